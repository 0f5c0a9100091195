"""The caching allocator: malloc+free speed and fragmentation, gpurt against its peers.

Speed (host time per malloc+free of a cached block, median, microseconds), in this process:
  gpurt          caching_allocator_alloc + caching_allocator_delete (target <= 1.0 us)
  gpurt core     the same allocator called directly (no device/stream lookup)
  gpurt.empty    gpurt.empty(n, uint8) + del, when gpurt.array is there
  cupy pool      MemoryPool.malloc + drop;   cupy.empty + del
  torch          torch.empty(n, uint8, device="cuda") + del
  cuMemAllocAsync + cuMemFreeAsync on one stream (the driver's own pool)
  cuda.core      Device().allocate + Buffer.close
Fragmentation: peak reserved and allocated bytes for the same transformer-inference-like
trace (weights, KV caches grown by reallocation, per-layer activations, logits) replayed
through gpurt and torch; gpurt's peak reserved must not be higher.

Without a GPU the allocator core runs over a host-memory stand-in backend, as a CPU proxy.

    python benchmarks/bench_memory.py [--json PATH]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import HostBackend, host_us, peer, print_rows, write_results

KiB, MiB = 1 << 10, 1 << 20
SIZES = ((4 * KiB, "4 KiB"), (1 * MiB, "1 MiB"), (64 * MiB, "64 MiB"))


def _row(what: str, lib: str, fn: Callable[[], Any]) -> dict[str, Any]:
    fn()  # the first call may create a segment; measure the cached path
    return {"what": what, "lib": lib, "host_us": host_us(fn, number=5000, repeat=15, warmup=500)}


def core_rows(allocator: Any, lib: str) -> list[dict[str, Any]]:
    rows = []
    malloc, free = allocator.malloc, allocator.free
    for n, label in SIZES:
        rows.append(_row(f"alloc+free {label}", lib, lambda n=n: free(malloc(n, 0))))
    return rows


def gpu_speed_rows() -> list[dict[str, Any]]:
    from cuda.bindings import driver as cu

    import gpurt
    from gpurt.device import bind_context

    gpurt.init()
    rows: list[dict[str, Any]] = []
    alloc, delete = gpurt.caching_allocator_alloc, gpurt.caching_allocator_delete
    for n, label in SIZES:
        row = _row(f"alloc+free {label}", "gpurt", lambda n=n: delete(alloc(n)))
        row["meets_1us_target"] = row["host_us"] <= 1.0
        rows.append(row)
    allocator = gpurt.memory._allocator()
    rows += core_rows(allocator, "gpurt core")
    if hasattr(gpurt, "empty"):
        for n, label in SIZES:
            rows.append(_row(f"alloc+free {label}", "gpurt.empty+del",
                             lambda n=n: gpurt.empty(n, np.uint8)))
    cupy = peer("cupy")
    if cupy is not None:
        pool = cupy.cuda.MemoryPool()
        for n, label in SIZES:
            rows.append(_row(f"alloc+free {label}", "cupy pool", lambda n=n: pool.malloc(n)))
            rows.append(_row(f"alloc+free {label}", "cupy.empty+del",
                             lambda n=n: cupy.empty(n, dtype=cupy.uint8)))
    torch = peer("torch")
    if torch is not None:
        for n, label in SIZES:
            rows.append(_row(f"alloc+free {label}", "torch.empty+del",
                             lambda n=n: torch.empty(n, dtype=torch.uint8, device="cuda")))
    bind_context(0)
    stream = cu.cuStreamCreate(1)[1]
    for n, label in SIZES:
        def async_pair(n: int = n) -> None:
            ptr = cu.cuMemAllocAsync(n, stream)[1]
            cu.cuMemFreeAsync(ptr, stream)
        rows.append(_row(f"alloc+free {label}", "cuMemAllocAsync+FreeAsync", async_pair))
    cu.cuStreamSynchronize(stream)
    device_cls = None
    for name in ("cuda.core", "cuda.core.experimental"):
        if peer(name) is not None:
            device_cls = getattr(sys.modules[name], "Device", None)
            if device_cls is not None:
                break
    if device_cls is not None:
        dev = device_cls()
        dev.set_current()
        core_stream = dev.create_stream()  # cuda.core >= 1.2 asks for the allocation stream
        for n, label in SIZES:
            rows.append(_row(f"alloc+free {label}", "cuda.core allocate+close",
                             lambda n=n: dev.allocate(n, stream=core_stream).close()))
    bind_context(0)
    return rows


def transformer_trace(seed: int = 0, hidden: int = 2048, layers: int = 8,
                      requests: int = 10) -> list[tuple[str, int, int]]:
    """(op, id, bytes) for an fp16 decoder serving requests of varying batch and length:
    weights once, then per request a prefill and decode steps whose KV caches grow by
    reallocation (allocate the bigger cache, then free the old one)."""
    rng = random.Random(seed)
    ffn, vocab, heads, fp16 = 4 * hidden, 32000, 16, 2
    trace: list[tuple[str, int, int]] = []
    ids = iter(range(1 << 30))

    def alloc(nbytes: int) -> int:
        tid = next(ids)
        trace.append(("alloc", tid, nbytes))
        return tid

    def free(tid: int) -> None:
        trace.append(("free", tid, 0))

    weights = [alloc(n * fp16) for _ in range(layers)
               for n in (hidden * 3 * hidden, hidden * hidden, hidden * ffn * 2, ffn * hidden)]
    weights.append(alloc(vocab * hidden * fp16))
    for _ in range(requests):
        batch, prompt, new = rng.choice([1, 2, 4, 8]), rng.randint(16, 512), rng.randint(8, 48)
        caches = [alloc(batch * prompt * 2 * hidden * fp16) for _ in range(layers)]
        x = alloc(batch * prompt * hidden * fp16)
        for _layer in range(layers):  # prefill
            qkv = alloc(batch * prompt * 3 * hidden * fp16)
            scores = alloc(batch * heads * prompt * prompt * fp16)
            attn = alloc(batch * prompt * hidden * fp16)
            free(scores)
            free(qkv)
            up = alloc(batch * prompt * ffn * 2 * fp16)
            down = alloc(batch * prompt * hidden * fp16)
            free(up)
            free(attn)
            free(x)
            x = down
        free(x)
        for step in range(new):  # decode, one token at a time
            length = prompt + step + 1
            h = alloc(batch * hidden * fp16)
            for layer in range(layers):
                grown = alloc(batch * length * 2 * hidden * fp16)
                free(caches[layer])
                caches[layer] = grown
                qkv = alloc(batch * 3 * hidden * fp16)
                scores = alloc(batch * heads * length * fp16)
                out = alloc(batch * hidden * fp16)
                free(scores)
                free(qkv)
                up = alloc(batch * ffn * 2 * fp16)
                down = alloc(batch * hidden * fp16)
                free(up)
                free(out)
                free(h)
                h = down
            logits = alloc(batch * vocab * 4)
            free(logits)
            free(h)
        for cache in caches:
            free(cache)
    for w in weights:
        free(w)
    return trace


def replay(trace: list[tuple[str, int, int]], alloc: Callable[[int], Any],
           free: Callable[[Any], None]) -> None:
    live: dict[int, Any] = {}
    for op, tid, nbytes in trace:
        if op == "alloc":
            live[tid] = alloc(nbytes)
        else:
            free(live.pop(tid))


def fragmentation_rows(trace: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    import gpurt

    rows = []
    torch = peer("torch")
    if torch is not None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        replay(trace, lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"), lambda t: None)
        rows.append({"what": "transformer trace", "lib": "torch",
                     "peak_reserved_MiB": torch.cuda.max_memory_reserved() / MiB,
                     "peak_allocated_MiB": torch.cuda.max_memory_allocated() / MiB})
        torch.cuda.empty_cache()
    gpurt.empty_cache()
    gpurt.reset_peak_memory_stats()
    replay(trace, gpurt.caching_allocator_alloc, gpurt.caching_allocator_delete)
    ours = {"what": "transformer trace", "lib": "gpurt",
            "peak_reserved_MiB": gpurt.max_memory_reserved() / MiB,
            "peak_allocated_MiB": gpurt.max_memory_allocated() / MiB}
    if rows:  # the target: no more reserved than torch for the same trace
        ours["not_above_torch"] = ours["peak_reserved_MiB"] <= rows[0]["peak_reserved_MiB"]
    rows.append(ours)
    gpurt.empty_cache()
    return rows


def cpu_proxy_rows(trace: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    from gpurt._memory import stats as _memstats
    from gpurt._memory.allocator import CachingAllocator
    from gpurt._memory.config import AllocatorConfig

    allocator = CachingAllocator(0, HostBackend(), AllocatorConfig())
    rows = core_rows(allocator, "gpurt core (CPU proxy)")
    fresh = CachingAllocator(0, HostBackend(), AllocatorConfig())
    replay(trace, lambda n: fresh.malloc(n, 0), fresh.free)
    stats = _memstats.flatten(fresh.nested_stats())
    rows.append({"what": "transformer trace", "lib": "gpurt (CPU proxy)",
                 "peak_reserved_MiB": stats["reserved_bytes.all.peak"] / MiB,
                 "peak_allocated_MiB": stats["allocated_bytes.all.peak"] / MiB})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write results here (default: $GPURT_BENCH_OUT/memory.json)")
    args = parser.parse_args()
    import gpurt

    trace = transformer_trace()
    if gpurt.is_available():
        rows = gpu_speed_rows() + fragmentation_rows(trace)
    else:
        rows = cpu_proxy_rows(trace)
    print_rows("caching allocator", rows)
    write_results("memory", rows, args.json)


if __name__ == "__main__":
    main()
