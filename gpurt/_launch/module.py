"""Module: compiled code (a cubin, PTX or a fatbin) and its kernels, loaded on first use.

Module and :class:`~gpurt.Kernel` live here together: a module makes its kernels, and a
kernel asks its module for the loaded library (:meth:`Module.library`), and to replace code
from the disk cache that the driver refuses (:meth:`Module.replace_refused`). gpurt.nvrtc
compiles the code; this package loads and launches it.
"""

from __future__ import annotations

import re
import struct
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from cuda.bindings import driver as cu

from .._core.captures import CAPTURES
from .._core.driver import CudaError, CudaUnavailableError, OutOfMemoryError, check
from .._nvrtc.cache import Entry
from .._nvrtc.images import describe
from .._streams.handles import deferred_while_unsafe
from .kernel import Kernel, explain_load_error

__all__ = ["Module"]


def _unload(libraries: list[Any]) -> None:
    """Finalizer: unload a module's libraries; never raises (the driver may be gone at exit).
    While a graph capture is underway, or on the driver's host-callback thread, the unload
    waits for the next safe point: cuLibraryUnload waits for the device, which invalidates a
    capture, and a module in a reference cycle with its kernels is collected whenever Python's
    garbage collector runs, mid-capture too (NVIDIA/warp#401 met the same)."""
    if deferred_while_unsafe(_unload, libraries):
        return
    for i, library in enumerate(libraries):
        libraries[i] = None
        if library is not None:
            try:
                cu.cuLibraryUnload(library)
            except Exception:
                pass


def _recompiling_helps(err: CudaError) -> bool:
    """Whether the driver's refusal of cached code may be the code's fault: not for lack of
    memory or of a usable driver, nor for a kernel name that is not in the code."""
    return not isinstance(err, (OutOfMemoryError, CudaUnavailableError)) and (
        err.name != "CUDA_ERROR_NOT_FOUND")


_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)")
_STT_FUNC, _STO_CUDA_ENTRY, _SHT_SYMTAB = 2, 0x10, 2


def entry_names(code: bytes, kind: str) -> frozenset[str] | None:
    """The (mangled) names of the kernels in ``code``, read without a GPU: the ``.entry``
    lines of PTX, or the cubin's ELF symbol table (functions marked as CUDA entries). None
    where the code cannot be read so (then the driver tells at load)."""
    if kind == "ptx":
        return frozenset(m.decode() for m in _PTX_ENTRY.findall(code))
    try:
        if kind == "fatbin":
            return _fatbin_entries(code)
        return _elf_entries(code)
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None


def _fatbin_entries(code: bytes) -> frozenset[str] | None:
    """The entries of a fatbin's cubins when all of its code is uncompressed cubins."""
    image = describe(code)
    if not image.members or any(not a.startswith("sm_") for a in image.archs):
        return None
    found: set[str] = set()
    for member in image.members:
        names = _elf_entries(member)
        if names is None:
            return None
        found |= names
    return frozenset(found)


def _elf_entries(code: bytes) -> frozenset[str] | None:
    """Entry functions of a little-endian ELF64 cubin (every read bounds-checked)."""
    if code[:4] != b"\x7fELF" or code[4] != 2 or code[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", code, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", code, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(code):
        return None
    sections = [struct.unpack_from("<IIQQQQIIQQ", code, shoff + i * shentsize)
                for i in range(shnum)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_SYMTAB or entsize != 24 or offset + size > len(code):
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size - 23, 24):
            name, info, other = struct.unpack_from("<IBB", code, at)
            if info & 0xF == _STT_FUNC and other & _STO_CUDA_ENTRY:
                start = strings + name
                names.add(code[start:code.index(b"\0", start)].decode())
    return frozenset(names)


class Module:
    """Compiled code and its kernels: ``module["name"]`` / ``get_function(name)``.

    ``code`` is the cubin (or PTX), ``kind`` says which, ``lowered_names`` maps each name
    expression to its mangled name and ``log`` holds NVRTC's warnings. The code is loaded
    (cuLibraryLoadData, context-independent) on the first launch of one of its kernels.
    Code from the disk cache that the driver refuses, at load or at the first use of a
    kernel, is compiled afresh once (replacing the cache entry) and loaded instead."""

    def __init__(self, entry: Entry, arch: str, source: str | None, options: Sequence[str] = (),
                 program_name: str = "kernel.cu",
                 rebuild: Callable[[], Entry] | None = None) -> None:
        self._use(entry)
        self.arch = arch
        self.source = source
        self.options = tuple(options)
        self.program_name = program_name
        self._rebuild = rebuild
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()
        # [the library in use, then libraries the driver refused after loading them: kernels
        # may hold handles into those, so they are unloaded with the module]
        self._libraries: list[Any] = [None]
        finalizer = weakref.finalize(self, _unload, self._libraries)
        finalizer.atexit = False

    def _use(self, entry: Entry) -> None:
        self.code = entry.binary
        self.kind = entry.kind
        self.lowered_names = dict(entry.lowered)
        self.log = entry.log
        self._entries = entry_names(self.code, self.kind)

    def __repr__(self) -> str:
        return f"<gpurt.Module {self.program_name} {self.kind} {self.arch}, {len(self.code)} bytes>"

    def get_function(self, name: str) -> Kernel:
        """The kernel called ``name``: an extern "C" name, a name expression given to
        :func:`compile`, or a mangled name."""
        kernel = self._kernels.get(name)
        if kernel is None:
            symbol = self.lowered_names.get(name)
            if symbol is None:
                if any(ch in name for ch in "<>:(& "):
                    known = ", ".join(map(repr, self.lowered_names)) or "none"
                    raise KeyError(f"{name!r} is not one of this module's name expressions "
                                   f"({known}); pass it in compile(..., name_expressions=[...])")
                symbol = name
            if self._entries is not None and symbol not in self._entries:
                known = ", ".join(map(repr, sorted(self._entries))) or "none"
                raise KeyError(f"no kernel {name!r} in this module; its kernels are: {known} "
                               "(C++ kernels that are not extern \"C\" are reached by a name "
                               "given in compile(..., name_expressions=[...]))")
            kernel = self._kernels.setdefault(name, Kernel(self, name, symbol))
        return kernel

    __getitem__ = get_function

    def library(self) -> Any:
        """The loaded CUlibrary (wraps cuLibraryLoadData on first call)."""
        library = self._libraries[0]
        if library is not None:
            return library
        CAPTURES.run_deferred()  # (a first launch is a safe point: unloads queued in captures)
        with self._lock:
            while self._libraries[0] is None:
                try:
                    self._libraries[0] = check(cu.cuLibraryLoadData(
                        self.code, None, None, 0, None, None, 0), "cuLibraryLoadData")
                except CudaError as err:
                    if not self._recompile(err):  # True once at most
                        raise explain_load_error(err, self.arch) from None
            return self._libraries[0]

    def replace_refused(self, library: Any, err: CudaError) -> bool:
        """After the driver refused ``library`` at the first use of a kernel (``err``): True
        when :meth:`library` now loads other code (freshly compiled, since this came from
        the disk cache, or already replaced by another thread); False when ``err`` stands."""
        with self._lock:
            if self._libraries[0] is not library:
                return True
            if not self._recompile(err):
                return False
            self._libraries.append(library)
            self._libraries[0] = None
            return True

    def _recompile(self, err: CudaError) -> bool:
        """Replace code from the disk cache that the driver refused with ``err`` by a fresh
        compile (which also replaces the cache entry); False where that cannot help. Once
        per module: fresh code that is refused too is NVRTC's or the driver's problem."""
        if self._rebuild is None or not _recompiling_helps(err):
            return False
        entry = self._rebuild()
        self._rebuild = None
        self._use(entry)
        return True
