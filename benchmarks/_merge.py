"""The merged benchmark file, ``bench.json``: every suite of one run in one JSON document.

    {"env": {...}, "runs": [run, ...], "suites": {suite: {"suite", "env", "rows"}, ...}}

``env`` is the first suite's environment (device, driver, versions, date: see
``_common.environment``); each ``run`` records how one ``bench_*.py`` process ended:
``{"bench", "exit_code", "seconds", "status"}`` plus an optional ``"note"``, with status
``ok``, ``failed``, ``timeout``, ``skipped`` or ``not run``. Optional top-level ``notes``
(a list of strings) say what was missing in the run (a peer library, the GPU).

Shared by benchmarks/run_all.py (``gpurt bench``) and scripts/gpu_check_report.py
(``scripts/gpu-check``), so both write the same file. Standard library only: it runs on the
GPU machine before anything else is known to work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["STATUSES", "merge", "read_suites", "run_record", "write"]

STATUSES = ("ok", "failed", "timeout", "skipped", "not run")


def run_record(bench: str, exit_code: int, seconds: float, status: str,
               note: str | None = None) -> dict[str, Any]:
    """How one benchmark process ended (``bench`` is the script's stem, e.g. bench_nvtx)."""
    if status not in STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {STATUSES}")
    record: dict[str, Any] = {"bench": bench, "exit_code": int(exit_code),
                              "seconds": float(seconds), "status": status}
    if note:
        record["note"] = note
    return record


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_suites(stage: Path) -> dict[str, Any]:
    """Every ``<suite>.json`` the benchmarks wrote into ``stage`` (GPURT_BENCH_OUT), by suite
    name; an unreadable file becomes ``{"error": ...}``."""
    suites: dict[str, Any] = {}
    for path in sorted(Path(stage).glob("*.json")):
        doc = _read_json(path)
        suites[path.stem] = doc if isinstance(doc, dict) else {"error": f"unreadable {path.name}"}
    return suites


def merge(stage: Path, runs: list[dict[str, Any]], env: dict[str, Any] | None = None,
          notes: list[str] | None = None) -> dict[str, Any]:
    """The merged document from the suites in ``stage`` and the run records. ``env`` is used
    when no suite wrote one (e.g. when every suite was skipped)."""
    suites = read_suites(stage)
    suite_env = next((s["env"] for s in suites.values() if isinstance(s.get("env"), dict)), None)
    merged: dict[str, Any] = {"env": suite_env or env, "runs": list(runs), "suites": suites}
    if notes:
        merged["notes"] = list(notes)
    return merged


def write(path: Path, merged: dict[str, Any]) -> None:
    """Write the merged document as indented JSON."""
    Path(path).write_text(json.dumps(merged, indent=1) + "\n")
