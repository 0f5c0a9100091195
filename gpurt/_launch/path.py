"""Which driver call kernel launches take: gpurt._launch._claunch's, or cuda.bindings' from Python.

The C extension ``gpurt._launch._claunch`` (gpurt/_launch/_claunch*.c, built on install where
there is a C compiler) calls the driver's cuLaunchKernel, whose address
:func:`find_launch_kernel` gets once through cuda.bindings (cuGetProcAddress), the way the
bindings find it for themselves.
Without the extension, or with ``GPURT_PURE_PYTHON_LAUNCH=1`` (read at import, for debugging),
launches go through cuda.bindings' cuLaunchKernel from Python. gpurt/_launch/kernel.py makes the
launchers; ``gpurt info`` reports :func:`launch_path`.
"""

from __future__ import annotations

import os
from typing import Any

from cuda.bindings import driver as cu

from .._core.driver import CudaError, CudaUnavailableError, check, init

__all__ = ["PURE_PYTHON_ENV", "capture_status", "claunch", "find_launch_kernel",
           "find_launch_kernel_ex", "launch_path", "pure_python", "result_code", "route"]

PURE_PYTHON_ENV = "GPURT_PURE_PYTHON_LAUNCH"
pure_python = os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")

_not_built = ""
try:
    import gpurt._launch._claunch as claunch  # (not "from . import": its error would blame a cycle)
except ImportError as exc:  # installed without a C compiler
    claunch = None  # type: ignore[assignment]
    _not_built = f"the C extension gpurt._launch._claunch is not built ({exc})"

_found: tuple[int, str] | None = None  # (address of the driver's cuLaunchKernel or 0, why)
_found_ex: tuple[int, str] | None = None  # the same for cuLaunchKernelEx


def _lookup(name: str, versions: tuple[int, int]) -> tuple[int, str]:
    """(the address of the driver's ``name`` or 0, why), asked for as cuda.bindings asks:
    ``versions`` = (legacy stream version, per-thread default stream version)."""
    init()
    flags = cu.CUdriverProcAddress_flags
    try:
        per_thread = int(os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0"))
    except ValueError:
        per_thread = 0
    if per_thread:
        version, flag = versions[1], flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    else:
        version, flag = versions[0], flags.CU_GET_PROC_ADDRESS_LEGACY_STREAM
    try:
        address, _ = check(cu.cuGetProcAddress(name.encode(), version, flag),
                           f"cuGetProcAddress({name})")
    except CudaError as err:
        return 0, str(err)
    address = int(address or 0)
    return (address, f"gpurt._launch._claunch calls {name} at {address:#x}" if address
            else f"cuGetProcAddress found no {name}")


def find_launch_kernel() -> tuple[int, str]:
    """The address of the driver's cuLaunchKernel as cuda.bindings finds it (the per-thread
    default stream variant where CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM asks for it), or 0,
    and why (wraps cuGetProcAddress). Looked up once; initialises the driver."""
    global _found
    if _found is None:
        _found = _lookup("cuLaunchKernel", (4000, 7000))
    return _found


def find_launch_kernel_ex() -> tuple[int, str]:
    """:func:`find_launch_kernel` for cuLaunchKernelEx (CUDA 11.8+), which cluster launches
    of gpurt._launch._claunch.PlannedLaunch call."""
    global _found_ex
    if _found_ex is None:
        _found_ex = _lookup("cuLaunchKernelEx", (12000, 12000))
    return _found_ex


_capturing: int | None = None  # the address of the driver's cuStreamIsCapturing, or 0


def capture_status(handle: int) -> tuple[int, int] | None:
    """cuStreamIsCapturing for stream ``handle`` called from C: (CUresult, status) as ints
    (gpurt/_streams/handles.py's stream_is_capturing asks here), or None where the driver
    has no such function to call (the caller asks through cuda.bindings). The driver's
    address is looked up on the first call."""
    global _capturing
    if _capturing is None:
        _capturing = _lookup("cuStreamIsCapturing", (10000, 10000))[0]
    return claunch.capture_status(_capturing, handle) if _capturing else None


def route() -> tuple[int, str]:
    """(the address of cuLaunchKernel for gpurt._launch._claunch, or 0 for cuda.bindings'
    path, why).
    Initialises the driver where the extension is there."""
    if pure_python:
        return 0, f"{PURE_PYTHON_ENV} is set"
    if claunch is None:
        return 0, _not_built
    return find_launch_kernel()


def launch_path() -> dict[str, str]:
    """How kernel launches reach the driver: ``{"path": "compiled" or "python", "why": ...}``.
    "compiled": gpurt._launch._claunch calls cuLaunchKernel from C; "python": cuda.bindings'
    cuLaunchKernel is called from Python (a few tenths of a microsecond more per launch)."""
    try:
        address, why = route()
    except CudaUnavailableError:  # the extension is there, the driver is not
        return {"path": "compiled", "why": "gpurt._launch._claunch is built; it finds "
                                           "cuLaunchKernel once a driver is there"}
    return {"path": "compiled" if address else "python", "why": why}


def result_code(code: Any) -> Any:
    """The CUresult of a result code from gpurt._launch._claunch (an int; kept an int where the
    bindings do not know it), for :func:`gpurt._core.driver.check`."""
    try:
        return cu.CUresult(code)
    except ValueError:
        return int(code)
