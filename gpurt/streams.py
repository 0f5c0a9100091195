"""Streams and events with torch.cuda's names and meanings.

The current stream is per thread and per device: ``set_stream``, ``with stream(s):`` and
``with Stream():`` change it for the calling thread only, and a new thread starts on each
device's default stream (the legacy NULL stream, handle 0). :func:`current_stream` and
:func:`current_stream_handle` sit on the hot path of every launch and allocation, so they are
a thread-local lookup and nothing more.

Handles are owned by the object that created them: :meth:`Stream.close` and
:meth:`Event.close` destroy them at once; a dropped object is released by a
``weakref.finalize`` that only queues its handle, and the queue is emptied at the next safe
point (creating or closing a stream or an event), never from a finalizer, a host callback
or interpreter shutdown. Borrowed handles (:class:`ExternalStream`, default streams) are never
destroyed by us.
"""

from __future__ import annotations

import ctypes
import operator
import weakref
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as cu

from ._core import syncdebug
from ._core.driver import check
from ._core.state import THREAD, Saved, all_thread_streams
from ._sanitizer import hooks as _csan
from ._streams.handles import (
    Owned,
    adopt,
    call,
    drop_callback,
    is_ready,
    keep_callback,
    launch_host_func,
    live_handles,  # noqa: F401  (re-exported for leak checks)
    not_ready,
    raw_call,
    release_later,
    release_pending,
)
from .device import Device, DeviceLike, _index, current_device, set_device

__all__ = [
    "Event",
    "ExternalStream",
    "Stream",
    "StreamContext",
    "as_stream",
    "as_stream_handle",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
]

_NON_BLOCKING = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
_EVENT_DISABLE_TIMING = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
_EVENT_BLOCKING_SYNC = int(cu.CUevent_flags.CU_EVENT_BLOCKING_SYNC)
_EVENT_INTERPROCESS = int(cu.CUevent_flags.CU_EVENT_INTERPROCESS)
_CAPTURE_NONE = int(cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)
_IPC_HANDLE_SIZE = 64  # CU_IPC_HANDLE_SIZE


# ---- per-thread current streams ----------------------------------------------------------


def _in_use(stream: Stream) -> bool:
    """True when ``stream`` is current on some thread or will be restored by a ``with``."""
    for state in all_thread_streams():
        if stream in list(state.streams.values()):
            return True
        if any(stream in saved for saved in list(state.saved)):
            return True
    return False


def _enter(owner: object, stream: Stream) -> None:
    """Make ``stream`` (and its device) current on this thread, remembering what was."""
    stream._live()
    state = THREAD.streams
    target = stream.device_index
    prev_device = current_device()
    saved = Saved(owner, prev_device, state.streams.get(prev_device), target,
                   state.streams.get(target))
    if prev_device != target:
        set_device(target)
    state.assign(target, stream)
    state.saved.append(saved)


def _exit(owner: object) -> None:
    """Undo the latest :func:`_enter` of ``owner`` on this thread."""
    saved_list = THREAD.streams.saved
    for position in range(len(saved_list) - 1, -1, -1):
        if saved_list[position].owner is owner:
            saved = saved_list.pop(position)
            break
    else:
        return  # __exit__ without __enter__ on this thread
    state = THREAD.streams
    state.assign(saved.target_device, saved.target_prev)
    state.assign(saved.prev_device, saved.prev_stream)
    if current_device() != saved.prev_device:
        set_device(saved.prev_device)


def current_stream_handle(index: int) -> int:
    """Raw handle (an int, 0 = legacy default stream) of this thread's current stream on
    device ``index``. Unchecked, for the launch and allocation hot paths."""
    return THREAD.streams.handles.get(index, 0)


# ---- streams ---------------------------------------------------------------------------------


def as_stream_handle(stream: Any, device: DeviceLike = None) -> int:
    """The raw handle (an int; 0 is the legacy default stream) of ``stream``: None (this
    thread's current stream on ``device``, default the current device), an int handle, a
    gpurt Stream, a CUstream, or a stream of another library: anything with
    ``__cuda_stream__`` (cuda.core's protocol), ``cuda_stream`` (torch) or an int ``ptr``
    (CuPy). Raises TypeError for anything else. The one such conversion in gpurt."""
    if type(stream) is int:
        return stream
    if stream is None:
        return current_stream_handle(current_device() if device is None else _index(device))
    if isinstance(stream, Stream):
        return stream._ident
    if isinstance(stream, (int, cu.CUstream)) and not isinstance(stream, bool):
        return int(stream)
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is None:
        handle = getattr(stream, "ptr", None)  # cupy.cuda.Stream
    if isinstance(handle, int):
        return int(handle)
    raise TypeError(f"expected a stream (a gpurt.Stream, an object with __cuda_stream__, "
                    f"cuda_stream or ptr, an int handle, or None), got {type(stream).__name__}")


def as_stream(stream: Any, device: DeviceLike = None) -> Stream:
    """``stream`` as a gpurt Stream: this thread's current stream on ``device`` for None, a
    gpurt Stream itself, anything else :func:`as_stream_handle` takes as an
    :class:`ExternalStream` on ``device`` (default: the current device)."""
    if stream is None:
        return current_stream(device)
    if isinstance(stream, Stream):
        return stream
    return ExternalStream(stream, device)


class Stream:
    """A CUDA stream on one device, created non-blocking (wraps cuStreamCreateWithPriority).

    ``priority``: lower is more urgent; values outside :meth:`priority_range` are clamped by
    the driver. ``with Stream() as s:`` makes ``s`` (and its device) current on this thread
    and restores what was there on exit; streams are reusable as context managers and nest.
    """

    __slots__ = (
        "__weakref__",
        "_device",
        "_finalizer",
        "_handle",
        "_ident",
        "_owned",
        "device_index",
    )

    def __init__(self, device: DeviceLike = None, priority: int = 0) -> None:
        index = _index(device)
        release_pending()
        handle = call(index, "cuStreamCreateWithPriority", cu.cuStreamCreateWithPriority,
                      _NON_BLOCKING, operator.index(priority))
        self._setup(index, handle,
                    Owned(handle, index, "stream", cu.cuStreamDestroy, "cuStreamDestroy"))

    def _setup(self, index: int, handle: Any, owned: Owned | None = None) -> None:
        """Fill in a new Stream; ``owned`` is None for handles gpurt must not destroy."""
        self.device_index = index
        self._device = Device(index)
        self._handle = handle
        self._ident = int(handle)
        self._owned = owned
        self._finalizer = None if owned is None else adopt(self, owned)

    @classmethod
    def _borrow(cls, index: int, handle: int) -> Stream:
        """A Stream over a handle gpurt does not own (never destroyed by us)."""
        self = cls.__new__(cls)
        self._setup(index, cu.CUstream(handle))
        return self

    def _live(self) -> Any:
        """The handle, or a clear error once the stream was closed."""
        handle = self._handle
        if handle is None:
            raise RuntimeError(f"{self!r} was closed; create a new Stream")
        return handle

    # -- identity --
    @property
    def handle(self) -> Any:
        """The driver's ``CUstream``."""
        return self._live()

    @property
    def cuda_stream(self) -> int:
        """The raw stream handle as an int (0 for the legacy default stream)."""
        self._live()
        return self._ident

    @property
    def device(self) -> Device:
        """The device this stream belongs to."""
        return self._device

    @property
    def priority(self) -> int:
        """This stream's priority (wraps cuStreamGetPriority)."""
        return int(call(self.device_index, "cuStreamGetPriority", cu.cuStreamGetPriority,
                        self._live()))

    @staticmethod
    def priority_range(device: DeviceLike = None) -> tuple[int, int]:
        """(least, greatest) stream priority, e.g. (0, -5) (wraps cuCtxGetStreamPriorityRange)."""
        least, greatest = call(_index(device), "cuCtxGetStreamPriorityRange",
                               cu.cuCtxGetStreamPriorityRange)
        return int(least), int(greatest)

    def __cuda_stream__(self) -> tuple[int, int]:
        """cuda.core's stream protocol: (version 0, raw handle)."""
        self._live()
        return (0, self._ident)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stream):
            return NotImplemented
        return self.device_index == other.device_index and self._ident == other._ident

    def __hash__(self) -> int:
        return hash((self.device_index, self._ident))

    def __repr__(self) -> str:
        closed = " (closed)" if self._handle is None else ""
        return (f"<gpurt.{type(self).__name__} device=cuda:{self.device_index} "
                f"cuda_stream={self._ident:#x}{closed}>")

    # -- work --
    def query(self) -> bool:
        """True when all work submitted so far has completed (wraps cuStreamQuery)."""
        return is_ready(self.device_index, "cuStreamQuery", cu.cuStreamQuery, self._live())

    def synchronize(self) -> None:
        """Wait until all work submitted so far has completed (wraps cuStreamSynchronize).
        A sync debug mode site, as torch's ``Stream.synchronize``."""
        if syncdebug.LEVEL:
            syncdebug.warn_or_error_on_sync("Stream.synchronize()")
        call(self.device_index, "cuStreamSynchronize", cu.cuStreamSynchronize, self._live())
        if _csan.ON:
            _csan.TRACKER.stream_synchronize(self._ident, self.device_index)

    def wait_event(self, event: Event) -> None:
        """Make future work on this stream wait for ``event`` (wraps cuStreamWaitEvent).
        The event may belong to another device. A never-recorded event is a no-op."""
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        """Make future work on this stream wait for all work submitted so far to ``stream``."""
        if stream == self:
            return
        event = Event()
        try:
            event.record(stream)
            event.wait(self)
        finally:
            event.close()

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on this stream and return it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def launch_host_func(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` on a driver thread once the work submitted so far has completed
        (wraps cuLaunchHostFunc). ``fn`` is kept alive until it ran; it must not call CUDA.
        An exception it raises is reported through ``sys.unraisablehook``. Launched while
        the stream captures a CUDA graph, ``fn`` runs on every replay and is kept for good."""
        if not callable(fn):
            raise TypeError(f"launch_host_func expects a callable, got {type(fn).__name__}")
        handle = self._live()
        status = call(self.device_index, "cuStreamIsCapturing", cu.cuStreamIsCapturing, handle)
        key = keep_callback(fn, captured=int(status) != _CAPTURE_NONE)
        try:
            call(self.device_index, "cuLaunchHostFunc", launch_host_func, handle, key)
        except BaseException:
            drop_callback(key)
            raise

    # -- lifetime and context --
    def close(self) -> None:
        """Destroy the stream now (wraps cuStreamDestroy; queued work still completes).
        Idempotent; a no-op for borrowed streams (default stream, ExternalStream). The
        caching allocator first records what it still needs on the stream; while a graph
        capture is underway that waits, and the handle is destroyed at a later safe point."""
        owned, finalizer = self._owned, self._finalizer
        if owned is None or finalizer is None or self._handle is None:
            return
        if _in_use(self):
            raise RuntimeError(f"cannot close {self!r}: it is the current stream of a thread "
                               "(or will be restored by an open `with` block); leave it first")
        self._handle = None
        finalizer.detach()
        release_pending()
        if not owned.release():
            release_later(owned)

    def __enter__(self) -> Stream:
        _enter(self, self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _exit(self)


class ExternalStream(Stream):
    """A stream created elsewhere (torch, CuPy, raw driver calls), wrapped by its handle:
    anything :func:`as_stream_handle` takes but None. Never destroyed by us; the
    caller keeps it alive. ``device`` defaults to the current device, as in torch."""

    __slots__ = ()

    def __init__(self, stream_ptr: Any, device: DeviceLike = None) -> None:
        self._setup(_index(device), cu.CUstream(as_stream_handle(stream_ptr)))


# ---- events ----------------------------------------------------------------------------------


class Event:
    """A CUDA event. Like torch's, it is created lazily, on the device of the stream it is
    first recorded on (wraps cuEventCreate); before that, ``query()`` is True and
    ``wait``/``synchronize`` do nothing. ``interprocess`` events cannot time."""

    __slots__ = (
        "__weakref__",
        "_closed",
        "_device_index",
        "_finalizer",
        "_flags",
        "_handle",
        "_owned",
        "_recorded",
        "blocking",
        "enable_timing",
        "interprocess",
    )

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        if interprocess and enable_timing:
            raise ValueError("an interprocess Event cannot record timing: "
                             "pass enable_timing=False")
        self.enable_timing = bool(enable_timing)
        self.blocking = bool(blocking)
        self.interprocess = bool(interprocess)
        flags = 0 if enable_timing else _EVENT_DISABLE_TIMING
        if blocking:
            flags |= _EVENT_BLOCKING_SYNC
        if interprocess:
            flags |= _EVENT_INTERPROCESS
        self._flags = flags
        self._handle: Any = None
        self._device_index: int | None = None
        self._recorded = False
        self._closed = False
        self._owned: Owned | None = None
        self._finalizer: weakref.finalize | None = None

    def _own(self, index: int, handle: Any) -> None:
        self._handle = handle
        self._device_index = index
        self._owned = Owned(handle, index, "event", cu.cuEventDestroy, "cuEventDestroy")
        self._finalizer = adopt(self, self._owned)

    def _create(self, index: int) -> Any:
        if self._handle is None:
            if self._closed:
                raise RuntimeError(f"{self!r} was closed; create a new Event")
            release_pending()
            self._own(index, call(index, "cuEventCreate", cu.cuEventCreate, self._flags))
        return self._handle

    def _live(self, what: str) -> tuple[int, Any]:
        """(device index, handle) of a created event, or a RuntimeError naming ``what``."""
        handle, index = self._handle, self._device_index
        if handle is None or index is None:
            state = "was closed" if self._closed else "was never recorded"
            raise RuntimeError(f"{what}: the event {state}")
        return index, handle

    @classmethod
    def from_ipc_handle(cls, device: DeviceLike, handle: bytes) -> Event:
        """Open an event another process exported with :meth:`ipc_handle`
        (wraps cuIpcOpenEventHandle)."""
        data = bytes(handle)
        if len(data) != _IPC_HANDLE_SIZE:
            raise ValueError(f"an IPC event handle has {_IPC_HANDLE_SIZE} bytes, got {len(data)}")
        index = _index(device)
        ipc = cu.CUipcEventHandle()
        ctypes.memmove(ipc.getPtr(), data, _IPC_HANDLE_SIZE)
        event = cls(interprocess=True)
        release_pending()
        event._own(index, call(index, "cuIpcOpenEventHandle", cu.cuIpcOpenEventHandle, ipc))
        event._recorded = True  # recorded (or not) by the exporting process
        return event

    # -- identity --
    @property
    def handle(self) -> Any:
        """The driver's ``CUevent``, or None before the first record."""
        return self._handle

    @property
    def cuda_event(self) -> int:
        """The raw event handle as an int (0 before the first record, as in torch)."""
        return 0 if self._handle is None else int(self._handle)

    @property
    def device(self) -> Device | None:
        """The event's device, or None before the first record."""
        return None if self._device_index is None else Device(self._device_index)

    def __repr__(self) -> str:
        if self._handle is None:
            return f"<gpurt.Event {'closed' if self._closed else 'uninitialized'}>"
        return f"<gpurt.Event {int(self._handle):#x} device=cuda:{self._device_index}>"

    # -- work --
    def record(self, stream: Stream | None = None) -> None:
        """Record the event on ``stream`` (default: the current stream) (wraps cuEventRecord)."""
        if stream is None:
            stream = current_stream()
        index = stream.device_index
        if self._device_index is not None and self._device_index != index:
            raise ValueError(f"this Event was created on cuda:{self._device_index} and cannot "
                             f"be recorded on a stream of cuda:{index}")
        stream_handle = stream._live()
        call(index, "cuEventRecord", cu.cuEventRecord, self._create(index), stream_handle)
        self._recorded = True
        if _csan.ON:
            _csan.TRACKER.event_record(int(self._handle), stream._ident, index)

    def wait(self, stream: Stream | None = None) -> None:
        """Make future work on ``stream`` (default: the current stream) wait for this event
        (wraps cuStreamWaitEvent); any device's stream may wait. No-op before a record."""
        if self._handle is None and not self._closed:
            return
        _, handle = self._live("Event.wait")
        if stream is None:
            stream = current_stream()
        call(stream.device_index, "cuStreamWaitEvent", cu.cuStreamWaitEvent, stream._live(),
             handle, 0)
        if _csan.ON:
            _csan.TRACKER.event_wait(int(handle), stream._ident, stream.device_index)

    def query(self) -> bool:
        """True when the recorded work has completed, or nothing was recorded
        (wraps cuEventQuery)."""
        if self._handle is None and not self._closed:
            return True
        index, handle = self._live("Event.query")
        return is_ready(index, "cuEventQuery", cu.cuEventQuery, handle)

    def synchronize(self) -> None:
        """Wait until the recorded work has completed (wraps cuEventSynchronize)."""
        if self._handle is None and not self._closed:
            return
        index, handle = self._live("Event.synchronize")
        call(index, "cuEventSynchronize", cu.cuEventSynchronize, handle)
        if _csan.ON:
            _csan.TRACKER.event_synchronize(int(handle))

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event and ``end_event``, both recorded with
        ``enable_timing=True`` and completed (wraps cuEventElapsedTime)."""
        for role, event in (("start", self), ("end", end_event)):
            if not event.enable_timing:
                raise ValueError(f"elapsed_time needs both events created with "
                                 f"enable_timing=True; the {role} event was not")
            if not event._recorded:
                raise RuntimeError(f"elapsed_time needs both events recorded; "
                                   f"the {role} event was never recorded")
        index, start = self._live("Event.elapsed_time")
        _, end = end_event._live("Event.elapsed_time")
        result = raw_call(index, cu.cuEventElapsedTime, start, end)
        if not_ready(result):
            raise RuntimeError("elapsed_time: the recorded work has not completed yet; "
                               "call end_event.synchronize() first")
        return float(check(result, "cuEventElapsedTime"))

    def ipc_handle(self) -> bytes:
        """The 64-byte handle another process opens with :meth:`from_ipc_handle`
        (wraps cuIpcGetEventHandle). Creates the event on the current device if needed."""
        if not self.interprocess:
            raise ValueError("ipc_handle needs an Event created with interprocess=True")
        index = current_device() if self._device_index is None else self._device_index
        handle = self._create(index)
        ipc = call(index, "cuIpcGetEventHandle", cu.cuIpcGetEventHandle, handle)
        return ctypes.string_at(ipc.getPtr(), _IPC_HANDLE_SIZE)

    def close(self) -> None:
        """Destroy the event now (wraps cuEventDestroy). Idempotent."""
        if self._closed:
            return
        self._closed = True
        owned, finalizer = self._owned, self._finalizer
        if _csan.ON and self._handle is not None:
            _csan.TRACKER.event_forget(int(self._handle))
        self._handle = None
        if owned is None or finalizer is None:
            return
        finalizer.detach()
        release_pending()
        owned.release()


# ---- current / default streams ------------------------------------------------------------

_defaults: dict[int, Stream] = {}


def default_stream(device: DeviceLike = None) -> Stream:
    """The legacy default (NULL) stream of ``device``, handle 0; never destroyed."""
    index = current_device() if device is None else _index(device)
    stream = _defaults.get(index)
    if stream is None:
        stream = _defaults.setdefault(index, Stream._borrow(index, 0))
    return stream


def current_stream(device: DeviceLike = None) -> Stream:
    """This thread's current stream on ``device`` (default: the current device)."""
    if type(device) is int:  # a device with a stream already is a valid one: no checks
        stream = THREAD.streams.streams.get(device)
        if stream is None:
            stream = _defaults.get(device)
        if stream is not None:
            return stream
    index = current_device() if device is None else _index(device)
    stream = THREAD.streams.streams.get(index)
    if stream is None:
        stream = _defaults.get(index) or default_stream(index)
    return stream


def set_stream(stream: Stream | None) -> None:
    """Make ``stream`` this thread's current stream on its device and make that device
    current, as torch does. Prefer ``with stream(s):``, which restores. None is a no-op."""
    if stream is None:
        return
    stream._live()
    if current_device() != stream.device_index:
        set_device(stream.device_index)
    THREAD.streams.assign(stream.device_index, stream)


class StreamContext:
    """Context manager that makes ``stream`` current (and its device) on this thread and
    restores exactly what was there on exit, also on exceptions. None is a no-op."""

    __slots__ = ("stream",)

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            _enter(self, self.stream)
        return self.stream

    def __exit__(self, *exc_info: object) -> None:
        if self.stream is not None:
            _exit(self)


def stream(stream: Stream | None) -> StreamContext:
    """``with gpurt.stream(s):`` -- see :class:`StreamContext`."""
    return StreamContext(stream)
