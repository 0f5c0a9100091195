"""Tests for the lagged softmax chunks (kernels/softmax_lagged.cu): a row's chunks reduced by
one CTA each and written by another that reads them again ``lag`` tickets later, meeting
through counters in the stream's kept workspace that the kernel leaves zero. The plan on the
CPU; on the GPU every dtype and op against float64 with poisoned outputs, at odd lengths and
offsets, with more CTAs than fit at once, repeated calls and a captured graph."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import gpurt
from test_softmax import (
    BF16,
    DTYPES,
    F16,
    F32,
    OPS,
    TOLERANCE,
    error,
    inputs,
    offset_view,
    reference,
    run_variant,
)

sm = importlib.import_module("gpurt.kernels.softmax")
plan = importlib.import_module("gpurt.kernels._softmax_plan")
workspace = importlib.import_module("gpurt.kernels._gemm_workspace")
V = plan.Variant


def lagged(dtype: np.dtype, op: int, items: int, threads: int, blocks: int, lag: int = 0,
           edges: bool = True, hint: int = 2, early: bool = True) -> plan.Variant:
    return V("lagged", plan.dtype_code(dtype), op, 16 // dtype.itemsize, items, threads,
             threads, min_blocks=blocks, edges=edges, lag=lag, hint=hint, early=early)


# The shapes benchmarks/softmax_edges_dev.py --set softlag2 times: (dtype, op) -> (items,
# threads, CTAs per SM, hint, early) (the kernels; the lag is an argument).
_FORWARD = [(4, 256, 4, 2, True), (8, 256, 4, 2, True), (4, 256, 4, 2, False),
            (8, 512, 2, 2, True)]
LONG_SHAPES = {
    (BF16, plan.SOFTMAX): _FORWARD + [(4, 256, 4, 1, False)],
    (F32, plan.SOFTMAX): _FORWARD[:2],
    (F16, plan.SOFTMAX): _FORWARD[:1],
    (BF16, plan.LOG_SOFTMAX): _FORWARD[:1],
    (BF16, plan.SOFTMAX_BACKWARD): _FORWARD[:1],
    (F32, plan.SOFTMAX_BACKWARD): _FORWARD[:1],
    (BF16, plan.LOG_SOFTMAX_BACKWARD): _FORWARD[:1],
}


def lagged_variants(long: bool = False) -> list[plan.Variant]:
    """Small lagged variants (128 threads, 2 vectors; lag 0, 1 and 3 per multiprocessor;
    each hint, early or not) for every dtype and op, or (``long``) LONG_SHAPES."""
    if long:
        return [lagged(dtype, op, *shape[:3], lag=2, hint=shape[3], early=shape[4])
                for (dtype, op), shapes in LONG_SHAPES.items() for shape in shapes]
    return [v for dtype in DTYPES for op in OPS.values()
            for v in (lagged(dtype, op, 2, 128, 4, hint=0, early=False),
                      lagged(dtype, op, 2, 128, 4, lag=3),
                      lagged(dtype, op, 2, 128, 4, lag=1, hint=1, early=False))]


# ---- the plan (CPU) ------------------------------------------------------------------------------


def test_lagged_variant_names_lag_and_checks():
    v = lagged(BF16, plan.SOFTMAX, 4, 256, 4, lag=2)
    assert v.names() == ("softmax_lagged<2, 0, 8, 4, 256, 4, 1, 2, 1>",)
    assert dataclasses.replace(v, hint=1, early=False, edges=False).names() == (
        "softmax_lagged<2, 0, 8, 4, 256, 4, 0, 1, 0>",)
    assert v.chunks(1_000_003) == 123 and v.shared_mem == 0
    # a row's chunks, then 2 per multiprocessor more, at most the launch's other chunks
    assert v.lag_tickets(64, 1_000_003, 132) == 123 + 264
    assert v.lag_tickets(1, 1_000_003, 132) == 123
    assert v.lag_tickets(2, 1_000_003, 132) == 246
    assert v.grid(64, 1_000_003) == 64 * 123  # the reducing CTAs (the lag's are added)
    for bad in (dict(smem_items=2), dict(one_pass=True), dict(lag=-1), dict(min_blocks=16),
                dict(hint=3), dict(kind="ticket", lag=1), dict(kind="rows", hint=1),
                dict(kind="ticket", early=True)):
        with pytest.raises(ValueError):
            V(**{**dict(kind="lagged", dtype=2, op=0, vec=8, items=4, group=256, threads=256,
                        min_blocks=4, edges=True), **bad})


def test_lagged_variants_compile_for_sm_90_without_local_memory():
    variants = [v for v in lagged_variants(long=True) if v.threads * v.items <= 1024]
    names = sorted({n for v in variants for n in v.names()})
    module = gpurt.compile(sm.source(), options=("--ptxas-options=-v",), name_expressions=names,
                           arch="sm_90", program_name="softmax.cu")
    assert set(names) <= set(module.lowered_names)


# ---- on the GPU ----------------------------------------------------------------------------------


def check(variant: plan.Variant, op: int, shape: tuple[int, int], dtype: np.dtype,
          rng: np.random.Generator, offset: int = 0, scale: float = 1.0) -> None:
    a, b = inputs(op, shape, dtype, rng, scale)
    ref, size = reference(op, a.astype(np.float64), None if b is None else b.astype(np.float64))
    out = offset_view(np.full(shape, 12345, dtype), offset)  # poison: every element written
    arrays = [offset_view(t, offset) for t in (a, b) if t is not None]
    run_variant(variant, arrays, out)
    err = error(out.to_numpy(), ref, size)
    assert err < TOLERANCE[dtype], (variant, shape, offset, scale, err)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_lagged_chunks_against_float64(dtype, op_name, gpu_state):
    """Small lagged variants: rows of 1 to 11009 elements in up to 11 chunks at offsets of 0,
    1 and 3 elements (each row its own alignment), and 1000 rows of 4099 (5000-6000 CTAs,
    more than fit at once); each call leaves the workspace's counters zero for the next."""
    op = OPS[op_name]
    rng = np.random.default_rng([op, dtype.itemsize, 2121])
    code = plan.dtype_code(dtype)
    small = [v for v in lagged_variants() if (v.dtype, v.op) == (code, op)]
    assert len(small) == 3
    cases = [(37, cols, offset) for cols in (1, 7, 1000, 1024, 4099, 11009) for offset in (0, 1, 3)]
    for rows, cols, offset in cases + [(1, 11009, 3), (2, 4099, 0)]:
        for variant in small:
            check(variant, op, (rows, cols), dtype, rng, offset)
    check(small[1], op, (1000, 4099), dtype, rng, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
def test_lagged_16bit_forward_edge_values(dtype, gpu_state):
    """16-bit forward (one pass) with NaN, +inf, -inf, a row of -inf and a rising ramp, at
    large magnitudes, offsets 0 and 3, softmax and log_softmax."""
    rng = np.random.default_rng([dtype.itemsize, 16, 2121])
    for op in (plan.SOFTMAX, plan.LOG_SOFTMAX):
        variant = lagged(dtype, op, 2, 128, 4, lag=1)
        for cols, offset, scale in ((4099, 0, 1.0), (11009, 3, 1e3 if dtype == F16 else 1e4)):
            a, _ = inputs(op, (5, cols), dtype, rng, scale)
            a[0, cols // 3] = np.nan
            a[3, cols // 2] = np.inf
            a[4] = np.linspace(-60.0, 60.0, cols).astype(dtype)
            ref, size = reference(op, a.astype(np.float64), None)
            out = offset_view(np.full((5, cols), 12345, dtype), offset)
            run_variant(variant, [offset_view(a, offset)], out)
            assert error(out.to_numpy(), ref, size) < TOLERANCE[dtype], (op, cols, offset)


@pytest.mark.gpu
def test_lagged_long_rows_against_float64(gpu_state):
    """The timed shapes (LONG_SHAPES) at 3 rows of 200003 and 2 rows of 1000003, offsets 0
    and 3, every dtype and op; in place (out is x) for forward."""
    rng = np.random.default_rng(2_000_003)
    dtypes = {plan.dtype_code(d): d for d in DTYPES}
    for variant in lagged_variants(long=True):
        dtype = dtypes[variant.dtype]
        check(variant, variant.op, (3, 200_003), dtype, rng, 0)
        check(variant, variant.op, (2, 1_000_003), dtype, rng, 3)
    for dtype in (F32, BF16):  # in place
        variant = lagged(dtype, plan.SOFTMAX, 4, 256, 4, lag=2)
        a, _ = inputs(plan.SOFTMAX, (5, 200_003), dtype, rng, 1.0)
        ref, size = reference(plan.SOFTMAX, a.astype(np.float64), None)
        x = offset_view(a, 1)
        run_variant(variant, [x], x)
        assert error(x.to_numpy(), ref, size) < TOLERANCE[dtype]


@pytest.mark.gpu
def test_lagged_calls_in_a_captured_graph(gpu_state):
    """Two lagged calls captured on one stream share the capture's workspace (its counters
    zeroed once, left zero by each kernel): every replay is right on fresh inputs, and the
    stream's own workspace serves eager calls before and after."""
    rng = np.random.default_rng(77)
    variant = lagged(BF16, plan.SOFTMAX, 2, 128, 4, lag=1)
    backward = lagged(BF16, plan.SOFTMAX_BACKWARD, 2, 128, 4, lag=1)
    shape = (9, 11009)
    x = gpurt.asarray(np.zeros(shape, BF16))
    y, dy = gpurt.asarray(np.zeros(shape, BF16)), gpurt.asarray(np.zeros(shape, BF16))
    out, grad = gpurt.empty(shape, BF16), gpurt.empty(shape, BF16)
    calls = [(variant, [x], out), (backward, [y, dy], grad)]
    planned = [sm.plan_variant(v, arrays, o, plan.RowsView(*shape), gpurt.current_device())
               for v, arrays, o in calls]
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        for call, (_, arrays, o) in zip(planned, calls):
            call.launch(arrays[0], arrays[-1], o, None)
    for _ in range(3):
        a, _ = inputs(plan.SOFTMAX, shape, BF16, rng, 1.0)
        yb, db = inputs(plan.SOFTMAX_BACKWARD, shape, BF16, rng, 1.0)
        x.copy_(gpurt.asarray(a))
        y.copy_(gpurt.asarray(yb))
        dy.copy_(gpurt.asarray(db))
        out.copy_(gpurt.asarray(np.full(shape, 12345, BF16)))
        grad.copy_(gpurt.asarray(np.full(shape, 12345, BF16)))
        graph.replay()
        gpurt.synchronize()
        ref, size = reference(plan.SOFTMAX, a.astype(np.float64), None)
        assert error(out.to_numpy(), ref, size) < TOLERANCE[BF16]
        ref, size = reference(plan.SOFTMAX_BACKWARD, yb.astype(np.float64),
                              db.astype(np.float64))
        assert error(grad.to_numpy(), ref, size) < TOLERANCE[BF16]
        check(variant, plan.SOFTMAX, shape, BF16, rng)  # eager, between replays
    del graph


@pytest.mark.gpu
def test_lagged_calls_on_two_streams(gpu_state):
    """Calls on two streams, each with its own kept workspace, alternating."""
    rng = np.random.default_rng(78)
    variant = lagged(F32, plan.SOFTMAX, 2, 128, 4, lag=1)
    side = gpurt.Stream()
    for stream in (None, side, None, side):
        a, _ = inputs(plan.SOFTMAX, (37, 4099), F32, rng, 1.0)
        ref, size = reference(plan.SOFTMAX, a.astype(np.float64), None)
        x, out = gpurt.asarray(a), gpurt.asarray(np.full(a.shape, 12345, F32))
        gpurt.synchronize()
        call = sm.plan_variant(variant, [x], out, plan.RowsView(*a.shape),
                               gpurt.current_device())
        call.launch(x, x, out, stream)
        gpurt.synchronize()
        assert error(out.to_numpy(), ref, size) < TOLERANCE[F32]
