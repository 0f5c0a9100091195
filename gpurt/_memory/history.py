"""Memory history: a bounded trace of allocator events with the Python frames that made them.

Like torch's ``_record_memory_history``: while enabled, each allocator records what happened
(alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map and
segment_unmap for expandable segments, oom, empty_cache) into a
ring buffer, and remembers where each live block was allocated. Frames are taken with
``sys._getframe`` (cheap: no source lines are read) and kept as tuples until a snapshot
turns them into JSON-ready dicts.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import types
from typing import Any

__all__: list[str] = []

Frames = tuple  # tuple of (filename, line, name)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # gpurt/
_MAX_DEPTH = 64

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "empty_cache")


def capture_frames() -> Frames:
    """The calling Python stack, innermost first, without gpurt's own frames."""
    frame: types.FrameType | None = sys._getframe(1)
    frames: list[tuple[str, int, str]] = []
    while frame is not None and len(frames) < _MAX_DEPTH:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(frames)


def frames_json(frames: Frames | None) -> list[dict[str, Any]]:
    return [{"filename": f, "line": line, "name": name} for f, line, name in frames or ()]


class HistorySettings:
    """What is being recorded. Shared by every device allocator of the process.

    ``trace``: keep the event ring buffer; ``alloc_frames``: remember frames of allocations;
    ``free_frames``: also of frees (context="all"); ``observer``: told of every allocation
    and free as ``observer.allocated(ptr, size)`` / ``observer.freed(ptr, size)`` (the stream
    sanitizer's tracker; called under the allocator's lock, so it must only queue)."""

    __slots__ = ("trace", "alloc_frames", "free_frames", "max_entries", "on", "observer")

    def __init__(self) -> None:
        self.trace = False
        self.alloc_frames = False
        self.free_frames = False
        self.max_entries = 1
        self.observer: Any = None
        self.on = False  # anything recorded at all (one check on the allocation hot path)

    def configure(self, enabled: Any, context: Any, stacks: str, max_entries: int) -> None:
        """torch's argument meanings: enabled None|'state'|'all' (bools accepted),
        context None|'state'|'alloc'|'all', stacks 'python'|'all'."""
        if enabled is True:
            enabled = "all"
        elif enabled is False:
            enabled = None
        if enabled not in (None, "state", "all"):
            raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
        if context not in (None, "state", "alloc", "all"):
            raise ValueError(f"context must be None, 'state', 'alloc' or 'all', got {context!r}")
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
        if int(max_entries) < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        on = enabled is not None
        self.trace = enabled == "all"
        self.alloc_frames = on and context is not None
        self.free_frames = on and context == "all"
        self.max_entries = int(max_entries)
        self.on = self.trace or self.alloc_frames or self.observer is not None

    def watch(self, observer: Any) -> None:
        """Tell ``observer`` (None: nobody) of every allocation and free from now on."""
        self.observer = observer
        self.on = self.trace or self.alloc_frames or observer is not None

    @property
    def enabled(self) -> bool:
        return self.on


class DeviceTrace:
    """The ring buffer of one device's events."""

    __slots__ = ("entries",)

    def __init__(self, max_entries: int = 1) -> None:
        self.entries: collections.deque[tuple] = collections.deque(maxlen=max_entries)

    def resize(self, max_entries: int) -> None:
        if self.entries.maxlen != max_entries:
            self.entries = collections.deque(self.entries, maxlen=max_entries)

    def record(self, action: str, addr: int, size: int, stream: int, frames: Frames | None) -> None:
        self.entries.append((action, addr, size, stream, time.time_ns() // 1000, frames))

    def clear(self) -> None:
        self.entries.clear()

    def as_json(self) -> list[dict[str, Any]]:
        return [
            {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t,
             "frames": frames_json(frames)}
            for action, addr, size, stream, t, frames in list(self.entries)
        ]
