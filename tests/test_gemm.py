"""gpurt.kernels.gemm: configs, heuristics and the autotuner (CPU), every kernel variant
compiled for sm_80/sm_90/sm_90a (CPU, NVRTC), and results against float64 (GPU)."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib
import json
import os
import re
import stat
import warnings

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
plans = importlib.import_module("gpurt.kernels._gemm_plan")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
simt_model = importlib.import_module("gpurt.kernels._gemm_simt_model")
tuning = importlib.import_module("gpurt.kernels._gemm_tuner")
workspace_mod = importlib.import_module("gpurt.kernels._gemm_workspace")
gemm = gemm_mod.gemm
Config, Problem = tune.Config, tune.Problem

H100 = ((9, 0), 132)


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    """Debugging switches from the environment must not change what these tests see."""
    monkeypatch.delenv("GPURT_GEMM_DISABLE", raising=False)
    monkeypatch.delenv("GPURT_GEMM_NVRTC_OPTIONS", raising=False)


def problem(m=4096, n=4096, k=4096, dt=tune.DT_BF16, a_k=True, b_k=False, vec=True, tma=True,
            cap=H100[0], sms=H100[1], pitch128=True) -> Problem:
    return Problem(m, n, k, dt, a_k, b_k, vec, tma, cap, sms, pitch128=pitch128)


# ---- configs -------------------------------------------------------------------------------------


def test_config_validation():
    with pytest.raises(ValueError, match="unknown"):
        Config("cublas", 128, 128, 32)
    with pytest.raises(ValueError, match="wgmma"):
        Config("wgmma", 32, 256, 64)  # 64- and 128-row tiles only
    with pytest.raises(ValueError, match="wgmma"):
        Config("wgmma", 128, 160, 64)
    with pytest.raises(ValueError, match="wgmma"):
        Config("wgmma", 128, 192, 32)  # 128 x 192: 16-bit only (TF32's kernel has none)
    with pytest.raises(ValueError, match="split"):
        Config("wgmma", 128, 256, 64, stages=4, split_k=2, cluster_m=2)
    with pytest.raises(ValueError, match="split"):
        Config("wgmma", 128, 256, 32, stages=4, split_k=2)
    with pytest.raises(ValueError, match="simt"):
        Config("simt", 128, 96, 8)
    with pytest.raises(ValueError, match="simt"):
        Config("simt", 128, 128, 32)
    with pytest.raises(ValueError, match="simt"):
        Config("simt", 128, 192, 8, 32, 128)
    with pytest.raises(ValueError, match="warp tiles"):
        Config("mma", 128, 128, 32, 48, 64)
    with pytest.raises(ValueError, match="invalid"):
        Config("mma", 128, 128, 32, 64, 64, stages=0)
    with pytest.raises(ValueError, match="cluster"):
        Config("mma", 128, 128, 32, 64, 64, cluster_m=2)
    with pytest.raises(ValueError, match="cluster"):
        Config("wgmma", 128, 256, 64, stages=4, cluster_m=4)
    with pytest.raises(ValueError, match="TMA"):
        Config("mma", 128, 128, 32, 64, 64, tma_store=True)
    with pytest.raises(ValueError, match="TF32"):
        Config("wgmma", 128, 256, 32, stages=4, cluster_m=2)
    with pytest.raises(ValueError, match="wgmma"):
        Config("wgmma", 128, 256, 16, stages=4)
    with pytest.raises(ValueError, match="wgmma"):
        Config("wgmma", 128, 32, 64, stages=4)
    with pytest.raises(ValueError, match="bn >= 128"):
        Config("wgmma", 128, 64, 64, stages=4, cluster_m=2)


def test_config_geometry():
    wide = Config("wgmma", 128, 256, 64, stages=4)
    assert wide.threads == 384
    assert wide.shared_mem(True, False) == 4 * (128 + 256) * 64 * 2 + 64 + 1024
    assert wide.name_expression(2, True, False, True) == \
        "gemm_wgmma<2, 256, 4, true, false, 1, false>"
    pair = dataclasses.replace(wide, cluster_m=2, tma_store=True)
    assert pair.name_expression(1, False, True, True) == \
        "gemm_wgmma<1, 256, 4, false, true, 2, true>"
    assert "c2" in pair.label() and "tmaC" in pair.label()
    assert pair.shared_mem(True, True) == wide.shared_mem(True, True) + 2 * 64 * 128 * 2
    assert pair.shared_mem(True, True) <= 227 * 1024
    simt = Config("simt", 128, 128, 8, stages=4)
    # a ring of 4 stages of fp32 A [8][128 + 4] and B [8][128 + 4] tiles, whatever the layout
    assert simt.threads == 256 and simt.shared_mem(True, True, 4) == 4 * 2 * 8 * 132 * 4
    assert simt.shared_mem(False, False, 4) == simt.shared_mem(True, True, 4)
    assert simt.name_expression(0, False, True, False) == \
        "gemm_simt<128, 128, 8, 8, 4, false, true, false>"
    assert "s4" in simt.label()
    wide_simt = Config("simt", 128, 256, 16, 32, 128, stages=3)
    assert wide_simt.threads == 256 and "w32x128" in wide_simt.label()
    assert wide_simt.name_expression(0, True, False, True) == \
        "gemm_simt<128, 256, 16, 16, 3, true, false, true>"
    assert Config("simt", 128, 128, 16, 32, 128, stages=3).threads == 128
    mma = Config("mma", 128, 256, 32, 64, 64, stages=3)
    assert mma.threads == 256
    # A K-major: 128 rows of 32+8; B N-major: 32 rows of 256+8 (2-byte elements)
    assert mma.shared_mem(True, False, 2) == 3 * (128 * 40 + 32 * 264) * 2
    assert mma.name_expression(1, True, True, True) == \
        "gemm_mma<1, 128, 256, 32, 64, 64, 3, true, true, true>"
    assert mma.tiles(129, 256) == 2
    assert Config.from_json(json.loads(json.dumps(mma.to_json()))) == mma
    assert "split4" in dataclasses.replace(mma, split_k=4).label()


def test_wgmma_tf32_geometry():
    """128-byte rows of 32 fp32 take the bytes of 64 16-bit elements; B must be K-major, so
    an N-major B turns the problem around (C^T = B^T A^T, the output stored transposed)."""
    wide, narrow = tune._WGMMA_TF32[0], tune._WGMMA_TF32[1]
    bf16 = Config("wgmma", 128, 256, 64, stages=4, tma_store=True)
    assert wide.shared_mem(True, False, 4) == bf16.shared_mem(True, False, 2) <= 227 * 1024
    assert narrow.shared_mem(True, True, 4) <= 227 * 1024
    tf32 = tune.DT_TF32
    assert wide.name_expression(tf32, True, True, True) == \
        "gemm_wgmma_tf32<256, 4, true, false, true>"
    assert wide.name_expression(tf32, True, False, True) == \
        "gemm_wgmma_tf32<256, 4, false, true, true>"  # swapped: the old B is M-major A
    assert wide.name_expression(tf32, False, True, True) == \
        "gemm_wgmma_tf32<256, 4, false, false, true>"
    assert gemm_launch.source_of(wide, tf32) == "gemm_wgmma_tf32.cu"
    assert gemm_launch.source_of(bf16, tune.DT_BF16) == "gemm_wgmma.cu"


def test_eligibility():
    wide = Config("wgmma", 128, 256, 64, stages=4)
    assert tune.eligible(problem(), wide)
    assert not tune.eligible(problem(tma=False), wide)
    assert not tune.eligible(problem(cap=(8, 9)), wide)
    assert not tune.eligible(problem(cap=(10, 0)), wide)  # sm_90a code runs on 9.0 only
    assert not tune.eligible(problem(dt=tune.DT_F32), wide)
    mma = tune._MMA[0]
    assert tune.eligible(problem(cap=(8, 0)), mma)
    assert not tune.eligible(problem(cap=(7, 5)), mma)
    assert not tune.eligible(problem(dt=tune.DT_TF32), mma)  # bk 32 is the 16-bit tiling
    assert tune.eligible(problem(dt=tune.DT_TF32), tune._TF32[0])
    assert tune.eligible(problem(dt=tune.DT_F32), tune._SIMT[0])
    assert not tune.eligible(problem(dt=tune.DT_F32), mma)
    small_smem = dataclasses.replace(problem(), max_shared=48 * 1024)
    assert not tune.eligible(small_smem, wide)
    tf32 = tune._WGMMA_TF32[0]
    for a_k, b_k in ((True, False), (True, True), (False, True)):
        assert tune.eligible(problem(dt=tune.DT_TF32, a_k=a_k, b_k=b_k), tf32)
    assert "K-major" in tune.why_not(problem(dt=tune.DT_TF32, a_k=False, b_k=False), tf32)
    assert "TF32" in tune.why_not(problem(), tf32)  # bk 32 is the TF32 tiling
    assert "16-bit" in tune.why_not(problem(dt=tune.DT_TF32), wide)
    assert "TMA" in tune.why_not(problem(dt=tune.DT_TF32, tma=False), tf32)
    assert not tune.eligible(problem(dt=tune.DT_F32), tf32)


@pytest.mark.parametrize("dims,kind", [
    ((4096, 4096, 4096), "wgmma"),
    ((8192, 8192, 512), "wgmma"),
    ((16, 4096, 4096), "decode"),    # decode shape: B streamed once, K split over a cluster
    ((127, 257, 61), "mma"),         # small: 32 x 32 mma tiles (_gemm_tune._small)
])
def test_heuristic_bf16_hopper(dims, kind, monkeypatch):
    chosen = tune.heuristic(problem(*dims))
    assert chosen.kernel == kind
    assert chosen.tma_store == (kind == "wgmma")
    assert tune.eligible(problem(*dims), chosen)
    if dims[0] == 16:
        assert chosen.split_k > 1


def test_disable_switch(monkeypatch):
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "wgmma, simt")
    assert tune.disabled_kernels() == {"wgmma", "simt"}
    assert not tune.eligible(problem(), tune._WGMMA[0])
    assert tune.heuristic(problem()).kernel == "mma"
    assert all(c.kernel == "mma" for c in tune.candidates(problem()))
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "cluster,tma_store")
    found = tune.candidates(problem())
    assert any(c.kernel == "wgmma" for c in found)
    assert not any(c.cluster_m > 1 or c.tma_store for c in found)


def test_heuristic_fallbacks():
    assert tune.heuristic(problem(tma=False, vec=False)).kernel == "mma"
    assert tune.heuristic(problem(cap=(8, 0))).kernel == "mma"
    fp32 = tune.heuristic(problem(dt=tune.DT_F32))
    assert fp32.kernel == "simt" and (fp32.bm, fp32.bn, fp32.wn) == (128, 256, 128)
    turing = dataclasses.replace(problem(dt=tune.DT_F32, cap=(7, 5)), max_shared=64 * 1024)
    assert tune.heuristic(turing).bm == 64 and tune.eligible(turing, tune.heuristic(turing))
    assert tune.heuristic(problem(64, 64, 64, dt=tune.DT_F32)).bm <= 64
    tf32 = tune.heuristic(problem(dt=tune.DT_TF32))  # N-major B: a transposed output
    assert tf32.kernel == "wgmma" and tf32.bk == 32 and tf32.bn == 256 and not tf32.tma_store
    tf32 = tune.heuristic(problem(dt=tune.DT_TF32, b_k=True))
    assert tf32.kernel == "wgmma" and tf32.bn == 256 and tf32.tma_store
    tf32 = tune.heuristic(problem(1000, 1000, 1000, dt=tune.DT_TF32))  # 32 wide tiles
    assert tf32.kernel == "wgmma" and tf32.bn == 64
    for dims in ((1024, 1024, 1024), (128, 11008, 4096)):  # few tiles, still wgmma
        assert tune.heuristic(problem(*dims, dt=tune.DT_TF32)).kernel == "wgmma"
    for dims in ((16, 4096, 4096), (128, 4096, 4096)):  # decode tiles (session 9 s9-tf32m)
        assert tune.heuristic(problem(*dims, dt=tune.DT_TF32)).kernel == "decode"
    for fallback in (problem(dt=tune.DT_TF32, a_k=False, b_k=False),
                     problem(dt=tune.DT_TF32, tma=False), problem(dt=tune.DT_TF32, cap=(8, 0)),
                     problem(16, 4096, 4096, dt=tune.DT_TF32, tma=False)):  # thin: split-K mma
        tf32 = tune.heuristic(fallback)
        assert tf32.kernel == "mma" and tf32.bk == 16 and tune.eligible(fallback, tf32)
    skinny = tune.heuristic(problem(8, 64, 65536, dt=tune.DT_F32))
    assert 1 < skinny.split_k <= 32


def test_candidates_are_eligible_and_unique():
    for p in (problem(), problem(16, 4096, 4096), problem(dt=tune.DT_F32),
              problem(dt=tune.DT_TF32), problem(cap=(8, 6), tma=False),
              problem(dt=tune.DT_F16, a_k=False, b_k=True)):
        found = tune.candidates(p)
        assert found[0] == tune.heuristic(p)
        assert len(set(found)) == len(found) >= 2
        assert all(tune.eligible(p, c) for c in found)
        assert all(c.cluster_m == 1 for c in found)


def test_wgmma_split_for_few_tiles(monkeypatch):
    """Decode shapes: the 16-bit wgmma tiles split K until their items fill the waves; on
    128 x 64 tiles in 4 slices where those fit."""
    assert tune._wave_split(problem(), tune._WGMMA[1]) == 1  # 1024 tiles
    assert tune._wave_split(problem(128, 4096, 4096), tune._WGMMA[1]) == 4  # 32 tiles: 128
    assert tune._wave_split(problem(64, 11008, 4096), tune._WGMMA[1]) == 3  # 86: 258 of 264
    assert tune._wave_split(problem(128, 4096, 256), tune._WGMMA[1]) == 1  # 4 K tiles
    assert tune._wave_split(problem(128, 14336, 4096), tune._WGMMA[1]) == 4  # partials cap
    assert tune._wave_split(problem(1000, 1000, 1000), tune._WGMMA[1]) == 1
    chosen = tune.heuristic(problem(128, 4096, 4096))
    assert (chosen.kernel, chosen.split_k) == ("decode", 1)  # tests/test_gemm_decode.py
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "decode")
    chosen = tune.heuristic(problem(128, 4096, 4096))
    assert (chosen.kernel, chosen.bn, chosen.split_k, chosen.tma_store) == ("wgmma", 128, 4, False)
    assert tune.heuristic(problem(64, 14336, 4096)).split_k == 7
    assert tune.heuristic(problem(1000, 1000, 1000)) == tune._WGMMA_64  # 64 x 128, unsplit
    found = tune.candidates(problem(128, 4096, 4096))
    assert dataclasses.replace(tune._WGMMA[1], split_k=4) in found
    # s8-splitk2: 128 x 64 tiles in 4 slices where those items fit the SMs, 16+ K tiles deep
    narrow = dataclasses.replace(tune._WGMMA[7], split_k=4)
    for shape in [(128, 128, 4096), (256, 256, 8192), (512, 512, 8192), (64, 64, 4096)]:
        assert tune.heuristic(problem(*shape)) == narrow and narrow in tune.candidates(
            problem(*shape))  # decode disabled
    # s9-splitk: thin decode tiles split over clusters of 8 where 8+ of them fit one wave
    monkeypatch.delenv("GPURT_GEMM_DISABLE")
    assert tune.heuristic(problem(512, 512, 8192)) == narrow  # 16 x 8 CTAs: two waves
    assert tune.heuristic(problem(64, 64, 4096)) == narrow  # 2 decode tiles of 64 x 32
    assert tune.heuristic(problem(128, 128, 4096)).label() == "decode 64x32x64 s6 split8 g8"
    assert tune.heuristic(problem(256, 256, 8192)).label() == "decode 128x64x64 s8 split8 g8"
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "decode")
    assert tune._narrow_split(problem(128, 128, 2048)) == 1  # slices of 8 K tiles
    assert tune._narrow_split(problem(1024, 512, 8192)) == 1  # 64 tiles: 4 slices won't fit
    assert tune._narrow_split(problem(128, 128, 4096, pitch128=False)) == 1
    assert tune.heuristic(problem(128, 128, 4096, pitch128=False)).bn == 128
    assert all(tune.eligible(problem(128, 4096, 4096), c) for c in found)
    names = gemm_launch.kernel_names(dataclasses.replace(tune._WGMMA[1], split_k=4),
                                     problem(128, 4096, 4096))
    assert names == ("gemm_wgmma_splitk<2, 128, 6, true, false, 1, false>",)  # one launch
    assert gemm_launch.kernel_names(tune._WGMMA[1], problem(128, 4096, 4096))[0].startswith(
        "gemm_wgmma<")


def test_wave_fill_tiles(monkeypatch):
    """16-bit and TF32 wgmma grids take the tile width whose waves finish first (time of a
    wave ~ width / rate): narrow tiles where wide ones leave SMs idle, wide ones otherwise."""
    narrow16, narrow32 = tune._WGMMA[7], tune._WGMMA_TF32[4]
    assert (narrow16.bn, narrow32.bn) == (64, 64) and narrow16.tma_store
    for dt, narrow in ((tune.DT_BF16, narrow16), (tune.DT_F16, narrow16),
                       (tune.DT_TF32, narrow32)):
        for dims in ((1024, 1024, 1024), (1000, 1000, 1000), (512, 512, 512)):
            # 128 tiles: one wave (16-bit: 64 x 128 tiles, as many, at a higher rate; at
            # 512^3, 32 of them, 64 x 80 tiles of C^T: 56, session 14)
            want = tune._WGMMA_64 if dt != tune.DT_TF32 else narrow
            if dims[0] == 512 and dt != tune.DT_TF32:
                want = tune._WGMMA_64N80_T
            assert tune.heuristic(problem(*dims, dt=dt)) == want
        for dims in ((2000, 2000, 2000), (3000, 5000, 2000),
                     (4096, 4096, 4096), (8192, 8192, 512)):  # wide tiles fill their waves
            chosen = tune.heuristic(problem(*dims, dt=dt))
            if dims[2] == 512 and dt != tune.DT_TF32:  # short K: ping-pong 128 x 128 tiles
                assert chosen == tune._PINGPONG, dims
                continue
            assert chosen.kernel == "wgmma" and chosen.bn == 256, dims
        # 72 tiles of 128 x 256 on 132 SMs, 96 of 128 x 192 (16-bit only; H100 s10-tile192)
        # or of 192 x 128, which took less time (H200 s11-tile192r), then 128 of 192 x 96 on
        # C^T (H100, session 13: x0.94 of cuBLAS against x0.79)
        chosen = tune.heuristic(problem(1536, 1536, 1536, dt=dt))
        assert (chosen.bm, chosen.bn, chosen.swap) == (
            (128, 256, False) if dt == tune.DT_TF32 else (192, 96, True))
        assert narrow in tune.candidates(problem(1024, 1024, 1024, dt=dt))
    # rows that are not 128-byte multiples (1000 16-bit elements): 128 x 128 beats 128 x 64 in
    # one wave (H100 1.17x, H200 1.07x), and 64 x 128 beats both (H200, s11-tile64: 10.8 us
    # against 11.0), in 2-CTA clusters along M (s12-tile64n); TF32 keeps its choice (even
    # there); wider grids keep 128 x 256
    for dt in (tune.DT_BF16, tune.DT_F16):
        for dims in ((1000, 1000, 1000), (1024, 1024, 1024)):
            chosen = tune.heuristic(problem(*dims, dt=dt, pitch128=False))
            assert chosen == tune._WGMMA_64_C2, dims
        for dims in ((2000, 2000, 2000), (3000, 5000, 2000)):
            assert tune.heuristic(problem(*dims, dt=dt, pitch128=False)).bn == 256, dims
    assert tune.heuristic(problem(1000, 1000, 1000, dt=tune.DT_TF32, pitch128=False)) == narrow32
    # the rule follows the device: 2048^2 fills 132 SMs with 128 x 256 tiles, 264 with 128 x 128
    assert tune.heuristic(problem(2048, 2048, 2048)).bn == 256
    assert tune.heuristic(problem(2048, 2048, 2048, sms=264)) == tune._WGMMA[5]
    assert tune.heuristic(problem(2048, 2048, 2048, sms=528)) == tune._WGMMA_64  # 512 tiles
    # C 64 wide: TF32 decode tiles (session 9 s9-tf32m); without them (TF32 turns it onto
    # wgmma's N) the same tiles, the narrow one does least work
    assert tune.heuristic(problem(64, 14336, 4096, dt=tune.DT_TF32)).kernel == "decode"
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "decode")
    assert tune.heuristic(problem(64, 14336, 4096, dt=tune.DT_TF32)) == narrow32
    monkeypatch.delenv("GPURT_GEMM_DISABLE")
    # one wave of wide tiles beats four of narrow ones, one of narrow beats one of wide;
    # ineligible configs are skipped
    def waves(config):
        return 132 * (4 if config.bn == 64 else 1)

    pair = [tune._WGMMA[4], narrow16]
    assert tune._fill_best(problem(), pair, waves) == tune._WGMMA[4]
    assert tune._fill_best(problem(), pair, lambda config: 132) == narrow16
    smem = dataclasses.replace(problem(1024, 1024, 1024), max_shared=150 * 1024)
    assert tune._fill_best(smem, [tune._WGMMA[5], narrow16], lambda c: 1) == tune._WGMMA[5]
    # the tile fits shared memory with its TMA-store staging
    assert narrow16.shared_mem(True, False) <= 227 * 1024
    assert narrow32.shared_mem(True, False, 4) <= 227 * 1024


def test_simt_wave_model():
    """The simt choices the H100 sweeps of sessions 8, 9 and 21 measured fastest
    (notes_gemm.md)."""
    def pick(m, n, k, **kw):
        found = tune.heuristic(problem(m, n, k, dt=tune.DT_F32, **kw))
        return found.bm, found.bn, found.wn, found.split_k

    assert pick(128, 4096, 4096) == (128, 256, 128, 8)  # 16 tiles x 8 slices: one wave
    assert pick(64, 4096, 4096) == (64, 128, 0, 8)
    assert pick(128, 14336, 4096) == (128, 256, 128, 7)
    assert pick(32, 11008, 4096) == (32, 128, 0, 6)  # no rows computed in vain
    assert pick(16, 4096, 4096) == (32, 128, 0, 16)
    assert pick(1000, 1000, 1000) == (128, 256, 128, 4)  # one wave, its ending spread
    assert pick(2053, 3001, 1999, vec=False, tma=False) == (96, 128, 0, 1)  # two whole waves
    # unpacked (the pack route copies B there): 96 x 128 and 128 x 128 tie (session 21)
    assert pick(4099, 4099, 4099, vec=False, tma=False) == (96, 128, 0, 1)
    # odd pitches at M <= 128 (session 21, once split-K's partial rows were aligned): the wide
    # tile split as on aligned rows, 0.91-0.95 of cuBLAS against 0.83-0.88 for 128 x 128
    assert pick(97, 4093, 4099, vec=False, tma=False) == (128, 256, 128, 8)
    assert pick(127, 8191, 2053, vec=False, tma=False) == (128, 256, 128, 4)
    # B given N x K (nn.Linear's weight) at 96-257 rows: the 96-row tile (session 21, 0.80-1.00
    # of cuBLAS against 0.69-0.86 for the 128-row tiles)
    assert pick(96, 4096, 4096, b_k=True) == (96, 128, 0, 8)
    assert pick(257, 14336, 4096, b_k=True) == (96, 128, 0, 7)
    # ... and at 16-64 rows the narrow tiles (session 21: 1.0-1.3x cuBLAS at 16-32 rows)
    assert pick(32, 11008, 4096, b_k=True) == (32, 128, 0, 6)
    assert pick(64, 4096, 4096, b_k=True) == (64, 64, 0, 8)
    # under 2^24 multiply-adds a few latency-bound CTAs: K split in powers of two down to a
    # K tile or two a slice (session 22: 1.2-2.9x faster than unsplit on an H100)
    assert pick(128, 128, 128) == (64, 64, 0, 8)
    assert pick(127, 257, 61) == (64, 64, 0, 8)
    assert pick(64, 127, 255) == (64, 64, 0, 16)
    assert pick(33, 65, 4097) == (64, 64, 0, 32)
    assert pick(32, 32, 32)[3] == 1  # under 2^18: nothing is worth a second kernel
    for dims in ((64, 64, 64), (100, 300, 100), (200, 200, 200), (1, 256, 256)):
        p = problem(*dims, dt=tune.DT_F32)
        for config in tune._SIMT:
            split = simt_model.split_for(p, config)
            assert split & (split - 1) == 0 and split <= -(-p.k // config.bk)
    assert pick(4096, 4096, 4096) == (128, 256, 128, 1)
    assert pick(3000, 5000, 2000)[3] == 1  # 3.6 waves: its partial sums would outgrow L2
    for dims in ((1, 4096, 4096), (64, 4096, 4096), (8, 64, 65536), (300, 700, 5000)):
        p = problem(*dims, dt=tune.DT_F32)
        for config in tune._SIMT:
            split = simt_model.split_for(p, config)
            k_tiles = -(-p.k // config.bk)
            assert split == 1 or k_tiles // split >= 8
            assert -(-k_tiles // -(-k_tiles // split)) == split  # no empty slice


def test_split_for():
    assert tune._split_for(problem(), tune._MMA[0]) == 1  # enough tiles
    assert tune._split_for(problem(16, 4096, 256), tune._MMA[3]) == 1  # K too short
    split = tune._split_for(problem(16, 256, 8192), tune._MMA[3])
    assert 16 <= split <= 32 and split <= 8192 // 128
    assert tune._split_for(problem(16, 4096, 4096), tune._MMA[2]) == 17  # 32 tiles -> ~4/SM


def test_few_rows_on_split_rows_take_the_small_tile_split():
    """M = 5..16 times a B on rows no vector load reads whole: 32 x 32 x 64 split-K mma where
    the tiles leave room for a split (16 x 4099^2: split 4); not on 16-byte rows, above 16
    rows, nor where the grid is full or K short."""
    def split_rows(m, n, k, dt=tune.DT_BF16):
        return problem(m, n, k, dt, vec=False, tma=False, pitch128=False)

    for m, dt in ((16, tune.DT_BF16), (16, tune.DT_F16), (8, tune.DT_BF16), (5, tune.DT_F16)):
        chosen = tune.heuristic(split_rows(m, 4099, 4099, dt))
        assert chosen == dataclasses.replace(tune._MMA_SMALL, split_k=4), (m, chosen)
    for p in (split_rows(17, 4099, 4099), split_rows(16, 14341, 4099),
              split_rows(16, 2053, 1999), problem(16, 4096, 4096),
              dataclasses.replace(split_rows(16, 4099, 4099), b_kmajor=True)):
        assert tune.heuristic(p).bm != tune._MMA_SMALL.bm, p


@pytest.mark.gpu
def test_few_rows_on_split_rows_results(gpu_state, monkeypatch):
    """The small split tile on rows no vector load reads whole, forced and as gemm's own
    choice, against float64 on poisoned outputs; then captured in a graph and replayed."""
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    rng = np.random.default_rng()
    for m, n, k, dtype in ((16, 4099, 4099, np.float16), (8, 1031, 2053, gpurt.bfloat16),
                           (13, 4099, 2050, gpurt.bfloat16)):
        dt = tune.DT_F16 if dtype == np.float16 else tune.DT_BF16
        config = tune._few_rows_on_split_rows(
            problem(m, n, k, dt, vec=False, tma=False, pitch128=False))
        assert config is not None and config.split_k >= 2
        run_case(rng, m, n, k, dtype, config=config)
        run_case(rng, m, n, k, dtype)
    da = gpurt.asarray(rand(rng, (16, 4099), gpurt.bfloat16))
    db = gpurt.asarray(rand(rng, (4099, 4099), gpurt.bfloat16))
    out = poisoned((16, 4099), gpurt.bfloat16)
    gemm(da, db, out=out)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm(da, db, out=out)
    check_replays(graph, da, db, out, rng, "16x4099x4099")
    del graph


# ---- the autotuner -------------------------------------------------------------------------------


def test_autotune_switch(monkeypatch):
    monkeypatch.delenv("GPURT_GEMM_AUTOTUNE", raising=False)
    assert tuning.autotune_enabled()
    for off in ("0", "false", "OFF", "no"):
        monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", off)
        assert not tuning.autotune_enabled()
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "1")
    assert tuning.autotune_enabled()


def test_tensor_maps_promote_l2_fills_only_for_128_byte_rows(monkeypatch):
    """Rows (and a base) at 128-byte multiples: 256-byte L2 promotion; split rows: none (an
    H100 measured 3000x5000x2000 bf16 15% faster without it, notes_gemm.md)."""
    seen = []
    buffer = ctypes.create_string_buffer(128)

    class Encoded:
        def getPtr(self):
            return ctypes.addressof(buffer)

    class Driver:
        def __getattr__(self, name):
            return getattr(cu, name)

        def cuTensorMapEncodeTiled(self, *args):
            seen.append(args[9])
            return (cu.CUresult.CUDA_SUCCESS, Encoded())

    monkeypatch.setattr(gemm_launch, "cu", Driver())
    monkeypatch.setattr(gemm_launch, "_maps", {})
    gemm_launch.tensor_map(1 << 20, True, 1000, 1024, 1024, tune.DT_BF16, 128)  # 2048-byte rows
    gemm_launch.tensor_map(1 << 20, True, 1000, 1000, 1000, tune.DT_BF16, 128)  # 2000-byte rows
    gemm_launch.tensor_map((1 << 20) + 64, False, 1024, 512, 1024, tune.DT_BF16, 128)
    gemm_launch.tensor_map(1 << 20, True, 1000, 1000, 1024, tune.DT_F32, 128)  # 4096-byte rows
    promotion = cu.CUtensorMapL2promotion
    assert seen == [promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
                    promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
                    promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B]


def test_problem_key_is_the_exact_shape():
    key = tuning.problem_key(problem(4000, 4096, 3000), "NVIDIA H100", "abc")
    assert key == tuning.problem_key(problem(4000, 4096, 3000), "NVIDIA H100", "abc")
    # one tile more or less per wave: shapes of one power-of-two bucket get their own results
    assert key != tuning.problem_key(problem(4096, 4096, 3000), "NVIDIA H100", "abc")
    assert key != tuning.problem_key(problem(4000, 4095, 3000), "NVIDIA H100", "abc")
    assert key != tuning.problem_key(problem(4000, 4096, 3001), "NVIDIA H100", "abc")
    assert key != tuning.problem_key(problem(4000, 4096, 3000), "NVIDIA H200", "abc")
    assert key != tuning.problem_key(problem(4000, 4096, 3000), "NVIDIA H100", "abd")
    assert key != tuning.problem_key(problem(4000, 4096, 3000, b_k=True), "NVIDIA H100", "abc")
    assert "bfloat16" in key and "KN" in key and key.endswith("4000x4096x3000")
    # pitches that are not 128-byte multiples have their own results (their best tiles differ)
    unaligned = problem(4000, 4096, 3000, pitch128=False)
    assert key != tuning.problem_key(unaligned, "NVIDIA H100", "abc")


def test_tuner_picks_fastest_and_persists(tmp_path):
    folder = tmp_path / "cache"
    tuner = tuning.Tuner(str(folder))
    configs = tune.candidates(problem())
    times = {c: 1.0 + i for i, c in enumerate(configs)}
    times[configs[-1]] = 0.5
    calls = []

    def timer(config):
        calls.append(config)
        return times[config]

    assert tuner.choose("k1", configs, timer) == configs[-1]
    assert calls == configs * tuning.ROUNDS  # in rounds over every config
    path = folder / "gemm-tune-v1.json"
    assert path.exists()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["results"]["k1"]["ms"] == 0.5
    assert len(doc["results"]["k1"]["timings_ms"]) == len(configs)
    assert not [p for p in os.listdir(folder) if p.startswith(".tmp")]
    # a new process (a new Tuner) reads it back without timing anything
    again = tuning.Tuner(str(folder))
    assert again.choose("k1", configs, lambda c: pytest.fail("timed again")) == configs[-1]
    assert again.lookup_ms("k1") == 0.5 and again.lookup_ms("nothing") is None
    # a second key is merged with the first on disk
    again.choose("k2", configs, lambda c: 1.0)
    assert set(json.loads(path.read_text())["results"]) == {"k1", "k2"}
    again.clear()
    assert not path.exists() and again.lookup("k1") is None


def test_tuner_keeps_the_heuristics_pick_unless_clearly_beaten():
    """Another config replaces the first (the heuristic's) only when it times at least
    DEFAULT_MARGIN faster: the tuner's short timings carry a few percent of spread."""
    configs = tune.candidates(problem())
    close = 1.0 - tuning.DEFAULT_MARGIN / 2
    times = {c: 1.0 if c == configs[0] else 2.0 for c in configs}
    times[configs[1]] = close
    assert tuning.Tuner(None).choose("k", configs, times.__getitem__) == configs[0]
    times[configs[1]] = 1.0 - tuning.DEFAULT_MARGIN * 2
    assert tuning.Tuner(None).choose("k", configs, times.__getitem__) == configs[1]
    times[configs[0]] = None  # the first cannot run: the fastest of the rest, however close
    times[configs[1]] = close
    assert tuning.Tuner(None).choose("k", configs, times.__getitem__) == configs[1]


def test_tuner_takes_each_configs_median_over_rounds():
    """A drift while tuning (clocks ramping up in the first round) reaches every config in
    one of its ROUNDS samples only, and a config that fails in a later round is dropped."""
    configs = tune.candidates(problem())[:4]
    rounds = {c: iter([9.0, 2.0 + i, 2.0 + i][:tuning.ROUNDS]) for i, c in enumerate(configs)}
    rounds[configs[2]] = iter([0.1, None])  # fastest in round 1, then cannot run

    tuner = tuning.Tuner(None)
    assert tuner.choose("k", configs, lambda c: next(rounds[c])) == configs[0]
    timings = tuner.results()["k"]["timings_ms"]
    assert timings == {configs[0].label(): 2.0, configs[1].label(): 3.0,
                       configs[3].label(): 5.0}


def test_tuner_skips_failures_and_survives_corruption(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "gemm-tune-v1.json").write_text("{not json")
    tuner = tuning.Tuner(str(folder))
    configs = tune.candidates(problem())

    def timer(config):
        if config == configs[0]:
            raise RuntimeError("no")
        return None if config == configs[1] else 2.0

    with pytest.warns(RuntimeWarning, match="failed while tuning"):
        chosen = tuner.choose("k", configs, timer)
    assert chosen == configs[2]
    assert json.loads((folder / "gemm-tune-v1.json").read_text())["results"]["k"]


def test_tuner_all_fail_returns_first_and_memory_only():
    tuner = tuning.Tuner(None)
    configs = tune.candidates(problem())
    assert tuner.choose("k", configs, lambda c: None) == configs[0]
    assert tuner.lookup("k") is None
    assert tuner.choose("k", configs, lambda c: 1.0) == configs[0]
    assert tuner.lookup("k") == configs[0]


def test_tuner_unwritable_folder_warns(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    tuner = tuning.Tuner(str(blocker / "sub"))
    with pytest.warns(RuntimeWarning, match="could not save"):
        tuner.choose("k", tune.candidates(problem()), lambda c: 1.0)
    assert tuner.lookup("k") is not None  # still remembered in memory


# ---- operand layouts (no GPU: a stand-in with the attributes gemm reads) -------------------------


@dataclasses.dataclass
class FakeArray:
    shape: tuple
    strides: tuple  # bytes
    dtype: np.dtype = np.dtype(np.float16)
    ptr: int = 4096
    cloned: bool = False

    def clone(self):
        size = self.dtype.itemsize
        return FakeArray(self.shape, (self.shape[1] * size, size), self.dtype, 8192, True)


def fake(rows, cols, s0, s1, dtype=np.float16):
    size = np.dtype(dtype).itemsize
    return FakeArray((rows, cols), (s0 * size, s1 * size), np.dtype(dtype))


def test_operand_layouts():
    op, rows, k = plans._operand(fake(300, 200, 200, 1), trans=False)
    assert (rows, k, op.kmajor, op.ld) == (300, 200, True, 200)
    op, rows, k = plans._operand(fake(300, 200, 200, 1), trans=True)  # op = x.T: 200 x 300
    assert (rows, k, op.kmajor, op.ld) == (200, 300, False, 200)
    op, rows, k = plans._operand(fake(300, 200, 1, 304), trans=False)  # column-major
    assert (rows, k, op.kmajor, op.ld) == (300, 200, False, 304)
    op, _, _ = plans._operand(fake(300, 200, 256, 1), trans=False)  # padded rows
    assert op.ld == 256 and op.kmajor
    x = fake(300, 200, 400, 2)  # every other column: no unit stride, copied
    op, rows, k = plans._operand(x, trans=False)
    assert op.array.cloned and op.kmajor and op.ld == 200
    op, _, _ = plans._operand(fake(300, 200, -200, 1), trans=False)
    assert op.array.cloned


def test_operand_vectors_prefer_aligned_pitch():
    # a 1 x K row: either layout works; an aligned made-up pitch is preferred
    op, rows, k = plans._operand(fake(1, 61, 61, 1), trans=False)
    assert rows == 1 and k == 61 and op.ld % 8 == 0
    # an (M x 1) column with K = 1
    op, rows, k = plans._operand(fake(5, 1, 1, 1), trans=False)
    assert (rows, k) == (5, 1) and op.ld % 8 == 0
    layouts = plans._layouts(4, 4, 6, 1, 8)
    assert layouts == [(6, True)]


def test_check_dtype():
    assert plans._check_dtype(fake(2, 2, 2, 1, np.float32), fake(2, 2, 2, 1, np.float32)) == 0
    assert plans._check_dtype(fake(2, 2, 2, 1, gpurt.bfloat16),
                                 fake(2, 2, 2, 1, gpurt.bfloat16)) == tune.DT_BF16
    with pytest.raises(TypeError, match="float64"):
        plans._check_dtype(fake(2, 2, 2, 1, np.float64), fake(2, 2, 2, 1, np.float64))
    with pytest.raises(TypeError, match="mix"):
        plans._check_dtype(fake(2, 2, 2, 1, np.float16), fake(2, 2, 2, 1, np.float32))


def test_overlap():
    a = fake(4, 4, 4, 1)
    b = FakeArray((4, 4), (8, 2), np.dtype(np.float16), ptr=a.ptr + 30)
    c = FakeArray((4, 4), (8, 2), np.dtype(np.float16), ptr=a.ptr + 32)
    assert plans._overlaps(a, b) and not plans._overlaps(a, c)


# ---- every variant compiles (NVRTC, no GPU) ------------------------------------------------------


def _variants(family):
    """A representative set of instantiations per kernel family: every base config in one
    layout, every layout in the first config, and an unaligned (VEC=false) one."""
    layouts = [(True, False), (True, True), (False, False), (False, True)]
    if family == "simt":
        items = [(c, tune.DT_F32) for c in tune._SIMT]
    elif family == "mma":
        items = [(c, tune.DT_BF16) for c in tune._MMA] + [(tune._MMA[0], tune.DT_F16)]
        items += [(c, tune.DT_TF32) for c in tune._TF32]
    else:  # with the fused split-K kernel of the configs that split
        items = [(c, dt) for c in tune._WGMMA for dt in (tune.DT_BF16, tune.DT_F16)]
        items += [(dataclasses.replace(c, split_k=3), tune.DT_BF16) for c in tune._WGMMA[:2]]
    names = set()
    for config, dt in items:
        names.add(config.name_expression(dt, True, False, True))
    first = items[0]
    for a_k, b_k in layouts:
        names.add(first[0].name_expression(first[1], a_k, b_k, True))
        if family != "wgmma":
            names.add(first[0].name_expression(first[1], a_k, b_k, False))
    if family != "wgmma":  # the split-K kernels (their last CTA of a tile sums the slices)
        for config, dt in (items[0], items[-1]):
            names.add(dataclasses.replace(config, split_k=3).name_expression(dt, True, False,
                                                                             True))
    return sorted(names)


@pytest.mark.parametrize("family,arch", [
    ("simt", "sm_80"), ("simt", "sm_90"), ("mma", "sm_80"), ("mma", "sm_90"),
    ("wgmma", "sm_90a"),
])
def test_variants_compile_without_spills(family, arch, tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = _variants(family)
    module = gpurt.compile(gemm_launch.text(f"gemm_{family}.cu"), options=["--ptxas-options=-v"],
                           name_expressions=names, arch=arch, program_name=f"gemm_{family}.cu",
                           headers=gemm_launch.headers(f"gemm_{family}.cu"))
    log = module.log
    assert set(module.lowered_names) == set(names)
    assert "warning" not in log.lower(), log  # serialized wgmma (C7510) or setmaxnreg ignored
    entries = re.findall(r"Function properties for (\S+)\n[^\n]*?(\d+) bytes spill stores", log)
    from gpurt._nvrtc import prebuilt
    assert len(entries) == len(names), (  # the context of a csan-only empty log (session 5)
        f"log of {len(log)} chars, {module!r}, prebuilt archives {prebuilt.archives()}, "
        f"sanitizer {gpurt.sanitizer.is_enabled()}: {log}")
    # nothing spills (the 8 x 8 SIMT kernels fit 128 registers for 2 CTAs per SM), except
    # that NVRTC 13.0's ptxas spills 4 bytes in one 64x128 mma variant under its 128-register
    # cap (13.5 does not): a few bytes are tolerated there, never a real spill
    allowed = 8 if family == "mma" else 0
    assert all(int(spill) <= allowed for _, spill in entries), log
    if family == "wgmma":
        assert re.findall(r"Used (\d+) registers", log) == ["168"] * len(names), log


def test_wgmma_tf32_compiles_without_spills(tmp_path, monkeypatch):
    """Every TF32 wgmma config in its three layouts (K-major A by descriptor, M-major A from
    registers, and the transposed output): no spills, no serialized wgmma."""
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = sorted({c.name_expression(tune.DT_TF32, a_k, b_k, True) for c in tune._WGMMA_TF32
                    for a_k, b_k in ((True, False), (True, True), (False, True))})
    module = gpurt.compile(gemm_launch.text("gemm_wgmma_tf32.cu"),
                           options=["--ptxas-options=-v"], name_expressions=names, arch="sm_90a",
                           program_name="gemm_wgmma_tf32.cu",
                           headers={"gemm_common.cu": gemm_launch.text("gemm_common.cu"),
                                    "gemm_wgmma.cu": gemm_launch.text("gemm_wgmma.cu")})
    log = module.log
    assert set(module.lowered_names) == set(names)
    assert "warning" not in log.lower(), log
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(names) and set(spills) == {"0"}, log


def test_wgmma_needs_sm90a(tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    with pytest.raises(gpurt.CompileError):
        gpurt.compile(gemm_launch.text("gemm_wgmma.cu"), arch="sm_90",
                      name_expressions=["gemm_wgmma<2, 256, 4, true, false, 1, false>"],
                      headers={"gemm_common.cu": gemm_launch.text("gemm_common.cu")})


def test_arch_for():
    assert gemm_launch.arch_for(tune._WGMMA[0], (9, 0)) == "sm_90a"
    assert gemm_launch.arch_for(tune._MMA[0], (9, 0)) == "sm_90"
    assert gemm_launch.arch_for(tune._SIMT[0], (8, 6)) == "sm_86"


# ---- GPU: results against float64 ----------------------------------------------------------------

TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-2, np.dtype(gpurt.bfloat16): 1e-2}
DTYPES = [np.float32, np.float16, gpurt.bfloat16]


@pytest.fixture
def no_tuning(monkeypatch, tmp_path):
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    gemm_mod.clear_plans()  # plans remember the settings they were made under
    yield
    gemm_mod.clear_plans()


def rand(rng, shape, dtype):
    return (rng.standard_normal(shape)).astype(np.float32).astype(dtype)


def device(host):
    return gpurt.asarray(np.ascontiguousarray(host))


def poisoned(shape, dtype):
    out = gpurt.empty(shape, dtype=dtype)
    out.fill_(np.nan)
    return out


def rel_err(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), "output has NaN/inf (unwritten or overflowed elements)"
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def reference(a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, c=None):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    product = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    want = alpha * product
    if beta:
        want = want + beta * c.astype(np.float64)
    return want


def check_replays(graph, da, db, out, rng, label="", dtype=gpurt.bfloat16, limit=1e-2):
    """Replay ``graph`` (a captured gemm(da, db, out=out) of ``dtype``) twice on fresh inputs."""
    (m, k), n = da.shape, db.shape[1]
    for _ in range(2):
        a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
        da.copy_(device(a))
        db.copy_(device(b))
        out.copy_(poisoned((m, n), dtype))
        gpurt.synchronize()
        graph.replay()
        gpurt.synchronize()
        assert rel_err(out.numpy(), reference(a, b)) < limit, label


def run_case(rng, m, n, k, dtype, trans_a=False, trans_b=False, config=None, **kw):
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    out = poisoned((m, n), dtype)
    result = gemm(device(a), device(b), out=out, trans_a=trans_a, trans_b=trans_b,
                  config=config, **kw)
    assert result is out
    err = rel_err(out.numpy(), reference(a, b, trans_a, trans_b))
    limit = 5e-3 if kw.get("allow_tf32") else TOL[np.dtype(dtype)]
    assert err < limit, (m, n, k, np.dtype(dtype).name, trans_a, trans_b, config, err)
    return err


SHAPES = [(1, 1, 1), (127, 257, 61), (8, 1000, 3000), (300, 8, 700), (256, 256, 256),
          (129, 130, 1), (64, 520, 72)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes(gpu_state, no_tuning, dtype, shape):
    run_case(np.random.default_rng(hash(shape) % 1000), *shape, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
def test_transposes(gpu_state, no_tuning, dtype, trans_a, trans_b):
    run_case(np.random.default_rng(7), 200, 136, 264, dtype, trans_a, trans_b)


def _forced_configs():
    """(config, dtype) pairs covering every base config of every family on this device."""
    pairs = [(c, np.float32) for c in tune._SIMT]
    pairs += [(c, gpurt.bfloat16) for c in tune._MMA] + [(tune._MMA[0], np.float16)]
    pairs += [(c, np.float16) for c in tune._WGMMA[:3]] + [(tune._WGMMA[0], gpurt.bfloat16)]
    pairs += [(c, gpurt.bfloat16) for c in tune._WGMMA[2:]]
    pairs += [(dataclasses.replace(tune._MMA[3], split_k=3), gpurt.bfloat16),
              (dataclasses.replace(tune._SIMT[3], split_k=4), np.float32)]
    pairs += [(dataclasses.replace(tune._WGMMA[1], split_k=3), gpurt.bfloat16),
              (dataclasses.replace(tune._WGMMA[0], split_k=2), np.float16)]
    return pairs


@pytest.mark.gpu
@pytest.mark.parametrize("config,dtype", _forced_configs(),
                         ids=lambda v: v.label().replace(" ", "_") if isinstance(v, Config)
                         else np.dtype(v).name)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
def test_every_config(gpu_state, config, dtype, trans_a, trans_b):
    major, minor = gpurt.get_device_capability()
    if config.kernel == "wgmma" and (major, minor) != (9, 0):
        pytest.skip("wgmma needs sm_90")
    # edges in every dimension and several K tiles; multiples of 8 keep rows 16-byte
    # aligned in every layout (TMA's rule for wgmma)
    run_case(np.random.default_rng(3), 2 * 128 + 40, 3 * 256 + 8, 3 * 64 + 8, dtype,
             trans_a, trans_b, config=config)


@pytest.mark.gpu
def test_wgmma_all_layouts_and_persistence(gpu_state):
    if gpurt.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(11)
    sms = gpurt.get_device_properties().multi_processor_count
    for dtype in (gpurt.bfloat16, np.float16):
        for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
            run_case(rng, 384, 520, 136, dtype, trans_a, trans_b, config=tune._WGMMA[0])
            # an odd number of tile rows: the second CTA of the last cluster has no rows
            run_case(rng, 3 * 128 - 8, 520, 136, dtype, trans_a, trans_b, config=tune._WGMMA[2])
            run_case(rng, 3 * 128 - 8, 520, 136, dtype, trans_a, trans_b, config=tune._WGMMA[6])
    # many more tiles than CTAs: each CTA walks several tiles through the ring
    m = 128 * (sms // 4 + 3)
    run_case(rng, m, 1024, 520, gpurt.bfloat16, config=tune._WGMMA[1])
    run_case(rng, m, 1024, 520, gpurt.bfloat16, config=tune._WGMMA[2])
    run_case(rng, m, 1024, 520, gpurt.bfloat16, config=tune._WGMMA[4])
    # a TMA-store config whose output rows are not 16-byte aligned falls back to plain stores
    a, b = rand(rng, (200, 136), np.float16), rand(rng, (136, 264), np.float16)
    wide = poisoned((200, 265), np.float16)
    gemm(device(a), device(b), out=wide[:, :264], config=tune._WGMMA[4])
    assert rel_err(wide.numpy()[:, :264], reference(a, b)) < 1e-2
    assert np.isnan(np.asarray(wide.numpy()[:, 264], dtype=np.float32)).all()


def _split_case(rng, config, dtype, m, n, k, trans_a, trans_b, **kw):
    """One fused split-K call with alpha, beta and Cin against float64, twice: the same bits
    both times (the last CTA of a tile sums the slices in slice order)."""
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    c = rand(rng, (m, n), dtype)
    want = reference(a, b, trans_a, trans_b, alpha=0.75, beta=-1.25, c=c)
    got = []
    for _ in range(2):
        out = poisoned((m, n), dtype)
        gemm(device(a), device(b), out=out, trans_a=trans_a, trans_b=trans_b, alpha=0.75,
             beta=-1.25, c=device(c), config=config, **kw)
        got.append(out.numpy())
    label = (config.label(), np.dtype(dtype).name, m, n, k, trans_a, trans_b)
    assert rel_err(got[0], want) < (5e-3 if kw.get("allow_tf32") else TOL[np.dtype(dtype)]), label
    assert got[0].tobytes() == got[1].tobytes(), label


@pytest.mark.gpu
def test_wgmma_split_k_fused(gpu_state):
    """gemm_wgmma_splitk (one launch: each tile's last CTA sums the slices): every layout,
    both 16-bit types, edge tiles, empty K slices (7 slices of 4 K tiles), alpha/beta/Cin,
    repeatable bits, and the ticket counters left at zero for the next call."""
    if gpurt.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(29)
    m, n = 2 * 128 + 40, 2 * 128 + 8
    for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
        for dtype in (gpurt.bfloat16, np.float16):
            config = dataclasses.replace(tune._WGMMA[1], split_k=3)
            _split_case(rng, config, dtype, m, n, 1000 - 1000 % 8, trans_a, trans_b)
    for config, k in [(dataclasses.replace(tune._WGMMA[1], split_k=7), 3 * 64 + 8),
                      (dataclasses.replace(tune._WGMMA[0], split_k=2), 520),
                      (dataclasses.replace(tune._WGMMA[1], split_k=16), 4096)]:
        _split_case(rng, config, gpurt.bfloat16, 136, 264, k, False, False)
    _split_case(rng, dataclasses.replace(tune._WGMMA[1], split_k=4), gpurt.bfloat16,
                      1, 8, 512, False, False)  # one element row, a mostly empty tile
    _assert_counters_zero()


def _assert_counters_zero():
    """The kept workspaces' ticket counters are back at zero (for the next call)."""
    gpurt.synchronize()
    for kept in workspace_mod._kept.values():
        counters = kept.arrays[0].numpy()[:kept.counter_room].view(np.uint32)
        assert kept.counter_room > 0 and not counters.any()


@pytest.mark.gpu
@pytest.mark.parametrize("base", [tune._WGMMA[1], tune._WGMMA[7]], ids=["128x128", "128x64"])
def test_wgmma_split_k_coalesced_sum(gpu_state, base):
    """beta = 0 on a C that takes 4-element stores: the half tiles inside C take the coalesced
    sum (sum_half_tile_quads), edge ones the pair loop; against float64, and bit for bit what
    the pair loop alone gives (the same output in an array pitched n + 2: no 4-element
    stores); ticket counters back at zero."""
    if gpurt.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(41)
    for m, n, k, split in [(200, 264, 2056, 4), (256, 128, 4096, 7), (64, 64, 1024, 16)]:
        for dtype in (gpurt.bfloat16, np.float16):
            a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
            config = dataclasses.replace(base, split_k=split)
            out = poisoned((m, n), dtype)
            gemm(device(a), device(b), out=out, alpha=0.75, config=config)
            label = (config.label(), np.dtype(dtype).name, m, n, k)
            assert rel_err(out.numpy(), reference(a, b, alpha=0.75)) < TOL[np.dtype(dtype)], label
            wide = poisoned((m, n + 2), dtype)
            gemm(device(a), device(b), out=wide[:, :n], alpha=0.75, config=config)
            assert out.numpy().tobytes() == np.ascontiguousarray(wide.numpy()[:, :n]).tobytes(), \
                label
    _assert_counters_zero()


@pytest.mark.gpu
def test_mma_simt_split_k_fused(gpu_state):
    """gemm_mma_splitk and gemm_simt_splitk (one launch: each tile's last CTA sums the
    slices): every layout, bf16/fp16/fp32/TF32, edge tiles, empty K slices (7 slices of 1-2
    K tiles), rows not 16-byte aligned (VEC=false), alpha/beta/Cin, repeatable bits, and the
    ticket counters left at zero."""
    rng = np.random.default_rng(31)
    mma, simt = tune._MMA[3], tune._SIMT[3]  # 64 x 64 and 64 x 128 tiles
    m, n = 2 * 64 + 40, 2 * 128 + 8
    for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
        _split_case(rng, dataclasses.replace(mma, split_k=3), gpurt.bfloat16, m, n, 1000,
                    trans_a, trans_b)
        _split_case(rng, dataclasses.replace(simt, split_k=4), np.float32, m, n, 1000, trans_a,
                    trans_b)
    _split_case(rng, dataclasses.replace(mma, split_k=3), np.float16, m, n, 1000, False, False)
    _split_case(rng, dataclasses.replace(tune._TF32[1], split_k=3), np.float32, m, n, 1000,
                False, True, allow_tf32=True)
    _split_case(rng, dataclasses.replace(mma, split_k=7), gpurt.bfloat16, 136, 264, 3 * 32 + 8,
                False, False)
    _split_case(rng, dataclasses.replace(simt, split_k=5), np.float32, 131, 77, 203, False,
                False)  # odd rows: element loads
    _split_case(rng, dataclasses.replace(mma, split_k=4), np.float16, 1, 8, 512, False, False)
    _assert_counters_zero()



@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 7, 16, 17])
def test_split_k_slice_counts(gpu_state, splits):
    """The fused split-K sum loads 4 slices of several pairs before their adds: slice counts
    below, at a multiple of and past that batch, on every kernel that splits (wgmma 64, 128
    and 256 wide, mma 16-bit and TF32, simt; an odd M x N: 4-byte loads) against float64, the same
    bits twice, the ticket counters back at zero."""
    rng = np.random.default_rng(37 + splits)
    split = functools.partial(dataclasses.replace, split_k=splits)
    cases = [(split(tune._MMA[3]), gpurt.bfloat16, 168, 264, 2056, {}),
             (split(tune._SIMT[3]), np.float32, 131, 77, 1003, {}),
             (split(tune._TF32[1]), np.float32, 168, 264, 2056, {"allow_tf32": True})]
    if gpurt.get_device_capability() == (9, 0):
        cases += [(split(c), np.float16, 200, 264, 2056, {})
                  for c in (*tune._WGMMA[:2], tune._WGMMA[7])]  # 128 x 256, 128, 64 wide
    for config, dtype, m, n, k, kw in cases:
        _split_case(rng, config, dtype, m, n, k, False, False, **kw)
    _assert_counters_zero()

@pytest.mark.gpu
@pytest.mark.parametrize("base", [tune._SIMT[0], tune._SIMT[2], tune._SIMT[4], tune._SIMT[5]],
                         ids=lambda c: c.label().replace(" ", "_"))
def test_simt_split_end(gpu_state, base):
    """gemm_simt_splitk's end (each thread sums the outputs it holds over the K slices, its
    own from registers; float4 where N % 4 == 0): 8 x 16 and 8 x 8 thread tiles, edge tiles
    in M and N, rows 16-byte aligned and not, uneven slices and a partial K tile, M-major A
    and K-major B, alpha/beta/Cin, the same bits twice, ticket counters left at zero."""
    rng = np.random.default_rng(37)
    m = base.bm + 37
    for n, k, split, trans_a, trans_b in [(base.bn + 68, 1000, 3, False, False),
                                          (base.bn + 67, 517, 5, True, True),
                                          (2 * base.bn + 4, 1027, 7, False, True)]:
        _split_case(rng, dataclasses.replace(base, split_k=split), np.float32, m, n, k, trans_a,
                    trans_b)
    _assert_counters_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_alpha_beta_c(gpu_state, no_tuning, dtype):
    rng = np.random.default_rng(5)
    m, n, k = 150, 270, 90
    a, b, c = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype), rand(rng, (m, n), dtype)
    out = poisoned((m, n), dtype)
    gemm(device(a), device(b), out=out, alpha=0.5, beta=-1.5, c=device(c))
    assert rel_err(out.numpy(), reference(a, b, alpha=0.5, beta=-1.5, c=c)) < TOL[np.dtype(dtype)]
    # c defaults to out: accumulate in place
    acc = device(c)
    gemm(device(a), device(b), out=acc, alpha=2.0, beta=1.0)
    assert rel_err(acc.numpy(), reference(a, b, alpha=2.0, beta=1.0, c=c)) < TOL[np.dtype(dtype)]
    # beta == 0 never reads c, even NaN
    out = gemm(device(a), device(b), beta=0.0, c=poisoned((m, n), dtype))
    assert rel_err(out.numpy(), reference(a, b)) < TOL[np.dtype(dtype)]
    with pytest.raises(ValueError, match="beta"):
        gemm(device(a), device(b), beta=1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, gpurt.bfloat16], ids=lambda d: np.dtype(d).name)
def test_column_major_and_strided_outputs(gpu_state, no_tuning, dtype):
    rng = np.random.default_rng(9)
    m, n, k = 96, 200, 80
    a, b, c = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype), rand(rng, (m, n), dtype)
    want = reference(a, b, alpha=1.0, beta=0.25, c=c)
    store = poisoned((n, m), dtype)
    out_t = store.T  # column-major (m x n) view
    gemm(device(a), device(b), out=out_t, beta=0.25, c=device(c))  # c row-major: re-laid out
    assert rel_err(store.numpy().T, want) < TOL[np.dtype(dtype)]
    wide = poisoned((m, 2 * n), dtype)
    gemm(device(a), device(b), out=wide[:, ::2], beta=0.25, c=device(c))  # no unit stride
    assert rel_err(wide.numpy()[:, ::2], want) < TOL[np.dtype(dtype)]
    assert np.isnan(np.asarray(wide.numpy()[:, 1::2], dtype=np.float32)).all()  # untouched


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_unaligned_views(gpu_state, no_tuning, dtype):
    """Row pitches and bases that are not 16-byte aligned take the element-wise loaders."""
    rng = np.random.default_rng(13)
    m, n, k = 130, 150, 77
    a_big, b_big = rand(rng, (m, k + 3), dtype), rand(rng, (k + 1, n + 5), dtype)
    a_dev, b_dev = device(a_big), device(b_big)
    out = poisoned((m, n), dtype)
    gemm(a_dev[:, 1:k + 1], b_dev[1:, 3:n + 3], out=out)
    want = reference(a_big[:, 1:k + 1], b_big[1:, 3:n + 3])
    assert rel_err(out.numpy(), want) < TOL[np.dtype(dtype)]


@pytest.mark.gpu
def test_tf32(gpu_state, no_tuning):
    rng = np.random.default_rng(17)
    err = run_case(rng, 300, 400, 500, np.float32, allow_tf32=True)
    assert err > 1e-6  # TF32 really ran (exact fp32 would be ~1e-7)
    run_case(rng, 100, 64, 33, np.float32, True, True, allow_tf32=True)


@pytest.mark.gpu
@pytest.mark.parametrize("config", tune._WGMMA_TF32, ids=lambda c: c.label().replace(" ", "_"))
def test_wgmma_tf32_layouts(gpu_state, config):
    """Each TF32 wgmma config in its three layouts, with edges in every dimension, a K tail,
    several tiles per CTA and beta; the fourth layout (A M-major, B N-major) is refused."""
    if gpurt.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90")
    rng = np.random.default_rng(23)
    sms = gpurt.get_device_properties().multi_processor_count
    for trans_a, trans_b in [(False, False), (False, True), (True, True)]:
        run_case(rng, 300, 520, 136, np.float32, trans_a, trans_b, config=config,
                 allow_tf32=True)
        run_case(rng, 128 * (sms // 4 + 3), 264, 36, np.float32, trans_a, trans_b,
                 config=config, allow_tf32=True)
    a, b, c = (rand(rng, shape, np.float32) for shape in ((96, 72), (72, 200), (96, 200)))
    out = device(c)
    gemm(device(a), device(b), out=out, alpha=0.5, beta=-1.0, config=config, allow_tf32=True)
    assert rel_err(out.numpy(), reference(a, b, alpha=0.5, beta=-1.0, c=c)) < 5e-3
    with pytest.raises(ValueError, match="K-major"):
        gemm(device(a.T.copy()), device(b), trans_a=True, config=config, allow_tf32=True)


@pytest.mark.gpu
def test_empty_and_k_zero(gpu_state, no_tuning):
    rng = np.random.default_rng(19)
    out = gemm(gpurt.empty((0, 5)), gpurt.empty((5, 4)))
    assert out.shape == (0, 4)
    c = rand(rng, (3, 4), np.float32)
    out = poisoned((3, 4), np.float32)
    gemm(gpurt.empty((3, 0)), gpurt.empty((0, 4)), out=out, beta=2.0, c=device(c))
    np.testing.assert_allclose(out.numpy(), 2.0 * c, rtol=1e-6)
    for dtype in (np.float16, gpurt.bfloat16):
        out = poisoned((3, 4), dtype)
        gemm(gpurt.empty((3, 0), dtype=dtype), gpurt.empty((0, 4), dtype=dtype), out=out)
        assert (np.asarray(out.numpy(), dtype=np.float32) == 0).all()


@pytest.mark.gpu
def test_argument_errors(gpu_state, no_tuning):
    a = gpurt.zeros((4, 5))
    with pytest.raises(ValueError, match="inner"):
        gemm(a, gpurt.zeros((4, 5)))
    with pytest.raises(TypeError, match="mix"):
        gemm(a, gpurt.zeros((5, 3), dtype=np.float16))
    with pytest.raises(ValueError, match="2-D"):
        gemm(gpurt.zeros(5), gpurt.zeros((5, 3)))
    with pytest.raises(ValueError, match="out must be"):
        gemm(a, gpurt.zeros((5, 3)), out=gpurt.zeros((4, 4)))
    with pytest.raises(ValueError, match="overlaps"):
        gemm(a, gpurt.zeros((5, 5)), out=a)
    with pytest.raises(TypeError, match="host memory"):
        gemm(np.zeros((4, 5), np.float32), gpurt.zeros((5, 3)))
    with pytest.raises(ValueError, match="cannot run"):
        gemm(a, gpurt.zeros((5, 3)), config=tune._WGMMA[0])


@pytest.mark.gpu
def test_stream_argument(gpu_state, no_tuning):
    rng = np.random.default_rng(23)
    a, b = rand(rng, (64, 48), np.float32), rand(rng, (48, 80), np.float32)
    stream = gpurt.Stream()
    with stream:
        da, db = device(a), device(b)
    out = gemm(da, db, stream=stream)
    stream.synchronize()
    assert rel_err(out.numpy(), reference(a, b)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_torch_inputs(gpu_state, no_tuning, dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    a = torch.randn(333, 129, device="cuda", dtype=tdtype)
    b = torch.randn(257, 129, device="cuda", dtype=tdtype)  # used transposed: a view, no copy
    out = torch.full((333, 257), float("nan"), device="cuda", dtype=tdtype)
    gemm(a, b.T, out=out, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    want = a.double() @ b.double().T
    err = float(torch.linalg.norm(out.double() - want) / torch.linalg.norm(want))
    assert err < TOL[np.dtype(np.float32 if dtype == "float32" else
                              (np.float16 if dtype == "float16" else gpurt.bfloat16))]
    torch_err = float(torch.linalg.norm((a @ b.T).double() - want) / torch.linalg.norm(want))
    assert err < 4 * torch_err + 1e-6  # no worse than cuBLAS's own rounding, within reason


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, m, n, k", [("float32", 97, 4093, 515), ("float32", 67, 61, 33),
                                            ("bfloat16", 16, 1000, 264)])
def test_torch_tensors_repeat_from_c(gpu_state, no_tuning, monkeypatch, dtype, m, n, k):
    """Repeated calls on plain torch tensors skip the Python intake (their key and addresses
    are read in C): fresh tensors each call, out given or made, c apart from out or out
    itself, an out that overlaps a refused, all against float64."""
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    tol = 1e-5 if dtype == "float32" else 1e-2
    general = []
    real = gemm_mod._gemm_arrays
    monkeypatch.setattr(gemm_mod, "_gemm_arrays", lambda *a: general.append(1) or real(*a))

    def check(got, want):
        torch.cuda.synchronize()
        err = float(torch.linalg.norm(got.double() - want) / torch.linalg.norm(want))
        assert err < tol

    def fresh(*shape):
        return torch.randn(*shape, device="cuda", dtype=tdtype)

    for call in range(3):  # the first of each signature plans; the others come from C
        a, b = fresh(m, k), fresh(n, k).T
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        assert gemm(a, b, out=out) is out
        check(out, a.double() @ b.double())
        made = gemm(a, b)
        assert isinstance(made, gpurt.Array) and made.shape == (m, n)
        check(torch.tensor(made.numpy().astype(np.float64), device="cuda"),
              a.double() @ b.double())
        c = fresh(m, n)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        gemm(a, b, out=out, c=c, alpha=0.5, beta=-2.0)
        check(out, 0.5 * (a.double() @ b.double()) - 2.0 * c.double())
        old = fresh(m, n)
        out = old.clone()
        gemm(a, b, out=out, c=out, alpha=1.5, beta=0.25)  # c is out itself
        check(out, 1.5 * (a.double() @ b.double()) + 0.25 * old.double())
        assert len(general) == (4 if call == 0 else 0), general
        general.clear()
    rows = fresh(3 * 64, 64)  # out may be any view that does not overlap a
    a, b = rows[64:128], fresh(64, 64)
    gemm(a, b, out=rows[128:])
    check(rows[128:], a.double() @ b.double())
    with pytest.raises(ValueError, match="overlaps"):  # the same signature: the repeat refuses
        gemm(a, b, out=rows[72:136])


@pytest.mark.gpu
def test_torch_tensors_mixed_and_on_a_side_stream(gpu_state, no_tuning):
    """Torch tensors beside gpurt Arrays in one call (repeated: the C key reads both), and
    torch tensors made on a torch stream that is not gpurt's current one (the C key refuses
    them; the general intake orders the work), each against float64."""
    torch = pytest.importorskip("torch")
    m, n, k = 33, 130, 70
    for _ in range(2):
        a = torch.randn(m, k, device="cuda")
        b = gpurt.asarray(torch.randn(k, n, device="cuda"))
        c = torch.randn(m, n, device="cuda")
        out = gpurt.empty((m, n), dtype=np.float32)
        out.fill_(np.nan)
        gemm(a, b, out=out, c=c, alpha=2.0, beta=-0.5)
        torch.cuda.synchronize()
        want = 2.0 * (a.double() @ torch.as_tensor(b.numpy(), device="cuda").double()) \
            - 0.5 * c.double()
        got = torch.as_tensor(out.numpy(), device="cuda").double()
        assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) < 1e-5
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda")
        result = gemm(a, b)
    gpurt.synchronize()
    torch.cuda.synchronize()
    want = a.double() @ b.double()
    got = torch.as_tensor(result.numpy(), device="cuda").double()
    assert float(torch.linalg.norm(got - want) / torch.linalg.norm(want)) < 1e-5


@pytest.mark.gpu
def test_cupy_inputs(gpu_state, no_tuning):
    cp = pytest.importorskip("cupy")
    a = cp.random.standard_normal((120, 70), dtype=cp.float32)
    b = cp.random.standard_normal((70, 90), dtype=cp.float32)
    out = gemm(a, b)
    cp.cuda.Device().synchronize()
    want = cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)
    assert rel_err(out.numpy(), want) < 1e-5


@pytest.mark.gpu
def test_autotuner_on_device(gpu_state, monkeypatch, tmp_path):
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "1")
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    gemm_mod.clear_plans()
    rng = np.random.default_rng(29)
    m = n = k = 512  # 2^27 multiply-adds: just big enough to be tuned
    a, b = rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no candidate may fail
        out = gemm(device(a), device(b))
    assert rel_err(out.numpy(), reference(a, b)) < 1e-2
    results = gemm_mod.gemm_tuning_results()
    assert len(results) == 1
    (entry,) = results.values()
    assert entry["ms"] > 0 and len(entry["timings_ms"]) >= 2
    assert (tmp_path / "gemm-tune-v1.json").exists()
    gemm_mod.clear_gemm_tuning()
