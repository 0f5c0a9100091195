"""Exact fp32 gemm through the simt kernel's 4-byte copies of N-major operands
(kernels/gemm_simt.cu's MNMajorCopy<VEC=false>: rows not 16-byte aligned) on small odd shapes,
B a view at element offsets 0..3, A also given K x M, each against float64 on a poisoned output
(PASS / FAIL): for compute-sanitizer (memcheck, racecheck, synccheck) on the GPU machine.

    compute-sanitizer --tool memcheck python benchmarks/s21_simt_san.py
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")

# tiles: 8 x 16 and 8 x 8 outputs a thread, 3 warp rows (an A copy that does not divide evenly)
CONFIGS = [tune._SIMT[0], tune._SIMT[3], tune._SIMT[5], tune._SIMT[8]]
# (M, N, K, K split, A given K x M): B's pitch N + 4 (odd) or N + 5 (2 mod 4)
SHAPES = [(1, 261, 61, 1, False), (97, 67, 131, 2, False), (33, 130, 70, 1, True),
          (130, 259, 7, 1, False)]


def main() -> None:
    rng = np.random.default_rng(21)
    for config in CONFIGS:
        for index, (m, n, k, split, trans_a) in enumerate(SHAPES):
            for offset in range(4):
                ldb = n + 4 + index % 2
                a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
                b_full = rng.standard_normal((k, ldb)).astype(np.float32)
                c = rng.standard_normal((m, n)).astype(np.float32)
                out = gpurt.empty((m, n), dtype=np.float32)
                out.fill_(np.nan)
                run = dataclasses.replace(config, split_k=split)
                gemm_mod.gemm(gpurt.asarray(a), gpurt.asarray(b_full)[:, offset:offset + n],
                              out=out, trans_a=trans_a, alpha=0.5, beta=2.0,
                              c=gpurt.asarray(c), config=run)
                b = b_full[:, offset:offset + n].astype(np.float64)
                want = 0.5 * ((a.T if trans_a else a).astype(np.float64) @ b) + 2.0 * c
                got = out.numpy().astype(np.float64)
                err = np.linalg.norm(got - want) / np.linalg.norm(want) \
                    if np.isfinite(got).all() else np.inf
                ok = err < 1e-5
                print(("PASS " if ok else "FAIL ") + f"{run.label()} {m}x{n}x{k} ldb {ldb} "
                      f"+{offset} trans_a={trans_a}: {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
