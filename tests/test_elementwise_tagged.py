"""Split column reductions folded from tagged partials (reduction.COLUMN_TAGGED,
reduce_codegen._fold_tagged): the plan and source on the CPU, then sums, maxima, a dot and
views on the GPU, the same bits as the shipped fold, repeated calls, two streams and graph
replays (the words and counters kept zeroed between launches)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401  (fixture)
from gpurt._elementwise import counters, reduce_codegen, reduction

BF16 = np.dtype(ml_dtypes.bfloat16)


def _sum(name: str, reduce_type: str | None = None) -> gpurt.ReductionKernel:
    extra = {"reduce_type": reduce_type} if reduce_type else {}
    return gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", name, **extra)


@pytest.mark.usefixtures("sm90")
def test_tagged_plans_keep_their_words_after_the_counters(monkeypatch) -> None:
    """Tagged: 4-byte partials of a one-level column fold, as 64-bit words after the
    counters (8-byte aligned), the ticket taken before the walk; not for 8-byte partials,
    tree folds or row walks."""
    monkeypatch.setattr(reduction, "COLUMN_TAGGED", True)
    r = _sum("sum_tagged_plan")
    plan = r._plan([fake_array((4099, 8191), BF16)], [None], 0, False)
    blocks, splits = plan.grid[0], plan.splits
    assert splits > 1 and plan.fold and plan.words_at == blocks + blocks % 2
    assert plan.counts == plan.words_at + 2 * splits * 8191
    source = plan.kernel.module.source.split('extern "C"')[1]
    assert "unsigned long long* _partial" in source
    assert source.index("_gpurt_ticket_inc(") < source.index("_gpurt_put_tagged(")
    monkeypatch.setattr(reduce_codegen, "TAGGED_TICKET", "late")
    late = _sum("sum_tagged_late")._plan([fake_array((4099, 8191), BF16)], [None], 0, False)
    late_source = late.kernel.module.source.split('extern "C"')[1]
    assert late_source.index("_gpurt_put_tagged(") < late_source.index("_gpurt_ticket_inc(")
    monkeypatch.setattr(reduce_codegen, "TAGGED_TICKET", "early")
    assert "_gpurt_poll(" in source and "_gpurt_ticket_acq_rel" not in source
    assert "__nanosleep" not in source
    wide = r._plan([fake_array((4099, 8191), np.float64)], [None], 0, False)
    tall = r._plan([fake_array((65536, 1023), BF16)], [None], 0, False)  # a tree fold
    rows = r._plan([fake_array((4, 1 << 20))], [None], 1, False)
    assert wide.fold and tall.fold and rows.fold and tall.counts > tall.grid[0]
    assert not (wide.words_at or tall.words_at or rows.words_at)
    monkeypatch.setattr(reduction, "COLUMN_TAGGED", False)
    plain = _sum("sum_untagged_plan")._plan([fake_array((4099, 8191), BF16)], [None], 0, False)
    assert plain.grid == plan.grid and not plain.words_at and plain.counts == blocks


def _check(got: np.ndarray, want: np.ndarray, dtype: np.dtype, n: int) -> None:
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2**-7 if dtype.itemsize == 2
                               else 1e-4, atol=1e-5 * math.sqrt(n) * 4)


CASES = [((4099, 1024), np.float32, (slice(None), slice(None)), False),
         ((4099, 1001), BF16, (slice(None), slice(None)), False),
         ((2047, 1003), np.float16, (slice(None), slice(1, None)), True),
         ((301, 1039), np.float32, (slice(None, None, -1), slice(2, None)), False),
         ((8192, 512), BF16, (slice(None), slice(None)), False)]


@pytest.mark.gpu
@pytest.mark.parametrize("ticket, load, poll", [("early", "relaxed", "each"),
                                                ("late", "relaxed", "each"),
                                                ("early", "cg", "each"), ("late", "cg", "batch")])
@pytest.mark.parametrize("shape, dtype, index, keepdims", CASES,
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) and
                         isinstance(c[0], int) else None)
def test_tagged_sums_match_the_shipped_fold(gpu_state, monkeypatch, shape, dtype, index,
                                            keepdims, ticket, load, poll) -> None:
    """Three tagged calls (either ticket, poll load and way): the same bits each time and
    as the shipped fold (the same order of partials), against float64; outputs poisoned
    first."""
    monkeypatch.setattr(reduce_codegen, "TAGGED_TICKET", ticket)
    monkeypatch.setattr(reduce_codegen, "TAGGED_LOAD", load)
    monkeypatch.setattr(reduce_codegen, "TAGGED_POLL", poll)
    dtype = np.dtype(dtype)
    rng = np.random.default_rng()
    x = rng.standard_normal(shape).astype(dtype)
    want = x.astype(np.float64)[index].sum(0, keepdims=keepdims)
    dev = gpurt.asarray(x)[index]
    fill = np.full(want.shape, np.nan, dtype)
    monkeypatch.setattr(reduction, "COLUMN_TAGGED", True)
    r = _sum(f"sum_tagged_{ticket}_{load}_{poll}_{dtype.name}")
    got = [r(dev, gpurt.asarray(fill), axis=0, keepdims=keepdims).numpy() for _ in range(3)]
    plan = list(r._plans.values())[-1]
    assert plan.splits > 1 and plan.words_at, plan.grid
    monkeypatch.setattr(reduction, "COLUMN_TAGGED", False)
    plain = _sum(f"sum_plain_{dtype.name}")(dev, axis=0, keepdims=keepdims).numpy()
    _check(got[0], want, dtype, shape[0])
    assert all(np.array_equal(g.view(np.uint8), plain.view(np.uint8)) for g in got)


@pytest.mark.gpu
def test_tagged_maxima_and_dots(gpu_state, monkeypatch) -> None:
    """An int32 maximum and a two-input float32 dot, tagged; 8-byte partials (a float64
    sum) take the shipped fold beside them."""
    monkeypatch.setattr(reduction, "COLUMN_TAGGED", True)
    rng = np.random.default_rng()
    most = gpurt.ReductionKernel("T x", "int32 y", "x", "max(a, b)", "y = a", "-2147483647",
                                 "max_tagged", reduce_type="int32")
    ints = rng.integers(-1000, 1000, (3001, 515)).astype(np.int32)
    got = most(gpurt.asarray(ints)[:, 1:], axis=0).numpy()
    np.testing.assert_array_equal(got, ints[:, 1:].max(0))
    assert list(most._plans.values())[-1].words_at
    dot = gpurt.ReductionKernel("T x, T w", "float32 y", "x * w", "a + b", "y = a", "0",
                                "dot_tagged", reduce_type="float32")
    x, w = (rng.standard_normal((4099, 1001)).astype(np.float32) for _ in range(2))
    _check(dot(gpurt.asarray(x), gpurt.asarray(w), axis=0).numpy(),
           (x.astype(np.float64) * w).sum(0), np.dtype(np.float32), 4099)
    wide = _sum("sum_tagged_f64", "float64")
    y = rng.standard_normal((4099, 1001))
    np.testing.assert_allclose(wide(gpurt.asarray(y), axis=0).numpy(), y.sum(0), rtol=1e-10)
    assert not list(wide._plans.values())[-1].words_at


@pytest.mark.gpu
def test_tagged_sums_on_two_streams(gpu_state, monkeypatch) -> None:
    """Tagged sums back to back on two streams, nothing waiting between the calls: each
    stream's kept words and counters are zeroed again by every fold."""
    monkeypatch.setattr(reduction, "COLUMN_TAGGED", True)
    rng = np.random.default_rng()
    r = _sum("sum_tagged_streams")
    xs = [rng.standard_normal((4099, 1001)).astype(np.float32) for _ in range(3)]
    arrays = [gpurt.asarray(x) for x in xs]
    streams = [gpurt.Stream(), gpurt.Stream()]
    for s in streams:
        s.wait_stream(gpurt.current_stream())
    outs = []
    for i in range(8):
        with gpurt.stream(streams[i % 2]):
            outs.append(r(arrays[i % 3], axis=0))
    for s in streams:
        gpurt.current_stream().wait_stream(s)
    gpurt.synchronize()
    for i, out in enumerate(outs):
        _check(out.numpy(), xs[i % 3].astype(np.float64).sum(0), np.dtype(np.float32), 4099)
    for s in streams:
        key = counters._kept.key(0, gpurt.streams.as_stream_handle(s))
        kept = counters._kept.get(key)
        assert kept is not None and not kept.numpy().any()  # every word and counter at 0


@pytest.mark.gpu
def test_tagged_sums_in_graph_replays(gpu_state, monkeypatch) -> None:
    """Tagged column sums captured in a CUDA graph (their own zeroed words and counters),
    replayed three times over new data."""
    monkeypatch.setattr(reduction, "COLUMN_TAGGED", True)
    rng = np.random.default_rng()
    r = _sum("sum_tagged_graph")
    x = gpurt.asarray(rng.standard_normal((4099, 1001)).astype(np.float32))
    full = gpurt.asarray(rng.standard_normal((4099, 1003)).astype(BF16))
    odd = full[:, 1:]  # realigned rows
    r(x, axis=0), r(odd, axis=0)
    assert all(p.words_at for p in r._plans.values())
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        col = r(x, axis=0)
        col_odd = r(odd, axis=0)
    for _ in range(3):
        xs = rng.standard_normal((4099, 1001)).astype(np.float32)
        fs = rng.standard_normal((4099, 1003)).astype(BF16)
        x.copy_(xs)
        full.copy_(fs)
        g.replay()
        gpurt.synchronize()
        _check(col.numpy(), xs.astype(np.float64).sum(0), np.dtype(np.float32), 4099)
        _check(col_odd.numpy(), fs[:, 1:].astype(np.float64).sum(0), BF16, 4099)
