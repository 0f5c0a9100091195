"""gpurt.jiterator: torch.cuda.jiterator's _create_jit_fn and _create_multi_output_jit_fn.
Parsing and plans on any machine (compiled for sm_90, never launched); results against
numpy float64 and torch's own jiterator on a GPU."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401  (fixture)
from gpurt.jiterator import _create_jit_fn, _create_multi_output_jit_fn, function_name

BF16 = np.dtype(ml_dtypes.bfloat16)
AXPY = "template <typename T> T my_axpy(T x, T y, T alpha) { return -x + alpha * y; }"
TWO = ("template <typename T> void sum_diff(T x, T y, T scale, T& s, T& d) "
       "{ s = (x + y) * scale; d = x - y; }")


def test_function_name_is_the_first_template_function() -> None:
    assert function_name(AXPY) == "my_axpy"
    assert function_name(TWO) == "sum_diff"
    assert function_name("template<typename T>\n__device__ T& ref_op(T& x) { return x; }") == \
        "ref_op"
    with pytest.raises(ValueError, match="template function"):
        function_name("float f(float x) { return x; }")


def test_arguments_are_checked_before_any_work() -> None:
    fn = _create_jit_fn(AXPY, alpha=1.0)
    with pytest.raises(TypeError, match="unexpected keyword.*beta"):
        fn(1.0, 2.0, beta=3)
    with pytest.raises(ValueError, match="1 to 8 inputs"):
        fn(*range(9))
    with pytest.raises(TypeError, match="bool, int or float"):
        _create_jit_fn(AXPY, alpha="x")
    with pytest.raises(ValueError, match="num_outputs"):
        _create_multi_output_jit_fn(TWO, num_outputs=0)


@pytest.mark.usefixtures("sm90")
def test_plan_promotes_like_torch() -> None:
    fn = _create_jit_fn(AXPY, alpha=1.0)
    cases = [((np.float16, np.int32), np.float16), ((np.float16, BF16), np.float32),
             ((np.int8, np.uint8), np.int16), ((np.bool_, np.int64), np.int64),
             ((np.float32, np.float64), np.float64)]
    for (a, b), expected in cases:
        plan = fn._plan([fake_array((64,), a), fake_array((64,), b, ptr=1 << 24), 1.0],
                        [None], 2, ["alpha"])
        assert plan.out_dtypes == (np.dtype(expected),)
    scalar = fn._plan([fake_array((64,), np.int32), 0.5, 1.0], [None], 2, ["alpha"])
    assert scalar.out_dtypes == (np.dtype(np.float32),)
    with pytest.raises(ValueError, match="do not broadcast"):
        fn._plan([fake_array((3,)), fake_array((4,)), 1.0], [None], 2, ["alpha"])


@pytest.mark.usefixtures("sm90")
def test_multi_output_plan_and_bad_code() -> None:
    fn = _create_multi_output_jit_fn(TWO, num_outputs=2, scale=2)
    plan = fn._plan([fake_array((5, 7), np.float16), fake_array((7,), np.float16, ptr=1 << 24),
                     2], [None, None], 2, ["scale"])
    assert plan.out_dtypes == (np.dtype(np.float16),) * 2 and plan.shape == (5, 7)
    bad = _create_jit_fn("template <typename T> T oops(T x) { return x +* nothing_here; }")
    with pytest.raises(gpurt.CompileError) as info:
        bad._plan([fake_array((4,))], [None], 1, [])
    assert "nothing_here" in str(info.value)


# ---- GPU ---------------------------------------------------------------------------------------

PAIR_DTYPES = [np.float32, np.float16, BF16, np.float64, np.int8, np.int32, np.int64, np.uint8,
               np.bool_]


def _random(shape, dtype, rng):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(0 if dt.kind == "u" else -9, 10, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


@pytest.mark.gpu
def test_every_dtype_pair_against_numpy_and_torch_promotion(gpu_state) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng()
    fn = _create_jit_fn("template <typename T> T mix(T x, T y) { return x * T(2) + y; }")
    for a, b in itertools.product(PAIR_DTYPES, repeat=2):
        x, y = _random((3, 129), a, rng), _random((129,), b, rng)
        got = fn(gpurt.asarray(x), gpurt.asarray(y))
        tx, ty = torch.from_dlpack(gpurt.asarray(x)), torch.from_dlpack(gpurt.asarray(y))
        expected = torch.result_type(tx, ty)
        assert str(expected) == f"torch.{got.dtype.name}" or (
            expected == torch.bool and got.dtype == np.bool_), (a, b, got.dtype, expected)
        common = got.dtype
        if common == np.bool_:
            want = x.astype(bool) | y.astype(bool)
            np.testing.assert_array_equal(got.numpy(), want)
            continue
        ref = x.astype(common).astype(np.float64) * 2 + y.astype(common).astype(np.float64)
        tol = 2e-2 if common in (np.dtype(np.float16), BF16) else 1e-6
        np.testing.assert_allclose(got.numpy().astype(np.float64), ref, rtol=tol, atol=tol,
                                   err_msg=f"{np.dtype(a).name} x {np.dtype(b).name}")


@pytest.mark.gpu
def test_matches_torch_jiterator_with_scalars_kwargs_views_and_out(gpu_state) -> None:
    torch = pytest.importorskip("torch")
    ours = _create_jit_fn(AXPY, alpha=1.0)
    theirs = torch.cuda.jiterator._create_jit_fn(AXPY, alpha=1.0)
    x = torch.randn(64, 300, device="cuda")
    y = torch.randn(300, device="cuda", dtype=torch.float16)
    for args, kw in [((x, y), {}), ((x, y), {"alpha": 3.5}), ((x.t(), x.t()), {"alpha": -1.0})]:
        got = torch.from_dlpack(ours(*args, **kw))
        torch.testing.assert_close(got, theirs(*args, **kw), rtol=1e-5, atol=1e-5)
    # torch's jiterator takes tensors only; a Python scalar input promotes like torch's ops
    got = torch.from_dlpack(ours(x[:, ::3], 2.0))
    torch.testing.assert_close(got, -x[:, ::3] + 2.0, rtol=1e-5, atol=1e-5)
    half = torch.from_dlpack(ours(y, 2.5, alpha=2.0))
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, -y + 5.0, rtol=1e-2, atol=1e-2)
    out = torch.full((64, 300), float("nan"), device="cuda")
    assert ours(x, y, out=out) is out
    torch.testing.assert_close(out, theirs(x, y), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="float64"):
        ours(x, y, out=torch.empty(64, 300, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        ours(x, y, out=torch.empty(300, device="cuda"))


@pytest.mark.gpu
def test_multi_output_against_numpy(gpu_state) -> None:
    rng = np.random.default_rng()
    fn = _create_multi_output_jit_fn(TWO, num_outputs=2, scale=2)
    x = rng.standard_normal((33, 65)).astype(np.float32)
    y = rng.standard_normal((65,)).astype(np.float32)
    s_out = gpurt.asarray(np.full((33, 65), np.nan, np.float32))
    s, d = fn(gpurt.asarray(x), gpurt.asarray(y), scale=0.5, out=(s_out, None))
    assert s is s_out
    np.testing.assert_allclose(s.numpy(), (x.astype(np.float64) + y) * 0.5, rtol=1e-6)
    np.testing.assert_allclose(d.numpy(), x.astype(np.float64) - y, rtol=1e-6)
    s2, _ = fn(gpurt.asarray(x), 1.0)
    np.testing.assert_allclose(s2.numpy(), (x.astype(np.float64) + 1) * 2, rtol=1e-6)


@pytest.mark.gpu
def test_large_contiguous_and_misaligned(gpu_state) -> None:
    rng = np.random.default_rng()
    fn = _create_jit_fn("template <typename T> T sq(T x) { return x * x; }")
    x = rng.standard_normal(3 * 8192 + 17).astype(np.float16)
    dev = gpurt.asarray(x)
    for view, ref in [(dev, x), (dev[1:], x[1:]), (dev[3:-5], x[3:-5])]:
        got = fn(view).numpy().astype(np.float64)
        np.testing.assert_allclose(got, ref.astype(np.float64) ** 2, rtol=2e-3, atol=1e-3)
