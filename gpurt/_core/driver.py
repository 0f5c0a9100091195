"""The one door to the CUDA driver: lazy initialisation, errors, fork safety.

Every other module calls ``cuda.bindings`` functions and hands the result tuple to
:func:`check`, the only place where a ``CUresult`` (or ``nvrtcResult``) becomes a Python
exception. ``import gpurt`` never touches the GPU: :func:`init` runs on first use, once,
under a lock, and remembers the process that did it so a forked child gets a clear error
instead of a hang.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from cuda.bindings import __version__ as _bindings_version
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc as _nvrtc

from .fork import at_fork_in_child

__all__ = [
    "CudaError",
    "CudaUnavailableError",
    "OutOfMemoryError",
    "check",
    "check_call",
    "init",
    "is_initialized",
    "driver_version",
    "bindings_version",
]

_SUCCESS = 0
_NO_DRIVER_HELP = (
    "no NVIDIA driver was found on this machine (libcuda could not be loaded). "
    "GPU calls need an NVIDIA GPU and its driver; compiling kernels ahead of time "
    "(gpurt.compile(..., arch='sm_90')) still works without one."
)
_FORK_HELP = (
    "Cannot re-initialize CUDA in forked subprocess: CUDA was initialised in the parent "
    "before fork(). Use the 'spawn' or 'forkserver' start method of multiprocessing."
)


class CudaError(RuntimeError):
    """A CUDA driver (or NVRTC) call failed: ``code``, its ``name`` and the driver's text."""

    def __init__(self, code: int, name: str, description: str, call: str = "") -> None:
        self.code = int(code)
        self.name = name
        self.description = description
        self.call = call
        where = f" (in {call})" if call else ""
        super().__init__(f"{name}: {description}{where}")


class CudaUnavailableError(CudaError):
    """CUDA cannot be used here: no driver, no device, or a forked child."""

    def __init__(self, message: str, code: int = 100) -> None:
        # 100 is CUDA_ERROR_NO_DEVICE; the text carries the real reason.
        super().__init__(code, "CUDA_UNAVAILABLE", message)
        self.args = (message,)

    def __str__(self) -> str:
        return self.description


class OutOfMemoryError(CudaError, MemoryError):
    """Device memory is exhausted (``CUDA_ERROR_OUT_OF_MEMORY``); also a ``MemoryError``."""


_lock = threading.RLock()
_initialized = False
_initializing = False  # cuInit is running (on some thread, under _lock)
_init_error: CudaUnavailableError | None = None
_init_pid: int | None = None
_forked_child = False


def _error_text(err: Any) -> tuple[str, str]:
    """Name and description of a CUresult or nvrtcResult, never raising."""
    if isinstance(err, _nvrtc.nvrtcResult):
        res = _nvrtc.nvrtcGetErrorString(err)
        text = res[1].decode() if res[0] == _SUCCESS else ""
        return err.name, text or err.name
    try:
        name_res = cu.cuGetErrorName(err)
        desc_res = cu.cuGetErrorString(err)
        name = name_res[1].decode() if name_res[0] == _SUCCESS else ""
        desc = desc_res[1].decode() if desc_res[0] == _SUCCESS else ""
    except Exception:  # the driver itself may be unloadable
        name, desc = "", ""
    if not name:
        name = getattr(err, "name", f"CUDA_ERROR_{int(err)}")
    return name, desc or "unknown error"


def raise_for(err: Any, call: str = "") -> None:
    """Raise the exception that matches a failed result code."""
    code = int(err)
    if _forked_child and code == int(cu.CUresult.CUDA_ERROR_NOT_INITIALIZED):
        raise CudaUnavailableError(_FORK_HELP, code)
    name, desc = _error_text(err)
    if code == int(cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY) and not isinstance(
        err, _nvrtc.nvrtcResult
    ):
        raise OutOfMemoryError(code, name, desc, call)
    raise CudaError(code, name, desc, call)


def check(result: tuple, call: str = "") -> Any:
    """Unwrap a ``(err, *values)`` tuple from cuda.bindings: raise on error, else return
    nothing, the single value, or the tuple of values."""
    err = result[0]
    if err != _SUCCESS:
        raise_for(err, call)
    n = len(result)
    if n == 1:
        return None
    if n == 2:
        return result[1]
    return result[1:]


def check_call(call: str, library: str, function: Callable[..., Any], *args: Any) -> Any:
    """Call ``function`` of a library whose bindings raise their own errors instead of
    returning a result code (nvJitLink, nvFatbin) and turn such an error into a CudaError
    named ``<library>_<status name>``, so that callers catch one family of exceptions."""
    try:
        return function(*args)
    except Exception as exc:
        status = getattr(exc, "status", None)
        if not isinstance(status, int):
            raise
        name = str(exc).split(" (")[0] or f"ERROR_{status}"
        raise CudaError(status, f"{library}_{name}", str(exc), call) from None


def _after_fork_in_child() -> None:
    """The child of a fork: CUDA started (or starting, on another thread) in the parent
    cannot be used here; and _lock, which that thread may hold, is renewed (only the
    forking thread lives on in the child, so a held lock would never be released)."""
    global _forked_child, _initialized, _initializing, _lock
    _lock = threading.RLock()
    if _initialized or _initializing:
        _forked_child = True
        _initialized = _initializing = False


at_fork_in_child("driver", _after_fork_in_child)


def init() -> None:
    """Initialise the driver once (``cuInit``); raise :class:`CudaUnavailableError` with
    the reason when CUDA cannot be used. Cheap after the first call."""
    if _initialized:
        return
    _slow_init()


def _slow_init() -> None:
    global _initialized, _initializing, _init_error, _init_pid
    with _lock:
        if _initialized:
            return
        if _forked_child:
            raise CudaUnavailableError(_FORK_HELP, 3)
        if _init_error is not None:
            # A fresh exception each time: re-raising the cached one would grow its
            # traceback on every call (device_count() is called over and over).
            raise CudaUnavailableError(_init_error.description, _init_error.code) from None
        _initializing = True
        try:
            err = cu.cuInit(0)[0]
        except Exception as exc:  # libcuda.so missing: the bindings raise while loading it
            _init_error = CudaUnavailableError(f"{_NO_DRIVER_HELP} [{exc.__class__.__name__}]")
            raise _init_error from None
        finally:
            _initializing = False
        if err != _SUCCESS:
            name, desc = _error_text(err)
            if int(err) == int(cu.CUresult.CUDA_ERROR_NO_DEVICE):
                msg = "the NVIDIA driver is loaded but found no CUDA device"
            else:
                msg = f"CUDA driver initialisation failed: {name}: {desc}"
            _init_error = CudaUnavailableError(msg, int(err))
            raise _init_error
        _init_pid = os.getpid()
        _initialized = True


def is_initialized() -> bool:
    """True once the driver has been initialised in this process."""
    return _initialized


def is_forked_child() -> bool:
    """True in a child forked after the parent initialised CUDA."""
    return _forked_child


def driver_version() -> int | None:
    """The driver's CUDA version as an int (13000 = 13.0), or None without a driver."""
    try:
        init()
    except CudaUnavailableError:
        return None
    return int(check(cu.cuDriverGetVersion()))


def bindings_version() -> str:
    """The installed cuda-bindings version string."""
    return str(_bindings_version)
