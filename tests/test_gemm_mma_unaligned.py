"""The mma.sync kernel's loads of 16-bit rows that are not 16-byte multiples
(kernels/gemm_mma.cu's fetch_tile, VEC=false). GPU: every base misalignment (0..7
elements) of A and B, both layouts of each, sizes whose rows end inside a chunk (1..7 valid
elements), split K, beta with C in, against float64 on poisoned outputs; the elements just
past each operand's view are NaN, so a load that let one in would show."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import gpurt
from test_gemm import TOL, gemm, no_tuning, poisoned, rand, reference, rel_err  # noqa: F401

tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

CONFIGS = [Config("mma", 64, 64, 32, 32, 32, 4), Config("mma", 32, 32, 64, 16, 16, 2),
           Config("mma", 32, 32, 64, 16, 16, 2, split_k=3),
           Config("mma", 128, 128, 32, 64, 64, 4, split_k=2)]
DTYPES = [np.float16, gpurt.bfloat16]


def framed(rng, rows, cols, dtype, shift, ld):
    """A rows x cols view starting ``shift`` elements into row 1 of a device matrix with rows
    ``ld`` elements apart, NaN everywhere outside the view; (the view, the host matrix)."""
    host = np.full((rows + 2, ld), np.nan, dtype=np.float32).astype(dtype)
    mat = rand(rng, (rows, cols), dtype)
    host[1:rows + 1, shift:shift + cols] = mat
    return gpurt.asarray(host)[1:rows + 1, shift:shift + cols], mat


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label().replace(" ", "_"))
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False)])
def test_mma_unaligned_rows(gpu_state, no_tuning, dtype, config, trans_a, trans_b):  # noqa: F811
    rng = np.random.default_rng(19)
    for m, n, k, shift_a, shift_b in ((37, 101, 75, 1, 3), (5, 130, 203, 7, 5),
                                      (70, 67, 131, 2, 0), (17, 259, 66, 0, 6),
                                      (33, 45, 9, 3, 4)):
        a_shape = (k, m) if trans_a else (m, k)
        b_shape = (n, k) if trans_b else (k, n)
        a_dev, a = framed(rng, *a_shape, dtype, shift_a, a_shape[1] + shift_a + 3)
        b_dev, b = framed(rng, *b_shape, dtype, shift_b, b_shape[1] + shift_b + 5)
        c = rand(rng, (m, n), dtype)
        out = poisoned((m, n), dtype)
        gemm(a_dev.T if trans_a else a_dev, b_dev.T if trans_b else b_dev, out=out,
             beta=0.5, c=gpurt.asarray(c), config=config)
        got = out.numpy()
        want = reference(a.T if trans_a else a, b.T if trans_b else b, beta=0.5, c=c)
        assert rel_err(got, want) < TOL[np.dtype(dtype)], (m, n, k, shift_a, shift_b)
