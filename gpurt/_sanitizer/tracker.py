"""Which allocation each access touches, the accesses since the last write of each, and the
check that a new access is ordered after every conflicting one (write-read, read-write,
write-write) by the stream clocks of clocks.py.

Allocations are byte ranges ``[start, start + size)`` that the allocators report
(:meth:`Tracker.allocated` / :meth:`Tracker.freed`, queued without a lock: the allocators
call them under their own lock, from finalizers too). An address inside a range counts
as that allocation; addresses in no known range (host memory, memory of torch's or CuPy's
allocator) are not tracked. A freed allocation's history is forgotten: the allocator
orders the reuse of its memory itself (same stream, or events of ``record_stream``).

During a CUDA graph capture, accesses on the capturing streams (and streams that joined
the capture through an event) are kept in the capture's log instead of being checked: the
captured work runs only at replay, where the log is checked and recorded on the replay
stream as one operation.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import linecache
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from .clocks import Clocks, stream_key

__all__ = ["Access", "Tracker", "UnorderedAccess", "frames_here", "format_frames"]

Frames = tuple[tuple[Any, int], ...]  # (code object, line) of each frame, innermost first
Position = int | str | None  # a kernel argument's index, an operand's name, None for copies

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # gpurt/
_MAX_FRAMES = 40


def frames_here() -> Frames:
    """The calling Python stack, innermost first, as (code, line) pairs: the cheapest record
    there is (every access takes one); :func:`format_frames` reads names and source later."""
    frame: Any = sys._getframe(1)
    frames: list[tuple[Any, int]] = []
    append = frames.append
    while frame is not None and len(frames) < _MAX_FRAMES:
        append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames)


def _inside_gpurt(filename: str) -> bool:
    return filename.startswith(_PACKAGE_DIR) or filename.startswith("<gpurt ")


def format_frames(frames: Frames, indent: str = "    ") -> str:
    """A stack as traceback prints it (outermost first), with source lines, without gpurt's
    own frames (the launch path, generated launchers) unless nothing else is left."""
    outside = [(code, line) for code, line in frames if not _inside_gpurt(code.co_filename)]
    lines = []
    for code, line in reversed(outside or frames):
        lines.append(f'{indent}File "{code.co_filename}", line {line}, in {code.co_name}')
        text = linecache.getline(code.co_filename, line).strip()
        if text:
            lines.append(f"{indent}  {text}")
    return "\n".join(lines)


@dataclasses.dataclass(slots=True)
class Access:
    """One operation's access to one allocation."""

    seq: int
    stream: int  # the stream's key
    handle: int  # the stream's raw handle, for messages
    write: bool
    what: str  # the kernel or operation, e.g. "kernel scale" or "copy (device to host)"
    position: Position
    frames: Frames

    def describe(self) -> str:
        kind = "writing" if self.write else "reading"
        if self.position is None:
            arg = ""
        elif isinstance(self.position, int):
            arg = f" argument {self.position} of"
        else:
            arg = f" {self.position} of"
        return f"{kind}{arg} {self.what} on stream {self.handle:#x}"


class UnorderedAccess:
    """Two accesses to one allocation, the earlier not ordered before the later one."""

    def __init__(self, start: int, size: int, current: Access, previous: Access) -> None:
        self.start, self.size = start, size
        self.current, self.previous = current, previous

    @property
    def kind(self) -> str:
        """"write-read", "read-write" or "write-write": the earlier access's kind first."""
        first = "write" if self.previous.write else "read"
        return f"{first}-{'write' if self.current.write else 'read'}"

    def __str__(self) -> str:
        return (f"unordered {self.kind} on the allocation at {self.start:#x} ({self.size} bytes):\n"
                f"  now: {self.current.describe()}\n{format_frames(self.current.frames)}\n"
                f"  before, not ordered before it by an event, a stream wait or a "
                f"synchronize: {self.previous.describe()}\n{format_frames(self.previous.frames)}")


class _History:
    __slots__ = ("size", "write", "reads")

    def __init__(self, size: int) -> None:
        self.size = size
        self.write: Access | None = None
        self.reads: dict[int, Access] = {}  # the latest read per stream since the write


@dataclasses.dataclass
class CaptureLog:
    """What a graph capture accessed: (start, write, what, position, frames) in order."""

    entries: list[tuple[int, bool, str, Position, Frames]] = dataclasses.field(
        default_factory=list)


class _CapturedEvent:
    """An event recorded on a capturing stream: waiting on it joins the capture."""

    __slots__ = ("log",)

    def __init__(self, log: CaptureLog) -> None:
        self.log = log


class Tracker:
    """The sanitizer's state for the process: thread-safe (one lock)."""

    def __init__(self, blocking: Any = None) -> None:
        self._lock = threading.Lock()
        self.blocking = blocking  # handle -> whether that stream syncs with the legacy one
        self.clocks = Clocks(blocking)
        self._starts: list[int] = []  # sorted starts of the known allocations
        self._sizes: dict[int, int] = {}
        self._histories: dict[int, _History] = {}
        self._changes: collections.deque[tuple[bool, int, int]] = collections.deque()
        self._captures: dict[int, CaptureLog] = {}  # capturing stream key -> its log
        self._captured_events: dict[Any, _CapturedEvent] = {}

    # ---- allocations (called by the allocators, under their locks) ---------------------

    def allocated(self, ptr: int, size: int) -> None:
        self._changes.append((True, ptr, size))

    def freed(self, ptr: int, size: int) -> None:
        self._changes.append((False, ptr, size))

    def _apply_changes(self) -> None:
        changes = self._changes
        while changes:
            alive, ptr, size = changes.popleft()
            self._histories.pop(ptr, None)
            known = ptr in self._sizes
            if alive:
                if not known:
                    bisect.insort(self._starts, ptr)
                self._sizes[ptr] = size
            elif known:
                del self._sizes[ptr]
                del self._starts[bisect.bisect_left(self._starts, ptr)]

    def allocation_of(self, ptr: int) -> tuple[int, int] | None:
        """(start, size) of the known allocation holding address ``ptr``, or None."""
        with self._lock:
            self._apply_changes()
            return self._find(ptr)

    def _find(self, ptr: int) -> tuple[int, int] | None:
        at = bisect.bisect_right(self._starts, ptr) - 1
        if at < 0:
            return None
        start = self._starts[at]
        size = self._sizes[start]
        return (start, size) if ptr < start + max(size, 1) else None

    def _stream(self, handle: int, device: int) -> int:
        """The key of stream ``handle`` of ``device``, its clock made and brought past the
        legacy stream's implicit barriers (an operation is being queued on it)."""
        key = stream_key(handle, device)
        self.clocks.clock(key, device, handle)
        self.clocks.barriers(key)
        return key

    # ---- accesses -----------------------------------------------------------------------

    def access(self, handle: int, device: int, reads: Iterable[tuple[int, Position]],
               writes: Iterable[tuple[int, Position]], what: str, raise_now: bool,
               frames: Frames | None = None) -> list[UnorderedAccess]:
        """Record one operation on stream ``handle`` of ``device`` that reads and writes the
        given addresses (each with its kernel argument position or None); an address both
        read and written counts as written. Returns the unordered pairs found; with
        ``raise_now`` and any found, nothing is recorded (the caller raises)."""
        if frames is None:
            frames = frames_here()
        with self._lock:
            self._apply_changes()
            key = self._stream(handle, device)
            touched: dict[int, tuple[bool, Position]] = {}
            for ptr, position in reads:
                found = self._find(ptr) if ptr else None
                if found is not None and found[0] not in touched:
                    touched[found[0]] = (False, position)
            for ptr, position in writes:
                found = self._find(ptr) if ptr else None
                if found is not None and not touched.get(found[0], (False,))[0]:
                    touched[found[0]] = (True, position)
            log = self._captures.get(key)
            if log is not None:
                log.entries.extend((start, write, what, position, frames)
                                   for start, (write, position) in touched.items())
                return []
            return self._check_and_commit(key, handle, touched, what, frames, raise_now)

    def _check_and_commit(self, key: int, handle: int,
                          touched: dict[int, tuple[bool, Position]], what: str,
                          frames: Frames, raise_now: bool) -> list[UnorderedAccess]:
        clocks = self.clocks
        seq = clocks.seq + 1  # the tick below makes it this operation's number
        found: list[UnorderedAccess] = []
        accesses = []
        for start, (write, position) in touched.items():
            access = Access(seq, key, handle, write, what, position, frames)
            history = self._histories.get(start)
            if history is None:
                history = self._histories[start] = _History(self._sizes[start])
            earlier = [history.write] if history.write is not None else []
            if write:
                earlier.extend(history.reads.values())
            for previous in earlier:
                if not clocks.ordered(key, previous.stream, previous.seq):
                    found.append(UnorderedAccess(start, history.size, access, previous))
            accesses.append((history, access))
        if found and raise_now:
            return found
        clocks.tick(key)
        for history, access in accesses:
            if access.write:
                history.write = access
                history.reads = {}
            else:
                history.reads[key] = access
        return found

    # ---- ordering -----------------------------------------------------------------------

    def event_record(self, event: Any, handle: int, device: int) -> None:
        with self._lock:
            key = self._stream(handle, device)
            log = self._captures.get(key)
            if log is not None:
                self._captured_events[event] = _CapturedEvent(log)
                return
            self._captured_events.pop(event, None)
            self.clocks.record(event, key)

    def event_wait(self, event: Any, handle: int, device: int) -> None:
        with self._lock:
            key = self._stream(handle, device)
            captured = self._captured_events.get(event)
            if captured is not None:
                self._captures[key] = captured.log  # the stream joins the capture
            elif key not in self._captures:
                self.clocks.wait(key, event)

    def stream_wait(self, consumer: int, producer: int, device: int,
                    producer_device: int | None = None) -> None:
        """Stream ``consumer`` waits for ``producer`` (of ``producer_device``, default
        ``device``), as an event recorded on one and waited for by the other."""
        with self._lock:
            source = self._stream(producer,
                                  device if producer_device is None else producer_device)
            target = self._stream(consumer, device)
            log = self._captures.get(source)
            if log is not None:
                self._captures[target] = log
            elif target not in self._captures:
                self.clocks.wait_stream(target, source)

    def stream_synchronize(self, handle: int, device: int) -> None:
        with self._lock:
            key = self._stream(handle, device)
            self.clocks.sync_stream(key)

    def event_synchronize(self, event: Any) -> None:
        with self._lock:
            self.clocks.sync_event(event)

    def device_synchronize(self, device: int) -> None:
        with self._lock:
            self.clocks.sync_device(device)

    def event_forget(self, event: Any) -> None:
        with self._lock:
            self.clocks.forget_event(event)
            self._captured_events.pop(event, None)

    # ---- graphs -------------------------------------------------------------------------

    def capture_begin(self, handle: int, device: int) -> None:
        with self._lock:
            key = self._stream(handle, device)
            self._captures[key] = CaptureLog()

    def capture_end(self, handle: int, device: int) -> CaptureLog | None:
        """The log of the capture on ``handle``; the streams that joined it leave it."""
        with self._lock:
            log = self._captures.pop(stream_key(handle, device), None)
            if log is not None:
                for key in [k for k, v in self._captures.items() if v is log]:
                    del self._captures[key]
            return log

    def replay(self, log: CaptureLog, handle: int, device: int, raise_now: bool,
               frames: Frames | None = None) -> list[UnorderedAccess]:
        """A replay of the graph whose capture made ``log``, on stream ``handle``: every
        captured access at once, checked and recorded there."""
        if frames is None:
            frames = frames_here()
        with self._lock:
            self._apply_changes()
            key = self._stream(handle, device)
            touched: dict[int, tuple[bool, Position]] = {}
            names: list[str] = []
            for start, write, what, position, _ in log.entries:
                if start not in self._sizes:
                    continue  # freed since the capture
                if write or start not in touched:
                    touched[start] = (write or touched.get(start, (False,))[0], position)
                if what not in names:
                    names.append(what)
            what = f"graph replay ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
            if key in self._captures:  # a replay inside another capture
                self._captures[key].entries.extend(
                    (start, write, what, position, frames)
                    for start, (write, position) in touched.items())
                return []
            return self._check_and_commit(key, handle, touched, what, frames, raise_now)

    # ---- state --------------------------------------------------------------------------

    def reset(self, live: Sequence[tuple[int, int]] | None = None, blocking: Any = None) -> None:
        """Forget every access, clock and capture, and ask ``blocking(handle)`` whether a
        stream syncs with the legacy one (None: none does). ``live``: the allocations known
        now (an allocator snapshot taken after the allocators began reporting; what they
        reported meanwhile is applied on top, which leaves the latest state); None: none,
        nor any reported change (the allocators stopped reporting)."""
        with self._lock:
            if live is None:
                self._changes.clear()
                live = ()
            self.blocking = blocking
            self.clocks = Clocks(blocking)
            self._histories.clear()
            self._captures.clear()
            self._captured_events.clear()
            self._sizes = dict(live)
            self._starts = sorted(self._sizes)
