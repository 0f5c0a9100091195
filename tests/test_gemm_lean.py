"""The lean forms of the 16-bit wgmma kernel (Config.lean; kernels/gemm_wgmma.cu's gemm_wgmma_bm,
its LEAN bits: descriptors by offset, the first stages' copies before the CTA barrier, an
epilogue without the per-element beta test). CPU: names, labels, what they reject, compiled
without spills. GPU: every layout, both 16-bit types, edge tiles, K shorter than the ring,
alpha/beta/Cin, offset views, many tiles per CTA, in clusters, with the pipelined and the
held-stage epilogues, plain stores, graph replay, against float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import _wgmma_tiles as tiles
from test_gemm_wgmma_x import _graph_case, _ids

tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

T64 = tune._WGMMA_64
VARIANTS = [
    dataclasses.replace(T64, lean=7),  # every bit
    dataclasses.replace(T64, lean=1),
    dataclasses.replace(T64, lean=2),
    dataclasses.replace(tune._WGMMA_64_C2, lean=7),  # clusters: the barrier whole
    dataclasses.replace(tune._WGMMA[5], pipe_store=True, lean=7),  # 128 x 128 pipelined
    dataclasses.replace(tune._WGMMA_192_C2, lean=7),  # 128 x 192 s5: the held stage
    dataclasses.replace(tune._WGMMA_192_C2, lean=16),  # held stage, the producer's tail
    dataclasses.replace(tune._WGMMA_64_C2, lean=23),  # the producer's tail, no end barrier
    dataclasses.replace(tune._WGMMA_T192_C2, lean=23),  # 192 x 192 c2, the producer's tail
    dataclasses.replace(tune._WGMMA_64_C2, lean=23, swap=True),  # C^T, the producer's tail
    dataclasses.replace(tune._WGMMA[6], lean=16),  # 128 x 256 c2, the producer's tail
    dataclasses.replace(tune._WGMMA_T192, lean=7),  # 192 x 192: three consumers
    dataclasses.replace(T64, tma_store=False, lean=7),  # plain stores
    dataclasses.replace(T64, lean=0),  # the plain 64 x 128 tile
    tune._WGMMA_64_LEAN4,  # the tuner's candidate: beta-free staged stores alone
    T64,  # the default: lean 5, and descriptors by offset
]


def test_config_fields():
    lean = VARIANTS[-1]
    assert lean.label() == "wgmma 64x128x64 s8 tmaC lean5 g8"
    assert lean.source == VARIANTS[4].source == "gemm_wgmma.cu"
    assert lean.name_expression(2, True, False, True) == \
        "gemm_wgmma_bm<2, 64, 128, 8, true, false, 1, true, false, 5>"
    assert VARIANTS[4].name_expression(1, False, True, True) == \
        "gemm_wgmma_bm<1, 128, 128, 6, false, true, 1, true, true, 7>"
    assert lean.shared_mem(True, False) == T64.shared_mem(True, False)
    assert lean.threads == T64.threads
    assert Config.from_json(lean.to_json()) == lean
    assert T64.lean == 5 and tune._WGMMA_64_C2.lean == 23  # the defaults (s12c-lean, s16)
    assert "lean" not in VARIANTS[-3].label()


@pytest.mark.parametrize("bad", [
    dict(lean=8), dict(lean=15), dict(lean=16), dict(lean=32), dict(lean=-1),
    dict(lean=24, cluster_m=2), dict(lean=11, cluster_m=2),
    dict(split_k=2, bm=128), dict(cluster_n=2, bm=128), dict(pingpong=True, bm=128),
])
def test_config_rejects(bad):
    with pytest.raises(ValueError, match="lean"):
        dataclasses.replace(VARIANTS[0], **bad)


def test_cluster_defaults_end_without_a_barrier():
    """The cluster defaults end with the producer's tail (bit 16), no cluster barrier; bit 8
    (session 15's split end barrier, which the tail beat everywhere) is gone."""
    for config in (tune._WGMMA_64_C2, tune._WGMMA_T192_C2, tune._WGMMA_192_C2, tune._WGMMA[6]):
        assert config.cluster_m == 2 and config.lean & 16, config


def test_tuner_offers_lean4_beside_the_64_row_tile():
    """Where the tuner times the 64 x 128 tile it times its lean 4 form too (a tuned table
    then holds the faster at each shape); the sanitizer sweep runs it."""
    assert tune._WGMMA_64_LEAN4 == dataclasses.replace(T64, lean=4)
    for dims, pitch128 in (((768, 768, 768), True), ((1000, 1000, 1000), False),
                           ((256, 4096, 4096), True)):
        offered = tune.candidates(tiles.problem(*dims, pitch128=pitch128))
        assert T64 in offered and tune._WGMMA_64_LEAN4 in offered, dims
    assert tune._WGMMA_64_LEAN4 not in tune.candidates(tiles.problem(4096, 4096, 4096))
    assert tune._WGMMA_64_LEAN4 in tune.all_configs(tiles.problem(1000, 1000, 1000))


def test_compiles_without_spills(tmp_path, monkeypatch):
    tiles.assert_compiles_without_spills(VARIANTS, tmp_path, monkeypatch)


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    tiles.layouts_and_edges(config, 101)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS[:9], ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    tiles.many_tiles_per_cta(config, 103)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS[:1], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(107))
