"""First-call latency of the bundled GEMM on a cold machine, against torch's first matmul.

Each case runs in a fresh process with an empty kernel cache folder (GPURT_CACHE_DIR), times
the first ``gemm(a, b)`` of a bf16 N^3 product (default 4096) from the call to the end of a
device synchronization (the inputs are made and synchronized before), then a second call,
and checks a few rows of the result against a float64 numpy reference:

  torch            torch's first ``a @ b`` (cuBLAS handle, kernel loading)
  gpurt jit        GPURT_PREBUILT=0: compiles and tunes at first use (the issue's 6.0 s)
  gpurt prebuilt   GPURT_PREBUILT=ARCHIVE: code and default tuning from the archive

The archive is --archive, else GPURT_BENCH_ARCHIVE, else the installed package's
(``gpurt build-kernels``); without one the prebuilt case is left out. ``--archive
LABEL=FILE`` (repeatable) names each case "gpurt prebuilt (LABEL)", e.g. archives with and
without a default tuning table.

    python benchmarks/bench_first_call.py [--n 4096] [--archive [LABEL=]FILE ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from _common import print_rows, write_results

CHILD_GPURT = """
import json, time
t0 = time.perf_counter()
import ml_dtypes, numpy as np
import gpurt
from gpurt.kernels.gemm import gemm
imported = time.perf_counter() - t0
n = {n}
rng = np.random.default_rng(1)
ha = rng.standard_normal((n, n)).astype(ml_dtypes.bfloat16)
hb = rng.standard_normal((n, n)).astype(ml_dtypes.bfloat16)
a, b = gpurt.asarray(ha), gpurt.asarray(hb)
gpurt.synchronize()
t1 = time.perf_counter()
c = gemm(a, b)
gpurt.synchronize()
first = time.perf_counter() - t1
t2 = time.perf_counter()
c = gemm(a, b)
gpurt.synchronize()
second = time.perf_counter() - t2
rows = c.to_numpy()[:8].astype(np.float64)
want = ha[:8].astype(np.float64) @ hb.astype(np.float64)
err = float(np.abs(rows - want).max() / np.abs(want).max())
print(json.dumps({{"import_s": imported, "first_s": first, "second_s": second, "rel_err": err}}))
"""

CHILD_TORCH = """
import json, time
t0 = time.perf_counter()
import torch
imported = time.perf_counter() - t0
n = {n}
torch.manual_seed(1)
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t1 = time.perf_counter()
c = a @ b
torch.cuda.synchronize()
first = time.perf_counter() - t1
t2 = time.perf_counter()
c = a @ b
torch.cuda.synchronize()
second = time.perf_counter() - t2
want = a[:8].double() @ b.double()
err = float(((c[:8].double() - want).abs().max() / want.abs().max()).item())
print(json.dumps({{"import_s": imported, "first_s": first, "second_s": second, "rel_err": err}}))
"""


def _child(code: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with an empty kernel cache folder."""
    with tempfile.TemporaryDirectory(prefix="gpurt-first-call-") as cache:
        full = {**os.environ, **env, "GPURT_CACHE_DIR": os.path.join(cache, "kernels")}
        done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                              text=True, timeout=timeout, cwd=cache)  # no ./gpurt shadowing
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _archives(given: list[str]) -> list[tuple[str, str]]:
    """(case name, path) of each archive to time."""
    found = []
    for item in given or [os.environ.get("GPURT_BENCH_ARCHIVE", "")]:
        label, _, path = item.rpartition("=")
        if path:
            found.append((f"gpurt prebuilt ({label})" if label else "gpurt prebuilt",
                          os.path.abspath(path)))
    if not found:
        try:
            from gpurt.kernels import _prebuilt
        except ImportError:
            return []
        path = _prebuilt.archive_path()
        found = [("gpurt prebuilt", path)] if path else []
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--archive", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=2, help="cold processes per fast case")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cases: list[tuple[str, str, dict[str, str], int]] = [
        ("torch", CHILD_TORCH, {}, args.repeat),
        ("gpurt jit", CHILD_GPURT, {"GPURT_PREBUILT": "0"}, 1),
    ]
    for name, path in _archives(args.archive):
        cases.append((name, CHILD_GPURT, {"GPURT_PREBUILT": path}, args.repeat))
    runs = []
    for name, code, env, repeat in cases:
        for attempt in range(repeat):
            result = _child(code.format(n=args.n), env, timeout=300)
            runs.append({"case": name, "attempt": attempt, **result})
    rows = summarize(runs, args.n)
    print_rows("first call", rows)
    write_results("first_call", rows, args.json)


def summarize(runs: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Wide rows for publish.py: per gpurt case, its best first call (seconds) beside
    torch's best first call of the same run; then every process's numbers as a summary."""
    def best(case: str) -> float | None:
        times = [r["first_s"] for r in runs if r["case"] == case and "first_s" in r]
        return min(times) if times else None

    torch_first = best("torch")
    rows: list[dict[str, Any]] = []
    for case in dict.fromkeys(r["case"] for r in runs if r["case"] != "torch"):
        rows.append({"name": f"first gemm {n}^3 bf16, cold process, empty cache: {case}",
                     "unit": "s", "gpurt": best(case), "torch": torch_first})
    rows.append({"summary": {"processes": runs}})
    return rows


if __name__ == "__main__":
    main()
