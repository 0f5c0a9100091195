"""gpurt.ElementwiseKernel and gpurt.ReductionKernel: parsing, type binding, promotion,
broadcasting and plans on any machine (kernels compiled for sm_90 through NVRTC, never
launched), then results against numpy float64 on a GPU."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401  (fixture)
from gpurt._elementwise import codegen, counters, realign_codegen, reduce_codegen, reduction
from gpurt._elementwise.layout import broadcast_shape, collapse, normalize_axes
from gpurt._elementwise.types import parse_params, promote, result_type
from gpurt.elementwise import reads_output

BF16 = np.dtype(ml_dtypes.bfloat16)

# ---- CPU: parsing, promotion, layouts --------------------------------------------------------


def test_parse_params_reads_types_placeholders_and_raw() -> None:
    x, y, w = parse_params("T x, float32 y, raw T w", "in_params")
    assert (x.ctype, x.dtype, x.raw) == ("T", None, False)
    assert y.dtype == np.float32 and w.raw and w.dtype is None
    with pytest.raises(ValueError, match="cannot parse"):
        parse_params("T", "in_params")
    with pytest.raises(ValueError, match="twice"):
        parse_params("T x, T x", "in_params")
    with pytest.raises(ValueError, match="reserved"):
        parse_params("T i", "in_params")


@pytest.mark.parametrize("a, b, expected", [
    (np.float16, BF16, np.float32), (np.int16, np.float16, np.float16),
    (np.uint8, np.int8, np.int16), (np.bool_, np.uint8, np.uint8),
    (np.int64, np.float32, np.float32), (np.float32, np.float64, np.float64),
    (np.int32, np.int64, np.int64), (BF16, np.int64, BF16),
])
def test_promotion_follows_torch(a, b, expected) -> None:
    assert promote(np.dtype(a), np.dtype(b)) == np.dtype(expected)
    assert promote(np.dtype(b), np.dtype(a)) == np.dtype(expected)


def test_scalars_promote_only_across_categories() -> None:
    f16, i8, f64 = np.dtype(np.float16), np.dtype(np.int8), np.dtype(np.float64)
    i64, b = np.dtype(np.int64), np.dtype(np.bool_)
    assert result_type([f16], [f64]) == f16          # x_half * 2.0 stays half
    assert result_type([i8], [i64]) == i8            # x_int8 + 1 stays int8
    assert result_type([i8], [f64]) == np.float32    # int8 * 0.5 -> default float
    assert result_type([b], [i64]) == i64
    with pytest.raises(TypeError, match="no common integer"):
        promote(np.dtype(np.uint64), np.dtype(np.int8))


def test_broadcast_and_collapse() -> None:
    assert broadcast_shape([(3, 1, 5), (4, 5), ()]) == (3, 4, 5)
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(4,\).*do not broadcast"):
        broadcast_shape([(3, 2), (4,)])
    # a C-contiguous block collapses to one dimension; a transposed one does not
    assert collapse((2, 3, 4), [(12, 4, 1)]) == ((24,), ((1,),))
    assert collapse((3, 4), [(1, 3)]) == ((3, 4), ((1, 3),))
    # size-1 dimensions drop; a broadcast dimension stops the merge
    assert collapse((1, 3, 4), [(0, 4, 1), (0, 0, 1)]) == ((3, 4), ((4, 1), (0, 1)))
    assert normalize_axes(-1, 3) == (2,) and normalize_axes((2, 0), 3) == (0, 2)
    with pytest.raises(ValueError, match="out of bounds"):
        normalize_axes(3, 3)
    with pytest.raises(ValueError, match="repeated"):
        normalize_axes((0, -3), 3)


def test_reads_output_tells_assignments_from_reads() -> None:
    assert not reads_output("z = x + y", "z")
    assert not reads_output("z = x; w = z == 1", "w")
    assert reads_output("z += x", "z")
    assert reads_output("z = z * 2", "z")


@pytest.mark.usefixtures("sm90")
def test_elementwise_plans_contiguous_vectorized_and_strided() -> None:
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "axpy_plan")
    x, y = fake_array((1000, 1000)), fake_array((1000, 1000), ptr=1 << 24)
    plan = k._plan([x, y], [None])
    unroll = codegen.UNROLL  # a tile per block: 256 threads x UNROLL vectors
    assert plan.grid == math.ceil(10**6 / (256 * unroll * 4)) and plan.tail == (10**6,)
    misaligned = k._plan([fake_array((1000, 1000), ptr=(1 << 20) + 4), y], [None])
    assert misaligned.grid == math.ceil(10**6 / (256 * unroll * 1))  # no 16-byte vectors
    broadcast = k._plan([x, fake_array((1000,), ptr=1 << 24)], [None])
    assert broadcast.tail == (10**6, 1000, 1000, 1000, 1, 0, 1, 1000, 1)
    scalar = k._plan([fake_array((1000, 1000), np.float16), 3], [None])
    assert scalar.out_dtypes == (np.dtype(np.float16),) and scalar.grid == math.ceil(
        10**6 / (256 * unroll * 8))


@pytest.mark.usefixtures("sm90")
def test_elementwise_binding_errors() -> None:
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x + y", "add_bind")
    with pytest.raises(TypeError, match="T is already float32"):
        k._plan([fake_array((4,)), fake_array((4,), np.float64)], [None])
    with pytest.raises(ValueError, match="do not broadcast"):
        k._plan([fake_array((4,)), fake_array((5,))], [None])
    with pytest.raises(TypeError, match="complex64"):
        k._plan([fake_array((4,), np.complex64), fake_array((4,), np.complex64)], [None])
    with pytest.raises(TypeError, match="takes 2 inputs"):
        k(1.0)
    typed = gpurt.ElementwiseKernel("int32 x", "float32 z", "z = x", "typed_bind")
    with pytest.raises(TypeError, match="same_kind"):
        typed._plan([fake_array((4,), np.float32)], [None])
    out_only = gpurt.ElementwiseKernel("float32 x", "T z", "z = x", "unbound")
    with pytest.raises(TypeError, match="not known"):
        out_only._plan([fake_array((4,))], [None])
    with pytest.raises(ValueError, match="C identifier"):
        gpurt.ElementwiseKernel("T x", "T z", "z = x", "not a name")


@pytest.mark.usefixtures("sm90")
def test_bad_expression_raises_compile_error_with_the_line() -> None:
    k = gpurt.ElementwiseKernel("T x", "T z", "z = x +* undefined_thing", "broken")
    with pytest.raises(gpurt.CompileError) as info:
        k._plan([fake_array((4,))], [None])
    assert "undefined_thing" in info.value.log
    assert "undefined_thing" in str(info.value)  # the generated source line is shown


@pytest.mark.usefixtures("sm90")
def test_reduction_plans_walks_and_splits(monkeypatch) -> None:
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_plan")
    rows = r._plan([fake_array((8192, 8192))], [None], -1, False)
    assert rows.splits == 1 and rows.grid == (8192, 1, 1) and rows.out_shape == (8192,)
    cols = r._plan([fake_array((8192, 8192))], [None], 0, False)
    per = reduce_codegen.COLUMN_WIDTH * max(1, reduction.COLUMN_VECTOR_BYTES // 4)
    assert cols.splits > 1 and cols.fold and cols.finish is None and cols.grid[0] == 8192 // per
    long_rows = r._plan([fake_array((4, 1 << 20))], [None], 1, True)
    assert long_rows.splits > 1 and long_rows.out_shape == (4, 1)
    everything = r._plan([fake_array((3, 4, 5))], [None], None, False)
    assert everything.out_shape == () and everything.middle[:2] == (1, 60)
    some = r._plan([fake_array((3, 4, 5))], [None], (0, 2), False)
    assert some.out_shape == (4,) and some.middle[:2] == (4, 15)
    with monkeypatch.context() as patch:  # the split's second kernel instead of the fold
        patch.setattr(reduction, "FOLD", False)
        cols = r._plan([fake_array((8192, 8192))], [None], 0, False)
    assert cols.splits > 1 and not cols.fold and cols.finish is not None


@pytest.mark.usefixtures("sm90")
def test_tall_column_sums_fold_in_a_tree(monkeypatch) -> None:
    """A column split whose one-level fold would give a thread more than
    COLUMN_FOLD_TREE_FROM partial rows folds in two levels: a counter per column block of the
    grid and one per group of splits; fewer rows a thread, one level."""
    monkeypatch.setattr(reduction, "COLUMN_FOLD_TREE", 16)
    monkeypatch.setattr(reduction, "COLUMN_FOLD_TREE_FROM", 32)
    monkeypatch.setattr(reduction, "COLUMN_TREE_WIDTH", 0)  # COLUMN_WIDTH everywhere
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_tree")
    tall = r._plan([fake_array((65536, 1023))], [None], 0, False)
    assert tall.splits > 16 and tall.fold
    assert tall.counts == tall.grid[0] * (1 + -(-tall.splits // 16))
    assert "_gpurt_group_last" in tall.kernel.module.source
    square = r._plan([fake_array((2047, 10007))], [None], 0, False)
    assert 1 < square.splits <= 16 and square.counts == square.grid[0]
    aligned = r._plan([fake_array((65536, 1024))], [None], 0, False)  # 8 threads an output
    assert aligned.splits > 16 and aligned.counts == aligned.grid[0]
    monkeypatch.setattr(reduction, "COLUMN_FOLD_TREE", 0)
    flat = r._plan([fake_array((65536, 1023))], [None], 0, False)
    assert flat.splits == tall.splits and flat.counts == flat.grid[0]
    assert "_gpurt_group_last" not in flat.kernel.module.source


@pytest.mark.usefixtures("sm90")
def test_tall_realigned_sums_take_narrower_blocks(monkeypatch) -> None:
    """Where the realigned walk's split would fold in a tree at COLUMN_WIDTH, it takes
    COLUMN_TREE_WIDTH threads across: twice the column blocks, fewer splits; elsewhere (no
    tree, or no realigning) COLUMN_WIDTH."""
    monkeypatch.setattr(reduction, "COLUMN_FOLD_TREE", 16)
    monkeypatch.setattr(reduction, "COLUMN_FOLD_TREE_FROM", 32)
    monkeypatch.setattr(reduce_codegen, "COLUMN_WIDTH", 32)
    monkeypatch.setattr(reduction, "COLUMN_TREE_WIDTH", 16)
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_narrow")

    def plan(shape, dtype=np.float32):
        return r._plan([fake_array(shape, dtype)], [None], 0, False)

    f32, b16 = plan((65536, 1023)), plan((65536, 1023), BF16)
    assert f32.grid[:2] == (-(-1023 // (15 * 4)), 58) and f32.counts == f32.grid[0]
    assert b16.grid[:2] == (-(-1023 // (15 * 8)), 117) and b16.counts > b16.grid[0]  # a tree
    assert "_gpurt_group_last" in b16.kernel.module.source
    assert plan((4099, 8191)).grid[0] == -(-8191 // (31 * 4))  # one level: as before
    assert plan((65536, 1024)).grid[0] == 1024 // 32           # aligned: as before
    monkeypatch.setattr(reduction, "COLUMN_TREE_WIDTH", 0)
    assert plan((65536, 1023)).grid[:2] == (-(-1023 // (31 * 4)), 117)


@pytest.mark.usefixtures("sm90")
def test_column_walk_vectors_only_where_aligned(monkeypatch) -> None:
    monkeypatch.setattr(reduction, "COLUMN_VECTOR_BYTES", 16)
    monkeypatch.setattr(reduce_codegen, "COLUMN_WIDTH", 32)
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_cvec")

    def outputs_per_block(shape, axis, dtype=np.float32, **kw) -> int:
        plan = r._plan([fake_array(shape, dtype, **kw)], [None], axis, False)
        assert plan.kernel is not None
        return -(-plan.size // plan.grid[0])

    assert outputs_per_block((8192, 8192), 0) == 32 * 4          # float4 across columns
    assert outputs_per_block((8192, 8192), 0, BF16) == 32 * 8    # 8 bfloat16 a load
    assert outputs_per_block((6, 40, 64), 1) == 32 * 4           # 2-D kept, whole vectors
    monkeypatch.setattr(reduction, "COLUMN_REALIGN_BYTES", 0)
    assert outputs_per_block((4099, 8191), 0) == 32              # odd rows: scalars
    assert outputs_per_block((64, 1026), 0) == 32                # 1026 % 4: scalars
    assert outputs_per_block((64, 1024), 0, ptr=(1 << 20) + 4) == 32  # misaligned
    assert outputs_per_block((64, 1024), 0, strides=(4100, 4)) == 32  # rows 1025 apart


@pytest.mark.usefixtures("sm90")
def test_column_walk_realigns_rows_vectors_cannot_align_with(monkeypatch) -> None:
    monkeypatch.setattr(reduction, "COLUMN_REALIGN_BYTES", 16)
    monkeypatch.setattr(reduction, "COLUMN_VECTOR_BYTES", 4)
    monkeypatch.setattr(reduce_codegen, "COLUMN_WIDTH", 32)
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_realign")
    dot = gpurt.ReductionKernel("T x, T y", "T z", "x * y", "a + b", "z = a", "0", "dot_re")

    def blocks(kernel, arrays, axis=0) -> int:
        plan = kernel._plan(arrays, [None], axis, False)
        assert plan.kernel is not None
        return plan.grid[0]

    f4, b8 = 31 * 4, 31 * 8  # columns per block: float4 / 8-bfloat16 envelopes, one spare
    assert blocks(r, [fake_array((4099, 8191))]) == -(-8191 // f4)
    assert blocks(r, [fake_array((4099, 8191), BF16)]) == -(-8191 // b8)
    assert blocks(r, [fake_array((64, 1024), ptr=(1 << 20) + 4)]) == -(-1024 // f4)
    assert blocks(r, [fake_array((64, 1024), strides=(4100, 4))]) == -(-1024 // f4)
    assert blocks(r, [fake_array((5, 60, 333))], (0, 1)) == -(-333 // f4)  # reduced dims merge
    assert blocks(r, [fake_array((8192, 8192))]) == 8192 // 32          # aligned: as before
    assert blocks(r, [fake_array((6, 41, 1001))], 1) == -(-6 * 1001 // 32)  # 2-D kept
    odd = fake_array((300, 1001))
    assert blocks(dot, [odd, fake_array((300, 1001))]) == -(-1001 // f4)  # same alignment
    assert blocks(dot, [odd, fake_array((300, 1001), ptr=(1 << 20) + 4)]) == -(-1001 // 32)
    assert blocks(dot, [odd, fake_array((1, 1001), strides=(0, 4))]) == -(-1001 // 32)
    monkeypatch.setattr(reduction, "COLUMN_REALIGN_ALL", True)
    assert blocks(r, [fake_array((8192, 8192))]) == -(-8192 // f4)



@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("ticket", ["all", "one", "acqrel"])
def test_fold_tickets_fence_as_told(monkeypatch, ticket) -> None:
    """reduce_codegen.TICKET: every thread fences before the ticket ("all"), thread 0 alone
    ("one"), or thread 0's acq_rel atomic without a fence ("acqrel")."""
    monkeypatch.setattr(reduce_codegen, "TICKET", ticket)
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", f"sum_tk_{ticket}")
    plan = r._plan([fake_array((4099, 8191))], [None], 0, False)
    kernel = plan.kernel.module.source.split('extern "C"')[1]
    assert plan.fold and plan.counts == plan.grid[0]
    every = "    __threadfence();\n    __syncthreads();\n    if (threadIdx.x == 0)\n"
    assert (every in kernel) == (ticket == "all")
    assert ("if (threadIdx.x == 0) {\n        __threadfence();" in kernel) == (ticket == "one")
    assert ("_gpurt_ticket_acq_rel(_count" in kernel) == (ticket == "acqrel")
    assert kernel.count("__threadfence();") == {"all": 2, "one": 2, "acqrel": 0}[ticket]


def test_split_grids_round_to_whole_waves() -> None:
    fit = reduction._fit_waves  # (column blocks, splits, resident blocks) -> splits
    assert fit(67, 17, 1056) == 15   # 1.08 waves of 8 x 132 -> one wave
    assert fit(256, 8, 1056) == 8    # 1.94 waves: two, as asked
    assert fit(34, 17, 1056) == 17   # within one wave: every block runs at once
    assert fit(529, 3, 1056) == 3    # 1.5 -> 2 waves: never more splits than asked
    assert fit(600, 2, 1056) == 1    # 1.14 waves -> one: no split


@pytest.mark.usefixtures("sm90")
def test_column_splits_fit_the_kernels_occupancy(monkeypatch) -> None:
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_FIT", True)
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_WAVES", 2)  # splits aimed at two waves
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_LEAST_FEW", 0)  # splits of 32 rows a thread

    def plan(shape, per_sm, dtype=np.float32):
        monkeypatch.setattr(reduction, "_blocks_per_sm", lambda kernel, device: per_sm)
        r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_fit")
        return r._plan([fake_array(shape, dtype)], [None], 0, False)

    assert plan((4099, 8191), 8).grid == (67, 15, 1)   # 67 x 17 would be 1.08 waves
    assert plan((4099, 8191), 6).grid == (67, 11, 1)   # 6 per SM: 792 resident
    unsplit = plan((512, 12800), 1)                    # 400 x 2 over 132: six waves
    assert unsplit.splits == 1 and not unsplit.fold and unsplit.partial is None
    assert unsplit.middle[2] == 512                    # one chunk: all of K
    assert plan((1024, 16928), 8).splits == 1          # 529 blocks: over half a wave
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_FIT", False)
    assert plan((4099, 8191), 8).grid == (67, 17, 1)


@pytest.mark.usefixtures("sm90")
def test_short_column_splits_take_shorter_chunks(monkeypatch) -> None:
    """A column split that K keeps under-filled takes COLUMN_SPLIT_LEAST_FEW elements a thread
    where that still makes at most COLUMN_SPLIT_FEW splits; else COLUMN_SPLIT_LEAST."""
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_LEAST", 32)
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_LEAST_FEW", 16)
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_FEW", 16)
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_few")

    def grid(shape, dtype=np.float32):
        return r._plan([fake_array(shape, dtype)], [None], 0, False).grid[:2]

    assert grid((2047, 10007)) == (81, 13) and grid((2047, 10007), BF16) == (41, 16)
    assert grid((4099, 8191), BF16) == (34, 17)  # 31 splits at 16: too many, as at 32
    assert grid((4099, 8191)) == (67, 15)  # the wave, not K, limits it
    monkeypatch.setattr(reduction, "COLUMN_SPLIT_LEAST_FEW", 0)
    assert grid((2047, 10007)) == (81, 8) and grid((2047, 10007), BF16) == (41, 8)


@pytest.mark.usefixtures("sm90")
def test_reduction_rejects_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="identity=None"):
        gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", None, "noid")
    with pytest.raises(ValueError, match="raw"):
        gpurt.ReductionKernel("raw T x", "T y", "x", "a + b", "y = a", "0", "rawred")
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_err")
    with pytest.raises(ValueError, match="out of bounds"):
        r._plan([fake_array((3, 4))], [None], 2, False)
    with pytest.raises(ValueError, match="shape"):
        r._plan([fake_array((3, 4))], [fake_array((4,))], 1, False)


# ---- GPU ---------------------------------------------------------------------------------------

DTYPES = [np.float32, np.float16, BF16, np.float64, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.bool_]


def random(shape, dtype, rng) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(0 if dt.kind == "u" else -8, 9, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def tolerance(dtype) -> dict:
    dt = np.dtype(dtype)
    if dt in (np.dtype(np.float16), BF16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dt == np.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 1e-12, "atol": 1e-12}  # float64: FMA contraction may differ in the last bit


def poisoned(shape, dtype) -> gpurt.Array:
    dt = np.dtype(dtype)
    fill = 77 if dt.kind in "iub" else np.nan
    return gpurt.asarray(np.full(shape, fill, dtype=dt))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_elementwise_every_dtype(gpu_state, dtype) -> None:
    rng = np.random.default_rng()
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * y + x", "mul_add")
    for shape in [(1000, 37), (5,), (4099,)]:
        x, y = random(shape, dtype, rng), random(shape, dtype, rng)
        out = poisoned(shape, dtype)
        assert k(gpurt.asarray(x), gpurt.asarray(y), out) is out
        ref = x.astype(np.float64) * y.astype(np.float64) + x.astype(np.float64)
        got = out.numpy()
        if np.dtype(dtype) == np.bool_:
            np.testing.assert_array_equal(got, (x & y) | x)
        else:
            np.testing.assert_allclose(got.astype(np.float64), ref, **tolerance(dtype))
        fresh = k(gpurt.asarray(x), gpurt.asarray(y))
        np.testing.assert_array_equal(fresh.numpy(), got)


@pytest.mark.gpu
def test_elementwise_strided_offset_broadcast_and_in_place(gpu_state) -> None:
    rng = np.random.default_rng()
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x - 3 * y", "sub3")
    base = rng.standard_normal((9, 40, 6)).astype(np.float32)
    dev = gpurt.asarray(base)
    x = dev[1:, 3::2, :]                          # offset, non-contiguous
    y = gpurt.asarray(rng.standard_normal((19, 1)).astype(np.float32))  # broadcast
    ref = base[1:, 3::2, :].astype(np.float64) - 3 * y.numpy().astype(np.float64)
    np.testing.assert_allclose(k(x, y).numpy(), ref, rtol=1e-5, atol=1e-5)
    t = dev.transpose(2, 0, 1)                    # transposed read, strided write
    out_base = poisoned((6, 9, 80), np.float32)
    out = out_base[:, :, ::2]
    k(t, 0.5, out)
    np.testing.assert_allclose(out.numpy(), base.transpose(2, 0, 1) - 1.5, rtol=1e-5, atol=1e-5)
    assert np.isnan(out_base.numpy()[:, :, 1::2]).all()   # the gaps were not written
    in_place = gpurt.asarray(base.copy())
    k(in_place, in_place, in_place)
    np.testing.assert_allclose(in_place.numpy(), -2 * base, rtol=1e-5, atol=1e-5)
    zero_d = k(gpurt.asarray(np.float32(2.0)), gpurt.asarray(np.float32(1.0)))
    assert zero_d.shape == () and zero_d.numpy() == -1.0


@pytest.mark.gpu
def test_elementwise_typed_params_raw_index_and_outputs(gpu_state) -> None:
    rng = np.random.default_rng()
    x = rng.integers(-50, 50, size=1001).astype(np.int32)
    typed = gpurt.ElementwiseKernel("float32 x, float32 s", "float64 z, T w",
                                    "z = x * s; w = (T)i", "typed_two")
    z, w = typed(gpurt.asarray(x), 0.25, poisoned(1001, np.float64), poisoned(1001, np.int16))
    np.testing.assert_allclose(z.numpy(), x * 0.25)
    np.testing.assert_array_equal(w.numpy(), np.arange(1001, dtype=np.int16))
    rev = gpurt.ElementwiseKernel("raw T x", "T y", "y = x[_ind.size() - 1 - i]", "reverse")
    src = rng.standard_normal(777).astype(np.float64)
    got = rev(gpurt.asarray(src), poisoned(777, np.float64))
    np.testing.assert_array_equal(got.numpy(), src[::-1])
    acc = gpurt.ElementwiseKernel("T x", "T y", "y += x", "accumulate")
    start = rng.standard_normal(300).astype(np.float32)
    total = gpurt.asarray(start)
    acc(gpurt.asarray(np.ones(300, np.float32)), total)
    np.testing.assert_allclose(total.numpy(), start + 1, rtol=1e-6)


@pytest.mark.gpu
def test_elementwise_on_torch_tensors(gpu_state) -> None:
    torch = pytest.importorskip("torch")
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "axpy_torch")
    x = torch.randn(513, 257, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(257, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    assert k(x, y, out) is out
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 2 + y, rtol=1e-2, atol=1e-2)
    got = k(x[:, ::2], y[::2])
    torch.testing.assert_close(torch.from_dlpack(got), x[:, ::2] * 2 + y[::2],
                               rtol=1e-2, atol=1e-2)


REDUCE_DTYPES = [np.float32, np.float16, BF16, np.float64, np.int32, np.int64, np.uint8]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_sum_over_axes(gpu_state, dtype) -> None:
    rng = np.random.default_rng()
    r = gpurt.ReductionKernel("T x", "float64 y", "x", "a + b", "y = a", "0", "sum_axes",
                              reduce_type="float64")
    x = random((7, 33, 130), dtype, rng)
    dev = gpurt.asarray(x)
    ref64 = x.astype(np.float64)
    for axis in [None, 0, 1, 2, -1, (0, 2), (1, 2), (0, 1)]:
        for keepdims in (False, True):
            want = ref64.sum(axis=axis, keepdims=keepdims)
            out = poisoned(want.shape, np.float64)
            r(dev, out, axis=axis, keepdims=keepdims)
            np.testing.assert_allclose(out.numpy(), want, rtol=1e-9, atol=1e-9,
                                       err_msg=f"axis={axis} keepdims={keepdims}")
    plain = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_same")
    got = plain(dev, axis=-1).numpy().astype(np.float64)
    want = ref64.sum(-1)
    if np.dtype(dtype).kind == "u":
        want = want % 256
    scale = np.abs(ref64).sum(-1) + 1
    assert np.all(np.abs(got - want) <= scale * tolerance(dtype)["rtol"] + 1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, axis", [
    ((3, 300001), -1), ((300001,), None), ((20000, 7), 0), ((4096, 1000), 0),
    ((64, 2048), 1), ((1, 5), 1), ((5, 0), 1), ((0, 5), 1), ((2, 3, 4097), (0, 2)),
])
@pytest.mark.parametrize("fold", [True, False])
def test_sum_row_column_split_and_empty(gpu_state, monkeypatch, shape, axis, fold) -> None:
    monkeypatch.setattr(reduction, "FOLD", fold)  # a split's last block, or a finish kernel
    rng = np.random.default_rng()
    x = rng.standard_normal(shape).astype(np.float32)
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_f32")
    want = x.astype(np.float64).sum(axis=axis)
    got = r(gpurt.asarray(x), poisoned(want.shape, np.float32), axis=axis)
    n = max(1, x.size // max(1, want.size))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5 * math.sqrt(n) * 4)


@pytest.mark.gpu
def test_split_sums_keep_their_counters_per_stream(gpu_state) -> None:
    """Split column sums back to back on two streams, nothing waiting between the calls:
    every fold leaves its stream's kept counters zeroed, and no two streams share them."""
    rng = np.random.default_rng()
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_kept")
    xs = [rng.standard_normal((4099, 1001)).astype(np.float32) for _ in range(3)]
    arrays = [gpurt.asarray(x) for x in xs]
    streams = [gpurt.Stream(), gpurt.Stream()]
    for s in streams:
        s.wait_stream(gpurt.current_stream())  # the inputs' copies
    outs = []
    for i in range(8):
        with gpurt.stream(streams[i % 2]):
            outs.append(r(arrays[i % 3], poisoned((1001,), np.float32), axis=0))
    for s in streams:
        gpurt.current_stream().wait_stream(s)
    gpurt.synchronize()
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out.numpy(), xs[i % 3].astype(np.float64).sum(0),
                                   rtol=1e-4, atol=1e-3)
    plan = list(r._plans.values())[-1]
    handles = {gpurt.streams.as_stream_handle(s) for s in streams}
    assert plan.splits > 1 and plan.fold
    assert {h for _, h in counters._kept.keys()} >= handles  # each stream its own


@pytest.mark.gpu
@pytest.mark.parametrize("ticket", ["all", "one", "acqrel"])
def test_split_folds_under_every_ticket(gpu_state, monkeypatch, ticket) -> None:
    """Split sums folded by their last block whichever way the blocks take the ticket
    (reduce_codegen.TICKET): a long row (a block an output), short rows (a warp each),
    aligned, realigned and tall columns (one level, a tree); three calls each on the kept
    counters, the same bits every call, against float64; outputs poisoned first."""
    monkeypatch.setattr(reduce_codegen, "TICKET", ticket)
    rng = np.random.default_rng()
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", f"sum_ticket_{ticket}")
    for shape, axis, dtype in [((1, 300001), -1, np.float32), ((64, 2048), -1, np.float32),
                               ((4099, 1024), 0, np.float32), ((4099, 1001), 0, BF16),
                               ((40000, 37), 0, np.float32), ((40000, 301), 0, BF16)]:
        x = rng.standard_normal(shape).astype(dtype)
        want = x.astype(np.float64).sum(axis=axis)
        dev = gpurt.asarray(x)
        got = [r(dev, poisoned(want.shape, dtype), axis=axis).numpy() for _ in range(3)]
        plan = list(r._plans.values())[-1]
        assert plan.splits > 1 and plan.fold, shape
        n = x.size // want.size
        np.testing.assert_allclose(got[0].astype(np.float64), want, rtol=2**-7 if dtype is BF16
                                   else 1e-4, atol=1e-5 * math.sqrt(n) * 4)
        assert all(np.array_equal(g.view(np.uint8), got[0].view(np.uint8)) for g in got[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("tree, batch", [(2, 1), (3, 8), (16, 8)])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32], ids=lambda d: np.dtype(d).name)
def test_tall_column_reductions_fold_in_a_tree(gpu_state, monkeypatch, tree, batch,
                                               dtype) -> None:
    """Tall column sums and maxima (32-63 splits; aligned rows, an offset view, an odd width)
    folded in two levels of ``tree`` splits or one, ``batch`` partials in flight, twice
    each (the kept counters), against float64 (exact for integers); outputs poisoned first."""
    monkeypatch.setattr(reduction, "COLUMN_FOLD_TREE", tree)
    monkeypatch.setattr(reduction, "COLUMN_FOLD_TREE_FROM", 0)  # wherever splits > tree
    monkeypatch.setattr(reduce_codegen, "FOLD_BATCH", batch)
    rng = np.random.default_rng()
    ints = np.dtype(dtype).kind == "i"
    acc = "int32" if ints else "float32"
    name = f"{np.dtype(dtype).name}_{tree}_{batch}"
    total = gpurt.ReductionKernel("T x", f"{acc} y", "x", "a + b", "y = a", "0",
                                  f"sum_tree_{name}", reduce_type=acc)
    most = gpurt.ReductionKernel("T x", f"{acc} y", "x", "max(a, b)", "y = a",
                                 "-2147483647" if ints else "-3.0e38", f"max_tree_{name}",
                                 reduce_type=acc)
    base = (rng.integers(-1000, 1000, (16001, 1032)) if ints else
            rng.standard_normal((16001, 1032))).astype(dtype)
    dev, ref = gpurt.asarray(base), base.astype(np.float64)
    for index in [(slice(None), slice(None)), (slice(1, None), slice(3, 1030)),
                  (slice(None), slice(0, 1031))]:  # aligned, realigned, spread
        for kernel, reduce in [(total, np.sum), (most, np.max)]:
            want = reduce(ref[index], axis=0)
            for _ in range(2):
                out = poisoned(want.shape, acc)
                kernel(dev[index], out, axis=0)
                if ints:
                    np.testing.assert_array_equal(out.numpy(), want.astype(np.int64))
                else:
                    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4,
                                               atol=1e-5 * math.sqrt(ref.shape[0]) * 4)
        plan = list(total._plans.values())[-1]
        assert plan.splits > max(tree, 1) and plan.fold


@pytest.mark.gpu
@pytest.mark.parametrize("width, vector", [(32, 16), (64, 8), (256, 4), (256, 16)])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
def test_column_sums_under_each_walk_shape(gpu_state, monkeypatch, width, vector,
                                           dtype) -> None:
    """The column walk's block shapes and vector widths (also misaligned, strided and
    keepdims), split and folded or not, against float64; outputs poisoned first."""
    monkeypatch.setattr(reduce_codegen, "COLUMN_WIDTH", width)
    monkeypatch.setattr(reduction, "COLUMN_VECTOR_BYTES", vector)
    rng = np.random.default_rng()
    r = gpurt.ReductionKernel("T x", "float32 y", "x", "a + b", "y = a", "0",
                              f"sum_cw{width}_{vector}", reduce_type="float32")
    base = rng.standard_normal((2100, 1040)).astype(dtype)
    dev = gpurt.asarray(base)
    ref = base.astype(np.float64)
    cases = [((slice(None), slice(None)), 0, False), ((slice(0, 37), slice(None)), 0, True),
             ((slice(None), slice(1, 1025)), 0, False), ((slice(None), slice(0, 1040, 2)), 0,
                                                          False),
             ((slice(0, 2000), slice(0, 1040)), (0,), True)]
    for index, axis, keepdims in cases:
        want = ref[index].sum(axis=axis, keepdims=keepdims)
        out = poisoned(want.shape, np.float32)
        r(dev[index], out, axis=axis, keepdims=keepdims)
        n = ref[index].shape[0]
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4,
                                   atol=1e-5 * math.sqrt(n) * 4, err_msg=f"{index} {axis}")
    cube = rng.standard_normal((6, 700, 64)).astype(dtype)   # kept (6, 64), reduced 700
    want = cube.astype(np.float64).sum(axis=1, keepdims=True)
    out = poisoned(want.shape, np.float32)
    r(gpurt.asarray(cube), out, axis=1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("every", [False, True], ids=["misaligned", "all"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.int32, np.int8],
                         ids=lambda d: np.dtype(d).name)
def test_column_sums_of_rows_vectors_cannot_align_with(gpu_state, monkeypatch, dtype,
                                                       every) -> None:
    """The realigning column walk (odd row lengths, offset views, keepdims, splits, rows
    closer than a vector, reversed rows, two inputs; with ``every`` also aligned rows) against
    float64 (exact for integers); outputs poisoned first."""
    monkeypatch.setattr(reduction, "COLUMN_REALIGN_BYTES", 16)
    monkeypatch.setattr(reduction, "COLUMN_REALIGN_ALL", every)
    rng = np.random.default_rng()
    ints = np.dtype(dtype).kind == "i"
    out_t = "int32" if ints else "float32"
    r = gpurt.ReductionKernel("T x", f"{out_t} y", "x", "a + b", "y = a", "0",
                              f"sum_odd_{np.dtype(dtype).name}", reduce_type=out_t)
    dot = gpurt.ReductionKernel("T x, T w", f"{out_t} y", "x * w", "a + b", "y = a", "0",
                                f"dot_odd_{np.dtype(dtype).name}", reduce_type=out_t)

    def make(shape):
        if ints:
            return rng.integers(-100, 100, shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)

    def check(got, want, n) -> None:
        if ints:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * math.sqrt(n) * 4)

    cases = [((301, 1039), (slice(1, None), slice(3, None)), 0, True),
             ((4099, 1001), (slice(None), slice(None)), 0, False),
             ((2, 1001), (slice(None), slice(None)), 0, False),
             ((3000, 3), (slice(None), slice(None)), 0, False),
             ((130, 5), (slice(None), slice(1, None)), 0, False),
             ((2100, 1040), (slice(None), slice(1, 1025)), 0, False),
             ((2048, 1024), (slice(None), slice(None)), 0, False),
             ((5, 60, 333), (slice(None),) * 3, (0, 1), False),
             # rows reversed: row 0 is the highest in memory, its last vector the one past
             # the view's end (read element by element)
             ((300, 1001), (slice(None, None, -1), slice(None)), 0, False),
             ((2100, 1040), (slice(None, None, -1), slice(1, 1025)), 0, False)]
    for shape, index, axis, keepdims in cases:
        base = make(shape)
        ref = base[index].astype(np.float64)
        want = ref.sum(axis=axis, keepdims=keepdims)
        got = r(gpurt.asarray(base)[index], poisoned(want.shape, out_t), axis=axis,
                keepdims=keepdims)
        check(got.numpy(), want, ref.shape[0])
    x, w = make((777, 2049)), make((777, 2049))
    want = (x.astype(np.float64) * w).sum(0)
    check(dot(gpurt.asarray(x), gpurt.asarray(w), poisoned(want.shape, out_t), axis=0).numpy(),
          want, 777)
    want = (x[:, 1:].astype(np.float64) * w[:, :2048]).sum(0)  # one element apart: no
    got = dot(gpurt.asarray(x)[:, 1:], gpurt.asarray(w)[:, :2048],   # common envelope
              poisoned(want.shape, out_t), axis=0)
    check(got.numpy(), want, 777)


@pytest.mark.gpu
@pytest.mark.parametrize("batch_from", [1, 0], ids=["batched", "unrolled"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
def test_realigned_walk_loops(gpu_state, monkeypatch, dtype, batch_from) -> None:
    """Both loops of the realigned column walk (realign_codegen.REALIGN_BATCH_FROM: whole
    batches of loads, or `#pragma unroll` with its remainder) on row counts that leave every
    remainder, a split, reversed rows and a view ending at its buffer's end, against
    float64; the same bits on a second call."""
    monkeypatch.setattr(realign_codegen, "REALIGN_BATCH_FROM", batch_from)
    rng = np.random.default_rng()
    r = gpurt.ReductionKernel("T x", "float32 y", "x", "a + b", "y = a", "0",
                              f"sum_loops{batch_from}", reduce_type="float32")
    for shape, index in [((4099, 1001), (slice(None), slice(None))),
                         ((61, 1001), (slice(None), slice(2, None))),
                         ((299, 777), (slice(None, None, -1), slice(1, None)))]:
        base = rng.standard_normal(shape).astype(dtype)
        ref = base[index].astype(np.float64)
        got = r(gpurt.asarray(base)[index], poisoned((ref.shape[1],), "float32"), axis=0)
        np.testing.assert_allclose(got.numpy(), ref.sum(0), rtol=1e-4,
                                   atol=1e-5 * math.sqrt(shape[0]) * 4)
        again = r(gpurt.asarray(base)[index], poisoned((ref.shape[1],), "float32"), axis=0)
        assert again.numpy().tobytes() == got.numpy().tobytes()


@pytest.mark.gpu
def test_reductions_with_map_post_map_and_strides(gpu_state) -> None:
    rng = np.random.default_rng()
    base = rng.standard_normal((50, 60, 8)).astype(np.float32)
    dev = gpurt.asarray(base)
    view = dev[::2, 5:, :].transpose(2, 0, 1)     # strided, offset, transposed
    ref = base[::2, 5:, :].transpose(2, 0, 1).astype(np.float64)
    l2 = gpurt.ReductionKernel("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2norm")
    np.testing.assert_allclose(l2(view, axis=(1, 2)).numpy(), np.sqrt((ref ** 2).sum((1, 2))),
                               rtol=1e-5)
    mx = gpurt.ReductionKernel("T x", "T y", "x", "max(a, b)", "y = a", "-INFINITY", "amax")
    np.testing.assert_array_equal(mx(view, axis=1).numpy(), ref.max(1).astype(np.float32))
    mean = gpurt.ReductionKernel("T x", "T y", "x", "a + b",
                                 "y = a / (_in_ind.size() / _out_ind.size())", "0", "mean")
    np.testing.assert_allclose(mean(view, axis=0).numpy(), ref.mean(0), rtol=1e-5, atol=1e-6)
    dot = gpurt.ReductionKernel("T x, T w, T s", "T y", "x * w * s", "a + b", "y = a", "0",
                                "scaled_dot")
    w = rng.standard_normal((60,)).astype(np.float32)
    got = dot(gpurt.asarray(base[0]), gpurt.asarray(w[:, None]), 2.0, axis=0)
    np.testing.assert_allclose(got.numpy(), 2 * (base[0].astype(np.float64) * w[:, None]).sum(0),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_reduction_on_torch_and_errors(gpu_state) -> None:
    torch = pytest.importorskip("torch")
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_torch")
    x = torch.randn(300, 1000, device="cuda")
    out = torch.full((300,), float("nan"), device="cuda")
    assert r(x, out, axis=1) is out
    torch.testing.assert_close(out, x.sum(1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.from_dlpack(r(x.t(), axis=1)), x.sum(0), rtol=1e-4,
                               atol=1e-4)
    with pytest.raises(TypeError, match="device array"):
        r(np.ones(3), axis=0)
    with pytest.raises(TypeError, match="is float64"):
        r(torch.ones(3, device="cuda"), torch.ones(1, device="cuda", dtype=torch.float64))


@pytest.mark.gpu
def test_elementwise_and_reduction_in_graph_capture(gpu_state) -> None:
    rng = np.random.default_rng()
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "axpy_graph")
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_graph")
    x = gpurt.asarray(rng.standard_normal((64, 5000)).astype(np.float32))
    y = gpurt.asarray(rng.standard_normal((64, 5000)).astype(np.float32))
    odd = x[:, 1:4998]  # rows a vector cannot align with: the realigning column walk
    tall = gpurt.asarray(rng.standard_normal((4099, 301)).astype(np.float32))
    wide = gpurt.asarray(rng.standard_normal((2, 1 << 20)).astype(np.float32))
    # plans made outside the capture; the tall and wide sums are split (counters zeroed
    # and partials folded in each replay)
    k(x, y), r(x, axis=0), r(x, axis=-1), r(odd, axis=0), r(tall, axis=0), r(wide, axis=-1)
    assert all(p.splits > 1 and p.fold for p in list(r._plans.values())[-2:])
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        z = k(x, y)
        col = r(z, axis=0)
        row = r(z, axis=-1)
        col_odd = r(odd, axis=0)
        col_tall = r(tall, axis=0)
        row_wide = r(wide, axis=-1)
    for _ in range(2):
        xs = rng.standard_normal((64, 5000)).astype(np.float32)
        ys = rng.standard_normal((64, 5000)).astype(np.float32)
        x.copy_(xs)
        y.copy_(ys)
        g.replay()
        gpurt.synchronize()
        zs = xs.astype(np.float64) * 2 + ys
        np.testing.assert_allclose(z.numpy(), zs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(col.numpy(), zs.sum(0), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(row.numpy(), zs.sum(1), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(col_odd.numpy(), xs[:, 1:4998].astype(np.float64).sum(0),
                                   rtol=1e-4, atol=1e-3)
        ts = rng.standard_normal((4099, 301)).astype(np.float32)
        ws = rng.standard_normal((2, 1 << 20)).astype(np.float32)
        tall.copy_(ts)
        wide.copy_(ws)
        g.replay()
        gpurt.synchronize()
        np.testing.assert_allclose(col_tall.numpy(), ts.astype(np.float64).sum(0),
                                   rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(row_wide.numpy(), ws.astype(np.float64).sum(1),
                                   rtol=1e-4, atol=1e-2)
