"""Split-K's fp32 partial sums, kept per (device, stream) between calls.

cuBLAS keeps a workspace per stream (torch holds one per handle and stream, in its memory
statistics); gpurt does the same for split-K, so that a repeated split-K call allocates and
frees nothing. The workspace is an ordinary gpurt Array (it shows in gpurt.memory_stats)
and only grows. Work on one stream runs in order, so calls on a stream may share its
workspace; :data:`LOCK` keeps two threads on one stream from interleaving their launches
between the kernel that writes the partials and the one that reads them. A stream that is
capturing a CUDA graph gets fresh partials for each call instead (memory of the graph's own
pool, released with the graph). At most :data:`MAX_KEPT` streams keep a workspace (the
oldest is dropped first); :func:`clear` drops them all (gpurt.kernels.clear_plans does).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

import gpurt
from gpurt._streams.handles import stream_is_capturing
from gpurt.streams import current_stream_handle

__all__ = ["LOCK", "MAX_KEPT", "clear", "kept_bytes", "partials"]

MAX_KEPT = 8
LOCK = threading.RLock()
# a forked child gets a fresh lock (a parent thread may have held this one at the fork)
os.register_at_fork(after_in_child=lambda: globals().update(LOCK=threading.RLock()))
_kept: dict[tuple[int, int], Any] = {}  # (device, stream handle) -> float32 Array


def partials(index: int, handle: int | None, count: int) -> Any:
    """At least ``count`` float32 partial sums on device ``index``'s stream ``handle`` (None:
    this thread's current stream there): the stream's workspace, or, while the stream
    captures a graph, a new array that the caller keeps until its launches are queued. Call
    with :data:`LOCK` held until the kernels that use the partials are queued."""
    if handle is None:
        handle = current_stream_handle(index)
    if stream_is_capturing(index, handle):
        return gpurt.empty(count, dtype=np.float32, device=index,
                           stream=gpurt.as_stream(handle, index))
    key = (index, handle)
    found = _kept.get(key)
    if found is not None and found.shape[0] >= count:
        return found
    grown = gpurt.empty(count, dtype=np.float32, device=index,
                        stream=gpurt.as_stream(handle, index))
    _kept.pop(key, None)  # the old one is freed in stream order: later work may reuse it
    while len(_kept) >= MAX_KEPT:
        _kept.pop(next(iter(_kept)))
    _kept[key] = grown
    return grown


def kept_bytes() -> int:
    """Bytes the kept workspaces hold."""
    with LOCK:
        return sum(array.nbytes for array in _kept.values())


def clear() -> None:
    """Drop every kept workspace (each is freed in its stream's order)."""
    with LOCK:
        _kept.clear()
