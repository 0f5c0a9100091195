"""Memory history -> a stacked-allocations timeline: the model behind gpurt.memviz's pictures.

Input is a snapshot from ``gpurt.memory._snapshot()`` (torch's format: "segments" and one
trace per device in "device_traces"). The timeline has one step per alloc or free event.
Each allocation is a band from the step it was allocated to the step it was freed, its height
its size; bands are stacked in allocation order, so when one is freed the bands above it slide
down over the next step and the top edge is the allocated total. Past ``max_bands`` the
smallest allocations merge into one band on top. Bands still allocated when the trace ends
are the leak suspects. Plain Python, no driver: tested on a CPU from synthetic snapshots.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

__all__ = ["Allocation", "Timeline", "load_snapshot", "build_timelines", "format_bytes"]

Snapshot = Mapping[str, Any]
SnapshotLike = Union[Snapshot, str, "os.PathLike[str]"]
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gpurt/
_LIVE_STATES = ("active_allocated", "active_pending_free")


@dataclasses.dataclass(eq=False)  # compared by identity: the stack looks bands up by it
class Allocation:
    """One allocation's life. ``path`` is its band's lower edge: (step, offset in bytes)
    points; the band starts at ``start`` and ends at ``end`` (None: alive at the end)."""

    index: int
    address: int
    size: int
    stream: int
    start: int
    start_us: float | None
    frames: list[dict[str, Any]]
    end: int | None = None
    end_us: float | None = None
    before_trace: bool = False  # allocated before the trace began (or its start was lost)
    free_requested: bool = False  # freed by the program, release still pending at the end
    drawn: bool = True  # False: merged into the band of small allocations
    path: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    @property
    def alive_at_end(self) -> bool:
        return self.end is None

    @property
    def leak_suspect(self) -> bool:
        """Allocated during the trace and never freed by the program."""
        return self.end is None and not self.before_trace and not self.free_requested

    @property
    def callsite(self) -> str:
        return callsite(self.frames)


@dataclasses.dataclass
class Timeline:
    """The stacked picture of one device's trace."""

    device: int
    steps: int  # alloc/free events; x runs from 0 to steps + 1
    times_us: list[float]  # time of each x step (0 .. steps + 1)
    allocations: list[Allocation]
    totals: list[int]  # allocated bytes after each step (0 .. steps + 1)
    reserved: list[tuple[float, int]] | None  # step function of reserved bytes, if known
    # (step, top of the drawn bands, allocated total): the merged small allocations lie
    # between the two; the second is the total's curve
    envelope: list[tuple[float, int, int]]
    markers: list[tuple[float, float, str]]  # (step, time_us, "oom" | "empty_cache")
    close_action: str

    @property
    def peak(self) -> tuple[int, int]:
        """(bytes, step) of the highest allocated total."""
        best = max(range(len(self.totals)), key=self.totals.__getitem__)
        return self.totals[best], best

    def leak_suspects(self) -> list[Allocation]:
        return [a for a in self.allocations if a.leak_suspect]


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def frame_text(frame: Mapping[str, Any]) -> str:
    filename = str(frame.get("filename", "?"))
    return f"{frame.get('name', '?')} ({os.path.basename(filename)}:{frame.get('line', '?')})"


def is_internal(frame: Mapping[str, Any]) -> bool:
    """True for a frame in gpurt's own modules, here or where the snapshot was taken:
    gpurt/*.py and its subpackages, not the bundled kernels (gpurt/kernels)."""
    parent = os.path.dirname(str(frame.get("filename", "")).replace("\\", "/"))
    if os.path.basename(parent) == "kernels":
        return False
    return (parent == _PACKAGE_DIR or os.path.basename(parent) == "gpurt"
            or os.path.basename(os.path.dirname(parent)) == "gpurt")


def callsite(frames: Sequence[Mapping[str, Any]]) -> str:
    """The innermost frame outside gpurt itself: the line that asked for the memory."""
    for frame in frames:
        if not is_internal(frame):
            return frame_text(frame)
    return frame_text(frames[0]) if frames else "(no stack recorded)"


class SnapshotError(ValueError):
    """A memory snapshot whose content is not what ``_dump_snapshot`` writes."""


_MAX_DEVICE = 1 << 12  # device ordinals a snapshot may name (traces are a list by device)


def _refuse_constant(name: str) -> float:
    raise SnapshotError(f"the snapshot holds {name}, which is not a JSON number")


def _expect(ok: bool, where: str, what: str, value: Any) -> None:
    if not ok:
        raise SnapshotError(f"memory snapshot: {where} should be {what}, not {value!r:.60}")


def _is_int(value: Any, low: int = 0) -> bool:
    return type(value) is int and value >= low


def _check_fields(item: Any, where: str, ints: Sequence[str], texts: Sequence[str]) -> None:
    """``item`` is a dict whose present ``ints`` are ints >= 0 and ``texts`` strings, and
    whose frames, if any, are a list of dicts."""
    _expect(isinstance(item, dict), where, "an object", item)
    for key in ints:
        if key in item:
            _expect(_is_int(item[key]), f"{where}.{key}", "an integer >= 0", item[key])
    for key in texts:
        if key in item:
            _expect(isinstance(item[key], str), f"{where}.{key}", "a string", item[key])
    frames = item.get("frames")
    _expect(frames is None or isinstance(frames, list), f"{where}.frames", "a list", frames)
    for i, frame in enumerate(frames or []):
        _check_fields(frame, f"{where}.frames[{i}]", ("line",), ("filename", "name"))


def check_snapshot(data: Any) -> None:
    """Raise SnapshotError unless ``data`` has the shape ``_dump_snapshot`` writes, as far
    as the timeline reads it: typed fields, finite times, sizes and addresses >= 0."""
    _expect(isinstance(data, dict) and ("segments" in data or "device_traces" in data),
            "the top level", "a dict with 'segments' and 'device_traces'", data)
    segments, traces = data.get("segments") or [], data.get("device_traces") or []
    _expect(isinstance(segments, list), "segments", "a list", segments)
    _expect(isinstance(traces, list) and len(traces) <= _MAX_DEVICE, "device_traces",
            f"a list (at most {_MAX_DEVICE} devices)", traces)
    for i, segment in enumerate(segments):
        _check_fields(segment, f"segments[{i}]", ("stream", "total_size"), ())
        _expect(_is_int(segment.get("device", 0)) and segment.get("device", 0) < _MAX_DEVICE,
                f"segments[{i}].device", "a device ordinal", segment.get("device"))
        blocks = segment.get("blocks")
        _expect(blocks is None or isinstance(blocks, list), f"segments[{i}].blocks", "a list",
                blocks)
        for j, block in enumerate(blocks or []):
            _check_fields(block, f"segments[{i}].blocks[{j}]", ("address", "size"), ("state",))
    for d, trace in enumerate(traces):
        _expect(trace is None or isinstance(trace, list), f"device_traces[{d}]", "a list", trace)
        for i, event in enumerate(trace or []):
            where = f"device_traces[{d}][{i}]"
            _check_fields(event, where, ("addr", "size", "stream"), ("action",))
            t = event.get("time_us")
            _expect(t is None or (type(t) in (int, float) and math.isfinite(t)),
                    f"{where}.time_us", "a finite number", t)


def load_snapshot(snapshot: SnapshotLike) -> dict[str, Any]:
    """A snapshot dict from a dict or a JSON file written by ``_dump_snapshot``, checked
    (SnapshotError names the first field that is wrong)."""
    if isinstance(snapshot, Mapping):
        data: Any = dict(snapshot)
    else:
        path = os.fspath(snapshot)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read memory snapshot {path!r}: {exc.strerror}") from None
        try:
            data = json.loads(raw, parse_constant=_refuse_constant)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise SnapshotError(
                f"{path!r} is not a JSON memory snapshot (write one with "
                "gpurt.memory._dump_snapshot(path); pickled torch snapshots are not read)"
            ) from None
    check_snapshot(data)
    return data


def build_timelines(snapshot: SnapshotLike, max_bands: int = 2000) -> list[Timeline]:
    """One :class:`Timeline` per device that has a trace or live blocks."""
    data = load_snapshot(snapshot)
    traces = data.get("device_traces") or []
    segments = data.get("segments") or []
    devices = {i for i, trace in enumerate(traces) if trace}
    devices |= {int(s.get("device", 0)) for s in segments}
    timelines = []
    for device in sorted(devices):
        trace = traces[device] if device < len(traces) else []
        own = [s for s in segments if int(s.get("device", 0)) == device]
        timelines.append(_build(device, trace or [], own, max_bands))
    return timelines


def _build(device: int, trace: Sequence[Mapping[str, Any]],
           segments: Sequence[Mapping[str, Any]], max_bands: int) -> Timeline:
    actions = {e.get("action") for e in trace}
    close = "free_completed" if "free_completed" in actions else "free_requested"
    allocations = _allocations(trace, segments, close)
    steps = sum(1 for e in trace if e.get("action") in ("alloc", close))
    times = _step_times(trace, close, steps)

    for a in _choose_drawn(allocations, max_bands):
        a.drawn = True

    stack: list[Allocation] = []  # drawn, live, in allocation order (bottom first)
    offsets: dict[int, int] = {}  # allocation index -> current lower edge
    by_start: dict[int, list[Allocation]] = {}
    by_end: dict[int, Allocation] = {}
    for a in allocations:
        by_start.setdefault(a.start, []).append(a)
        if a.end is not None:
            by_end[a.end] = a
    drawn_total = other_total = 0
    totals = [0] * (steps + 2)
    envelope: list[tuple[float, int, int]] = []
    for step in range(steps + 1):
        slides = False  # a drawn band ends: those above slide down until the next step
        envelope.append((step, drawn_total, drawn_total + other_total))
        freed = by_end.get(step)
        if freed is not None and freed.drawn:
            freed.path.append((step, offsets[freed.index]))
            position = stack.index(freed)
            for above in stack[position + 1:]:
                old = offsets[above.index]
                offsets[above.index] = new = old - freed.size
                above.path += [(step, old), (step + 1, new)]
            slides = position < len(stack) - 1 or other_total > 0  # anything above it?
            del stack[position]
            drawn_total -= freed.size
        elif freed is not None:
            other_total -= freed.size
        for a in by_start.get(step, ()):
            if a.drawn:
                offsets[a.index] = drawn_total
                a.path.append((step, drawn_total))
                stack.append(a)
                drawn_total += a.size
            else:
                other_total += a.size
        envelope.append((step + 1 if slides else step, drawn_total, drawn_total + other_total))
        totals[step] = drawn_total + other_total
    totals[steps + 1] = totals[steps]
    for a in stack:  # alive at the end: the band runs to the right edge
        a.path.append((steps + 1, offsets[a.index]))
    envelope.append((steps + 1, drawn_total, drawn_total + other_total))
    reserved = _reserved(trace, segments, close, steps)
    markers = _markers(trace, close, steps)
    return Timeline(device, steps, times, allocations, totals, reserved, envelope, markers, close)


def _choose_drawn(allocations: Sequence[Allocation], max_bands: int) -> list[Allocation]:
    """The largest allocations, but the leak suspects first (up to half the bands): they
    are what the picture is for, and a merged band would hide them."""
    for a in allocations:
        a.drawn = False
    by_size = sorted(allocations, key=lambda a: (-a.size, a.index))
    chosen = [a for a in by_size if a.leak_suspect][: max_bands // 2]
    picked = {a.index for a in chosen}
    chosen += [a for a in by_size if a.index not in picked][: max_bands - len(chosen)]
    return chosen


def _allocations(trace: Sequence[Mapping[str, Any]], segments: Sequence[Mapping[str, Any]],
                 close: str) -> list[Allocation]:
    """Every allocation seen, in allocation order; those already live when the trace begins
    (freed without an alloc in the trace, or live blocks the trace never mentions) first."""
    before: list[Allocation] = []
    during: list[Allocation] = []
    live: dict[int, Allocation] = {}
    step = 0
    for event in trace:
        action = event.get("action")
        addr = int(event.get("addr", 0))
        if action == "alloc":
            step += 1
            a = Allocation(0, addr, int(event.get("size", 0)), int(event.get("stream", 0)),
                           step, _time(event), list(event.get("frames") or []))
            live[addr] = a
            during.append(a)
        elif action == "free_requested" and close != action:
            if addr in live:
                live[addr].free_requested = True
        elif action == close:
            step += 1
            found = live.pop(addr) if addr in live else None
            if found is not None:
                a = found
            else:  # allocated before the trace began
                a = Allocation(0, addr, int(event.get("size", 0)), int(event.get("stream", 0)),
                               0, None, [], before_trace=True)
                before.append(a)
            a.end, a.end_us, a.free_requested = step, _time(event), False
    seen = set(live)
    for segment in segments:
        for block in segment.get("blocks") or []:
            addr = int(block.get("address", 0))
            if block.get("state") in _LIVE_STATES and addr not in seen:
                before.append(Allocation(
                    0, addr, int(block.get("size", 0)), int(segment.get("stream", 0)), 0, None,
                    list(block.get("frames") or []), before_trace=True,
                    free_requested=block.get("state") == "active_pending_free"))
    ordered = before + during
    for index, a in enumerate(ordered):
        a.index = index
    return ordered


def _time(event: Mapping[str, Any]) -> float | None:
    value = event.get("time_us")
    return None if value is None else float(value)


def _step_times(trace: Sequence[Mapping[str, Any]], close: str, steps: int) -> list[float]:
    """Time of each step 0 .. steps + 1, non-decreasing; evenly spaced where unknown."""
    known = [_time(e) for e in trace if e.get("action") in ("alloc", close)]
    if not known or any(t is None for t in known):
        return [float(i) for i in range(steps + 2)]
    times: list[float] = []
    for t in known:
        times.append(max(t, times[-1]) if times else t)  # type: ignore[type-var,arg-type]
    span = times[-1] - times[0]
    pad = max(span * 0.02, 1.0)
    return [times[0] - pad, *times, times[-1] + pad]


_GROWS = ("segment_alloc", "segment_map")
_SHRINKS = ("segment_free", "segment_unmap")


def _reserved(trace: Sequence[Mapping[str, Any]], segments: Sequence[Mapping[str, Any]],
              close: str, steps: int) -> list[tuple[float, int]] | None:
    """Reserved bytes as a step function of x, from segment events; None if there are none."""
    changes: list[tuple[int, int]] = []
    step = 0
    for event in trace:
        action = event.get("action")
        if action in ("alloc", close):
            step += 1
        elif action in _GROWS or action in _SHRINKS:  # fixed or expandable segments
            sign = 1 if action in _GROWS else -1
            changes.append((min(step + 1, steps + 1), sign * int(event.get("size", 0))))
    if not changes:
        return None
    at_end = sum(int(s.get("total_size", 0)) for s in segments)
    level = max(0, at_end - sum(delta for _, delta in changes)) if segments else 0
    points: list[tuple[float, int]] = [(0, level)]
    for x, delta in changes:
        points += [(x, level), (x, level + delta)]
        level += delta
    points.append((steps + 1, level))
    return points


def _markers(trace: Sequence[Mapping[str, Any]], close: str,
             steps: int) -> list[tuple[float, float, str]]:
    markers = []
    step = 0
    for event in trace:
        action = event.get("action")
        if action in ("alloc", close):
            step += 1
        elif action in ("oom", "empty_cache"):
            markers.append((min(step + 0.5, steps + 1), _time(event) or 0.0, str(action)))
    return markers
