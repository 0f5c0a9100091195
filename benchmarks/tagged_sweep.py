"""Tagged column folds (reduction.COLUMN_TAGGED, s14-col) under compute-sanitizer: the quick
tier's reduce cases of scripts/sanitize_sweep.py and split column reductions made for the
tagged fold (realigned and aligned rows, reversed and keepdims views, an int32 maximum, a
two-input dot, a float64 sum beside them on the shipped fold), each checked against float64
and called twice (the second call on the words the first left zeroed). $TAGGED (default 1):
the knob; $POLL: reduce_codegen.POLL_NANOSLEEP; $TAGTICKET, $TAGLOAD:
reduce_codegen.TAGGED_TICKET, TAGGED_LOAD.

    compute-sanitizer --tool memcheck python3 -P benchmarks/tagged_sweep.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

TREE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(TREE / "scripts"), str(TREE / "tests")]

import sanitize_sweep  # noqa: E402

import gpurt  # noqa: E402
from gpurt._elementwise import reduce_codegen, reduction  # noqa: E402


def main() -> None:
    reduction.COLUMN_TAGGED = bool(int(os.environ.get("TAGGED", "1")))
    reduce_codegen.POLL_NANOSLEEP = int(os.environ.get("POLL", "0"))
    reduce_codegen.TAGGED_TICKET = os.environ.get("TAGTICKET", "early")
    reduce_codegen.TAGGED_LOAD = os.environ.get("TAGLOAD", "relaxed")
    calls = sanitize_sweep.run_cases("quick", ("reduce",))
    rng = np.random.default_rng(14)
    total = gpurt.ReductionKernel("T x", "float32 y", "x", "a + b", "y = a", "0", "tag_sum",
                                  reduce_type="float32")
    wide = gpurt.ReductionKernel("T x", "float64 y", "x", "a + b", "y = a", "0", "tag_sum64",
                                 reduce_type="float64")
    most = gpurt.ReductionKernel("T x", "int32 y", "x", "max(a, b)", "y = a", "-2147483647",
                                 "tag_max", reduce_type="int32")
    dot = gpurt.ReductionKernel("T x, T w", "float32 y", "x * w", "a + b", "y = a", "0",
                                "tag_dot", reduce_type="float32")
    import ml_dtypes

    cases = [((4099, 1001), ml_dtypes.bfloat16, (slice(None), slice(None)), False),
             ((2047, 1003), np.float16, (slice(None), slice(1, None)), True),
             ((2100, 1040), np.float32, (slice(None), slice(None)), False),
             ((301, 1039), np.float32, (slice(None, None, -1), slice(2, None)), True),
             ((4099, 1001), np.float64, (slice(1, None), slice(1, None)), False)]
    for shape, dtype, index, keepdims in cases:
        x = rng.standard_normal(shape).astype(dtype)
        w = rng.standard_normal(shape).astype(dtype)
        ref, ref_w = x.astype(np.float64)[index], w.astype(np.float64)[index]
        dev, dev_w = gpurt.asarray(x)[index], gpurt.asarray(w)[index]
        kernel = wide if dtype == np.float64 else total
        for _ in range(2):
            for got, want in [(kernel(dev, axis=0, keepdims=keepdims),
                               ref.sum(0, keepdims=keepdims)),
                              (dot(dev, dev_w, axis=0, keepdims=keepdims),
                               (ref * ref_w).sum(0, keepdims=keepdims))]:
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-2)
                calls += 1
    ints = rng.integers(-1000, 1000, (3001, 515)).astype(np.int32)
    for _ in range(2):
        np.testing.assert_array_equal(most(gpurt.asarray(ints)[:, 1:], axis=0).numpy(),
                                      ints[:, 1:].max(0))
        calls += 1
    tagged = sum(bool(p.words_at) for k in (total, most, dot) for p in k._plans.values())
    print(f"calls: {calls}, tagged plans: {tagged}")
    print("tagged sweep: pass")


if __name__ == "__main__":
    main()
