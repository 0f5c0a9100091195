"""Exact fp32 gemm through every simt tile on small odd shapes (kernels/gemm_simt.cu: the
4-byte copies of rows not 16-byte aligned, K-major copies of 4 to 8 rows a thread, split-K's
padded partial rows), B a view at element offsets 0 and 3, A given K x M and B N x K too, each
against float64 on a poisoned output (PASS / FAIL): for compute-sanitizer (memcheck,
racecheck, synccheck) on the GPU machine.

    compute-sanitizer --tool memcheck python benchmarks/s21_simt_san.py
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")

# every simt tile: 8 x 16 and 8 x 8 outputs a thread, 3 warp rows (copies that do not divide
# evenly), K-major copies of 4 to 8 rows a thread
CONFIGS = tune._SIMT
# (M, N, K, K split, A given K x M, B given N x K): B's pitch its row + 4 (odd) or + 5
SHAPES = [(1, 261, 61, 1, False, False), (97, 67, 131, 2, False, False),
          (33, 130, 70, 1, True, False), (130, 259, 7, 1, False, False),
          (97, 67, 131, 2, False, True), (45, 130, 70, 1, True, True)]


def main() -> None:
    rng = np.random.default_rng(21)
    for config in CONFIGS:
        for index, (m, n, k, split, trans_a, trans_b) in enumerate(SHAPES):
            for offset in (0, 3):
                rows, cols = (n, k) if trans_b else (k, n)
                ldb = cols + 4 + index % 2
                a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
                b_full = rng.standard_normal((rows, ldb)).astype(np.float32)
                c = rng.standard_normal((m, n)).astype(np.float32)
                out = gpurt.empty((m, n), dtype=np.float32)
                out.fill_(np.nan)
                run = dataclasses.replace(config, split_k=split)
                gemm_mod.gemm(gpurt.asarray(a), gpurt.asarray(b_full)[:, offset:offset + cols],
                              out=out, trans_a=trans_a, trans_b=trans_b, alpha=0.5, beta=2.0,
                              c=gpurt.asarray(c), config=run)
                b = b_full[:, offset:offset + cols].astype(np.float64)
                want = 0.5 * ((a.T if trans_a else a).astype(np.float64)
                              @ (b.T if trans_b else b)) + 2.0 * c
                verdict(f"{run.label()} {m}x{n}x{k} ldb {ldb} +{offset} trans_a={trans_a} "
                        f"trans_b={trans_b}", out, want)


def verdict(text: str, out: gpurt.Array, want: np.ndarray, tol: float = 1e-5) -> None:
    """Print PASS or FAIL, ``text`` and ``out``'s error relative to float64 ``want`` (inf
    where any value is not finite)."""
    got = out.numpy().astype(np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want) if np.isfinite(got).all() else np.inf
    print(("PASS " if err < tol else "FAIL ") + f"{text}: {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
