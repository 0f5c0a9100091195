"""Tests for softmax_pipe (kernels/softmax_pipe.cu): a thread-block cluster per row, each
cluster walking rows with two stages in shared memory (Variant.pipe), and the rule that
puts it in place of ticket chunks (kernels/_softmax_pipe.py). The plan's arithmetic and the
kernels' compilation on the CPU; on the GPU, forced variants against float64 numpy with
poisoned outputs (every dtype and op; rows of 1 to 11009 at offsets 0, 1, 3 in grids of 1, 3
and as many clusters as fit; the long-row candidates timed by benchmarks/softmax_edges_dev.py
--set softpipe; non-finite values; a captured graph), and the chooser's path with a rule
set. Helpers and the error measure are test_softmax's, ``check`` test_softmax_ends'."""

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
)
from test_softmax_ends import check

sm = importlib.import_module("gpurt.kernels.softmax")
plan = importlib.import_module("gpurt.kernels._softmax_plan")
pipes = importlib.import_module("gpurt.kernels._softmax_pipe")
V = plan.Variant


def pipe(dtype: np.dtype, op: int, items: int, threads: int, cluster: int, blocks: int = 1,
         mode: int = 1, edges: bool = True) -> plan.Variant:
    """A softmax_pipe variant (16-bit forward in one pass)."""
    code = plan.dtype_code(dtype)
    return V("cluster", code, op, 16 // dtype.itemsize, items, threads, threads, cluster,
             blocks, items, edges, code != 0 and op < plan.SOFTMAX_BACKWARD, pipe=mode)


# The candidates timed by softmax_edges_dev.py --set softpipe, one of each kernel shape:
# (dtype, op) -> (items, threads, cluster, CTAs per SM, mode)
PIPE_LONG = {
    (BF16, plan.SOFTMAX): [(4, 1024, 8, 1, 1), (4, 1024, 8, 1, 2), (8, 512, 8, 1, 1),
                           (4, 512, 16, 2, 1), (4, 1024, 16, 1, 1), (4, 1024, 16, 1, 2)],
    (F16, plan.SOFTMAX): [(4, 1024, 8, 1, 1)],
    (F32, plan.SOFTMAX): [(4, 1024, 16, 1, 1), (4, 1024, 16, 1, 2)],
    (BF16, plan.SOFTMAX_BACKWARD): [(2, 1024, 16, 1, 1)],
}


def pipe_variants(long: bool = False) -> list[plan.Variant]:
    """Small forced variants for every dtype and op (512 threads x 4 vectors in clusters of
    2, mode 1; 128 threads x 2 vectors, four CTAs per SM, in non-portable clusters of 16,
    mode 2), or (``long``) PIPE_LONG's."""
    if long:
        return [pipe(dtype, op, *shape) for (dtype, op), shapes in PIPE_LONG.items()
                for shape in shapes]
    return [v for dtype in DTYPES for op in OPS.values()
            for v in (pipe(dtype, op, 4, 512, 2), pipe(dtype, op, 2, 128, 16, 4, 2))]


# ---- the plan (CPU) ----------------------------------------------------------------------------


def test_pipe_variant_fields_names_and_sizes():
    v = pipe(BF16, plan.SOFTMAX, 4, 1024, 8)
    assert v.names() == ("softmax_pipe<2, 0, 8, 4, 1024, 8, 1, 1, 1, 0>",)
    assert dataclasses.replace(v, pipe=2).names()[0].endswith(", 1>")
    assert v.capacity == 8 * 1024 * 4 * 8 >= 200_003
    assert v.shared_mem == 2 * 4 * 1024 * 16  # two stages, every vector in shared memory
    back = pipe(F32, plan.SOFTMAX_BACKWARD, 2, 128, 16, 4, 2)
    assert back.names() == ("softmax_pipe<0, 2, 4, 2, 128, 16, 4, 1, 0, 1>",)
    assert back.shared_mem == 2 * 2 * 2 * 128 * 16 and back.non_portable
    for bad in (dict(pipe=3), dict(pipe=1, smem_items=2), dict(pipe=1, kind="ticket",
                                                                  cluster=1),
                dict(pipe=1, vec=2)):
        with pytest.raises(ValueError):
            V(**{**dict(kind="cluster", dtype=0, op=0, vec=4, items=4, group=512, threads=512,
                        cluster=2, smem_items=4), **bad})


def test_pipe_stands_in_for_ticket_chunks_where_a_rule_says(monkeypatch):
    ticket = plan.choose_variant(200_003, BF16, plan.SOFTMAX, rows=64)
    assert ticket.kind == "ticket"
    monkeypatch.setattr(pipes, "PIPE_SHAPES", {})
    assert pipes.pipe_variant(ticket, 64, 200_003, 264) is None
    rule = {(plan.SOFTMAX, 2): (pipes.PipeShape(1024, 4, waves=1.0),)}
    monkeypatch.setattr(pipes, "PIPE_SHAPES", rule)
    got = pipes.pipe_variant(ticket, 64, 200_003, 264)  # 256 chunks: one wave
    assert got == pipe(BF16, plan.SOFTMAX, 4, 1024, 8)
    assert pipes.pipe_variant(ticket, 300, 200_003, 264) is None  # more than one wave
    assert pipes.pipe_variant(ticket, 64, 1_000_003, 10**6) is None  # no cluster holds it
    assert pipes.pipe_variant(ticket, 64, 500_009, 10**6).cluster == 16
    small = plan.choose_variant(200_003, F32, plan.SOFTMAX, rows=64)
    assert pipes.pipe_variant(small, 64, 200_003, 10**6) is None  # no rule for float32


def test_pipe_variants_compile_for_sm_90_without_local_memory():
    names = sorted({n for v in pipe_variants() + pipe_variants(long=True) for n in v.names()})
    module = gpurt.compile(sm.source(), options=("--ptxas-options=-v",),
                           name_expressions=names, arch="sm_90", program_name="softmax.cu")
    assert set(names) <= set(module.lowered_names)
    frames = [line for line in module.log.splitlines() if "bytes stack frame" in line]
    assert frames and all(line.split(".", 1)[-1].split()[0] == "0" for line in frames), frames


# ---- on the GPU --------------------------------------------------------------------------------


def _hopper() -> None:
    if gpurt.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters are sm_90's")


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_pipe_rows_against_float64(dtype, op_name, gpu_state, monkeypatch):
    """Small forced variants: 37 rows of 1 to 11009 elements (CTAs whose share is empty
    included) at offsets 0, 1 and 3, in grids of 1 and 3 clusters (each walking many rows,
    both stages in turn) and of as many as fit."""
    _hopper()
    op = OPS[op_name]
    rng = np.random.default_rng([op, dtype.itemsize, 3131])
    code = plan.dtype_code(dtype)
    small = [v for v in pipe_variants() if (v.dtype, v.op) == (code, op)]
    assert len(small) == 2 and all(v.names()[0].startswith("softmax_pipe<") for v in small)
    fits = sm.resident_clusters
    for cols in (1, 7, 1000, 1024, 4099, 11009):
        for offset, clusters in ((0, 1), (1, 3), (3, 0)):
            monkeypatch.setattr(sm, "resident_clusters",
                                (lambda v, i, n=clusters: n) if clusters else fits)
            for variant in small:
                check(variant, (37, cols), dtype, offset, rng)


@pytest.mark.gpu
def test_pipe_long_rows_against_float64(gpu_state, monkeypatch):
    """The timed candidates at 3 rows of 200003 (and 500009 for clusters of 16 of 1024
    threads): one cluster walking the three rows at offset 0, as many as fit at offset 3;
    forward rows with NaN, +inf, -inf and a ramp."""
    _hopper()
    rng = np.random.default_rng(300_007)
    dtypes = {plan.dtype_code(d): d for d in DTYPES}
    fits = sm.resident_clusters
    for variant in pipe_variants(long=True):
        for cols in (200_003, 500_009):
            if cols > variant.capacity:
                continue
            for offset, one in ((0, True), (3, False)):
                monkeypatch.setattr(sm, "resident_clusters", (lambda v, i: 1) if one else fits)
                check(variant, (4, cols), dtypes[variant.dtype], offset, rng, special=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_pipe_in_a_captured_graph_and_through_the_chooser(dtype, gpu_state, monkeypatch):
    """With a rule that puts softmax_pipe in place of ticket launches of up to four waves,
    softmax() of 24 rows of 200003 at an offset of 3 (ticket chunks without it) plans it,
    and two such calls captured in one graph replay right on fresh inputs (outputs
    poisoned before each replay); an eager call between replays too."""
    _hopper()
    rng = np.random.default_rng([dtype.itemsize, 5353])
    shape = (24, 200_003)
    assert plan.choose_variant(shape[1], dtype, plan.SOFTMAX, rows=shape[0]).kind == "ticket"
    rule = {(plan.SOFTMAX, dtype.itemsize): (pipes.PipeShape(1024, 4, waves=4.0),)}
    monkeypatch.setattr(pipes, "PIPE_SHAPES", rule)
    sm.clear_plans()
    planned = []
    real = sm.plan_variant
    monkeypatch.setattr(sm, "plan_variant", lambda v, *a: planned.append(v) or real(v, *a))
    x = offset_view(inputs(plan.SOFTMAX, shape, dtype, rng, 1.0)[0], 3)
    outs = [offset_view(np.full(shape, 12345, dtype), 3) for _ in range(2)]
    try:
        for out in outs:
            softmax_out = sm.softmax(x, out=out)  # planned before the capture
            assert softmax_out is out
        assert planned and all(v.pipe == 1 and v.kind == "cluster" for v in planned), planned
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph):
            for out in outs:
                sm.softmax(x, out=out)
        for replay in range(3):
            a = inputs(plan.SOFTMAX, shape, dtype, rng, 1.0 + replay)[0]
            x.copy_(a)
            for out in outs:
                out.copy_(np.full(shape, 12345, dtype))  # poison
            graph.replay()
            ref, size = reference(plan.SOFTMAX, a.astype(np.float64), None)
            for out in outs:
                assert error(out.to_numpy(), ref, size) < TOLERANCE[dtype], replay
            assert error(sm.softmax(x).to_numpy(), ref, size) < TOLERANCE[dtype], replay
    finally:
        sm.clear_plans()
