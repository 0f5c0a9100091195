"""Session 22 (issue 17): the host cost of handing gemm torch tensors, piece by piece.

Host time per call (perf_counter, median of bursts; gemm bursts queued behind a sleep kernel
so that the launch queue never waits on the GPU) of: torch's own accessors, gpurt.asarray of a
torch tensor, gemm's out check, and gemm with each operand given as a torch tensor or as a
gpurt Array, with the garbage collector on and off; the collector's runs counted.

    python benchmarks/s22_intake.py [--shape 97x4093x4099] [--dtype fp32]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


def per_call_us(fn: Callable[[], Any], count: int = 2000, reps: int = 7) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        samples.append((time.perf_counter() - t0) / count * 1e6)
    return statistics.median(samples)


def burst_us(torch: Any, fn: Callable[[int], Any], sets: int, reps: int = 21) -> float:
    samples = []
    for _ in range(reps):
        torch.cuda._sleep(8_000_000)
        t0 = time.perf_counter()
        for i in range(16):
            fn(i % sets)
        samples.append((time.perf_counter() - t0) / 16 * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="97x4093x4099")
    parser.add_argument("--dtype", default="fp32")
    args = parser.parse_args()
    import torch

    import gpurt
    from gpurt.kernels import _gemm_plan as plans
    from gpurt.kernels import gemm
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.dtype, torch.float32)
    m, n, k = (int(v) for v in args.shape.rstrip("t").split("x"))
    sets = 4
    a = [torch.randn(m, k, device="cuda", dtype=dtype) for _ in range(sets)]
    b = [torch.randn(k, n, device="cuda", dtype=dtype) for _ in range(sets)]
    if args.shape.endswith("t"):
        b = [torch.randn(n, k, device="cuda", dtype=dtype).t() for _ in range(sets)]
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    ga, gb, gout = [gpurt.asarray(x) for x in a], [gpurt.asarray(x) for x in b], \
        gpurt.asarray(out)
    t = a[0]
    raw = torch._C._cuda_getCurrentRawStream
    pieces: dict[str, Callable[[], Any]] = {
        "t.dtype": lambda: t.dtype,
        "t.is_cuda": lambda: t.is_cuda,
        "t.requires_grad": lambda: t.requires_grad,
        "t.is_neg()": lambda: t.is_neg(),
        "t.get_device()": lambda: t.get_device(),
        "t.shape": lambda: t.shape,
        "t.stride()": lambda: t.stride(),
        "t.data_ptr()": lambda: t.data_ptr(),
        "raw_stream(0)": lambda: raw(0),
        "gpurt.asarray(t)": lambda: gpurt.asarray(t),
        "plans.as_array(t)": lambda: plans.as_array(t, "a"),
        "plans.matching(out)": lambda: plans.matching(out, "out", m, n, ga[0]),
        "gpurt.current_device()": gpurt.current_device,
        "gpurt.current_stream()": gpurt.current_stream,
    }
    for name, fn in pieces.items():
        print(f"{name:28s} {per_call_us(fn):8.3f} us", flush=True)
    variants: dict[str, Callable[[int], Any]] = {
        "gemm(Array, Array, out=Array)": lambda i: gemm(ga[i], gb[i], out=gout),
        "gemm(torch, Array, out=Array)": lambda i: gemm(a[i], gb[i], out=gout),
        "gemm(Array, torch, out=Array)": lambda i: gemm(ga[i], b[i], out=gout),
        "gemm(Array, Array, out=torch)": lambda i: gemm(ga[i], gb[i], out=out),
        "gemm(torch, torch, out=torch)": lambda i: gemm(a[i], b[i], out=out),
        "gemm(torch, torch) same set": lambda i: gemm(a[0], b[0], out=out),
        "gemm(Array, Array) same set": lambda i: gemm(ga[0], gb[0], out=gout),
        "torch.matmul(out=)": lambda i: torch.matmul(a[i], b[i], out=out),
        "torch.mm(out=)": lambda i: torch.mm(a[i], b[i], out=out),
    }
    for fn in variants.values():
        for i in range(sets):
            fn(i)
    torch.cuda.synchronize()
    for collector in ("gc on", "gc off"):
        if collector == "gc off":
            gc.disable()
        for name, fn in variants.items():
            before = sum(s["collections"] for s in gc.get_stats())
            us = burst_us(torch, fn, sets)
            runs = sum(s["collections"] for s in gc.get_stats()) - before
            print(f"{collector} {name:32s} {us:8.2f} us  (gc runs {runs})", flush=True)
        gc.enable()


if __name__ == "__main__":
    main()
