"""softmax() on a few 16-bit forward shapes whose launches take the tuned softmax_ends and
softmax_ticket forms (session 15), each checked against float64: for compute-sanitizer
(memcheck, racecheck, synccheck) on the GPU machine.

    compute-sanitizer --tool racecheck python benchmarks/softmax_ends_san.py [CASE ...]

CASE: indices into CASES (default: all).
"""

from __future__ import annotations

import importlib
import sys

import ml_dtypes
import numpy as np

import gpurt

sm = importlib.import_module("gpurt.kernels.softmax")
CASES = [(140, 131_075, ml_dtypes.bfloat16, "softmax"), (140, 131_075, np.float16, "log_softmax"),
         (40, 200_003, ml_dtypes.bfloat16, "softmax")]


def main() -> None:
    rng = np.random.default_rng(15)
    for rows, cols, dtype, name in [CASES[int(i)] for i in sys.argv[1:]] or CASES:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        y = getattr(sm, name)(gpurt.asarray(x.astype(dtype)))
        got = y.numpy().astype(np.float64) if hasattr(y, "numpy") else np.asarray(y)
        xs = x.astype(dtype).astype(np.float64)
        e = np.exp(xs - xs.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
        if name == "log_softmax":
            want = np.log(want)
        err = float(np.abs(got - want).max())
        print(f"{rows}x{cols} {np.dtype(dtype).name} {name}: max error {err:.2e}", flush=True)
        assert err < 0.05, err


if __name__ == "__main__":
    main()
