"""Exact fp32 gemm through the rowload kernel's tiles for a K-major B (kernels/gemm_rowload.cu's
run_nk at fp32: W = B^T stored N x K, 4-float loads realigned by shuffles) on small odd
shapes: every misalignment of W's rows (views 0..3 floats in) and 16-byte aligned rows, 16-64
rows of W a CTA, A given M x K or K x M, split
and unsplit, beta with C in; each against float64 on a poisoned output (PASS / FAIL): for
compute-sanitizer (memcheck, racecheck, synccheck) on the GPU machine.

    compute-sanitizer --tool memcheck python benchmarks/s22_nk_san.py
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np

import gpurt

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run with python -P)
from s21_simt_san import verdict  # noqa: E402

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
Config = importlib.import_module("gpurt.kernels._gemm_tune").Config

# (bm, rows of W a CTA, k a warp load, K split)
TILES = [(1, 64, 124, 1), (1, 64, 248, 3), (2, 64, 248, 2), (3, 64, 124, 1), (4, 64, 124, 4),
         (1, 16, 496, 1), (1, 16, 496, 3), (2, 32, 248, 2), (4, 32, 124, 3), (8, 64, 124, 1),
         (8, 32, 124, 2), (8, 16, 124, 3)]
# (M, N, K, A given K x M)
SHAPES = [(1, 67, 131, False), (2, 130, 517, True), (3, 5, 1001, False), (4, 257, 250, True),
          (13, 70, 301, False)]


def main() -> None:
    rng = np.random.default_rng(22)
    for bm, bn, bk, split in TILES:
        config = Config("rowload", bm, bn, bk, split_k=split)
        for m, n, k, trans_a in SHAPES:
            m = min(m, bm)
            for offset in (0, 1, 2, 3, 4):  # 4: 16-byte aligned rows (every lane's own load)
                ldw = k + 4 + offset % 2 if offset < 4 else -(-k // 4) * 4 + 8
                a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
                w_full = rng.standard_normal((n, ldw)).astype(np.float32)
                c = rng.standard_normal((m, n)).astype(np.float32)
                out = gpurt.empty((m, n), dtype=np.float32)
                out.fill_(np.nan)
                gemm_mod.gemm(gpurt.asarray(a), gpurt.asarray(w_full)[:, offset:offset + k],
                              out=out, trans_a=trans_a, trans_b=True, alpha=0.5, beta=2.0,
                              c=gpurt.asarray(c), config=config)
                w = w_full[:, offset:offset + k].astype(np.float64)
                want = 0.5 * ((a.T if trans_a else a).astype(np.float64) @ w.T) + 2.0 * c
                verdict(f"{config.label()} {m}x{n}x{k} ldw {ldw} +{offset} trans_a={trans_a}",
                        out, want)


if __name__ == "__main__":
    main()
