"""Replay random allocation traces through torch's caching allocator and gpurt's, in one
fresh process, and compare every shared memory_stats() key and the segment layouts.

Run by tests/test_memory.py in a subprocess (fresh allocators, no stray tensors); also
usable by hand: ``python tests/memory_vs_torch.py [SEED ...]``. Set PYTORCH_CUDA_ALLOC_CONF
and GPURT_ALLOC_CONF to the same settings to compare configurations. Prints one JSON line:
{"ok": bool, "traces": n, "keys": n, "problems": [...]}.
"""

from __future__ import annotations

import json
import random
import sys

import torch

import gpurt

KiB, MiB = 1 << 10, 1 << 20


def make_trace(seed: int, length: int = 400) -> list[tuple[str, int]]:
    """alloc(size) / free(index into live list) / empty_cache, with realistic sizes."""
    rng = random.Random(seed)
    trace: list[tuple[str, int]] = []
    live = 0
    for _ in range(length):
        r = rng.random()
        if r < 0.5 or live == 0:
            band = rng.choice([(1, 2 * KiB), (2 * KiB, 600 * KiB), (600 * KiB, 1 * MiB + 8 * KiB),
                               (1 * MiB, 10 * MiB), (10 * MiB, 80 * MiB)])
            trace.append(("alloc", rng.randint(*band)))
            live += 1
        elif r < 0.98:
            trace.append(("free", rng.randrange(live)))
            live -= 1
        else:
            trace.append(("empty_cache", 0))
    return trace


def layout(segments: list[dict]) -> list:
    """Segments as comparable shapes: type, size and (size, state) of each block."""
    return sorted(
        (s["segment_type"], s["total_size"], tuple((b["size"], b["state"]) for b in s["blocks"]))
        for s in segments
    )


def replay(trace, alloc, free, empty_cache, stats, snapshot) -> list:
    live: list = []
    records = []
    for step, (op, arg) in enumerate(trace):
        if op == "alloc":
            live.append(alloc(arg))
        elif op == "free":
            free(live.pop(arg))
        else:
            empty_cache()
        if step % 10 == 9 or op == "empty_cache":
            records.append((step, stats(), layout(snapshot())))
    while live:
        free(live.pop())
    records.append((len(trace), stats(), layout(snapshot())))
    empty_cache()
    records.append((len(trace) + 1, stats(), layout(snapshot())))
    return records


def reset_torch() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()


def reset_gpurt() -> None:
    gpurt.synchronize()
    gpurt.empty_cache()
    gpurt.reset_peak_memory_stats()
    gpurt.reset_accumulated_memory_stats()


def torch_snapshot() -> list[dict]:
    return [s for s in torch.cuda.memory_snapshot() if s["device"] == 0]


def main(seeds: list[int]) -> dict:
    torch.cuda.init()
    gpurt.init()
    problems: list[str] = []
    shared: set[str] = set()
    for seed in seeds:
        trace = make_trace(seed)
        reset_torch()
        ours = None
        theirs = replay(
            trace,
            alloc=lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"),
            free=lambda t: None,  # dropping the tensor frees it
            empty_cache=torch.cuda.empty_cache,
            stats=torch.cuda.memory_stats,
            snapshot=torch_snapshot,
        )
        reset_gpurt()
        ours = replay(
            trace,
            alloc=gpurt.caching_allocator_alloc,
            free=gpurt.caching_allocator_delete,
            empty_cache=gpurt.empty_cache,
            stats=gpurt.memory_stats,
            snapshot=gpurt.memory_snapshot,
        )
        keys = set(theirs[0][1]) & set(ours[0][1])
        shared |= keys
        for (step, t_stats, t_layout), (_, g_stats, g_layout) in zip(theirs, ours):
            diff = {k: (t_stats[k], g_stats[k]) for k in sorted(keys) if t_stats[k] != g_stats[k]}
            if diff or t_layout != g_layout:
                problems.append(
                    f"seed {seed} step {step} op {trace[min(step, len(trace) - 1)]}: "
                    f"torch vs gpurt {diff}"
                    + ("" if t_layout == g_layout else f"; layouts differ: {t_layout} vs {g_layout}")
                )
                break
    missing = sorted(k for k in torch.cuda.memory_stats() if k not in gpurt.memory_stats())
    return {"ok": not problems, "traces": len(seeds), "keys": len(shared),
            "missing_in_gpurt": missing, "problems": problems[:5]}


if __name__ == "__main__":
    seeds = [int(s) for s in sys.argv[1:]] or list(range(4))
    print(json.dumps(main(seeds)))
