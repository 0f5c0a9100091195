"""Session 8's decode sweep (issue 17, M = 1..128 at 4096-wide weights): every tiling the
decode and 16-bit wgmma kernels already have that could beat today's choice, timed
kernel-only (bench_gemm_decode's graph replay over rotating weights) next to cuBLAS in the
same process, with how many CTAs / clusters of each fit at once. (The session-8 run also
timed a tensor-map prefetch in the decode kernel on and off; it changed nothing measurable
and was removed: notes_gemm.md.)

    python benchmarks/decode_sweep_dev.py precompile | occupancy | sweep [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import torch  # noqa: E402
from decode_split_dev import graph_us  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
decode = importlib.import_module("gpurt.kernels._gemm_decode")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
Config = tune.Config

# (M, N, K, weights N x K as x @ W.T): the brief's shapes first, then where a new rule for
# 4096-row weights would also apply (K = 11008), and one shape it must leave alone
SHAPES = [(128, 4096, 4096, False), (64, 4096, 4096, False), (1, 4096, 4096, False),
          (8, 4096, 4096, False), (128, 4096, 4096, True), (64, 4096, 4096, True),
          (128, 4096, 11008, False), (64, 4096, 11008, False), (128, 11008, 4096, False),
          (1, 4096, 4096, True), (64, 11008, 4096, False), (4, 4096, 4096, False)]


def problem(m: int, n: int, k: int, nk: bool) -> Any:
    return tune.Problem(m, n, k, tune.DT_BF16, True, nk, True, True, (9, 0), 132)


def dc(bm: int, bn: int, stages: int, split: int) -> Any:
    return Config("decode", bm, bn, 64, stages=stages, split_k=split)


def wg(bn: int, stages: int, split: int) -> Any:
    return Config("wgmma", 128, bn, 64, stages=stages, split_k=split)


def variants(p: Any) -> list[Any]:
    """The heuristic's choice first, then the tilings worth timing on ``p``."""
    bn = decode._bn(p)
    found = [tune.heuristic(p)]
    if min(p.m, p.n) <= 16:  # the weight's bytes are all: ring depth, CTAs per SM, skinny
        found += [dc(64, bn, s, 2) for s in (4, 8, 10)]
        found += [dc(64, bn, 6, 4), dc(64, bn, 4, 4), dc(128, bn, 6, 4), dc(128, bn, 8, 2),
                  dc(64, bn, 6, 8), dc(64, bn, 6, 1)]
        found += [tune._skinny_config(t) for t in tune._skinny.candidates(p)]
    else:  # fewer Y re-reads: taller tiles with deeper splits, or the wgmma 128 x N path
        deep = 8 if bn < 128 else 6
        found += [dc(64, bn, 6, 2), dc(64, bn, 8, 2), dc(64, bn, 4, 2), dc(128, bn, deep, 2),
                  dc(128, bn, deep, 1), dc(128, bn, 6, 4),
                  dc(128, bn, 4 if bn < 128 else 3, 4), dc(64, bn, 4, 4)]
        if bn == 64:
            found.append(dc(256, 64, 2, 8))
        found += [wg(128, 6, s) for s in (2, 3, 4, 6)] + [wg(256, 4, s) for s in (2, 4, 8)]
        found += [wg(64, 8, s) for s in (2, 4)]
    unique: list[Any] = []
    for config in found:
        if config not in unique and tune.eligible(p, config):
            unique.append(config)
    return unique


def precompile() -> None:
    """Every program of the sweep and of the bench (heuristic choices), compiled in parallel
    into the disk cache."""
    jobs = set()
    for m, n, k, nk in SHAPES:
        for config in variants(problem(m, n, k, nk)):
            jobs.add(launch.program(config, problem(m, n, k, nk)))
    for n, k in bench.NK:
        for m in bench.M_VALUES:
            p = problem(m, n, k, False)
            jobs.add(launch.program(tune.heuristic(p), p))
            fp16 = dataclasses.replace(p, dt=tune.DT_F16)
            jobs.add(launch.program(tune.heuristic(fp16), fp16))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


def occupancy() -> None:
    """CTAs per SM and clusters at once of each variant's kernel (cuOccupancy*)."""
    seen = set()
    for m, n, k, nk in SHAPES:
        p = problem(m, n, k, nk)
        for config in variants(p):
            if config in seen:
                continue
            seen.add(config)
            kernel = launch.compile_kernels(*launch.program(config, p))[0]
            smem = config.shared_mem(p.a_kmajor, p.b_kmajor)
            row = {"config": config.label(), "smem": smem,
                   "regs": kernel.attributes().get("num_regs"),
                   "per_sm": kernel.max_active_blocks_per_multiprocessor(config.threads, smem)}
            if config.kernel == "decode" and config.split_k > 1:
                split = config.split_k
                row["clusters"] = kernel.max_active_clusters(gpurt.LaunchConfig(
                    split * 1024, config.threads, smem, cluster=split))
            print(json.dumps(row), flush=True)


def sweep(json_path: str | None) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy_bps = bench.copy_bandwidth(torch)
    rows: list[dict[str, Any]] = []
    stream = gpurt.Stream()
    for m, n, k, nk in SHAPES:
        bp = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, nk, l2)
        p = problem(m, n, k, nk)
        row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "w": "nk" if nk else "kn",
                               "copy": round(n * k * 2 / copy_bps * 1e6, 2)}
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            row["cublas"] = round(bench.torch_graph_us(torch, bp, 20), 2)
        configs = variants(p)
        row["heuristic"] = configs[0].label()
        for config in configs:
            try:
                row[config.label()] = graph_us(bp, config, stream)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{row['shape']} {config.label()}: {exc!r}", flush=True)
        row["rel_err"] = check(bp, configs, stream)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if json_path:
            Path(json_path).write_text(json.dumps(rows, indent=1))
        del bp
    summary(rows)


def check(bp: Any, configs: list[Any], stream: Any) -> float:
    """The worst relative error against float64 of every timed config on the first input
    set (output poisoned with NaN before each call)."""
    ref = bp.a[0].double() @ bp.b[0].double()
    worst = 0.0
    for config in configs:
        bp.out.fill_(float("nan"))
        torch.cuda.synchronize()  # the fill (torch's stream) before gemm's stream writes
        gm.gemm(bp.ga[0], bp.gb[0], out=bp.gout, stream=stream, config=config)
        stream.synchronize()
        err = float(torch.linalg.norm(bp.out.double() - ref) / torch.linalg.norm(ref))
        if not err < 1e-2:
            print(f"FAIL {bp.m}x{bp.n}x{bp.k} {config.label()}: err={err}", flush=True)
            err = float("inf")
        worst = max(worst, err)
    return float(f"{worst:.3g}")


def summary(rows: list[dict[str, Any]]) -> None:
    print(f"\n{torch.cuda.get_device_name()}: us kernel-only (graph replay); cuBLAS / gpurt")
    for row in rows:
        ours = {key: v for key, v in row.items() if key.startswith(("decode", "wgmma", "skinny"))}
        ranked = sorted(ours, key=ours.get)[:3]
        heur = row[row["heuristic"]]
        best = " ".join(f"{key} {ours[key]:.2f} x{row['cublas'] / ours[key]:.3f};"
                        for key in ranked)
        print(f"{row['shape']:>15} {row['w']} copy {row['copy']:.2f} cuBLAS {row['cublas']:.2f} "
              f"heur {heur:.2f} x{row['cublas'] / heur:.3f} | {best} err {row['rel_err']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "occupancy", "sweep"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    {"precompile": precompile, "occupancy": occupancy,
     "sweep": lambda: sweep(args.json)}[args.mode]()
