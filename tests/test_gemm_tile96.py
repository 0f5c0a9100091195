"""96- and 80-wide tiles on the 16-bit wgmma kernel (kernels/gemm_wgmma.cu with BN = 96 / 80:
m64n96k16 / m64n80k16, an N-major B and the staged C in 32- / 16-wide boxes with the 64- /
32-byte swizzle, wgmma descriptor layout type 2 / 3). CPU: configs, names, shared memory, what
they reject, compiled without spills, the tuner's and the sweep's lists, the heuristic's
picks. GPU: every layout, both 16-bit types, edge tiles, 2-CTA clusters (B multicast as
chunks 0, 2, .. | 1, ..), many tiles per CTA, alpha/beta/Cin, offset views, plain stores, graph
replay, against float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import _wgmma_tiles as tiles
from test_gemm_wgmma_x import _graph_case, _ids

tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

T192 = tune._WGMMA_T192N96
T64 = tune._WGMMA_64N96
T80 = tune._WGMMA_64N80
VARIANTS = [
    T192,
    tune._WGMMA_T192N96_C2,  # 2-CTA clusters along M: B multicast
    T64,
    dataclasses.replace(T64, lean=0, stages=8),
    Config("wgmma", 128, 96, 64, stages=7, group_m=8, tma_store=True),  # gemm_wgmma's own
    dataclasses.replace(T192, tma_store=False),  # plain stores
    T80,
    Config("wgmma", 128, 80, 64, stages=7, group_m=8, tma_store=True, cluster_m=2),
]

_problem = tiles.problem


def test_config_fields():
    assert T192.label() == "wgmma 192x96x64 s5 tmaC g8" and T192.narrow and T192.threads == 512
    assert T64.label() == "wgmma 64x96x64 s10 tmaC lean5 g8" and T64.threads == 256
    assert not tune._WGMMA_T192N128.narrow and not Config("mma", 64, 96, 32, 32, 32).narrow
    assert T192.name_expression(2, True, False, True) == \
        "gemm_wgmma_bm<2, 192, 96, 5, true, false, 1, true>"
    assert VARIANTS[1].name_expression(1, False, True, True) == \
        "gemm_wgmma_bm<1, 192, 96, 5, false, true, 2, true, false, 16>"
    assert T64.name_expression(2, True, True, True) == \
        "gemm_wgmma_bm<2, 64, 96, 10, true, true, 1, true, false, 5>"
    assert VARIANTS[4].name_expression(2, False, False, True) == \
        "gemm_wgmma<2, 96, 7, false, false, 1, true>"
    # the ring (A + B tiles and two barriers a stage), 1 KiB of slack, C's 64 x 96 per consumer
    assert T192.shared_mem(True, False) == 5 * (288 * 128 + 16) + 1024 + 192 * 96 * 2
    assert T64.shared_mem(False, False) == 10 * (160 * 128 + 16) + 1024 + 64 * 96 * 2
    assert VARIANTS[5].shared_mem(True, True) == 5 * (288 * 128 + 16) + 1024
    assert T80.shared_mem(True, False) == 11 * (144 * 128 + 16) + 1024 + 64 * 80 * 2
    assert (T80.box_width, T64.box_width, tune._WGMMA_64.box_width) == (16, 32, 64)
    for config in VARIANTS:
        assert config.shared_mem(True, True) <= 227 * 1024
        assert Config.from_json(config.to_json()) == config
    assert T192.tiles(1536, 1536) == 128 and tune._WGMMA_T192N128.tiles(1536, 1536) == 96
    assert T64.tiles(768, 768) == 96 and tune._WGMMA_64.tiles(768, 768) == 72


@pytest.mark.parametrize("base, bad", [
    (T192, dict(split_k=2)), (T192, dict(pipe_store=True)), (T64, dict(cluster_n=2)),
    (VARIANTS[4], dict(pingpong=True)), (T192, dict(stages=6)), (T64, dict(stages=11)),
    (VARIANTS[4], dict(stages=8)), (T80, dict(stages=12)), (T80, dict(bm=192)),
])
def test_config_rejects(base, bad):
    with pytest.raises(ValueError, match="80-wide wgmma tiles"):
        dataclasses.replace(base, **bad)
    with pytest.raises(ValueError, match="bk=32|TF32|96-wide"):
        dataclasses.replace(VARIANTS[4], bk=32)


def test_compiles_without_spills(tmp_path, monkeypatch):
    tiles.assert_compiles_without_spills(VARIANTS, tmp_path, monkeypatch)


def test_tuner_and_sweep_offer_them():
    """Candidates where 128 x 128 tiles make under two waves (1536^3: 144, 768^3: 36), the
    clusters on split rows only (as every cluster candidate), 64 x 80 with a K-major B only
    (its N-major boxes of 32-byte rows lost by far); not on big grids (4096^3: 1024). The
    sweep (all_configs) runs them everywhere."""
    for dims in ((1536, 1536, 1536), (768, 768, 768), (1280, 1280, 1280), (640, 640, 640)):
        assert {T192, T64} <= set(tune.candidates(_problem(*dims))), dims
        assert not {VARIANTS[1], T80} & set(tune.candidates(_problem(*dims))), dims
        assert T80 in tune.candidates(_problem(*dims, b_k=True)), dims
        assert set(tune._NARROW) <= set(tune.candidates(_problem(*dims, b_k=True,
                                                                 pitch128=False))), dims
    assert not set(tune._NARROW) & set(tune.candidates(_problem(4096, 4096, 4096)))
    assert set(tune._NARROW) <= set(tune.all_configs(_problem(4096, 4096, 4096)))
    assert not set(tune._NARROW) & set(tune.all_configs(_problem(1000, 1000, 1000,
                                                                  dt=tune.DT_TF32)))


def test_heuristic_does_not_take_them():
    """They lost where timed (H100, s13-narrow: 1536^3, 768^3, 1280^3, 384x2048x1024 with an
    N-major B; notes_gemm.md), so the heuristic keeps the 64-aligned widths; the tuner times
    them. (Their C^T forms, Config.swap, are another matter: tests/test_gemm_swap.py.)"""
    for dims in ((1536, 1536, 1536), (1536, 1536, 1024), (768, 768, 768), (640, 640, 640),
                 (1280, 1280, 1280), (384, 2048, 1024), (1024, 1024, 1024)):
        for b_k in (False, True):
            chosen = tune.heuristic(_problem(*dims, b_k=b_k))
            assert not chosen.narrow or chosen.swap, dims


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    tiles.layouts_and_edges(config, 101)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [*VARIANTS[:3], T80], ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    tiles.many_tiles_per_cta(config, 103)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [T192, T64, T80], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(107))
