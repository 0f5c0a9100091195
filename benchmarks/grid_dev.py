"""Development harness for GEMMs of few tiles (issue 17: 1000^3, 1024^3, TF32 1024^3 and other
irregular sizes, where a 128 x 128 grid leaves SMs idle): times every grid-filling candidate
(128 x 64 tiles, split-K 2-3 on wgmma, 2-CTA clusters, the wide tiles) kernel-only (20 calls
in a CUDA graph, replayed, over inputs rotating past the L2 cache) next to cuBLAS in the same
process, bf16, fp16 and TF32, and checks every timed result against float64. ``check`` runs
the new 128 x 64 tiles over edge cases in every layout; ``sanitize`` a small sweep for
compute-sanitizer.

    python benchmarks/grid_dev.py precompile | check | time [--json PATH] [--auto-only] | sanitize
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import tf32_dev  # noqa: E402
import torch  # noqa: E402
from decode_split_dev import check as check16  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

SHAPES = ((1000, 1000, 1000), (1024, 1024, 1024), (1536, 1536, 1536), (2000, 2000, 2000),
          (3000, 5000, 2000), (4099, 4099, 4099))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}
W = tune._WGMMA
N64 = Config("wgmma", 128, 64, 64, stages=8, group_m=8, tma_store=True)
T = tune._WGMMA_TF32
T64 = Config("wgmma", 128, 64, 32, stages=8, group_m=8, tma_store=True)


def split(config: Config, k: int) -> Config:
    return dataclasses.replace(config, split_k=k)


def plain(config: Config) -> Config:
    return dataclasses.replace(config, tma_store=False)


def variants(dtype: str) -> list[Config]:
    """The forced configs timed per shape (the ones a problem cannot run are skipped)."""
    if dtype == "tf32":
        return [T[0], T[3], T[1], T64, plain(T64), tune._TF32[0]]
    wide = [W[4], W[5], W[1], N64, plain(N64), W[6],
            dataclasses.replace(W[5], cluster_m=2)]
    splits = [split(W[1], 2), split(W[1], 3), split(plain(N64), 2), split(W[0], 2)]
    return wide + splits if dtype == "bf16" else [W[4], W[5], N64, split(W[1], 2)]


def problem_of(a: Any, b: Any, tf32: bool) -> Any:
    plan, _, _ = gm.plans.make_plan(gpurt.asarray(a), gpurt.asarray(b), None, 0.0, None, False,
                                    False, gpurt.as_stream(None, 0))
    return gm.plans.problem_of(plan, tf32)


# ---- timing --------------------------------------------------------------------------------------


def _graph_us(capture: Callable[[Callable[[], Any]], Any], call: Callable[[int], Any],
              sets: int, replay: Callable[[Any], Any]) -> float:
    for i in range(sets):  # compiles and loads outside the capture
        call(i)
    torch.cuda.synchronize()
    graph = capture(lambda: [call(i % sets) for i in range(bench.CALLS)])
    replay(graph)
    ms = bench._events_ms(torch, lambda: replay(graph), 30)
    return round(ms * 1e3 / bench.CALLS, 2)


def ours_us(p: Any, config: Config | None, tf32: bool, stream: Any) -> float:
    def call(i: int) -> None:
        gm.gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream, config=config, allow_tf32=tf32)

    def capture(body: Callable[[], Any]) -> Any:
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph, stream=stream):
            body()
        return graph

    with gpurt.stream(stream), torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        return _graph_us(capture, call, p.sets, lambda g: g.replay())


def cublas_us(p: Any) -> float:
    def call(i: int) -> None:
        torch.matmul(p.a[i], p.b[i], out=p.out)

    def capture(body: Callable[[], Any]) -> Any:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        return graph

    return _graph_us(capture, call, p.sets, lambda g: g.replay())


def error(p: Any, config: Config | None, tf32: bool, stream: Any, ref: Any) -> float:
    """gpurt's relative Frobenius error against float64 on the first input set (the output is
    poisoned first)."""
    p.out.fill_(float("nan"))
    gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream, config=config, allow_tf32=tf32)
    stream.synchronize()
    if not bool(torch.isfinite(p.out).all()):
        return float("inf")
    return float(torch.linalg.norm(p.out.double() - ref) / torch.linalg.norm(ref))


def time_shape(m: int, n: int, k: int, name: str, auto_only: bool, stream: Any,
               l2: int) -> dict[str, Any]:
    tf32 = name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    p = bench.Problem(gpurt, torch, m, n, k, DTYPES[name], False, l2)
    problem = problem_of(p.a[0], p.b[0], tf32)
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "dtype": name, "tma": problem.tma,
                           "auto_config": tune.heuristic(problem).label(),
                           "cublas_us": cublas_us(p)}
    ref = p.a[0].double() @ p.b[0].double()
    limit = 5e-3 if tf32 else 1e-2
    # without TMA (4099: pitches not 16-byte multiples) the tuner's own candidates
    pool = variants(name) if problem.tma else tune.candidates(problem)
    todo = [("auto", None)] + ([] if auto_only else [
        (c.label(), c) for c in pool if tune.eligible(problem, c)])
    for label, config in todo:
        try:
            err = error(p, config, tf32, stream, ref)
            us = ours_us(p, config, tf32, stream)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{row['shape']} {name} {label}: {exc!r}", flush=True)
            continue
        row[label] = {"us": us, "x": round(row["cublas_us"] / us, 3), "err": float(f"{err:.2g}"),
                      "ok": err < limit}
    del p, ref
    return row


def run_timing(json_path: str | None, auto_only: bool, dtypes: list[str]) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    rows = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for name in dtypes:
            for m, n, k in SHAPES:
                row = time_shape(m, n, k, name, auto_only, stream, l2)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if json_path:
                    Path(json_path).write_text(json.dumps(rows, indent=1))
    print(f"\n{torch.cuda.get_device_name()}: kernel-only us (graph replay); x = cuBLAS / gpurt")
    bad = 0
    for row in rows:
        ours = {key: v for key, v in row.items() if isinstance(v, dict)}
        bad += sum(not v["ok"] for v in ours.values())
        best = max(ours, key=lambda key: ours[key]["x"]) if ours else "-"
        auto = ours.get("auto", {"us": 0, "x": 0})
        print(f"{row['shape']:>15} {row['dtype']} cuBLAS {row['cublas_us']:8.2f} auto "
              f"{auto['us']:8.2f} x{auto['x']:.3f} ({row['auto_config']}) best "
              f"x{ours[best]['x'] if ours else 0:.3f} ({best})")
    print(f"results against float64: {bad} over the limit")


# ---- correctness ---------------------------------------------------------------------------------


def check_cases() -> list[tuple[str, tuple[Any, ...]]]:
    """(kind, arguments) of decode_split_dev.check ("16") or tf32_dev.check ("32")."""
    cases: list[tuple[str, tuple[Any, ...]]] = []
    for a_t, b_t in ((False, False), (False, True), (True, True), (True, False)):
        for config in (N64, plain(N64), split(plain(N64), 3)):
            cases.append(("16", (1000, 1000, 1000, config, a_t, b_t)))
            cases.append(("16", (200, 264, 72, config, a_t, b_t, 0.5)))  # edges, 2 K tiles
            cases.append(("16", (136, 520, 4104, config, a_t, b_t, -1.0, torch.float16)))
        cases.append(("16", (4224, 1000, 520, N64, a_t, b_t)))  # several tiles per CTA
    for config in (T64, plain(T64)):
        for layout in ("nn", "nt", "tt"):
            cases.append(("32", (300, 520, 136, config, layout)))
            cases.append(("32", (132, 260, 36, config, layout, 4, 0.5)))
            cases.append(("32", (4224, 1024, 520, config, layout)))
            cases.append(("32", (76, 1000, 68, config, layout, 0, -1.0, True)))
            cases.append(("32", (200, 264, 200, config, layout, 0, 0.0, False, 1)))
    return cases


def run_checks(cases: list[tuple[str, tuple[Any, ...]]]) -> int:
    failures = 0
    for kind, args in cases:
        try:
            ok, what = (check16 if kind == "16" else tf32_dev.check)(*args)
        except Exception as exc:  # noqa: BLE001 - report and go on
            ok, what = False, f"{args[:3]} {args[3].label()} {args[4:]}: {exc!r}"
        failures += not ok
        print(("PASS " if ok else "FAIL ") + what, flush=True)
    print(f"checks: {len(cases) - failures} passed, {failures} failed", flush=True)
    return failures


def sanitize() -> None:
    cases: list[tuple[str, tuple[Any, ...]]] = [
        ("16", (200, 136, 72, N64, False, False, 0.5)),
        ("16", (72, 200, 136, N64, True, True)),
        ("16", (136, 72, 200, plain(N64), False, True, 0.0, torch.float16)),
        ("16", (200, 136, 520, split(plain(N64), 3), True, False, -1.0)),
        ("32", (132, 72, 68, T64, "nn", 0, 0.5)),
        ("32", (72, 132, 36, T64, "nt", 4)),
        ("32", (40, 72, 40, T64, "tt", 0, 0.0, False, 1)),
    ]
    sys.exit(1 if run_checks(cases) else 0)


# ---- compiling -----------------------------------------------------------------------------------


def precompile() -> None:
    """Every program the checks and timings use, compiled in parallel into the disk cache."""
    jobs = set()

    def add(config: Config, problem: Any) -> None:
        if tune.eligible(problem, config):
            jobs.add(launch.program(config, problem))

    for name, dt in (("bf16", tune.DT_BF16), ("fp16", tune.DT_F16), ("tf32", tune.DT_TF32)):
        for m, n, k in SHAPES:
            tma = m % 8 == 0 or m == 1000 or m == 2000  # 4099: pitches not 16-byte multiples
            problem = tune.Problem(m, n, k, dt, True, False, tma, tma, (9, 0), 132)
            pool = variants(name) if tma else tune.candidates(problem)
            for config in [tune.heuristic(problem), *pool]:
                add(config, problem)
        for a_k in (True, False):
            for b_k in (True, False):
                problem = tune.Problem(1024, 1024, 1024, dt, a_k, b_k, True, True, (9, 0), 132)
                for config in (N64, plain(N64), split(plain(N64), 3), T64, plain(T64)):
                    add(config, problem)
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "check", "time", "sanitize"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--auto-only", action="store_true", help="time gemm's choice only")
    parser.add_argument("--dtypes", default="bf16,tf32,fp16")
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile()
    elif args.mode == "check":
        sys.exit(1 if run_checks(check_cases()) else 0)
    elif args.mode == "time":
        run_timing(args.json, args.auto_only, args.dtypes.split(","))
    else:
        sanitize()
