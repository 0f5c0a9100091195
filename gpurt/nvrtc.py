"""Compile CUDA C++ at run time with NVRTC, cached in memory and on disk.

``compile(source, ...)`` returns a :class:`Module` of compiled code (a cubin for the exact
device architecture by default, PTX only when asked); ``module["name"]`` (or a name
expression such as ``module["f<float, 128>"]``) returns a :class:`~gpurt.Kernel`. With an
explicit ``arch`` nothing needs a GPU, so kernels can be compiled and cached ahead of time.
See ``gpurt/_nvrtc/cache.py`` for the caches and ``gpurt/_launch/kernel.py`` for launching.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cuda.bindings import nvrtc as _nvrtc

from ._core.driver import CudaError, check
from ._core.files import write_atomic
from ._launch.kernel import Kernel, LaunchConfig, add_launch_hook, remove_launch_hook
from ._launch.module import Module
from ._launch.path import launch_path  # noqa: F401 (gpurt.nvrtc.launch_path(): the launch path in use)
from ._launch.planned import plan_key  # noqa: F401 (gpurt.nvrtc.plan_key: keys of planned calls)
from ._nvrtc import cache as _kcache
from ._nvrtc.cache import Entry, cache_dir, clear_cache  # noqa: F401 (gpurt.nvrtc.clear_cache)
from .device import get_arch

__all__ = [
    "compile",
    "compile_file",
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
_LOG_LINE = re.compile(r"^(?P<file>[^\n()]+)\((?P<line>\d+)\): (?P<what>error|warning|remark)",
                       re.M)
_MISSING_HEADER = re.compile(r'could not open source file "(?P<name>[^"]+)"')


class CompileError(CudaError):
    """NVRTC could not compile a program. ``log`` holds NVRTC's messages, ``options`` the
    options used and ``source`` the program; ``str()`` shows the log and, with line numbers,
    the source lines the log points at."""

    def __init__(self, error: CudaError, log: str, source: str, options: Sequence[str],
                 program_name: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(error.code, error.name, error.description, "nvrtcCompileProgram")
        self.log = log
        self.source = source
        self.options = tuple(options)
        self.program_name = program_name
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        parts = [f"{self.name}: NVRTC could not compile {self.program_name!r} "
                 f"(options: {' '.join(self.options)})", self.log.rstrip()]
        excerpt = self.excerpt()
        if excerpt:
            parts += ["", "source lines the log points at:", excerpt]
        missing = _MISSING_HEADER.search(self.log)
        if missing and missing["name"].startswith(("cuda", "cub/", "thrust/", "nv/", "crt/")):
            parts += ["", f"hint: CUDA's header {missing['name']!r} was not found; install the "
                      "NVIDIA wheels that ship them (nvidia-cuda-runtime for cuda_fp16.h/"
                      "cuda_bf16.h, nvidia-cuda-cccl for cuda/std and CUB) or set CUDA_HOME"]
        return "\n".join(parts)

    def excerpt(self, context: int = 1, limit: int = 8) -> str:
        """The source lines named in the log (``context`` lines around each), numbered."""
        files = {self.program_name: self.source, **self.headers}
        shown: list[str] = []
        seen: set[tuple[str, int]] = set()
        for match in _LOG_LINE.finditer(self.log):
            name, line = match["file"].strip(), int(match["line"])
            text = files.get(name) or files.get(os.path.basename(name))
            if text is None or (name, line) in seen or len(seen) >= limit:
                continue
            seen.add((name, line))
            lines = text.splitlines()
            first, last = max(1, line - context), min(len(lines), line + context)
            shown.append(f"--- {name}:{line} ({match['what']})")
            for number in range(first, last + 1):
                mark = ">" if number == line else " "
                shown.append(f"{mark}{number:5d} | {lines[number - 1]}")
        return "\n".join(shown)


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
                             "must be linked before it can be loaded: linking is not supported "
                             "yet")
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
            arch: str | None = None, ptx: bool = False, *,
            program_name: str = "kernel.cu") -> Module:
    """Compile CUDA C++ ``source`` with NVRTC into a :class:`Module`.

    ``arch`` defaults to the current device's exact architecture (``gpurt.get_arch()``);
    give it ('sm_90', 'sm_90a', 'compute_90' for PTX) to compile without a GPU. ``ptx=True``
    asks for PTX instead of a cubin. ``name_expressions`` (e.g. ``"f<float, 128>"``) make
    template kernels reachable by those names; ``headers`` maps include names to sources;
    ``include_paths`` (and -I options) are searched before CUDA's own headers, and their files
    are part of the cache key (re-checked at most once a second). ``-std=c++17`` is the
    default. Results are cached in memory and on disk; raises :class:`CompileError`.

    ``source`` must be a str (TypeError otherwise, also for bytes: decode them first, so that
    the encoding is the caller's choice). Options whose output gpurt cannot load (relocatable
    code: -rdc=true, -dc; LTO IR: -dlto; other output kinds) raise ValueError."""
    if not isinstance(source, str):
        raise TypeError(f"compile() needs the source as a str, got {type(source).__name__}"
                        + (" (decode the bytes first)" if isinstance(source, bytes) else ""))
    opts, incs, arch = _canonical(options, include_paths, arch, ptx)
    ptx = arch.startswith("compute_")
    exprs = tuple(name_expressions)
    hdrs = _headers(headers)
    digests = tuple(_kcache.include_digest(p) for p in incs)
    memory_key = (source, opts, exprs, hdrs, incs, digests, arch, program_name)
    module = _kcache.memory_get(memory_key)
    if module is not None:
        return module

    directory = cache_dir()
    tools = _kcache.toolchain(directory)
    key = _kcache.make_key({
        "schema": _kcache.SCHEMA, "gpurt": _gpurt_version(), "nvrtc": tools.nvrtc_version,
        "toolchain": tools.digest, "arch": arch, "options": opts, "program": program_name,
        "source": source, "name_expressions": sorted(exprs), "headers": hdrs,
        "include_dirs": list(zip(incs, digests)),
    })
    build = functools.partial(_build, source, program_name,
                              _nvrtc_options(arch, opts, incs, tools), exprs, hdrs, ptx)

    entry = None
    if directory is not None and _kcache.usable(directory):
        entry = _kcache.load(directory, key)
    from_disk = entry is not None
    if entry is None:
        entry = build()
        if directory is not None:
            _kcache.store(directory, key, entry)

    def rebuild() -> Entry:
        """Compile afresh code from the disk cache that the driver refused (see Module)."""
        fresh = build()
        if directory is not None:
            _kcache.store(directory, key, fresh)
        return fresh

    module = Module(entry, arch, source, opts, program_name, rebuild if from_disk else None)
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
           headers: tuple[tuple[str, str], ...], ptx: bool) -> Entry:
    """Run NVRTC once; the program is destroyed on every path."""
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
        if ptx:
            binary = _output_buffer(check(_nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize"))
            check(_nvrtc.nvrtcGetPTX(program, binary), "nvrtcGetPTX")
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
    return Entry(bytes(binary), "ptx" if ptx else "cubin", lowered, log)


def compile_file(path: str, arch: str, options: Sequence[str] = (),
                 output: str | None = None) -> str:
    """Compile the CUDA file ``path`` for ``arch`` ('sm_90' -> cubin, 'compute_90' -> PTX),
    write the result to ``output`` (default: ``path`` with .cubin/.ptx) and return that path.
    The file's folder is an include path. NVRTC always runs (the kernel caches serve
    compile(); a file's folder may be too big to fingerprint). Used by ``gpurt compile``."""
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    folder = os.path.dirname(os.path.abspath(path))
    opts, incs, arch = _canonical(options, (folder,), arch, False)
    tools = _kcache.toolchain(cache_dir())
    entry = _build(source, os.path.basename(path), _nvrtc_options(arch, opts, incs, tools), (),
                   (), arch.startswith("compute_"))
    if output is None:
        output = os.path.splitext(path)[0] + (".ptx" if entry.kind == "ptx" else ".cubin")
    data = entry.binary.rstrip(b"\0") if entry.kind == "ptx" else entry.binary
    write_atomic(output, data, ".gpurt-tmp-", 0o666)
    return output


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
