"""Profiling: ``start()``/``stop()`` for an external profiler's capture range, and
``profile()``, which times every gpurt.nvtx range and every gpurt kernel launch on the
device with CUDA events and reports a table and a Chrome trace.

While a profile is active, a range pushed through gpurt.nvtx records an event on the current
stream when it begins and ends; a kernel launched through gpurt.nvrtc records an event on
its stream before and after (launch hooks). Nothing is read back until the profile ends (or
``table()`` is asked for): then the device is synchronised once and the event pairs become
:class:`TraceRecord` s. Events come from a per-device pool, so profiling many launches costs
two ``cuEventRecord`` calls each and no event creation.

``gpurt.nvtx`` is the NVTX module (torch.cuda.nvtx's names); it is re-exported here.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from cuda.bindings import driver as cu
from rich.console import Console

from . import nvtx
from . import streams as _streams
from ._core.driver import CudaError, check
from ._core.fork import renew_after_fork
from ._launch import kernel as _launch
from ._profiler.trace import ProfileResult, Stat, TraceRecord, chrome_trace, key_averages
from .device import bind_context, current_device
from .device import synchronize as synchronize_device

__all__ = [
    "nvtx",
    "start",
    "stop",
    "profile",
    "Profile",
    "ProfileResult",
    "TraceRecord",
    "Stat",
    "key_averages",
    "chrome_trace",
]

_POOL_LIMIT = 8192  # events kept per device between profiles


def start() -> None:
    """Begin the capture range of an attached profiler (wraps cuProfilerStart), e.g.
    ``nsys profile --capture-range=cudaProfilerApi``."""
    bind_context(current_device())
    check(cu.cuProfilerStart(), "cuProfilerStart")


def stop() -> None:
    """End the capture range begun by :func:`start` (wraps cuProfilerStop)."""
    bind_context(current_device())
    check(cu.cuProfilerStop(), "cuProfilerStop")


class _EventPool:
    """Timing events per device, reused across ranges, launches and profiles."""

    def __init__(self) -> None:
        self._free: dict[int, list[_streams.Event]] = {}
        self._lock = threading.Lock()

    def take(self, device_index: int) -> _streams.Event:
        with self._lock:
            free = self._free.get(device_index)
            if free:
                return free.pop()
        return _streams.Event(enable_timing=True)

    def give(self, device_index: int, events: Sequence[_streams.Event]) -> None:
        with self._lock:
            free = self._free.setdefault(device_index, [])
            free.extend(events[: max(0, _POOL_LIMIT - len(free))])


_pool = _EventPool()
renew_after_fork(_pool, _lock=threading.Lock)


class _Pending:
    """A record whose device times are not read yet."""

    __slots__ = ("name", "kind", "device", "stream", "begin", "end", "host_begin", "host_end",
                 "thread", "depth", "domain")

    def __init__(self, name: str, kind: str, device: int, stream: int, begin: Any,
                 host_begin: int, thread: int, depth: int, domain: str | None) -> None:
        self.name = name
        self.kind = kind
        self.device = device
        self.stream = stream
        self.begin = begin
        self.end: Any = None
        self.host_begin = host_begin
        self.host_end = host_begin
        self.thread = thread
        self.depth = depth
        self.domain = domain


class Profile:
    """The profile context manager; see :func:`profile`. Observes gpurt.nvtx ranges and
    gpurt kernel launches between ``__enter__`` and ``__exit__``."""

    def __init__(self, *, print_table: bool = True, sort_by: str = "total",
                 row_limit: int | None = None, console: Console | None = None) -> None:
        key_averages([], sort_by)  # validate sort_by now
        self.print_table = print_table
        self.sort_by = sort_by
        self.row_limit = row_limit
        self.console = console
        self._active = False
        self._lock = threading.Lock()
        self._finished: list[_Pending] = []
        self._open: dict[tuple[int, str | None], list[_Pending]] = {}  # (thread, domain)
        self._started: dict[tuple[str | None, int], _Pending] = {}  # (domain, range_id)
        self._launching: dict[int, _Pending] = {}  # thread -> kernel between begin and end
        self._origins: dict[int, tuple[Any, int]] = {}  # device -> (event, host ns)
        self._host_origin = 0
        self._external: dict[tuple[int, int], _streams.ExternalStream] = {}
        self._records: list[TraceRecord] = []
        self._left_open = 0  # ranges still open when the profile ended
        self._untimed = 0  # pairs whose events could not be read

    # -- lifetime -------------------------------------------------------------------------

    def __enter__(self) -> Profile:
        if self._active:
            raise RuntimeError("this profile is already active")
        previous = nvtx._set_observer(self)
        if previous is not None:
            nvtx._set_observer(previous)
            raise RuntimeError("another gpurt.profiler.profile() is already active")
        try:
            index = current_device()
            synchronize_device(index)  # so the origin event runs at once
            self._origin(index, _streams.current_stream())
            self._host_origin = self._origins[index][1]
        except BaseException:
            nvtx._set_observer(None)
            raise
        _launch.add_launch_hook(self._on_launch)
        self._active = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._active = False
        _launch.remove_launch_hook(self._on_launch)
        nvtx._set_observer(None)
        with self._lock:
            unfinished = [p for stack in self._open.values() for p in stack]
            unfinished += [*self._started.values(), *self._launching.values()]
            self._open.clear()
            self._started.clear()
            self._launching.clear()
        self._left_open += sum(1 for p in unfinished if p.kind == "range")
        self._collect(unfinished)
        for index, (event, _) in self._origins.items():
            _pool.give(index, [event])
        self._origins.clear()
        self._external.clear()
        if self.print_table and exc_info[0] is None:
            self.result.print(self.sort_by, self.row_limit, self.console)

    # -- results --------------------------------------------------------------------------

    @property
    def result(self) -> ProfileResult:
        """Everything finished so far, read from the device (synchronises once)."""
        self._collect()
        notes = []
        if self._left_open:
            notes.append(f"{self._left_open} ranges still open at the end were left out")
        if self._untimed:
            notes.append(f"{self._untimed} records could not be timed (events recorded "
                         "during CUDA graph capture never run)")
        return ProfileResult(self._records, notes)

    @property
    def records(self) -> list[TraceRecord]:
        """The timed records so far, by device start time."""
        return self.result.records

    def key_averages(self, sort_by: str = "total") -> list[Stat]:
        """Per-name device-time statistics (calls, total/mean/min/max ms, share)."""
        return self.result.key_averages(sort_by)

    def table(self, sort_by: str | None = None, row_limit: int | None = None) -> str:
        """The statistics as a text table."""
        return self.result.table(sort_by or self.sort_by, row_limit or self.row_limit)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        """Write a Chrome-trace JSON file (Perfetto, chrome://tracing); returns the path."""
        return self.result.export_chrome_trace(path)

    def _collect(self, discard: Sequence[_Pending] = ()) -> None:
        """Turn finished pending records into TraceRecords; return all their events."""
        with self._lock:
            finished, self._finished = self._finished, []
        if not finished and not discard:
            return
        for index in {p.device for p in (*finished, *discard)}:
            synchronize_device(index)
        host_origin = self._host_origin
        for p in finished:
            origin, origin_host_ns = self._origins[p.device]
            offset_us = (origin_host_ns - host_origin) / 1000.0
            try:
                start_ms = origin.elapsed_time(p.begin)
                duration_ms = p.begin.elapsed_time(p.end) if p.end is not None else 0.0
            except (CudaError, RuntimeError):  # e.g. recorded into a graph being captured
                self._untimed += 1
                continue
            self._records.append(TraceRecord(
                name=p.name, kind=p.kind, device=p.device, stream=p.stream,
                start_us=offset_us + 1000.0 * start_ms,
                duration_us=1000.0 * max(0.0, duration_ms),
                thread=p.thread,
                host_start_us=(p.host_begin - host_origin) / 1000.0,
                host_duration_us=(p.host_end - p.host_begin) / 1000.0,
                depth=p.depth, domain=p.domain,
            ))
        for p in (*finished, *discard):
            _pool.give(p.device, [e for e in (p.begin, p.end) if e is not None])

    # -- recording ------------------------------------------------------------------------

    def _origin(self, index: int, stream: Any) -> None:
        """Record the event that device ``index``'s times are measured from."""
        with self._lock:
            if index not in self._origins:
                event = _pool.take(index)
                event.record(stream)
                self._origins[index] = (event, time.perf_counter_ns())

    def _begin(self, name: str, kind: str, stream: Any, depth: int,
               domain: str | None) -> _Pending:
        index = stream.device_index
        if index not in self._origins:
            self._origin(index, stream)
        event = _pool.take(index)
        event.record(stream)
        return _Pending(name, kind, index, stream.cuda_stream, event, time.perf_counter_ns(),
                        threading.get_ident(), depth, domain)

    def _end(self, pending: _Pending, stream: Any) -> None:
        event = _pool.take(pending.device)
        event.record(stream)
        pending.end = event
        pending.host_end = time.perf_counter_ns()
        with self._lock:
            self._finished.append(pending)

    def _stream_for(self, handle: int) -> Any:
        """A gpurt stream object for a raw handle handed to a launch hook."""
        current = _streams.current_stream()
        if current.cuda_stream == handle:
            return current
        key = (current.device_index, handle)
        stream = self._external.get(key)
        if stream is None:
            stream = self._external[key] = _streams.ExternalStream(handle, current.device_index)
        return stream

    # nvtx observer (gpurt.nvtx.RangeObserver)

    def on_push(self, domain: str | None, message: str) -> None:
        stack = self._open.setdefault((threading.get_ident(), domain), [])
        stack.append(self._begin(message, "range", _streams.current_stream(), len(stack),
                                 domain))

    def on_pop(self, domain: str | None) -> None:
        stack = self._open.get((threading.get_ident(), domain))
        if stack:  # empty when the range was pushed before the profile began
            self._end(stack.pop(), _streams.current_stream())

    def on_start(self, domain: str | None, message: str, range_id: int) -> None:
        pending = self._begin(message, "range", _streams.current_stream(), -1, domain)
        with self._lock:
            self._started[(domain, range_id)] = pending

    def on_end(self, domain: str | None, range_id: int) -> None:
        with self._lock:
            pending = self._started.pop((domain, range_id), None)
        if pending is not None:
            self._end(pending, _streams.current_stream())

    def on_mark(self, domain: str | None, message: str) -> None:
        pending = self._begin(message, "mark", _streams.current_stream(), 0, domain)
        with self._lock:
            self._finished.append(pending)

    # gpurt.nvrtc launch hook

    def _on_launch(self, kernel: Any, stream_handle: int, phase: str) -> None:
        thread = threading.get_ident()
        if phase == "begin":
            stale = self._launching.pop(thread, None)  # a launch that raised: no "end"
            if stale is not None:
                self._collect([stale])
            stream = self._stream_for(int(stream_handle))
            self._launching[thread] = self._begin(kernel.name, "kernel", stream, 0, None)
        elif phase == "end":
            pending = self._launching.pop(thread, None)
            if pending is not None:
                self._end(pending, self._stream_for(int(stream_handle)))


def profile(*, print_table: bool = True, sort_by: str = "total", row_limit: int | None = None,
            console: Console | None = None) -> Profile:
    """Time every gpurt.nvtx range and gpurt kernel launch on the device while active::

        with gpurt.profiler.profile() as prof:
            with gpurt.nvtx.range("step"):
                kernel(grid, block, args)
        prof.export_chrome_trace("trace.json")   # open in ui.perfetto.dev

    On exit the device is synchronised once and, unless ``print_table=False``, a table of
    calls, total/mean/min/max device ms and share per name is printed. One profile at a
    time per process."""
    return Profile(print_table=print_table, sort_by=sort_by, row_limit=row_limit,
                   console=console)
