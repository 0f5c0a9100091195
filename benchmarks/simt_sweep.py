"""The fp32 SIMT GEMM variants side by side with cuBLAS, in one process (notes_gemm.md).

Each variant (a kernels/_gemm_tune.py Config, forced with ``config=``) is first checked
against a float64 product on fresh random inputs in every operand layout, on edge shapes,
unaligned (non-VEC) rows and split-K, into NaN-poisoned outputs; then timed at the square
sizes beside torch.matmul (fp32, TF32 off) with bench_gemm's Timer (a batch of calls queued
behind a spin kernel, median of samples). Prints one line per result as it goes and a table
last; ``--json`` keeps every row.

    python benchmarks/simt_sweep.py [--sizes 2048,4096,8192] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import multiprocessing
import sys
from typing import Any

from bench_gemm import Timer

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
plans = importlib.import_module("gpurt.kernels._gemm_plan")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

VARIANTS = [
    *tune._SIMT,
    Config("simt", 128, 256, 16, 32, 128, stages=4),
    Config("simt", 128, 256, 8, 32, 128, stages=4),
    Config("simt", 256, 128, 16, 32, 128, stages=3),
    Config("simt", 128, 256, 16, 32, 128, stages=3, group_m=16),
    Config("simt", 128, 256, 16, 32, 128, stages=3, group_m=4),
]
# (m, n, k, trans_a, trans_b, split_k): every layout with edges in M, N and K; odd leading
# dimensions (4-byte copies only); a K shorter than one tile; split-K with a partial slice
CASES = [(296, 520, 200, ta, tb, 1) for ta in (False, True) for tb in (False, True)] + [
    (127, 257, 61, False, False, 1), (129, 67, 37, True, True, 1), (33, 130, 5, False, True, 1),
    (200, 136, 1000, False, False, 3), (1, 1, 1, False, False, 1)]


def _compile_one(job: tuple[Config, bool, bool, bool, str]) -> None:
    config, a_k, b_k, vec, arch = job
    problem = tune.Problem(1, 1, 1, tune.DT_F32, a_k, b_k, vec, False, (9, 0), 1)
    gemm_launch.compile_kernels(config.source, gemm_launch.kernel_names(config, problem), arch)


def precompile(configs: list[Config], arch: str) -> None:
    """Fills the disk cache with every layout of every variant, one process per CPU (NVRTC
    takes about a second per variant and layout)."""
    layouts = list(itertools.product((False, True), repeat=3))  # A K-major, B K-major, VEC
    jobs = [(c, *flags, arch) for c in configs for flags in layouts]
    with multiprocessing.get_context("spawn").Pool() as pool:
        pool.map(_compile_one, jobs)


def _card() -> str:
    """The SM clock and power draw now (NVML), or why not."""
    try:
        return f"SM clock {gpurt.clock_rate()} MHz, {gpurt.power_draw() / 1000:.0f} W"
    except Exception as exc:  # NVML missing or refused: the sweep goes on
        return f"(no NVML: {exc})"


def check(config: Any, gen: Any, torch: Any) -> float:
    """The worst relative error of ``config`` over CASES (inf: a NaN or an exception)."""
    worst = 0.0
    for m, n, k, ta, tb, split in CASES:
        a = torch.randn((k, m) if ta else (m, k), device="cuda", generator=gen)
        b = torch.randn((n, k) if tb else (k, n), device="cuda", generator=gen)
        out = torch.full((m, n), float("nan"), device="cuda")
        gemm_mod.gemm(a, b, out=out, trans_a=ta, trans_b=tb, stream=torch.cuda.current_stream(),
                      config=dataclasses.replace(config, split_k=split))
        ref = (a.double().T if ta else a.double()) @ (b.double().T if tb else b.double())
        err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
        worst = max(worst, err if err == err else float("inf"))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2048,4096,8192")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    precompile(VARIANTS, gpurt.get_arch())
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(1)
    stream = gpurt.Stream()
    timer = Timer(gpurt, stream)
    rows: list[dict[str, Any]] = []
    good = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for config in VARIANTS:
            try:
                err = check(config, gen, torch)
            except Exception as exc:  # report and go on
                err = float("inf")
                print(f"{config.label()}: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
            torch.cuda.synchronize()
            print(f"check {config.label():36s} worst err {err:.3g} "
                  f"{'ok' if err < 1e-5 else 'WRONG'}", flush=True)
            if err < 1e-5:
                good.append(config)
        for size in (int(s) for s in args.sizes.split(",")):
            a = torch.randn(size, size, device="cuda", generator=gen)
            b = torch.randn(size, size, device="cuda", generator=gen)
            out = torch.empty(size, size, device="cuda")
            ga, gb, gout = gpurt.asarray(a), gpurt.asarray(b), gpurt.asarray(out)
            flops = 2.0 * size ** 3
            batch = max(1, min(20, int(4e11 / flops)))
            ref = a.double() @ b.double()
            cublas = timer.ms(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), batch,
                              args.repeat)
            first = len(rows)
            for config in good:
                ms = timer.ms(lambda ga=ga, gb=gb, gout=gout, config=config: gemm_mod.gemm(
                    ga, gb, out=gout, stream=stream, config=config), batch, args.repeat)
                err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
                plan = plans.make_plan(ga, gb, gout, 0.0, None, False, False, stream)[0]
                names = gemm_launch.kernel_names(config, plans.problem_of(plan, False))
                kernel = gemm_launch.compile_kernels(config.source, names, gpurt.get_arch())[0]
                rows.append({"size": size, "config": config.label(), "ms": ms,
                             "tflops": round(flops / ms / 1e9, 2),
                             "cublas_tflops": round(flops / cublas / 1e9, 2),
                             "ratio": round(cublas / ms, 3), "err": float(f"{err:.3g}"),
                             "regs": kernel.num_regs, "blocks_per_sm":
                             kernel.max_active_blocks_per_multiprocessor(
                                 config.threads, config.shared_mem(True, False, 4))})
                print(rows[-1], _card(), flush=True)
            # cuBLAS again after the variants (clocks drift as the card warms): the ratios
            # use its faster time
            again = timer.ms(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), batch,
                             args.repeat)
            print(f"cuBLAS {size}: {flops / cublas / 1e9:.1f} then {flops / again / 1e9:.1f} "
                  "TFLOP/s", flush=True)
            for row in rows[first:]:
                best = min(cublas, again)
                row["cublas_tflops"] = round(flops / best / 1e9, 2)
                row["ratio"] = round(best / row["ms"], 3)
            del a, b, out, ga, gb, gout, ref
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": gpurt.get_device_name(), "rows": rows}, fh, indent=1)
    print(f"\n{'size':>5} {'config':36s} {'TFLOP/s':>8} {'cuBLAS':>7} {'ratio':>6} regs CTAs/SM")
    for row in rows:
        print(f"{row['size']:5d} {row['config']:36s} {row['tflops']:8.1f} "
              f"{row['cublas_tflops']:7.1f} {row['ratio']:6.3f} {row['regs']:4d} "
              f"{row['blocks_per_sm']}")
    sys.exit(0 if len(good) == len(VARIANTS) else 1)


if __name__ == "__main__":
    main()
