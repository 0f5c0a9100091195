"""The GEMM tuner with and without its rotating buffer (tunable.set_rotating_buffer_size):
which config each picks, and how both picks run with warm operands (bench_gemm's timing:
a batch of calls on the same A and B behind a spin kernel) and with cold ones (bench_gemm_
decode's: 20 calls in a CUDA graph rotating over copies of A and B that exceed the L2),
against cuBLAS timed the same two ways in the same process.

    python benchmarks/tuner_rotating_dev.py [--shapes 8192x8192x512,1000] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
from typing import Any

import bench_gemm
import bench_gemm_decode as cold
from _common import print_rows, write_results

SHAPES = "8192x8192x512,1000,1024,2000x3000x1000,3000,4096x4096x1024,2048,4096,3000x5000x2000"


def pick(gemm_mod: Any, tunable: Any, ga: Any, gb: Any, gout: Any, stream: Any,
         rotating: int, folder: str) -> Any:
    """The config the tuner picks with this rotating buffer size, from a fresh results file."""
    tunable.set_filename(os.path.join(folder, f"rotating{rotating}.json"))
    tunable.set_rotating_buffer_size(rotating)
    gemm_mod.gemm(ga, gb, out=gout, stream=stream)
    plans = importlib.import_module("gpurt.kernels._gemm_plan")
    choosing = importlib.import_module("gpurt.kernels._gemm_choose")
    plan, _, _ = plans.make_plan(ga, gb, gout, 0.0, None, False, False, stream)
    return choosing.choose(plan, plans.problem_of(plan, False), stream)


def measure(gpurt: Any, torch: Any, gemm_mod: Any, tunable: Any, timer: Any, stream: Any,
            shape: tuple[int, int, int], repeat: int, folder: str) -> dict[str, Any]:
    """One shape's row: both picks, each timed warm and cold, as multiples of cuBLAS."""
    m, n, k = shape
    p = cold.Problem(gpurt, torch, m, n, k, torch.bfloat16, False,
                     torch.cuda.get_device_properties(0).L2_cache_size)
    ga, gb, gout = p.ga[0], p.gb[0], p.gout
    picks = {r: pick(gemm_mod, tunable, ga, gb, gout, stream, r, folder) for r in (0, -1)}
    batch = max(1, min(50, int(1e11 / (m * n * k))))
    warm_cublas = timer.ms(lambda: torch.matmul(p.a[0], p.b[0], out=p.out), batch, repeat)
    cold_cublas = cold.torch_graph_us(torch, p, repeat)
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}"}
    for rotating, config in picks.items():
        name = "rotating" if rotating else "warm"
        warm_ms = timer.ms(lambda c=config: gemm_mod.gemm(ga, gb, out=gout, stream=stream,
                                                           config=c), batch, repeat)
        cold_us = cold.gpurt_graph_us(gpurt, gemm_mod.gemm, p, config, repeat, torch)
        row[f"{name}_tuner_pick"] = config.label()
        row[f"{name}_pick_vs_cublas_warm"] = round(warm_cublas / warm_ms, 3)
        row[f"{name}_pick_vs_cublas_cold"] = round(cold_cublas / cold_us, 3)
    p.out.fill_(float("nan"))
    torch.cuda.synchronize()
    gemm_mod.gemm(ga, gb, out=gout, stream=stream)
    stream.synchronize()
    row["rel_err"] = float(f"{p.rel_error(torch):.3g}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    import gpurt

    gemm_mod = importlib.import_module("gpurt.kernels.gemm")
    tunable = importlib.import_module("gpurt.kernels.tunable")
    stream = gpurt.Stream()
    timer = bench_gemm.Timer(gpurt, stream)
    rows: list[dict[str, Any]] = []
    folder = tempfile.mkdtemp()
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for shape in bench_gemm.parse_shapes(args.shapes):
            rows.append(measure(gpurt, torch, gemm_mod, tunable, timer, stream, shape,
                                args.repeat, folder))
            print(rows[-1], flush=True)
            write_results("tuner_rotating", rows, args.json)
    print_rows("the tuner's pick without / with its rotating buffer, x cuBLAS", rows)


if __name__ == "__main__":
    main()
