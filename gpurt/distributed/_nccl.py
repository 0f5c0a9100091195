"""NCCL through NVIDIA's nccl4py bindings (``nccl.bindings.nccl``, the ``nccl4py`` wheel,
which finds ``libnccl.so.2`` of the ``nvidia-nccl-cu13``/``-cu12`` wheels).

This module owns: loading the bindings (with an install hint when they are missing), the
one place an NCCL status becomes a Python exception (:func:`call` → :class:`NcclError`),
dtypes and reduce ops in NCCL's terms, and communicators with their lifetime. NCCL itself
is imported on first use, never by ``import gpurt``.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import importlib
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from .._array import dtypes as _dtypes
from .._core.fork import renew_after_fork
from .._streams.handles import deferred_while_unsafe
from ..device import bind_context
from ._store import DistributedError

__all__ = ["NcclError", "ReduceOp"]

INSTALL_HINT = ("gpurt's collectives run on NCCL through NVIDIA's nccl4py bindings: "
                "pip install 'gpurt[nccl]' (nccl4py and nvidia-nccl-cu13)")
UNIQUE_ID_BYTES = 128
_IN_PROGRESS = 7  # ncclInProgress: a non-blocking call still running

_module: Any = None
_load_lock = threading.Lock()
renew_after_fork(globals(), _load_lock=threading.Lock)


class NcclError(DistributedError):
    """An NCCL call failed; ``status`` is NCCL's ncclResult_t, ``call`` the failing call."""

    def __init__(self, call: str, status: int, text: str) -> None:
        self.call, self.status = call, status
        super().__init__(f"{call} failed: {text}")


def bindings() -> Any:
    """The ``nccl.bindings.nccl`` module, imported once; DistributedError if absent."""
    global _module
    if _module is None:
        with _load_lock:
            if _module is None:
                try:
                    module = importlib.import_module("nccl.bindings.nccl")
                except ImportError as exc:
                    raise DistributedError(f"{INSTALL_HINT} ({exc})") from None
                _module = module
    return _module


def is_available() -> bool:
    """True if the NCCL bindings and library can be loaded."""
    try:
        bindings().get_version()
    except Exception:  # a missing wheel or a library that does not load
        return False
    return True


def describe() -> dict[str, Any]:
    """For ``gpurt info``: whether collectives can run here, NCCL's version, or why not."""
    try:
        major, minor, patch = version()
    except Exception as exc:  # a missing wheel or a library that does not load
        return {"available": False, "version": None, "why": str(exc)}
    return {"available": True, "version": f"{major}.{minor}.{patch}",
            "why": f"NCCL {major}.{minor}.{patch} through nccl4py"}


def call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, an NCCL binding; its failure raised as :class:`NcclError`."""
    try:
        return fn(*args)
    except bindings().NCCLError as exc:
        raise NcclError(what, int(getattr(exc, "status", -1)), str(exc)) from None


def error_text(status: int) -> str:
    """NCCL's words for an ncclResult_t (its number alone if NCCL cannot say)."""
    try:
        return str(bindings().get_error_string(status))
    except Exception:  # the library is gone or the code unknown: still say something
        return f"ncclResult_t {status}"


def version() -> tuple[int, int, int]:
    """The loaded NCCL library's version as (major, minor, patch)."""
    code = call("ncclGetVersion", bindings().get_version)
    return code // 10000, code // 100 % 100, code % 100


# ---- dtypes and reduce ops ---------------------------------------------------------------


class ReduceOp(enum.IntEnum):
    """Reductions, with torch.distributed.ReduceOp's names and NCCL's values."""

    SUM = 0
    PRODUCT = 1
    MAX = 2
    MIN = 3
    AVG = 4  # NCCL >= 2.10; integer AVG is NCCL's (truncating) division


_DATATYPES: dict[np.dtype, int] = {
    np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8,
    _dtypes.bfloat16: 9,
    np.dtype(ml_dtypes.float8_e4m3fn): 10, np.dtype(ml_dtypes.float8_e5m2): 11,  # NCCL >= 2.24
}


def datatype(dtype: np.dtype, what: str) -> int:
    """NCCL's ncclDataType_t for ``dtype``; TypeError naming ``what`` if NCCL has none."""
    code = _DATATYPES.get(dtype)
    if code is None:
        if dtype == np.dtype(np.bool_):  # bytes as far as NCCL is concerned, as in torch
            return _DATATYPES[np.dtype(np.uint8)]
        names = ", ".join(sorted(d.name for d in _DATATYPES))
        raise TypeError(f"{what}: NCCL has no {dtype.name} type (it has {names})")
    return code


def reduce_op(op: Any, dtype: np.dtype, what: str) -> int:
    """NCCL's ncclRedOp_t for ``op`` (a ReduceOp or its name) applied to ``dtype``."""
    try:
        op = ReduceOp[op.upper()] if isinstance(op, str) else ReduceOp(op)
    except (KeyError, ValueError):
        raise ValueError(f"{what}: unknown reduce op {op!r}; use one of "
                         f"{', '.join(o.name for o in ReduceOp)}") from None
    if dtype == np.dtype(np.bool_) and op not in (ReduceOp.MAX, ReduceOp.MIN):
        raise TypeError(f"{what}: bool arrays reduce with MAX (or) and MIN (and) only")
    return int(op)


# ---- communicators -----------------------------------------------------------------------


def unique_id() -> bytes:
    """A fresh ncclUniqueId (128 bytes) for a new group of ranks (ncclGetUniqueId)."""
    uid = call("ncclGetUniqueId", bindings().get_unique_id)
    return ctypes.string_at(uid.ptr, UNIQUE_ID_BYTES)


def _release(handle: Any, abort: bool) -> None:
    """Destroy (or abort) a communicator; never raises. A finalizer's destroy waits while a
    graph capture is underway or on the driver's host-callback thread (ncclCommDestroy frees
    device memory and waits for the device, which invalidates a capture)."""
    if not abort and deferred_while_unsafe(_release, handle, abort):
        return
    nccl = bindings()
    with contextlib.suppress(Exception):  # a finaliser must not raise; the process may be exiting
        (nccl.comm_abort if abort else nccl.comm_destroy)(handle)


class Communicator:
    """One rank's seat in an NCCL communicator, on one device. Destroyed by
    :meth:`destroy` (or :meth:`abort`), and by a finaliser when dropped."""

    def __init__(self, handle: Any, device: int, rank: int, size: int) -> None:
        self.handle, self.device, self.rank, self.size = handle, device, rank, size
        self._finalizer = weakref.finalize(self, _release, handle, False)

    def __repr__(self) -> str:
        state = "" if self.alive else ", destroyed"
        return (f"<gpurt NCCL communicator rank {self.rank}/{self.size} "
                f"on cuda:{self.device}{state}>")

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def async_error(self) -> int:
        """NCCL's asynchronous error state (0 when healthy; ncclCommGetAsyncError)."""
        return int(call("ncclCommGetAsyncError", bindings().comm_get_async_error, self.handle))

    def destroy(self) -> None:
        """Free the communicator once its work has finished (ncclCommDestroy)."""
        if self._finalizer.detach() is not None:
            bind_context(self.device)
            call("ncclCommDestroy", bindings().comm_destroy, self.handle)

    def abort(self) -> None:
        """Stop the communicator's pending work and free it (ncclCommAbort); safe from
        another thread while a collective hangs."""
        if self._finalizer.detach() is not None:
            _release(self.handle, True)


def init_rank(size: int, uid: bytes, rank: int, device: int) -> Communicator:
    """Rank ``rank`` of ``size`` joins the group named by ``uid``, on ``device``; blocks
    until all ranks have joined (ncclCommInitRank)."""
    nccl = bindings()
    handle_id = nccl.UniqueId.from_buffer(bytearray(uid))
    bind_context(device)  # NCCL takes the thread's current device as the rank's device
    handle = call("ncclCommInitRank", nccl.comm_init_rank, size, handle_id, rank)
    return Communicator(handle, device, rank, size)


def init_all(devices: Sequence[int]) -> list[Communicator]:
    """One communicator per device of ``devices`` for one process driving them all;
    rank i is ``devices[i]`` (ncclCommInitAll)."""
    handles = call("ncclCommInitAll", bindings().comm_init_all, len(devices), list(devices))
    return [Communicator(h, d, r, len(devices)) for r, (h, d) in enumerate(zip(handles, devices))]


def call_group(what: str, calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    """Each (binding, arguments) of ``calls`` as one NCCL group (ncclGroupStart/End):
    needed when one thread drives several devices, and for send/recv pairs."""
    nccl = bindings()
    call("ncclGroupStart", nccl.group_start)
    try:
        for fn, args in calls:
            call(what, fn, *args)
    finally:
        call("ncclGroupEnd", nccl.group_end)
