"""Dev harness for the bandwidth kernels (issues 19, 20, 17), one process, timed like the
benchmarks (benchmarks/_common.Timer: busy L2-evicting memset before each call, median):

  random   every bench_random case, plus a write-only ceiling (cuMemsetD32 of the same bytes)
           and uniform/normal float32 with the grid scaled (resident CTAs x 1/2, 1, 2)
  reduce   the bench_elementwise reductions under code-generation variants (unrolls, waves
           of split blocks, splits folded by their last block or a finish kernel), each
           result checked against torch in float64
  elementwise  the bench_elementwise unary and binary cases (float32, bfloat16, float16)
           under contiguous-walk variants (unroll, waves of resident blocks)
  softmax  bf16 backward rows of 32k-64k: the chooser's variant before and after the
           512-thread shape (benchmarks/softmax_edges_dev.routes)

    python benchmarks/bandwidth_dev.py [--json PATH] [--areas random,reduce,elementwise,softmax]
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any

import bench_elementwise
import bench_random
from _common import Timer, copy_gbps, peer

import gpurt
from gpurt._elementwise import codegen, reduce_codegen, reduction
from gpurt._random import kernels as rkernels

# (row unroll, column unroll, waves of split blocks); run 1 (H200) compared unrolls and waves
# (the first is the code before this work, the second the pick); run 2 also a column walk with
# 16-byte loads, 4 outputs a thread (worse: 1024x65536 77.8% against 84.8%), since removed
# session 5: (row unroll, column unroll, row waves, column waves, FOLD: the split's last
# block folds instead of a finish kernel); run 1 (H100) also tried (4, 8, 1, 1, False) and
# column unroll 16
REDUCE_VARIANTS = [(4, 8, 1, 1, True), (4, 8, 1, 2, True), (4, 8, 1, 3, True),
                   (4, 8, 1, 4, True), (4, 4, 1, 2, True), (4, 4, 1, 4, True),
                   (4, 8, 1, 2, False)]
# random.cu variants (macros) timed on randint int64 and int32
# (run 2 on an H100: GPURT_RNG_SPREAD_STORE, 512 contiguous bytes per store instruction,
# moved randint int64 from 80% to 102% of copy; now the store)
RANDOM_DEFINES: list[str] = []
# contiguous elementwise walk: (UNROLL, WAVES); the first is the walk before session 5; runs
# 1-2 (H100) also tried unroll 8, waves 1-2 (worse) and cache operators on the vector
# accesses (evict-first stores: no change; evict-first loads: worse), since removed
EW_VARIANTS = [(4, 0), (1, 0), (2, 0), (1, 0), (4, 0)]


def _ok(result: tuple) -> Any:
    if int(result[0]) != 0:
        raise RuntimeError(f"driver call failed: {result[0]!r}")
    return result[1] if len(result) == 2 else None


def random_rows(timer: Timer, copy: float, torch: Any) -> list[dict[str, Any]]:
    from cuda.bindings import driver as cu

    rows = bench_random.measure(timer, copy, torch)
    nbytes = bench_random.N * 4
    scratch = gpurt.empty(bench_random.N, "float32")
    ms = timer.ms(lambda: _ok(cu.cuMemsetD32Async(scratch.ptr, 7, bench_random.N, timer.handle)))
    rows.append({"op": "memset (write-only ceiling)", "dtype": "float32",
                 "gpurt_GBps": nbytes / ms / 1e6, "pct_copy": 100 * nbytes / ms / 1e6 / copy})
    for define in RANDOM_DEFINES:  # random.cu compiled with a dev macro
        saved = rkernels.source
        rkernels.source = lambda d=define, s=saved: f"#define {d}\n" + s()
        rkernels._kernels.clear()
        try:
            for op, dtype in [("randint", bench_random.I64), ("randint", bench_random.I32)]:
                out = gpurt.empty(bench_random.N, dtype)
                call = bench_random.gpurt_call(op, out, None, None, timer.handle)
                gbps = bench_random.N * dtype.itemsize / timer.ms(call) / 1e6
                rows.append({"op": f"{op} with {define}", "dtype": dtype.name,
                             "gpurt_GBps": gbps, "pct_copy": 100 * gbps / copy})
        finally:
            rkernels.source = saved
            rkernels._kernels.clear()
    original = rkernels.grid_for
    for scale in (0.5, 2.0):
        def scaled(kernel: Any, device: int, chunks: int, scale: float = scale) -> int:
            return max(1, int(original(kernel, device, 1 << 40) * scale))

        rkernels.grid_for = scaled
        try:
            for op in ("uniform", "normal"):
                out = gpurt.empty(bench_random.N, "float32")
                call = bench_random.gpurt_call(op, out, None, None, timer.handle)
                gbps = nbytes / timer.ms(call) / 1e6
                rows.append({"op": f"{op} grid x{scale}", "dtype": "float32", "gpurt_GBps": gbps,
                             "pct_copy": 100 * gbps / copy})
        finally:
            rkernels.grid_for = original
    return rows


def reduce_rows(timer: Timer, copy: float, torch: Any) -> list[dict[str, Any]]:
    cases = [c for c in bench_elementwise._bandwidth_cases(torch) if c[1] in ("row", "column")]
    rows = []
    defaults = (reduce_codegen.ROW_UNROLL, reduce_codegen.COLUMN_UNROLL, reduction.SPLIT_WAVES,
                reduction.COLUMN_SPLIT_WAVES, reduction.FOLD)
    for index, variant in enumerate(REDUCE_VARIANTS):
        row_unroll, column_unroll, waves, column_waves, fold = variant
        reduce_codegen.ROW_UNROLL, reduce_codegen.COLUMN_UNROLL = row_unroll, column_unroll
        reduction.SPLIT_WAVES, reduction.COLUMN_SPLIT_WAVES = waves, column_waves
        reduction.FOLD = fold
        kernel = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0",
                                       f"dev_sum{index}")
        with gpurt.stream(gpurt.ExternalStream(timer.handle)):
            for what, kind, make, _, theirs, nbytes, _ in cases:
                tensors = make()
                arrays = [gpurt.asarray(t) for t in tensors]
                axis = 0 if kind == "column" else -1
                call = functools.partial(kernel, arrays[0], arrays[1], axis=axis)
                tensors[1].fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                want = tensors[0].double().sum(axis)
                err = float(((tensors[1].double() - want).abs() /
                             (tensors[0].double().abs().sum(axis) + 1e-30)).max())
                gbps = nbytes / timer.ms(call) / 1e6
                torch_gbps = nbytes / timer.ms(functools.partial(theirs, tensors)) / 1e6
                rows.append({"variant": f"unroll {row_unroll}/{column_unroll} waves "
                                        f"{waves}/{column_waves} fold {fold}",
                             "what": what, "gpurt_GBps": round(gbps, 1),
                             "torch_GBps": round(torch_gbps, 1),
                             "pct_copy": round(100 * gbps / copy, 1),
                             "vs_torch": round(gbps / torch_gbps, 3), "rel_err": err})
                print(json.dumps(rows[-1]), flush=True)
                del tensors, arrays
    reduce_codegen.ROW_UNROLL, reduce_codegen.COLUMN_UNROLL = defaults[:2]
    reduction.SPLIT_WAVES, reduction.COLUMN_SPLIT_WAVES, reduction.FOLD = defaults[2:]
    return rows


def elementwise_rows(timer: Timer, copy: float, torch: Any) -> list[dict[str, Any]]:
    """z = x * 2 and z = x * 2 + y over 64 Mi elements per EW_VARIANTS, torch once per case;
    every variant's output checked against torch's."""
    n = bench_elementwise.BIG
    names = ("UNROLL", "WAVES")
    defaults = tuple(getattr(codegen, name) for name in names)
    cases = []
    for tdt in (torch.float32, torch.bfloat16, torch.float16):
        x, y = torch.randn(n, device="cuda", dtype=tdt), torch.randn(n, device="cuda", dtype=tdt)
        z = torch.empty_like(x)
        item = x.element_size()
        cases.append((f"x*2 {tdt}", (x, z), lambda t: torch.mul(t[0], 2, out=t[1]),
                      2 * n * item, 1))
        cases.append((f"x*2+y {tdt}", (x, y, z), lambda t: torch.add(t[1], t[0], alpha=2,
                                                                       out=t[2]),
                      3 * n * item, 2))
    rows = []
    with gpurt.stream(gpurt.ExternalStream(timer.handle)):
        torch_gbps = {what: nbytes / timer.ms(functools.partial(theirs, tensors)) / 1e6
                      for what, tensors, theirs, nbytes, _ in cases}
        for index, variant in enumerate(EW_VARIANTS):
            for name, value in zip(names, variant):
                setattr(codegen, name, value)
            unary = gpurt.ElementwiseKernel("T x", "T z", "z = x * 2", f"dev_scale{index}")
            binary = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y",
                                             f"dev_axpy{index}")
            for what, tensors, theirs, nbytes, inputs in cases:
                arrays = [gpurt.asarray(t) for t in tensors]
                call = functools.partial(unary if inputs == 1 else binary, *arrays)
                tensors[-1].fill_(float("nan"))
                call()
                got = tensors[-1].clone()
                theirs(tensors)
                exact = bool(torch.equal(got, tensors[-1]))
                gbps = nbytes / timer.ms(call) / 1e6
                rows.append({"variant": "unroll {} waves {}".format(*variant), "what": what,
                             "gpurt_GBps": round(gbps, 1),
                             "torch_GBps": round(torch_gbps[what], 1),
                             "pct_copy": round(100 * gbps / copy, 1),
                             "vs_torch": round(gbps / torch_gbps[what], 3),
                             "equal_torch": exact})
                print(json.dumps(rows[-1]), flush=True)
    for name, value in zip(names, defaults):
        setattr(codegen, name, value)
    return rows


def softmax_rows(timer: Timer, copy: float, torch: Any) -> list[dict[str, Any]]:
    """16-bit backward rows: the chooser's pick before the 512-thread shape and now."""
    import softmax_edges_dev as dev
    from bench_softmax import BF16

    plan = dev.plan
    routes = {}
    for cols, op in [(40000, plan.SOFTMAX_BACKWARD), (50257, plan.SOFTMAX_BACKWARD),
                     (65536, plan.SOFTMAX_BACKWARD), (50257, plan.LOG_SOFTMAX_BACKWARD)]:
        now = plan.choose_variant(cols, BF16, op)
        saved = plan.LONG_ROWS[op, 2]
        plan.LONG_ROWS[op, 2] = saved[1:]  # without _WIDE16_BACKWARD
        try:
            before = plan.choose_variant(cols, BF16, op)
        finally:
            plan.LONG_ROWS[op, 2] = saved
        name = {v: k for k, v in dev.OPS.items()}[op]
        routes[cols, BF16, name] = [before, now]
    dev.ROUTES = routes
    return dev.routes(timer, copy, torch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--areas", default="random,reduce,softmax")
    args = parser.parse_args()
    torch = peer("torch")
    handle = int(torch.cuda.current_stream().cuda_stream)
    timer = Timer(handle, repeat=20)
    copy = copy_gbps(timer)
    found: dict[str, Any] = {"device": gpurt.get_device_name(), "copy_GBps": copy}
    areas = {"random": random_rows, "reduce": reduce_rows, "softmax": softmax_rows,
             "elementwise": elementwise_rows}
    for area in args.areas.split(","):
        try:
            found[area] = areas[area](timer, copy, torch)
        except Exception as exc:  # the other areas still run and report
            found[area] = f"failed: {type(exc).__name__}: {exc}"
        print(f"== {area} on {found['device']} (copy {copy:.0f} GB/s)")
        for row in found[area] if isinstance(found[area], list) else [found[area]]:
            print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(found, fh, indent=1)


if __name__ == "__main__":
    main()
