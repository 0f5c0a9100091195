"""Cases for gpurt.random's fills and ReductionKernel sums, shared by
tests/test_bandwidth_cases.py and scripts/sanitize_sweep.py: outputs and inputs are views
stored like users' (any element offset, padded rows, column-major) in buffers that end at the
view's last element (tests/_kernel_cases.stored), so a write or read past the view is one past
the allocation; each result is checked (fills bit for bit against tests/_philox.py, sums
against float64) and nothing outside an output view may change."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import _philox
import gpurt
from _kernel_cases import stored
from gpurt import random as grandom

FILL_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": gpurt.bfloat16,
               "int32": np.int32, "int64": np.int64, "int8": np.int8, "bool": np.bool_}
# (fill, dtype) pairs: every kernel template and store width
FILLS = [("uniform", "float32"), ("uniform", "bfloat16"), ("normal", "float32"),
         ("normal", "float16"), ("randint", "int32"), ("randint", "int64"),
         ("randint_wide", "int64"), ("randint", "int8"), ("bernoulli", "bool"),
         ("bernoulli", "float32"), ("dropout", "float32"), ("dropout", "bfloat16")]
SUM = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "cases_sum")


@dataclasses.dataclass(frozen=True)
class FillCase:
    fill: str  # a FILLS name
    dtype: str  # a FILL_DTYPES key
    rows: int
    cols: int
    col_major: bool = False
    offset: int = 0  # elements into the buffer
    pad: int = 0  # leading dimension above the minimum


def _stored_values(rng: np.random.Generator, case: FillCase, dtype: Any) -> Any:
    """A stored (rows x cols) view of ``dtype`` with random contents (bool: random bits)."""
    if np.dtype(dtype).kind in "fV":
        return stored(rng, case.rows, case.cols, dtype, case.col_major, case.offset, case.pad)
    out = stored(rng, case.rows, case.cols, np.float32, case.col_major, case.offset, case.pad)
    host = rng.integers(0, 2, out.host.size).astype(dtype)
    buffer = gpurt.asarray(host)
    item = np.dtype(dtype).itemsize
    ld = out.ld
    strides = (item, ld * item) if case.col_major else (ld * item, item)
    view = buffer._view(case.offset * item, (case.rows, case.cols), strides)
    return dataclasses.replace(out, buffer=buffer, host=host.copy(), original=host.copy(),
                               view=view)


def run_fill(case: FillCase, rng: np.random.Generator) -> None:
    """One fill of a stored view, checked bit for bit against the numpy reference."""
    dtype = np.dtype(FILL_DTYPES[case.dtype])
    seed, n = int(rng.integers(2**63)), case.rows * case.cols
    g = gpurt.Generator(gpurt.current_device())
    g.manual_seed(seed)
    out = _stored_values(rng, case, dtype)
    want: Any
    if case.fill == "uniform":
        grandom.uniform_(out.view, -1.0, 2.0, generator=g)
        want = _philox.uniform(seed, 0, n, -1.0, 2.0, dtype)
    elif case.fill == "normal":
        grandom.normal_(out.view, 0.5, 3.0, generator=g)
        want = _philox.normal(seed, 0, n, 0.5, 3.0, dtype)
    elif case.fill.startswith("randint"):
        info = np.iinfo(dtype)
        low, high = (info.min, info.max) if case.fill == "randint_wide" else (-3, 100)
        grandom.randint_(out.view, low, high, generator=g)
        want = _philox.randint(seed, 0, n, low, high, dtype)
    elif case.fill == "bernoulli":
        grandom.bernoulli_(out.view, 0.3, generator=g)
        want = _philox.bernoulli(seed, 0, n, 0.3).astype(dtype)
    else:
        x = stored(rng, case.rows, case.cols, dtype, not case.col_major, case.offset + 1, 1)
        mask = _stored_values(rng, dataclasses.replace(case, dtype="bool"), np.bool_)
        grandom.dropout(x.view, 0.25, out=out.view, mask=mask.view, generator=g)
        want, kept = _philox.dropout(seed, 0, x.logical(), 0.25)
        _check_bits(mask, kept.reshape(-1), f"{case} mask")
    _check_bits(out, np.asarray(want).reshape(-1), str(case))


def _check_bits(out: Any, want: np.ndarray, label: str) -> None:
    out.refresh()
    out.assert_outside_untouched(label)
    got = out.logical().reshape(-1)
    bits = np.dtype(f"u{got.dtype.itemsize}")
    wrong = got.view(bits) != want.astype(got.dtype).view(bits)
    assert not wrong.any(), f"{label}: {wrong.sum()} wrong elements, first {np.argmax(wrong)}"


@dataclasses.dataclass(frozen=True)
class ReduceCase:
    dtype: str  # float32 or bfloat16
    rows: int
    cols: int
    axis: int | None
    col_major: bool = False
    offset: int = 0
    pad: int = 0


def run_reduce(case: ReduceCase, rng: np.random.Generator) -> None:
    """x.sum(axis) of a stored view into a poisoned output, checked against float64."""
    dtype = np.float32 if case.dtype == "float32" else gpurt.bfloat16
    x = stored(rng, case.rows, case.cols, dtype, case.col_major, case.offset, case.pad)
    want = x.logical().astype(np.float64).sum(axis=case.axis)
    want = np.asarray(want).reshape(-1)
    out = stored(rng, 1, want.size, dtype, False, 1, 0, poison=True)
    target = out.view.reshape(-1) if case.axis is not None else out.view.reshape(())
    SUM(x.view, target, axis=case.axis)
    out.refresh()
    out.assert_outside_untouched(str(case))
    got = out.logical().astype(np.float64).reshape(-1)
    size = case.cols if case.axis in (1, -1) else case.rows if case.axis == 0 else x.logical().size
    magnitude = np.abs(x.logical().astype(np.float64)).sum(axis=case.axis)
    eps = 1e-6 if case.dtype == "float32" else 2.0**-7
    bound = eps * np.abs(want) + 1e-6 * np.sqrt(size) * np.asarray(magnitude).reshape(-1)
    assert np.isfinite(got).all(), f"{case}: unwritten outputs"
    bad = np.abs(got - want) > bound + 1e-30
    assert not bad.any(), f"{case}: {bad.sum()} wrong sums, first at {np.argmax(bad)}"


def fill_cases(tier: str) -> list[FillCase]:
    """Every fill over aligned, misaligned, padded and column-major views, odd sizes."""
    shapes = [(3, 1001), (129, 65)] if tier == "quick" else \
        [(3, 1001), (1, 7), (129, 65), (1, 1), (17, 4099), (1, 100_003)]
    cases = []
    for fill, dtype in FILLS:
        for rows, cols in shapes:
            for col_major, offset, pad in [(False, 0, 0), (False, 1, 0), (False, 3, 2),
                                           (True, 1, 1)]:
                cases.append(FillCase(fill, dtype, rows, cols, col_major, offset, pad))
    return cases


def reduce_cases(tier: str) -> list[ReduceCase]:
    """Row, column and whole sums: the row walk (vector and scalar), the column walk, splits
    (70000 x 37: 137 splits of the realigned walk 16 threads wide, the column fold's tree of
    groups)."""
    shapes = [(3, 4099), (1, 70_001), (4099, 3), (130, 257), (300, 256), (70_000, 37)] \
        if tier == "quick" else \
        [(3, 4099), (1, 70_001), (4099, 3), (130, 257), (300, 256), (70_000, 37),
         (1, 1_000_003), (2048, 300), (33, 20_000), (5000, 1024)]
    cases = []
    for dtype in ("float32", "bfloat16"):
        for rows, cols in shapes:
            for axis in (1, 0, None):
                for col_major, offset, pad in [(False, 0, 0), (False, 1, 0), (True, 2, 3)]:
                    cases.append(ReduceCase(dtype, rows, cols, axis, col_major, offset, pad))
    return cases
