"""What a profile becomes once its events are read: timed records, per-name statistics, a
rich table and Chrome-trace JSON. Plain Python with no driver, so it is tested on a CPU from
records built by hand; gpurt.profiler fills it from CUDA events.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["TraceRecord", "Stat", "ProfileResult", "key_averages", "chrome_trace"]

KINDS = ("kernel", "range", "mark")
HOST_PID = 1 << 20  # the host process's track group in the trace, below the devices
_SORT_KEYS = {
    "total": lambda s: -s.total_ms,
    "calls": lambda s: -s.calls,
    "mean": lambda s: -s.mean_ms,
    "max": lambda s: -s.max_ms,
    "name": lambda s: s.name,
}


@dataclasses.dataclass(frozen=True)
class TraceRecord:
    """One timed thing: a kernel launch, an NVTX range or a mark.

    Device times are microseconds since the profile began (CUDA events); host times are
    microseconds on the same origin (perf_counter), None where not taken. ``depth`` is the
    nesting level of a push/pop range, -1 for a start/end range (it may span threads)."""

    name: str
    kind: str
    device: int
    stream: int
    start_us: float
    duration_us: float
    thread: int = 0
    host_start_us: float | None = None
    host_duration_us: float | None = None
    depth: int = 0
    domain: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.duration_us < 0:
            raise ValueError(f"negative duration {self.duration_us} for {self.name!r}")

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


@dataclasses.dataclass(frozen=True)
class Stat:
    """Device-time statistics of one name: ``share`` is a fraction of all kernel time for
    kernels, of the profiled span for ranges, 0 for marks."""

    name: str
    kind: str
    calls: int
    total_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    share: float


def span_us(records: Iterable[TraceRecord]) -> float:
    """Device time from the first record's start to the last one's end."""
    starts, ends = [], []
    for r in records:
        starts.append(r.start_us)
        ends.append(r.end_us)
    return max(ends) - min(starts) if starts else 0.0


def key_averages(records: Sequence[TraceRecord], sort_by: str = "total") -> list[Stat]:
    """Aggregate records per (kind, name), like torch.profiler's key_averages."""
    if sort_by not in _SORT_KEYS:
        raise ValueError(f"sort_by must be one of {sorted(_SORT_KEYS)}, got {sort_by!r}")
    groups: dict[tuple[str, str], list[float]] = {}
    for r in records:
        groups.setdefault((r.kind, r.name), []).append(r.duration_us / 1000.0)
    kernel_ms = sum(sum(v) for (kind, _), v in groups.items() if kind == "kernel")
    span_ms = span_us(records) / 1000.0
    stats = []
    for (kind, name), times in groups.items():
        total = sum(times)
        whole = kernel_ms if kind == "kernel" else span_ms if kind == "range" else 0.0
        stats.append(Stat(
            name=name, kind=kind, calls=len(times), total_ms=total,
            mean_ms=total / len(times), min_ms=min(times), max_ms=max(times),
            share=total / whole if whole > 0 else 0.0,
        ))
    stats.sort(key=lambda s: (_SORT_KEYS[sort_by](s), s.kind, s.name))
    return stats


def render_table(records: Sequence[TraceRecord], sort_by: str = "total",
                 row_limit: int | None = None, notes: Sequence[str] = ()) -> Table:
    """A rich table of :func:`key_averages`, ``notes`` added to its caption."""
    stats = key_averages(records, sort_by)
    kernels = sum(1 for r in records if r.kind == "kernel")
    ranges = sum(1 for r in records if r.kind == "range")
    kernel_ms = sum(s.total_ms for s in stats if s.kind == "kernel")
    span_ms = span_us(records) / 1000.0
    table = Table(title=f"gpurt profile: {kernels} kernel launches, {ranges} ranges "
                        f"(device time)", title_justify="left")
    for header in ("Name", "Kind", "Calls", "Total ms", "Mean ms", "Min ms", "Max ms", "Share"):
        table.add_column(header, justify="left" if header in ("Name", "Kind") else "right")
    shown = stats if row_limit is None else stats[:row_limit]
    for s in shown:
        timed = s.kind != "mark"
        table.add_row(
            s.name, s.kind, str(s.calls),
            *(f"{v:.4f}" if timed else "-" for v in (s.total_ms, s.mean_ms, s.min_ms, s.max_ms)),
            f"{100 * s.share:.1f}%" if timed else "-",
        )
    caption = [f"share: kernels of all kernel time ({kernel_ms:.4f} ms), "
               f"ranges of the profiled span ({span_ms:.4f} ms)"]
    if len(shown) < len(stats):
        caption.append(f"{len(stats) - len(shown)} more rows not shown")
    table.caption = "; ".join([*caption, *notes])
    table.caption_justify = "left"
    return table


def _stream_label(handle: int) -> str:
    if handle == 0:
        return "default stream (legacy)"
    if handle == 2:
        return "default stream (per-thread)"
    return f"stream {handle:#x}"


def chrome_trace(records: Sequence[TraceRecord]) -> dict[str, Any]:
    """Chrome-trace JSON (Perfetto, chrome://tracing): one process per device with one track
    per stream, a host process with one track per thread, and a flow arrow from each kernel's
    launch on the host to its run on the device. Times in microseconds."""
    events: list[dict[str, Any]] = []
    streams: dict[tuple[int, int], int] = {}
    threads: dict[int, int] = {}

    def stream_tid(device: int, handle: int) -> int:
        key = (device, handle)
        if key not in streams:
            streams[key] = tid = sum(1 for d, _ in streams if d == device) + 1
            events.append(_meta("thread_name", device, tid, name=_stream_label(handle)))
            events.append(_meta("thread_sort_index", device, tid, sort_index=tid))
        return streams[key]

    def thread_tid(ident: int) -> int:
        if ident not in threads:
            threads[ident] = tid = len(threads) + 1
            events.append(_meta("thread_name", HOST_PID, tid, name=f"host thread {ident:#x}"))
        return threads[ident]

    for device in sorted({r.device for r in records}):
        events.append(_meta("process_name", device, 0, name=f"cuda:{device}"))
        events.append(_meta("process_sort_index", device, 0, sort_index=device))
    if any(r.host_start_us is not None for r in records):
        events.append(_meta("process_name", HOST_PID, 0, name="host (Python)"))
        events.append(_meta("process_sort_index", HOST_PID, 0, sort_index=HOST_PID))

    for flow_id, r in enumerate(sorted(records, key=lambda r: (r.start_us, -r.duration_us))):
        tid = stream_tid(r.device, r.stream)
        args: dict[str, Any] = {"device_ms": r.duration_us / 1000.0}
        if r.domain is not None:
            args["domain"] = r.domain
        base = {"name": r.name, "cat": r.kind, "pid": r.device, "tid": tid, "ts": r.start_us}
        if r.kind == "mark":
            events.append({**base, "ph": "i", "s": "t"})
        elif r.depth < 0:  # a start/end range may overlap others on its track: async pair
            pair = {**base, "id": flow_id, "args": args}
            events.append({**pair, "ph": "b"})
            events.append({**pair, "ph": "e", "ts": r.end_us})
        else:
            events.append({**base, "ph": "X", "dur": r.duration_us, "args": args})
        if r.host_start_us is None:
            continue
        host_tid = thread_tid(r.thread)
        host = {"name": r.name, "cat": r.kind, "pid": HOST_PID, "tid": host_tid,
                "ts": r.host_start_us}
        if r.kind == "mark":
            events.append({**host, "ph": "i", "s": "t"})
            continue
        events.append({**host, "ph": "X", "dur": r.host_duration_us or 0.0,
                       "args": {"host_ms": (r.host_duration_us or 0.0) / 1000.0}})
        if r.kind == "kernel":  # launch on the host -> run on the device
            flow = {"name": "launch", "cat": "launch", "id": flow_id}
            events.append({**flow, "ph": "s", "pid": HOST_PID, "tid": host_tid,
                           "ts": r.host_start_us})
            events.append({**flow, "ph": "f", "bp": "e", "pid": r.device, "tid": tid,
                           "ts": r.start_us})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "gpurt.profiler"}}


def _meta(what: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "args": args}


class ProfileResult:
    """Finished records of a profile, with the views on them."""

    def __init__(self, records: Sequence[TraceRecord], notes: Sequence[str] = ()) -> None:
        self.records: list[TraceRecord] = sorted(records, key=lambda r: r.start_us)
        self.notes = list(notes)  # what the table should mention: records left out ...

    def key_averages(self, sort_by: str = "total") -> list[Stat]:
        """Per-name statistics, largest total first (see :func:`key_averages`)."""
        return key_averages(self.records, sort_by)

    def table(self, sort_by: str = "total", row_limit: int | None = None,
              width: int = 120) -> str:
        """The statistics as text (a rich table rendered without colour)."""
        out = io.StringIO()
        Console(file=out, width=width, color_system=None).print(
            render_table(self.records, sort_by, row_limit, self.notes))
        return out.getvalue()

    def print(self, sort_by: str = "total", row_limit: int | None = None,
              console: Console | None = None) -> None:
        """Print the statistics table (to ``console``, default stdout)."""
        (console or Console()).print(render_table(self.records, sort_by, row_limit, self.notes))

    def chrome_trace(self) -> dict[str, Any]:
        return chrome_trace(self.records)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> str:
        """Write the Chrome-trace JSON to ``path`` (open it in ui.perfetto.dev); returns it."""
        with open(path, "w") as fh:
            json.dump(self.chrome_trace(), fh)
        return os.fspath(path)
