"""Development harness for the decode GEMM family (kernels/gemm_decode.cu: wgmma with the
small side of C on wgmma's N): checks forced decode configs against float64 (every layout,
odd M, K tails, empty K slices of a cluster, beta, tall C, fp16), then times every decode
candidate kernel-only (bench_gemm_decode's graph replay over rotating weights) next to cuBLAS
and to the choice gemm made before this family (GPURT_GEMM_DISABLE=decode). ``sanitize`` runs
a small sweep for compute-sanitizer; ``race`` the case where the full sweep's racecheck
reported hazards.

    python benchmarks/decode_dev.py precompile | check | time [--json PATH] | sanitize | race
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import torch  # noqa: E402
from decode_split_dev import graph_us, run_checks, time_variants  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
decode = importlib.import_module("gpurt.kernels._gemm_decode")


def problem(m: int, n: int, k: int, a_t: bool = False, b_t: bool = False,
            dt: int = tune.DT_BF16) -> Any:
    return tune.Problem(m, n, k, dt, not a_t, b_t, True, True, (9, 0), 132)


def config(p: Any, bm: int = 128, split: int | None = None) -> Any:
    return tune._decode_config(decode._tiles(p, bm, split))


def check_cases() -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    for a_t, b_t in ((False, False), (False, True), (True, True), (True, False)):
        ms = (16, 64, 128) if a_t else (3, 17, 33, 100)  # an M-major A needs 16-byte rows
        for m in ms:
            cases.append((m, 4096, 4096, config(problem(m, 4096, 4096, a_t, b_t)), a_t, b_t))
            cases.append((m, 1000, 1000, config(problem(m, 1000, 1000, a_t, b_t), 64, 2), a_t,
                          b_t, 0.5))
        cases.append((ms[1], 264, 72, config(problem(ms[1], 264, 72, a_t, b_t), 128, 4), a_t,
                      b_t))  # 2 K tiles over 4 ranks: empty slices
        cases.append((ms[0], 520, 4104, config(problem(ms[0], 520, 4104, a_t, b_t), 128, 8),
                      a_t, b_t, -1.0))  # K tail, clusters of 8
        tall = (4096, 64, 4096) if b_t else (1000, 16, 1000)  # C tall: X = op(a)
        cases.append((*tall, config(problem(*tall, a_t, b_t)), a_t, b_t, 0.5))
    cases.append((17, 301, 1000, config(problem(17, 301, 1000, False, True)), False, True, 0.5))
    cases.append((64, 11008, 4096, config(problem(64, 11008, 4096, dt=tune.DT_F16)), False,
                  False, 0.0, torch.float16))
    cases.append((100, 4096, 1000, config(problem(100, 4096, 1000, dt=tune.DT_F16), 64), False,
                  True, 0.5, torch.float16))
    for a_t, b_t in ((False, False), (True, True)):  # 256-row tiles: two 64-row blocks per wgmma
        for m, n, k, split in ((64, 4096, 4096, 8), (100 - 36 * a_t, 1000, 1000, 2),
                               (128, 264, 4104, 1), (24, 4096, 520, 4)):
            cases.append((m, n, k, tune.Config("decode", 256, 64 if a_t or m > 32 else 32, 64,
                                               stages=4, split_k=split), a_t, b_t, 0.5))
    return cases


def precompile() -> None:
    """Every decode program of the checks and timings, compiled in parallel into the cache."""
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    jobs = set()
    problems = [problem(m, n, k, a_t, b_t, dt) for dt in (tune.DT_BF16, tune.DT_F16)
                for a_t in (True, False) for b_t in (True, False)
                for m, n, k in ((3, 4096, 4096), (17, 4096, 4096), (33, 4096, 4096),
                                (64, 4096, 4096), (128, 4096, 4096), (1000, 16, 1000),
                                (4096, 64, 4096))]
    problems += [problem(m, n, k, False, nk) for n, k in NK for m in M_VALUES
                 for nk in (False, True)]
    for p in problems:
        for c in tune.all_configs(p) + [tune.heuristic(p)]:
            if c.kernel == "decode":
                jobs.add(launch.program(c, p))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


def sanitize() -> None:
    cases = [(17, 264, 200, config(problem(17, 264, 200), 128, 2), False, False, 0.5),
             (64, 136, 520, config(problem(64, 136, 520, True, True), 64, 4), True, True),
             (72, 8, 264, config(problem(72, 8, 264, False, True)), False, True, 0.0,
              torch.float16)]
    cases.append((40, 264, 1000, tune.Config("decode", 256, 64, 64, stages=4, split_k=2),
                  False, False, 0.5))
    sys.exit(1 if run_checks(cases) else 0)


def race() -> None:
    """The sanitizer sweep's TMA-aligned case (17 x 264 x 200, beta 0.5) with every decode
    config gemm may force on it, bf16 and fp16, every layout: where the full sweep's
    racecheck reported hazards (notes_gemm.md)."""
    cases = []
    for dtype, dt in ((torch.bfloat16, tune.DT_BF16), (torch.float16, tune.DT_F16)):
        for a_t, b_t in ((False, False), (True, True), (True, False), (False, True)):
            p = problem(17, 264, 200, a_t, b_t, dt)
            cases += [(17, 264, 200, c, a_t, b_t, 0.5, dtype) for c in tune.all_configs(p)
                      if c.kernel == "decode"]
    sys.exit(1 if run_checks(cases) else 0)


M_VALUES = tuple(int(m) for m in os.environ.get("DECODE_M", "8,16,32,64,128").split(","))
NK = ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096))


def run_timing(json_path: str | None) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    stream = gpurt.Stream()
    for n, k in NK:
        for m in M_VALUES:
            p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, False, l2)
            row: dict[str, Any] = {"shape": f"{m}x{n}x{k}"}
            with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
                row["cublas"] = round(bench.torch_graph_us(torch, p, 20), 2)
            tp = problem(m, n, k)
            os.environ["GPURT_GEMM_DISABLE"] = "decode"
            old = tune.heuristic(tp)
            os.environ.pop("GPURT_GEMM_DISABLE")
            variants = [("old " + old.label(), old)]
            variants += [(c.label(), c) for c in tune.candidates(tp) if c.kernel == "decode"]
            time_variants(p, row, variants, stream, rows, json_path)
            del p
    print(f"\n{torch.cuda.get_device_name()}: us kernel-only (graph replay); cuBLAS / gpurt")
    for row in rows:
        ours = {key: v for key, v in row.items() if key.startswith("decode")}
        best = min(ours, key=ours.get) if ours else "-"
        old = next(key for key in row if key.startswith("old"))
        print(f"{row['shape']:>15} cuBLAS {row['cublas']:6.2f} old {row[old]:6.2f} "
              f"x{row['cublas'] / row[old]:.2f} best {ours.get(best, 0):6.2f} "
              f"x{row['cublas'] / ours.get(best, 1e9):.2f} ({best})")


def run_stages() -> None:
    """Ring depth of 64-row tiles on grids of one CTA per SM (4096-row weights, split 2), and
    how many clusters of 2, 4 and 8 CTAs of 200 KiB run at once (the cluster-4 penalty)."""
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    for split in (2, 4, 8):
        cfg = tune.Config("decode", 128, 16, 64, stages=8, split_k=split)
        p = problem(8, 4096, 4096)
        kernel = launch.compile_kernels("gemm_decode.cu", launch.kernel_names(cfg, p), "sm_90a")[0]
        smem = cfg.shared_mem(True, False)
        fit = kernel.max_active_clusters(gpurt.LaunchConfig(split * 1024, cfg.threads, smem,
                                                             cluster=split))
        print(json.dumps({"split": split, "max_clusters": fit}), flush=True)
    for n, k in ((4096, 4096), (4096, 11008)):
        for m in (8, 64, 128):
            bp = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, False, l2)
            row: dict[str, Any] = {"shape": f"{m}x{n}x{k}"}
            with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
                row["cublas"] = round(bench.torch_graph_us(torch, bp, 20), 2)
            bn = decode._bn(problem(m, n, k))
            for stages in (4, 6, 8, 10, 12):
                cfg = tune.Config("decode", 64, bn, 64, stages=stages, split_k=2)
                if cfg.shared_mem(True, False) <= 227 * 1024:
                    row[cfg.label()] = graph_us(bp, cfg, stream)
            print(json.dumps(row), flush=True)
            del bp


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "check", "time", "sanitize", "stages",
                                         "race"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile()
    elif args.mode == "check":
        sys.exit(1 if run_checks(check_cases()) else 0)
    elif args.mode == "time":
        run_timing(args.json)
    elif args.mode == "stages":
        run_stages()
    elif args.mode == "race":
        race()
    else:
        sanitize()
