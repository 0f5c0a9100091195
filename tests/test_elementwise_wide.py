"""The 16-bit realigned column walk built for fewer resident blocks (reduction.
COLUMN_WIDE_MIN_BLOCKS: more registers, all of a thread's loads in flight) and its fold's
16-byte partial loads over padded partial rows (reduction.FOLD_VECTOR): plans on any machine
(compiled for sm_90 through NVRTC, never launched), results against float64 on a GPU."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401  (fixture)
from gpurt._elementwise import reduction

BF16 = np.dtype(ml_dtypes.bfloat16)


def _sum(name: str, acc: str = "float32") -> gpurt.ReductionKernel:
    return gpurt.ReductionKernel("T x", f"{acc} y", "x", "a + b", "y = a", "0", name,
                                 reduce_type=acc)


def _bounds(plan) -> str:
    return plan.kernel.module.source.split("__launch_bounds__(")[1].split(")")[0]


@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("vector", [False, True])
def test_wide_cap_only_where_a_16bit_realigned_grid_fits(monkeypatch, vector) -> None:
    """Off (0) nothing changes; at 6 the 16-bit realigned splits whose grid fits 6 blocks a SM
    take that cap (and, with FOLD_VECTOR, rows padded to whole 16-byte vectors); float32,
    aligned rows and grids past 6 a SM keep the cap of 8 and unpadded partial rows."""
    r = _sum(f"sum_wide_plan_{vector}")
    off = {shape: r._plan([fake_array(shape, BF16)], [None], 0, False)
           for shape in [(4099, 8191), (2047, 10007)]}
    assert all(_bounds(p) == "256, 8" and p.pitch == p.size for p in off.values())
    monkeypatch.setattr(reduction, "COLUMN_WIDE_MIN_BLOCKS", 6)
    monkeypatch.setattr(reduction, "FOLD_VECTOR", vector)
    for shape, before in off.items():
        plan = r._plan([fake_array(shape, BF16)], [None], 0, False)
        assert _bounds(plan) == "256, 6" and plan.grid == before.grid
        assert plan.grid[0] * plan.grid[1] <= 132 * 6
        assert plan.pitch == (-(-plan.size // 4) * 4 if vector else plan.size)
        assert ("_gpurt_l2v" in plan.kernel.module.source) == vector
    for shape, dtype in [((4099, 8191), np.float32), ((8192, 8192), BF16),
                         ((1023, 65537), BF16)]:  # fp32; aligned; 265 x 3 blocks > 792
        plan = r._plan([fake_array(shape, dtype)], [None], 0, False)
        assert _bounds(plan) == "256, 8" and plan.pitch == plan.size, shape


@pytest.mark.usefixtures("sm90")
def test_vector_fold_needs_4_byte_partials_dividing_the_block() -> None:
    """Four float32/int32/uint32 partials a load where they divide the block's outputs;
    float64 partials and other widths fold one a load."""
    reduction.FOLD_VECTOR, saved = True, reduction.FOLD_VECTOR
    try:
        assert reduction._fold_vec(np.dtype(np.float32), 248) == 4
        assert reduction._fold_vec(BF16, 120) == 4  # 16-bit sums keep float32 partials
        assert reduction._fold_vec(np.dtype(np.int32), 496) == 4
        assert reduction._fold_vec(np.dtype(np.float64), 248) == 1
        assert reduction._fold_vec(np.dtype(np.float32), 246) == 1
    finally:
        reduction.FOLD_VECTOR = saved


def poisoned(shape, dtype) -> gpurt.Array:
    dt = np.dtype(dtype)
    return gpurt.asarray(np.full(shape, 77 if dt.kind in "iub" else np.nan, dtype=dt))


@pytest.mark.gpu
@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("dtype", [BF16, np.float16, np.int16],
                         ids=lambda d: np.dtype(d).name)
def test_wide_column_sums_and_maxima(gpu_state, monkeypatch, vector, dtype) -> None:
    """Realigned 16-bit column sums and maxima under the wide cap, split in one level and in
    a tree (70000 x 37), odd widths, an offset and a reversed view, keepdims: three calls
    each on the kept counters, the same bits every call, against float64 (exact for
    int16 into int32); outputs poisoned first."""
    monkeypatch.setattr(reduction, "COLUMN_WIDE_MIN_BLOCKS", 6)
    monkeypatch.setattr(reduction, "FOLD_VECTOR", vector)
    rng = np.random.default_rng()
    ints = np.dtype(dtype).kind == "i"
    acc = "int32" if ints else "float32"
    name = f"{np.dtype(dtype).name}_{vector}"
    total = _sum(f"sum_wide_{name}", acc)
    most = gpurt.ReductionKernel("T x", f"{acc} y", "x", "max(a, b)", "y = a",
                                 "-2147483647" if ints else "-3.0e38", f"max_wide_{name}",
                                 reduce_type=acc)
    cases = [((4099, 8191), (slice(None), slice(None)), False),
             ((2100, 1041), (slice(None, None, -1), slice(1, None)), True),
             ((9000, 301), (slice(3, None), slice(2, None)), False),
             ((70000, 37), (slice(None), slice(None)), False)]
    for shape, index, keepdims in cases:
        base = (rng.integers(-1000, 1000, shape) if ints else
                rng.standard_normal(shape)).astype(dtype)
        dev, ref = gpurt.asarray(base), base.astype(np.float64)[index]
        for kernel, reduce in [(total, np.sum), (most, np.max)]:
            want = reduce(ref, axis=0, keepdims=keepdims)
            got = []
            for _ in range(3):
                out = poisoned(want.shape, acc)
                kernel(dev[index], out, axis=0, keepdims=keepdims)
                got.append(out.numpy())
            if ints:
                np.testing.assert_array_equal(got[0], want.astype(np.int64))
            else:
                np.testing.assert_allclose(got[0], want, rtol=1e-4,
                                           atol=1e-5 * math.sqrt(ref.shape[0]) * 4)
            assert all(np.array_equal(g.view(np.uint8), got[0].view(np.uint8))
                       for g in got[1:]), (shape, kernel)
            plan = list(kernel._plans.values())[-1]
            assert plan.splits > 1 and plan.fold and _bounds(plan) == "256, 6", shape
            assert ("_gpurt_l2v" in plan.kernel.module.source) == vector, shape
