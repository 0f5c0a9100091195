"""Tests for softmax_ends (kernels/softmax_ends.cu): ticket chunks whose rows at the launch's
two ends are cut into smaller chunks (Variant.ends). The plan's arithmetic and the kernels'
compilation on the CPU; on the GPU, forced variants against float64 numpy with poisoned
outputs (every dtype and op; short rows in many chunks at offsets 0, 1, 3; the long-row
candidates timed by benchmarks/softmax_edges_dev.py --set softends; non-finite values;
a captured graph), each head / middle / tail split of the rows, and the stream's counters
left zero. Helpers and the error measure are test_softmax's."""

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
from test_softmax_long import kept_counters_are_zero, run_variant

sm = importlib.import_module("gpurt.kernels.softmax")
plan = importlib.import_module("gpurt.kernels._softmax_plan")


def ends_variants(long: bool = False) -> list[plan.Variant]:
    """Small forced softmax_ends variants for every dtype and op (128 threads, 4 vectors a
    thread: registers only, and 2 in shared memory four CTAs per SM; split 2 and 4; 16-bit
    forward in one pass, the second tuned), or (``long``) the chooser's ticket chunks of
    forward rows of 1000003 with splits 2, 4 and 8 (the route set's candidates)."""
    found = []
    for dtype in DTYPES:
        code, vec = plan.dtype_code(dtype), 16 // dtype.itemsize
        for op in OPS.values():
            one = code != 0 and op < plan.SOFTMAX_BACKWARD
            if long and op < plan.SOFTMAX_BACKWARD:
                pick = dataclasses.replace(plan.choose_variant(1_000_003, dtype, op), persist=0)
                found += [dataclasses.replace(pick, ends=e) for e in (2, 4, 8)
                          if pick.items % e == 0]
            if long:
                continue
            found += [plan.Variant("ticket", code, op, vec, 4, 128, 128, edges=True,
                                   one_pass=one, ends=2),
                      plan.Variant("ticket", code, op, vec, 4, 128, 128, min_blocks=4,
                                   smem_items=2, edges=True, one_pass=one, ends=4,
                                   tune=3 if one else 0)]  # 16-bit forward: tuned, as chosen
    return found


# ---- the plan (CPU) ----------------------------------------------------------------------------


def test_ends_variant_fields_names_and_sizes():
    ticket = plan.Variant("ticket", 2, 0, 8, 16, 512, 512, min_blocks=2, smem_items=12,
                          edges=True, one_pass=True)
    ends = dataclasses.replace(ticket, ends=2)
    assert ends.names() == ("softmax_ends<2, 0, 8, 16, 512, 2, 12, 1, 1, 2>",)
    assert ticket.chunks(1_000_003) == ends.chunks(1_000_003) == 16
    assert ends.most_chunks(1_000_003) == 31 and ticket.most_chunks(1_000_003) == 16
    assert dataclasses.replace(ticket, ends=8).most_chunks(1_000_003) == 123
    assert ends.workspace(64, 1_000_003) == (2 * 64 * 31, 65)
    # 264 CTAs at once: the first 9 rows fill them in chunks of half size (31 a row)
    assert ends.ends_rows(64, 1_000_003, 264) == (9, 9)
    assert ends.ends_grid(64, 1_000_003, 9, 9) == 46 * 16 + 18 * 31
    assert dataclasses.replace(ends, ends_head=50, ends_tail=0).ends_rows(64, 1_000_003,
                                                                          264) == (5, 0)
    assert ends.ends_rows(8, 1_000_003, 264) == (8, 0)  # every row small, none twice
    assert ends.ends_rows(12, 1_000_003, 264) == (9, 3)
    for bad in (dict(ends=3), dict(ends=16), dict(ends=2, persist=1), dict(ends=8, items=4),
                dict(kind="split", ends=2), dict(ends=2, ends_head=-1)):
        with pytest.raises(ValueError):
            plan.Variant(**{**dict(kind="ticket", dtype=0, op=0, vec=4, items=4, group=512,
                                   threads=512), **bad})


def test_ends_variants_compile_for_sm_90_without_local_memory():
    """The 16-bit candidates and the small test variants: no stack frame (ptxas)."""
    variants = [v for v in ends_variants() + ends_variants(long=True) if v.dtype]
    names = sorted({n for v in variants for n in v.names()})
    module = gpurt.compile(sm.source(), options=("--ptxas-options=-v",),
                           name_expressions=names, arch="sm_90", program_name="softmax.cu")
    assert set(names) <= set(module.lowered_names)
    frames = [line for line in module.log.splitlines() if "bytes stack frame" in line]
    assert frames and all(line.split(".", 1)[-1].split()[0] == "0" for line in frames), frames


# ---- on the GPU --------------------------------------------------------------------------------


def check(variant: plan.Variant, shape: tuple[int, int], dtype: np.dtype, offset: int,
          rng: np.random.Generator, special: bool = False) -> None:
    """``variant`` on fresh inputs of ``shape`` at ``offset`` elements, poisoned output;
    ``special``: forward rows with a NaN and a +inf too."""
    op = variant.op
    a, b = inputs(op, shape, dtype, rng, 1.0)
    if special and op < plan.SOFTMAX_BACKWARD and shape[0] > 3:
        a[1, shape[1] // 3] = np.nan
        a[2, shape[1] - 1] = np.inf
        a[3] = np.arange(shape[1]) % 50  # a ramp: the maximum at many places
    ref, size = reference(op, a.astype(np.float64), None if b is None else b.astype(np.float64))
    out = offset_view(np.full(shape, 12345, dtype), offset)  # poison
    arrays = [offset_view(t, offset) for t in (a, b) if t is not None]
    run_variant(variant, arrays, out)
    err = error(out.to_numpy(), ref, size)
    assert err < TOLERANCE[dtype], (variant, shape, offset, err)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_ends_chunks_against_float64(dtype, op_name, gpu_state, monkeypatch):
    """Small forced variants: 37 rows of 1 to 11009 elements at offsets 0, 1 and 3 with 0,
    1, 3 and all rows at each end (the residency the plan sees replaced), and 1000 rows of
    4099 with the device's own residency (more CTAs than fit at once)."""
    if gpurt.get_device_capability()[0] < 9:
        pytest.skip("ticket chunks are sm_90's")
    op = OPS[op_name]
    rng = np.random.default_rng([op, dtype.itemsize, 2121])
    code = plan.dtype_code(dtype)
    small = [v for v in ends_variants() if (v.dtype, v.op) == (code, op)]
    assert len(small) == 2 and all(v.names()[0].startswith("softmax_ends<") for v in small)
    fits = sm.resident_ctas
    for cols in (1, 7, 1000, 1024, 4099, 11009):
        for offset, ends in ((0, 1), (1, 3), (3, 0), (1, 37)):
            for variant in small:
                # the rows whose small chunks fill `ends` * small CTAs: `ends` rows at each end
                n = ends * variant.most_chunks(cols)
                monkeypatch.setattr(sm, "resident_ctas", lambda v, i, n=n: n)
                head, tail = variant.ends_rows(37, cols, n)
                assert (head, tail) == (min(37, ends), min(37 - min(37, ends), ends))
                check(variant, (37, cols), dtype, offset, rng)
    monkeypatch.setattr(sm, "resident_ctas", fits)
    for variant in small:
        check(variant, (1000, 4099), dtype, 1, rng)
    assert kept_counters_are_zero()


@pytest.mark.gpu
def test_ends_long_rows_against_float64(gpu_state, monkeypatch):
    """The timed candidates (the chooser's chunks of forward rows of 1000003, split 2, 4, 8)
    at 4 rows
    of 200003 and of 1000003, offsets 0 and 3: one row at each end (two in full chunks
    between) and every row small; forward rows with NaN, +inf, -inf and a ramp."""
    if gpurt.get_device_capability()[0] < 9:
        pytest.skip("ticket chunks are sm_90's")
    rng = np.random.default_rng(200_003)
    dtypes = {plan.dtype_code(d): d for d in DTYPES}
    fits = sm.resident_ctas
    for variant in ends_variants(long=True):
        for cols in (200_003, 1_000_003):
            for offset, one_each in ((0, True), (3, False)):
                n = variant.most_chunks(cols)
                monkeypatch.setattr(sm, "resident_ctas",
                                    (lambda v, i, n=n: n) if one_each else fits)
                check(variant, (4, cols), dtypes[variant.dtype], offset, rng, special=True)
    assert kept_counters_are_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: d.name)
def test_ends_chunks_in_a_captured_graph(dtype, gpu_state):
    """A split-2 variant of the chooser's chunks (softmax, 6 rows of 1000003 at an offset
    of 3) launched twice in one captured graph, replayed on fresh inputs: outputs right
    (poisoned before each replay), the stream's counters left zero."""
    if gpurt.get_device_capability()[0] < 9:
        pytest.skip("ticket chunks are sm_90's")
    rng = np.random.default_rng([dtype.itemsize, 4343])
    shape = (6, 1_000_003)
    pick = plan.choose_variant(shape[1], dtype, plan.SOFTMAX)
    variant = dataclasses.replace(pick, persist=0, ends=2, ends_head=20, ends_tail=20)
    x = offset_view(inputs(plan.SOFTMAX, shape, dtype, rng, 1.0)[0], 3)
    outs = [offset_view(np.full(shape, 12345, dtype), 3) for _ in range(2)]
    view = plan.RowsView(*shape)
    calls = [sm.plan_variant(variant, [x], out, view, gpurt.current_device()) for out in outs]
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        for call, out in zip(calls, outs):
            call.launch(x, x, out, None)
    for replay in range(3):
        a = inputs(plan.SOFTMAX, shape, dtype, rng, 1.0 + replay)[0]
        x.copy_(a)
        for out in outs:
            out.copy_(np.full(shape, 12345, dtype))  # poison
        graph.replay()
        ref, size = reference(plan.SOFTMAX, a.astype(np.float64), None)
        for out in outs:
            assert error(out.to_numpy(), ref, size) < TOLERANCE[dtype], replay
    assert kept_counters_are_zero()
