"""Small and odd GEMMs (issue 17): the mma.sync kernel's element-wise loaders (rows that are not
16-byte aligned: 4-byte cp.async for fp32, register-staged loads for 16-bit types) in the small
tiles, every layout, offset views, beta with C, split-K and graph replay, against float64."""

from __future__ import annotations

import dataclasses
import importlib
import re

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
         (mma(32, 32, 16, 16, 16, 4), np.float32), (mma(64, 64, 16, 32, 32, 4), np.float32),
         (dataclasses.replace(tune._TF32_THIN, split_k=2), np.float32)]


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


def _problem(m, n, k, dt=tune.DT_F16, aligned=False, b_k=False):
    return tune.Problem(m, n, k, dt, True, b_k, aligned, aligned, (9, 0), 132)


def test_small_rule():
    """Small problems take the 32 x 32 mma tiles; larger ones and long K in TF32 keep the
    earlier choice (wgmma, or mma / the packed route); TF32 with M <= 16 on a long K takes
    16-row tiles split about 2 CTAs per SM."""
    for dt, small in ((tune.DT_F16, tune._MMA_SMALL), (tune.DT_BF16, tune._MMA_SMALL),
                      (tune.DT_TF32, tune._TF32_SMALL)):
        for shape in ((127, 257, 61), (1, 9, 3), (509, 61, 257), (251, 251, 251)):
            assert tune.heuristic(_problem(*shape, dt)) == small, (shape, dt)
            assert tune.candidates(_problem(*shape, dt))[0] == small
        for shape in ((128, 256, 64), (512, 512, 128), (256, 256, 256)):
            assert tune.heuristic(_problem(*shape, dt, aligned=True)) == small
        for shape in ((509, 509, 509), (600, 8, 8)):  # past 2^25 multiply-adds / 512
            assert tune.heuristic(_problem(*shape, dt)) != small
        for shape in ((512, 512, 512), (400, 400, 400)):  # aligned: the wgmma kernel
            assert tune.heuristic(_problem(*shape, dt, aligned=True)).kernel == "wgmma"
    assert tune.heuristic(_problem(127, 257, 509, tune.DT_F16)) == tune._MMA_SMALL
    assert tune.heuristic(_problem(127, 257, 509, tune.DT_TF32)) != tune._TF32_SMALL
    assert tune.heuristic(_problem(16, 256, 64, aligned=True)).kernel in ("skinny", "decode")
    assert tune.heuristic(_problem(127, 257, 61, tune.DT_F32)).kernel == "simt"
    for m, b_k in ((16, False), (16, True), (1, True), (1, False)):
        # aligned rows take TF32 decode tiles (session 9 s9-tf32m), the others the thin mma;
        # M <= 4 with an N-major B the fp32 rowload kernel (session 19)
        assert tune.heuristic(_problem(m, 4096, 4096, tune.DT_TF32, aligned=True,
                                       b_k=b_k)).kernel == "decode"
        thin = tune.heuristic(_problem(m, 4096, 4096, tune.DT_TF32, aligned=False, b_k=b_k))
        if m == 1 and not b_k:
            assert thin.kernel == "rowload" and thin.bm == 1
            continue
        assert thin == dataclasses.replace(tune._TF32_THIN, split_k=4)  # 64 tiles x 4: 2 / SM
        assert thin in tune.candidates(_problem(m, 4096, 4096, tune.DT_TF32, False, b_k))
    assert tune.heuristic(_problem(17, 4096, 4096, tune.DT_TF32, aligned=True)).bm == 64
    for config in (tune._MMA_SMALL, tune._TF32_SMALL):
        assert config in tune.all_configs(_problem(127, 257, 61, tune.DT_TF32 if config.bk == 16
                                                   else tune.DT_F16))
        assert config.threads == 128


def test_small_configs_compile_without_spills(tmp_path, monkeypatch):
    """The small tiles in every layout, with and without vector loads: no spills."""
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    names = sorted({config.name_expression(dt, a_k, b_k, vec)
                    for config, dts in ((tune._MMA_SMALL, (tune.DT_F16, tune.DT_BF16)),
                                        (tune._TF32_SMALL, (tune.DT_TF32,)))
                    for dt in dts for a_k in (True, False) for b_k in (True, False)
                    for vec in (True, False)})
    module = gpurt.compile(launch.text("gemm_mma.cu"), options=["--ptxas-options=-v"],
                           name_expressions=names, arch="sm_90", program_name="gemm_mma.cu",
                           headers=launch.headers("gemm_mma.cu"))
    spills = re.findall(r"(\d+) bytes spill stores", module.log)
    assert len(spills) == len(names) and set(spills) == {"0"}, module.log
