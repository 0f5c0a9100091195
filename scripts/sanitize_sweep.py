"""Every bundled kernel path under compute-sanitizer, over a sweep of odd shapes, layouts and
element offsets (the cases of tests/_kernel_cases.py, each checked against float64 too, and
of tests/_bandwidth_cases.py: gpurt.random's fills and ReductionKernel sums).

    python3 -P scripts/sanitize_sweep.py --out OUTDIR [--tier quick|full] [--kinds K,...]

runs the sweep once plainly (compiling every GEMM variant first, in parallel, into the kernel
cache, and checking every result), then under compute-sanitizer: memcheck over the tier's
sweep and, with --tier full, racecheck and synccheck (the kernels use shared memory,
barriers, clusters) over the middle "race" sweep. gpurt's caching is off under the
sanitizer (GPURT_NO_CACHING=1), so every array is its own allocation and a read past a view
is a read past an allocation.
``--report-api-errors no``: gpurt probes cuKernelGetParamInfo past a kernel's last
parameter on purpose. Writes OUTDIR/sanitize.json and OUTDIR/sanitize.log; exit code 0
only when every pass ran clean (0 errors) and every result matched.

``--cases TIER`` runs the cases of a tier alone (what the sanitizer wraps); ``--kinds`` keeps
only some kinds of case (gemm, softmax, fill, reduce; default all).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TREE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TREE / "tests"))  # _kernel_cases
TOOLS = ("memcheck", "racecheck", "synccheck")


SHAPES = {"quick": [(33, 129, 67), (5, 7, 0)],
          "race": [(33, 129, 67), (130, 257, 65)],
          "full": [(33, 129, 67), (1, 1, 1), (5, 7, 0), (130, 257, 65), (17, 300, 1000),
                   (127, 64, 200)]}
# shapes whose operands' rows (K long, padded by 8) are 16-byte aligned
# (256, 256, 4096): few tiles and a long K, which the heuristic splits over K (wgmma split-K,
# whose tiles' last CTAs sum the slices in the same launch)
TMA_SHAPES = {"quick": [(17, 264, 200)], "race": [(17, 264, 200), (256, 256, 4096)],
              "full": [(17, 264, 200), (100, 8, 1000), (256, 256, 4096)]}
LENGTHS = {"quick": [7, 1000, 4099],
           "race": [7, 4099, 50257, 65536, 70001, 131072, 600001],
           "full": [1, 7, 33, 1000, 4099, 32001, 50257, 65536, 70001, 131072, 600001, 1000003]}
LONG = 1_000_000  # rows at least this long: one row per case
TIERS = tuple(SHAPES)
KINDS = ("gemm", "softmax", "fill", "reduce")


def _cases(tier: str) -> Iterator[tuple[str, Any]]:
    """("gemm", GemmCase) and ("softmax", SoftmaxCase) items of the sweep: aligned (offset
    0) and unaligned (offset 1 element) operands, every dtype and op; softmax also with every
    array one element in (rows at any alignment: 16-byte accesses with edges); then the
    ("fill", FillCase) and ("reduce", ReduceCase) items of tests/_bandwidth_cases.py."""
    from _bandwidth_cases import fill_cases, reduce_cases
    from _kernel_cases import OPS, SOFTMAX_DTYPES, GemmCase, SoftmaxCase

    transposes = [(False, False), (True, True)]
    if tier != "quick":
        transposes += [(True, False), (False, True)]
    for dtype in ("float32", "tf32", "float16", "bfloat16"):
        for m, n, k in SHAPES[tier]:
            for trans_a, trans_b in transposes:
                for offset in (0, 1):
                    yield "gemm", GemmCase(
                        m, n, k, dtype, trans_a, trans_b, a_layout=(trans_a, offset, 3),
                        b_layout=(not trans_b, offset, 0), out_layout=(False, offset, 1),
                        alpha=-1.5, beta=0.5, c_is_out=offset == 1)
    for dtype in ("float16", "bfloat16"):  # 16-byte rows: the TMA families (wgmma, decode)
        for m, n, k in TMA_SHAPES[tier]:
            for trans_a, trans_b in transposes:
                yield "gemm", GemmCase(
                    m, n, k, dtype, trans_a, trans_b, a_layout=(trans_a, 0, 8),
                    b_layout=(not trans_b, 0, 8), out_layout=(False, 0, 1), alpha=-1.5,
                    beta=0.5)
    for op in OPS:
        for dtype in SOFTMAX_DTYPES:
            for cols in LENGTHS[tier]:
                # aligned; agreeing modulo 16 bytes (16-byte accesses with edges), modulo 8
                # (float32) or 4 bytes (16-bit types)
                for offsets in [(0, 0, 0), (1, 1, 1), (1, 3, 1)]:
                    rows = 1 if cols >= LONG else 3
                    yield "softmax", SoftmaxCase(op, dtype, rows, cols, offsets, given_out=True)
    if tier != "quick":  # enough rows for the forward tickets' wide chunks (16-bit: one pass)
        for op in OPS[:2]:
            yield "softmax", SoftmaxCase(op, "float32", 32, 600_001, (1, 1, 1), given_out=True)
            yield "softmax", SoftmaxCase(op, "bfloat16", 32, 200_003, (1, 1, 1), given_out=True)
        # the persistent ticket chunks (s8-softpersist): 16-bit softmax backward, float32
        # softmax rows of 131073-262144 elements
        yield "softmax", SoftmaxCase("softmax_backward", "bfloat16", 32, 200_003, (1, 1, 1),
                                     given_out=True)
        yield "softmax", SoftmaxCase("softmax", "float32", 16, 200_003, (1, 1, 1), given_out=True)
    fills = "full" if tier == "full" else "quick"
    yield from (("fill", case) for case in fill_cases(fills))
    yield from (("reduce", case) for case in reduce_cases(fills))


def run_cases(tier: str, kinds: tuple[str, ...] = KINDS) -> int:
    """Run (and check) every case of ``kinds``; returns the number of kernel calls."""
    import numpy as np

    from _bandwidth_cases import run_fill, run_reduce
    from _kernel_cases import gemm_configs, run_gemm, run_softmax

    calls = 0
    rng = np.random.default_rng(14)
    for kind, case in _cases(tier):
        if kind not in kinds:
            continue
        if kind == "gemm":
            for config in [None, *gemm_configs(case, rng)]:
                run_gemm(case, config, rng)
                calls += 1
            continue
        {"softmax": run_softmax, "fill": run_fill, "reduce": run_reduce}[kind](case, rng)
        calls += 1
    return calls


def _sanitizer() -> str:
    found = shutil.which("compute-sanitizer") or next(
        iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"), reverse=True)), None)
    if found is None:
        raise SystemExit("sanitize_sweep: compute-sanitizer not found (PATH, /usr/local/cuda*)")
    return found


def _run(command: list[str], env: dict[str, str], log: Any, timeout: float) -> dict[str, Any]:
    start = time.monotonic()
    log.write(f"\n== {' '.join(command)}\n")
    log.flush()
    try:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        output, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) \
            else (exc.stdout or ""), -1
    log.write(output)
    # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)"
    summary = re.findall(r"(?:ERROR SUMMARY: |hazards displayed \()(\d+) error", output)
    calls = re.findall(r"^calls: (\d+)$", output, re.M)
    return {"exit_code": code, "errors": int(summary[-1]) if summary else None,
            "calls": int(calls[-1]) if calls else None,
            "seconds": round(time.monotonic() - start, 1), "timed_out": code == -1,
            "tail": output.strip().splitlines()[-3:]}


def sweep(out: Path, tier: str, budget: float, kinds: tuple[str, ...] = KINDS) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    deadline = time.monotonic() + budget
    me = [sys.executable, "-P", str(Path(__file__).resolve()), "--kinds", ",".join(kinds)]
    result: dict[str, Any] = {"tier": tier, "kinds": list(kinds), "passes": {}}
    with open(out / "sanitize.log", "w") as log:
        if "gemm" in kinds:
            warm = [sys.executable, "-P", "-c", "import importlib; "
                    "importlib.import_module('gpurt.kernels.gemm').precompile()"]
            result["passes"]["precompile"] = _run(warm, env, log, budget)
        plain = "full" if tier == "full" else "quick"
        result["passes"]["plain"] = _run(me + ["--cases", plain], env, log, budget)
        sanitizer = _sanitizer()
        quiet = dict(env, GPURT_NO_CACHING="1")
        for tool in TOOLS if tier == "full" else ("memcheck",):
            left = deadline - time.monotonic()
            if left < 30:
                result["passes"][tool] = {"skipped": "out of time"}
                continue
            cases = tier if tool == "memcheck" else "race"
            command = [sanitizer, "--tool", tool, "--report-api-errors", "no",
                       "--print-limit", "20", *me, "--cases", cases]
            result["passes"][tool] = _run(command, quiet, log, left)
    try:
        import gpurt

        result["device"] = gpurt.get_device_name(0)
    except Exception as exc:  # the record is still written
        result["device"] = f"unknown ({exc})"
    passes = result["passes"]
    clean = all(p.get("exit_code") == 0 and p.get("errors") in (0, None) for p in passes.values())
    clean = clean and all(passes.get(t, {}).get("errors") == 0
                          for t in (TOOLS if tier == "full" else ("memcheck",)))
    result["clean"] = clean
    (out / "sanitize.json").write_text(json.dumps(result, indent=1))
    for name, p in passes.items():
        print(f"sanitize {name:10s} errors={p.get('errors')} calls={p.get('calls')} "
              f"exit={p.get('exit_code')} {p.get('seconds')} s {p.get('skipped', '')}")
    print("sanitize:", "CLEAN" if clean else "NOT CLEAN (see sanitize.log)")
    return 0 if clean else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tier", choices=("quick", "full"), default="quick")
    parser.add_argument("--budget", type=float, default=480, help="seconds for all passes")
    parser.add_argument("--cases", choices=TIERS, help="run the cases of a tier only")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated kinds of case (of {', '.join(KINDS)})")
    args = parser.parse_args()
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds takes some of {', '.join(KINDS)}, got {args.kinds}")
    if args.cases:
        print(f"calls: {run_cases(args.cases, kinds)}")
        return 0
    if args.out is None:
        parser.error("--out is required")
    return sweep(args.out, args.tier, args.budget, kinds)


if __name__ == "__main__":
    sys.exit(main())
