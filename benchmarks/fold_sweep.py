"""The column fold's variants (fold_codegen.py, s13-col) under compute-sanitizer: the quick
tier's reduce cases of scripts/sanitize_sweep.py and split column reductions made for the
variants (realigned and aligned rows, reversed and keepdims views, float64, an int32 maximum,
a two-input dot), each checked against float64, with reduction.FOLD_STAGE_BYTES from $STAGE
(default 32768) and reduction.FOLD_EARLY from $EARLY (default 1).

    compute-sanitizer --tool memcheck python3 -P benchmarks/fold_sweep.py
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
from gpurt._elementwise import reduction  # noqa: E402


def main() -> None:
    reduction.FOLD_STAGE_BYTES = int(os.environ.get("STAGE", "32768"))
    reduction.FOLD_EARLY = bool(int(os.environ.get("EARLY", "1")))
    calls = sanitize_sweep.run_cases("quick", ("reduce",))
    rng = np.random.default_rng(13)
    total = gpurt.ReductionKernel("T x", "float64 y", "x", "a + b", "y = a", "0", "fold_sum",
                                  reduce_type="float64")
    most = gpurt.ReductionKernel("T x", "int32 y", "x", "max(a, b)", "y = a", "-2147483647",
                                 "fold_max", reduce_type="int32")
    dot = gpurt.ReductionKernel("T x, T w", "float64 y", "x * w", "a + b", "y = a", "0",
                                "fold_dot", reduce_type="float64")
    import ml_dtypes

    cases = [((4099, 1001), ml_dtypes.bfloat16, (slice(None), slice(None)), False),
             ((2100, 1040), np.float32, (slice(None), slice(None)), False),
             ((301, 1039), np.float32, (slice(None, None, -1), slice(2, None)), True),
             ((4099, 1001), np.float64, (slice(1, None), slice(1, None)), False)]
    for shape, dtype, index, keepdims in cases:
        x = rng.standard_normal(shape).astype(dtype)
        w = rng.standard_normal(shape).astype(dtype)
        ref, ref_w = x.astype(np.float64)[index], w.astype(np.float64)[index]
        dev, dev_w = gpurt.asarray(x)[index], gpurt.asarray(w)[index]
        for got, want in [(total(dev, axis=0, keepdims=keepdims),
                           ref.sum(0, keepdims=keepdims)),
                          (dot(dev, dev_w, axis=0, keepdims=keepdims),
                           (ref * ref_w).sum(0, keepdims=keepdims))]:
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-3)
            calls += 1
    ints = rng.integers(-1000, 1000, (3001, 515)).astype(np.int32)
    np.testing.assert_array_equal(most(gpurt.asarray(ints)[:, 1:], axis=0).numpy(),
                                  ints[:, 1:].max(0))
    calls += 1
    print(f"calls: {calls}")
    print("fold sweep: pass")


if __name__ == "__main__":
    main()
