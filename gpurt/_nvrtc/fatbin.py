"""Fatbins with NVIDIA's nvFatbin (``cuda.bindings.nvfatbin``, the nvidia-nvfatbin wheel):
cubins for several GPU architectures, and PTX for later ones, in one image that the driver
picks from at load time."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from .._core.driver import check_call

__all__ = ["make_fatbin", "version"]


def _library() -> Any:
    """cuda.bindings.nvfatbin; RuntimeError saying what to install where it is missing."""
    try:
        return importlib.import_module("cuda.bindings.nvfatbin")
    except ImportError as exc:
        raise RuntimeError(f"this needs cuda-bindings' nvfatbin module and NVIDIA's library "
                           f"(pip install nvidia-nvfatbin cuda-bindings>=12.9): {exc}") from exc


def version() -> tuple[int, int]:
    """nvFatbin's (major, minor) version."""
    lib = _library()
    major, minor = check_call("nvFatbinVersion", "NVFATBIN", lib.version)
    return int(major), int(minor)


def make_fatbin(parts: Sequence[tuple[str, str, bytes]], name: str = "kernel") -> bytes:
    """One fatbin of ``parts``: (arch, kind, binary) with kind 'cubin' (arch 'sm_90a') or
    'ptx' (arch 'compute_90'). Wraps nvFatbinCreate/AddCubin/AddPTX/Get; the handle is
    destroyed on every path."""
    lib = _library()
    handle = check_call("nvFatbinCreate", "NVFATBIN", lib.create, [], 0)
    try:
        for arch, kind, binary in parts:
            number = arch.split("_", 1)[1]
            label = f"{name}.{arch}"
            if kind == "ptx":
                check_call("nvFatbinAddPTX", "NVFATBIN", lib.add_ptx, handle, binary,
                           len(binary), number, label, "")
            elif kind == "cubin":
                check_call("nvFatbinAddCubin", "NVFATBIN", lib.add_cubin, handle, binary,
                           len(binary), number, label)
            else:
                raise ValueError(f"a fatbin holds cubins and PTX, not {kind!r}")
        size = check_call("nvFatbinSize", "NVFATBIN", lib.size, handle)
        buffer = bytearray(size)
        check_call("nvFatbinGet", "NVFATBIN", lib.get, handle, buffer)
    finally:
        check_call("nvFatbinDestroy", "NVFATBIN", lib.destroy, handle)
    return bytes(buffer)
