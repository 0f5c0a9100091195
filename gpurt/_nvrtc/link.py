"""Linking device code with NVIDIA's nvJitLink (``cuda.bindings.nvjitlink``, the
nvidia-nvjitlink wheel): relocatable cubins (NVRTC's -rdc=true), LTO-IR (-dlto), PTX,
fatbins, and libraries or host objects made by nvcc, into one cubin for one architecture.
Linking needs no GPU."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from .._core.driver import CudaError, check_call
from .images import describe

__all__ = ["LinkError", "link_images", "input_kind", "version"]


def _library() -> Any:
    """cuda.bindings.nvjitlink; RuntimeError saying what to install where it is missing."""
    try:
        return importlib.import_module("cuda.bindings.nvjitlink")
    except ImportError as exc:
        raise RuntimeError(f"this needs cuda-bindings' nvjitlink module and NVIDIA's library "
                           f"(pip install nvidia-nvjitlink cuda-bindings>=12.9): {exc}") from exc


_AR_MAGIC = b"!<arch>\n"


class LinkError(CudaError):
    """nvJitLink could not link: ``log`` holds its error log, ``inputs`` the inputs' names."""

    def __init__(self, error: CudaError, log: str, inputs: Sequence[str],
                 options: Sequence[str]) -> None:
        super().__init__(error.code, error.name, error.description, error.call)
        self.log = log
        self.inputs = tuple(inputs)
        self.options = tuple(options)

    def __str__(self) -> str:
        return (f"{self.name}: nvJitLink could not link {', '.join(self.inputs)} "
                f"(options: {' '.join(self.options)})\n{self.log.rstrip()}")


def version() -> tuple[int, int]:
    """nvJitLink's (major, minor) version."""
    lib = _library()
    major, minor = check_call("nvJitLinkVersion", "NVJITLINK", lib.version)
    return int(major), int(minor)


def input_kind(data: bytes, what: str) -> str:
    """How nvJitLink takes ``data``: 'cubin', 'ptx', 'ltoir', 'fatbin', 'library' (an ar
    archive, nvcc -lib) or 'object' (a host ELF object with device code, nvcc -c);
    ValueError for anything else."""
    if data[:8] == _AR_MAGIC:
        return "library"
    if data[:4] == b"\x7fELF" and len(data) > 0x14 and data[0x12] != 190:  # not EM_CUDA
        return "object"
    image = describe(data, what)
    if image.kind == "cubin" and not image.relocatable:
        raise ValueError(f"{what} is an executable cubin, which cannot be linked: compile "
                         "it with -rdc=true (Linker.add_source does) or load it alone with "
                         "gpurt.load_module")
    return image.kind


def _log(handle: int, error: bool) -> str:
    lib = _library()
    size_of = lib.get_error_log_size if error else lib.get_info_log_size
    get = lib.get_error_log if error else lib.get_info_log
    size = check_call("nvJitLinkGetLogSize", "NVJITLINK", size_of, handle)
    if not size:
        return ""
    buffer = bytearray(size)
    check_call("nvJitLinkGetLog", "NVJITLINK", get, handle, buffer)
    return bytes(buffer).rstrip(b"\0").decode(errors="replace").strip()


def link_images(inputs: Sequence[tuple[str, bytes]], arch: str, lto: bool = False,
                options: Sequence[str] = ()) -> tuple[bytes, str]:
    """Link ``inputs`` ((name, data) pairs) into one cubin for ``arch`` ('sm_90'); returns
    (cubin, nvJitLink's info log). ``lto`` (also implied by any LTO-IR input) optimises
    across the inputs at link time. Raises LinkError with nvJitLink's log, ValueError for
    an input it cannot take. The nvJitLink handle is destroyed on every path."""
    lib = _library()
    if not inputs:
        raise ValueError("nothing to link: add at least one input")
    kinds = [input_kind(data, name) for name, data in inputs]
    lto = lto or "ltoir" in kinds
    flags = [f"-arch={arch}", *(("-lto",) if lto else ()), *options]
    handle = check_call("nvJitLinkCreate", "NVJITLINK", lib.create, len(flags), flags)
    try:
        try:
            for (name, data), kind in zip(inputs, kinds):
                check_call("nvJitLinkAddData", "NVJITLINK", lib.add_data, handle,
                           getattr(lib.InputType, kind.upper()), data, len(data), name)
            check_call("nvJitLinkComplete", "NVJITLINK", lib.complete, handle)
        except CudaError as err:
            raise LinkError(err, _log(handle, True), [n for n, _ in inputs], flags) from None
        size = check_call("nvJitLinkGetLinkedCubinSize", "NVJITLINK",
                          lib.get_linked_cubin_size, handle)
        cubin = bytearray(size)
        check_call("nvJitLinkGetLinkedCubin", "NVJITLINK", lib.get_linked_cubin, handle,
                   cubin)
        info = _log(handle, False)
    finally:
        check_call("nvJitLinkDestroy", "NVJITLINK", lib.destroy, handle)
    return bytes(cubin), info
