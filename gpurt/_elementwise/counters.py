"""The fold's ticket counters (split reductions, reduce_codegen._fold), kept zeroed per
(device, stream) between calls.

Every fold sets the counters it used back to 0, and one stream's launches run in order, so
the next launch on that stream finds them zeroed: no memset before each launch (H100: about
1 us a call, 1-3 points of copy bandwidth on the split column sums; notes_bandwidth.md,
session 8). A stream keeps one uint32 array that only grows, shared by every reduction (a
launch uses its first ``ReductionPlan.counts``: one per column block of the grid, more for a
tree fold), like the split-K workspaces of kernels/_gemm_workspace.py. A stream that is
capturing a CUDA graph gets new zeroed counters for each call (the graph's replays may run
beside the stream's later launches), and so does the per-thread default stream (one handle,
a different stream in each thread). At most :data:`MAX_KEPT` streams keep counters (the
oldest is dropped first); :func:`clear` drops them all.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .._core.fork import renew_after_fork
from .._streams.kept import KeptPerStream
from . import api as gpurt

__all__ = ["KEEP", "MAX_KEPT", "clear", "kept_bytes", "take"]

KEEP = True  # False: new counters zeroed by a memset before every launch
MAX_KEPT = 8
_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)
_kept: KeptPerStream[Any] = KeptPerStream(MAX_KEPT)  # each stream's counters (an Array)


def take(index: int, count: int) -> Any:
    """At least ``count`` zeroed uint32 counters (a gpurt Array) for a launch on this
    thread's current stream of device ``index``; hold the array until the launch is queued
    (a dropped one is freed in its stream's order)."""
    key = _kept.key(index, gpurt.current_stream_handle(index)) if KEEP else None
    if key is None:
        return gpurt.zeros(count, np.uint32, index)
    with _lock:
        found = _kept.get(key)
        if found is None or found.shape[0] < count:
            room = max(count, found.shape[0] * 2 if found is not None else 0)
            found = gpurt.zeros(room, np.uint32, index)  # on the stream, before the launch
            _kept.put(key, found)
        return found


def kept_bytes() -> int:
    """Bytes the kept counters hold."""
    with _lock:
        return sum(array.nbytes for array in _kept.values())


def clear() -> None:
    """Drop every stream's kept counters (each array is freed in its stream's order)."""
    with _lock:
        _kept.clear()
