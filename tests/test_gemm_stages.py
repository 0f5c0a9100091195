"""5 stages of 128 x 192 on the 16-bit wgmma kernel (cuBLAS's depth at 2000x3000x1000): a ring
too deep to leave two TMA-store staging boxes per consumer beside it stages C through one
[64][64] box per consumer, 64 columns a pass (kernels/gemm_wgmma.cu ONE_BOX; Config.shared_mem
keeps the same rule), which also fits 192 x 192 with 4 stages and 192 x 128 with 5; with
pipe_store the odd passes go to the A half of the tile's last stage, held until they are read
(HOLD).
CPU: shared memory, names, what is rejected, the defaults that take them, compiled without
spills. GPU: every layout, both 16-bit types, edges inside each 64-column pass, clusters,
beta/Cin, offset views, C rows TMA cannot store, many tiles per CTA, graph replay, against
float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import _wgmma_tiles as tiles
from test_gemm_wgmma_x import _graph_case, _ids

tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

S5 = dataclasses.replace(tune._WGMMA_192_S4, stages=5)  # one box per consumer
C2_S5 = dataclasses.replace(S5, cluster_m=2)
S5_PS, C2_S5_PS = (dataclasses.replace(c, pipe_store=True) for c in (S5, C2_S5))
PLAIN_S5 = dataclasses.replace(S5, tma_store=False, group_m=8)  # no staging (CPU only)
T192_S4 = tune._WGMMA_T192  # one box per slab as well
T192N128_S5 = tune._WGMMA_T192N128
VARIANTS = [
    S5,
    C2_S5,  # gemm_wgmma's clusters: B multicast
    S5_PS,  # gemm_wgmma_x: the held stage as a second box
    C2_S5_PS,
    T192_S4,
    T192N128_S5,
]
SMEM = 227 * 1024

_problem = tiles.problem


def test_config_fields():
    assert S5.label() == "wgmma 128x192x64 s5 tmaC g16"
    assert C2_S5.name_expression(2, True, False, True) == \
        "gemm_wgmma<2, 192, 5, true, false, 2, true>"
    assert C2_S5_PS.name_expression(1, False, True, True) == \
        "gemm_wgmma_x<1, 192, 5, false, true, 2, 1, false, true, true>"
    assert S5_PS.shared_mem(True, False) == S5.shared_mem(True, False)
    assert T192N128_S5.name_expression(1, False, True, True) == \
        "gemm_wgmma_bm<1, 192, 128, 5, false, true, 1, true>"
    # 5 x 40 KiB + one 8 KiB box per consumer + barriers + the 1 KiB alignment slack
    assert S5.shared_mem(True, False) == 5 * 40960 + 2 * 8192 + 5 * 16 + 1024 <= SMEM
    assert S5.shared_mem(True, False) + 2 * 8192 > SMEM  # two boxes each would not fit
    assert PLAIN_S5.shared_mem(True, False) == 5 * 40960 + 5 * 16 + 1024
    assert T192_S4.shared_mem(True, False) == 4 * 49152 + 3 * 8192 + 4 * 16 + 1024 <= SMEM
    assert T192N128_S5.shared_mem(True, False) <= SMEM
    # the configs whose two boxes fit keep them (their shared memory, their PTX)
    assert tune._WGMMA_192_S4.shared_mem(True, False) == 4 * 40960 + 2 * 16384 + 4 * 16 + 1024
    assert tune._WGMMA[4].shared_mem(True, False) == 4 * 49152 + 2 * 16384 + 4 * 16 + 1024
    assert Config.from_json(C2_S5.to_json()) == C2_S5


@pytest.mark.parametrize("config, bad, match", [
    (S5, dict(stages=6), "at most 5 stages"),
    (S5_PS, dict(stages=4), "pipe_store"),  # two boxes each, three passes: not even
    (Config("wgmma", 64, 192, 64, stages=5, tma_store=True), dict(pipe_store=True),
     "pipe_store"),
    (T192_S4, dict(pipe_store=True), "192-row"),
    (S5, dict(split_k=2), "unsplit 16-bit"),
])
def test_config_rejects(config, bad, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(config, **bad)


def test_too_deep_for_one_box_is_not_eligible():
    """A ring that leaves no room even for one box per consumer: why_not says so."""
    problem = _problem(3000, 3000, 3000)
    assert tune.eligible(problem, S5) and tune.eligible(problem, T192_S4)
    deep = dataclasses.replace(tune._WGMMA_T192, stages=5)  # 240 KiB of ring
    assert "shared memory" in (tune.why_not(problem, deep) or "")


def test_defaults_take_the_winners():
    """Session 12's H100 run (notes_gemm.md): 5 stages with the held stage won for 128 x 192,
    4 stages of 192 x 192 in 2 x 1 clusters at 3000^3, 5 of 192 x 128 at 1536^3; 5 stages
    through one box alone lost to the held stage and is offered to no one. (Session 16: the
    cluster forms end without the cluster barrier, Config.lean 16.)"""
    picks = {((2000, 3000, 1000), False): dataclasses.replace(C2_S5_PS, lean=16),
             ((256, 11008, 4096), True): S5_PS,
             ((3000, 3000, 3000), False): dataclasses.replace(T192_S4, cluster_m=2, lean=23),
             ((1536, 1536, 1536), True): tune._WGMMA_T192N96_T}  # C^T (session 13)
    assert tune._tall_for(_problem(1536, 1536, 1536), tune._WGMMA_192) == T192N128_S5
    for (dims, pitch128), config in picks.items():
        problem = _problem(*dims, pitch128=pitch128)
        assert tune.heuristic(problem) == config, dims
        offered = {*tune.candidates(problem), *tune.all_configs(problem)}
        assert not offered & {S5, C2_S5}, dims


def test_compiles_without_spills(tmp_path, monkeypatch):
    tiles.assert_compiles_without_spills([S5, C2_S5, S5_PS, C2_S5_PS, T192_S4, T192N128_S5],
                                         tmp_path, monkeypatch)


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    tiles.layouts_and_edges(config, 89)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    tiles.many_tiles_per_cta(config, 97)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [S5, C2_S5, C2_S5_PS], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(101))
