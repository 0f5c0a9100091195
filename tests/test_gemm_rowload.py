"""The row-streaming GEMM kernel (kernels/gemm_rowload.cu, kernels/_gemm_rowload.py): a few
rows of A times an N-major B whose rows need not be 16-byte multiples. CPU: configs, the
heuristic's choice, compilation without spills. GPU: results against float64 on poisoned
outputs (odd sizes, offset views, both A layouts, beta with C in, split K, graph replay)."""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest

import gpurt
from test_gemm_skinny import rand, run

tune = importlib.import_module("gpurt.kernels._gemm_tune")
rowload = importlib.import_module("gpurt.kernels._gemm_rowload")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
gemm_mod = importlib.import_module("gpurt.kernels.gemm")
Config, Problem = tune.Config, tune.Problem
BF16, F16, F32 = tune.DT_BF16, tune.DT_F16, tune.DT_F32


def rl(bm, slots, rows, split=1):
    return Config("rowload", bm, 248 * slots, 8 * rows, split_k=split)


def rl32(bm, slots, rows, split=1):
    """An fp32 tiling: 124 columns a warp load (4 fp32 a lane)."""
    return Config("rowload", bm, 124 * slots, 8 * rows, split_k=split)


def nk(bm, slots, split=1, rows=8):
    """A tiling for a K-major B: 8 x rows rows of W per CTA, 248 x slots k per warp step."""
    return Config("rowload", bm, 8 * rows, 248 * slots, split_k=split)


def nk32(bm, slots, split=1, rows=8):
    """fp32 tiles for a K-major B: 8 x rows rows of W, 124 k a warp load."""
    return Config("rowload", bm, 8 * rows, 124 * slots, split_k=split)


def split_rows(m, n, k, **kw):
    """An H100 problem whose rows are not 16-byte multiples, B N-major."""
    return Problem(m, n, k, BF16, True, False, False, False, (9, 0), 132, pitch128=False, **kw)


@pytest.mark.parametrize("fields", [dict(bm=3), dict(bn=256), dict(bk=128), dict(wm=16),
                                    dict(tma_store=True), dict(bn=64), dict(bk=248)])
def test_config_validation(fields):
    with pytest.raises(ValueError):
        dataclasses.replace(rl(1, 2, 8), **fields)
    with pytest.raises(ValueError):
        dataclasses.replace(nk(1, 1), bm=4)
    with pytest.raises(ValueError):
        nk(2, 2)  # past 128 registers


def test_config_geometry():
    config = rl(4, 1, 4, split=5)
    assert config.threads == 256 and config.shared_mem(True, False) == 0
    assert config.tiles(4, 4099) == 17 and config.source == "gemm_rowload.cu"
    assert config.name_expression(BF16, True, False, False) == \
        "gemm_rowload_splitk<2, 4, 1, 4, true>"
    assert rl(1, 2, 8).name_expression(F16, False, False, True) == \
        "gemm_rowload<1, 1, 2, 8, false>"
    assert nk(1, 2, 3).name_expression(BF16, True, True, False) == \
        "gemm_rowload_nk_splitk<2, 1, 2, 8, true>"
    assert nk(2, 1).tiles(2, 4099) == 65


def test_eligibility():
    problem = split_rows(1, 4099, 4099)
    assert tune.eligible(problem, rl(1, 2, 8))
    k_major = dataclasses.replace(problem, b_kmajor=True)
    assert "N-major B, not K-major" in tune.why_not(k_major, rl(1, 2, 8))
    assert "K-major B, not N-major" in tune.why_not(problem, nk(1, 1))
    assert tune.eligible(k_major, nk(1, 2, 3)) and tune.eligible(k_major, nk(2, 1))
    f32 = dataclasses.replace(problem, dt=F32)
    assert "124 or 248 columns" in tune.why_not(f32, rl(1, 2, 8))
    assert "248 or 496 columns" in tune.why_not(problem, rl32(1, 1, 8))
    assert tune.eligible(f32, rl32(1, 2, 8)) and tune.eligible(f32, rl(1, 1, 8))  # 248: 2 loads
    f32_nk = dataclasses.replace(f32, b_kmajor=True)
    assert tune.eligible(f32_nk, nk32(4, 1)) and tune.eligible(f32_nk, nk(1, 1))  # 248: 2 loads
    assert "(1..4) x (16|32|64) x (124|248|496) with bn / 8 x bk / 124 <= 16 (8 x (16|32|64) " \
        "x 124" in tune.why_not(f32_nk, nk(1, 2))
    assert tune.eligible(f32_nk, nk32(1, 4, rows=2)) and tune.eligible(f32_nk, nk32(2, 2, rows=4))
    assert tune.eligible(f32_nk, nk32(8, 1, rows=4)) and tune.eligible(f32_nk, nk32(8, 1))
    for past in ((16, 1, 1, 4), (8, 2)):  # 4 rows a tile at most, then 8 at one load a row
        with pytest.raises(ValueError):
            nk32(*past)
    assert "(1..2) x" in tune.why_not(k_major, nk32(8, 1))
    assert "(1..2) x (16|32|64) x (248|496|992)" in tune.why_not(k_major, nk32(1, 1))
    tf32 = dataclasses.replace(problem, dt=tune.DT_TF32)
    assert "N-major B only" in tune.why_not(dataclasses.replace(tf32, b_kmajor=True), nk(1, 1))
    assert "124 or 248 columns" in tune.why_not(tf32, rl(1, 2, 8))
    assert tune.eligible(tf32, rl32(1, 2, 8))
    assert "sm_70" in tune.why_not(dataclasses.replace(problem, capability=(6, 1)), rl(1, 2, 8))


@pytest.mark.parametrize("m,n,k,bm,split", [
    (1, 4099, 4099, 1, 15), (2, 4099, 4099, 2, 15), (3, 11003, 4093, 4, 5), (4, 4093, 11003, 4, 15),
    (1, 4099, 4096, 1, 15), (1, 2053, 1999, 1, 28)])
def test_heuristic_streams_split_rows(m, n, k, bm, split):
    """The narrowest tiles, one wave of resident CTAs (2 per SM), two rounds of loads a warp
    at least: the configs that ran fastest on an H100 (notes_gemm.md, s9-rowload)."""
    config = tune.heuristic(split_rows(m, n, k))
    assert config == rl(bm, 1, 4, split)
    assert config.tiles(m, n) * config.split_k <= 264
    assert -(-k // config.split_k) >= 2 * config.bk


@pytest.mark.parametrize("m,n,k,bm,split", [(1, 5003, 4099, 1, 12), (4, 4099, 4099, 4, 15),
                                            (3, 11003, 4093, 4, 5)])
def test_heuristic_streams_f32_split_rows(m, n, k, bm, split):
    """Exact fp32 with B's rows not 16-byte multiples (the simt kernel would load them 4 bytes
    at a time): the rowload kernel's 248-column tiles (two warp loads); aligned rows and a
    K-major B stay on the simt kernel."""
    problem = dataclasses.replace(split_rows(m, n, k), dt=F32)
    config = tune.heuristic(problem)
    assert config == rl32(bm, 2, 4, split)  # one wave of resident CTAs (2 per SM)
    assert config.tiles(m, n) * config.split_k <= 264
    assert config.name_expression(F32, True, False, False) == \
        f"gemm_rowload_splitk<0, {bm}, 2, 4, true>"
    assert any(c.kernel == "simt" for c in tune.candidates(problem))
    assert tune.candidates(problem)[0] == config
    assert tune.heuristic(dataclasses.replace(problem, vec=True)).kernel == "simt"
    assert tune.heuristic(dataclasses.replace(problem, m=9)).kernel == "simt"
    # allow_tf32: the same exact fp32 kernel (fp32 products are what TF32 permits)
    tf32 = dataclasses.replace(problem, dt=tune.DT_TF32)
    assert tune.heuristic(tf32) == config and config in tune.candidates(tf32)
    assert config.name_expression(tune.DT_TF32, True, False, False) == \
        f"gemm_rowload_splitk<0, {bm}, 2, 4, true>"
    assert tune.heuristic(dataclasses.replace(tf32, m=16)).kernel != "rowload"


@pytest.mark.parametrize("m,bm,bk,split", [(1, 1, 248, 4), (2, 2, 248, 4)])
def test_heuristic_dots_a_k_major_b(m, bm, bk, split):
    """x @ W.T with W's rows 8198 bytes: 64 rows of W per CTA, slices of whole K steps."""
    config = tune.heuristic(dataclasses.replace(split_rows(m, 4099, 4099), b_kmajor=True))
    assert config == nk(bm, bk // 248, split)


@pytest.mark.parametrize("m,n,k,vec,split", [
    (5, 4096, 4096, True, 4), (8, 11008, 4096, True, 1), (6, 5003, 3001, False, 3),
    (7, 4099, 4099, False, 4)])
def test_heuristic_dots_f32_past_four_rows(m, n, k, vec, split):
    """Exact fp32 x @ W.T for M = 5-8: the 8-row dot-product tile, 124 k a warp load (faster
    than the simt tiles on an H100, session 23)."""
    problem = dataclasses.replace(split_rows(m, n, k), dt=F32, b_kmajor=True, vec=vec)
    assert tune.heuristic(problem) == nk32(8, 1, split)


@pytest.mark.parametrize("m,n,k,vec,split", [
    (1, 4096, 4096, True, 4), (4, 11008, 4096, True, 1), (3, 4099, 4099, False, 4),
    (2, 14336, 4096, True, 1), (1, 4096, 11008, True, 4)])
def test_heuristic_dots_f32_with_a_k_major_b(m, n, k, vec, split):
    """Exact fp32 x @ W.T for M <= 4, aligned rows or not: the dot-product kernel (one pass over
    W), bm = M, 124 k a warp load, one wave of resident CTAs (2 per SM)."""
    problem = dataclasses.replace(split_rows(m, n, k), dt=F32, b_kmajor=True, vec=vec)
    config = tune.heuristic(problem)
    assert config == nk32(m, 1, split)
    assert config.name_expression(F32, True, True, vec) == \
        f"gemm_rowload_nk{'_splitk' if split > 1 else ''}<0, {m}, 1, 8, true>"
    assert tune.heuristic(dataclasses.replace(problem, m=9)).kernel == "simt"
    assert config in tune.candidates(problem)
    assert tune.heuristic(dataclasses.replace(problem, dt=tune.DT_TF32)).kernel != "rowload"


@pytest.mark.parametrize("problem", [
    split_rows(5, 4099, 4099), split_rows(16, 4099, 4099), split_rows(1, 200, 4099),
    split_rows(1, 4099, 60),
    dataclasses.replace(split_rows(3, 4099, 4099), b_kmajor=True),
    dataclasses.replace(split_rows(1, 4096, 4096), vec=True, tma=True, pitch128=True),
])
def test_heuristic_leaves_other_shapes_alone(problem):
    assert tune.heuristic(problem).kernel != "rowload"


def test_candidates_and_all_configs():
    problem = split_rows(8, 4099, 4099)
    found = rowload.candidates(problem)
    assert found and all(bm == 8 and bn == 248 and bk == 32 for bm, bn, bk, _ in found)
    assert {c.split_k for c in tune.all_configs(problem) if c.kernel == "rowload"} == {1, 15}
    assert rowload.candidates(split_rows(9, 4099, 4099)) == []
    assert rowload.candidates(split_rows(1, 4099, 4099))[0] == (1, 248, 32, 15)
    assert any(c.kernel == "rowload" for c in tune.candidates(split_rows(1, 4099, 4099)))
    k_major = dataclasses.replace(split_rows(1, 4099, 4099), b_kmajor=True)
    assert [c for c in tune.candidates(k_major) if c.kernel == "rowload"] == \
        [nk(1, 1, 4), nk(1, 2, 3), nk(1, 1, 2, rows=4)]
    f32 = dataclasses.replace(k_major, dt=F32)
    assert [c for c in tune.candidates(f32) if c.kernel == "rowload"] == \
        [nk32(1, 1, 4), nk32(1, 2, 4), nk32(1, 1, 2, rows=4), nk32(1, 4, 1, rows=2)]


def _names():
    """Every tiling the heuristic or the tuner may pick, split and not (bf16, A K-major), and
    the split ones for fp16 with A M-major (one NVRTC program: minutes on one core)."""
    kn = [rl(bm, slots, rows) for bm in (1, 2, 4) for slots in (1, 2) for rows in (4, 8)
          if (bm, slots, rows) != (4, 2, 8)] + [rl(8, 1, 4), rl(16, 1, 4)]
    names = set()
    kn32 = [rl32(bm, slots, rows) for bm in (1, 2, 4) for slots in (1, 2) for rows in (4, 8)
            if (bm, slots, rows) != (4, 2, 8)] + [rl32(8, 1, 4), rl32(16, 1, 4)]
    for dt, a_k, splits in ((BF16, True, (1, 2)), (F16, False, (2,)), (F32, True, (1, 2))):
        for split in splits:
            for config in (kn32 if dt == F32 else kn):
                config = dataclasses.replace(config, split_k=split)
                names.add(config.name_expression(dt, a_k, False, False))
            # (not the 8-row tile with 8 rows of W a warp: NVRTC 13.0's ptxas spills 4 bytes
            # in its split-K kernel, 13.5's none; session 23 measured it as 13.0 builds it)
            nks = (nk32(1, 1, split), nk32(1, 4, split, rows=2), nk32(2, 2, split, rows=4),
                   nk32(4, 1, split), nk32(8, 1, split, rows=4)) if dt == F32 else (
                nk(1, 1, split), nk(1, 2, split), nk(2, 1, split), nk(1, 2, split, rows=4))
            for config in nks:
                names.add(config.name_expression(dt, a_k, True, False))
    return sorted(names)


def test_variants_compile_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = _names()
    module = gpurt.compile(gemm_launch.text("gemm_rowload.cu"), options=["--ptxas-options=-v"],
                           name_expressions=names, arch="sm_90", program_name="gemm_rowload.cu",
                           headers={"gemm_common.cu": gemm_launch.text("gemm_common.cu")})
    log = module.log
    assert set(module.lowered_names) == set(names)
    assert "warning" not in log.lower(), log
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(names), log
    assert all(int(s) == 0 for s in spills), log


# ---- GPU: results against float64 ----------------------------------------------------------------

CONFIGS = [rl(1, 2, 8), rl(1, 2, 8, 5), rl(2, 2, 8, 3), rl(4, 1, 8, 2), rl(4, 2, 4, 7),
           rl(8, 1, 4, 4), rl(16, 1, 4, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label().replace(" ", "_"))
@pytest.mark.parametrize("dtype", [gpurt.bfloat16, np.float16], ids=lambda d: np.dtype(d).name)
def test_odd_shapes(gpu_state, config, dtype):
    rng = np.random.default_rng()
    # (N = 1 leaves B's layout ambiguous: gemm may read it as K-major, which these cannot run)
    for m, n, k in [(1, 2, 1), (1, 4099, 257), (3, 67, 4099), (17, 130, 1000), (5, 3, 33),
                    (16, 520, 131), (9, 64, 64), (2, 5, 3001), (1, 777, 9)]:
        run(rng, m, n, k, dtype, config)


CONFIGS_NK = [nk(1, 2), nk(1, 2, 3), nk(1, 1, 5), nk(2, 1, 2), nk(1, 2, 2, rows=4),
              nk(2, 1, 3, rows=2)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS_NK, ids=lambda c: c.label().replace(" ", "_"))
@pytest.mark.parametrize("dtype", [gpurt.bfloat16, np.float16], ids=lambda d: np.dtype(d).name)
def test_k_major_b(gpu_state, config, dtype):
    """B stored N x K (column-major K x N, or its transpose through trans_b): odd sizes,
    offsets, both A layouts, beta."""
    rng = np.random.default_rng()
    for m, n, k in [(1, 2, 3), (1, 4099, 257), (2, 67, 4099), (1, 130, 1000), (2, 3, 33),
                    (1, 520, 497), (2, 64, 64), (1, 5, 3001)]:
        run(rng, m, n, k, dtype, config, b_t=True)
    for offset in (1, 3, 6):
        run(rng, 2, 301, 1001, dtype, config, a_t=offset == 3, b_t=True, offset=offset,
            beta=0.5 if offset == 1 else 0.0, alpha=-1.5)
        run(rng, 1, 1000, 999, dtype, config, trans=True, offset=offset)


CONFIGS_NK32 = [nk32(1, 1), nk32(1, 2, 3), nk32(2, 2, 2), nk32(3, 1, 5), nk32(4, 1),
                nk32(4, 1, 4), nk32(1, 4, 1, rows=2), nk32(1, 4, 3, rows=2),
                nk32(2, 2, 2, rows=4), nk32(4, 1, 3, rows=4), nk32(8, 1), nk32(8, 1, 3, rows=4),
                nk32(8, 1, 2, rows=2)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS_NK32, ids=lambda c: c.label().replace(" ", "_"))
def test_f32_k_major_b(gpu_state, config):
    """Exact fp32 (float64's answer to 1e-5) with B stored N x K: odd sizes, every
    misalignment of W's rows (views 1..3 floats in) and aligned ones, both A layouts, beta,
    fewer rows of A than the tile (up to 16 rows of A a tile)."""
    rng = np.random.default_rng()
    for m, n, k in [(1, 2, 3), (config.bm, 4099, 257), (2, 67, 4099), (1, 130, 1000),
                    (config.bm, 3, 33), (3, 520, 497), (4, 64, 64), (1, 5, 3001),
                    (config.bm, 4096, 4096), (max(1, config.bm - 3), 301, 1003)]:
        run(rng, min(m, config.bm), n, k, np.float32, config, b_t=True, tol=1e-5)
    for offset in (1, 2, 3):
        run(rng, config.bm, 301, 1001, np.float32, config, a_t=offset == 2, b_t=True,
            offset=offset, beta=0.5 if offset == 1 else 0.0, alpha=-1.5, tol=1e-5)
        run(rng, 1, 1000, 999, np.float32, config, trans=True, offset=offset, tol=1e-5)


CONFIGS_F32 = [rl32(1, 1, 4), rl32(1, 2, 8, 5), rl32(2, 2, 8, 3), rl32(4, 1, 8, 2),
               rl32(4, 2, 4, 7), rl32(8, 1, 4, 4), rl32(16, 1, 4, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS_F32, ids=lambda c: c.label().replace(" ", "_"))
def test_f32_odd_shapes(gpu_state, config):
    """Exact fp32 (fp32 products and sums: float64's answer to 1e-5), odd sizes, every
    misalignment of B's rows (a view 1..3 elements in), both A layouts, beta."""
    rng = np.random.default_rng()
    for m, n, k in [(1, 2, 1), (1, 5003, 257), (3, 67, 4099), (17, 130, 1000), (5, 3, 33),
                    (16, 520, 131), (9, 64, 64), (2, 5, 3001), (1, 777, 9)]:
        run(rng, m, n, k, np.float32, config, tol=1e-5)
    for offset in (1, 2, 3):
        run(rng, 3, 1003, 517, np.float32, config, a_t=offset == 2, offset=offset,
            beta=0.5 if offset == 1 else 0.0, alpha=-1.5, tol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("offset", [0, 1, 3, 6])
def test_layouts_and_offsets(gpu_state, a_t, offset):
    """A row- or column-major, every view a few elements into its buffer (so B's rows start
    at every misalignment), beta with C in."""
    rng = np.random.default_rng()
    for config in (rl(4, 2, 4, 3), rl(1, 2, 8, 2)):
        run(rng, 3, 1003, 517, gpurt.bfloat16, config, a_t=a_t, offset=offset,
            beta=0.5 if offset == 1 else 0.0, alpha=-1.5)
        run(rng, 11, 251, 299, np.float16, rl(8, 1, 4, config.split_k), a_t=a_t,
            offset=offset, beta=-1.0 if offset == 3 else 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("a_t,b_t,out_t", [(a, b, o) for a in (False, True)
                                           for b in (False, True) for o in (False, True)])
def test_gemms_own_choice_in_every_layout(gpu_state, monkeypatch, a_t, b_t, out_t):
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    for m, n, k in [(1, 4099, 4099), (16, 2053, 1999), (5, 1031, 257)]:
        run(rng, m, n, k, gpurt.bfloat16, None, a_t=a_t, b_t=b_t, out_t=out_t, offset=1,
            beta=0.5)
        run(rng, m, n, k, np.float16, None, a_t=a_t, b_t=b_t, out_t=out_t, trans=True)
        run(rng, m, n, k, np.float32, None, a_t=a_t, b_t=b_t, out_t=out_t, offset=3,
            beta=-0.5, tol=1e-5)


def _first_call(monkeypatch, da, db):
    """gemm(da, db) from fresh plans with the heuristic's choice: (the result, its Call)."""
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    gemm_mod.clear_plans()
    out = gemm_mod.gemm(da, db)
    (call,) = [entry[0] for entry in gemm_mod._calls.values()]
    return out, call


@pytest.mark.gpu
def test_heuristic_takes_rowload_and_is_deterministic(gpu_state, monkeypatch):
    rng = np.random.default_rng()
    a, b = rand(rng, (2, 4099), gpurt.bfloat16), rand(rng, (4099, 4100), gpurt.bfloat16)
    da, db = gpurt.asarray(a), gpurt.asarray(b)[:, :4099]
    first, call = _first_call(monkeypatch, da, db)
    assert call.config.kernel == "rowload" and call.config.split_k > 1
    want = a.astype(np.float64) @ b[:, :4099].astype(np.float64)
    got = first.numpy().astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    for _ in range(3):  # the slices are added in a fixed order: the same bits every time
        assert np.array_equal(gemm_mod.gemm(da, db).numpy().view(np.uint16),
                              first.numpy().view(np.uint16))


@pytest.mark.gpu
def test_f32_heuristic_takes_rowload(gpu_state, monkeypatch):
    """fp32 x a 4-byte-misaligned B (rows of 5003 floats): the rowload kernel, to 1e-5."""
    rng = np.random.default_rng()
    a, b = rand(rng, (1, 4099), np.float32), rand(rng, (4099, 5004), np.float32)
    da, db = gpurt.asarray(a), gpurt.asarray(b)[:, 1:]
    out, call = _first_call(monkeypatch, da, db)
    got = out.numpy().astype(np.float64)
    assert call.config.kernel == "rowload" and call.config.bn == 248
    want = a.astype(np.float64) @ b[:, 1:].astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    tf32 = gemm_mod.gemm(da, db, allow_tf32=True).numpy().astype(np.float64)
    assert [entry[0].config for entry in gemm_mod._calls.values()] == [call.config] * 2
    assert np.linalg.norm(tf32 - want) / np.linalg.norm(want) < 1e-5  # fp32 products


@pytest.mark.gpu
def test_graph_replay_with_c_in(gpu_state, monkeypatch):
    """A captured split-K rowload call (its partials in the capture's workspace), replayed on
    fresh inputs with out accumulating (beta = 1)."""
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    m, n, k = 3, 1031, 2053  # B's rows 2062 bytes
    da = gpurt.asarray(rand(rng, (m, k), gpurt.bfloat16))
    db = gpurt.asarray(rand(rng, (k, n), gpurt.bfloat16))
    out = gpurt.asarray(rand(rng, (m, n), gpurt.bfloat16))
    stream = gpurt.Stream()
    config = rl(4, 2, 8, 9)
    gemm_mod.gemm(da, db, out=out, beta=1.0, stream=stream, config=config)  # compile first
    stream.synchronize()
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        gemm_mod.gemm(da, db, out=out, beta=1.0, stream=stream, config=config)
    for _ in range(2):
        a, b = rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16)
        c = rand(rng, (m, n), gpurt.bfloat16)
        da.copy_(gpurt.asarray(a))
        db.copy_(gpurt.asarray(b))
        out.copy_(gpurt.asarray(c))
        gpurt.synchronize()
        graph.replay()
        gpurt.synchronize()
        want = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
        got = out.numpy().astype(np.float64)
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    graph.reset()


@pytest.mark.parametrize("dt", [F32, BF16, tune.DT_F16, tune.DT_TF32])
def test_the_rowload_picks_are_prebuilt(dt):
    """Every rowload config the heuristic picks at M = 1-8 (B either layout, rows aligned or
    not) is among the programs precompiled and built into the kernel archive: the first
    decode call on a new machine compiles nothing."""
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    built = {name for _, names, _ in launch.programs("sm_90a") for name in names}
    seen = 0
    for m in range(1, 9):
        for n, k in ((4096, 4096), (4099, 4099), (11008, 4096), (1000, 3001)):
            for b_k in (False, True):
                for a_k in (True, False):
                    vec = n % 8 == 0 and k % 8 == 0
                    problem = Problem(m, n, k, dt, a_k, b_k, vec, vec, (9, 0), 132,
                                      pitch128=vec)
                    config = tune.heuristic(problem)
                    if config.kernel == "rowload":
                        seen += 1
                        names = launch.kernel_names(config, problem)
                        assert set(names) <= built, (m, n, k, b_k, a_k, config.label())
    assert seen
