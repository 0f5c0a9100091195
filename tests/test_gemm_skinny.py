"""The skinny GEMM family (kernels/gemm_skinny.cu, kernels/_gemm_skinny.py): configs, the
heuristic's and tuner's choices for decode shapes and the swap to C^T (CPU), every variant
compiled without spills (CPU, NVRTC), and results against float64 (GPU) on odd and prime
sizes, offsets, every layout, beta != 0, K = 0 and forced configs."""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
skinny = importlib.import_module("gpurt.kernels._gemm_skinny")
Config, Problem = tune.Config, tune.Problem
gemm = gemm_mod.gemm


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    # the decode family (tests/test_gemm_decode.py) is the default on Hopper for TMA-aligned
    # operands; off here, so the skinny family's own choices are what these tests see
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "decode")
    monkeypatch.delenv("GPURT_GEMM_NVRTC_OPTIONS", raising=False)


def problem(m=1, n=4096, k=4096, dt=tune.DT_BF16, a_k=True, b_k=False, vec=True, cap=(9, 0),
            sms=132) -> Problem:
    return Problem(m, n, k, dt, a_k, b_k, vec, vec, cap, sms)


def sk(bm=8, warps=4, split=1) -> Config:
    return Config("skinny", bm, 64, 32 * warps, split_k=split)


# ---- configs and choices (CPU) -------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    dict(bm=12), dict(bm=64), dict(bn=128), dict(bk=96), dict(bk=512), dict(split_k=3),
    dict(split_k=16), dict(wm=8, wn=64), dict(tma_store=True),
])
def test_config_validation(fields):
    base = dict(kernel="skinny", bm=8, bn=64, bk=128)
    with pytest.raises(ValueError, match="skinny"):
        Config(**{**base, **fields})


def test_config_geometry():
    config = sk(16, 4, 8)
    assert config.threads == 128
    assert config.shared_mem(True, False) == 4 * 16 * 68 * 4
    assert sk(32, 8, 1).threads == 256 and sk(32, 8, 1).shared_mem(False, False) == 8 * 32 * 68 * 4
    # template order: DT, BM, WARPS, CS, G (big operand) K-major, S (small) K-major, VEC
    assert config.name_expression(2, True, False, True) == \
        "gemm_skinny<2, 16, 4, 8, false, true, true>"
    assert Config.from_json(config.to_json()) == config
    assert "skinny" in config.label() and "split8" in config.label()


def test_kernel_name_swaps_for_tall_outputs():
    config = sk()
    wide = problem(4, 4096, 512, a_k=True, b_k=False)
    assert skinny.kernel_name(config, wide) == "gemm_skinny<2, 8, 4, 1, false, true, true>"
    tall = problem(4096, 4, 512, a_k=True, b_k=False)  # S = op(b)^T, G = op(a)
    assert skinny.kernel_name(config, tall) == "gemm_skinny<2, 8, 4, 1, true, false, true>"
    assert skinny.kernel_name(config, dataclasses.replace(tall, vec=False)).endswith("false>")


def test_eligibility():
    assert tune.eligible(problem(), sk(8, 4, 8))
    assert tune.eligible(problem(dt=tune.DT_F16), sk())
    assert not tune.eligible(problem(dt=tune.DT_F32), sk())
    assert not tune.eligible(problem(dt=tune.DT_TF32), sk())
    assert tune.eligible(problem(cap=(8, 0)), sk(split=1))
    assert not tune.eligible(problem(cap=(8, 0)), sk(split=2))  # clusters need sm_90
    assert not tune.eligible(problem(cap=(7, 5)), sk())
    assert tune.eligible(problem(vec=False), sk(16, 4, 4))  # any alignment


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 4096, 4096), (32, 11008, 4096),
                                   (4, 4096, 11008), (16, 14336, 4096),
                                   (8, 4096, 11008), (4096, 2, 4096), (7, 999, 4099)])
def test_heuristic_picks_skinny_for_decode_shapes(m, n, k):
    p = problem(m, n, k)
    chosen = tune.heuristic(p)
    assert chosen.kernel == "skinny" and tune.eligible(p, chosen)
    small = min(m, n)
    assert chosen.bm == (8 if small <= 8 else 16 if small <= 16 else 32)
    assert chosen.split_k in (1, 2, 4, 8) and chosen.threads == 128
    assert tune.heuristic(problem(m, n, k, cap=(8, 0))).split_k == 1


def test_heuristic_leaves_other_shapes_alone(monkeypatch):
    # split-K wgmma (notes_gemm.md: 0.74-0.78 of cuBLAS at 32 x 4096^2, split-K mma 0.63-0.65)
    for dims in ((33, 4096, 4096), (32, 4096, 4096), (32, 4096, 11008)):
        chosen = tune.heuristic(problem(*dims, b_k=dims[2] == 11008))
        assert chosen.kernel == "wgmma" and chosen.split_k > 1
    # 17-32 rows: skinny only with a row block of G per SM at least (measured, notes_gemm.md)
    assert tune.heuristic(problem(32, 11008, 4096)).kernel == "skinny"
    assert tune.heuristic(problem(4096, 4096, 4096)).kernel == "wgmma"
    assert tune.heuristic(problem(1, 4096, 4096, dt=tune.DT_F32)).kernel == "simt"
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "skinny")
    assert tune.heuristic(problem(1, 4096, 4096)).kernel != "skinny"
    assert not any(c.kernel == "skinny" for c in tune.candidates(problem(1, 4096, 4096)))


def test_split_grows_until_the_device_is_busy_and_k_allows():
    assert tune.heuristic(problem(1, 4096, 4096)).split_k == 4  # 64 row blocks, clusters <= 4
    assert tune.heuristic(problem(1, 14336, 4096)).split_k == 2  # 224 row blocks
    # a K-major G needs more registers at bm = 8: 3 CTAs per SM, 448 would be two waves
    assert tune.heuristic(problem(1, 14336, 4096, b_k=True)).split_k == 1
    assert tune.heuristic(problem(16, 14336, 4096)).split_k == 1  # bm = 16: 3 CTAs per SM
    assert tune.heuristic(problem(4096, 1, 4096, a_k=False)).split_k == 4  # swapped: G = A
    assert tune.heuristic(problem(1, 4096, 256)).split_k == 1  # 8 chunks of K: no split
    assert tune.heuristic(problem(1, 64 * 132 * 3, 4096)).split_k == 1


def test_candidates():
    for p in (problem(1, 4096, 4096), problem(48, 4096, 4096), problem(16, 11008, 4096, b_k=True)):
        found = tune.candidates(p)
        mine = [c for c in found if c.kernel == "skinny"]
        assert len(mine) >= 3 and len(set(found)) == len(found)
        assert all(tune.eligible(p, c) for c in found)
    assert tune.candidates(problem(1, 4096, 4096))[0].kernel == "skinny"
    assert not any(c.kernel == "skinny" for c in tune.candidates(problem(65, 4096, 4096)))


def _names():
    names = {sk(bm, w, cs).name_expression(dt, True, False, True)
             for bm in (8, 16, 32) for w in (2, 4, 8) for cs in (1, 8) for dt in (1, 2)}
    for s_k in (True, False):
        for g_k in (True, False):
            for vec in (True, False):
                names.add(sk(16, 4, 4).name_expression(2, s_k, g_k, vec))
                names.add(sk(8, 4, 1).name_expression(1, s_k, g_k, vec))
    return sorted(names)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_variants_compile_without_spills(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = [n for n in _names() if arch == "sm_90" or n.split(", ")[3] == "1"]  # CS = 1
    module = gpurt.compile(gemm_launch.text("gemm_skinny.cu"), options=["--ptxas-options=-v"],
                           name_expressions=names, arch=arch, program_name="gemm_skinny.cu",
                           headers={"gemm_common.cu": gemm_launch.text("gemm_common.cu")})
    log = module.log
    assert set(module.lowered_names) == set(names)
    assert "warning" not in log.lower(), log
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(names), log
    assert all(int(s) <= 32 for s in spills), log  # at most a few words, never a real spill


def test_clusters_need_sm90(tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    with pytest.raises(gpurt.CompileError):
        gpurt.compile(gemm_launch.text("gemm_skinny.cu"), arch="sm_80",
                      name_expressions=[sk(8, 4, 2).name_expression(2, True, True, True)],
                      headers={"gemm_common.cu": gemm_launch.text("gemm_common.cu")})


# ---- GPU: results against float64 ----------------------------------------------------------------


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def on_device(host, offset=0, col_major=False):
    """``host`` (2-D) on the device as a view ``offset`` elements into a larger buffer, stored
    row-major or column-major."""
    rows, cols = host.shape
    stored = host.T if col_major else host
    flat = np.concatenate([np.full(offset, 7, host.dtype), np.ascontiguousarray(stored).ravel()])
    buf = gpurt.asarray(flat)[offset:]
    return buf.reshape(cols, rows).T if col_major else buf.reshape(rows, cols)


def run(rng, m, n, k, dtype, config, *, a_t=False, b_t=False, out_t=False, offset=0,
        beta=0.0, alpha=1.0, trans=False, tol=1e-2):
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    c = rand(rng, (m, n), dtype)
    out_host = c if beta else np.full((m, n), np.nan, dtype=np.float32).astype(dtype)
    out = on_device(out_host, offset, out_t)
    if trans:  # the transposes stored, op() through trans_a / trans_b
        da, db = on_device(a.T.copy(), offset, a_t), on_device(b.T.copy(), offset, b_t)
    else:
        da, db = on_device(a, offset, a_t), on_device(b, offset, b_t)
    gemm(da, db, out=out, alpha=alpha, beta=beta, trans_a=trans, trans_b=trans, config=config)
    got = out.numpy().astype(np.float64)
    want = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    if beta:
        want += beta * c.astype(np.float64)
    assert np.isfinite(got).all(), "unwritten (NaN) outputs"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < tol, (m, n, k, config, err)


DTYPES = [gpurt.bfloat16, np.float16]
CONFIGS = [sk(8, 4, 1), sk(16, 4, 8), sk(32, 4, 4), sk(8, 8, 2), sk(16, 2, 2), sk(32, 8, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label().replace(" ", "_"))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_odd_shapes(gpu_state, config, dtype):
    rng = np.random.default_rng()
    for m, n, k in [(1, 1, 1), (1, 4099, 257), (3, 67, 4099), (17, 130, 1000), (31, 1, 33),
                    (40, 257, 131), (9, 64, 64), (2, 5, 3001)]:
        run(rng, m, n, k, dtype, config)


@pytest.mark.gpu
@pytest.mark.parametrize("a_t,b_t,out_t", [(a, b, o) for a in (False, True)
                                           for b in (False, True) for o in (False, True)])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_layouts_and_offsets(gpu_state, a_t, b_t, out_t, offset):
    rng = np.random.default_rng()
    for config in (sk(16, 4, 4), sk(8, 2, 1)):
        run(rng, 13, 300, 517, gpurt.bfloat16, config, a_t=a_t, b_t=b_t, out_t=out_t,
            offset=offset, beta=0.5 if offset == 1 else 0.0, alpha=-1.5)
        run(rng, 300, 5, 517, np.float16, config, a_t=a_t, b_t=b_t, out_t=out_t, offset=offset)


@pytest.mark.gpu
def test_beta_k0_trans_and_heuristic(gpu_state, monkeypatch):
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    run(rng, 9, 200, 0, gpurt.bfloat16, sk(16, 4, 4), beta=2.0)  # K = 0: beta * c only
    run(rng, 9, 200, 0, gpurt.bfloat16, sk(8, 4, 1), beta=0.0)   # K = 0: zeros
    run(rng, 5, 1000, 999, np.float16, sk(8, 4, 2), trans=True, beta=-1.0)
    for m, n, k in [(1, 4096, 4096), (16, 1000, 4099), (4099, 3, 200), (32, 2048, 1024)]:
        run(rng, m, n, k, gpurt.bfloat16, None)  # gemm's own choice: skinny


@pytest.mark.gpu
def test_in_place_beta_and_deterministic(gpu_state):
    rng = np.random.default_rng()
    a, b = rand(rng, (4, 2048), gpurt.bfloat16), rand(rng, (2048, 4096), gpurt.bfloat16)
    c = rand(rng, (4, 4096), gpurt.bfloat16)
    da, db = gpurt.asarray(a), gpurt.asarray(b)
    out = gpurt.asarray(c)
    gemm(da, db, out=out, beta=1.0, config=sk(8, 4, 8))  # c defaults to out
    want = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    first = gemm(da, db, config=sk(8, 4, 8)).numpy()
    for _ in range(3):  # a fixed order of the partial sums: the same bits every time
        assert np.array_equal(gemm(da, db, config=sk(8, 4, 8)).numpy().view(np.uint16),
                              first.view(np.uint16))
