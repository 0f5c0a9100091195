"""Plumbing under streams.py: driver calls bound to a device, owned stream/event handles
with deferred release, and the trampoline that runs Python host callbacks.

Finalizers never call the driver: they queue the handle, and :func:`release_pending` destroys
queued handles at a safe point (streams.py calls it when it creates or closes a stream or an
event). A finalizer may fire anywhere -- inside a host callback, where CUDA calls are not
permitted, or at shutdown -- so this is the only safe place to do it.

Layers above may still hold a stream's raw handle (the caching allocator keeps the streams a
block was used on, and records events on them later). Recording on a destroyed stream is not
an error the driver reports: it crashes the process. So before gpurt destroys a stream it
owns, it asks the hooks registered with :func:`before_stream_destroy` to finish with it; a
hook that cannot do so now (a graph capture is underway) makes the destroy wait for the next
safe point.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import itertools
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as cu

from .._core import driver as _driver
from .._core.captures import CAPTURES
from .._core.driver import CudaError, check
from ..device import bind_context, current_device

__all__: list[str] = []

_NOT_CAPTURING = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
_NOT_CAPTURING_CODE = int(_NOT_CAPTURING)
_NOT_READY = int(cu.CUresult.CUDA_ERROR_NOT_READY)
_IMPLICIT = int(cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)


# ---- driver calls on a device ----------------------------------------------------------


def raw_call(index: int, fn: Callable[..., tuple], *args: Any) -> tuple:
    """Call driver ``fn(*args)`` with device ``index``'s context bound and return its raw
    result tuple. The calling thread's current device is bound again afterwards, so raw
    driver calls by the user keep seeing the device they chose."""
    bind_context(index)
    try:
        return fn(*args)
    finally:
        current = current_device()
        if current != index:
            bind_context(current)


def call(index: int, name: str, fn: Callable[..., tuple], *args: Any) -> Any:
    """:func:`raw_call`, then :func:`gpurt._core.driver.check` on the result."""
    return check(raw_call(index, fn, *args), name)


def is_ready(index: int, name: str, fn: Callable[..., tuple], handle: Any) -> bool:
    """True when a ``cuStreamQuery``/``cuEventQuery``-style call says the work is done,
    False on CUDA_ERROR_NOT_READY; any other error raises."""
    result = raw_call(index, fn, handle)
    if int(result[0]) == _NOT_READY:
        return False
    check(result, name)
    return True


def not_ready(result: tuple) -> bool:
    """True when a raw result is CUDA_ERROR_NOT_READY."""
    return int(result[0]) == _NOT_READY


# capture_status(handle) -> (CUresult, status) as ints, or None: cuStreamIsCapturing called
# from C, registered by the launch layer where its extension is built
# (gpurt/_launch/planned.py), or None
_capture_status: Callable[[int], tuple[int, int] | None] | None = None


def use_capture_status(query: Callable[[int], tuple[int, int] | None]) -> None:
    """Let :func:`stream_is_capturing` ask ``query(handle)`` for int handles (the split-K
    kernels ask on every call: the bindings' call and its enum objects cost ~2 us)."""
    global _capture_status
    _capture_status = query


def stream_is_capturing(index: int, handle: Any) -> bool:
    """Whether the stream ``handle`` of device ``index`` is capturing a CUDA graph (wraps
    cuStreamIsCapturing; the legacy stream while another stream captures counts as
    capturing)."""
    bind_context(index)
    found = _capture_status(handle) if type(handle) is int and _capture_status else None
    if found is not None:
        result, status = found
        if result == 0:
            return status != _NOT_CAPTURING_CODE
        if result == _IMPLICIT:
            return True
        check((cu.CUresult(result),), "cuStreamIsCapturing")  # raises for any other error
    try:
        status = check(cu.cuStreamIsCapturing(handle), "cuStreamIsCapturing")
    except CudaError as exc:
        if exc.name == "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT":
            return True
        raise
    return status != _NOT_CAPTURING


def capture_id(index: int, handle: Any) -> int | None:
    """The id of the CUDA graph capture that stream ``handle`` of device ``index`` takes part
    in (unique in the process), or None when it captures nothing, or is the legacy stream
    while another stream captures (wraps cuStreamGetCaptureInfo)."""
    bind_context(index)
    result = cu.cuStreamGetCaptureInfo(handle)
    if int(result[0]) == _IMPLICIT:
        return None
    status, found = check(result, "cuStreamGetCaptureInfo")[:2]
    return None if status == _NOT_CAPTURING else int(found)


# ---- owned handles and their deferred release ------------------------------------------


StreamHook = Callable[[int, int], bool]
_stream_hooks: list[StreamHook] = []


def before_stream_destroy(hook: StreamHook) -> None:
    """Register ``hook(device_index, stream_handle) -> bool``, called before gpurt destroys a
    stream it owns. The hook must stop every later use of that handle (e.g. record the events
    it would have recorded there later, now) and must not raise; it returns False when it
    cannot do that yet, and the stream is then kept and destroyed at a later safe point (the
    hooks are asked again then, so a hook may see the same stream twice)."""
    if hook not in _stream_hooks:
        _stream_hooks.append(hook)


class Owned:
    """A stream or event handle gpurt created and must destroy exactly once. It holds no
    reference to the Python object that uses it, so it can outlive it in the queue."""

    __slots__ = ("destroy", "handle", "index", "kind", "name")

    def __init__(self, handle: Any, index: int, kind: str, destroy: Callable[..., tuple],
                 name: str) -> None:
        self.handle = handle
        self.index = index
        self.kind = kind
        self.destroy = destroy
        self.name = name
        _live[kind] += 1

    def release(self) -> bool:
        """Destroy the handle (skipped in a forked child, where it belongs to the parent).
        False when a :func:`before_stream_destroy` hook asked to wait: nothing was done, and
        the caller queues the handle for a later safe point."""
        if _driver.is_forked_child():
            _live[self.kind] -= 1
            return True
        if self.kind == "stream":
            handle = int(self.handle)
            ready = [hook(self.index, handle) for hook in list(_stream_hooks)]
            if not all(ready):
                return False
        try:
            call(self.index, self.name, self.destroy, self.handle)
        finally:
            _live[self.kind] -= 1
        return True


_live: collections.Counter[str] = collections.Counter()
_pending: collections.deque[Owned] = collections.deque()


def adopt(owner: object, owned: Owned) -> weakref.finalize:
    """Queue ``owned`` for release when ``owner`` is collected (never at exit)."""
    finalizer = weakref.finalize(owner, _pending.append, owned)
    finalizer.atexit = False
    return finalizer


def release_later(owned: Owned) -> None:
    """Queue ``owned`` for the next :func:`release_pending` (its release had to wait)."""
    _pending.append(owned)


def release_pending() -> None:
    """Destroy the handles of collected streams and events; called at safe points. A stream
    whose destroy must wait (see :func:`before_stream_destroy`) stays queued for the next."""
    for _ in range(len(_pending)):  # what is queued now: a waiting stream is queued again
        try:
            owned = _pending.popleft()
        except IndexError:  # another thread emptied it
            return
        try:
            if not owned.release():
                _pending.append(owned)
        except CudaError as exc:
            warnings.warn(f"gpurt: releasing a collected {owned.kind} failed: {exc}",
                          RuntimeWarning, stacklevel=2)


def live_handles() -> dict[str, int]:
    """How many stream and event handles gpurt owns right now (for leak checks)."""
    return {"stream": _live["stream"], "event": _live["event"]}


# ---- host callbacks ------------------------------------------------------------------------

_host_callbacks: dict[int, Callable[[], Any]] = {}  # one-shot: dropped once they ran
_graph_callbacks: dict[int, Callable[[], Any]] = {}  # captured into graphs: run on every replay
_callback_keys = itertools.count(1)
_callback_thread = threading.local()  # .running: a host callback runs on this thread now


def in_host_callback() -> bool:
    """True on the driver's thread while it runs a host callback, where no CUDA call is
    permitted (also for finalizers that the garbage collector happens to run there)."""
    return getattr(_callback_thread, "running", False)


def deferred_while_unsafe(release: Callable[..., Any], *args: Any) -> bool:
    """For a finalizer whose driver call a capture forbids (it waits for the device): while a
    graph capture is underway or on the driver's host-callback thread, queue
    ``release(*args)`` for when the last capture ends (CAPTURES.defer) and return True; else
    False, and the caller runs it now."""
    if CAPTURES.count or in_host_callback():
        CAPTURES.defer(release, *args)
        return True
    return False


def _run_host_callback(key: int | None) -> None:
    """Runs on the driver's callback thread. An exception propagates to ctypes, which
    reports it through ``sys.unraisablehook`` and carries on: it never crashes the process."""
    key = key or 0
    _callback_thread.running = True
    try:
        captured = _graph_callbacks.get(key)
        if captured is not None:
            captured()
            return
        try:
            callback = _host_callbacks.get(key)
            if callback is not None:
                callback()
        finally:
            _host_callbacks.pop(key, None)
    finally:
        _callback_thread.running = False


_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_run_host_callback)  # lives forever
_HOST_FN_ADDRESS = ctypes.cast(_HOST_FN, ctypes.c_void_p).value
_libcuda_launch_host_func: Any = None


def launch_host_func(stream: Any, key: int) -> tuple:
    """``cuLaunchHostFunc(stream, trampoline, key)`` called on libcuda directly, returning
    the bindings' ``(CUresult,)`` shape for :func:`check`. The cuda.bindings wrapper frees
    its per-launch record after the first call, so a host node captured into a graph would
    read freed memory on its second replay; our trampoline needs no such record."""
    global _libcuda_launch_host_func
    if _libcuda_launch_host_func is None:
        lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        fn = lib.cuLaunchHostFunc
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        _libcuda_launch_host_func = fn
    rc = _libcuda_launch_host_func(int(stream), _HOST_FN_ADDRESS, key)
    return (cu.CUresult(rc),)


def keep_callback(fn: Callable[[], Any], *, captured: bool = False) -> int:
    """Hold ``fn`` for the trampoline; the key is the callback's ``userData``. A one-shot
    callback is dropped once it ran; a ``captured`` one (launched into a graph being
    captured) runs on every replay, so it is kept for the life of the process."""
    key = next(_callback_keys)
    (_graph_callbacks if captured else _host_callbacks)[key] = fn
    return key


def drop_callback(key: int) -> None:
    """Forget a callback whose launch failed."""
    _host_callbacks.pop(key, None)
    _graph_callbacks.pop(key, None)


def pending_callbacks() -> int:
    """How many one-shot host callbacks were launched and have not finished yet."""
    return len(_host_callbacks)


@atexit.register
def _drain_host_callbacks(timeout: float = 5.0) -> None:
    """At exit, give pending callbacks a moment to run before the interpreter goes away
    (a callback entering a finalised interpreter would crash it). No driver calls."""
    deadline = time.monotonic() + timeout
    while _host_callbacks and time.monotonic() < deadline:
        time.sleep(0.001)
