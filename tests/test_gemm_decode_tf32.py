"""TF32 on the decode family (kernels/gemm_decode.cu with DT_TF32): eligibility and the
chooser (CPU), the variants compiled without spills or serialized wgmma (CPU, NVRTC), and
results against float64 (GPU) on odd sizes, both layouts of the weight (by descriptor and
from registers), tall outputs, beta, split K over clusters, graph capture and reruns."""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import gpurt
from test_gemm_skinny import on_device, rand

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
decode = importlib.import_module("gpurt.kernels._gemm_decode")
Config, Problem = tune.Config, tune.Problem


def problem(m=16, n=4096, k=4096, a_k=True, b_k=False) -> Problem:
    return Problem(m, n, k, tune.DT_TF32, a_k, b_k, True, True, (9, 0), 132)


def dc(bm=64, bn=16, stages=6, split=1) -> Config:
    return Config("decode", bm, bn, 32, stages=stages, split_k=split)


def test_tf32_tiles_and_eligibility():
    assert tune.eligible(problem(), dc()) and tune.eligible(problem(b_k=True), dc(128, 32))
    assert not tune.eligible(problem(), Config("decode", 64, 16, 64, stages=6))  # bk 64: 16-bit
    assert "K-major" in tune.why_not(problem(a_k=False), dc())  # Y = op(a) M-major
    assert "K-major" in tune.why_not(problem(1000, 16, 512, b_k=False), dc())  # tall, Y = b^T
    assert tune.eligible(problem(1000, 16, 512, a_k=False, b_k=True), dc())
    bf16 = Problem(16, 4096, 4096, tune.DT_BF16, True, False, True, True, (9, 0), 132)
    assert not tune.eligible(bf16, dc())
    with pytest.raises(ValueError, match="decode"):
        Config("decode", 256, 16, 32, stages=4)
    assert dc(64, 16, 6, 2).name_expression(3, False, True, True) == \
        "gemm_decode<3, 64, 16, 6, false, true, 2>"


@pytest.mark.parametrize("m", [1, 8, 16, 32, 64])
@pytest.mark.parametrize("b_k", [False, True])
def test_heuristic_takes_decode_up_to_64_rows(m, b_k):
    for n, k in ((4096, 4096), (11008, 4096), (4096, 11008)):
        chosen = tune.heuristic(problem(m, n, k, b_k=b_k))
        assert chosen.kernel == "decode" and chosen.bk == 32 and chosen.bm == 64, chosen
        assert chosen.split_k == (2 if n == 4096 else 1) and chosen.stages == 6, chosen
    # 128 rows: decode where its tiles are 64 rows (4096-row weights), else wgmma
    for n, k in ((4096, 4096), (4096, 11008)):
        chosen = tune.heuristic(problem(128, n, k, b_k=b_k))
        assert (chosen.kernel, chosen.bm, chosen.bn, chosen.split_k) == ("decode", 64, 128, 2)
    assert tune.heuristic(problem(128, 11008, 4096, b_k=b_k)).kernel == "wgmma"
    assert tune.heuristic(problem(m, 4096, 4096, a_k=False, b_k=b_k)).kernel != "decode"
    assert any(c.kernel == "decode" for c in tune.candidates(problem(m, b_k=b_k)))


def test_tf32_variants_compile_without_spills_or_serialized_wgmma(tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = sorted({dc(bm, bn, 6, split).name_expression(3, x_k, True, True)
                    for bm, bn, split in ((64, 16, 2), (128, 32, 1), (64, 64, 8), (128, 128, 2))
                    for x_k in (True, False)})
    module = gpurt.compile(gemm_launch.text("gemm_decode.cu"), options=["--ptxas-options=-v"],
                           name_expressions=names, arch="sm_90a", program_name="gemm_decode.cu",
                           headers=gemm_launch.headers("gemm_decode.cu"))
    log = module.log
    assert "warning" not in log.lower() and "C75" not in log, log
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(names) and set(spills) == {"0"}, log


# ---- GPU: results against float64 ----------------------------------------------------------------


def run(rng, m, n, k, config, *, a_t=False, b_t=False, out_t=False, offset=0, beta=0.0,
        alpha=1.0):
    """One TF32 gemm (poisoned output unless beta) against float64."""
    a, b, c = (rand(rng, s, np.float32) for s in ((m, k), (k, n), (m, n)))
    out = on_device(c if beta else np.full((m, n), np.nan, np.float32), offset, out_t)
    gemm_mod.gemm(on_device(a, offset, a_t), on_device(b, offset, b_t), out=out, alpha=alpha,
                  beta=beta, config=config, allow_tf32=True)
    got = out.numpy().astype(np.float64)
    want = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 5e-3, (m, n, k, config, a_t, b_t, err)


@pytest.mark.gpu
@pytest.mark.parametrize("b_t", [False, True], ids=["weight_n_major", "weight_k_major"])
@pytest.mark.parametrize("bm,bn,split", [(64, 16, 1), (64, 16, 2), (128, 32, 4), (64, 64, 8),
                                         (128, 128, 2), (64, 32, 1)])
def test_tf32_odd_shapes(gpu_state, b_t, bm, bn, split):
    rng = np.random.default_rng()
    for m, n, k in [(3, 4096, 1000), (17, 264, 4100), (33, 1000, 72), (100, 520, 1000),
                    (1, 8, 8), (9, 4096, 64), (64, 260, 516)]:
        run(rng, m, n, k, dc(bm, bn, 6, split), b_t=b_t, beta=0.5 if m % 2 else 0.0,
            alpha=-1.5, offset=4 if n % 8 else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("out_t", [False, True])
def test_tf32_tall_outputs(gpu_state, out_t):
    """N < M: X = op(a) (K-major, or M-major from registers), Y = op(b)^T K-major."""
    rng = np.random.default_rng()
    for a_t in (False, True):
        run(rng, 1000, 24, 520, dc(128, 32, 6, 2), a_t=a_t, b_t=True, out_t=out_t,
            beta=0.5 if out_t else 0.0)


@pytest.mark.gpu
def test_tf32_own_choice_graph_and_determinism(gpu_state, monkeypatch):
    from test_gemm import poisoned

    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    for m, n, k, b_t in [(16, 4096, 4096, False), (16, 4096, 4096, True),
                         (64, 1024, 11008, False)]:
        assert tune.heuristic(problem(m, n, k, b_k=b_t)).kernel == "decode"
        run(rng, m, n, k, None, b_t=b_t, beta=-1.0)
    da = gpurt.asarray(rand(rng, (16, 4096), np.float32))
    db = gpurt.asarray(rand(rng, (4096, 4096), np.float32))
    out = poisoned((16, 4096), np.float32)
    gemm_mod.gemm(da, db, out=out, allow_tf32=True)
    first = out.numpy().copy()
    for _ in range(2):  # the cluster's partial tiles are summed in a fixed order
        assert np.array_equal(gemm_mod.gemm(da, db, allow_tf32=True).numpy(), first)
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm_mod.gemm(da, db, out=out, allow_tf32=True)
    for _ in range(2):  # replayed on fresh inputs
        a, b = rand(rng, (16, 4096), np.float32), rand(rng, (4096, 4096), np.float32)
        da.copy_(gpurt.asarray(a))
        db.copy_(gpurt.asarray(b))
        out.copy_(np.full((16, 4096), np.nan, np.float32))
        gpurt.synchronize()
        graph.replay()
        gpurt.synchronize()
        want = a.astype(np.float64) @ b.astype(np.float64)
        assert np.linalg.norm(out.numpy() - want) / np.linalg.norm(want) < 5e-3
    del graph
