"""The fp32 SIMT kernel's K tile run as a loop of ``kstep`` steps (kernels/gemm_simt.cu's
KSTEP): right against float64 and the same bits as the straight-line K tile (both add each
output's products in K order), in every layout, on offset views, split and not, in a graph;
and the config's checks (CPU)."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import gpurt
from test_gemm import _assert_counters_zero, check_replays, device, poisoned, rand, reference
from test_gemm_simt import LAYOUTS, _operands, _run

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

# (tile, kstep): 8 x 8 and 8 x 16 outputs a thread, 2 and 3 warp rows, 8- and 16-deep K tiles
ROLLED = [(tune._SIMT[3], 2), (tune._SIMT[0], 8), (tune._SIMT[2], 4), (tune._SIMT[8], 4)]


def _ids(value):
    return value.label().replace(" ", "_") if isinstance(value, Config) else str(value)


@pytest.mark.gpu
@pytest.mark.parametrize("base,kstep", ROLLED, ids=_ids)
def test_rolled_k_tile_is_the_straight_line_ones_bits(gpu_state, base, kstep):
    """Edges in M, N and K (a K shorter than a tile, a partial first tile), offset views
    (4-byte copies), alpha/beta/Cin, unsplit and split: each within float64's tolerance and
    bit for bit the kstep-0 kernel's result."""
    rng = np.random.default_rng(53)
    for index, (trans_a, trans_b) in enumerate(LAYOUTS):
        for m, n, k, split in [(2 * base.bm + 37, base.bn + 68, 203, 1),
                               (base.bm - 5, 2 * base.bn + 3, 7, 1),
                               (base.bm + 1, base.bn + 4, 1001, 3)]:
            dev, host = _operands(rng, m, n, k, trans_a, trans_b, offset=index % 2 == 1)
            straight = dataclasses.replace(base, split_k=split)
            rolled = dataclasses.replace(straight, kstep=kstep)
            want = _run(straight, dev, host, m, n, trans_a, trans_b)
            got = _run(rolled, dev, host, m, n, trans_a, trans_b)
            assert got.tobytes() == want.tobytes(), (rolled.label(), m, n, k)
    _assert_counters_zero()


@pytest.mark.gpu
def test_rolled_k_tile_in_a_graph(gpu_state):
    rng = np.random.default_rng(59)
    config = dataclasses.replace(tune._SIMT[3], kstep=4, split_k=2)
    m, n, k = 200, 259, 517
    a, b = rand(rng, (m, k), np.float32), rand(rng, (k, n), np.float32)
    da, db, out = device(a), device(b), poisoned((m, n), np.float32)
    gemm_mod.gemm(da, db, out=out, config=config)  # planned before the capture
    assert np.abs(out.numpy() - reference(a, b)).max() < 1e-3
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm_mod.gemm(da, db, out=out, config=config)
    check_replays(graph, da, db, out, rng, config.label(), np.float32, 1e-5)
    del graph
    _assert_counters_zero()


def test_kstep_names_and_checks():
    base = tune._SIMT[3]  # 64 x 128 x 8
    rolled = dataclasses.replace(base, kstep=4)
    assert rolled.name_expression(0, True, False, True) == \
        "gemm_simt<64, 128, 8, 8, 4, true, false, true, 4>"
    assert base.name_expression(0, True, False, True) == \
        "gemm_simt<64, 128, 8, 8, 4, true, false, true>"  # the old kernel's name
    assert "ks4" in rolled.label() and "ks" not in base.label()
    assert Config.from_json(rolled.to_json()) == rolled
    assert Config.from_json({k: v for k, v in base.to_json().items() if k != "kstep"}) == base
    for kstep in (3, 8, 16, -2, 6):  # odd, the whole tile, past it, negative, not a divisor
        with pytest.raises(ValueError, match="kstep"):
            dataclasses.replace(base, kstep=kstep)
    with pytest.raises(ValueError, match="kstep"):
        Config("mma", 128, 128, 32, 64, 64, stages=4, kstep=2)
