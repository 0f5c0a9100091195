"""The one-level column fold's variants (fold_codegen.py, s13-col): staged in shared memory
(reduction.FOLD_STAGE_BYTES) and the early ticket (reduction.FOLD_EARLY): where the planner
takes them, the source it builds (CPU, sm_90 through NVRTC), and sums, maxima, a mean and a
dot under each against float64 on a GPU (the same bits every call; outputs poisoned)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401  (fixture)
from gpurt._elementwise import fold_codegen, reduce_codegen, reduction

BF16 = np.dtype(ml_dtypes.bfloat16)


def _kernel_text(plan) -> str:
    return plan.kernel.module.source.split('extern "C"')[1]


@pytest.mark.usefixtures("sm90")
def test_staged_only_where_the_partials_fit(monkeypatch) -> None:
    """Staged: one-level column folds whose splits x outputs x 4 or 8 bytes fit the knob;
    not: the knob off, too many bytes, a tree, a row split, an unsplit sum."""
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_stage_plan")

    def plan(shape, dtype=np.float32, axis=0):
        return r._plan([fake_array(shape, dtype)], [None], axis, False)

    monkeypatch.setattr(reduction, "FOLD_STAGE_BYTES", 0)
    assert "_stg[" not in _kernel_text(plan((4099, 8191), BF16))
    monkeypatch.setattr(reduction, "FOLD_STAGE_BYTES", 20480)
    staged = plan((4099, 8191), BF16)  # 34 x 17 blocks, 248 outputs a block: 16864 bytes
    text = _kernel_text(staged)
    assert staged.grid[:2] == (34, 17) and "_stg[17][248]" in text
    assert "_gpurt_stage(&_stg" in text and "_gpurt_stage_wait();" in text
    assert "_b[8]" not in text  # the batched fold is gone
    assert "_stg[15][124]" in _kernel_text(plan((4099, 8191)))  # float32: 67 x 15
    monkeypatch.setattr(reduction, "FOLD_STAGE_BYTES", 16384)
    assert "_stg[" not in _kernel_text(plan((4099, 8191), BF16))  # 16864 bytes: too many
    monkeypatch.setattr(reduction, "FOLD_STAGE_BYTES", 1 << 20)
    tall = plan((65536, 1023), BF16)
    assert tall.counts > tall.grid[0] and "_stg[" not in _kernel_text(tall)  # a tree
    assert "_stg[" not in _kernel_text(plan((1, 1 << 22), axis=1))  # a row split
    unsplit = plan((1024, 65536))
    assert unsplit.splits == 1 and "_stg[" not in _kernel_text(unsplit)
    doubles = plan((4099, 1001), np.float64)
    assert doubles.splits > 1 and "_stg[" in _kernel_text(doubles)


@pytest.mark.usefixtures("sm90")
def test_early_ticket_only_on_one_level_column_folds(monkeypatch) -> None:
    """FOLD_EARLY: the ticket before the walk, two counters a column block, the folder's
    wait; not on a tree (its tickets count groups) nor a row split."""
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "sum_early_plan")

    def plan(shape, dtype=np.float32, axis=0):
        return r._plan([fake_array(shape, dtype)], [None], axis, False)

    monkeypatch.setattr(reduction, "FOLD_EARLY", True)
    early = plan((4099, 8191), BF16)
    text = _kernel_text(early)
    assert early.counts == 2 * early.grid[0]
    assert text.index(fold_codegen.EARLY_TICKET) < text.index("_gpurt_vec")  # before the walk
    assert fold_codegen.EARLY_WAIT in text and "_gpurt_ticket_acq_rel" not in text
    tall = plan((65536, 1023), BF16)
    assert "_gpurt_ticket = atomicAdd" not in _kernel_text(tall) and tall.counts > tall.grid[0]
    assert "_gpurt_ticket = atomicAdd" not in _kernel_text(plan((1, 1 << 22), axis=1))
    monkeypatch.setattr(reduction, "FOLD_EARLY", False)
    assert plan((4099, 8191), BF16).counts == early.grid[0]


def test_staged_source_copies_then_folds_in_split_order() -> None:
    text = fold_codegen.staged("int", 248, 5, "STORE;\n", 256)
    assert "__shared__ _type_reduce _stg[5][248];" in text
    copy, fold = text.index("_gpurt_stage(&_stg"), text.index("_acc = _gpurt_reduce(_acc")
    assert copy < text.index("_gpurt_stage_wait();") < text.index("__syncthreads();") < fold
    assert "for (int _i = 0; _i < (int)gridDim.y; ++_i)" in text


# ---- GPU ---------------------------------------------------------------------------------------


def poisoned(shape, dtype) -> gpurt.Array:
    dt = np.dtype(dtype)
    return gpurt.asarray(np.full(shape, 77 if dt.kind in "iub" else np.nan, dtype=dt))


@pytest.mark.gpu
@pytest.mark.parametrize("stage, early", [(1 << 15, False), (0, True), (1 << 15, True)],
                         ids=["staged", "early", "both"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.int32, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_fold_variants_match_float64(gpu_state, monkeypatch, dtype, stage, early) -> None:
    """Each variant's folds (aligned, realigned, offset, reversed and keepdims views; sums,
    maxima, a mean's post_map, a two-input dot) against float64 (exact for int32), three
    calls the same bits (the kept counters), and the same bits as the shipped fold where
    one thread takes each output."""
    monkeypatch.setattr(reduction, "FOLD_STAGE_BYTES", stage)
    monkeypatch.setattr(reduction, "FOLD_EARLY", early)
    rng = np.random.default_rng()
    ints = np.dtype(dtype).kind == "i"
    acc = "int32" if ints else "float64" if dtype is np.float64 else "float32"
    name = f"{np.dtype(dtype).name}_{stage}_{early:d}"
    total = gpurt.ReductionKernel("T x", f"{acc} y", "x", "a + b", "y = a", "0",
                                  f"sum_staged_{name}", reduce_type=acc)
    most = gpurt.ReductionKernel("T x", f"{acc} y", "x", "max(a, b)", "y = a",
                                 "-2147483647" if ints else "-3.0e38", f"max_staged_{name}",
                                 reduce_type=acc)
    mean = gpurt.ReductionKernel("T x", f"{acc} y", "x", "a + b",
                                 "y = a / (_in_ind.size() / _out_ind.size())", "0",
                                 f"mean_staged_{name}", reduce_type=acc)
    dot = gpurt.ReductionKernel("T x, T w", f"{acc} y", "x * w", "a + b", "y = a", "0",
                                f"dot_staged_{name}", reduce_type=acc)
    base = (rng.integers(-1000, 1000, (4099, 1040)) if ints else
            rng.standard_normal((4099, 1040))).astype(dtype)
    other = (rng.integers(-3, 4, base.shape) if ints else rng.standard_normal(base.shape))
    dev, dev2 = gpurt.asarray(base), gpurt.asarray(other.astype(dtype))
    ref, ref2 = base.astype(np.float64), other.astype(dtype).astype(np.float64)
    views = [((slice(None), slice(None)), False), ((slice(1, None), slice(3, 1030)), False),
             ((slice(None, None, -1), slice(2, None)), True), ((slice(0, 3001), slice(1, 1034)),
                                                                True)]
    for index, keepdims in views:
        n = ref[index].shape[0]
        cases = [(total, ref[index].sum(0, keepdims=keepdims), (dev[index],)),
                 (most, ref[index].max(0, keepdims=keepdims), (dev[index],)),
                 (dot, (ref[index] * ref2[index]).sum(0, keepdims=keepdims),
                  (dev[index], dev2[index]))]
        if not ints:  # an integer mean truncates
            cases.append((mean, ref[index].mean(0, keepdims=keepdims), (dev[index],)))
        for kernel, want, args in cases:
            got = []
            for _ in range(3):
                out = poisoned(want.shape, acc)
                kernel(*args, out, axis=0, keepdims=keepdims)
                got.append(out.numpy())
            plan = list(kernel._plans.values())[-1]
            text = _kernel_text(plan)
            assert plan.splits > 1 and plan.fold, index
            assert ("_stg[" in text) == bool(stage)
            assert ("_gpurt_ticket = atomicAdd" in text) == early
            if ints:
                np.testing.assert_array_equal(got[0], want.astype(np.int64))
            else:
                scale = 1 if kernel is mean else math.sqrt(n) * 4
                np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5 * scale)
            assert all(np.array_equal(g.view(np.uint8), got[0].view(np.uint8))
                       for g in got[1:])
    if dtype is BF16:  # realigned, 248 outputs a block: a thread an output in both folds
        odd = dev[1:, 3:1030]
        want = total(odd, axis=0).numpy()
        monkeypatch.setattr(reduction, "FOLD_STAGE_BYTES", 0)
        monkeypatch.setattr(reduction, "FOLD_EARLY", False)
        batched = gpurt.ReductionKernel("T x", "float32 y", "x", "a + b", "y = a", "0",
                                        f"sum_shipped_{name}", reduce_type="float32")
        got = batched(odd, axis=0).numpy()
        shipped = _kernel_text(list(batched._plans.values())[-1])
        assert "_stg[" not in shipped and "_gpurt_ticket = atomicAdd" not in shipped
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
