"""128 x 192 tiles on the 16-bit wgmma kernel (kernels/gemm_wgmma.cu, BN = 192: m64n192k16,
an epilogue of 128 + 64 columns, B multicast as 64-wide chunks 0, 2 | 1 in 2-CTA clusters).
CPU: configs, names, what they reject, compiled without spills, the wave model's choices. GPU:
every layout, both 16-bit types, edge tiles, clusters (2 x 1 and 2 x 2) whose second CTA has no
tile, many tiles per CTA, alpha/beta/Cin, offset views, plain stores, graph replay, against
float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest

import _wgmma_tiles as tiles
import gpurt
from test_gemm import check_replays, device, poisoned, rand
from test_gemm_wgmma_x import _graph_case, _ids

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

W192 = tune._WGMMA_192_S4  # two staging boxes per consumer (5 stages: test_gemm_stages.py)
VARIANTS = [
    W192,
    dataclasses.replace(W192, cluster_m=2),  # gemm_wgmma's clusters: B multicast
    tune._WGMMA_192_C2X2,  # gemm_wgmma_x: A and B multicast
    dataclasses.replace(W192, tma_store=False, group_m=8),  # plain stores
]


_problem = tiles.problem


def test_config_fields():
    assert W192.label() == "wgmma 128x192x64 s4 tmaC g16"
    assert W192.name_expression(2, True, False, True) == \
        "gemm_wgmma<2, 192, 4, true, false, 1, true>"
    assert VARIANTS[2].name_expression(1, False, True, True) == \
        "gemm_wgmma_x<1, 192, 4, false, true, 2, 2, false, true>"
    # 4 stages of 16 + 24 KiB and the TMA-store staging fit the 227 KiB of an H100's SM
    assert W192.shared_mem(True, False) <= 227 * 1024
    # (5 stages fit with one staging box per consumer: tests/test_gemm_stages.py)
    assert Config.from_json(W192.to_json()) == W192
    assert W192.tiles(2000, 3000) == 16 * 16 and tune._WGMMA[4].tiles(2000, 3000) == 16 * 12


@pytest.mark.parametrize("bad, match", [
    (dict(split_k=2), "unsplit 16-bit"),
    (dict(bk=32), "unsplit 16-bit"),  # TF32
    (dict(pipe_store=True), "pipe_store"),  # three 64-wide passes: not an even count
    (dict(pingpong=True), "pingpong"),
])
def test_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(W192, **bad)


def test_compiles_without_spills(tmp_path, monkeypatch):
    tiles.assert_compiles_without_spills([W192, VARIANTS[2]], tmp_path, monkeypatch)


def test_tuner_and_sweep_offer_it():
    assert {W192, tune._WGMMA_192} <= set(tune.candidates(_problem(2000, 3000, 1024)))
    every = tune.all_configs(_problem(4096, 4096, 4096))
    assert {W192, tune._WGMMA_192, tune._WGMMA_192_C2X2} <= set(every)
    assert tune._WGMMA_192_C2X2 in tune.candidates(_problem(3000, 3000, 3000, pitch128=False))


def test_wave_model_choices():
    """The chooser takes 128 x 192 where it won on an H100 (s10-tile192) and keeps the other
    tiles where they won or the 192-wide ones make more waves."""
    assert tune.heuristic(_problem(256, 11008, 4096)) == tune._WGMMA_192  # 116 CTAs, not 86
    # 96 against 72 (1536^3 now takes 192 x 128, 96 tiles too: test_gemm_tile192r.py)
    assert tune.heuristic(_problem(1536, 1536, 1024)) == tune._WGMMA_192
    assert tune.heuristic(_problem(2000, 3000, 1000, pitch128=False)) == tune._WGMMA_192_C2
    assert tune.heuristic(_problem(3000, 5000, 2000, pitch128=False)) == tune._WGMMA_C2X2
    for dims in ((4096, 4096, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (2048, 11008, 4096),
                 (256, 14336, 4096)):  # 192-wide tiles would add a wave
        assert tune.heuristic(_problem(*dims)).bn == 256, dims
    assert tune.heuristic(_problem(1024, 1024, 1024)) == tune._WGMMA_64  # s11-tile64
    assert tune.heuristic(_problem(2000, 3000, 1000, dt=tune.DT_TF32)).bn != 192


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    tiles.layouts_and_edges(config, 61)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    tiles.many_tiles_per_cta(config, 67)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [W192, VARIANTS[2]], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(71))
