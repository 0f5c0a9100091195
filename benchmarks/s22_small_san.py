"""Exact fp32 gemm at gemm's own choices (tuner off) for problems under 2^24 multiply-adds,
which split K in powers of two down to one K tile a slice (some slices empty: 100x300x100 and
200^3 split 8), and for x @ W.T at M <= 4 (rowload's dot products), B also a view 1-3 floats in,
beta with C in; each against float64 on a poisoned output (PASS / FAIL): for
compute-sanitizer (memcheck, racecheck, synccheck) on the GPU machine.

    GPURT_GEMM_AUTOTUNE=0 compute-sanitizer --tool memcheck python benchmarks/s22_small_san.py
"""

from __future__ import annotations

import importlib

import numpy as np

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")

# (M, N, K, B given N x K)
SHAPES = [(64, 64, 64, False), (128, 128, 128, True), (100, 300, 100, False),
          (127, 257, 61, False), (127, 257, 61, True), (200, 200, 200, False),
          (33, 65, 4097, True), (64, 127, 255, False), (1, 1000, 3001, True),
          (3, 515, 1025, True), (4, 300, 4096, True)]


def main() -> None:
    rng = np.random.default_rng(22)
    for m, n, k, trans_b in SHAPES:
        for offset in (0, 3):
            rows, cols = (n, k) if trans_b else (k, n)
            a = rng.standard_normal((m, k)).astype(np.float32)
            b_full = rng.standard_normal((rows, cols + 4)).astype(np.float32)
            c = rng.standard_normal((m, n)).astype(np.float32)
            out = gpurt.empty((m, n), dtype=np.float32)
            out.fill_(np.nan)
            b_view = gpurt.asarray(b_full)[:, offset:offset + cols]
            gemm_mod.gemm(gpurt.asarray(a), b_view, out=out, trans_b=trans_b, alpha=0.5,
                          beta=2.0, c=gpurt.asarray(c))
            b = b_full[:, offset:offset + cols].astype(np.float64)
            want = 0.5 * (a.astype(np.float64) @ (b.T if trans_b else b)) + 2.0 * c
            got = out.numpy().astype(np.float64)
            err = np.linalg.norm(got - want) / np.linalg.norm(want) \
                if np.isfinite(got).all() else np.inf
            config = [e[0] for e in gemm_mod._calls.values()][-1].config.label()
            print(("PASS " if err < 1e-5 else "FAIL ") + f"{m}x{n}x{k} trans_b={trans_b} "
                  f"+{offset} {config}: {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
