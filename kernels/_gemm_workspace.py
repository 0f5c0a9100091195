"""Split-K's fp32 partial sums and ticket counters, kept per (device, stream) between calls.

cuBLAS keeps a workspace per stream (torch holds one per handle and stream, in its memory
statistics); gpurt does the same for split-K, so that a repeated split-K call allocates and
frees nothing. A workspace is one ordinary gpurt Array (it shows in gpurt.memory_stats)
that only grows: first the ticket counters of the split-K kernels (gemm_*_splitk: the CTA
that takes a tile's last ticket sums its slices), zeroed once when the workspace is
allocated and left zero by every kernel, then the partial sums, which no call expects
zeroed. The two regions never overlap, so a call of another shape never finds partials where
its counters lie. Work on one stream runs in order, so calls on a stream may share its
workspace (each split-K call is one launch); :data:`LOCK` keeps the table of workspaces
consistent between threads and holds a workspace until the launch that uses it is queued.
A stream that is capturing a CUDA graph gets fresh partials and fresh zeroed counters for
each call instead (memory of the graph's own pool, released with the graph). At most
:data:`MAX_KEPT` streams keep a workspace (the oldest is dropped first); :func:`clear` drops
them all (gpurt.kernels.clear_plans does).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import numpy as np

import gpurt
from gpurt._streams.handles import stream_is_capturing
from gpurt.streams import current_stream_handle

__all__ = ["LOCK", "MAX_KEPT", "Workspace", "clear", "kept_bytes", "take"]

MAX_KEPT = 8
LOCK = threading.RLock()
# a forked child gets a fresh lock (a parent thread may have held this one at the fork)
os.register_at_fork(after_in_child=lambda: globals().update(LOCK=threading.RLock()))


@dataclasses.dataclass(frozen=True)
class Workspace:
    """``counters`` (uint32, zero) and ``partials`` (float32): device pointers to at least
    :attr:`counter_room` and :attr:`partial_room` elements; ``arrays`` own the memory (keep
    them until the launches that use it are queued)."""

    arrays: tuple[Any, ...]
    counters: int
    partials: int
    counter_room: int
    partial_room: int


_kept: dict[tuple[int, int], Workspace] = {}  # (device, stream handle) -> its workspace


def take(index: int, handle: int | None, partials: int, counters: int = 0) -> Workspace:
    """Room for ``partials`` float32 sums and ``counters`` zeroed uint32 counters on device
    ``index``'s stream ``handle`` (None: this thread's current stream there): the stream's
    workspace, or, while the stream captures a graph, new arrays. Call with :data:`LOCK` held
    until the kernels that use it are queued."""
    if handle is None:
        handle = current_stream_handle(index)
    if stream_is_capturing(index, handle):
        stream = gpurt.as_stream(handle, index)
        made = gpurt.empty(max(partials, 1), dtype=np.float32, device=index, stream=stream)
        if counters == 0:
            return Workspace((made,), 0, made.ptr, 0, made.shape[0])
        zeroed = gpurt.zeros(counters, dtype=np.uint32, device=index, stream=stream)
        return Workspace((made, zeroed), zeroed.ptr, made.ptr, counters, made.shape[0])
    key = (index, handle)
    found = _kept.get(key)
    if found is not None and found.partial_room >= partials and found.counter_room >= counters:
        return found
    if found is not None:  # grow both regions to at least what either call needed
        partials, counters = max(partials, found.partial_room), max(counters, found.counter_room)
    room = -(-counters // 4) * 4  # the partials start 16-byte aligned
    # zeroed once: the counters must start at zero, and the kernels leave them so
    array = gpurt.zeros(room + max(partials, 1), dtype=np.float32, device=index,
                        stream=gpurt.as_stream(handle, index))
    grown = Workspace((array,), array.ptr, array.ptr + 4 * room, room, array.shape[0] - room)
    _kept.pop(key, None)  # the old one is freed in stream order: later work may reuse it
    while len(_kept) >= MAX_KEPT:
        _kept.pop(next(iter(_kept)))
    _kept[key] = grown
    return grown


def kept_bytes() -> int:
    """Bytes the kept workspaces hold."""
    with LOCK:
        return sum(array.nbytes for kept in _kept.values() for array in kept.arrays)


def clear() -> None:
    """Drop every kept workspace (each is freed in its stream's order)."""
    with LOCK:
        _kept.clear()
