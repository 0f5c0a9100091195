"""Fragmentation: peak reserved memory with fixed and with expandable segments, gpurt and torch.

The trace is a transformer training loop whose batches have varying sequence lengths (the
case torch's expandable segments were made for): per step, the forward pass keeps every
layer's activations (whose sizes follow the sequence length, the attention scores with its
square), the backward pass frees them in reverse while making gradients, and the weight
gradients live on. With fixed segments, blocks cached for one step's sizes rarely fit the
next step's larger ones, so new segments pile up; expandable segments grow in place.

Each allocator replays the same trace from an empty cache, in this process: gpurt with
fixed segments, gpurt with ``expandable_segments:True`` (set at run time with
``gpurt.memory._set_allocator_settings``), and the same two settings of torch's caching
allocator. Rows: peak reserved and peak allocated MiB, their ratio (1.0 = no
fragmentation), driver allocations or page maps (``num_device_alloc``) and host
time of the replay. gpurt's statistics equal torch's, so both columns of a setting should
agree; the target is peak reserved with expandable segments well below fixed segments.

Without a GPU the allocator core runs over a host-memory stand-in backend (a CPU proxy).

    python benchmarks/bench_fragmentation.py [--json PATH] [--steps N]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from _common import HostBackend, peer, print_rows, write_results

MiB = 1 << 20
FIXED, EXPANDABLE = "expandable_segments:False", "expandable_segments:True"


def training_trace(steps: int = 24, seed: int = 0, hidden: int = 1024, layers: int = 8,
                   batch: int = 4, heads: int = 16, vocab: int = 32000
                   ) -> list[tuple[str, int, int]]:
    """(op, id, bytes) of a bf16 decoder's training steps at sequence lengths 128..2048."""
    rng = random.Random(seed)
    bf16, ffn = 2, 4 * hidden
    trace: list[tuple[str, int, int]] = []
    ids = iter(range(1 << 30))

    def alloc(nbytes: int) -> int:
        tid = next(ids)
        trace.append(("alloc", tid, nbytes))
        return tid

    def free(*tids: int) -> None:
        trace.extend(("free", tid, 0) for tid in tids)

    shapes = [hidden * 3 * hidden, hidden * hidden, hidden * ffn, ffn * hidden]
    weights = [alloc(n * bf16) for _ in range(layers) for n in shapes]
    weights.append(alloc(vocab * hidden * bf16))
    grads: list[int] = []
    for _ in range(steps):
        seq = rng.randrange(128, 2049, 64)
        tokens = batch * seq
        act = tokens * hidden * bf16
        x = alloc(act)
        saved = []
        for _layer in range(layers):  # forward: keep what backward needs
            qkv = alloc(3 * act)
            scores = alloc(batch * heads * seq * seq * bf16)
            attn = alloc(act)
            up = alloc(4 * act)
            gelu = alloc(4 * act)
            out = alloc(act)
            saved.append((x, qkv, scores, attn, up, gelu))
            x = out
        logits = alloc(tokens * vocab * bf16)
        grad = alloc(tokens * vocab * bf16)
        free(logits)
        dx = alloc(act)
        free(grad, x)
        for layer_saved in reversed(saved):  # backward: gradients in, activations out
            x_in, qkv, scores, attn, up, gelu = layer_saved
            d_gelu = alloc(4 * act)
            free(gelu)
            d_up = alloc(4 * act)
            free(up, d_gelu)
            d_attn = alloc(act)
            free(attn, d_up)
            d_scores = alloc(batch * heads * seq * seq * bf16)
            free(scores)
            d_qkv = alloc(3 * act)
            free(qkv, d_scores, d_attn)
            d_x = alloc(act)
            free(x_in, d_qkv, dx)
            dx = d_x
        free(dx)
        if not grads:  # weight gradients: made by the first backward, kept
            grads = [alloc(n * bf16) for _ in range(layers) for n in shapes]
    free(*grads, *weights)
    return trace


def replay(trace: list[tuple[str, int, int]], alloc: Callable[[int], Any],
           free: Callable[[Any], None]) -> float:
    """Replay the trace; host milliseconds it took."""
    live: dict[int, Any] = {}
    start = time.perf_counter()
    for op, tid, nbytes in trace:
        if op == "alloc":
            live[tid] = alloc(nbytes)
        else:
            free(live.pop(tid))
    return (time.perf_counter() - start) * 1e3


def _row(lib: str, setting: str, stats: dict[str, Any], ms: float) -> dict[str, Any]:
    reserved = stats["reserved_bytes.all.peak"]
    allocated = stats["allocated_bytes.all.peak"]
    return {"what": "training trace, varying sequence lengths",
            "segments": "expandable" if setting == EXPANDABLE else "fixed", "lib": lib,
            "peak_reserved_MiB": reserved / MiB, "peak_allocated_MiB": allocated / MiB,
            "reserved_per_allocated": reserved / allocated,
            "num_device_alloc": stats["num_device_alloc"], "replay_host_ms": ms}


def gpurt_rows(trace: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    import gpurt
    from gpurt import memory

    rows = []
    for setting in (FIXED, EXPANDABLE):
        gpurt.synchronize()
        gpurt.empty_cache()
        memory._set_allocator_settings(setting)
        gpurt.reset_peak_memory_stats()
        gpurt.reset_accumulated_memory_stats()
        ms = replay(trace, gpurt.caching_allocator_alloc, gpurt.caching_allocator_delete)
        rows.append(_row("gpurt", setting, gpurt.memory_stats(), ms))
        gpurt.empty_cache()
    memory._set_allocator_settings(FIXED)
    return rows


def torch_rows(trace: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    torch = peer("torch")
    if torch is None:
        return []
    rows = []
    for setting in (FIXED, EXPANDABLE):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings(setting)
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
        ms = replay(trace, lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"),
                    lambda t: None)  # dropping the tensor frees it
        rows.append(_row("torch", setting, torch.cuda.memory_stats(), ms))
        torch.cuda.empty_cache()
    torch.cuda.memory._set_allocator_settings(FIXED)
    return rows


def cpu_proxy_rows(trace: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    from gpurt._memory import stats as ms
    from gpurt._memory.allocator import CachingAllocator
    from gpurt._memory.config import parse

    rows = []
    for setting in (FIXED, EXPANDABLE):
        allocator = CachingAllocator(0, HostBackend(total=80 << 30), parse(setting))  # type: ignore[arg-type]
        took = replay(trace, lambda n, a=allocator: a.malloc(n, 0), allocator.free)
        rows.append(_row("gpurt (CPU proxy)", setting,
                         ms.flatten(allocator.nested_stats()), took))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write results here (default: "
                        "$GPURT_BENCH_OUT/fragmentation.json)")
    parser.add_argument("--steps", type=int, default=24, help="training steps in the trace")
    args = parser.parse_args()
    import gpurt

    trace = training_trace(args.steps)
    rows = gpurt_rows(trace) + torch_rows(trace) if gpurt.is_available() else \
        cpu_proxy_rows(trace)
    print_rows("fragmentation: fixed vs expandable segments", rows)
    write_results("fragmentation", rows, args.json)


if __name__ == "__main__":
    main()
