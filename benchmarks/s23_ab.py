"""Session 23 (issue 17): rowload's dot-product tiles for x @ W.T (fp32), HEAD's kernel source
against this tree's, in one process: each forced config timed kernel-only cold
(bench_gemm_decode's graph harness) with every source in turn, ROUNDS rounds, so process-to-
process differences (allocation, clocks) do not enter the comparison. Sources: ``new`` (this
tree), ``old`` (benchmarks/old_s23/gemm_rowload.cu, ignored by git, carried to the GPU machine:
``git show 88641c0:kernels/gemm_rowload.cu``; 64 rows of W a CTA, 31 lanes a load on any rows).

    python benchmarks/s23_ab.py --json PATH [--shapes 1x4096x4096t:4,...] [--rounds 3]

A shape's ``:S`` suffix times the 64 x 124 tile at K split S (1 without it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from pathlib import Path

import torch
from bench_gemm_decode import Problem, gpurt_graph_us, torch_graph_us

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
rowload = importlib.import_module("gpurt.kernels._gemm_rowload")
Config = importlib.import_module("gpurt.kernels._gemm_tune").Config

HERE = Path(__file__).resolve().parent
NEW = launch.text("gemm_rowload.cu")
SOURCES = {"new": NEW, "old": (HERE / "old_s23" / "gemm_rowload.cu").read_text()}
_text, _name = launch.text, rowload.name_expression


def use(source: str) -> None:
    """Compile gemm_rowload.cu from SOURCES[source] from now on (old: its 4-argument names)."""
    launch.text = lambda name: SOURCES[source] if name == "gemm_rowload.cu" else _text(name)

    def name(config, dt, a_kmajor):
        found = _name(config, dt, a_kmajor)
        if source == "old":  # no rows-a-warp argument
            head, args = found.split("<")
            parts = args.rstrip(">").split(", ")
            found = head + "<" + ", ".join(parts[:3] + parts[4:]) + ">"
        return found

    rowload.name_expression = name
    launch._kernels.clear()
    gemm_mod.clear_plans()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--shapes", default="3x4099x4099t:4,3x4099x4099t,1x5003x3001t:3,"
                        "1x5003x3001t:2,1x4096x4096t:4,1x11008x4096t,4x4096x4096t:4,"
                        "1x14336x4096t,1x4096x11008t:4,2x4096x4096t:4,4x11008x4096t")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for text in args.shapes.split(","):
        shape, _, split = text.partition(":")
        m, n, k = (int(v) for v in shape.rstrip("t").split("x"))
        p = Problem(gpurt, torch, m, n, k, torch.float32, True, l2, tf32=False)
        config = Config("rowload", min(m, 4), 64, 124, split_k=int(split or 1))
        cublas = torch_graph_us(torch, p, args.repeat)
        times: dict[str, list[float]] = {s: [] for s in SOURCES}
        for _ in range(args.rounds):
            for source in SOURCES:
                use(source)
                p.out.fill_(math.nan)
                times[source].append(round(gpurt_graph_us(gpurt, gemm_mod.gemm, p, config,
                                                          args.repeat, torch), 2))
                gemm_mod.gemm(p.ga[0], p.gb[0], out=p.gout, config=config)
                torch.cuda.synchronize()
                assert p.rel_error(torch) < 1e-5, (text, source)
        row = {"shape": text, "config": config.label(), "cublas_us": round(cublas, 2),
               **{s: sorted(v)[len(v) // 2] for s, v in times.items()}, "all": times}
        rows.append(row)
        print(row, flush=True)
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
