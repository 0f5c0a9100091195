"""GPU tests of gpurt.kernels.softmax's long-row routes, apart from tests/test_softmax.py so
that a suite in several workers (a file each) is not held up by one long file: ticket chunks,
persistent chunks, one-pass 16-bit forward chunks, the tuned chunks, rows of 1M with edges,
the split, and what softmax() launches for few rows, each against float64 on fresh random
data with a poisoned output. Errors are measured as in tests/test_softmax.py."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import gpurt
from gpurt.kernels import softmax
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
    plan,
    reference,
    run_op,
    sm,
)


def ticket_variants() -> list[plan.Variant]:
    """The chooser's ticket variants for rows of 1M, and small forced ones (short rows in
    many chunks: chunk boundaries, the edges in a row's first chunk, shared-memory vectors,
    several CTAs per multiprocessor; 16-bit forward also in one pass)."""
    found = []
    for dtype in DTYPES:
        code, vec = plan.dtype_code(dtype), 16 // dtype.itemsize
        for op in OPS.values():
            found.append(plan.choose_variant(1_000_003, dtype, op))
            small = [plan.Variant("ticket", code, op, vec, 2, 128, 128, edges=True),
                     plan.Variant("ticket", code, op, vec, 4, 128, 128, min_blocks=4,
                                  smem_items=2, edges=True)]
            if code and op < plan.SOFTMAX_BACKWARD:
                small += [dataclasses.replace(v, one_pass=True) for v in small]
            found += small
    return found


def run_variant(variant: plan.Variant, arrays: list, out: gpurt.Array) -> None:
    """Launch a forced ``variant`` on ``arrays`` (x, or y and dy) into ``out``."""
    view = plan.RowsView(*out.shape)
    call = sm.plan_variant(variant, arrays, out, view, gpurt.current_device())
    call.launch(arrays[0], arrays[-1], out, None)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_ticket_chunks_against_float64(dtype, op_name, gpu_state):
    """Small forced ticket variants: rows of 1 to 11009 elements in up to 11 chunks, at
    offsets of 0, 1 and 3 elements (each row its own alignment), and 1000 rows of 4099 in
    more CTAs (3000-5000) than fit on an H100/H200 at once (tickets across waves)."""
    op = OPS[op_name]
    rng = np.random.default_rng([op, dtype.itemsize, 1717])
    code = plan.dtype_code(dtype)
    small = [v for v in ticket_variants() if (v.dtype, v.op) == (code, op) and v.threads == 128]
    assert len(small) == (4 if code and op < plan.SOFTMAX_BACKWARD else 2)
    cases = [(37, cols, offset) for cols in (1, 7, 1000, 1024, 4099, 11009) for offset in (0, 1, 3)]
    for rows, cols, offset in cases + [(1000, 4099, 1)]:
        for variant in small if rows < 1000 else [v for v in small if not v.smem_items]:
            a, b = inputs(op, (rows, cols), dtype, rng, 1.0)
            ref, size = reference(op, a.astype(np.float64),
                                  None if b is None else b.astype(np.float64))
            out = offset_view(np.full((rows, cols), 12345, dtype), offset)  # poison
            arrays = [offset_view(t, offset) for t in (a, b) if t is not None]
            run_variant(variant, arrays, out)
            err = error(out.to_numpy(), ref, size)
            assert err < TOLERANCE[dtype], (variant, rows, cols, offset, err)


def kept_counters_are_zero() -> bool:
    """Whether the current stream's kept workspace has every counter zero, as each ticket
    launch must leave them."""
    workspace = importlib.import_module("gpurt.kernels._gemm_workspace")
    space = workspace.take(gpurt.current_device(), None, 0)
    gpurt.synchronize()
    words = space.arrays[0].to_numpy().view(np.uint32)[:space.counter_room]
    return not words.any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_ticket_chunks_in_a_captured_graph(dtype, gpu_state):
    """The chooser's ticket chunks (softmax, 4 rows of 1000003 at an offset of 3 elements)
    captured twice in one graph, replayed on fresh inputs between eager calls: every output
    right (poisoned before), and the stream's counters left zero."""
    if gpurt.get_device_capability()[0] < 9:
        pytest.skip("ticket chunks are sm_90's")
    rng = np.random.default_rng([dtype.itemsize, 4242])
    shape = (4, 1_000_003)
    assert plan.choose_variant(shape[1], dtype, plan.SOFTMAX).kind == "ticket"
    x = offset_view(inputs(plan.SOFTMAX, shape, dtype, rng, 1.0)[0], 3)
    outs = [offset_view(np.full(shape, 12345, dtype), 3) for _ in range(2)]
    for out in outs:
        softmax(x, out=out)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        for out in outs:
            softmax(x, out=out)
    for replay in range(3):
        a = inputs(plan.SOFTMAX, shape, dtype, rng, 1.0 + replay)[0]
        x.copy_(a)
        for out in outs:
            out.copy_(np.full(shape, 12345, dtype))  # poison
        graph.replay()
        ref, size = reference(plan.SOFTMAX, a.astype(np.float64), None)
        for out in outs:
            assert error(out.to_numpy(), ref, size) < TOLERANCE[dtype], replay
        eager = softmax(x)
        assert error(eager.to_numpy(), ref, size) < TOLERANCE[dtype], replay
    assert kept_counters_are_zero()


def forward16_variants() -> list[plan.Variant]:
    """16-bit forward CTA shapes for long rows (s7-softbf16): one CTA of 1024 threads per SM
    (6 of 8 vectors in shared memory), two of 512 (12 of 16), and ticket chunks of the latter;
    each also with the reduction in one pass (s8-softlong16), lane groups in one pass, and
    persistent ticket chunks of 256 threads in one pass (s8-softpersist)."""
    found = []
    for dtype in (F16, BF16):
        code = plan.dtype_code(dtype)
        for op in (plan.SOFTMAX, plan.LOG_SOFTMAX):
            shapes = [plan.Variant("rows", code, op, 8, 8, 1024, 1024, 1, 1, 6, True),
                      plan.Variant("rows", code, op, 8, 16, 512, 512, 1, 2, 12, True),
                      plan.Variant("ticket", code, op, 8, 16, 512, 512, min_blocks=2,
                                   smem_items=12, edges=True)]
            found += shapes + [dataclasses.replace(v, one_pass=True) for v in shapes]
            found.append(plan.Variant("ticket", code, op, 8, 16, 256, 256, min_blocks=2,
                                      smem_items=12, edges=True, one_pass=True, persist=2))
            found.append(plan.Variant("rows", code, op, 8, 4, 32, 128, edges=True,
                                      one_pass=True))
    return found


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
def test_16bit_forward_shapes_against_float64(dtype, op_name, gpu_state):
    """Forced 16-bit forward variants at lengths where a thread holds none, some or all of
    its vectors inside the row (the maximum of packed pairs and the exps skip the rest), at
    offsets 0, 1 and 3 elements and at large magnitudes, with -inf, a row of -inf, a NaN and
    a +inf (their rows are NaN, like the reference's) and a rising ramp (one pass: the
    reference moves up at every vector); then the chooser's picks (None) at lengths from
    lane groups to rows of 131071."""
    op = OPS[op_name]
    code = plan.dtype_code(dtype)
    rng = np.random.default_rng([op, dtype.itemsize, 16])
    variants = [v for v in forward16_variants() if (v.dtype, v.op) == (code, op)]
    assert len(variants) == 8
    for variant in [*variants, None]:
        lengths: tuple[int, ...] = (1, 7, 4099, 32001, 50257, 65529, 65536)
        if variant is None:
            lengths = (7, 1000, 4099, 32001, 50257, 131071)
        elif variant.kind == "ticket":
            lengths = (50257, 65537, 200_003)
        elif variant.group < variant.threads:
            lengths = (1, 7, 100, 1000, 1024)
        check_forward16(op, dtype, rng, variant, lengths)


def check_forward16(op: int, dtype: np.dtype, rng: np.random.Generator,
                    variant: plan.Variant | None, lengths: tuple[int, ...]) -> None:
    """test_16bit_forward_shapes_against_float64's rows for ``variant`` (None: the
    chooser's pick) at each of ``lengths``."""
    for cols in lengths:
        for offset, scale in ((0, 1.0), (1, 1.0), (3, 1e3 if dtype == F16 else 1e4)):
            a, _ = inputs(op, (5, cols), dtype, rng, scale)
            a[0, cols // 3] = np.nan
            a[3, cols // 2] = np.inf
            a[4] = np.linspace(-60.0, 60.0, cols).astype(dtype)
            ref, size = reference(op, a.astype(np.float64), None)
            out = offset_view(np.full((5, cols), 12345, dtype), offset)  # poison
            if variant is None:
                run_op(op, offset_view(a, offset), None, out=out)
            else:
                run_variant(variant, [offset_view(a, offset)], out)
            err = error(out.to_numpy(), ref, size)
            assert err < TOLERANCE[dtype], (variant, cols, offset, scale, err)


def tuned_variants() -> list[plan.Variant]:
    """softmax_ticket's TUNE knobs (s15-soft1w: 1 the shared-memory vectors first, 3 also
    1 / sum once, 7 also chunks of equal length) on the 16-bit forward ticket chunks in one
    pass (512 threads x 16 vectors, 12 in shared memory) and small ones (128 x 4, 2 in
    shared memory: many chunks a row, and empty equal chunks in short rows)."""
    found = []
    for dtype in (F16, BF16):
        code = plan.dtype_code(dtype)
        for op in (plan.SOFTMAX, plan.LOG_SOFTMAX):
            for tune in (1, 3, 7):
                found += [plan.Variant("ticket", code, op, 8, items, threads, threads,
                                       min_blocks=blocks, smem_items=smem, edges=True,
                                       one_pass=True, tune=tune)
                          for items, threads, blocks, smem in ((16, 512, 2, 12), (4, 128, 4, 2))]
    return found


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
def test_tuned_ticket_chunks_against_float64(dtype, op_name, gpu_state):
    """The TUNE variants as test_16bit_forward_shapes_against_float64 checks the ticket
    chunks (the small ones at rows of 1 to 11009 elements, in up to 22 chunks)."""
    op = OPS[op_name]
    code = plan.dtype_code(dtype)
    rng = np.random.default_rng([op, dtype.itemsize, 1515])
    variants = [v for v in tuned_variants() if (v.dtype, v.op) == (code, op)]
    assert len(variants) == 6
    for variant in variants:
        lengths = (50257, 65537, 200_003) if variant.threads == 512 else (1, 7, 1000, 4099, 11009)
        check_forward16(op, dtype, rng, variant, lengths)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_ticket_rows_of_1m_with_edges(dtype, op_name, gpu_state):
    """Rows of 1M through the chooser (chunks meeting through the ticket on sm_90, else the
    split) at odd length and offset: 2 rows (the few-rows chunks) and 4 (the wide ones)."""
    op = OPS[op_name]
    rng = np.random.default_rng([op, dtype.itemsize, 1_000_003])
    picks = [plan.choose_variant(1_000_003, dtype, op, rows=rows) for rows in (2, 4)]
    assert picks[0].threads == plan.SPLIT_THREADS and not picks[0].smem_items
    assert picks[1] == plan.choose_variant(1_000_003, dtype, op)  # the wide chunks
    for rows in (2, 4):
        if gpurt.get_device_capability()[0] >= 9:
            assert plan.choose_variant(1_000_003, dtype, op, rows=rows).kind == "ticket"
        check_long_rows(op, (rows, 1_000_003), dtype, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", list(OPS))
def test_split_rows_with_edges(op_name, gpu_state):
    """Rows longer than a cluster holds in the two-launch split (before sm_90, or where a
    row's chunks do not fit the device at once) at odd length and offset."""
    op = OPS[op_name]
    rng = np.random.default_rng([op, 1_000_003])
    shape = (2, 1_000_003 if op >= plan.SOFTMAX_BACKWARD else 1_048_583)
    split = plan.choose_variant(shape[1], F32, op, tickets=False)
    assert split.kind == "split"
    check_long_rows(op, shape, F32, rng, split)


def check_long_rows(op: int, shape: tuple[int, int], dtype: np.dtype,
                    rng: np.random.Generator, variant: plan.Variant | None = None) -> None:
    """The chooser's pick (or ``variant``) at offsets 0 and 3, poisoned output."""
    for offset in (0, 3):
        a, b = inputs(op, shape, dtype, rng, 1.0)
        ref, size = reference(op, a.astype(np.float64), None if b is None else b.astype(np.float64))
        out = offset_view(np.full(shape, 12345, dtype), offset)  # poison
        args = [offset_view(a, offset), None if b is None else offset_view(b, offset)]
        if variant is None:
            run_op(op, *args, out=out)
        else:
            run_variant(variant, [t for t in args if t is not None], out)
        assert error(out.to_numpy(), ref, size) < TOLERANCE[dtype], offset


def _record_plans(monkeypatch) -> list:
    """The variants softmax() plans from now on (sm.plan_variant wrapped), in order."""
    chosen = []
    planned = sm.plan_variant

    def recording(variant, *args):
        chosen.append(variant)
        return planned(variant, *args)

    monkeypatch.setattr(sm, "plan_variant", recording)
    return chosen


@pytest.mark.gpu
def test_the_split_stands_in_where_a_rows_chunks_do_not_fit(gpu_state, monkeypatch):
    """An H100/H200 holds a row's chunks at once; where a device could not (too few SMs, a
    partition of one), the plan takes the split instead of a ticket launch that never ends."""
    ticket = plan.choose_variant(1_000_003, F32, rows=2)
    if gpurt.get_device_capability()[0] >= 9:
        assert ticket.kind == "ticket"
        assert sm.tickets_fit(ticket, ticket.chunks(1_000_003), gpurt.current_device())
        assert not sm.tickets_fit(ticket, 10**6, gpurt.current_device())
    chosen = _record_plans(monkeypatch)
    monkeypatch.setattr(sm, "tickets_fit", lambda variant, chunks, index: False)
    sm.clear_plans()
    try:
        check_long_rows(plan.SOFTMAX, (2, 1_000_003), F32, np.random.default_rng(16))
    finally:
        sm.clear_plans()
    assert chosen and all(v.kind == "split" for v in chosen), chosen


# s14-soft's chooser rules through softmax(): (shape, dtype, op) -> what _plan launches on
# an H100 / H200 (132 SMs): the few-rows chunks for rows of one CTA or a cluster, the ticket
# chunks that replace clusters of 4 (fp32 softmax) and of 8 (fp32 softmax backward), the
# half chunks of a one-wave 16-bit forward launch, the one-stage chunks of a one-wave 16-bit
# softmax backward launch
FEW_ROWS_LAUNCHES = [
    ((8, 50257), F32, "softmax", "softmax_ticket<0, 0, 4, 8, 512, 2, 0, 1>"),
    ((8, 50257), F32, "softmax_backward", "softmax_ticket<0, 2, 4, 4, 512, 2, 0, 1>"),
    ((8, 50257), BF16, "log_softmax", "softmax_ticket<2, 1, 8, 4, 512, 2, 0, 1>"),
    ((8, 50257), BF16, "log_softmax_backward", "softmax_ticket<2, 3, 8, 2, 512, 2, 0, 1>"),
    ((16, 300_001), F32, "softmax", "softmax_ticket<0, 0, 4, 32, 512, 1, 6, 1>"),
    ((10, 200_003), F32, "softmax_backward", "softmax_ticket<0, 2, 4, 16, 512, 1, 4, 1>"),
    ((16, 200_003), BF16, "softmax", "softmax_ticket<2, 0, 8, 8, 512, 2, 4, 1, 1, 7>"),
    ((64, 200_003), F16, "log_softmax", "softmax_ticket<1, 1, 8, 16, 512, 2, 12, 1, 1, 7>"),
    ((8, 1_000_003), BF16, "softmax", "softmax_ticket<2, 0, 8, 8, 512, 2, 4, 1, 1, 3>"),
    ((20, 200_003), BF16, "softmax_backward", "softmax_ticket<2, 2, 8, 16, 512, 1, 12, 1>"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype, op_name, name", FEW_ROWS_LAUNCHES,
                         ids=lambda x: getattr(x, "name", str(x)))
def test_few_rows_launches_against_float64(shape, dtype, op_name, name, gpu_state, monkeypatch):
    """What softmax() launches for these shapes (sm_90 with 132 SMs: the variant above) and
    its results at offsets 0 and 3 against float64, poisoned output."""
    chosen = _record_plans(monkeypatch)
    sm.clear_plans()
    try:
        check_long_rows(OPS[op_name], shape, dtype, np.random.default_rng([shape[1], 14]))
    finally:
        sm.clear_plans()
    props = gpurt.get_device_properties()
    if gpurt.get_device_capability()[0] >= 9 and props.multi_processor_count == 132:
        assert {v.names()[0] for v in chosen} == {name}, chosen


def test_tuned_variants_compile_for_sm_90_without_local_memory():
    """softmax_ticket's TUNE variants (tuned_variants): no stack frame (ptxas)."""
    names = sorted({n for v in tuned_variants() for n in v.names()})
    module = gpurt.compile(sm.source(), options=("--ptxas-options=-v",), name_expressions=names,
                           arch="sm_90", program_name="softmax.cu")
    assert set(names) <= set(module.lowered_names)
    frames = [line for line in module.log.splitlines() if "bytes stack frame" in line]
    assert frames and all(line.split(".", 1)[-1].split()[0] == "0" for line in frames), frames
