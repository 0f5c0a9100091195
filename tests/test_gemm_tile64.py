"""64-row tiles on the 16-bit wgmma kernel (kernels/gemm_wgmma.cu's gemm_wgmma_bm: a producer
and one consumer warpgroup, m64nBNk16, gemm_wgmma.cu's body with BM = 64). CPU: configs,
names, what they reject, compiled without spills, the tuner's and the sweep's lists, the
heuristic's picks. GPU: every layout, both 16-bit types, edge tiles, many tiles
per CTA, alpha/beta/Cin, offset views, plain and pipelined stores, graph replay, against
float64 on poisoned outputs."""

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

T64 = tune._WGMMA_64
VARIANTS = [
    T64,
    dataclasses.replace(T64, tma_store=False, stages=6),  # plain stores
    dataclasses.replace(T64, pipe_store=True),  # 64-wide passes into two boxes in turn
    Config("wgmma", 64, 256, 64, stages=5, group_m=16, tma_store=True),  # m64n256: 128 accs
    tune._WGMMA_64_C2,  # 2-CTA clusters along M, B multicast (s12-tile64n)
    dataclasses.replace(tune._WGMMA_64_C2, pipe_store=True, lean=0),
    dataclasses.replace(T64, lean=0),  # the plain tile (the default until s12c-lean)
]
T64_C2 = tune._WGMMA_64_C2


_problem = tiles.problem


def test_config_fields():
    assert T64.label() == "wgmma 64x128x64 s8 tmaC lean5 g8"
    assert T64.threads == 256 and tune._WGMMA[5].threads == 384
    assert T64.source == VARIANTS[2].source == "gemm_wgmma.cu"
    assert T64.name_expression(2, True, False, True) == \
        "gemm_wgmma_bm<2, 64, 128, 8, true, false, 1, true, false, 5>"
    assert VARIANTS[2].name_expression(1, False, True, True) == \
        "gemm_wgmma_bm<1, 64, 128, 8, false, true, 1, true, true, 5>"
    # 8 stages of 8 + 16 KiB and one consumer's 16 KiB of TMA-store staging fit 227 KiB
    assert T64.shared_mem(True, False) == 8 * 24 * 1024 + 16 * 1024 + 16 * 8 + 1024
    assert T64.shared_mem(True, False) <= 227 * 1024
    assert VARIANTS[3].shared_mem(True, True) <= 227 * 1024
    assert Config.from_json(T64.to_json()) == T64
    assert T64.tiles(1000, 1000) == 16 * 8 and tune._WGMMA[5].tiles(1000, 1000) == 8 * 8
    assert T64_C2.label() == "wgmma 64x128x64 s8 c2 tmaC lean23 g8" and T64_C2.cluster == 2
    assert T64_C2.threads == 256 and T64_C2.shared_mem(True, False) == T64.shared_mem(True, False)
    assert T64_C2.name_expression(2, True, False, True) == \
        "gemm_wgmma_bm<2, 64, 128, 8, true, false, 2, true, false, 23>"
    assert dataclasses.replace(T64_C2, lean=0).name_expression(2, True, False, True) == \
        "gemm_wgmma_bm<2, 64, 128, 8, true, false, 2, true>"


@pytest.mark.parametrize("bad", [
    dict(split_k=2), dict(cluster_n=2), dict(cluster_m=2, cluster_n=2), dict(pingpong=True),
    dict(bk=32),
])
def test_config_rejects(bad):
    with pytest.raises(ValueError, match="64-row wgmma tiles"):
        dataclasses.replace(T64, **bad)
    with pytest.raises(ValueError, match=r"\(64\|128\) x"):
        dataclasses.replace(T64, bm=32)
    with pytest.raises(ValueError, match="64-wide chunks of B"):
        dataclasses.replace(T64_C2, bn=64)


def test_compiles_without_spills(tmp_path, monkeypatch):
    """232 registers (the consumers' setmaxnreg): 256 threads hold 59392 of the SM's 65536."""
    tiles.assert_compiles_without_spills(VARIANTS, tmp_path, monkeypatch, registers="232")


def test_tuner_and_sweep_offer_it():
    assert {T64, T64_C2} <= set(tune.candidates(_problem(1000, 1000, 1000, pitch128=False)))
    assert T64_C2 not in tune.candidates(_problem(1024, 1024, 1024))  # clusters: split rows
    assert {T64, T64_C2} <= set(tune.all_configs(_problem(4096, 4096, 4096)))
    assert T64 not in tune.all_configs(_problem(1000, 1000, 1000, dt=tune.DT_TF32))


def test_heuristic_takes_them_where_128_row_tiles_leave_sms_idle():
    """The wave model (H200, s11-tile64) takes 64 x 128 where 128 x 128 leaves SMs idle: 1000^3
    and 1024^3 (128 tiles against 64), 768^3 (where 64 x 96 tiles of C^T then replace them:
    test_gemm_swap.py), and one full wave of them unsplit before split-K at 256x4096x4096; not
    on grids of whole waves like 4096^3, which the tuner does not time it on either."""
    for dims, pitch128 in (((1024, 1024, 1024), True), ((768, 768, 768), True),
                           ((256, 4096, 4096), True)):
        problem = _problem(*dims, pitch128=pitch128)
        want = tune._WGMMA_64N96_T if dims[0] == 768 else T64
        assert tune.heuristic(problem) == want, dims
        assert T64 in tune.candidates(problem), dims
    problem = _problem(4096, 4096, 4096)
    assert tune.heuristic(problem).bm == 128 and T64 not in tune.candidates(problem)


def test_heuristic_clusters_them_on_split_rows():
    """On rows that are not 128-byte multiples the L2's requests limit the one-wave grids of
    64 x 128 tiles: 2-CTA clusters along M (B multicast) where the tiles fill 90% of the SMs
    and the pairs run as one wave (s12-tile64n, H100); not on fewer tiles (the L2 is not the
    limit there: untimed) nor where the pairs would take two waves (66 at once on 132 SMs)."""
    for dims in ((1000, 1000, 1000), (1000, 1000, 4000), (1000, 1000, 2000), (1024, 1000, 500)):
        problem = _problem(*dims, pitch128=False)
        assert tune.heuristic(problem) == T64_C2, dims
        assert T64_C2 in tune.candidates(problem), dims
    assert tune._rows64_cluster(_problem(1000, 1000, 1000, pitch128=False), T64) == T64_C2
    assert tune._rows64_cluster(_problem(1000, 1000, 1000), T64) == T64  # 128-byte rows
    assert tune._rows64_cluster(_problem(1000, 1200, 1000, pitch128=False), T64) == T64
    assert tune._rows64_cluster(_problem(1000, 768, 1000, pitch128=False), T64) == T64  # 96
    assert tune.heuristic(_problem(1000, 768, 1000, pitch128=False)) == T64
    assert tune._rows64_cluster(_problem(1000, 1000, 1000, pitch128=False),
                                tune._WGMMA[5]) == tune._WGMMA[5]


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    tiles.layouts_and_edges(config, 83)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    tiles.many_tiles_per_cta(config, 89)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [T64, VARIANTS[2]], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(97))
