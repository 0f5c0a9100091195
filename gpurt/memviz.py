"""Pictures of memory history: the stacked-allocations timeline of a snapshot from
``gpurt.memory._record_memory_history`` / ``_dump_snapshot``, as a self-contained HTML page
(:func:`render_html`) or a PNG (:func:`render_png`, needs the 'plot' extra: matplotlib).

Each allocation is a band over its lifetime, stacked in allocation order, coloured by the
line of code that allocated it; allocations never freed by the end of the trace are hatched
red and listed by call site. ``gpurt memviz SNAPSHOT -o out.html [--png out.png]`` runs
:func:`memviz_main`.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import types
from collections.abc import Sequence
from typing import Any, cast

from ._profiler.memtimeline import (
    Allocation,
    SnapshotError,
    SnapshotLike,
    Timeline,
    build_timelines,
    format_bytes,
    is_internal,
)
from ._profiler.memviz_page import PAGE

__all__ = ["render_html", "render_png", "memviz_main", "build_timelines"]

# Call-site colours, most allocated bytes first; red is kept for the leak suspects.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
           "#ff9da7", "#86bcb6", "#a0cbe8", "#8cd17d", "#ffbe7d", "#d4a6c8", "#f1ce63",
           "#79706e", "#bab0ac")
OTHER_COLOR = "#d9d9d9"
LEAK_COLOR = "#d62728"
_FRAMES_SHOWN = 8
_PLOT_HELP = "render_png needs matplotlib: pip install 'gpurt[plot]' (or pip install matplotlib)"


def _callsites(allocations: Sequence[Allocation]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Call sites by bytes allocated, each with its colour and leak totals."""
    sites: dict[str, dict[str, Any]] = {}
    for a in allocations:
        site = sites.setdefault(a.callsite, {"name": a.callsite, "count": 0, "bytes": 0,
                                             "largest": 0, "leak_count": 0, "leak_bytes": 0})
        site["count"] += 1
        site["bytes"] += a.size
        site["largest"] = max(site["largest"], a.size)
        if a.leak_suspect:
            site["leak_count"] += 1
            site["leak_bytes"] += a.size
    ordered = sorted(sites.values(), key=lambda s: (-s["bytes"], s["name"]))
    for rank, site in enumerate(ordered):
        site["color"] = PALETTE[rank] if rank < len(PALETTE) else OTHER_COLOR
    return ordered, {s["name"]: i for i, s in enumerate(ordered)}


def _shown_frames(frames: Sequence[dict[str, Any]]) -> list[str]:
    """The user's frames (innermost first), or gpurt's when there are no others."""
    user = [f for f in frames if not is_internal(f)] or list(frames)
    return [f"{f.get('name', '?')}  {f.get('filename', '?')}:{f.get('line', '?')}"
            for f in user[:_FRAMES_SHOWN]]


def _timeline_data(tl: Timeline) -> dict[str, Any]:
    """What the page's script needs for one device, as plain JSON values."""
    sites, site_index = _callsites(tl.allocations)
    frame_ids: dict[str, int] = {}
    bands = []
    for a in tl.allocations:
        if not a.drawn:
            continue
        frames = [frame_ids.setdefault(text, len(frame_ids)) for text in _shown_frames(a.frames)]
        bands.append({
            "i": a.index, "s": a.size, "p": [v for point in a.path for v in point],
            "c": site_index[a.callsite], "st": a.start, "en": a.end,
            "t0": a.start_us, "t1": a.end_us, "a": f"{a.address:#x}", "stream": a.stream,
            "leak": a.leak_suspect, "pend": a.free_requested and a.end is None,
            "f": frames,
        })
    peak_bytes, peak_step = tl.peak
    suspects = tl.leak_suspects()
    notices = []
    if tl.steps == 0:
        notices.append("This snapshot has no alloc/free events for this device (was "
                       "gpurt.memory._record_memory_history('all') on?): only the blocks "
                       "live at snapshot time are shown.")
    merged = [a for a in tl.allocations if not a.drawn]
    largest = sorted(bands, key=lambda b: (-cast(int, b["s"]), cast(int, b["i"])))[:15]
    return {
        "device": tl.device, "steps": tl.steps, "times": tl.times_us,
        "t0": tl.times_us[1] if tl.steps else tl.times_us[0],
        "envelope": [list(p) for p in tl.envelope],
        "reserved": [list(p) for p in tl.reserved] if tl.reserved else None,
        "markers": [list(m) for m in tl.markers],
        "bands": bands, "callsites": sites, "frames": list(frame_ids),
        "largest": [b["i"] for b in largest],
        "count": sum(1 for a in tl.allocations if not a.before_trace),
        "peak": {"bytes": peak_bytes, "step": peak_step},
        "end_bytes": tl.totals[-1],
        "leak_count": len(suspects), "leak_bytes": sum(a.size for a in suspects),
        "oom_count": sum(1 for m in tl.markers if m[2] == "oom"),
        "merged_count": len(merged), "notices": notices,
    }


def _default_title(snapshot: SnapshotLike) -> str:
    if isinstance(snapshot, (str, os.PathLike)):
        return f"gpurt memory timeline: {os.path.basename(os.fspath(snapshot))}"
    return "gpurt memory timeline"


def render_html(snapshot: SnapshotLike, out_path: str | os.PathLike[str], *,
                title: str | None = None, max_bands: int = 2000) -> str:
    """Write the memory timeline of ``snapshot`` (a dict or a JSON file) as one
    self-contained HTML page (inline SVG and script, no network); returns the path.
    The ``max_bands`` largest allocations per device are drawn one by one, the rest
    merged into one band."""
    timelines = build_timelines(snapshot, max_bands=max_bands)
    title = title or _default_title(snapshot)
    data = {"timelines": [_timeline_data(tl) for tl in timelines]}
    # Every "<" escaped: no "</script", "<!--" or "<script" can end or change the data block.
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    fills = {"__TITLE__": html.escape(title), "__DATA__": payload}
    page = re.sub("__TITLE__|__DATA__", lambda m: fills[m.group(0)], PAGE)  # one pass
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return os.fspath(out_path)


def _matplotlib() -> types.SimpleNamespace:
    """The pieces of matplotlib we draw with (no pyplot: no global state, no GUI backend).
    Imported here, not at the top: matplotlib is the optional 'plot' extra."""
    try:
        # (the optional extra: mypy runs without it)
        from matplotlib import patches  # type: ignore[import-not-found,unused-ignore]
        from matplotlib.backends.backend_agg import (  # type: ignore[import-not-found,unused-ignore]
            FigureCanvasAgg,
        )
        from matplotlib.collections import (  # type: ignore[import-not-found,unused-ignore]
            PolyCollection,
        )
        from matplotlib.figure import Figure  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ImportError(_PLOT_HELP) from exc
    return types.SimpleNamespace(Figure=Figure, FigureCanvas=FigureCanvasAgg, patches=patches,
                                 PolyCollection=PolyCollection)


def render_png(snapshot: SnapshotLike, out_path: str | os.PathLike[str], *,
               title: str | None = None, max_bands: int = 1500, dpi: int = 110) -> str:
    """Write the memory timeline as a PNG with matplotlib (the 'plot' extra); returns the
    path. Raises ImportError naming the extra when matplotlib is missing."""
    mpl = _matplotlib()
    timelines = build_timelines(snapshot, max_bands=max_bands)
    if not timelines:
        raise ValueError("the snapshot has no devices with memory history to draw")
    fig = mpl.Figure(figsize=(15, 0.6 + 7.4 * len(timelines)), dpi=dpi)
    mpl.FigureCanvas(fig)
    fig.suptitle(title or _default_title(snapshot), x=0.01, ha="left", fontsize=14,
                 fontweight="bold")
    for row, tl in enumerate(timelines):
        ax = fig.add_subplot(len(timelines), 1, row + 1)
        _draw_timeline(ax, tl, mpl)
    fig.tight_layout(rect=(0, 0, 1, 0.99))
    fig.savefig(out_path, dpi=dpi)
    return os.fspath(out_path)


def _draw_timeline(ax: Any, tl: Timeline, mpl: types.SimpleNamespace) -> None:
    """One device's timeline on ``ax``: the allocations as bands coloured by call site, the
    totals, the markers, the peak, the leak bracket, the title and the legend."""
    sites, site_index = _callsites(tl.allocations)
    unit = _byte_unit(max([p[2] for p in tl.envelope] + [r[1] for r in tl.reserved or []]))
    scale = 1.0 / unit[1]
    _draw_allocations(ax, tl, sites, site_index, scale, mpl.PolyCollection)
    xs = [p[0] for p in tl.envelope]
    ax.plot(xs, [p[2] * scale for p in tl.envelope], color="#222", linewidth=1.0,
            label="allocated total")
    if tl.reserved:
        ax.plot([p[0] for p in tl.reserved], [p[1] * scale for p in tl.reserved], color="#555",
                linestyle=(0, (6, 4)), linewidth=1.2, label="reserved (segments)")
    _draw_markers(ax, tl)
    peak, peak_step = tl.peak
    ax.plot([peak_step], [peak * scale], "o", color="#222", markersize=4)
    ax.annotate(f"peak {format_bytes(peak)}", (peak_step, peak * scale), xytext=(5, 5),
                textcoords="offset points", fontsize=9)
    end = tl.steps + 1
    ymax = max([p[2] for p in tl.envelope] + [r[1] for r in tl.reserved or []]) * scale * 1.08
    ax.set_xlim(0, end)
    ax.set_ylim(0, max(ymax, 1e-9))
    suspects = tl.leak_suspects()
    leak_bytes = sum(a.size for a in suspects)
    _draw_leak_bracket(ax, suspects, leak_bytes, end, scale)
    ax.set_ylabel(f"allocated memory ({unit[0]})")
    ax.set_xlabel("allocation and free events (in order)")
    count = sum(1 for a in tl.allocations if not a.before_trace)
    ax.set_title(f"cuda:{tl.device} — {count} allocations, peak {format_bytes(peak)}, "
                 f"{format_bytes(tl.totals[-1])} allocated at the end, "
                 f"{len(suspects)} never freed ({format_bytes(leak_bytes)})",
                 loc="left", fontsize=11, color=LEAK_COLOR if suspects else "#222")
    ax.grid(axis="y", color="#eee")
    ax.set_axisbelow(True)
    _draw_legend(ax, tl, sites, mpl.patches)


def _draw_allocations(ax: Any, tl: Timeline, sites: list[dict[str, Any]],
                      site_index: dict[str, int], scale: float, PolyCollection: Any) -> None:
    """The drawn allocations as bands (faded from before the trace; leak suspects hatched,
    frees still pending dashed), and the smaller ones merged into one grey band."""
    polygons, colors, leaks, pending = [], [], [], []
    for a in tl.allocations:
        if not a.drawn:
            continue
        lower = [(x, y * scale) for x, y in a.path]
        polygon = lower + [(x, y + a.size * scale) for x, y in reversed(lower)]
        polygons.append(polygon)
        color = sites[site_index[a.callsite]]["color"]
        colors.append(color + ("80" if a.before_trace else ""))  # faded: from before the trace
        if a.leak_suspect:
            leaks.append(polygon)
        elif a.free_requested and a.end is None:
            pending.append(polygon)
    ax.add_collection(PolyCollection(polygons, facecolors=colors, edgecolors="white",
                                     linewidths=0.3))
    if any(not a.drawn for a in tl.allocations):
        lower = [(x, b * scale) for x, b, _ in tl.envelope]
        upper = [(x, t * scale) for x, _, t in reversed(tl.envelope)]
        ax.add_collection(PolyCollection([lower + upper], facecolors=OTHER_COLOR,
                                         edgecolors="none"))
    ax.add_collection(PolyCollection(leaks, facecolors="none", edgecolors=LEAK_COLOR,
                                     hatch="////", linewidths=1.0))
    ax.add_collection(PolyCollection(pending, facecolors="none", edgecolors="#e08a00",
                                     linestyles="--", linewidths=1.0))


def _draw_markers(ax: Any, tl: Timeline) -> None:
    """A vertical line per out-of-memory and empty_cache marker; close labels stack down."""
    rows: list[tuple[float, int]] = []  # marker labels placed
    near = (tl.steps + 1) / 14
    for x, _, kind in tl.markers:
        color = LEAK_COLOR if kind == "oom" else "#777"
        ax.axvline(x, color=color, linewidth=1.1, linestyle="-" if kind == "oom" else ":")
        row = 0
        while any(r == row and abs(px - x) < near for px, r in rows):
            row += 1
        rows.append((x, row))
        ax.annotate("out of memory" if kind == "oom" else "empty_cache", (x, 1.0),
                    xycoords=("data", "axes fraction"), xytext=(3, -12 - 11 * row),
                    textcoords="offset points", color=color, fontsize=9)


def _draw_leak_bracket(ax: Any, suspects: list[Allocation], leak_bytes: int, end: int,
                       scale: float) -> None:
    """At the right edge, a bracket over the drawn leak suspects with their count and bytes."""
    drawn = [a for a in suspects if a.drawn]
    if not drawn:
        return
    lo = min(a.path[-1][1] for a in drawn) * scale
    hi = max(a.path[-1][1] + a.size for a in drawn) * scale
    ax.annotate("", (end, lo), xytext=(end, hi),
                arrowprops={"arrowstyle": "|-|", "color": LEAK_COLOR, "lw": 1.6})
    ax.annotate(f"never freed:\n{len(suspects)} allocs\n{format_bytes(leak_bytes)}",
                (end, (lo + hi) / 2), xytext=(8, 0), textcoords="offset points",
                color=LEAK_COLOR, fontsize=9, fontweight="bold", va="center",
                annotation_clip=False)


def _draw_legend(ax: Any, tl: Timeline, sites: list[dict[str, Any]], patches: Any) -> None:
    """The legend under the chart: call sites that leak first, then the largest by bytes."""
    listed = sorted(sites, key=lambda s: (-s["leak_bytes"], -s["bytes"]))[:12]
    handles = [patches.Patch(facecolor=s["color"], label=_legend_label(s)) for s in listed]
    handles.append(patches.Patch(facecolor="none", edgecolor=LEAK_COLOR, hatch="////",
                                 label="hatched red: never freed (leak suspect)"))
    if any(a.before_trace for a in tl.allocations):
        handles.append(patches.Patch(facecolor="#99999980",
                                     label="faded: allocated before recording began"))
    if any(not a.drawn for a in tl.allocations):
        handles.append(patches.Patch(facecolor=OTHER_COLOR, label="smaller allocations, merged"))
    handles += ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, -0.1), ncol=3,
              fontsize=8.5, frameon=False, title="colour = the line of code that allocated",
              title_fontsize=9, alignment="left")


def _legend_label(site: dict[str, Any]) -> str:
    text = f"{site['name']}: {site['count']}x, {format_bytes(site['bytes'])}"
    if site["leak_count"]:
        text += f" ({site['leak_count']} never freed)"
    return text


def _byte_unit(top: float) -> tuple[str, int]:
    for name, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if top >= 4 * size:
            return name, size
    return "bytes", 1


def memviz_main(argv: Sequence[str] | None = None) -> int:
    """``gpurt memviz SNAPSHOT -o out.html [--png out.png]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="gpurt memviz",
        description="Draw a memory-history snapshot (gpurt.memory._dump_snapshot) as a "
                    "timeline of stacked allocations; never-freed ones are marked in red.")
    parser.add_argument("snapshot", help="the snapshot JSON file")
    parser.add_argument("-o", "--output", help="HTML file to write (default: SNAPSHOT.html)")
    parser.add_argument("--png", help="also write a PNG here (needs matplotlib)")
    parser.add_argument("--title", help="page title")
    parser.add_argument("--max-bands", type=int, default=2000,
                        help="largest allocations drawn one by one (default 2000)")
    args = parser.parse_args(argv)
    output = args.output or os.path.splitext(args.snapshot)[0] + ".html"
    try:
        timelines = build_timelines(args.snapshot, max_bands=args.max_bands)
        render_html(args.snapshot, output, title=args.title, max_bands=args.max_bands)
        written = [output]
        if args.png:
            render_png(args.snapshot, args.png, title=args.title, max_bands=args.max_bands)
            written.append(args.png)
    except SnapshotError as exc:
        print(f"gpurt memviz: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, ImportError, OSError) as exc:
        print(f"gpurt memviz: error: {exc}", file=sys.stderr)
        return 1
    for tl in timelines:
        suspects = tl.leak_suspects()
        print(f"cuda:{tl.device}: {sum(1 for a in tl.allocations if not a.before_trace)} "
              f"allocations, peak {format_bytes(tl.peak[0])}, {len(suspects)} never freed "
              f"({format_bytes(sum(a.size for a in suspects))})")
    print("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    raise SystemExit(memviz_main())
