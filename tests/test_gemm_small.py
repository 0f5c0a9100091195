"""Small and odd GEMMs (issue 17): the mma.sync kernel's element-wise loaders (rows that are not
16-byte aligned: 4-byte cp.async for fp32, register-staged loads for 16-bit types) in the small
tiles, every layout, offset views, beta with C, split-K and graph replay, against float64."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import gpurt
from test_gemm import TOL, check_replays, device, no_tuning, poisoned, rand, reference, rel_err  # noqa: F401

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config


def mma(bm, bn, bk, wm, wn, stages, split=1):
    return Config("mma", bm, bn, bk, wm, wn, stages=stages, split_k=split)


# (config, dtype): one K tile of 64 in one stage, 32-row / 32-column tiles, split-K, TF32
SMALL = [(mma(64, 64, 64, 32, 32, 2), np.float16), (mma(32, 32, 32, 16, 16, 4), gpurt.bfloat16),
         (mma(32, 64, 32, 16, 32, 4), np.float16), (mma(64, 64, 32, 32, 32, 4, 2), gpurt.bfloat16),
         (mma(32, 32, 16, 16, 16, 4), np.float32), (mma(64, 64, 16, 32, 32, 4), np.float32)]


def _views(rng, rows, cols, dtype, trans):
    """A random rows x cols operand (stored cols x rows when ``trans``) one element into its
    rows, with a pitch of its row length + 3: neither base nor pitch 16-byte aligned."""
    shape = (cols, rows) if trans else (rows, cols)
    host = rand(rng, (shape[0], shape[1] + 3), dtype)
    return host[:, 1:shape[1] + 1], device(host)[:, 1:shape[1] + 1]


@pytest.mark.gpu
@pytest.mark.parametrize("config,dtype", SMALL, ids=lambda v: v.label().replace(" ", "_")
                         if isinstance(v, Config) else np.dtype(v).name)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
@pytest.mark.parametrize("m,n,k", [(127, 257, 61), (70, 93, 301), (1, 9, 3)])
def test_small_unaligned(gpu_state, no_tuning, config, dtype, trans_a, trans_b, m, n, k):
    rng = np.random.default_rng(m * n + k)
    a, da = _views(rng, m, k, dtype, trans_a)
    b, db = _views(rng, k, n, dtype, trans_b)
    c = rand(rng, (m, n), dtype)
    out = poisoned((m, n), dtype)
    tf32 = np.dtype(dtype) == np.float32
    gemm_mod.gemm(da, db, out=out, trans_a=trans_a, trans_b=trans_b, alpha=1.5, beta=-0.5,
                  c=device(c), config=config, allow_tf32=tf32)
    want = reference(a, b, trans_a, trans_b, 1.5, -0.5, c)
    assert rel_err(out.numpy(), want) < (5e-3 if tf32 else TOL[np.dtype(dtype)])


@pytest.mark.gpu
@pytest.mark.parametrize("config", [SMALL[0][0], SMALL[1][0], SMALL[3][0]],
                         ids=lambda c: c.label().replace(" ", "_"))
def test_small_graph_replay(gpu_state, config):
    """A captured small gemm on rows of 61 elements replays right on fresh inputs."""
    rng = np.random.default_rng(5)
    m, n, k = 127, 257, 61
    da = device(rand(rng, (m, k), gpurt.bfloat16))
    db = device(rand(rng, (k, n), gpurt.bfloat16))
    out = poisoned((m, n), gpurt.bfloat16)
    stream = gpurt.Stream()
    gemm_mod.gemm(da, db, out=out, config=config, stream=stream)  # compiled outside capture
    stream.synchronize()
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        gemm_mod.gemm(da, db, out=out, config=config, stream=stream)
    check_replays(graph, da, db, out, rng, config.label())
