"""The decode GEMM family (kernels/gemm_decode.cu, kernels/_gemm_decode.py): configs, which
operand goes where, eligibility, the heuristic's and tuner's choices (CPU), every variant
compiled without spills or serialized wgmma (CPU, NVRTC), and results against float64 (GPU)
on odd M, N and K, every layout, tall outputs, beta != 0, out= views, clusters splitting K
with empty slices, planned repeated launches and bit-identical reruns."""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import gpurt
from test_gemm_skinny import on_device, rand, run

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
decode = importlib.import_module("gpurt.kernels._gemm_decode")
Config, Problem = tune.Config, tune.Problem
gemm = gemm_mod.gemm


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    monkeypatch.delenv("GPURT_GEMM_DISABLE", raising=False)
    monkeypatch.delenv("GPURT_GEMM_NVRTC_OPTIONS", raising=False)


def test_decode_is_the_default_and_can_be_disabled(monkeypatch):
    assert tune.heuristic(problem(16, 4096, 4096)).kernel == "decode"
    assert any(c.kernel == "decode" for c in tune.candidates(problem(32, 4096, 4096)))
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "decode")
    assert tune.heuristic(problem(16, 4096, 4096)).kernel == "skinny"
    assert not any(c.kernel == "decode" for c in tune.candidates(problem(32, 4096, 4096)))
    monkeypatch.delenv("GPURT_GEMM_DISABLE")
    assert any(c.kernel == "decode" for c in tune.all_configs(problem(32, 4096, 4096)))


def problem(m=32, n=4096, k=4096, dt=tune.DT_BF16, a_k=True, b_k=False, tma=True, cap=(9, 0),
            sms=132) -> Problem:
    return Problem(m, n, k, dt, a_k, b_k, tma, tma, cap, sms)


def dc(bm=128, bn=32, stages=4, split=1) -> Config:
    return Config("decode", bm, bn, 64, stages=stages, split_k=split)


# ---- configs and choices (CPU) -------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    dict(bm=96), dict(bn=8), dict(bn=256), dict(bk=16), dict(bk=32, bm=256), dict(split_k=3),
    dict(bk=32, bm=192),
    dict(split_k=16),
    dict(stages=1), dict(stages=17), dict(wm=8, wn=64), dict(tma_store=True), dict(cluster_m=2),
])
def test_config_validation(fields):
    base = dict(kernel="decode", bm=128, bn=32, bk=64, stages=4)
    with pytest.raises(ValueError, match="decode"):
        Config(**{**base, **fields})


def test_config_geometry():
    config = dc(128, 16, 8, 4)
    assert config.threads == 288 and dc(64, 16).threads == 160 and dc(256, 16).threads == 288
    assert dc(192, 128, 5, 4).threads == 416  # three consumer warpgroups and a producer warp
    assert config.shared_mem(True, False) == 8 * 144 * 128 + 16 * 8 + 1024
    # a partial tile larger than a shallow ring takes its place
    assert dc(128, 128, 2).shared_mem(True, True) == 128 * 132 * 4 + 32 + 1024
    # template order: DT, BM, BN, STAGES, X (big operand) K-major, Y (small) K-major, SPLIT
    assert config.name_expression(2, False, True, True) == \
        "gemm_decode<2, 128, 16, 8, false, true, 4>"
    assert Config.from_json(config.to_json()) == config
    assert config.source == "gemm_decode.cu"
    assert gemm_launch.arch_for(config, (9, 0)) == "sm_90a"


def test_sides_put_the_small_side_on_wgmma_n():
    wide = decode.sides(16, 4096, True, False)  # C = D^T: X = op(b)^T, Y = op(a)
    assert wide == decode.Side(False, 4096, 16, False, True)
    tall = decode.sides(4096, 16, False, True)  # C = D: X = op(a), Y = op(b)^T
    assert tall == decode.Side(True, 4096, 16, False, True)
    assert decode.kernel_name(dc(), problem(4096, 16, 4096, a_k=False, b_k=True)) == \
        "gemm_decode<2, 128, 32, 4, false, true, 1>"


def test_eligibility():
    assert tune.eligible(problem(), dc())
    assert tune.eligible(problem(dt=tune.DT_F16), dc(64, 16, 8, 8))
    for p, words in ((problem(dt=tune.DT_F32), "float16"), (problem(dt=tune.DT_TF32), "float16"),
                     (problem(cap=(8, 0)), "sm_90"), (problem(tma=False), "16-byte"),
                     (problem(k=0), "K >= 1"), (problem(a_k=False), "64-wide")):
        assert words in tune.why_not(p, dc()), p
    assert tune.eligible(problem(a_k=False), dc(bn=64))  # an M-major A in 64-wide boxes
    assert "shared memory" in tune.why_not(problem(), dc(128, 128, 16))


@pytest.mark.parametrize("m,n,k,bm,bn,split", [
    (1, 4096, 4096, 64, 16, 2), (8, 14336, 4096, 128, 16, 1), (17, 4096, 4096, 64, 32, 2),
    (32, 11008, 4096, 128, 32, 1), (64, 14336, 4096, 128, 64, 1), (128, 4096, 4096, 64, 64, 1),
    (64, 4096, 4096, 64, 32, 1), (128, 4096, 11008, 64, 128, 2), (96, 4096, 4096, 64, 128, 2),
    (100, 4096, 11008, 64, 128, 2), (4096, 33, 4096, 64, 64, 2), (4096, 128, 4096, 64, 64, 1),
    (24, 4096, 256, 64, 32, 1),  # 4 K tiles: too few to split
])
def test_heuristic_picks_decode_on_hopper(m, n, k, bm, bn, split):
    p = problem(m, n, k)
    chosen = tune.heuristic(p)
    assert chosen.kernel == "decode" and tune.eligible(p, chosen)
    assert (chosen.bm, chosen.bn, chosen.split_k) == (bm, bn, split)
    assert chosen.shared_mem(True, False) <= 227 * 1024


def test_halves_take_cublas_tiling_at_4096_rows():
    """64 / 128 x 4096^2 (16-bit): 64-row tiles over the batch's two halves, unsplit, the
    deepest ring in 200 KiB; not TF32, K above 64 tiles or at most 32, an M-major batch in
    32-wide halves, nor grids that are not one CTA per SM for over half the SMs."""
    assert decode.halves(problem(128, 4096, 4096)) == decode.Tiles(64, 64, 12, 1)
    assert decode.halves(problem(64, 4096, 4096, dt=tune.DT_F16)) == decode.Tiles(64, 32, 16, 1)
    assert decode.halves(problem(128, 4096, 4096, a_k=False)) == decode.Tiles(64, 64, 12, 1)
    for p in (problem(128, 4096, 4096, dt=tune.DT_TF32), problem(128, 4096, 8192),
              problem(128, 4096, 2048), problem(64, 4096, 4096, a_k=False),
              problem(96, 4096, 4096), problem(128, 11008, 4096), problem(128, 2048, 4096)):
        assert decode.halves(p) is None, p
    assert decode.Tiles(64, 64, 12, 1) in decode.candidates(problem(128, 4096, 4096))


def test_splits_fill_one_wave_of_clusters():
    """K splits in 4 and 8 where those clusters still fit one wave (120 of 132 SMs) with 8+ K
    tiles per CTA; thin tiles split 8 for few-tile square shapes (few_tiles)."""
    assert (decode._split(problem(128, 1024, 8192), 64, 16)) == 4  # 64 CTAs; 128 would not fit
    assert decode._split(problem(1, 1024, 8192), 64, 15) == 8  # 120 CTAs
    assert decode._split(problem(1, 1024, 1024), 64, 15) == 2  # 16 K tiles: 8 per CTA
    assert decode._split(problem(128, 4096, 4096), 64, 64) == 2  # 4096 rows: unchanged
    assert decode._split(problem(128, 11008, 4096), 128, 86) == 1
    assert tune.heuristic(problem(128, 1024, 8192)).label() == "decode 64x128x64 s6 split4 g8"
    assert decode.few_tiles(problem(128, 128, 4096)) == decode.Tiles(64, 32, 6, 8)  # 64 CTAs
    assert decode.few_tiles(problem(256, 256, 8192)) == decode.Tiles(128, 64, 8, 8)  # tie: 128
    assert decode.few_tiles(problem(512, 512, 8192)) is None  # 128 CTAs at least
    assert decode.few_tiles(problem(384, 384, 8192)) is None  # no 128 x 128 tiles
    assert decode.few_tiles(problem(192, 320, 4096)) == decode.Tiles(64, 64, 6, 8)  # 120 CTAs
    assert decode.few_tiles(problem(128, 128, 2048)) is None  # 32 K tiles: 4 per CTA
    assert decode.few_tiles(problem(64, 64, 4096)) is None  # 2 tiles of 64 x 32
    assert decode.few_tiles(problem(128, 128, 4096, dt=tune.DT_F32)) is None
    # an M-major A (Y = op(a)) comes in 64-wide boxes: 64 x 64 tiles
    assert decode.few_tiles(problem(128, 256, 4096, a_k=False)) == decode.Tiles(64, 64, 6, 8)
    assert tune.eligible(problem(128, 256, 4096, a_k=False),
                         tune.heuristic(problem(128, 256, 4096, a_k=False)))


def test_heuristic_leaves_other_shapes_alone(monkeypatch):
    assert tune.heuristic(problem(129, 4096, 4096)).kernel == "wgmma"
    assert tune.heuristic(problem(16, 4096, 4096, tma=False)).kernel == "mma"  # split rows
    assert tune.heuristic(problem(16, 4096, 4096, cap=(8, 0))).kernel == "skinny"
    assert tune.heuristic(problem(64, 4096, 4096, tma=False)).kernel != "decode"
    assert tune.heuristic(problem(32, 4096, 4096, dt=tune.DT_F32)).kernel == "simt"
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "decode")
    assert tune.heuristic(problem(32, 4096, 4096)).kernel == "wgmma"
    assert tune.heuristic(problem(16, 4096, 4096)).kernel == "skinny"
    assert not any(c.kernel == "decode" for c in tune.candidates(problem(32, 4096, 4096)))


def test_candidates_and_all_configs():
    for p in (problem(16, 4096, 4096), problem(64, 11008, 4096), problem(128, 4096, 4096),
              problem(32, 4096, 4096, a_k=False, b_k=True)):
        found = tune.candidates(p)
        mine = [c for c in found if c.kernel == "decode"]
        assert len(mine) >= 2 and len(set(found)) == len(found)
        assert all(tune.eligible(p, c) for c in found)
        assert {c.bm for c in mine} == {64, 128}
        assert all(c in tune.all_configs(p) for c in mine)
    assert not any(c.kernel == "decode" for c in tune.candidates(problem(129, 4096, 4096)))
    assert gemm_launch.programs("sm_90a")  # the decode programs are among those precompiled
    assert any(src == "gemm_decode.cu" for src, _, _ in gemm_launch.programs("sm_90"))


def _names():
    names = set()
    for dt in (1, 2):
        for bm in (64, 128, 256):
            for bn in (16, 32, 64, 128):
                names.add(dc(bm, bn, 4, 8 if bn == 16 else 1).name_expression(dt, False, True,
                                                                              True))
    for x_k in (True, False):
        for y_k in (True, False):
            names.add(dc(128, 64, 6, 4).name_expression(2, x_k, y_k, True))
            names.add(dc(64, 128, 4, 2).name_expression(1, x_k, y_k, True))
            names.add(dc(192, 128, 5, 4).name_expression(2, x_k, y_k, True))  # 3 consumers
    names.add(dc(192, 64, 5, 2).name_expression(1, False, True, True))
    return sorted(names)


def test_variants_compile_without_spills_or_serialized_wgmma(tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = _names()
    module = gpurt.compile(gemm_launch.text("gemm_decode.cu"), options=["--ptxas-options=-v"],
                           name_expressions=names, arch="sm_90a", program_name="gemm_decode.cu",
                           headers=gemm_launch.headers("gemm_decode.cu"))
    log = module.log
    assert set(module.lowered_names) == set(names)
    assert "warning" not in log.lower() and "C75" not in log, log
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(names) and set(spills) == {"0"}, log


# ---- GPU: results against float64 ----------------------------------------------------------------

DTYPES = [gpurt.bfloat16, np.float16]


def tiles(m, n, k, bm=128, split=None, a_k=True, b_k=False):
    return tune._decode_config(decode._tiles(problem(m, n, k, a_k=a_k, b_k=b_k), bm, split))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bm,split", [(128, 1), (128, 4), (64, 2), (64, 8), (256, 1), (256, 2)])
def test_odd_shapes(gpu_state, dtype, bm, split):
    rng = np.random.default_rng()
    for m, n, k in [(3, 4096, 1000), (17, 264, 4104), (33, 1000, 72), (100, 520, 1000),
                    (128, 136, 200), (1, 8, 8), (9, 4096, 64)]:
        run(rng, m, n, k, dtype, tiles(m, n, k, bm, split))


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 2, 4])
def test_three_consumer_tiles(gpu_state, split):
    """192-row tiles (3 consumer warpgroups): a last tile past P, K tails, the four transposes
    where eligible, tall C, alpha and beta, bf16 and fp16; then captured in a graph and
    replayed on fresh inputs."""
    from test_gemm import check_replays, poisoned

    rng = np.random.default_rng()
    for m, n, k in [(128, 4096, 1000), (17, 1000, 4104), (64, 200, 520), (1000, 24, 520)]:
        for a_t, b_t in ((False, False), (False, True), (True, False), (True, True)):
            if (a_t and m % 8) or (m > n and (n % 8 or not b_t)):
                continue  # M-major A needs 16-byte rows; a tall C's Y is op(b)^T, K-major
            config = tiles(m, n, k, 192, split, not a_t, b_t)
            dtype = np.float16 if b_t else gpurt.bfloat16
            run(rng, m, n, k, dtype, config, a_t=a_t, b_t=b_t, out_t=a_t and b_t,
                beta=0.5 if a_t != b_t else 0.0, alpha=-1.5)
    config = tiles(128, 4096, 4096, 192, split)
    da = gpurt.asarray(rand(rng, (128, 4096), gpurt.bfloat16))
    db = gpurt.asarray(rand(rng, (4096, 4096), gpurt.bfloat16))
    out = poisoned((128, 4096), gpurt.bfloat16)
    gemm(da, db, out=out, config=config)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm(da, db, out=out, config=config)
    check_replays(graph, da, db, out, rng, config.label())
    del graph


@pytest.mark.gpu
@pytest.mark.parametrize("bn", [16, 32, 64])
def test_thin_tiles_split_8_on_square_shapes(gpu_state, bn):
    """Tiles narrower than the small side with K split over clusters of 8 (the few-tile
    square shapes of wgmma split-K, session 9): square and odd sizes, the four transposes
    where the small operand may be M-major (64-wide boxes), alpha and beta."""
    rng = np.random.default_rng()
    for m, n, k in [(128, 128, 4096), (136, 200, 2056), (72, 72, 1000)]:
        for a_t, b_t in ((False, False), (False, True), (True, False), (True, True)):
            if a_t and bn % 64:
                continue  # Y = op(a) M-major: 64-wide boxes
            run(rng, m, n, k, np.float16 if b_t else gpurt.bfloat16, dc(64, bn, 4, 8),
                a_t=a_t, b_t=b_t, beta=0.5 if a_t != b_t else 0.0, alpha=-1.5)


@pytest.mark.gpu
@pytest.mark.parametrize("a_t,b_t,out_t", [(a, b, o) for a in (False, True)
                                           for b in (False, True) for o in (False, True)])
def test_layouts_tall_outputs_and_beta(gpu_state, a_t, b_t, out_t):
    rng = np.random.default_rng()
    # a_t stores A column-major (M-major): its rows of M elements need 16 bytes
    for m, n, k in [(16 if a_t else 17, 1000, 520), (64, 264, 1000), (1000, 24, 520)]:
        a_k, b_k = not a_t, b_t
        config = tiles(m, n, k, 128, 2, a_k, b_k)
        if m > n and (n % 8 or not b_k):
            continue  # a tall C's Y is op(b)^T: 16-byte rows, 64-wide boxes when N-major
        run(rng, m, n, k, gpurt.bfloat16, config, a_t=a_t, b_t=b_t, out_t=out_t,
            beta=0.5 if out_t else 0.0, alpha=-1.5)


@pytest.mark.gpu
def test_gemms_own_choice_and_out_views(gpu_state, monkeypatch):
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    for m, n, k in [(17, 4096, 4096), (33, 11008, 1024), (100, 2048, 4096), (4096, 64, 1024)]:
        p = problem(m, n, k)
        assert tune.heuristic(p).kernel == "decode"
        run(rng, m, n, k, gpurt.bfloat16, None, beta=-1.0)
    # out= a view into a larger buffer (row pitch 4104), beta with c = out
    a, b = rand(rng, (40, 1024), gpurt.bfloat16), rand(rng, (1024, 4096), gpurt.bfloat16)
    big = rand(rng, (40, 4104), gpurt.bfloat16)
    dbig = gpurt.asarray(big)
    out = dbig[:, 8:]
    gemm(on_device(a), on_device(b), out=out, beta=2.0, config=tiles(40, 4096, 1024, 128, 4))
    want = a.astype(np.float64) @ b.astype(np.float64) + 2.0 * big[:, 8:].astype(np.float64)
    got = dbig.numpy()
    assert np.linalg.norm(got[:, 8:] - want) / np.linalg.norm(want) < 1e-2
    assert np.array_equal(got[:, :8].view(np.uint16), big[:, :8].view(np.uint16))


@pytest.mark.gpu
def test_gemms_own_choice_on_few_tile_shapes(gpu_state, monkeypatch):
    """gemm's own choice where K splits over clusters of 8 (few_tiles) or 4 (_split): against
    float64 in bf16 and fp16 (a K-major B, alpha, beta), then captured in a graph and
    replayed on fresh inputs."""
    from test_gemm import check_replays, poisoned

    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    for m, n, k in [(128, 128, 4096), (256, 256, 8192), (128, 1024, 8192)]:
        chosen = tune.heuristic(problem(m, n, k))
        assert chosen.kernel == "decode" and chosen.split_k in (4, 8), chosen
        run(rng, m, n, k, gpurt.bfloat16, None, beta=-1.0)
        run(rng, m, n, k, np.float16, None, b_t=True, alpha=0.5)
        da = gpurt.asarray(rand(rng, (m, k), gpurt.bfloat16))
        db = gpurt.asarray(rand(rng, (k, n), gpurt.bfloat16))
        out = poisoned((m, n), gpurt.bfloat16)
        gemm(da, db, out=out)  # planned before the capture
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph):
            gemm(da, db, out=out)
        check_replays(graph, da, db, out, rng, chosen.label())
        del graph


@pytest.mark.gpu
def test_gemms_own_choice_on_batch_halves(gpu_state, monkeypatch):
    """gemm's own choice at 64 / 128 x 4096^2 (halves: 64-row tiles, K unsplit, 12-16
    stages): both weight layouts and fp16 with beta, then captured in a graph and replayed."""
    from test_gemm import check_replays, poisoned

    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    for m in (64, 128):
        assert tune.heuristic(problem(m, 4096, 4096)).split_k == 1
        run(rng, m, 4096, 4096, gpurt.bfloat16, None)
        run(rng, m, 4096, 4096, gpurt.bfloat16, None, b_t=True)
        run(rng, m, 4096, 4096, np.float16, None, beta=0.5, alpha=-1.5)
    da = gpurt.asarray(rand(rng, (128, 4096), gpurt.bfloat16))
    db = gpurt.asarray(rand(rng, (4096, 4096), gpurt.bfloat16))
    out = poisoned((128, 4096), gpurt.bfloat16)
    gemm(da, db, out=out)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm(da, db, out=out)
    check_replays(graph, da, db, out, rng, "128x4096x4096")
    del graph


@pytest.mark.gpu
def test_planned_relaunches_and_deterministic(gpu_state):
    rng = np.random.default_rng()
    config = tiles(24, 4096, 2048, 128, 4)
    a = [gpurt.asarray(rand(rng, (24, 2048), gpurt.bfloat16)) for _ in range(2)]
    b = [gpurt.asarray(rand(rng, (2048, 4096), gpurt.bfloat16)) for _ in range(2)]
    out = gpurt.empty((24, 4096), dtype=gpurt.bfloat16)
    for i in (0, 1, 0, 1):  # the planned path re-encodes the tensor maps of new pointers
        out.copy_(np.full((24, 4096), np.nan, dtype=np.float32).astype(gpurt.bfloat16))
        gemm(a[i], b[i], out=out, config=config)
        want = a[i].numpy().astype(np.float64) @ b[i].numpy().astype(np.float64)
        got = out.numpy().astype(np.float64)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    first = gemm(a[0], b[0], config=config).numpy()
    for _ in range(3):  # the cluster's partial tiles are summed in a fixed order
        assert np.array_equal(gemm(a[0], b[0], config=config).numpy().view(np.uint16),
                              first.view(np.uint16))
