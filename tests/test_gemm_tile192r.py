"""192-row tiles on the 16-bit wgmma kernel (kernels/gemm_wgmma.cu gemm_wgmma_bm: three
consumer warpgroups of 64 rows, 512 threads; 192 x 192 and 192 x 128, alone or in 2-CTA
clusters along M that multicast B). CPU: configs, names, what they reject, compiled without
spills, the chooser's candidates. GPU: every layout, both 16-bit types, edge tiles in M (inside
each 64-row slab), N and K, clusters whose second CTA has no tile, many tiles per CTA, alpha /
beta / Cin, offset views, plain stores, graph replay, against float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest

import _wgmma_tiles as tiles
import gpurt
from test_gemm_wgmma_x import _graph_case, _ids

gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

# two staging boxes a slab (one more stage and one box: test_gemm_stages.py, the defaults)
T192 = dataclasses.replace(tune._WGMMA_T192, stages=3)
T128 = dataclasses.replace(tune._WGMMA_T192N128, stages=4)
VARIANTS = [
    T192,
    dataclasses.replace(T192, cluster_m=2),  # B multicast in pairs along M
    T128,
    dataclasses.replace(T128, cluster_m=2),
    dataclasses.replace(T192, tma_store=False),  # plain stores
]


_problem = tiles.problem


def test_config_fields():
    assert T192.label() == "wgmma 192x192x64 s3 tmaC g8"
    assert T192.threads == 512 and tune._WGMMA[4].threads == 384
    assert T192.name_expression(2, True, False, True) == \
        "gemm_wgmma_bm<2, 192, 192, 3, true, false, 1, true>"
    assert VARIANTS[3].name_expression(1, False, True, True) == \
        "gemm_wgmma_bm<1, 192, 128, 4, false, true, 2, true>"
    assert T192.source == "gemm_wgmma.cu"
    # stages of (192 + BN) x 128 bytes and 3 slabs of 16 KiB staging fit an H100's 227 KiB
    for config in (T192, T128):
        assert config.shared_mem(True, False) <= 227 * 1024
        deeper = dataclasses.replace(config, stages=config.stages + 1)
        # one more stage fits with one staging box a slab (test_gemm_stages.py), not two
        assert deeper.shared_mem(True, False) <= 227 * 1024 < \
            deeper.shared_mem(True, False) + 3 * 8192
    # the 128-row tiles' footprint is unchanged
    assert tune._WGMMA[4].shared_mem(True, True) == 4 * 384 * 128 + 32768 + 64 + 1024
    assert T192.tiles(3000, 3000) == 16 * 16 and T128.tiles(2000, 3000) == 11 * 24
    assert Config.from_json(VARIANTS[1].to_json()) == VARIANTS[1]


@pytest.mark.parametrize("bad, match", [
    (dict(bn=256), "192-row"),  # 128 accumulators a thread: over the consumers' registers
    (dict(bn=64), "192-row"),
    (dict(split_k=2), "192-row"),
    (dict(cluster_n=2), "192-row"),
    (dict(pipe_store=True), "192-row"),
    (dict(bm=256), "wgmma kernel takes"),
    (dict(bk=32), "192-row"),  # TF32
])
def test_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(T192, **bad)


def test_compiles_without_spills(tmp_path, monkeypatch):
    tiles.assert_compiles_without_spills([T192, VARIANTS[3]], tmp_path, monkeypatch)


def test_tuner_and_sweep_offer_them():
    assert set(tune._TALL) <= set(tune.all_configs(_problem(4096, 4096, 4096)))
    assert {tune._WGMMA_T192, tune._WGMMA_T192N128} <= set(
        tune.candidates(_problem(4096, 4096, 4096)))
    split_rows = tune.candidates(_problem(3000, 3000, 3000, pitch128=False))
    assert {tune._WGMMA_T192_C2, tune._WGMMA_T192N128_C2} <= set(split_rows)
    assert not any(c.bm == 192 for c in tune.candidates(_problem(2000, 3000, 1000,
                                                                 dt=tune.DT_TF32)))


def test_wave_model_choices():
    """The chooser takes 192 x 128 where it won on an H200 (s11-tile192r: 1536^3, one wave of
    96 tiles either way) and keeps the 128-row tiles where they won or the 192-row ones make
    more waves, at short K (pipelined and ping-pong epilogues), on split rows and for TF32."""
    assert tune._tall_for(_problem(1536, 1536, 1536), tune._WGMMA_192) == tune._WGMMA_T192N128
    # which _swapped_for then turns into 192 x 96 tiles of C^T (H100, session 13)
    assert tune.heuristic(_problem(1536, 1536, 1536)) == tune._WGMMA_T192N96_T
    assert tune.heuristic(_problem(1536, 1536, 1024)) == tune._WGMMA_192  # short K
    # split rows: 192 x 128 unclustered where it makes one wave (session 14, _tall_split_rows)
    assert tune.heuristic(_problem(1536, 1536, 1536, pitch128=False)) == tune._WGMMA_T192N128
    assert tune.heuristic(_problem(256, 11008, 4096)) == tune._WGMMA_192  # 116 CTAs, one wave
    for dims in ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 8192, 8192)):
        assert tune.heuristic(_problem(*dims)) == tune._WGMMA[4], dims
    # 192 x 192 in 2 x 1 clusters: 2 rounds of pairs, faster than 3 of 128 x 192 (H100,
    # session 12: 0.937 of cuBLAS against 0.825)
    assert tune.heuristic(_problem(3000, 3000, 3000, pitch128=False)) == tune._WGMMA_T192_C2
    assert tune.heuristic(_problem(2000, 3000, 1000, pitch128=False)) == tune._WGMMA_192_C2
    assert tune.heuristic(_problem(3000, 5000, 2000, pitch128=False)) == tune._WGMMA_C2X2
    assert tune.heuristic(_problem(1536, 1536, 1536, dt=tune.DT_TF32)).bm == 128


def test_tall_split_rows():
    """_tall_split_rows: on rows that are not 128-byte multiples, 192 x 128 unclustered in
    place of 128 x 192 (alone or in 2 x 1 clusters) where its grid makes one wave of no more
    tiles and K > 1024 (H100, session 14: 768x3000x1536 x0.92 of cuBLAS against x0.83,
    768x3000x4096 x0.97 against x0.91, 576x4000x4096 x0.88 against x0.70, K-major B too);
    not where it makes two waves (lost there: x0.49-0.71),
    at short K, or on 128-byte rows (_tall_for's ground)."""
    for dims in ((768, 3000, 1536), (768, 3000, 4096), (576, 4000, 4096)):
        assert tune.heuristic(_problem(*dims, pitch128=False)) == tune._WGMMA_T192N128, dims
        assert tune.heuristic(_problem(*dims, pitch128=False, b_k=True)) == tune._WGMMA_T192N128
    for dims in ((1000, 3000, 2000), (1536, 3000, 1536), (2000, 2000, 2000), (1000, 6000, 1000),
                 (768, 3000, 1024)):
        assert tune.heuristic(_problem(*dims, pitch128=False)).cluster_m == 2, dims
    for config in (tune._WGMMA_192, tune._WGMMA_192_C2):
        assert tune._tall_split_rows(_problem(768, 3000, 1536), config) == config  # pitch128
        assert tune._tall_split_rows(_problem(768, 3000, 1536, pitch128=False),
                                     config) == tune._WGMMA_T192N128
    assert tune._tall_split_rows(_problem(768, 3000, 1536, pitch128=False),
                                 tune._WGMMA[4]) == tune._WGMMA[4]


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    tiles.layouts_and_edges(config, 73)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    tiles.many_tiles_per_cta(config, 79)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [T192, VARIANTS[3]], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(83))
