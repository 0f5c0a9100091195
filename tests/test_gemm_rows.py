"""fp32 GEMMs cut in two along M (kernels/_gemm_rows.py): whole waves of the wide simt tile
over the first rows, the rest as a second launch. Where the wave model cuts (CPU), and the
cut's results against float64 in every layout, on offset views, with alpha/beta/Cin, into a
column-major C, through the planned path and in a CUDA graph (GPU)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import gpurt
from test_gemm import (
    _assert_counters_zero,
    check_replays,
    device,
    poisoned,
    rand,
    reference,
    rel_err,
)

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
plans = importlib.import_module("gpurt.kernels._gemm_plan")
rows_mod = importlib.import_module("gpurt.kernels._gemm_rows")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
simt_model = importlib.import_module("gpurt.kernels._gemm_simt_model")
tunable = importlib.import_module("gpurt.kernels.tunable")

LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]
# (m, n, k, rows of the head, head tile): a tail with a K split (37 x 517 x 1001) and without
CASES = [(293, 517, 1001, 256, tune._SIMT[0]), (300, 290, 203, 128, tune._SIMT[1])]


def _problem(m, n, k, dt=tune.DT_F32, sms=132, b_kmajor=False):
    vec = n % 4 == 0 and k % 4 == 0
    return tune.Problem(m, n, k, dt, True, b_kmajor, vec, vec, (9, 0), sms)


def test_cut_where_the_last_wave_is_nearly_empty(monkeypatch):
    """3000^3 (288 wide tiles on 132 SMs: 2.2 waves) runs 22 tile rows (two whole waves)
    apart from the last 184 rows; grids of nearly whole waves, small ones, 16-bit types and
    GPURT_GEMM_DISABLE=rows are not cut."""
    assert rows_mod.cut(_problem(3000, 3000, 3000)) == (2816, tune._SIMT[0])
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048),
                    (1000, 1000, 1000), (128, 4096, 4096), (8192, 8192, 512)]:
        assert rows_mod.cut(_problem(m, n, k)) is None, (m, n, k)
    assert rows_mod.cut(_problem(3000, 3000, 3000, tune.DT_BF16)) is None
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "rows")
    assert rows_mod.cut(_problem(3000, 3000, 3000)) is None


def test_cut_costs_less_than_one_grid_in_the_model():
    """Where it cuts, the model's two grids plus the cut's cost beat one grid by 3%."""
    for m, n, k in [(3000, 3000, 3000), (2053, 3001, 1999)]:
        p = _problem(m, n, k)
        head_rows, head = rows_mod.cut(p)
        whole = tune.heuristic(p)
        assert rows_mod._cut_cost(p, head, head_rows) < 0.97 * simt_model.grid_cost(
            p, whole, whole.split_k)
        assert head_rows % head.bm == 0 and 0 < head_rows < m


@pytest.fixture
def forced_cut(monkeypatch):
    """gemm's plans cut where the test says (``set(rows, head)``), untuned, cleared before
    and after; yields the setter."""
    monkeypatch.setattr(tunable, "is_enabled", lambda: False)

    def force(head_rows, head):
        monkeypatch.setattr(rows_mod, "cut", lambda problem: (head_rows, head))
        gemm_mod.clear_plans()

    gemm_mod.clear_plans()
    yield force
    gemm_mod.clear_plans()


def _planned_cuts():
    return [entry[0] for entry in gemm_mod._calls.values()
            if isinstance(entry[0], rows_mod.RowsCall)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,head_rows,head", CASES, ids=["tail_split", "tail_whole"])
def test_cut_matches_float64(gpu_state, forced_cut, m, n, k, head_rows, head):
    """Every layout, offset views (odd pitches and bases) every other one, alpha/beta/Cin;
    the planned second call gives the first's bits; a column-major C (the plan turned
    around: the cut runs along N) too."""
    forced_cut(head_rows, head)
    rng = np.random.default_rng(61)
    for index, (trans_a, trans_b) in enumerate(LAYOUTS):
        pad = 3 if index % 2 else 0
        a = rand(rng, (k, m + pad) if trans_a else (m, k + pad), np.float32)
        b = rand(rng, (n, k + pad) if trans_b else (k, n + pad), np.float32)
        c = rand(rng, (m, n), np.float32)
        da, db, dc = device(a)[:, pad:], device(b)[:, pad:], device(c)
        want = reference(a[:, pad:], b[:, pad:], trans_a, trans_b, alpha=0.75, beta=-1.25, c=c)
        got = []
        for _ in range(2):
            out = poisoned((m, n), np.float32)
            gemm_mod.gemm(da, db, out=out, trans_a=trans_a, trans_b=trans_b, alpha=0.75,
                          beta=-1.25, c=dc)
            got.append(out.numpy())
            assert rel_err(got[-1], want) < 1e-5, (trans_a, trans_b, pad)
        assert got[0].tobytes() == got[1].tobytes()
        assert [call.rows for call in _planned_cuts()] == [head_rows], (trans_a, trans_b)
        gemm_mod.clear_plans()
    out_t = poisoned((n, m), np.float32)
    gemm_mod.gemm(device(a[:, pad:]), device(b[:, pad:]), out=out_t.T, trans_a=trans_a,
                  trans_b=trans_b)
    assert rel_err(out_t.numpy().T, reference(a[:, pad:], b[:, pad:], trans_a, trans_b)) < 1e-5
    _assert_counters_zero()


@pytest.mark.gpu
def test_cut_in_a_graph(gpu_state, forced_cut):
    """Both launches captured, replayed on fresh inputs (the tail's split-K ending included)."""
    forced_cut(256, tune._SIMT[0])
    rng = np.random.default_rng(67)
    m, n, k = 293, 517, 1001
    da, db = device(rand(rng, (m, k), np.float32)), device(rand(rng, (k, n), np.float32))
    out = poisoned((m, n), np.float32)
    gemm_mod.gemm(da, db, out=out)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm_mod.gemm(da, db, out=out)
    check_replays(graph, da, db, out, rng, "cut", np.float32, 1e-5)
    del graph
    assert _planned_cuts()
    _assert_counters_zero()


@pytest.mark.gpu
def test_the_model_cuts_on_few_sms(gpu_state, monkeypatch):
    """With 6 SMs the model itself cuts 600 x 260 x 800 (its first 512 rows on 128 x 128
    tiles, two whole waves), and the result is right."""
    monkeypatch.setattr(tunable, "is_enabled", lambda: False)
    monkeypatch.setattr(plans, "usable_sms", lambda index, count: 6)
    gemm_mod.clear_plans()
    rng = np.random.default_rng(71)
    m, n, k = 600, 260, 800
    a, b = rand(rng, (m, k), np.float32), rand(rng, (k, n), np.float32)
    out = poisoned((m, n), np.float32)
    try:
        gemm_mod.gemm(device(a), device(b), out=out)
        cuts = _planned_cuts()
    finally:
        gemm_mod.clear_plans()
    assert rel_err(out.numpy(), reference(a, b)) < 1e-5
    assert len(cuts) == 1 and cuts[0].head.config == tune._SIMT[1]
