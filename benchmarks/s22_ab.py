"""Session 22 (issue 17): gemm's host path with torch tensors against gpurt Arrays, steady state.

Per shape: host time per call over bursts of 100 calls queued behind a sleep kernel (median of
9 bursts), once before gpurt's allocator exists and once after, for gemm on gpurt Arrays, on
torch tensors, and torch.matmul; then cProfile call counts of 100 calls of each gemm variant,
printing the functions whose counts differ and the torch variant's costliest.

    python benchmarks/s22_ab.py [--shapes 97x4093x4099:fp32,16x4096x4096t:bf16]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

BURST = 100


def burst_us(torch: Any, fn: Callable[[int], Any], sets: int, reps: int = 9) -> float:
    samples = []
    for _ in range(reps):
        torch.cuda._sleep(40_000_000)  # ~20 ms: longer than a burst's host time
        t0 = time.perf_counter()
        for i in range(BURST):
            fn(i % sets)
        samples.append((time.perf_counter() - t0) / BURST * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def counts(torch: Any, fn: Callable[[int], Any], sets: int) -> dict[str, tuple[int, float]]:
    prof = cProfile.Profile()
    torch.cuda._sleep(40_000_000)
    prof.enable()
    for i in range(BURST):
        fn(i % sets)
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    return {f"{key[0].rsplit('/', 2)[-1]}:{key[1]}({key[2]})": (value[1], value[2] * 1e6 / BURST)
            for key, value in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="97x4093x4099:fp32,16x4096x4096t:bf16")
    args = parser.parse_args()
    import torch

    import gpurt
    from gpurt.kernels import gemm
    for item in args.shapes.split(","):
        one_shape(torch, gpurt, gemm, *item.split(":"))


def one_shape(torch: Any, gpurt: Any, gemm: Any, text: str, dt: str) -> None:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dt, torch.float32)
    m, n, k = (int(v) for v in text.rstrip("t").split("x"))
    sets = 3
    a = [torch.randn(m, k, device="cuda", dtype=dtype) for _ in range(sets)]
    if text.endswith("t"):
        b = [torch.randn(n, k, device="cuda", dtype=dtype).t() for _ in range(sets)]
    else:
        b = [torch.randn(k, n, device="cuda", dtype=dtype) for _ in range(sets)]
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    g: dict[str, Any] = {}
    variants: dict[str, Callable[[int], Any]] = {
        "torch tensors": lambda i: gemm(a[i], b[i], out=out),
        "gpurt Arrays": lambda i: gemm(g["a"][i], g["b"][i], out=g["out"]),
        "torch.matmul": lambda i: torch.matmul(a[i], b[i], out=out),
    }
    print(f"== {text} {dt}", flush=True)
    line = [f"{name} {burst_us(torch, variants[name], sets):.2f}"
            for name in ("torch tensors", "torch.matmul")]
    print("  first calls (no gpurt allocation yet?):", " | ".join(line), flush=True)
    g.update(a=[gpurt.asarray(x) for x in a], b=[gpurt.asarray(x) for x in b],
             out=gpurt.asarray(out))
    gpurt.empty(1)  # gpurt's allocator in use
    for _ in range(2):
        line = [f"{name} {burst_us(torch, fn, sets):.2f}" for name, fn in variants.items()]
        print("  us per call:", " | ".join(line), flush=True)
    seen = {name: counts(torch, variants[name], sets)
            for name in ("torch tensors", "gpurt Arrays")}
    ours, theirs = seen["torch tensors"], seen["gpurt Arrays"]
    for key in sorted(set(ours) | set(theirs)):
        c1, c2 = ours.get(key, (0, 0.0)), theirs.get(key, (0, 0.0))
        if c1[0] != c2[0]:
            print(f"  calls/100 torch {c1[0]:5d} arrays {c2[0]:5d}  {key}")
    print("  torch variant, costliest (us per gemm call under cProfile):")
    for key, (calls, us) in sorted(ours.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"    {us:7.2f} {calls:5d} {key}")


if __name__ == "__main__":
    main()
