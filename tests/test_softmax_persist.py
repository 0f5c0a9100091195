"""GPU tests of gpurt.kernels.softmax's persistent ticket chunks (softmax_persist), apart
from tests/test_softmax_long.py so that a suite in several workers (a file each) is not held
up by one long file: small persistent variants of every dtype and op in their own and in the
smallest deadlock-free grid, and the long-row shapes the chooser takes, each against float64
on fresh random data with a poisoned output."""

from __future__ import annotations

import numpy as np
import pytest

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
    sm,
)
from test_softmax_long import check_long_rows, run_variant

# The long-row persistent shapes timed by benchmarks/softmax_edges_dev.py --set softpersist:
# (dtype, op) -> (items, threads, CTAs per SM, shared-memory items, persist)
PERSIST_LONG = {
    (BF16, plan.SOFTMAX): [(16, 256, 2, 12, 1), (16, 256, 2, 12, 2), (16, 512, 1, 12, 1),
                           (16, 512, 1, 12, 2), (8, 512, 2, 6, 2)],
    (F16, plan.SOFTMAX): [(16, 256, 2, 12, 2), (16, 512, 1, 12, 2)],
    (BF16, plan.LOG_SOFTMAX): [(16, 256, 2, 12, 2), (16, 512, 1, 12, 2)],
    (BF16, plan.SOFTMAX_BACKWARD): [(8, 512, 1, 6, 1), (8, 512, 1, 6, 2), (8, 256, 2, 6, 2)],
    (F16, plan.SOFTMAX_BACKWARD): [(8, 512, 1, 6, 1)],  # the chooser's (not run in s8)
    (F32, plan.SOFTMAX): [(16, 512, 1, 12, 1), (16, 512, 1, 12, 2), (16, 256, 2, 12, 2)],
    (F32, plan.SOFTMAX_BACKWARD): [(8, 512, 1, 6, 2), (8, 256, 2, 6, 2)],
}


def persist_variants(long: bool = False) -> list[plan.Variant]:
    """Ticket chunks in a persistent grid (softmax_persist), 16-bit forward in one pass:
    small ones (128 threads: registers only, next chunk's loads before the reduction; with
    shared memory, after it and before it) for every dtype and op, or (``long``) those of
    PERSIST_LONG."""
    found = []
    for dtype in DTYPES:
        code, vec = plan.dtype_code(dtype), 16 // dtype.itemsize
        for op in OPS.values():
            one = code != 0 and op < plan.SOFTMAX_BACKWARD
            shapes = PERSIST_LONG.get((dtype, op), []) if long else [
                (2, 128, 1, 0, 2), (4, 128, 4, 2, 1), (4, 128, 4, 2, 2)]
            found += [plan.Variant("ticket", code, op, vec, items, threads, threads,
                                   min_blocks=blocks, smem_items=smem, edges=True,
                                   one_pass=one, persist=persist)
                      for items, threads, blocks, smem, persist in shapes]
    return found


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_persist_chunks_against_float64(dtype, op_name, gpu_state, monkeypatch):
    """Small persistent ticket variants as test_ticket_chunks_against_float64 checks the
    ticket's, each in its own grid (as many CTAs as fit) and in the smallest one that cannot
    deadlock (as many CTAs as a row has chunks: each CTA walks many chunks, and its next
    chunk is often of the row it waits for)."""
    op = OPS[op_name]
    rng = np.random.default_rng([op, dtype.itemsize, 1919])
    code = plan.dtype_code(dtype)
    small = [v for v in persist_variants() if (v.dtype, v.op) == (code, op)]
    assert len(small) == 3
    assert all(v.names()[0].startswith("softmax_persist<") for v in small)
    cases = [(37, cols, offset) for cols in (1, 7, 1000, 4099, 11009) for offset in (0, 1, 3)]
    fits = sm.resident_ctas
    for rows, cols, offset in cases + [(1000, 4099, 1)]:
        for variant in small:
            for least in (False, True):
                chunks = variant.chunks(cols)
                monkeypatch.setattr(sm, "resident_ctas",
                                    (lambda v, i, n=chunks: n) if least else fits)
                a, b = inputs(op, (rows, cols), dtype, rng, 1.0)
                ref, size = reference(op, a.astype(np.float64),
                                      None if b is None else b.astype(np.float64))
                out = offset_view(np.full((rows, cols), 12345, dtype), offset)  # poison
                arrays = [offset_view(t, offset) for t in (a, b) if t is not None]
                run_variant(variant, arrays, out)
                err = error(out.to_numpy(), ref, size)
                assert err < TOLERANCE[dtype], (variant, rows, cols, offset, least, err)


@pytest.mark.gpu
def test_persist_long_rows_against_float64(gpu_state, monkeypatch):
    """The long-row persistent shapes at 3 rows of 200003 (their own grid) and 2 rows of
    1000003 (the smallest grid), offsets 0 and 3, poisoned outputs."""
    rng = np.random.default_rng(200_003)
    dtypes = {plan.dtype_code(d): d for d in DTYPES}
    for variant in persist_variants(long=True):
        dtype = dtypes[variant.dtype]
        check_long_rows(variant.op, (3, 200_003), dtype, rng, variant)
        chunks = variant.chunks(1_000_003)
        monkeypatch.setattr(sm, "resident_ctas", lambda v, i, n=chunks: n)
        check_long_rows(variant.op, (2, 1_000_003), dtype, rng, variant)
        monkeypatch.undo()
