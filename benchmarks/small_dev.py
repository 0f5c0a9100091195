"""Development harness for small and odd GEMMs (issue 17: 127x257x61 and other latency-bound
sizes of M, N, K in 1..512, rows that are not 16-byte aligned) and TF32 at small M (16 / 128 x
4096^2). ``time`` runs every candidate tile (mma.sync: 64 x 64, 32-row and 32-column tiles, one
deep K tile for short K, split-K) kernel-only (20 calls in a CUDA graph, replayed, over rotating
inputs) next to cuBLAS (torch.matmul) in the same process, fp16, bf16, TF32 and fp32, in the
four operand layouts, each result checked against float64; ``tf32`` times the TF32 decode rows
several times over (median and spread); ``check`` runs edge cases (offset views, beta, every
layout) of the candidates; ``sanitize`` a few of them for compute-sanitizer. ``rule`` checks
the chooser's small-problem rule (kernels/_gemm_tune._small) on sizes ``time`` did not cover:
gemm's choice against its choice without the rule (the packed route included) and the rivals,
aligned rows too; and the TF32 16 x 4096^2 tilings (16-row tiles of 2 warps, 32 x 64 ones).

    python benchmarks/small_dev.py precompile | check | time [--json PATH] | tf32 | sanitize
    python benchmarks/small_dev.py precompile --rule | rule [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grid_dev  # noqa: E402
import torch  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

# (M, N, K): odd sizes (rows not 16-byte aligned) and two aligned controls; the first two in
# every layout
SHAPES = ((127, 257, 61), (257, 127, 251), (7, 131, 29), (31, 67, 13), (61, 509, 127),
          (13, 257, 509), (509, 61, 257), (251, 251, 251), (127, 257, 509), (509, 509, 509),
          (128, 256, 64), (64, 128, 64))
ALL_LAYOUTS = 2
LAYOUTS = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "tt": (True, True)}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32,
          "fp32": torch.float32}


def mma(bm: int, bn: int, bk: int, wm: int, wn: int, stages: int, split: int = 1) -> Config:
    return Config("mma", bm, bn, bk, wm, wn, stages=stages, split_k=split)


# 16-bit candidates: today's 64 x 64 (_MMA[3]), one K tile of 64 (short K in one stage),
# narrower tiles (more CTAs), split-K for the longer K
C16 = (mma(64, 64, 32, 32, 32, 4), mma(64, 64, 64, 32, 32, 2), mma(32, 64, 32, 16, 32, 4),
       mma(64, 32, 32, 32, 16, 4), mma(32, 32, 32, 16, 16, 4), mma(32, 32, 64, 16, 16, 2),
       mma(64, 64, 32, 32, 32, 4, 2), mma(64, 64, 32, 32, 32, 4, 4),
       mma(32, 32, 32, 16, 16, 4, 2))
# TF32 candidates (bk 16: 16 fp32 per row)
C32 = (mma(64, 64, 16, 32, 32, 4), mma(32, 32, 16, 16, 16, 4), mma(32, 64, 16, 16, 32, 4),
       mma(64, 32, 16, 32, 16, 4), mma(32, 32, 16, 16, 16, 8), mma(64, 64, 16, 32, 32, 4, 2),
       mma(32, 32, 16, 16, 16, 4, 2))
# TF32 at 16 / 128 x 4096^2: the rivals of gemm's choice
T = tune._WGMMA_TF32
TF32_DECODE = {16: [mma(64, 64, 16, 32, 32, 4, s) for s in (4, 6, 9, 12, 16)]
               + [mma(32, 64, 16, 16, 32, 4, s) for s in (6, 9)]
               + [mma(128, 128, 16, 64, 64, 4, 16)],
               128: [T[4], dataclasses.replace(T[4], tma_store=False), T[1], T[3],
                     mma(64, 64, 16, 32, 32, 4, 2), mma(64, 64, 16, 32, 32, 4, 4)]}


# the rule's check: unaligned sizes new to ``time`` (some past its 2^25 multiply-adds), aligned
# ones on both sides of its K <= 128, M x N <= 2^17 line
RULE_UNALIGNED = ((100, 300, 200), (333, 111, 77), (45, 450, 450), (500, 20, 500),
                  (300, 300, 300), (400, 400, 200), (200, 500, 300), (64, 64, 1),
                  (400, 400, 400), (300, 300, 380))
RULE_ALIGNED = ((128, 256, 64), (128, 128, 32), (256, 256, 128), (256, 512, 128),
                (512, 512, 128), (256, 256, 256), (512, 512, 256), (512, 512, 512), (64, 64, 512))
RULE_RIVALS = {"fp16": (mma(32, 32, 64, 16, 16, 3), mma(32, 32, 32, 16, 16, 4)),
               "tf32": (mma(32, 32, 16, 16, 16, 8),)}
TF32_M16 = ([mma(32, 64, 16, 16, 32, 4, s) for s in (4, 6, 8)] + [mma(32, 64, 16, 16, 32, 6, 6)]
            + [mma(16, 64, 16, 16, 32, 4, s) for s in (4, 8, 16)]
            + [mma(16, 128, 16, 16, 64, 4, s) for s in (4, 8)]
            + [mma(32, 128, 16, 32, 32, 4, s) for s in (4, 6)] + [mma(64, 64, 16, 32, 32, 4, 9)])


def candidates(name: str, k: int) -> list[Config]:
    if name == "fp32":
        return []
    pool = C32 if name == "tf32" else C16
    return [c for c in pool if c.split_k == 1 or k >= 128 * c.split_k]


class Operands:
    """Rotating input sets of one shape and layout (torch tensors and gpurt arrays)."""

    def __init__(self, m: int, n: int, k: int, name: str, layout: str, l2: int) -> None:
        a_t, b_t = LAYOUTS[layout]
        dtype = DTYPES[name]
        self.sets = max(2, min(24, -(-3 * l2 // ((m * k + k * n) * dtype.itemsize))))

        def make(rows: int, cols: int, t: bool) -> Any:
            x = torch.randn(cols, rows, device="cuda").t() if t else torch.randn(
                rows, cols, device="cuda")
            return x.to(dtype)

        self.a = [make(m, k, a_t) for _ in range(self.sets)]
        self.b = [make(k, n, b_t) for _ in range(self.sets)]
        self.out = torch.empty(m, n, device="cuda", dtype=dtype)
        self.ga = [gpurt.asarray(x) for x in self.a]
        self.gb = [gpurt.asarray(x) for x in self.b]
        self.gout = gpurt.asarray(self.out)


def time_case(m: int, n: int, k: int, name: str, layout: str, stream: Any, l2: int,
              configs: list[Config]) -> dict[str, Any]:
    tf32 = name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    p = Operands(m, n, k, name, layout, l2)
    problem = grid_dev.problem_of(p.a[0], p.b[0], tf32)
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "dtype": name, "layout": layout,
                           "vec": problem.vec, "auto_config": tune.heuristic(problem).label(),
                           "cublas_us": grid_dev.cublas_us(p)}
    ref = p.a[0].double() @ p.b[0].double()
    limit = 5e-3 if tf32 else 1e-5 if name == "fp32" else 1e-2
    for label, config in [("auto", None)] + [(c.label(), c) for c in configs
                                             if tune.eligible(problem, c)]:
        try:
            err = grid_dev.error(p, config, tf32, stream, ref)
            us = grid_dev.ours_us(p, config, tf32, stream)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{row['shape']} {name} {layout} {label}: {exc!r}", flush=True)
            continue
        row[label] = {"us": us, "x": round(row["cublas_us"] / us, 3), "err": float(f"{err:.2g}"),
                      "ok": err < limit}
    return row


def summary(rows: list[dict[str, Any]]) -> None:
    print(f"\n{torch.cuda.get_device_name()}: kernel-only us (graph replay); x = cuBLAS / gpurt")
    bad = 0
    for row in rows:
        ours = {key: v for key, v in row.items() if isinstance(v, dict)}
        bad += sum(not v["ok"] for v in ours.values())
        best = max(ours, key=lambda key: ours[key]["x"]) if ours else "-"
        auto = ours.get("auto", {"us": 0, "x": 0})
        print(f"{row['shape']:>12} {row['dtype']} {row['layout']} cuBLAS {row['cublas_us']:7.2f} "
              f"auto {auto['us']:7.2f} x{auto['x']:.3f} ({row['auto_config']}) best "
              f"x{ours[best]['x'] if ours else 0:.3f} ({best} {ours[best]['us'] if ours else 0})")
    print(f"results against float64: {bad} over the limit")


def run_timing(json_path: str | None, dtypes: list[str]) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    rows = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for index, (m, n, k) in enumerate(SHAPES):
            for name in dtypes:
                layouts = list(LAYOUTS) if index < ALL_LAYOUTS else ["nn"]
                for layout in layouts:
                    row = time_case(m, n, k, name, layout, stream, l2, candidates(name, k))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            if json_path:
                Path(json_path).write_text(json.dumps(rows, indent=1))
    summary(rows)


def run_tf32(json_path: str | None, rounds: int) -> None:
    """TF32 16 / 128 x 4096^2 (nn and nt): cuBLAS and gemm's choice timed ``rounds`` times
    each, alternating, then each rival once."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for m in (16, 128):
            for layout in ("nn", "nt"):
                p = Operands(m, 4096, 4096, "tf32", layout, l2)
                problem = grid_dev.problem_of(p.a[0], p.b[0], True)
                ref = p.a[0].double() @ p.b[0].double()
                ratios = []
                for _ in range(rounds):
                    cublas = grid_dev.cublas_us(p)
                    ratios.append(cublas / grid_dev.ours_us(p, None, True, stream))
                row: dict[str, Any] = {
                    "shape": f"{m}x4096x4096", "layout": layout,
                    "auto_config": tune.heuristic(problem).label(), "cublas_us": cublas,
                    "auto_x": [round(r, 3) for r in ratios],
                    "auto_median": round(statistics.median(ratios), 3),
                    "auto_err": grid_dev.error(p, None, True, stream, ref)}
                for config in TF32_DECODE[m]:
                    if tune.eligible(problem, config):
                        us = grid_dev.ours_us(p, config, True, stream)
                        row[config.label()] = {"us": us, "x": round(cublas / us, 3), "err": float(
                            f"{grid_dev.error(p, config, True, stream, ref):.2g}")}
                rows.append(row)
                print(json.dumps(row), flush=True)
                del p, ref
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def _without_rule(fn: Any) -> Any:
    """fn() with the small-problem rule off (gemm's choice before it), plans cleared around."""
    saved = tune._small
    tune._small = lambda problem: False
    gm.clear_plans()
    try:
        return fn()
    finally:
        tune._small = saved
        gm.clear_plans()


def rule_case(m: int, n: int, k: int, name: str, layout: str, stream: Any, l2: int,
              rivals: list[Config]) -> dict[str, Any]:
    tf32 = name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    p = Operands(m, n, k, name, layout, l2)
    problem = grid_dev.problem_of(p.a[0], p.b[0], tf32)
    ref = p.a[0].double() @ p.b[0].double()
    before = _without_rule(lambda: tune.heuristic(problem))
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "dtype": name, "layout": layout,
                           "vec": problem.vec, "small": tune._small(problem),
                           "auto_config": tune.heuristic(problem).label(),
                           "before_config": before.label(), "cublas_us": grid_dev.cublas_us(p)}
    limit = 5e-3 if tf32 else 1e-2
    timed = [("auto", None), ("before", None)] + [(c.label(), c) for c in rivals]
    for label, config in timed:
        if isinstance(config, Config) and not tune.eligible(problem, config):
            continue
        forced = config if isinstance(config, Config) else None

        def measure(forced: Config | None = forced) -> tuple[float, float]:
            err = grid_dev.error(p, forced, tf32, stream, ref)
            return err, grid_dev.ours_us(p, forced, tf32, stream)

        try:
            err, us = _without_rule(measure) if label == "before" else measure()
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{row['shape']} {name} {layout} {label}: {exc!r}", flush=True)
            continue
        row[label] = {"us": us, "x": round(row["cublas_us"] / us, 3), "err": float(f"{err:.2g}"),
                      "ok": err < limit}
    return row


def run_rule(json_path: str | None) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    rows = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for name in ("fp16", "tf32"):
            for shapes in (RULE_UNALIGNED, RULE_ALIGNED):
                for m, n, k in shapes:
                    rivals = list(RULE_RIVALS[name])
                    rivals.append(tune._TF32_SMALL if name == "tf32" else tune._MMA_SMALL)
                    row = rule_case(m, n, k, name, "nn", stream, l2, rivals)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        for layout in ("nn", "nt"):
            row = rule_case(16, 4096, 4096, "tf32", layout, stream, l2, TF32_M16)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    summary(rows)


# ---- correctness ---------------------------------------------------------------------------------


def check(m: int, n: int, k: int, name: str, layout: str, config: Config | None,
          beta: float = 0.0, offset: int = 0) -> tuple[bool, str]:
    """One gemm against float64 on fresh inputs ``offset`` elements into their buffers (so
    bases are not 16-byte aligned), output poisoned first; (passed, description)."""
    a_t, b_t = LAYOUTS[layout]
    dtype = DTYPES[name]

    def make(rows: int, cols: int, t: bool) -> Any:
        flat = torch.randn(offset + rows * cols, device="cuda").to(dtype)[offset:]
        return flat.view(cols, rows).t() if t else flat.view(rows, cols)

    a, b = make(m, k, a_t), make(k, n, b_t)
    c = torch.randn(m, n, device="cuda").to(dtype) if beta else None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    ref = 1.5 * (a.double() @ b.double())
    if c is not None:
        ref += beta * c.double()
    what = (f"{m}x{n}x{k} {name} {layout} {config.label() if config else 'auto'} beta={beta} "
            f"off={offset}")
    try:
        gm.gemm(a, b, out=out, alpha=1.5, beta=beta, c=c, config=config,
                allow_tf32=name == "tf32")
    except Exception as exc:  # noqa: BLE001 - report and go on
        return False, f"{what}: {exc!r}"
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(out.double() - ref)) / (float(torch.linalg.norm(ref)) or 1.0)
    limit = 5e-3 if name == "tf32" else 1e-5 if name == "fp32" else 1e-2
    return bool(torch.isfinite(out).all()) and err < limit, f"{what}: err={err:.2e}"


def check_cases(sanitize: bool = False) -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    if sanitize:
        for name, pool in (("fp16", C16[:2]), ("bf16", C16[4:7]), ("tf32", C32[:2])):
            for config in pool:
                cases.append((37, 45, 61, name, "nt", config, 0.5, 1))
                cases.append((70, 33, 300, name, "tn", config, 0.0, 0))
        # gemm's own choice on aligned rows (the small rule: 32 x 32 tiles, vector loads)
        cases += [(64, 96, 64, "fp16", "nn", None, 0.5), (96, 64, 40, "tf32", "nt", None)]
        return cases
    for layout in LAYOUTS:
        for name, pool in (("fp16", C16), ("bf16", C16), ("tf32", C32)):
            for config in pool:
                cases.append((127, 257, 61, name, layout, config))
                cases.append((70, 93, 301, name, layout, config, 0.5, 1))  # K tail, offsets
                cases.append((1, 9, 3, name, layout, config, -1.0, 3))
        for name in DTYPES:
            cases.append((127, 257, 61, name, layout, None, 0.5, 1))
            cases.append((509, 61, 257, name, layout, None))
    return cases


def run_checks(cases: list[tuple[Any, ...]]) -> int:
    failures = 0
    for case in cases:
        ok, what = check(*case)
        failures += not ok
        print(("PASS " if ok else "FAIL ") + what, flush=True)
    print(f"checks: {len(cases) - failures} passed, {failures} failed", flush=True)
    return failures


# ---- compiling -----------------------------------------------------------------------------------


def precompile_rule() -> set[Any]:
    """The programs of ``rule`` (nn; without the rule too: the packed route's wgmma)."""
    jobs = set()
    for name, dt in (("fp16", tune.DT_F16), ("tf32", tune.DT_TF32)):
        for shapes, vec in ((RULE_UNALIGNED, False), (RULE_ALIGNED, True), (((16, 4096, 4096),),
                                                                             True)):
            for m, n, k in shapes:
                for b_k in (False, True):
                    problem = tune.Problem(m, n, k, dt, True, b_k, vec, vec, (9, 0), 132)
                    packed = dataclasses.replace(problem, vec=True, tma=True)
                    configs = [tune.heuristic(problem), tune.heuristic(packed),
                               _without_rule(lambda p=problem: tune.heuristic(p)),
                               _without_rule(lambda p=packed: tune.heuristic(p)),
                               *RULE_RIVALS[name], tune._MMA_SMALL, tune._TF32_SMALL]
                    if m == 16 and dt == tune.DT_TF32:
                        configs += TF32_M16
                    jobs.update(launch.program(c, problem) for c in configs
                                if tune.eligible(problem, c))
    # tests/test_gemm_small.py's forced configs (unaligned, every layout) and the sanitizer's
    tested = ((C16[1], tune.DT_F16), (C16[2], tune.DT_F16), (C16[4], tune.DT_BF16),
              (C16[5], tune.DT_BF16), (C16[6], tune.DT_BF16), (C32[0], tune.DT_TF32),
              (C32[1], tune.DT_TF32))
    for (config, dt), a_k, b_k in itertools.product(tested, (True, False), (True, False)):
        problem = tune.Problem(127, 257, 301, dt, a_k, b_k, False, False, (9, 0), 132)
        jobs.add(launch.program(config, problem))
    return jobs


def precompile(rule: bool = False) -> None:
    """Every program the checks and timings use, compiled in parallel into the disk cache."""
    if rule:
        jobs = precompile_rule()
        print(f"precompiling {len(jobs)} programs", flush=True)
        print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)
        return
    jobs = set()
    dts = {"fp16": tune.DT_F16, "bf16": tune.DT_BF16, "tf32": tune.DT_TF32, "fp32": tune.DT_F32}
    for name, dt in dts.items():
        for a_k in (True, False):
            for b_k in (True, False):
                for vec in (True, False):
                    if vec and (b_k or not a_k):  # aligned rows: the controls, timed in nn
                        continue
                    for m, n, k in SHAPES:
                        problem = tune.Problem(m, n, k, dt, a_k, b_k, vec, vec, (9, 0), 132)
                        for config in [tune.heuristic(problem), *candidates(name, 4096)]:
                            if tune.eligible(problem, config):
                                jobs.add(launch.program(config, problem))
    for m in (16, 128):
        for b_k in (True, False):
            problem = tune.Problem(m, 4096, 4096, tune.DT_TF32, True, b_k, True, True, (9, 0), 132)
            for config in [tune.heuristic(problem), *TF32_DECODE[m]]:
                if tune.eligible(problem, config):
                    jobs.add(launch.program(config, problem))
    print(f"precompiling {len(jobs)} programs", flush=True)
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "check", "time", "tf32", "sanitize",
                                         "rule"))
    parser.add_argument("--rule", action="store_true", help="precompile: rule's programs")
    parser.add_argument("--json", default=None)
    parser.add_argument("--dtypes", default="fp16,bf16,tf32,fp32")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile(args.rule)
    elif args.mode == "rule":
        run_rule(args.json)
    elif args.mode == "check":
        sys.exit(1 if run_checks(check_cases()) else 0)
    elif args.mode == "time":
        run_timing(args.json, args.dtypes.split(","))
    elif args.mode == "tf32":
        run_tf32(args.json, args.rounds)
    else:
        sys.exit(1 if run_checks(check_cases(sanitize=True)) else 0)
