"""Exact fp32 (simt) on rows along M or N that are not 16-byte multiples: those operands copied
into 128-byte rows first (kernels/_gemm_pack.py, ``simt=True``), then the vector-load kernel,
cut along M or not. Where the model takes the route (CPU), and its results against float64 in
every layout, on offset views, with alpha/beta/Cin, with and without the cut, through the
planned path and in a CUDA graph (GPU)."""

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
pack = importlib.import_module("gpurt.kernels._gemm_pack")
rows_mod = importlib.import_module("gpurt.kernels._gemm_rows")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
tunable = importlib.import_module("gpurt.kernels.tunable")

LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]
_BASE = 1 << 20  # a 128-byte aligned address for the model's operands


def _problem(m, n, k, vec):
    return tune.Problem(m, n, k, tune.DT_F32, True, False, vec, False, (9, 0), 132)


def _copies(m, n, k):
    """The simt copies of a row-major A (m x k) and B (k x n) with 16-byte-aligned bases."""
    return pack.copies_for([(_BASE, k, True, m, k), (_BASE, n, False, n, k)], 4, simt=True)


def test_simt_copies_only_rows_along_m_or_n():
    """K-major operands (4-byte transposing copies at any alignment) and 16-byte rows are
    not copied; B's rows of 3001 floats are, into a 128-byte pitch."""
    copies = _copies(2053, 3001, 1999)
    assert [(c.which, c.width, c.rows, c.pitch) for c in copies] == [(1, 3001, 1999, 3008)]
    assert _copies(2053, 3000, 1999) == ()
    both = pack.copies_for([(_BASE, 2053, False, 2053, 1999), (_BASE, 1999, True, 3001, 1999)],
                           4, simt=True)
    assert [c.which for c in both] == [0]  # A stored K x M (M-major), B N x K (K-major)


def test_the_model_copies_big_problems_only():
    """2053 x 3001 x 1999, 4099^3 and 3001^3 gain more than the copy costs; 1031^3 and the
    decode shapes on 4099 rows do not."""
    for m, n, k in [(2053, 3001, 1999), (4099, 4099, 4099), (3001, 3001, 3001)]:
        assert pack.simt_pays(rows_mod.modelled(_problem(m, n, k, False)),
                              rows_mod.modelled(_problem(m, n, k, True)), _copies(m, n, k))
    for m, n, k in [(1031, 1029, 1027), (128, 4099, 4099), (16, 4099, 4099)]:
        assert not pack.simt_pays(rows_mod.modelled(_problem(m, n, k, False)),
                                  rows_mod.modelled(_problem(m, n, k, True)), _copies(m, n, k))
    assert not pack.simt_pays(100.0, 50.0, ())


@pytest.fixture
def forced_route(monkeypatch):
    """gemm's fp32 plans take the copies wherever rows allow them (``set(cut)``: and cut
    where the test says, or never with None), untuned, cleared before and after."""
    monkeypatch.setattr(tunable, "is_enabled", lambda: False)
    monkeypatch.setattr(pack, "simt_pays", lambda before, after, copies: bool(copies))

    def force(cut):
        monkeypatch.setattr(rows_mod, "cut", lambda problem: cut)
        gemm_mod.clear_plans()

    gemm_mod.clear_plans()
    yield force
    gemm_mod.clear_plans()


def _planned_packs():
    return [entry[0] for entry in gemm_mod._calls.values()
            if isinstance(entry[0], pack.PackedCall)]


# (m, n, k, cut, whether a part splits K): the cut with a split tail, one grid (split and not)
CASES = [(293, 517, 1001, (256, tune._SIMT[0]), True), (300, 290, 203, (128, tune._SIMT[1]), True),
         (131, 259, 1003, None, True), (67, 33, 45, None, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,cut,split", CASES, ids=["cut_split", "cut", "split", "small"])
def test_packed_simt_matches_float64(gpu_state, forced_route, m, n, k, cut, split):
    """Every layout, offset views (odd pitches and bases) every other one, alpha/beta/Cin;
    the planned second call gives the first's bits; C turned around (column-major) too."""
    forced_route(cut)
    rng = np.random.default_rng(83)
    n_odd = n + (n % 4 == 0)  # rows of an odd count of floats: never 16-byte multiples
    for index, (trans_a, trans_b) in enumerate(LAYOUTS):
        pad = 3 if index % 2 else 0
        a = rand(rng, (k, m + pad) if trans_a else (m, k + pad), np.float32)
        b = rand(rng, (n_odd, k + pad) if trans_b else (k, n_odd + pad), np.float32)
        c = rand(rng, (m, n_odd), np.float32)
        da, db, dc = device(a)[:, pad:], device(b)[:, pad:], device(c)
        want = reference(a[:, pad:], b[:, pad:], trans_a, trans_b, alpha=0.75, beta=-1.25, c=c)
        got = []
        for _ in range(2):
            out = poisoned((m, n_odd), np.float32)
            gemm_mod.gemm(da, db, out=out, trans_a=trans_a, trans_b=trans_b, alpha=0.75,
                          beta=-1.25, c=dc)
            got.append(out.numpy())
            assert rel_err(got[-1], want) < 1e-5, (trans_a, trans_b, pad)
        assert got[0].tobytes() == got[1].tobytes()
        packs = _planned_packs()
        # A stored K x M (on a view 3 floats in) is copied too; B stored N x K (K-major) is not
        copied = "A" * trans_a + "B" * (not trans_b)
        if copied:
            assert len(packs) == 1 and packs[0].label().endswith(" pack" + copied), \
                (trans_a, trans_b, [p.label() for p in packs])
            assert isinstance(packs[0].inner, rows_mod.RowsCall) == (cut is not None)
        else:
            assert not packs, (trans_a, trans_b)
        gemm_mod.clear_plans()
    out_t = poisoned((n_odd, m), np.float32)
    gemm_mod.gemm(device(a[:, pad:]), device(b[:, pad:]), out=out_t.T, trans_a=trans_a,
                  trans_b=trans_b)
    assert rel_err(out_t.numpy().T, reference(a[:, pad:], b[:, pad:], trans_a, trans_b)) < 1e-5
    if split:  # (unsplit calls take no counters: the workspace then holds only the copies)
        _assert_counters_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("cut", [(256, tune._SIMT[0]), None], ids=["cut", "whole"])
def test_packed_simt_in_a_graph(gpu_state, forced_route, cut):
    """The copy and both launches of the cut captured, replayed on fresh inputs (the tail's
    split-K ending and the copies' scratch from the graph's own workspace)."""
    forced_route(cut)
    rng = np.random.default_rng(89)
    m, n, k = 293, 517, 1001
    da, db = device(rand(rng, (m, k), np.float32)), device(rand(rng, (k, n), np.float32))
    out = poisoned((m, n), np.float32)
    gemm_mod.gemm(da, db, out=out)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm_mod.gemm(da, db, out=out)
    check_replays(graph, da, db, out, rng, "simt pack", np.float32, 1e-5)
    del graph
    assert len(_planned_packs()) == 1
    _assert_counters_zero()


@pytest.mark.gpu
def test_the_model_copies_b_at_2053x3001x1999(gpu_state, monkeypatch):
    """The model's own choice at 2053 x 3001 x 1999: B copied, then the cut; the result
    right; GPURT_GEMM_DISABLE=pack keeps the rows as they are."""
    monkeypatch.setattr(tunable, "is_enabled", lambda: False)
    gemm_mod.clear_plans()
    rng = np.random.default_rng(97)
    m, n, k = 2053, 3001, 1999
    a, b = rand(rng, (m, k), np.float32), rand(rng, (k, n), np.float32)
    da, db = device(a), device(b)
    out = poisoned((m, n), np.float32)
    try:
        gemm_mod.gemm(da, db, out=out)
        packs = _planned_packs()
        assert rel_err(out.numpy(), reference(a, b)) < 1e-5
        assert len(packs) == 1 and packs[0].label().endswith(" packB")
        assert isinstance(packs[0].inner, rows_mod.RowsCall)
        monkeypatch.setenv("GPURT_GEMM_DISABLE", "pack")
        gemm_mod.clear_plans()
        gemm_mod.gemm(da, db, out=out)
        assert not _planned_packs()
    finally:
        gemm_mod.clear_plans()
