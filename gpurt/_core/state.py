"""Per-thread state: what each thread remembers, in one place.

``THREAD`` is a :class:`threading.local`; on each thread its attributes are

``index``
    int, the thread's current device (absent until one is chosen: device 0).
``bound``
    int, the device whose primary context is current on the thread (absent: none).
``place``
    the record where new arrays go (gpurt/_array/ownership.py), absent when there is none;
    :func:`forget_place` drops it whenever ``index`` or a current stream changes.
``streams``
    :class:`ThreadStreams`, made on the thread's first use: its current stream per device.

This is the contract the compiled launch path reads (``KernelCall`` in
gpurt/_launch/_claunch.c is handed ``THREAD`` itself and reads ``index``, ``bound`` and
``streams.handles`` from the thread's ``__dict__``): change both together. ``THREAD`` is never
replaced; :func:`forget_devices` empties it in place in a child forked after CUDA started.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, NamedTuple

from .fork import renew_after_fork

__all__ = ["THREAD", "ThreadStreams", "all_thread_streams", "current_place", "forget_devices",
           "forget_place", "remember_place"]


class Saved(NamedTuple):
    """What a stream's ``with`` block replaced, to be put back on exit."""

    owner: object  # the Stream or StreamContext whose block this is
    prev_device: int
    prev_stream: Any  # a gpurt Stream, None: the device's default stream
    target_device: int
    target_prev: Any


class ThreadStreams:
    """One thread's current stream per device (unset = default stream), their raw handles
    (``handles``: the launch and allocation hot paths read them) and the saved states of its
    open ``with`` blocks."""

    __slots__ = ("__weakref__", "handles", "saved", "streams")

    def __init__(self) -> None:
        self.streams: dict[int, Any] = {}
        self.handles: dict[int, int] = {}
        self.saved: list[Saved] = []

    def assign(self, index: int, stream: Any) -> None:
        """Make ``stream`` (a gpurt Stream; None: the default stream) current on device
        ``index`` for the thread that owns this state (only that thread calls this)."""
        forget_place()
        if stream is None:
            self.streams.pop(index, None)
            self.handles.pop(index, None)
        else:
            self.streams[index] = stream
            self.handles[index] = stream._ident


_all_streams: weakref.WeakSet[ThreadStreams] = weakref.WeakSet()
_all_streams_lock = threading.Lock()
renew_after_fork(globals(), _all_streams_lock=threading.Lock)


class _Thread(threading.local):
    index: int
    bound: int
    place: Any

    def __init__(self) -> None:  # runs once in every thread that touches THREAD
        self.streams = ThreadStreams()
        with _all_streams_lock:
            _all_streams.add(self.streams)


THREAD = _Thread()


def all_thread_streams() -> list[ThreadStreams]:
    """The current streams of every live thread."""
    with _all_streams_lock:
        return list(_all_streams)


def current_place() -> Any:
    """This thread's place, or None when there is none yet (read from the thread's own dict:
    a missing attribute would raise and catch an AttributeError, ten times the cost)."""
    return THREAD.__dict__.get("place")


def remember_place(place: Any) -> None:
    """Keep ``place``, made for this thread's current device and its current stream."""
    THREAD.place = place


def forget_place() -> None:
    """Drop this thread's place: its current device or that device's stream changed."""
    try:
        del THREAD.place
    except AttributeError:
        pass


def forget_devices() -> None:
    """Forget this thread's current and bound device and its place (in a forked child, the
    only thread there is), so that the next use takes the slow path and its fork error."""
    for name in ("index", "bound", "place"):
        THREAD.__dict__.pop(name, None)
