"""Dev harness for the bandwidth kernels (issues 19, 20, 17), one process, timed like the
benchmarks (benchmarks/_common.Timer: busy L2-evicting read before each call, median):

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
from gpurt._elementwise import codegen, counters, realign_codegen, reduce_codegen, reduction
from gpurt._random import kernels as rkernels

# Session 8 (s8-colodd, s8-colfold; issue 20): "fit" (COLUMN_SPLIT_FIT), "keep"
# (counters.KEEP), "batch" (reduce_codegen.FOLD_BATCH), "tree"/"from" (reduction.
# COLUMN_FOLD_TREE/_FROM), "cap" (reduce_codegen.COLUMN_MIN_BLOCKS) shipped; their runs' rows are
# in results/bandwidth-dev-s8-*-nvidia-h100.json. Session 9 (s9-colsum): where a split column
# sum's fixed 6-7 us go. "walk": the split kernel alone, its partials folded by nobody (FOLD
# off, the finish kernel not launched; results checked before with the finish kernel): the
# walk's time without the fold; "fold": reduction.FOLD (False: walk + finish kernel);
# "ticket": reduce_codegen.TICKET (how a split block takes the fold's ticket: "all" threads
# fence, thread 0 alone ("one"), thread 0's acq_rel atomic ("acqrel")). "odd": only the
# odd-width shapes; "rows": also the rows. "treewidth": reduction.COLUMN_TREE_WIDTH (added after
# the run: 0 = the code before; the run's "width": 16 rows give its tall shapes' numbers).
# Rows of s9-colsum's H100 run: results/bandwidth-dev-s9-colsum-nvidia-h100.json. Session 10
# (s10-colwalk): the realigned walk's edges and loop; its run's rows (the variants of the time,
# with the walk's generator before the session swapped in as "before") are in
# results/bandwidth-dev-s10-colwalk-nvidia-h100.json. "batchfrom": realign_codegen.
# REALIGN_BATCH_FROM (the realigned loop as whole batches of loads where a vector holds at
# least this many elements; 1: everywhere, 0: nowhere). "twins": also aligned shapes of the
# odd ones' bytes (4096x8192 bfloat16 reached only 82.5% of copy there). Session 13
# (s13-col): "s13": only S13_SHAPES (the shapes in every float dtype); the session's
# fold variants (staged in shared memory, an early ticket: both lost, removed; branch s13-col
# at 444f161) and their rows: results/bandwidth-dev-s13-col-nvidia-h100.json. Session 14
# (s14-col): "s14": only S14_SHAPES; the session's variants (tagged partials polled by a folder
# chosen by an early or late ticket, a fitted shared-memory carveout: all lost on the issue's
# odd shapes, removed; branch s14-col at 2377f6b, benchmarks/col_dev.sh) and their rows:
# results/bandwidth-dev-s14-col-{1,2}-nvidia-h100.json.
_BASE = {"width": 32, "vector": 4, "unroll": 4, "waves": 1, "least": 32, "spread": 4,
         "realign": 16, "all": False, "fit": True, "keep": True, "batch": 8, "tree": 16,
         "from": 32, "cap": 8, "fold": True, "ticket": "acqrel", "treewidth": 16,
         "batchfrom": 8}
REDUCE_VARIANTS = [
    {**_BASE, "s14": True},  # main (the shipped defaults)
    {**_BASE, "s14": True},  # main again: the run's noise
]
# Session 20 (`--set s20`): tall column sums of 16-bit rows of odd width (65536x1023 bfloat16,
# 82% of copy: the one column sum under 85% of a copy of its own bytes) under the walk's width
# (8: one-level folds of ~twice the column blocks), one-level folds of every split, and fewer
# splits; main first and last.
S20_VARIANTS = [
    {**_BASE, "s20": True},
    {**_BASE, "s20": True, "treewidth": 8},
    {**_BASE, "s20": True, "tree": 0},
    {**_BASE, "s20": True, "least": 64},
    {**_BASE, "s20": True, "treewidth": 8, "least": 64},
    {**_BASE, "s20": True, "treewidth": 8, "tree": 0},
    {**_BASE, "s20": True},
]
_KNOBS = {"width": (reduce_codegen, "COLUMN_WIDTH"),
          "vector": (reduction, "COLUMN_VECTOR_BYTES"),
          "unroll": (reduce_codegen, "COLUMN_UNROLL"),
          "waves": (reduction, "COLUMN_SPLIT_WAVES"),
          "least": (reduction, "COLUMN_SPLIT_LEAST"),
          "spread": (reduction, "COLUMN_SPREAD_BYTES"),
          "realign": (reduction, "COLUMN_REALIGN_BYTES"),
          "all": (reduction, "COLUMN_REALIGN_ALL"),
          "fit": (reduction, "COLUMN_SPLIT_FIT"),
          "keep": (counters, "KEEP"),
          "batch": (reduce_codegen, "FOLD_BATCH"),
          "tree": (reduction, "COLUMN_FOLD_TREE"),
          "from": (reduction, "COLUMN_FOLD_TREE_FROM"),
          "cap": (reduce_codegen, "COLUMN_MIN_BLOCKS"),
          "fold": (reduction, "FOLD"),
          "ticket": (reduce_codegen, "TICKET"),
          "treewidth": (reduction, "COLUMN_TREE_WIDTH"),
          "batchfrom": (realign_codegen, "REALIGN_BATCH_FROM")}
# (rows, cols, axis, dtype name): row sums run only under variants with "rows"
REDUCE_SHAPES = [(8192, 8192, -1, "float32"), (65536, 1024, -1, "float32"),
                 (1, 1 << 26, -1, "float32"), (8192, 8192, 0, "float32"),
                 (1024, 65536, 0, "float32"), (65536, 1024, 0, "float32"),
                 (8192, 8192, 0, "bfloat16"), (1024, 65536, 0, "bfloat16"),
                 (4099, 8191, 0, "float32"), (4099, 8191, 0, "bfloat16"),
                 (4099, 8191, 0, "float16"), (2047, 10007, 0, "float32"),
                 (2047, 10007, 0, "bfloat16"), (65536, 1023, 0, "float32"),
                 (65536, 1023, 0, "bfloat16"), (1023, 65537, 0, "float32"),
                 (1023, 65537, 0, "bfloat16")]
# aligned shapes of about the odd ones' bytes: run under variants with "twins"
TWIN_SHAPES = [(4096, 8192, 0, "float32"), (4096, 8192, 0, "bfloat16"),
               (4096, 8192, 0, "float16"), (2048, 10000, 0, "bfloat16"),
               (65536, 1024, 0, "bfloat16")]
S13_SHAPES = [(r, c, 0, dt) for r, c in ((4099, 8191), (2047, 10007), (4096, 8192),
                                         (65536, 1023), (8192, 8192), (1023, 65537))
              for dt in ("float32", "bfloat16", "float16")]
S14_SHAPES = [(r, c, 0, dt) for r, c in ((4099, 8191), (2047, 10007)) for dt in
              ("float32", "bfloat16", "float16")] + \
    [(r, c, 0, dt) for r, c in ((8192, 8192), (1024, 65536)) for dt in ("float32", "bfloat16")] + \
    [(4096, 8192, 0, "bfloat16"), (65536, 1023, 0, "bfloat16")]
S20_SHAPES = [(65536, 1023, 0, "bfloat16"), (65536, 1023, 0, "float16"),
              (65536, 1023, 0, "float32"), (131072, 1023, 0, "bfloat16"),
              (32768, 2047, 0, "bfloat16"), (65536, 1024, 0, "bfloat16"),
              (4099, 8191, 0, "bfloat16")]
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


def _reduce_case(torch: Any, rows: int, cols: int, axis: int, dtype: str) -> tuple:
    tdt = getattr(torch, dtype)
    x = torch.randn(rows, cols, device="cuda", dtype=tdt)
    out = torch.empty(cols if axis == 0 else rows, device="cuda", dtype=tdt)
    return x, out


def reduce_rows(timer: Timer, copy: float, torch: Any) -> list[dict[str, Any]]:
    """Each REDUCE_VARIANTS setting over REDUCE_SHAPES, checked against float64; torch once
    per shape."""
    rows = []
    saved = {name: getattr(*where) for name, where in _KNOBS.items()}
    torch_gbps = {}
    for index, variant in enumerate(REDUCE_VARIANTS):
        for name, (module, attr) in _KNOBS.items():
            setattr(module, attr, variant[name])
        kernel = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0",
                                       f"dev_sum{index}")
        with gpurt.stream(gpurt.ExternalStream(timer.handle)):
            shapes = S20_SHAPES if variant.get("s20") else S14_SHAPES if variant.get("s14") \
                else S13_SHAPES if variant.get("s13") \
                else REDUCE_SHAPES + (TWIN_SHAPES if variant.get("twins") else [])
            for shape in shapes:
                if shape[2] != 0 and not variant.get("rows"):
                    continue
                if variant.get("odd") and shape[1] % 8 == 0 and shape not in TWIN_SHAPES:
                    continue
                rows.append(_reduce_row(timer, copy, torch, kernel, shape, torch_gbps, variant))
                print(json.dumps(rows[-1]), flush=True)
    for name, (module, attr) in _KNOBS.items():
        setattr(module, attr, saved[name])
    return rows


def _reduce_row(timer: Timer, copy: float, torch: Any, kernel: Any, shape: tuple,
                torch_gbps: dict, variant: dict) -> dict[str, Any]:
    rows_, cols, axis, dtype = shape
    x, out = _reduce_case(torch, *shape)
    nbytes = x.numel() * x.element_size()
    gx, gout = gpurt.asarray(x), gpurt.asarray(out)
    call = functools.partial(kernel, gx, gout, axis=axis)
    errs = []
    for _ in range(2):  # twice: the second call finds the counters as the first left them
        out.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        want = x.double().sum(axis)
        errs.append(float(((out.double() - want).abs() /
                           (x.double().abs().sum(axis) + 1e-30)).max()))
    plan = list(kernel._plans.values())[-1] if getattr(kernel, "_plans", None) else None
    if variant.get("walk") and plan is not None and plan.splits > 1 and not plan.fold:
        plan.launches = (plan.launches[0], lambda *args: None)  # the finish kernel skipped
    gbps = nbytes / timer.ms(call) / 1e6
    if shape not in torch_gbps:
        theirs = functools.partial(torch.sum, x, axis, out=out)
        torch_gbps[shape] = nbytes / timer.ms(theirs) / 1e6
    return {"variant": variant, "what": f"sum({axis}) {rows_}x{cols} {dtype}",
            "gpurt_GBps": round(gbps, 1), "torch_GBps": round(torch_gbps[shape], 1),
            "pct_copy": round(100 * gbps / copy, 1),
            "vs_torch": round(gbps / torch_gbps[shape], 3), "rel_err": max(errs),
            "plan": None if plan is None else [plan.grid, plan.splits]}


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
    parser.add_argument("--set", default="", help="s20: the reduce area's S20_VARIANTS")
    args = parser.parse_args()
    if args.set == "s20":
        REDUCE_VARIANTS[:] = S20_VARIANTS
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
