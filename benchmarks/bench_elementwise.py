"""Elementwise and reduction kernels from a line of code (gpurt.ElementwiseKernel,
ReductionKernel, jiterator) against torch's own ops, in one process.

Host time per call: small arrays (kernels of a few microseconds), calls back to back in
batches of BATCH after warm-up, the device synchronized between batches (outside the timed
region); a sample is one batch's wall time per call, the row is the median of REPEAT
samples, gpurt and torch alternating batch by batch (as benchmarks/bench_dispatch.py).

Bandwidth: large contiguous arrays, bytes = each input read once + each output written once,
device time from driver events around each call on one stream (median), a 512 MiB read before
every timed call (L2 evicted and clean, host launch time hidden; benchmarks/_common.Timer),
next to torch's equivalent single-kernel op and a 1 GiB device-to-device copy (the copy
bandwidth) timed the same way, and a copy moving the row's own bytes in one launch
(``samecopy``: what one launch of that size can reach). Issue 20's targets: host time <=
torch's op; binary ops >= 90% of copy and >= torch; reductions >= 85% of copy and >= torch.

    python benchmarks/bench_elementwise.py [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import Timer, bandwidth_timer, copy_gbps, print_rows, write_results

import gpurt

BATCH = 100
REPEAT = 21
BIG = 1 << 26  # elements of the large elementwise arrays
# (rows, cols, axis, dtype) of the bandwidth reductions: rows, columns (aligned, tall, wide,
# odd widths: square-ish, tall, wide), the single long row
REDUCTIONS = [(8192, 8192, -1, "float32"), (65536, 1024, -1, "float32"),
              (8192, 8192, 0, "float32"), (1024, 65536, 0, "float32"),
              (65536, 1024, 0, "float32"), (4099, 8191, 0, "float32"),
              (8192, 8192, 0, "bfloat16"), (1024, 65536, 0, "bfloat16"),
              (4099, 8191, 0, "bfloat16"), (4099, 8191, 0, "float16"),
              (2047, 10007, 0, "float32"), (65536, 1023, 0, "float32"),
              (1023, 65537, 0, "bfloat16"), (1, BIG, -1, "float32"),
              # the two column sums furthest from the copy (issue 20): 16-bit, odd widths
              (2047, 10007, 0, "bfloat16"), (65536, 1023, 0, "bfloat16")]

AXPY = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "bench_axpy")
SCALE = gpurt.ElementwiseKernel("T x", "T z", "z = x * 2", "bench_scale")
SUM = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "bench_sum")
JIT_AXPY = gpurt.jiterator._create_jit_fn(
    "template <typename T> T bench_jaxpy(T x, T y) { return x * T(2) + y; }")


def _ok(result: tuple) -> Any:
    if int(result[0]) != 0:
        raise RuntimeError(f"driver call failed: {result[0]!r}")
    return result[1] if len(result) == 2 else None


# ---- host time ---------------------------------------------------------------------------------


def _per_call(fn: Callable[[], Any], sync: Callable[[], Any]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(BATCH):
        fn()
    elapsed = time.perf_counter() - t0
    sync()
    return elapsed / BATCH * 1e6


def side_by_side(ours: Callable[[], Any], theirs: Callable[[], Any],
                 sync: Callable[[], Any]) -> tuple[float, float]:
    """Median us per call of ``ours`` and ``theirs``, measured in alternating batches."""
    for _ in range(3):
        _per_call(ours, sync)
        _per_call(theirs, sync)
    a, b = [], []
    for _ in range(REPEAT):
        a.append(_per_call(ours, sync))
        b.append(_per_call(theirs, sync))
    return statistics.median(a), statistics.median(b)


def host_rows(torch: Any) -> list[dict[str, Any]]:
    sync = torch.cuda.synchronize
    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    m = torch.randn(32, 1000, device="cuda")
    gx, gy, gm = gpurt.asarray(x), gpurt.asarray(y), gpurt.asarray(m)
    torch_jit = torch.cuda.jiterator._create_jit_fn(
        "template <typename T> T bench_tjaxpy(T x, T y) { return x * T(2) + y; }")
    cases = [
        ("x * 2 + y (1000 f32): ElementwiseKernel, gpurt Arrays", lambda: AXPY(gx, gy),
         lambda: x * 2 + y, "x * 2 + y"),
        ("x * 2 + y (1000 f32): ElementwiseKernel, torch tensors", lambda: AXPY(x, y),
         lambda: x * 2 + y, "x * 2 + y"),
        ("x * 2 + y (1000 f32): jiterator, gpurt Arrays", lambda: JIT_AXPY(gx, gy),
         lambda: torch_jit(x, y), "torch jiterator"),
        ("x * 2 + y (1000 f32): jiterator, torch tensors", lambda: JIT_AXPY(x, y),
         lambda: torch_jit(x, y), "torch jiterator"),
        ("x.sum(-1) (32x1000 f32): ReductionKernel, gpurt Arrays", lambda: SUM(gm, axis=-1),
         lambda: m.sum(-1), "x.sum(-1)"),
        ("x.sum(-1) (32x1000 f32): ReductionKernel, torch tensors", lambda: SUM(m, axis=-1),
         lambda: m.sum(-1), "x.sum(-1)"),
    ]
    rows = []
    for what, ours, theirs, torch_op in cases:
        a, b = side_by_side(ours, theirs, sync)
        rows.append({"what": what, "torch op": torch_op, "unit": "us (host)",
                     "gpurt": round(a, 3), "torch": round(b, 3), "gpurt/torch": round(a / b, 3),
                     "target (gpurt/peer <=)": 1.0})
    return rows


# ---- bandwidth ---------------------------------------------------------------------------------




def _bandwidth_cases(torch: Any) -> list[tuple[Any, ...]]:
    """(what, kind, make inputs, gpurt call, torch call, bytes, target % of copy)."""
    cases: list[tuple[Any, ...]] = []
    for tdt in (torch.float32, torch.bfloat16):
        def unary(tdt: Any = tdt) -> tuple[Any, ...]:
            x = torch.randn(BIG, device="cuda", dtype=tdt)
            return x, torch.empty_like(x)

        def binary(tdt: Any = tdt) -> tuple[Any, ...]:
            x = torch.randn(BIG, device="cuda", dtype=tdt)
            return x, torch.randn(BIG, device="cuda", dtype=tdt), torch.empty_like(x)

        item = torch.tensor([], dtype=tdt).element_size()
        name = str(tdt).replace("torch.", "")
        cases.append((f"z = x * 2, {BIG} {name}", "unary", unary,
                      lambda g: SCALE(g[0], g[1]),
                      lambda t: torch.mul(t[0], 2, out=t[1]), 2 * BIG * item, 90))
        cases.append((f"z = x * 2 + y, {BIG} {name}", "binary", binary,
                      lambda g: AXPY(g[0], g[1], g[2]),
                      lambda t: torch.add(t[1], t[0], alpha=2, out=t[2]), 3 * BIG * item, 90))
    for rows, cols, axis, name in REDUCTIONS:
        tdt = getattr(torch, name)

        def reduce_inputs(rows: int = rows, cols: int = cols, axis: int = axis,
                          tdt: Any = tdt) -> tuple:
            x = torch.randn(rows, cols, device="cuda", dtype=tdt)
            return x, torch.empty(cols if axis == 0 else rows, device="cuda", dtype=tdt)

        kind = "row" if axis == -1 else "column"
        item = torch.tensor([], dtype=tdt).element_size()
        cases.append((f"x.sum({axis}), {rows}x{cols} {name}", kind, reduce_inputs,
                      lambda g, axis=axis: SUM(g[0], g[1], axis=axis),
                      lambda t, axis=axis: torch.sum(t[0], axis, out=t[1]),
                      rows * cols * item, 85))
    return cases


def bandwidth_rows(torch: Any, timer: Timer, copy: float) -> list[dict[str, Any]]:
    rows = []
    with gpurt.stream(gpurt.ExternalStream(timer.handle)):
        for what, kind, make, ours, theirs, nbytes, target in _bandwidth_cases(torch):
            tensors = make()
            arrays = [gpurt.asarray(t) for t in tensors]
            gbps = nbytes / timer.ms(functools.partial(ours, arrays)) / 1e6
            torch_gbps = nbytes / timer.ms(functools.partial(theirs, tensors)) / 1e6
            same = copy_gbps(timer, max(1, nbytes // 2))  # one copy launch moving these bytes
            rows.append({"what": what, "kind": kind, "gpurt_GBps": round(gbps, 1),
                         "torch_GBps": round(torch_gbps, 1), "copy_GBps": round(copy, 1),
                         "samecopy_GBps": round(same, 1), "pct_copy": round(100 * gbps / copy, 1),
                         "pct_samecopy": round(100 * gbps / same, 1),
                         "vs_torch": round(gbps / torch_gbps, 3), "target_pct": target,
                         "meets_target": gbps >= target / 100 * copy and gbps >= torch_gbps})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    setup = bandwidth_timer("elementwise", args.json, 15 if args.quick else 40,
                            need_torch=True)
    if setup is None:
        return
    timer, torch = setup
    copy = copy_gbps(timer)
    rows = bandwidth_rows(torch, timer, copy)
    print_rows(f"elementwise/reductions on {gpurt.get_device_name()}: GB/s, copy {copy:.0f} GB/s",
               rows)
    host = host_rows(torch)
    print_rows(f"host time per call on {gpurt.get_device_name()}", host)
    write_results("elementwise", host + rows, args.json)


if __name__ == "__main__":
    main()
