"""Compile CUDA C++ at run time with NVRTC, cached in memory and on disk; load and link code
made ahead of time.

``compile(source, ...)`` returns a :class:`Module` of compiled code (a cubin for the exact
device architecture by default, PTX only when asked, a fatbin for a list of architectures);
``module["name"]`` (or a name expression such as ``module["f<float, 128>"]``) returns a
:class:`~gpurt.Kernel`. With an explicit ``arch`` nothing needs a GPU, so kernels can be
compiled and cached ahead of time. :func:`load_module` loads cubins, PTX, fatbins and LTO-IR
made elsewhere; :class:`Linker` links relocatable code and LTO-IR with nvJitLink;
:func:`add_prebuilt` serves compile() from a prebuilt archive (docs/aot.md). See
``gpurt/_nvrtc/`` for the caches, formats, linker and archives, and ``gpurt/_launch/kernel.py``
for launching.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cuda.bindings import nvrtc as _nvrtc

from ._core.driver import CudaError, check
from ._core.files import write_atomic
from ._launch.kernel import Kernel, LaunchConfig, add_launch_hook, remove_launch_hook
from ._launch.module import Module
from ._launch.path import launch_path  # noqa: F401 (gpurt.nvrtc.launch_path(): the launch path in use)
from ._launch.planned import (  # noqa: F401 (repeated calls from C)
    add_dispatch,
    dispatch,
    plan_key,  # noqa: F401 (gpurt.nvrtc.plan_key: keys of planned calls)
    plan_key_addresses,  # noqa: F401 (the same keys, and the items' addresses)
)
from ._nvrtc import cache as _kcache
from ._nvrtc import fatbin as _fatbin
from ._nvrtc import images as _images
from ._nvrtc import link as _link
from ._nvrtc import prebuilt as _prebuilt
from ._nvrtc.cache import Entry, cache_dir, clear_cache  # noqa: F401 (gpurt.nvrtc.clear_cache)
from ._nvrtc.errors import CompileError
from ._nvrtc.link import LinkError
from .device import get_arch

__all__ = [
    "compile",
    "compile_file",
    "load_module",
    "Linker",
    "link",
    "LinkError",
    "Module",
    "Kernel",
    "RawKernel",
    "LaunchConfig",
    "CompileError",
    "add_launch_hook",
    "remove_launch_hook",
    "get_arch_list",
    "get_gencode_flags",
]

Headers = Mapping[str, str] | Iterable[tuple[str, str]] | None

_ARCH = re.compile(r"^(sm|compute)_(\d+[af]?)$")
_ARCH_OPTION = re.compile(r"^(-arch|--gpu-architecture)(=|$)")
_INCLUDE_OPTION = re.compile(r"^(-I|--include-path=|--include-path$)")


# ---- compiling ----------------------------------------------------------------------------


def _normalize_arch(arch: Any, ptx: bool) -> str:
    text = str(arch).strip()
    if text.isdigit():
        text = f"sm_{text}"
    if _ARCH.match(text) is None:
        raise ValueError(f"invalid arch {arch!r}: expected e.g. 'sm_90', 'sm_90a' or 'compute_90'")
    if ptx and text.startswith("sm_"):
        text = "compute_" + text[3:]
    return text


def _split_arch(options: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """Pull an -arch/--gpu-architecture option out of ``options``."""
    arch, rest = None, []
    items = iter(options)
    for option in items:
        match = _ARCH_OPTION.match(option)
        if match is None:
            rest.append(option)
        elif match.group(2) == "=":
            arch = option[match.end():]
        else:
            arch = next(items, None)
    return arch, tuple(rest)


def _split_includes(options: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Pull -I/--include-path options out of ``options``, so that the cache fingerprints
    those folders like ``include_paths``."""
    paths, rest = [], []
    items = iter(options)
    for option in items:
        match = _INCLUDE_OPTION.match(option)
        if match is None:
            rest.append(option)
        else:
            paths.append(option[match.end():] or next(items, ""))
    return tuple(p for p in paths if p), tuple(rest)


def _headers(headers: Headers) -> tuple[tuple[str, str], ...]:
    if not headers:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple(sorted((str(name), str(text)) for name, text in items))


def _canonical(options: Sequence[str] | str, include_paths: Sequence[Any], arch: str | None,
               ptx: bool) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """(options, include folders, arch) of a request: -I and -arch options pulled out,
    the arch resolved (default: the current device's) and -std=c++17 added if absent."""
    opts = (options,) if isinstance(options, str) else tuple(options)
    _refuse_unloadable(opts)
    option_includes, opts = _split_includes(opts)
    incs = tuple(os.path.abspath(os.fspath(p)) for p in (*include_paths, *option_includes))
    option_arch, opts = _split_arch(opts)
    if arch is not None and option_arch is not None and option_arch != arch:
        raise ValueError(f"arch={arch!r} conflicts with the option -arch={option_arch}")
    arch = _normalize_arch(arch or option_arch or get_arch(), ptx)
    if not any(o.startswith(("-std", "--std")) for o in opts):
        opts = ("-std=c++17", *opts)
    return opts, incs, arch


# NVRTC options whose output gpurt cannot load: relocatable code and LTO IR must be linked
# first, and gpurt chooses the output kind itself (a cubin, or PTX with ptx=True).
_NEEDS_LINKING = frozenset({"-dlto", "--dlto", "-dlink-time-opt", "--dlink-time-opt", "-dc",
                            "--device-c"})
_RELOCATABLE = frozenset({"-rdc", "--relocatable-device-code"})
_OUTPUT_KIND = frozenset({"-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin",
                          "-fdevice-syntax-only", "--fdevice-syntax-only"})


def _refuse_unloadable(opts: tuple[str, ...]) -> None:
    """ValueError for options whose output gpurt cannot load, before NVRTC runs (NVRTC
    would make code that loads as nothing, or that must be linked first)."""
    for option in opts:
        if not isinstance(option, str):
            raise TypeError(f"NVRTC options are strings, got {option!r}")
        flag, _, value = option.partition("=")
        if option in _NEEDS_LINKING or (flag in _RELOCATABLE and value.lower() != "false"):
            raise ValueError(f"NVRTC option {option!r} makes relocatable code or LTO IR, which "
                             "must be linked before it can be loaded: use gpurt.Linker (its "
                             "add_source() compiles for linking) or gpurt.link()")
        if flag in _OUTPUT_KIND:
            raise ValueError(f"NVRTC option {option!r} changes the kind of output; gpurt makes "
                             "a cubin, or PTX with ptx=True (or a compute_XX arch)")


def _nvrtc_options(arch: str, opts: tuple[str, ...], incs: tuple[str, ...],
                   tools: _kcache.Toolchain) -> tuple[str, ...]:
    """The options NVRTC gets: the arch, the user's, then include folders, CUDA's last."""
    return (f"-arch={arch}", *opts, *(f"-I{p}" for p in (*incs, *tools.include_dirs)))


def _gpurt_version() -> str:
    package = sys.modules.get(__package__ or "gpurt")
    return str(getattr(package, "__version__", "unknown"))


def compile(source: str, options: Sequence[str] | str = (), name_expressions: Sequence[str] = (),
            headers: Headers = None, include_paths: Sequence[str | os.PathLike[str]] = (),
            arch: str | Sequence[str] | None = None, ptx: bool = False, *,
            program_name: str = "kernel.cu") -> Module:
    """Compile CUDA C++ ``source`` with NVRTC into a :class:`Module`.

    ``arch`` defaults to the current device's exact architecture (``gpurt.get_arch()``);
    give it ('sm_90', 'sm_90a', 'compute_90' for PTX) to compile without a GPU. A list of
    architectures (['sm_80', 'sm_90a', 'sm_100']) makes a fatbin (nvFatbin) with a cubin for
    each, from which the driver picks the device's; ``compute_XX`` items, or ``ptx=True``
    (PTX of the newest listed architecture), add PTX that later GPUs JIT-compile. For one
    architecture ``ptx=True`` asks for PTX instead of a cubin. ``name_expressions`` (e.g.
    ``"f<float, 128>"``) make template kernels reachable by those names; ``headers`` maps
    include names to sources; ``include_paths`` (and -I options) are searched before CUDA's
    own headers, and their files are part of the cache key (re-checked at most once a
    second). ``-std=c++17`` is the default. Results are cached in memory and on disk (a
    fatbin's cubins one by one); code of a registered prebuilt archive is used instead of
    compiling where it matches (:func:`add_prebuilt`). Raises :class:`CompileError`.

    ``source`` must be a str (TypeError otherwise, also for bytes: decode them first, so that
    the encoding is the caller's choice). Options whose output gpurt cannot load (relocatable
    code: -rdc=true, -dc; LTO IR: -dlto; other output kinds) raise ValueError: such code is
    made and linked by :class:`Linker`."""
    if not isinstance(source, str):
        raise TypeError(f"compile() needs the source as a str, got {type(source).__name__}"
                        + (" (decode the bytes first)" if isinstance(source, bytes) else ""))
    if arch is not None and not isinstance(arch, str):
        return _compile_fatbin(source, options, tuple(name_expressions), headers,
                               include_paths, tuple(arch), ptx, program_name)
    opts, incs, target = _canonical(options, include_paths, arch, ptx)
    return _compile_one(source, opts, incs, tuple(name_expressions), _headers(headers), target,
                        program_name, "ptx" if target.startswith("compute_") else "cubin")


def _compile_one(source: str, opts: tuple[str, ...], incs: tuple[str, ...],
                 exprs: tuple[str, ...], hdrs: tuple[tuple[str, str], ...], arch: str,
                 program_name: str, output: str) -> Module:
    """compile() of canonical inputs: the memory cache, else :func:`_entry`."""
    digests = tuple(_kcache.include_digest(p) for p in incs)
    memory_key = (source, opts, exprs, hdrs, incs, digests, arch, program_name, output)
    module = _kcache.memory_get(memory_key)
    if module is not None:
        return module
    entry, rebuild = _entry(source, opts, incs, digests, exprs, hdrs, arch, program_name, output)
    module = Module(entry, arch, source, opts, program_name, rebuild)
    _kcache.memory_put(memory_key, module)
    return module


def _entry(source: str, opts: tuple[str, ...], incs: tuple[str, ...], digests: tuple[str, ...],
           exprs: tuple[str, ...], hdrs: tuple[tuple[str, str], ...], arch: str,
           program_name: str, output: str) -> tuple[Entry, Callable[[], Entry] | None]:
    """The compiled program: from a prebuilt archive, the disk cache or NVRTC (then stored
    on disk). Also returns, for code that did not come fresh from NVRTC, the function that
    compiles it afresh (Module calls it once if the driver refuses that code). A prebuilt
    program is looked up first: it needs no toolchain discovery."""
    directory = cache_dir()

    def key_and_build() -> tuple[str, Callable[[], Entry]]:
        tools = _kcache.toolchain(directory)
        key = _kcache.make_key({
            "schema": _kcache.SCHEMA, "gpurt": _gpurt_version(), "nvrtc": tools.nvrtc_version,
            "toolchain": tools.digest, "arch": arch, "options": opts, "program": program_name,
            "source": source, "name_expressions": sorted(exprs), "headers": hdrs,
            "include_dirs": list(zip(incs, digests)), "output": output,
        })
        return key, functools.partial(_build, source, program_name,
                                      _nvrtc_options(arch, opts, incs, tools), exprs, hdrs,
                                      output)

    def rebuild() -> Entry:
        """Compile afresh code that the driver refused (see Module)."""
        key, build = key_and_build()
        fresh = build()
        if directory is not None:
            _kcache.store(directory, key, fresh)
        return fresh

    if not incs and output == "cubin" and _prebuilt.archives():
        found = _prebuilt.lookup(_prebuilt.program_key(program_name, source, hdrs, opts, arch),
                                 exprs)
        if found is not None:
            return found, rebuild
    key, build = key_and_build()
    entry = None
    if directory is not None and _kcache.usable(directory):
        entry = _kcache.load(directory, key)
    if entry is not None:
        return entry, rebuild
    entry = build()
    if directory is not None:
        _kcache.store(directory, key, entry)
    return entry, None


def _fatbin_targets(archs: tuple[str, ...], ptx: bool) -> tuple[str, ...]:
    """The canonical architectures of a fatbin: each of ``archs`` once, plus with ``ptx``
    compute_XX of the newest one (without its a/f suffix: PTX for later GPUs)."""
    if not archs:
        raise ValueError("arch=[] names no architecture; give at least one (e.g. ['sm_90'])")
    targets = [_normalize_arch(a, False) for a in archs]
    if ptx:
        newest = max(targets, key=lambda a: _images.arch_number(a)[0])
        targets.append(f"compute_{_images.arch_number(newest)[0]}")
    return tuple(dict.fromkeys(targets))


def _compile_fatbin(source: str, options: Sequence[str] | str, exprs: tuple[str, ...],
                    headers: Headers, include_paths: Sequence[Any], archs: tuple[str, ...],
                    ptx: bool, program_name: str) -> Module:
    """compile() for several architectures: each compiled (and cached) alone, then bundled
    into one fatbin with nvFatbin."""
    targets = _fatbin_targets(archs, ptx)
    parts: list[tuple[str, Module]] = []
    opts: tuple[str, ...] = ()
    for target in targets:
        opts, _, _ = _canonical(options, include_paths, target, False)
        parts.append((target, compile(source, options, exprs, headers, include_paths, target,
                                      program_name=program_name)))
    memory_key = ("fatbin", program_name, exprs, tuple((a, m.code) for a, m in parts))
    module = _kcache.memory_get(memory_key)
    if module is None:
        binary = _fatbin.make_fatbin([(a, m.kind, m.code) for a, m in parts],
                                     os.path.splitext(program_name)[0])
        log = "\n".join(m.log for _, m in parts if m.log)
        entry = Entry(binary, "fatbin", dict(parts[0][1].lowered_names), log)
        module = Module(entry, ",".join(targets), source, opts, program_name)
        _kcache.memory_put(memory_key, module)
    return module


def _output_buffer(size: int) -> bytearray:
    """A fresh buffer for NVRTC to write into. Never ``b" " * size``: for size 1 that is
    CPython's shared one-byte object, and NVRTC's write would corrupt every b" " in the process."""
    return bytearray(size)


def _program_log(program: Any) -> str:
    size = check(_nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
    buffer = _output_buffer(size)
    check(_nvrtc.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
    return bytes(buffer).rstrip(b"\0").decode(errors="replace").strip()


def _build(source: str, program_name: str, options: tuple[str, ...], exprs: tuple[str, ...],
           headers: tuple[tuple[str, str], ...], output: str) -> Entry:
    """Run NVRTC once for ``output`` ('cubin', 'ptx' or 'ltoir'); the program is destroyed
    on every path."""
    program = check(_nvrtc.nvrtcCreateProgram(
        source.encode(), program_name.encode(), len(headers),
        [text.encode() for _, text in headers], [name.encode() for name, _ in headers]),
        "nvrtcCreateProgram")
    try:
        for expr in exprs:
            check(_nvrtc.nvrtcAddNameExpression(program, expr.encode()), "nvrtcAddNameExpression")
        try:
            check(_nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options]),
                  "nvrtcCompileProgram")
        except CudaError as err:
            if err.name not in ("NVRTC_ERROR_COMPILATION", "NVRTC_ERROR_INVALID_OPTION"):
                raise
            raise CompileError(err, _program_log(program), source, options, program_name,
                               dict(headers)) from err
        log = _program_log(program)
        if output == "ptx":
            binary = _output_buffer(check(_nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize"))
            check(_nvrtc.nvrtcGetPTX(program, binary), "nvrtcGetPTX")
        elif output == "ltoir":
            binary = _output_buffer(check(_nvrtc.nvrtcGetLTOIRSize(program),
                                          "nvrtcGetLTOIRSize"))
            check(_nvrtc.nvrtcGetLTOIR(program, binary), "nvrtcGetLTOIR")
        else:
            binary = _output_buffer(check(_nvrtc.nvrtcGetCUBINSize(program),
                                          "nvrtcGetCUBINSize"))
            check(_nvrtc.nvrtcGetCUBIN(program, binary), "nvrtcGetCUBIN")
        lowered = {
            expr: check(_nvrtc.nvrtcGetLoweredName(program, expr.encode()),
                        "nvrtcGetLoweredName").decode()
            for expr in exprs
        }
    finally:
        check(_nvrtc.nvrtcDestroyProgram(program), "nvrtcDestroyProgram")
    return Entry(bytes(binary), output, lowered, log)


def compile_file(path: str, arch: str | Sequence[str], options: Sequence[str] = (),
                 output: str | None = None, ptx: bool = False) -> str:
    """Compile the CUDA file ``path`` for ``arch`` ('sm_90' -> cubin, 'compute_90' -> PTX; a
    list -> a fatbin, with PTX of the newest when ``ptx``), write the result to ``output``
    (default: ``path`` with .cubin/.ptx/.fatbin) and return that path. The file's folder is
    an include path. NVRTC always runs (the kernel caches serve compile(); a file's folder
    may be too big to fingerprint). Used by ``gpurt compile``."""
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    folder = os.path.dirname(os.path.abspath(path))
    tools = _kcache.toolchain(cache_dir())
    targets = (arch,) if isinstance(arch, str) else _fatbin_targets(tuple(arch), ptx)
    parts = []
    for target in targets:
        opts, incs, target = _canonical(options, (folder,), target, False)
        kind = "ptx" if target.startswith("compute_") else "cubin"
        entry = _build(source, os.path.basename(path), _nvrtc_options(target, opts, incs, tools),
                       (), (), kind)
        parts.append((target, kind, entry.binary))
    if isinstance(arch, str):
        kind, data = parts[0][1], parts[0][2]
        data = data.rstrip(b"\0") if kind == "ptx" else data
    else:
        kind, data = "fatbin", _fatbin.make_fatbin(parts, os.path.splitext(
            os.path.basename(path))[0])
    if output is None:
        output = os.path.splitext(path)[0] + "." + kind
    write_atomic(output, data, ".gpurt-tmp-", 0o666)
    return output


# ---- loading and linking code made elsewhere -----------------------------------------------

CodeSource = bytes | bytearray | memoryview | str | os.PathLike


def _read_code(code: CodeSource) -> tuple[bytes, str, str]:
    """(data, what to call it in messages, program name) of a path or of bytes."""
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code), "the data", "<bytes>"
    if isinstance(code, (str, os.PathLike)):
        path = os.fspath(code)
        return _images.read_file(path), path, os.path.basename(path)
    raise TypeError(f"expected the code's bytes or a path to its file, got "
                    f"{type(code).__name__}")


def load_module(code: CodeSource, *, arch: str | None = None) -> Module:
    """A :class:`Module` of device code made elsewhere: a cubin, PTX, a fatbin, or LTO-IR
    or a relocatable cubin (linked alone with nvJitLink first). ``code`` is the code's bytes
    or the path of its file (str or path-like; a PTX text is passed as bytes). Kernels are
    found by name (``module["k"]``; C++ kernels by their mangled name).

    ``arch`` is the architecture the code must run on (default: the current device's). The
    code is untrusted input: ValueError for a file that is not device code, is cut short,
    larger than 1 GiB or a symbolic link, or holds code for other architectures only (the
    message names the file's architectures and the device's); KeyError for a kernel that is
    not in it; :class:`LinkError` where linking fails."""
    data, what, program_name = _read_code(code)
    image = _images.describe(data, what)
    target = _normalize_arch(arch or get_arch(), False)
    if image.kind == "ltoir" or image.relocatable:
        data, _ = _link.link_images([(program_name, data)], target, image.kind == "ltoir")
        image = _images.describe(data, what)
    _images.check_runs_on(image, target, what)
    module = Module(Entry(data, image.kind, {}, ""), ",".join(image.archs) or target, None,
                    (), program_name)
    return module


class Linker:
    """Link several programs into one :class:`Module` with nvJitLink: CUDA C++ sources
    compiled for linking (relocatable code, or LTO-IR with ``lto=True``) and code made
    elsewhere (cubins, PTX, fatbins, LTO-IR, and nvcc's libraries and objects), so that
    kernels call ``extern __device__`` functions of other sources.

    ``arch`` defaults to the current device's ('sm_90'); ``options`` go to nvJitLink (e.g.
    ``-O3``, ``-lineinfo``). Linking needs no GPU when ``arch`` is given. The linked cubin is
    cached in memory and on disk by the digests of its inputs."""

    def __init__(self, arch: str | None = None, *, lto: bool = False,
                 options: Sequence[str] = ()) -> None:
        self.arch = _normalize_arch(arch or get_arch(), False)
        if not self.arch.startswith("sm_"):
            raise ValueError(f"a Linker makes a cubin: give an sm_XX arch, not {self.arch!r}")
        self.lto = lto
        self.options = tuple(options)
        self._inputs: list[tuple[str, bytes]] = []
        self._lowered: dict[str, str] = {}
        self._logs: list[str] = []

    def add_source(self, source: str, options: Sequence[str] | str = (),
                   name_expressions: Sequence[str] = (), headers: Headers = None,
                   include_paths: Sequence[str | os.PathLike[str]] = (), *,
                   program_name: str = "kernel.cu") -> None:
        """Compile ``source`` with NVRTC for linking (-rdc=true, or -dlto with ``lto``;
        cached like compile()) and add it; its name expressions name kernels of the result."""
        if not isinstance(source, str):
            raise TypeError(f"add_source() needs the source as a str, got "
                            f"{type(source).__name__}")
        opts, incs, _ = _canonical(options, include_paths, self.arch, False)
        opts = (*opts, "-dlto" if self.lto else "-rdc=true")
        exprs, hdrs = tuple(name_expressions), _headers(headers)
        digests = tuple(_kcache.include_digest(p) for p in incs)
        entry, _ = _entry(source, opts, incs, digests, exprs, hdrs, self.arch, program_name,
                          "ltoir" if self.lto else "cubin")
        self._inputs.append((program_name, entry.binary))
        self._lowered.update(entry.lowered)
        if entry.log:
            self._logs.append(entry.log)

    def add_data(self, data: bytes, name: str = "<bytes>") -> None:
        """Add code made elsewhere (kind told from its content; ValueError if it is none)."""
        data = bytes(data)
        _link.input_kind(data, name)
        self._inputs.append((name, data))

    def add_file(self, path: str | os.PathLike[str]) -> None:
        """Add the code in file ``path`` (a bounded regular file, see :func:`load_module`)."""
        data, what, name = _read_code(path)
        _link.input_kind(data, what)
        self._inputs.append((name, data))

    def link(self) -> Module:
        """Link everything added into one :class:`Module` (wraps nvJitLinkCreate, AddData,
        Complete, GetLinkedCubin); raises :class:`LinkError` with nvJitLink's log."""
        parts = [[name, hashlib.sha256(data).hexdigest()] for name, data in self._inputs]
        key = _kcache.make_key({"schema": _kcache.SCHEMA, "link": _link.version(),
                                "arch": self.arch, "lto": self.lto, "options": self.options,
                                "inputs": parts, "lowered": self._lowered})
        module = _kcache.memory_get(("link", key))
        if module is not None:
            return module
        directory = cache_dir()
        entry = None
        if directory is not None and _kcache.usable(directory):
            entry = _kcache.load(directory, key)
        if entry is None:
            cubin, log = _link.link_images(self._inputs, self.arch, self.lto, self.options)
            entry = Entry(cubin, "cubin", dict(self._lowered), "\n".join([*self._logs, log]))
            if directory is not None:
                _kcache.store(directory, key, entry)
        module = Module(entry, self.arch, None, self.options, "linked")
        _kcache.memory_put(("link", key), module)
        return module


def link(sources: Sequence[str] = (), files: Sequence[CodeSource] = (), *,
         arch: str | None = None, lto: bool = False, options: Sequence[str] = (),
         compile_options: Sequence[str] = (), name_expressions: Sequence[str] = ()) -> Module:
    """Link CUDA C++ ``sources`` (compiled for linking, with ``compile_options``) and code
    made elsewhere (``files``: bytes or paths) into one :class:`Module`: a :class:`Linker`
    in one call. ``name_expressions`` are looked up in every source."""
    linker = Linker(arch, lto=lto, options=options)
    for number, source in enumerate(sources):
        linker.add_source(source, compile_options, name_expressions,
                          program_name=f"source{number}.cu")
    for item in files:
        if isinstance(item, (bytes, bytearray, memoryview)):
            linker.add_data(bytes(item))
        else:
            linker.add_file(item)
    return linker.link()


def prebuild(source: str, options: Sequence[str] | str = (), name_expressions: Sequence[str] = (),
             headers: Headers = None, *, arch: str,
             program_name: str = "kernel.cu") -> tuple[str, Entry]:
    """Compile a program for a prebuilt archive (``gpurt build-kernels``): returns the key
    that :func:`compile` looks it up by, with the same arguments, and its cubin Entry."""
    opts, _, target = _canonical(options, (), arch, False)
    exprs, hdrs = tuple(name_expressions), _headers(headers)
    entry, _ = _entry(source, opts, (), (), exprs, hdrs, target, program_name, "cubin")
    return _prebuilt.program_key(program_name, source, hdrs, opts, target), entry


def add_prebuilt(path: str | os.PathLike[str]) -> None:
    """Use the code of the prebuilt archive at ``path`` (``gpurt build-kernels`` writes one)
    wherever :func:`compile` is asked for a program it holds: the file is read at the first
    such lookup, its index and each program it serves checked against their digests."""
    _prebuilt.add_archive(os.fspath(path))


class RawKernel:
    """One kernel from source, compiled on first use: ``RawKernel(src, "add")(grid, block,
    args)``. ``name`` may be an extern "C" name, a C++ name or a template instance such as
    ``"f<float>"`` (it is passed to NVRTC as a name expression)."""

    def __init__(self, source: str, name: str, options: Sequence[str] = (), headers: Headers = None,
                 include_paths: Sequence[str] = (), arch: str | None = None) -> None:
        self.source = source
        self.name = name
        self.options = tuple(options)
        self.headers = headers
        self.include_paths = tuple(include_paths)
        self.arch = arch

    @functools.cached_property
    def kernel(self) -> Kernel:
        """The compiled :class:`Kernel` (compiles on first access)."""
        module = compile(self.source, self.options, (self.name,), self.headers,
                         self.include_paths, self.arch)
        return module[self.name]

    def __call__(self, grid: Any, block: Any, args: Sequence[Any], shared_mem: int = 0,
                 stream: Any = None) -> None:
        self.kernel(grid, block, args, shared_mem, stream)

    def launch(self, config: LaunchConfig, *args: Any, stream: Any = None) -> None:
        self.kernel.launch(config, *args, stream=stream)

    def __repr__(self) -> str:
        return f"<gpurt.RawKernel {self.name!r}>"


# ---- what NVRTC can target (torch.cuda.get_arch_list / get_gencode_flags) ---------------


def get_arch_list() -> list[str]:
    """The SASS targets gpurt can compile for, e.g. ``['sm_75', ..., 'sm_90', ...]``
    (wraps nvrtcGetSupportedArchs). torch lists the targets it was built for; gpurt builds
    at run time, so this is what its NVRTC supports. Needs no GPU."""
    archs = check(_nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return [f"sm_{arch}" for arch in archs]


def get_gencode_flags() -> str:
    """:func:`get_arch_list` as nvcc ``-gencode`` flags, in torch's format."""
    return " ".join(f"-gencode compute=compute_{arch[3:]},code={arch}"
                    for arch in get_arch_list())
