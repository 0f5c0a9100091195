"""Replay random allocation traces through torch's caching allocator or gpurt's and record
every memory_stats() and the segment layouts along the way.

tests/test_memory.py runs this twice, ``torch`` and ``gpurt``, each in a fresh process (a
fresh CUDA context, so both see the driver hand out addresses in the same order, which
decides ties between equally good cached blocks), then compares the records: every shared
statistic key and every segment layout must be equal. Set PYTORCH_CUDA_ALLOC_CONF and
GPURT_ALLOC_CONF to the same settings to compare configurations. By hand:

    python tests/memory_vs_torch.py torch 0 1 2 > torch.json
    python tests/memory_vs_torch.py gpurt 0 1 2 > gpurt.json
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from typing import Any

KiB, MiB = 1 << 10, 1 << 20


def make_trace(seed: int, length: int = 400) -> list[tuple[str, int]]:
    """alloc(size) / free(index into the live list) / empty_cache, with realistic sizes; a
    temporary freed is often made again with the same size (gpurt's parked-block path)."""
    rng = random.Random(seed)
    trace: list[tuple[str, int]] = []
    sizes: list[int] = []  # of the live allocations, in the replay's order
    for _ in range(length):
        r = rng.random()
        if r < 0.5 or not sizes:
            band = rng.choice([(1, 2 * KiB), (2 * KiB, 600 * KiB), (600 * KiB, 1 * MiB + 8 * KiB),
                               (1 * MiB, 10 * MiB), (10 * MiB, 80 * MiB)])
            sizes.append(rng.randint(*band))
            trace.append(("alloc", sizes[-1]))
        elif r < 0.8:
            index = rng.randrange(len(sizes))
            sizes.pop(index)
            trace.append(("free", index))
        elif r < 0.98:
            size = sizes.pop()
            trace.append(("free", len(sizes)))  # the newest: the pattern of temporaries
            for _ in range(rng.choice([0, 0, 1, 3])):  # ... made and dropped again
                trace += [("alloc", size), ("free", len(sizes))]
        else:
            trace.append(("empty_cache", 0))
    return trace


def layout(segments: list[dict]) -> list:
    """Segments as comparable shapes: type, size and (size, state) of each block."""
    return sorted(
        [s["segment_type"], s["total_size"], [[b["size"], b["state"]] for b in s["blocks"]]]
        for s in segments
    )


def replay(trace: list[tuple[str, int]], alloc: Callable[[int], Any],
           free: Callable[[Any], None], empty_cache: Callable[[], None],
           stats: Callable[[], dict], snapshot: Callable[[], list]) -> list:
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
            records.append([step, dict(stats()), layout(snapshot())])
    while live:
        free(live.pop())
    records.append([len(trace), dict(stats()), layout(snapshot())])
    empty_cache()
    records.append([len(trace) + 1, dict(stats()), layout(snapshot())])
    return records


def run_torch(seeds: list[int]) -> list:
    import torch

    torch.cuda.init()
    out = []
    for seed in seeds:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
        out.append(replay(
            make_trace(seed),
            alloc=lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"),
            free=lambda t: None,  # dropping the tensor frees it
            empty_cache=torch.cuda.empty_cache,
            stats=torch.cuda.memory_stats,
            snapshot=lambda: [s for s in torch.cuda.memory_snapshot() if s["device"] == 0],
        ))
    return out


def run_gpurt(seeds: list[int]) -> list:
    import gpurt

    gpurt.init()
    out = []
    for seed in seeds:
        gpurt.synchronize()
        gpurt.empty_cache()
        gpurt.reset_peak_memory_stats()
        gpurt.reset_accumulated_memory_stats()
        out.append(replay(
            make_trace(seed),
            alloc=gpurt.caching_allocator_alloc,
            free=gpurt.caching_allocator_delete,
            empty_cache=gpurt.empty_cache,
            stats=gpurt.memory_stats,
            snapshot=gpurt.memory_snapshot,
        ))
    return out


def compare(seeds: list[int], theirs: list, ours: list) -> dict:
    """{"ok", "keys", "missing_in_gpurt", "problems"} for records of the same seeds."""
    problems: list[str] = []
    shared: set[str] = set()
    missing: set[str] = set()
    for seed, t_records, g_records in zip(seeds, theirs, ours):
        trace = make_trace(seed)
        for (step, t_stats, t_layout), (_, g_stats, g_layout) in zip(t_records, g_records):
            keys = set(t_stats) & set(g_stats)
            shared |= keys
            missing |= set(t_stats) - set(g_stats)
            diff = {k: (t_stats[k], g_stats[k]) for k in sorted(keys) if t_stats[k] != g_stats[k]}
            if diff or t_layout != g_layout:
                where = trace[min(step, len(trace) - 1)]
                text = f"seed {seed} step {step} (op {where}): torch vs gpurt {diff}"
                if t_layout != g_layout:
                    text += f"; layouts differ: {t_layout} vs {g_layout}"
                problems.append(text)
                break
    return {"ok": not problems, "keys": len(shared), "missing_in_gpurt": sorted(missing),
            "problems": problems[:5]}


if __name__ == "__main__":
    which, seeds = sys.argv[1], [int(s) for s in sys.argv[2:]] or list(range(4))
    print(json.dumps(run_torch(seeds) if which == "torch" else run_gpurt(seeds)))
