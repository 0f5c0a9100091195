"""Run every benchmark suite, each in its own process, and merge the results into one file.

    python benchmarks/run_all.py [--only NAME ...] [--out DIR] [--timeout S] [--force]
                                 [--publish] [--list]
    gpurt bench [the same arguments]

Each ``benchmarks/bench_*.py`` runs as ``python bench_X.py`` with ``GPURT_BENCH_OUT`` set to a
staging folder (so gpurt and its peers share one process per suite, never one process for
all suites), under its own time limit. ``OUT/bench.json`` gets the merged results in the
format of ``scripts/gpu-check`` (benchmarks/_merge.py: device, driver, versions and date in
``env``, one record per suite in ``runs``, every suite's rows in ``suites``) and
``OUT/bench.log`` the output of every suite. Without a GPU the suites are skipped with a
note (``--force`` runs them anyway); a missing peer library (torch, CuPy, cuda.core) is noted,
and each suite leaves that peer's rows out. ``--publish`` then runs benchmarks/publish.py on
the result (files under benchmarks/results/, the README's performance section).
Exit code: 0 when no suite failed or timed out, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _merge
import publish
from _common import environment
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

import gpurt

HERE = Path(__file__).resolve().parent
# peer library -> (module to look for, distributions that provide it)
PEERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("torch", ("torch",)),
    "CuPy": ("cupy", ("cupy", "cupy-cuda13x", "cupy-cuda12x")),
    "cuda.core": ("cuda.core", ("cuda-core", "cuda-python")),
}
_STATUS_STYLE = {"ok": "green", "failed": "red", "timeout": "red", "skipped": "yellow",
                 "not run": "yellow"}
_KILL_GRACE_S = 10.0


def discover(folder: Path = HERE) -> list[Path]:
    """The benchmark scripts of ``folder``, by name."""
    return sorted(folder.glob("bench_*.py"))


def suite_name(path_or_name: str | Path) -> str:
    """'bench_nvtx.py', 'bench_nvtx' or 'nvtx' -> 'nvtx'."""
    name = Path(path_or_name).name
    name = name.removesuffix(".py")
    return name.removeprefix("bench_")


def select(benches: list[Path], only: list[str]) -> list[Path]:
    """The benches named in ``only`` (all when empty); an unknown name raises ValueError."""
    if not only:
        return list(benches)
    by_name = {suite_name(path): path for path in benches}
    unknown = [name for name in only if suite_name(name) not in by_name]
    if unknown:
        known = ", ".join(by_name) or "none"
        raise ValueError(f"no benchmark named {', '.join(unknown)} (known: {known})")
    wanted = {suite_name(name) for name in only}
    return [path for path in benches if suite_name(path) in wanted]


def peer_versions() -> dict[str, str | None]:
    """Each peer library's installed version, or None when absent (found without importing
    it: importing torch costs seconds and would hold GPU memory in this process)."""
    found: dict[str, str | None] = {}
    for label, (module, dists) in PEERS.items():
        try:
            present = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            present = False
        version = None
        if present:
            for dist in dists:
                try:
                    version = importlib.metadata.version(dist)
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
        found[label] = (version or "?") if present else None
    return found


def gpu_missing() -> str | None:
    """Why the benchmarks cannot use a GPU here, or None when one is usable. Calls cuInit
    only (through gpurt.is_available); no context is created in this process."""
    try:
        if gpurt.is_available():
            return None
        gpurt.init()
    except gpurt.CudaError as exc:
        return str(exc)
    return "the driver found no CUDA device"


def child_environment(stage: Path) -> dict[str, str]:
    """The environment of a suite's process: GPURT_BENCH_OUT, and the folder this process
    imported gpurt from at the front of PYTHONPATH so the child imports the same gpurt."""
    env = dict(os.environ)
    env["GPURT_BENCH_OUT"] = str(stage)
    root = str(Path(gpurt.__file__).resolve().parent.parent)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in parts if p != root]])
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a suite that ran out of time, and everything it started (its process group)."""
    for sig, wait_s in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(log: Path, start: int, lines: int = 3) -> str:
    """The last ``lines`` lines the suite wrote to the log (from byte ``start``)."""
    with open(log, "rb") as fh:
        fh.seek(start)
        text = fh.read().decode(errors="replace")
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[:300]


def run_suite(path: Path, stage: Path, log: Path, timeout_s: float) -> dict[str, Any]:
    """Run one benchmark script in a new process (and process group); its output is
    appended to ``log``. Returns its run record."""
    before = {p.name: p.stat().st_mtime_ns for p in stage.glob("*.json")}
    with open(log, "ab") as fh:
        fh.write(f"==== {path.stem}\n".encode())
        fh.flush()
        start = fh.tell()
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, str(path)], cwd=path.parent,
                                env=child_environment(stage), stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
            status = "ok" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = proc.returncode if proc.returncode is not None else -9
            status = "timeout"
        seconds = round(time.monotonic() - t0, 1)
    wrote = [p.stem for p in stage.glob("*.json") if before.get(p.name) != p.stat().st_mtime_ns]
    note = None
    if status == "timeout":
        note = f"stopped after its time limit of {timeout_s:g} s"
    elif status == "failed":
        note = f"exit code {code}: {_tail(log, start)}"
    elif not wrote:
        status, note = "failed", "exited 0 but wrote no results (GPURT_BENCH_OUT)"
    else:
        note = f"wrote {', '.join(sorted(wrote))}"
    return _merge.run_record(path.stem, code, seconds, status, note)


def _status_line(record: dict[str, Any]) -> str:
    style = _STATUS_STYLE.get(record["status"], "white")
    note = f" [dim]{escape(record['note'])}[/dim]" if record.get("note") else ""
    return (f"[{style}]{record['status']:>7}[/{style}] {record['bench']:<20} "
            f"{record['seconds']:6.1f} s{note}")


def run(benches: list[Path], out: Path, timeout_s: float, force: bool,
        console: Console) -> dict[str, Any]:
    """Run ``benches`` one process each; write OUT/bench.json and OUT/bench.log."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench.log"
    log.write_bytes(b"")
    notes: list[str] = []
    missing_gpu = gpu_missing()
    if missing_gpu is not None:
        notes.append(f"no GPU: {missing_gpu}")
    peers = peer_versions()
    absent = [label for label, version in peers.items() if version is None]
    if absent:
        notes.append(f"not installed, so left out of every suite: {', '.join(absent)}")
    present = ", ".join(f"{label} {version}" for label, version in peers.items() if version)
    console.print(f"peers in this run: {escape(present) or 'none'}")
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpurt-bench-") as tmp:
        stage = Path(tmp)
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("benchmarks", total=len(benches))
            for path in benches:
                if missing_gpu is not None and not force:
                    record = _merge.run_record(path.stem, 0, 0.0, "skipped",
                                               "no GPU here (--force runs it anyway)")
                else:
                    progress.update(task, description=f"{path.stem} (limit {timeout_s:g} s)")
                    record = run_suite(path, stage, log, timeout_s)
                runs.append(record)
                progress.console.print(_status_line(record))
                progress.advance(task)
        # the suites write the environment; when none did, this process reads it (after
        # the suites ran: it imports the peers)
        wrote_env = any(isinstance(doc.get("env"), dict)
                        for doc in _merge.read_suites(stage).values())
        merged = _merge.merge(stage, runs, None if wrote_env else environment(), notes)
    _merge.write(out / "bench.json", merged)
    return merged


def summary_table(merged: dict[str, Any]) -> Table:
    """One line per suite: status, time, rows written, note."""
    table = Table(title="benchmarks", title_justify="left")
    for column in ("suite", "status", "seconds", "rows", "note"):
        table.add_column(column, overflow="fold")
    for record in merged["runs"]:
        suite = merged["suites"].get(suite_name(record["bench"]), {})
        rows = suite.get("rows")
        style = _STATUS_STYLE.get(record["status"], "white")
        table.add_row(record["bench"], f"[{style}]{record['status']}[/{style}]",
                      f"{record['seconds']:.1f}", str(len(rows)) if rows is not None else "-",
                      escape(record.get("note", "")))
    return table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpurt bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="run only these suites (e.g. --only nvtx graphs)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="folder for bench.json and bench.log (default: ./bench-out)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="time limit of one suite in seconds (default 300)")
    parser.add_argument("--force", action="store_true",
                        help="run the suites even where no GPU is found")
    parser.add_argument("--publish", action="store_true",
                        help="then publish the results (benchmarks/publish.py)")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(highlight=False)
    benches = discover()
    if args.list:
        for path in benches:
            console.print(f"{suite_name(path):<12} {path}")
        return 0
    try:
        chosen = select(benches, args.only)
    except ValueError as exc:
        console.print(f"[red]gpurt bench:[/red] {escape(str(exc))}")
        return 2
    if args.timeout <= 0:
        console.print("[red]gpurt bench:[/red] --timeout must be > 0")
        return 2
    merged = run(chosen, args.out, args.timeout, args.force, console)
    console.print(summary_table(merged))
    console.print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.log'}")
    if args.publish:
        publish.main([str(args.out / "bench.json")])
    failed = [r for r in merged["runs"] if r["status"] in ("failed", "timeout")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
