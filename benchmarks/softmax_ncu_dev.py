"""Issue 17 profiling helper (s10-soft16): launch the chooser's pick for one case
``--launches`` times on the same inputs, for ncu to profile one of the launches
(benchmarks/softmax_routes_dev.sh softprofile; benchmarks/ncu_timeline.py reads the
PM-sampling timeline from the report).

    python benchmarks/softmax_ncu_dev.py [--rows 64] [--cols 1000003] [--dtype bfloat16]
        [--op softmax] [--launches 3] [--tune N]

``--tune``: the pick's launch form with softmax_ticket's TUNE bits N (Variant.tune; ticket
chunks only, s15-soft1w).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib

import ml_dtypes
import numpy as np

import gpurt

sm = importlib.import_module("gpurt.kernels.softmax")
plan = importlib.import_module("gpurt.kernels._softmax_plan")
OPS = {"softmax": plan.SOFTMAX, "log_softmax": plan.LOG_SOFTMAX,
       "softmax_backward": plan.SOFTMAX_BACKWARD,
       "log_softmax_backward": plan.LOG_SOFTMAX_BACKWARD}
DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
          "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--cols", type=int, default=1_000_003)
    parser.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    parser.add_argument("--op", default="softmax", choices=tuple(OPS))
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--tune", type=int, default=0)
    args = parser.parse_args()
    dtype, op = DTYPES[args.dtype], OPS[args.op]
    variant = sm.launch_form(plan.choose_variant(args.cols, dtype, op, rows=args.rows),
                             args.rows, args.cols, gpurt.current_device())
    if args.tune:
        variant = dataclasses.replace(variant, tune=args.tune)
    rng = np.random.default_rng(17)
    shape = (args.rows, args.cols)
    arrays = [gpurt.asarray(rng.standard_normal(shape).astype(dtype))
              for _ in range(2 if op >= plan.SOFTMAX_BACKWARD else 1)]
    out = gpurt.empty(shape, dtype)
    call = sm.plan_variant(variant, arrays, out, plan.RowsView(*shape), gpurt.current_device())
    for _ in range(args.launches):
        call.launch(arrays[0], arrays[-1], out, None)
    gpurt.synchronize()
    print(variant.names()[0], "launched", args.launches, "times")


if __name__ == "__main__":
    main()
