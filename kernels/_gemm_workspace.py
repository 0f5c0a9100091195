"""Split-K's fp32 partial sums and ticket counters, and the packed route's copies of operands
whose rows TMA cannot read (kernels/_gemm_pack.py), kept per (device, stream) between calls;
softmax's ticket and persistent chunks (kernels/softmax.py) take their counters and
partials here too, and leave the counters zero as the split-K kernels do.

cuBLAS keeps a workspace per stream (torch holds one per handle and stream, in its memory
statistics); gpurt does the same for split-K, so that a repeated split-K call allocates and
frees nothing. A workspace is one ordinary gpurt Array (it shows in gpurt.memory_stats)
that only grows: first the ticket counters of the split-K kernels (gemm_*_splitk: the CTA
that takes a tile's last ticket sums its slices), zeroed once when the workspace is
allocated and left zero by every kernel, then the partial sums, which no call expects
zeroed. The two regions never overlap, so a call of another shape never finds partials where
its counters lie. The packed copies (``scratch``) lie in a second Array of their own, not
zeroed, so that growing one region never zeroes or copies the other. Work on one stream runs
in order, so calls on a stream may share its workspace (each split-K or packed call is one
launch after another on it); :data:`LOCK` keeps the table of workspaces
consistent between threads and holds a workspace until the launch that uses it is queued.
A stream that is capturing a CUDA graph gets a workspace of the graph's own instead (from
the graph's private pool, released with it), kept for the rest of that capture: the
capture's calls on that stream run in order in every replay too, so they share it as calls
on a stream do, and only the first of them (or one that needs more room) adds a memset node
that zeroes its counters. (A zeroed workspace per captured call put a memset node in front
of every split-K kernel node, ~1.9 us each on an H100: benchmarks/notes_gemm.md,
s8-splitk2.) The per-thread default stream, one handle that is a different stream in each
thread, gets fresh partials and fresh zeroed counters for each call. At most
:data:`MAX_KEPT` streams keep a workspace (the least recently used is dropped first:
gpurt/_streams/kept.py), and as many captures (the oldest first); a capture's is dropped
once no gpurt capture is underway, or when its stream captures again; :func:`clear` drops
them all (gpurt.kernels.clear_plans does).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

import gpurt
from gpurt._core.captures import CAPTURES
from gpurt._core.fork import renew_after_fork
from gpurt._streams.handles import capture_id
from gpurt._streams.kept import PER_THREAD_STREAM, KeptPerStream
from gpurt.streams import current_stream_handle

__all__ = ["LOCK", "MAX_KEPT", "Workspace", "clear", "kept_bytes", "partials_for", "take"]

MAX_KEPT = 8
LOCK = threading.RLock()
renew_after_fork(globals(), LOCK=threading.RLock)


@dataclasses.dataclass(frozen=True)
class Workspace:
    """``counters`` (uint32, zero) and ``partials`` (float32): device pointers to at least
    :attr:`counter_room` and :attr:`partial_room` elements; ``scratch``: a 128-byte aligned
    pointer to :attr:`scratch_room` bytes (0 when none was asked for); ``arrays`` own the
    memory (keep them until the launches that use it are queued)."""

    arrays: tuple[Any, ...]
    counters: int
    partials: int
    counter_room: int
    partial_room: int
    scratch: int = 0
    scratch_room: int = 0

    def holds(self, partials: int, counters: int, scratch: int = 0) -> bool:
        """Whether this workspace has room for what a call asks."""
        return self.partial_room >= partials and self.counter_room >= counters \
            and self.scratch_room >= scratch


_kept: KeptPerStream[Workspace] = KeptPerStream(MAX_KEPT)
# the workspaces of captures underway, per (device, stream handle): (capture id, workspace)
_captured: KeptPerStream[tuple[int, Workspace]] = KeptPerStream(MAX_KEPT)


def partials_for(split_k: int, m: int, n: int) -> int:
    """The float32 partial sums of an m x n output in ``split_k`` K slices: rows padded to a
    multiple of 4 floats, so that the simt kernel's slices keep every row 16-byte aligned
    (kernels/gemm_simt.cu's ``partial_pitch``); the other kernels use the first m x n."""
    return split_k * m * (-(-n // 4) * 4)


def take(index: int, handle: int | None, partials: int, counters: int = 0,
         scratch: int = 0) -> Workspace:
    """Room for ``partials`` float32 sums, ``counters`` zeroed uint32 counters and ``scratch``
    bytes (128-byte aligned) on device ``index``'s stream ``handle`` (None: this thread's
    current stream there): the stream's workspace, or, while the stream captures a graph, the
    capture's (from the graph's pool). Call with :data:`LOCK` held until the kernels that use
    it are queued."""
    if handle is None:
        handle = current_stream_handle(index)
    if _captured and not CAPTURES.count:  # every capture they served has ended
        _captured.clear()
    key = _kept.key(index, handle)
    if key is None:
        return _take_capturing(index, handle, partials, counters, scratch)
    found = _kept.get(key)
    if found is not None and found.holds(partials, counters, scratch):
        return found
    stream = gpurt.as_stream(handle, index)
    if found is not None and found.holds(partials, counters):
        grown = Workspace(found.arrays[:1], found.counters, found.partials, found.counter_room,
                          found.partial_room)
    else:
        if found is not None:  # grow both regions to at least what either call needed
            partials = max(partials, found.partial_room)
            counters = max(counters, found.counter_room)
        # the partials start 128-byte aligned: at 16 bytes past a 32-byte L2 sector, each
        # warp's 8-byte loads and stores of a slice row touched twice the sectors (ncu, H100)
        room = -(-counters // 32) * 32
        # zeroed once: the counters must start at zero, and the kernels leave them so
        array = gpurt.zeros(room + max(partials, 1), dtype=np.float32, device=index,
                            stream=stream)
        grown = Workspace((array,), array.ptr, array.ptr + 4 * room, room,
                          array.shape[0] - room)
    scratch = max(scratch, 0 if found is None else found.scratch_room)
    if scratch:
        if found is not None and found.scratch_room >= scratch:  # keep the copies' array
            grown = dataclasses.replace(grown, arrays=grown.arrays + found.arrays[1:],
                                        scratch=found.scratch, scratch_room=found.scratch_room)
        else:
            grown = _with_scratch(grown, index, stream, scratch)
    _kept.put(key, grown)  # the old one is freed in stream order: later work may reuse it
    return grown


def _fresh(index: int, handle: int, partials: int, counters: int, scratch: int) -> Workspace:
    """New partials, zeroed counters and scratch on stream ``handle``, for one call or, while
    it captures, for the capture."""
    stream = gpurt.as_stream(handle, index)
    made = gpurt.empty(max(partials, 1), dtype=np.float32, device=index, stream=stream)
    arrays: tuple[Any, ...] = (made,)
    counter_ptr = 0
    if counters:
        zeroed = gpurt.zeros(counters, dtype=np.uint32, device=index, stream=stream)
        arrays, counter_ptr = (made, zeroed), zeroed.ptr
    space = Workspace(arrays, counter_ptr, made.ptr, counters, made.shape[0])
    return _with_scratch(space, index, stream, scratch) if scratch else space


def _take_capturing(index: int, handle: int, partials: int, counters: int,
                    scratch: int) -> Workspace:
    """:func:`take` for a stream without a kept workspace: the one of its capture while it
    captures (grown to what either call needed), else new memory for this call alone."""
    ident = None if handle == PER_THREAD_STREAM else capture_id(index, handle)
    if ident is None:
        return _fresh(index, handle, partials, counters, scratch)
    found = _captured.get((index, handle))
    if found is not None and found[0] == ident:  # this capture's
        space = found[1]
        if space.holds(partials, counters, scratch):
            return space
        partials = max(partials, space.partial_room)
        counters = max(counters, space.counter_room)
        scratch = max(scratch, space.scratch_room)
    made = _fresh(index, handle, partials, counters, scratch)
    # replaces a smaller one of this capture, or one of an earlier capture (it is over)
    _captured.put((index, handle), (ident, made))
    return made


def _with_scratch(space: Workspace, index: int, stream: Any, scratch: int) -> Workspace:
    """``space`` with a new (not zeroed) array of ``scratch`` bytes from a 128-byte boundary."""
    words = -(-scratch // 4) + 32  # 128 bytes of slack to align the start
    made = gpurt.empty(words, dtype=np.float32, device=index, stream=stream)
    start = -(-made.ptr // 128) * 128
    return dataclasses.replace(space, arrays=space.arrays + (made,), scratch=start,
                               scratch_room=made.ptr + 4 * words - start)


def kept_bytes() -> int:
    """Bytes the kept workspaces hold."""
    with LOCK:
        return sum(array.nbytes for kept in _kept.values() for array in kept.arrays)


def clear() -> None:
    """Drop every kept workspace (each is freed in its stream's order)."""
    with LOCK:
        _kept.clear()
        _captured.clear()
