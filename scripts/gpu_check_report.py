"""Result files of scripts/gpu-check: the test summary, the merged benchmarks, the table.

Standard library only: it runs on the GPU machine before anything else is known to work.

    gpu_check_report.py summary OUTDIR --rc N --seconds S [--timed-out]
    gpu_check_report.py bench OUTDIR --stage DIR --runs RUNS.tsv
    gpu_check_report.py table OUTDIR

``summary`` reads OUTDIR/pytest.log (written by ``pytest -v -ra``) and OUTDIR/info.json and
writes OUTDIR/summary.json. The log is the source, not junit.xml, because a run stopped by
its time limit leaves a log but no junit file. ``bench`` merges the per-suite JSON files that
the benchmarks wrote into DIR with the run records into OUTDIR/bench.json. ``table`` prints
both for a person.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

# benchmarks/_merge.py writes bench.json for gpu-check and for benchmarks/run_all.py alike.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _merge  # noqa: E402

# distributions whose versions go into summary.json when installed
_DISTRIBUTIONS = (
    "cuda-bindings", "cuda-pathfinder", "cuda-core", "nvidia-cuda-nvrtc", "torch", "cupy",
    "cupy-cuda13x", "cupy-cuda12x", "numpy", "ml_dtypes", "rich", "nvtx", "pytest",
    "hypothesis", "pytest-timeout",
)
_OUTCOMES = ("passed", "failed", "skipped", "errors", "xfailed", "xpassed", "deselected")
_FINAL_LINE = re.compile(r"^=+ (.*\b(?:passed|failed|skipped|error|errors|deselected|"
                         r"xfailed|xpassed|no tests ran)\b.*) in [\d.]+s.* =+$")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
# a test id; the parameters in brackets may hold spaces ("[copy to pageable host memory]")
_NODE = r"\S+?\.py::[^\s\[]+(?:\[[^\]]*\])?"
_OUTCOME = r"(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
_VERBOSE = re.compile(rf"^({_NODE}) {_OUTCOME}\b")  # pytest -v: "tests/a.py::t PASSED [ 50%]"
_XDIST = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] {_OUTCOME} ({_NODE})")  # "[gw0] [ 50%] PASSED id"
_XDIST_WORKERS = re.compile(r"^(?:created: \d+/\d+ workers?|\d+ workers? \[\d+ items?\])\s*$")
_CRASHED = re.compile(rf"worker '(gw\d+)' crashed while running '({_NODE})'")
_SHORT = re.compile(r"^(FAILED|ERROR) (\S+::\S+?|\S+)(?: - (.*))?$")
_STARTED = re.compile(rf"^({_NODE})\s*$")  # -v prints the id alone when a test starts
_INSTAFAIL = re.compile(rf"^--- (?:FAILED|ERROR) ({_NODE}) \(\w+\)$")  # tests/conftest.py
_VERBOSE_KEY = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "errors",
                "XFAIL": "xfailed", "XPASS": "xpassed"}


def _result(line: str) -> tuple[str, str] | None:
    """(test id, outcome word) of a verbose result line, plain or pytest-xdist's."""
    match = _VERBOSE.match(line)
    if match:
        return match.group(1), match.group(2)
    match = _XDIST.match(line)
    if match:
        return match.group(2), match.group(1)
    return None


def parse_pytest_log(text: str) -> dict[str, Any]:
    """Counts, failed test ids (with pytest's one-line reason) and, for a run that was
    stopped, the test that was running, from the output of ``pytest -v -ra``, with or
    without pytest-xdist (whose controller never reports deselected tests: their count
    is then None)."""
    lines = text.splitlines()
    counts: dict[str, int | None] = dict.fromkeys(_OUTCOMES, 0)
    final = None
    for line in lines:
        match = _FINAL_LINE.match(line.strip())
        if match:
            final = match.group(1)
    results = [found for found in map(_result, lines) if found]
    if final is not None:
        for number, outcome in _COUNT.findall(final):
            counts["errors" if outcome.startswith("error") else outcome] = int(number)
    else:  # stopped before the summary: count the verbose result lines
        for _, word in results:
            counts[_VERBOSE_KEY[word]] = (counts[_VERBOSE_KEY[word]] or 0) + 1
    if any(_XDIST_WORKERS.match(line) for line in lines) and "deselected" not in (final or ""):
        counts["deselected"] = None
    failures: dict[str, str] = {}
    for line in lines:
        match = _SHORT.match(line)
        if match:
            failures[match.group(2)] = (match.group(3) or match.group(1))[:400]
    if not failures:  # no short summary: the outcome lines, with what else the log says
        failures = _failures_without_summary(lines, results)
    running = None  # a test whose start pytest -v printed but whose outcome never came
    for line in lines:
        if _result(line):
            running = None
        else:
            match = _STARTED.match(line)
            running = match.group(1) if match else running
    return {
        "counts": counts,
        "final_line": final,
        "failed": sorted(failures),
        "failure_reasons": failures,
        "running_when_stopped": running,
    }


def _failures_without_summary(lines: list[str], results: list[tuple[str, str]]) -> dict[str, str]:
    """Failed test ids and reasons of a log without pytest's short summary: a crashed
    pytest-xdist worker's message, else the first ``E`` line of the failure that
    tests/conftest.py printed at once (GPURT_INSTAFAIL), else the outcome word."""
    failures = {test: word for test, word in results if word in ("FAILED", "ERROR")}
    current = None
    for line in lines:
        crashed = _CRASHED.search(line)
        if crashed:
            failures[crashed.group(2)] = crashed.group(0)
            continue
        block = _INSTAFAIL.match(line)
        if block:
            current = block.group(1)
        elif current and line.startswith("E ") and failures.get(current) in ("FAILED", "ERROR"):
            failures[current] = line[1:].strip()[:400]
    return failures


def _versions() -> dict[str, str]:
    found = {}
    for dist in _DISTRIBUTIONS:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_summary(out: Path, rc: int, seconds: float, timed_out: bool) -> dict[str, Any]:
    """Write OUTDIR/summary.json from pytest.log, info.json and the installed versions."""
    log = out / "pytest.log"
    parsed = parse_pytest_log(log.read_text(errors="replace") if log.exists() else "")
    info = _read_json(out / "info.json") or {}
    devices = info.get("devices") or []
    counts = parsed["counts"]
    summary = {
        **{k: counts[k] for k in ("passed", "failed", "skipped", "errors")},
        "xfailed": counts["xfailed"],
        "xpassed": counts["xpassed"],
        "deselected": counts["deselected"],
        "failed_tests": parsed["failed"],
        "failure_reasons": parsed["failure_reasons"],
        "pytest_exit_code": rc,
        "timed_out": timed_out,
        "running_when_stopped": parsed["running_when_stopped"],
        "pytest_final_line": parsed["final_line"],
        "duration_s": round(seconds, 1),
        "device": devices[0]["name"] if devices else None,
        "devices": [d.get("name") for d in devices],
        "driver_cuda_version": (info.get("driver") or {}).get("cuda_version"),
        "nvrtc_version": (info.get("nvrtc") or {}).get("version"),
        "python": sys.version.split()[0],
        "versions": _versions(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def write_bench(out: Path, stage: Path, runs_file: Path) -> dict[str, Any]:
    """Merge the suites' JSON files in ``stage`` and the run records into OUTDIR/bench.json."""
    runs = []
    if runs_file.exists():
        for line in runs_file.read_text().splitlines():
            name, rc, seconds, status = line.split("\t")
            runs.append(_merge.run_record(name, int(rc), float(seconds), status))
    merged = _merge.merge(stage, runs)
    _merge.write(out / "bench.json", merged)
    return merged


def print_table(out: Path) -> None:
    """The closing table: tests, failures, benchmarks."""
    summary = _read_json(out / "summary.json")
    bench = _read_json(out / "bench.json")
    print("=" * 72)
    if summary:
        device = summary.get("device") or "no GPU"
        print(f"gpu-check on {device} (driver CUDA {summary.get('driver_cuda_version')}, "
              f"NVRTC {summary.get('nvrtc_version')}, Python {summary.get('python')})")
        print(f"tests: {summary['passed']} passed, {summary['failed']} failed, "
              f"{summary['skipped']} skipped, {summary['errors']} errors "
              f"in {summary['duration_s']} s (pytest exit {summary['pytest_exit_code']})")
        if summary.get("timed_out"):
            print(f"  STOPPED by the time limit while running: "
                  f"{summary.get('running_when_stopped')}")
        if summary["failed_tests"]:
            print("  failed or errored:")
        for test in summary["failed_tests"][:30]:
            print(f"  - {test}: {summary['failure_reasons'].get(test, '')[:120]}")
        if len(summary["failed_tests"]) > 30:
            print(f"  ... and {len(summary['failed_tests']) - 30} more (see pytest.log)")
    if bench and bench["runs"]:
        print("benchmarks:")
        for run in bench["runs"]:
            print(f"  {run['bench']:<28} {run['status']:<10} {run['seconds']:>7.1f} s  "
                  f"exit {run['exit_code']}")
    print("files: " + ", ".join(sorted(os.listdir(out))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary")
    summary.add_argument("out", type=Path)
    summary.add_argument("--rc", type=int, required=True)
    summary.add_argument("--seconds", type=float, required=True)
    summary.add_argument("--timed-out", action="store_true")
    bench = sub.add_parser("bench")
    bench.add_argument("out", type=Path)
    bench.add_argument("--stage", type=Path, required=True)
    bench.add_argument("--runs", type=Path, required=True)
    table = sub.add_parser("table")
    table.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "summary":
        write_summary(args.out, args.rc, args.seconds, args.timed_out)
    elif args.command == "bench":
        write_bench(args.out, args.stage, args.runs)
    else:
        print_table(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
