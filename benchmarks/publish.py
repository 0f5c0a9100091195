"""Publish benchmark results: per-suite files, RESULTS.md, ratio charts and the README section.

    python benchmarks/publish.py BENCH_JSON [--results DIR] [--readme PATH] [--no-readme]

From a merged ``bench.json`` (benchmarks/_merge.py; written by ``gpurt bench`` or
``scripts/gpu-check`` on the GPU machine) this writes, under ``benchmarks/results/``:

- ``<suite>-<device>.json`` for every suite that produced rows (the suite's document plus its
  run record), e.g. ``softmax-nvidia-h200.json``; a later run on the same device replaces it;
- ``RESULTS.md``: per device and suite, a table of gpurt against each peer with the ratio,
  the date, the versions, and the fact that peers ran in the same process in the same run;
- ``ratios-<device>.png``: bar charts of those ratios (needs matplotlib; skipped without it);

and regenerates README.md's performance section between ``<!-- perf:begin -->`` and
``<!-- perf:end -->``. RESULTS.md, the charts and the README are built from every result
file in the folder, so results of several devices sit side by side.

Rows (a light convention, see docs/benchmarks.md). A suite's rows are dicts; publish reads:

- *wide* rows, a column per implementation: ``{"name": ..., "unit": "us", "gpurt": 1.0,
  "torch": 1.6, "cupy": 1.3, "cuda_core": ..., "raw": ...}``, or with the unit in each
  column's name, one line per unit: ``{"shape": ..., "gpurt_tflops": 700, "cublas_tflops":
  745, "gpurt_ms": 0.19, "cublas_ms": 0.18}``; without "name", the row's other text and
  integer fields name it; an optional ``"better": "lower"|"higher"`` overrides the
  direction the unit implies;
- *long* rows, one implementation per row: ``{"what": ..., "lib": "torch 2.11", "host_us":
  1.6}`` (the implementation under "impl", "lib", "library" or "implementation"; each numeric
  field whose name ends in a unit, such as ``host_us``, ``device_ms``, ``gbps``, ``tflops``, is
  a measurement); rows that share their other fields become one line;
- ``{"summary": {...}}`` rows become notes; anything else is listed as it is.

The ratio is gpurt's speed relative to the peer, so above 1 means gpurt is faster: the
peer's value over gpurt's for times and sizes (lower is better), gpurt's over the peer's for
rates (higher is better). A unit with no known direction gets no ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

try:  # optional: the charts are skipped without it
    from matplotlib.figure import Figure
except ImportError:
    Figure = None

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE.parent / "README.md"
BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"

IMPL_KEYS = ("impl", "lib", "library", "implementation")
# implementations by display order; gpurt is the subject, the rest are peers
KNOWN_IMPLS = ("gpurt", "torch", "cupy", "cuda_core", "raw", "cublas", "copy", "samecopy", "nvtx",
               "numba", "jax", "triton", "pycuda")
# bounds rather than competitors: shown apart in the charts
REFERENCES = ("copy", "samecopy", "raw")
SKIPPED_PREFIXES = ("ratio", "speedup", "vs_")  # a suite's own ratios: publish computes them
# other spellings of an implementation (as a prefix of the row's text)
ALIASES = {"cuda.core": "cuda_core", "cuda-core": "cuda_core", "driver": "raw"}
LABELS = {"cuda_core": "cuda.core", "cupy": "CuPy", "raw": "raw driver", "cublas": "cuBLAS",
          "copy": "memcpy", "samecopy": "memcpy of the same bytes"}
# metric-name suffix -> (unit, which is better)
UNITS: dict[str, tuple[str, str]] = {
    "ns": ("ns", "lower"), "us": ("us", "lower"), "ms": ("ms", "lower"), "s": ("s", "lower"),
    "sec": ("s", "lower"), "bytes": ("bytes", "lower"), "kib": ("KiB", "lower"),
    "mib": ("MiB", "lower"), "gib": ("GiB", "lower"), "gbps": ("GB/s", "higher"),
    "gb_s": ("GB/s", "higher"), "tbps": ("TB/s", "higher"), "tb_s": ("TB/s", "higher"),
    "gflops": ("GFLOP/s", "higher"), "tflops": ("TFLOP/s", "higher"),
    "speedup": ("x", "higher"),
}
_METRIC = re.compile(r"(?:^|_)(" + "|".join(sorted(UNITS, key=len, reverse=True)) + r")$")
_LOWER_UNITS = {"ns", "us", "µs", "ms", "s", "sec", "bytes", "b", "kib", "mib", "gib",
                "kb", "mb", "gb"}


# ---- reading rows ------------------------------------------------------------------------


@dataclasses.dataclass
class Line:
    """One measurement across implementations: ``values`` maps implementation -> value."""

    name: str
    unit: str
    better: str | None
    values: dict[str, float]
    details: str = ""

    def ratio(self, peer: str) -> float | None:
        """gpurt's speed relative to ``peer`` (> 1: gpurt is faster), or None."""
        mine, theirs = self.values.get("gpurt"), self.values.get(peer)
        if mine is None or theirs is None or self.better is None:
            return None
        if not (mine > 0 and theirs > 0 and math.isfinite(mine) and math.isfinite(theirs)):
            return None
        return theirs / mine if self.better == "lower" else mine / theirs


@dataclasses.dataclass
class SuiteTable:
    """A suite's rows read into lines, notes and the rows that fit no convention."""

    suite: str
    env: dict[str, Any]
    lines: list[Line]
    notes: list[str]
    other: list[dict[str, Any]]
    run: dict[str, Any] | None = None

    @property
    def impls(self) -> list[str]:
        found = {impl for line in self.lines for impl in line.values}
        known = [impl for impl in KNOWN_IMPLS if impl in found]
        return known + sorted(found - set(known))

    @property
    def peers(self) -> list[str]:
        return [impl for impl in self.impls if impl != "gpurt"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def impl_name(text: Any) -> str:
    """'torch 2.11.0' -> 'torch', 'torch.cuda.nvtx' -> 'torch', 'cuda.core' -> 'cuda_core',
    'driver' -> 'raw', 'nvtx package' -> 'nvtx'."""
    lowered = str(text).strip().lower()
    for prefix, impl in ALIASES.items():
        if lowered.startswith(prefix):
            return impl
    for impl in KNOWN_IMPLS:
        if lowered.startswith(impl):
            return impl
    return lowered.split()[0] if lowered else "?"


def direction(unit: str) -> str | None:
    """'lower' or 'higher' for a unit text, None when it says neither."""
    text = unit.strip().lower()
    if text.endswith("/s") or "flop" in text or text in ("x", "speedup"):
        return "higher"
    if text.split(" ")[0] in _LOWER_UNITS:
        return "lower"
    return None


def metric_unit(key: str) -> tuple[str, str] | None:
    """(unit text, better) of a measurement field such as 'host_us' -> ('us (host)', 'lower')."""
    match = _METRIC.search(key.lower())
    if match is None:
        return None
    unit, better = UNITS[match.group(1)]
    prefix = key[: match.start()].strip("_").replace("_", " ")
    return (f"{unit} ({prefix})" if prefix else unit), better


def _label(key: str, value: Any) -> str:
    """How a naming field shows in a line's name: text as it is, numbers as key=value."""
    if isinstance(value, str) and any(ch.isalpha() for ch in value):
        return value
    return f"{key}={value}"


def impl_column(key: str) -> tuple[str, str | None] | None:
    """(implementation, measurement) of a wide column: 'torch' -> ('torch', None) (the unit
    is the row's), 'gpurt_GBps' -> ('gpurt', 'GBps'); None for other columns."""
    lowered = key.lower()
    if lowered in KNOWN_IMPLS or lowered in ALIASES:
        return impl_name(lowered), None
    for impl in sorted((*KNOWN_IMPLS, *ALIASES), key=len, reverse=True):
        if lowered.startswith(impl + "_") and metric_unit(key[len(impl) + 1:]) is not None:
            return impl_name(impl), key[len(impl) + 1:]
    return None


def _is_detail(key: str, value: Any) -> bool:
    """Fields shown after a line's name: bools, non-integer numbers and percentages."""
    if isinstance(value, (bool, float)):
        return True
    return _is_number(value) and "pct" in key.lower()


def _wide_lines(row: dict[str, Any]) -> list[Line]:
    """One line per measurement of a wide row (its columns named by implementation)."""
    unit = str(row.get("unit", ""))
    better = row.get("better") if row.get("better") in ("lower", "higher") else direction(unit)
    measured: dict[str | None, dict[str, float]] = {}
    labels: list[str] = []
    details: list[str] = []
    for key, value in row.items():
        if key in ("name", "unit", "better") or key.lower().startswith(SKIPPED_PREFIXES):
            continue
        column = impl_column(key)
        if column is not None:
            if _is_number(value):
                measured.setdefault(column[1], {})[column[0]] = float(value)
        elif _is_detail(key, value):
            details.append(f"{key}={_format(value)}")
        elif isinstance(value, (str, int)):
            labels.append(_label(key, value))
    name = str(row["name"]) if "name" in row else " · ".join(labels) or "?"
    if "name" in row and labels:
        name += " (" + ", ".join(labels) + ")"
    lines = []
    for metric, values in measured.items():
        if metric is None:
            lines.append(Line(name, unit, better, values, ", ".join(details)))
        else:
            metric_text, metric_better = metric_unit(metric)  # type: ignore[misc]
            lines.append(Line(name, metric_text, metric_better, values, ", ".join(details)))
    return lines


def _long_key(row: dict[str, Any], impl_key: str) -> tuple[str, list[tuple[str, float]]] | None:
    """(line name, [(metric, value)]) of a long row, or None when it measures nothing."""
    labels: list[str] = []
    metrics: list[tuple[str, float]] = []
    for key, value in row.items():
        if key == impl_key:
            continue
        if _is_number(value) and metric_unit(key) is not None:
            metrics.append((key, float(value)))
        elif isinstance(value, (str, int)) and not isinstance(value, bool):
            labels.append(_label(key, value))
    if not metrics:
        return None
    return " · ".join(labels) or "?", metrics


def read_rows(suite: str, rows: Iterable[Any], env: dict[str, Any] | None = None,
              run: dict[str, Any] | None = None) -> SuiteTable:
    """Sort a suite's rows into lines (wide rows as they are, long rows pivoted by their
    name and measurement), notes (summary rows) and other rows."""
    lines: list[Line] = []
    long_lines: dict[tuple[str, str], Line] = {}
    notes: list[str] = []
    other: list[dict[str, Any]] = []
    for row in rows:
        if not isinstance(row, dict):
            other.append({"row": row})
            continue
        if set(row) == {"summary"} and isinstance(row["summary"], dict):
            notes += [f"{key}: {_format(value)}" for key, value in row["summary"].items()]
            continue
        wide = _wide_lines(row)
        if wide:
            lines += wide
            continue
        impl_key = next((k for k in IMPL_KEYS if isinstance(row.get(k), str)), None)
        found = _long_key(row, impl_key) if impl_key else None
        if found is None:
            other.append(row)
            continue
        name, metrics = found
        impl_text = row[impl_key]  # type: ignore[index]
        for metric, value in metrics:
            unit, better = metric_unit(metric)  # type: ignore[misc]
            line = long_lines.get((name, metric))
            if line is None:
                line = long_lines[(name, metric)] = Line(name, unit, better, {})
                lines.append(line)
            impl = impl_name(impl_text)
            if impl in line.values:  # two variants of one library: keep both, by full name
                impl = str(impl_text).strip()
            line.values[impl] = value
    return SuiteTable(suite, dict(env or {}), lines, notes, other, run)


# ---- formatting --------------------------------------------------------------------------


def _format(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


def _ratio_text(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def label(impl: str) -> str:
    return LABELS.get(impl, impl)


def slug(device: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    text = re.sub(r"[^a-z0-9]+", "-", (device or "unknown device").lower()).strip("-")
    return text or "unknown-device"


def _cuda_version(value: Any) -> str | None:
    if isinstance(value, int):  # the driver's encoding: 13000 -> 13.0
        return f"{value // 1000}.{value % 1000 // 10}"
    return None if value is None else str(value)


def versions_text(env: dict[str, Any]) -> str:
    """'driver CUDA 13.0, cuda-bindings 13.3.0, gpurt 0.1.0, torch 2.11.0, ...'."""
    parts = []
    driver = _cuda_version(env.get("driver_cuda_version"))
    if driver:
        parts.append(f"driver CUDA {driver}")
    for key, name in (("cuda_bindings", "cuda-bindings"), ("gpurt", "gpurt"), ("torch", "torch"),
                      ("cupy", "CuPy"), ("cuda_core", "cuda.core"), ("numpy", "numpy"),
                      ("python", "Python")):
        if env.get(key):
            parts.append(f"{name} {env[key]}")
    return ", ".join(parts)


def _date(env: dict[str, Any]) -> str:
    return str(env.get("date") or "unknown date")[:10]


def older_note(group: list[SuiteTable], tables: list[SuiteTable]) -> str | None:
    """A device's note where its newest result is a day or more older than the newest of any
    device: gpurt has changed since those were measured, so they do not describe it now."""
    newest_here = max(_date(t.env) for t in group)
    newest = max(_date(t.env) for t in tables)
    if newest_here >= newest:
        return None
    return (f"Older results: this device last ran on {newest_here}, before the newest "
            f"results here ({newest}); the kernels and host paths have changed since, so its "
            f"rows describe that earlier gpurt.")


def markdown_table(table: SuiteTable) -> list[str]:
    """The suite's lines as a markdown table: values per implementation, ratios vs peers."""
    impls, peers = table.impls, table.peers
    header = ["what", "unit", *map(label, impls), *(f"gpurt vs {label(p)}" for p in peers)]
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for line in table.lines:
        name = line.name + (f" ({line.details})" if line.details else "")
        cells = [name, line.unit]
        cells += [_format(line.values[i]) if i in line.values else "" for i in impls]
        cells += [_ratio_text(line.ratio(p)) for p in peers]
        out.append("| " + " | ".join(map(_cell, cells)) + " |")
    return out


# ---- the published files -----------------------------------------------------------------


def _suite_docs(merged: dict[str, Any]) -> dict[str, Any]:
    """{suite: doc} of a merged file, or of a single suite's file."""
    if isinstance(merged.get("suites"), dict):
        return merged["suites"]
    if "rows" in merged:
        return {str(merged.get("suite", "suite")): merged}
    raise ValueError("not a bench.json: expected 'suites' (merged) or 'rows' (one suite)")


def split_results(merged: dict[str, Any], results: Path) -> tuple[list[Path], list[str]]:
    """Write ``<suite>-<device>.json`` for every suite with rows; returns the files written
    and notes on the suites left out."""
    results.mkdir(parents=True, exist_ok=True)
    runs = {r.get("bench"): r for r in merged.get("runs") or [] if isinstance(r, dict)}
    written: list[Path] = []
    skipped: list[str] = []
    for name, doc in _suite_docs(merged).items():
        rows = doc.get("rows") if isinstance(doc, dict) else None
        run = runs.get(f"bench_{name}") or runs.get(name)
        if not rows:
            why = doc.get("error") if isinstance(doc, dict) else None
            skipped.append(f"{name}: no rows ({why or 'nothing measured'})")
            continue
        env = doc.get("env") or merged.get("env") or {}
        suite = str(doc.get("suite") or name)
        out = {"suite": suite, "env": env, "rows": rows}
        if run is not None:
            out["run"] = run
        path = results / f"{suite}-{slug(env.get('device'))}.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        written.append(path)
    for record in runs.values():
        if record.get("status") not in ("ok", None):
            skipped.append(f"{record.get('bench')}: {record.get('status')} "
                           f"({record.get('note', 'see bench.log')})")
    return written, skipped


def load_results(results: Path) -> list[SuiteTable]:
    """Every ``<suite>-<device>.json`` of ``results``, read into tables (by device, suite)."""
    tables = []
    for path in sorted(results.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not (isinstance(doc, dict) and isinstance(doc.get("rows"), list)):
            continue
        suite, env = str(doc.get("suite")), doc.get("env") or {}
        if path.stem != f"{suite}-{slug(env.get('device'))}":
            continue  # not a file publish wrote (another tool's output left here)
        tables.append(read_rows(suite, doc["rows"], env, doc.get("run")))
    tables.sort(key=lambda t: (slug(t.env.get("device")), t.suite))
    return tables


def by_device(tables: list[SuiteTable]) -> dict[str, list[SuiteTable]]:
    grouped: dict[str, list[SuiteTable]] = {}
    for table in tables:
        grouped.setdefault(str(table.env.get("device") or "unknown device"), []).append(table)
    return grouped


SAME_RUN = ("Every suite ran in its own process; gpurt and its peers were measured in that "
            "same process, in the same run, on the device named.")
RATIO_RULE = ("\"gpurt vs X\" is gpurt's speed relative to X: above 1.00x gpurt is faster "
              "(X's time over gpurt's for times, gpurt's rate over X's for rates).")


def results_markdown(tables: list[SuiteTable], charts: dict[str, str]) -> str:
    """RESULTS.md: per device and suite, the table, date, versions and notes."""
    out = ["# Benchmark results", "",
           "Generated by `benchmarks/publish.py` from the JSON files in this folder (do not edit "
           "by hand). " + SAME_RUN + " " + RATIO_RULE, ""]
    if not tables:
        out += ["No results yet: run `gpurt bench --publish` on a GPU machine.", ""]
    for device, group in by_device(tables).items():
        out += [f"## {device}", ""]
        older = older_note(group, tables)
        out += [older, ""] if older else []
        if device in charts:
            out += [f"![gpurt vs peers on {device}]({charts[device]})", ""]
        for table in group:
            out += [f"### {table.suite}", "",
                    f"{device}, {_date(table.env)}; {versions_text(table.env)}.", ""]
            if table.lines:
                out += markdown_table(table) + [""]
            out += [f"- {_cell(note)}" for note in table.notes]
            out += [f"- row: `{json.dumps(row, sort_keys=True)}`" for row in table.other]
            if table.run and table.run.get("status") not in (None, "ok"):
                out.append(f"- run: {table.run.get('status')} ({table.run.get('note', '')})")
            if table.notes or table.other or (table.run and table.run.get("status") != "ok"):
                out.append("")
    return "\n".join(out).rstrip() + "\n"


@dataclasses.dataclass(frozen=True)
class Bar:
    """One bar of a chart: what is compared, with whom, the ratio, and whether the other
    side is a reference (a bound such as a memcpy or the raw driver call) or a peer."""

    what: str
    other: str
    ratio: float
    reference: bool

    def text(self, width: int = 80) -> str:
        what = self.what if len(self.what) <= width else self.what[: width - 3] + "..."
        return f"{what} vs {label(self.other)}"


def ratio_bars(group: list[SuiteTable]) -> list[Bar]:
    """Every ratio of the group's lines, in table order."""
    bars = []
    for table in group:
        for line in table.lines:
            for peer in table.peers:
                ratio = line.ratio(peer)
                if ratio is not None:
                    bars.append(Bar(f"{table.suite}: {line.name} [{line.unit}]", peer, ratio,
                                    peer in REFERENCES))
    return bars


def _color(bar: Bar) -> str:
    if bar.reference:
        return "#1f77b4"  # a bound, not a competitor: below 1 is expected
    return "#76b900" if bar.ratio >= 1.0 else "#d62728"


def write_chart(bars: list[Bar], device: str, path: Path) -> bool:
    """A horizontal bar chart of the ratios (log scale, 1 marked); False without matplotlib
    or without bars."""
    if Figure is None or not bars:
        return False
    height = 1.2 + 0.28 * len(bars)
    fig = Figure(figsize=(10, height))
    ax = fig.add_subplot()
    names = [bar.text() for bar in bars]
    ratios = [bar.ratio for bar in bars]
    colors = [_color(bar) for bar in bars]
    positions = list(range(len(bars)))[::-1]
    # bars grow from 1 (parity) to the ratio, left for slower, right for faster
    ax.barh(positions, [r - 1.0 for r in ratios], left=1.0, color=colors)
    ax.set_yticks(positions, names, fontsize=7)
    ax.set_xscale("log")
    low, high = min(min(ratios), 1.0) / 1.4, max(max(ratios), 1.0) * 1.4
    ticks = [2.0**k for k in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_xlim(low, high)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("gpurt's speed relative to the peer (> 1: gpurt is faster; blue: against "
                  "a bound such as memcpy bandwidth)")
    ax.set_title(f"gpurt vs peers on {device}, same process and run", fontsize=10)
    for y, ratio in zip(positions, ratios):
        ax.annotate(f"{ratio:.2f}x", (ratio, y), xytext=(3 if ratio >= 1 else -3, 0),
                    textcoords="offset points", va="center", fontsize=6,
                    ha="left" if ratio >= 1 else "right")
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return True


def readme_section(tables: list[SuiteTable], results_rel: str, charts: dict[str, str]) -> str:
    """The README's performance section (between the markers)."""
    if not tables:
        return ("Not measured yet: `gpurt bench --publish` on a GPU machine runs every suite "
                "against torch, CuPy and cuda.core and writes the results here.")
    intro = (f"Generated by `benchmarks/publish.py` from `{results_rel}/`. {SAME_RUN} "
             f"{RATIO_RULE} Full tables: [{results_rel}/RESULTS.md]({results_rel}/RESULTS.md).")
    out = [intro, ""]
    for device, group in by_device(tables).items():
        dates = sorted({_date(t.env) for t in group})
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        out += [f"**{device}**, {when}; {versions_text(group[0].env)}.", ""]
        older = older_note(group, tables)
        out += [older, ""] if older else []
        if device in charts:
            out += [f"![gpurt vs peers on {device}]({results_rel}/{charts[device]})", ""]
        out += ["| suite | what | unit | gpurt | peers | gpurt vs peers |",
                "| --- | --- | --- | --- | --- | --- |"]
        for table in group:
            for line in table.lines:
                peers = [p for p in table.peers if p in line.values]
                if "gpurt" not in line.values or not peers:
                    continue
                values = " · ".join(f"{label(p)} {_format(line.values[p])}" for p in peers)
                ratios = " · ".join(f"{_ratio_text(line.ratio(p))} {label(p)}"
                                    for p in peers if line.ratio(p) is not None)
                cells = [table.suite, line.name, line.unit, _format(line.values["gpurt"]),
                         values, ratios]
                out.append("| " + " | ".join(map(_cell, cells)) + " |")
        out.append("")
    return "\n".join(out).rstrip()


def replace_section(text: str, section: str) -> str:
    """``text`` with everything between the perf markers replaced by ``section``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {BEGIN} ... {END} markers around its performance "
                         "section")
    return text[: start + len(BEGIN)] + "\n" + section + "\n" + text[end:]


def publish(bench_json: Path, results: Path = RESULTS, readme: Path | None = README) -> list[str]:
    """Publish ``bench_json`` into ``results`` (and ``readme``); returns what was done."""
    merged = json.loads(Path(bench_json).read_text())
    written, skipped = split_results(merged, results)
    report = [f"wrote {path}" for path in written] + [f"left out {why}" for why in skipped]
    tables = load_results(results)
    charts: dict[str, str] = {}
    for device, group in by_device(tables).items():
        name = f"ratios-{slug(device)}.png"
        if write_chart(ratio_bars(group), device, results / name):
            charts[device] = name
            report.append(f"wrote {results / name}")
    if Figure is None:
        report.append("no charts: matplotlib is not installed (pip install matplotlib)")
    (results / "RESULTS.md").write_text(results_markdown(tables, charts))
    report.append(f"wrote {results / 'RESULTS.md'}")
    if readme is not None:
        try:
            rel = results.resolve().relative_to(readme.resolve().parent).as_posix()
        except ValueError:
            rel = results.as_posix()
        readme.write_text(replace_section(readme.read_text(), readme_section(tables, rel, charts)))
        report.append(f"updated {readme}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", type=Path, help="a merged bench.json")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where the result files go (default: benchmarks/results)")
    parser.add_argument("--readme", type=Path, default=README, help="the README to update")
    parser.add_argument("--no-readme", action="store_true", help="leave the README alone")
    args = parser.parse_args(argv)
    try:
        report = publish(args.bench_json, args.results, None if args.no_readme else args.readme)
    except (OSError, ValueError) as exc:
        print(f"publish: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
