"""Fatbins with NVIDIA's nvFatbin (``cuda.bindings.nvfatbin``, the nvidia-nvfatbin wheel):
cubins for several GPU architectures, and PTX for later ones, in one image that the driver
picks from at load time."""

from __future__ import annotations

from collections.abc import Sequence

from cuda.bindings import nvfatbin as _nvfatbin

from .._core.driver import check_call

__all__ = ["make_fatbin", "version"]


def version() -> tuple[int, int]:
    """nvFatbin's (major, minor) version."""
    major, minor = check_call("nvFatbinVersion", "NVFATBIN", _nvfatbin.version)
    return int(major), int(minor)


def make_fatbin(parts: Sequence[tuple[str, str, bytes]], name: str = "kernel") -> bytes:
    """One fatbin of ``parts``: (arch, kind, binary) with kind 'cubin' (arch 'sm_90a') or
    'ptx' (arch 'compute_90'). Wraps nvFatbinCreate/AddCubin/AddPTX/Get; the handle is
    destroyed on every path."""
    handle = check_call("nvFatbinCreate", "NVFATBIN", _nvfatbin.create, [], 0)
    try:
        for arch, kind, binary in parts:
            number = arch.split("_", 1)[1]
            label = f"{name}.{arch}"
            if kind == "ptx":
                check_call("nvFatbinAddPTX", "NVFATBIN", _nvfatbin.add_ptx, handle, binary,
                           len(binary), number, label, "")
            elif kind == "cubin":
                check_call("nvFatbinAddCubin", "NVFATBIN", _nvfatbin.add_cubin, handle, binary,
                           len(binary), number, label)
            else:
                raise ValueError(f"a fatbin holds cubins and PTX, not {kind!r}")
        size = check_call("nvFatbinSize", "NVFATBIN", _nvfatbin.size, handle)
        buffer = bytearray(size)
        check_call("nvFatbinGet", "NVFATBIN", _nvfatbin.get, handle, buffer)
    finally:
        check_call("nvFatbinDestroy", "NVFATBIN", _nvfatbin.destroy, handle)
    return bytes(buffer)
