"""64-row tiles on the 16-bit wgmma kernel (kernels/gemm_wgmma_x.cu's gemm_wgmma_64: a producer
and one consumer warpgroup, m64nBNk16, gemm_wgmma.cu's body with TBM = 64). CPU: configs,
names, what they reject, compiled without spills, the tuner's and the sweep's lists (the
heuristic does not take them yet). GPU: every layout, both 16-bit types, edge tiles, many tiles
per CTA, alpha/beta/Cin, offset views, plain and pipelined stores, graph replay, against
float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest

import gpurt
from test_gemm_wgmma_x import _case, _graph_case, _hopper, _ids

gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

T64 = tune._WGMMA_64
VARIANTS = [
    T64,
    dataclasses.replace(T64, tma_store=False, stages=6),  # plain stores
    dataclasses.replace(T64, pipe_store=True),  # 64-wide passes into two boxes in turn
    Config("wgmma", 64, 256, 64, stages=5, group_m=16, tma_store=True),  # m64n256: 128 accs
]


def _problem(m, n, k, pitch128=True, b_k=False, dt=tune.DT_BF16):
    return tune.Problem(m, n, k, dt, True, b_k, True, True, (9, 0), 132, pitch128=pitch128)


def test_config_fields():
    assert T64.label() == "wgmma 64x128x64 s8 tmaC g8"
    assert T64.threads == 256 and tune._WGMMA[5].threads == 384
    assert T64.source == "gemm_wgmma_x.cu"
    assert T64.name_expression(2, True, False, True) == \
        "gemm_wgmma_64<2, 128, 8, true, false, true>"
    assert VARIANTS[2].name_expression(1, False, True, True) == \
        "gemm_wgmma_64<1, 128, 8, false, true, true, true>"
    # 8 stages of 8 + 16 KiB and one consumer's 16 KiB of TMA-store staging fit 227 KiB
    assert T64.shared_mem(True, False) == 8 * 24 * 1024 + 16 * 1024 + 16 * 8 + 1024
    assert T64.shared_mem(True, False) <= 227 * 1024
    assert VARIANTS[3].shared_mem(True, True) <= 227 * 1024
    assert Config.from_json(T64.to_json()) == T64
    assert T64.tiles(1000, 1000) == 16 * 8 and tune._WGMMA[5].tiles(1000, 1000) == 8 * 8


@pytest.mark.parametrize("bad", [
    dict(split_k=2), dict(cluster_m=2), dict(cluster_n=2), dict(pingpong=True), dict(bk=32),
])
def test_config_rejects(bad):
    with pytest.raises(ValueError, match="64-row wgmma tiles"):
        dataclasses.replace(T64, **bad)
    with pytest.raises(ValueError, match=r"\(64\|128\) x"):
        dataclasses.replace(T64, bm=32)


def test_compiles_without_spills(tmp_path, monkeypatch):
    """232 registers (the consumers' setmaxnreg): 256 threads hold 59392 of the SM's 65536."""
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = sorted({config.name_expression(dt, a_k, b_k, True) for config in VARIANTS
                    for dt, a_k, b_k in ((tune.DT_BF16, True, False), (tune.DT_F16, False, True))})
    source = T64.source
    module = gpurt.compile(gemm_launch.text(source), options=["--ptxas-options=-v"],
                           name_expressions=names, arch="sm_90a", program_name=source,
                           headers=gemm_launch.headers(source))
    log = module.log
    assert "warning" not in log.lower(), log
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(names) and set(spills) == {"0"}, log
    assert set(re.findall(r"Used (\d+) registers", log)) == {"232"}, log


def test_tuner_and_sweep_offer_it():
    assert T64 in tune.candidates(_problem(1000, 1000, 1000, pitch128=False))
    assert T64 in tune.all_configs(_problem(4096, 4096, 4096))
    assert T64 not in tune.all_configs(_problem(1000, 1000, 1000, dt=tune.DT_TF32))


def test_heuristic_takes_them_where_128_row_tiles_leave_sms_idle():
    """The wave model (H200, s11-tile64) takes 64 x 128 where 128 x 128 leaves SMs idle: 1000^3
    and 1024^3 (128 tiles against 64), 768^3, and one full wave of them unsplit before split-K
    at 256x4096x4096; not on grids of whole waves like 4096^3, which the tuner does not time it
    on either."""
    for dims, pitch128 in (((1000, 1000, 1000), False), ((1024, 1024, 1024), True),
                           ((768, 768, 768), True), ((256, 4096, 4096), True)):
        problem = _problem(*dims, pitch128=pitch128)
        assert tune.heuristic(problem) == T64, dims
        assert T64 in tune.candidates(problem), dims
    problem = _problem(4096, 4096, 4096)
    assert tune.heuristic(problem).bm == 128 and T64 not in tune.candidates(problem)


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    """Every layout, both 16-bit types; edge tiles in M (inside the 64 rows), N and K."""
    _hopper()
    rng = np.random.default_rng(83)
    for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
        for dtype in (gpurt.bfloat16, np.float16):
            _case(rng, config, dtype, 3 * 64 - 8, 3 * config.bn + 8, 3 * 64 + 8, trans_a,
                  trans_b)
    _case(rng, config, gpurt.bfloat16, 200, 264, 72, beta=0.5)  # 2 K tiles, Cin
    _case(rng, config, np.float16, 136, 520, 1000, beta=-1.0, offset=8)  # K not a multiple
    _case(rng, config, gpurt.bfloat16, 72, 2 * config.bn + 24, 136, trans_b=True, odd_out=True)
    _case(rng, config, gpurt.bfloat16, 24, 40, 200, trans_a=True)  # one tile, mostly empty


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    """Far more tiles than CTAs (each CTA walks several, its stores overlapping the next
    tile's loads), and issue 17's shapes on split rows (pitches of 2000 bytes)."""
    _hopper()
    rng = np.random.default_rng(89)
    sms = gpurt.get_device_properties().multi_processor_count
    _case(rng, config, gpurt.bfloat16, 64 * (sms // 4 + 3), 1000, 520)
    _case(rng, config, gpurt.bfloat16, 1000, 1000, 1000, beta=0.25)
    _case(rng, config, np.float16, 1000, 3000, 264, trans_a=True, trans_b=True)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [T64, VARIANTS[2]], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(97))
