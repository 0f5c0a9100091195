"""Repeated calls of the bundled kernels through gpurt.nvrtc.dispatch (GPU): softmax,
ElementwiseKernel, jiterator and ReductionKernel with torch tensors and gpurt Arrays give the
float64 answer on fresh data at every call once dispatch takes them (no Python plan lookup),
and calls it must not take (another current torch stream, a tensor that needs a gradient)
still go the general way with its results and errors."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import gpurt
from gpurt._launch import path as _launchpath

softmax_mod = importlib.import_module("gpurt.kernels.softmax")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_launchpath.claunch is None, reason="needs the C extension")]
torch = pytest.importorskip("torch")

AXPY = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "dispatch_gpu_axpy")
SUM = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "dispatch_gpu_sum")
JIT = gpurt.jiterator._create_jit_fn(
    "template <typename T> T dispatch_gpu_jaxpy(T x, T y) { return x * T(2) + y; }")


def _softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _poisoned(*shape: int) -> torch.Tensor:
    return torch.full(shape, float("nan"), device="cuda")


def test_softmax_of_torch_tensors_repeats_from_c(gpu_state, monkeypatch):
    softmax_mod.clear_plans()
    x = torch.randn(64, 256, device="cuda")
    softmax_mod.softmax(x)  # plans it
    out = _poisoned(64, 256)
    softmax_mod.softmax(x, out=out)
    calls = []
    monkeypatch.setattr(softmax_mod, "_call", lambda *a: calls.append(a))
    for _ in range(3):
        x = torch.randn(64, 256, device="cuda") * 4
        got = softmax_mod.softmax(x)
        out = _poisoned(64, 256)
        assert softmax_mod.softmax(x, out=out) is out
        want = _softmax64(x.cpu().numpy())
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.cpu().numpy(), want, rtol=1e-5, atol=1e-6)
    assert not calls  # every call was dispatched from C


def test_softmax_backward_and_arrays_repeat_from_c(gpu_state, monkeypatch):
    softmax_mod.clear_plans()
    rng = np.random.default_rng(11)
    y = gpurt.asarray(_softmax64(rng.standard_normal((8, 300))).astype(np.float32))
    softmax_mod.softmax_backward(gpurt.asarray(rng.standard_normal((8, 300), np.float32)), y)
    calls = []
    monkeypatch.setattr(softmax_mod, "_call", lambda *a: calls.append(a))
    for _ in range(2):
        dy = rng.standard_normal((8, 300)).astype(np.float32)
        got = softmax_mod.softmax_backward(gpurt.asarray(dy), y).to_numpy()
        yh = y.to_numpy().astype(np.float64)
        want = yh * (dy - (dy * yh).sum(-1, keepdims=True))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not calls


def test_another_torch_stream_goes_the_general_way(gpu_state):
    softmax_mod.clear_plans()
    x = torch.randn(16, 128, device="cuda")
    softmax_mod.softmax(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.randn(16, 128, device="cuda") * 3  # written on the side stream
        got = softmax_mod.softmax(x)  # ordered after it by the general path
        z = AXPY(x, x)
    np.testing.assert_allclose(got.to_numpy(), _softmax64(x.cpu().numpy()), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(z.to_numpy(), 3 * x.cpu().numpy(), rtol=1e-6)


def test_a_tensor_that_needs_a_gradient_fails_as_before(gpu_state):
    x = torch.randn(4, 8, device="cuda")
    softmax_mod.softmax(x)
    with pytest.raises(Exception, match="grad"):
        softmax_mod.softmax(x.clone().requires_grad_())


@pytest.mark.parametrize("as_torch", [True, False])
def test_elementwise_jiterator_and_reduction_repeat_from_c(gpu_state, as_torch):
    for _ in range(3):
        tx = torch.randn(1000, device="cuda")
        ty = torch.randn(1000, device="cuda")
        tm = torch.randn(32, 1000, device="cuda")
        x, y, m = (tx, ty, tm) if as_torch else (gpurt.asarray(tx), gpurt.asarray(ty),
                                                 gpurt.asarray(tm))
        want = 2 * tx.double().cpu().numpy() + ty.double().cpu().numpy()
        z = _poisoned(1000) if as_torch else gpurt.full((1000,), float("nan"))
        assert AXPY(x, y, z) is z
        host = z.cpu().numpy() if as_torch else z.to_numpy()
        np.testing.assert_allclose(host, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(AXPY(x, y).to_numpy(), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(JIT(x, y).to_numpy(), want, rtol=1e-6, atol=1e-6)
        sums = SUM(m, axis=-1).to_numpy()
        np.testing.assert_allclose(sums, tm.double().cpu().numpy().sum(-1), rtol=1e-5,
                                   atol=1e-4)
    assert len(AXPY._direct) >= 1 and len(JIT._direct) >= 1 and SUM._direct


def _stats_moved(before: dict, after: dict) -> dict:
    """How each statistic moved (peaks aside: they move only past the highest so far)."""
    return {key: after[key] - before[key] for key in after if not key.endswith(".peak")}


def test_outputs_made_in_c_count_as_gpurt_empty(gpu_state, monkeypatch):
    """An output dispatch allocates from C is the Array gpurt.empty makes: the same statistics
    move, on its allocation and on its death, and it holds the float64 answer."""
    softmax_mod.clear_plans()
    rng = np.random.default_rng(5)
    x = gpurt.asarray(rng.standard_normal((48, 200)).astype(np.float32))
    softmax_mod.softmax(x)  # plans it
    calls = []
    monkeypatch.setattr(softmax_mod, "_call", lambda *a: calls.append(a))
    start = gpurt.memory_stats()
    made = gpurt.empty((48, 200))
    grown = gpurt.memory_stats()
    fields = (made.shape, made.strides, made.dtype, made.device, made.stream)
    del made
    freed = gpurt.memory_stats()
    got = softmax_mod.softmax(x)
    assert not calls and type(got) is gpurt.Array and got._owner is None
    assert (got.shape, got.strides, got.dtype, got.device, got.stream) == fields
    assert _stats_moved(freed, gpurt.memory_stats()) == _stats_moved(start, grown)
    np.testing.assert_allclose(got.to_numpy(), _softmax64(x.to_numpy()), rtol=1e-5,
                               atol=1e-6)
    before_free = gpurt.memory_stats()
    del got
    assert _stats_moved(before_free, gpurt.memory_stats()) == _stats_moved(grown, freed)


@pytest.mark.parametrize("view", [lambda t: t, lambda t: t[:, 3:], lambda t: t.t(),
                                  lambda t: t[5]])
def test_asarray_of_a_torch_tensor_read_in_c(gpu_state, view):
    """gpurt.asarray's C reader gives the Array of the Python intake, over the tensor's own
    memory, on gpurt's current stream (a tensor elsewhere goes the Python way, also right)."""
    from gpurt._array import interop
    from gpurt.array import _device_view, _wrap

    t = view(torch.randn(33, 65, device="cuda"))
    gpurt.empty(1)  # this thread's place (current device and stream), which the reader needs
    gpurt.asarray(t)  # the intake meets torch, if it had not yet
    fast, slow = interop.view(t), _device_view(t, None)
    assert fast is not None and fast._owner is t and gpurt.asarray(t).ptr == t.data_ptr()
    for name in ("ptr", "shape", "strides", "dtype", "device", "stream", "_contiguous"):
        assert getattr(fast, name) == getattr(slow, name), name
    np.testing.assert_array_equal(fast.to_numpy(), t.cpu().numpy())
    exported = _wrap(interop.from_dlpack(t, None))  # through a DLPack capsule
    taken = gpurt.from_dlpack(t)  # read in C
    assert taken._owner is t
    for name in ("ptr", "shape", "dtype", "device", "stream", "_contiguous"):
        assert getattr(taken, name) == getattr(exported, name), name
    assert all(a == b for a, b, n in zip(taken.strides, exported.strides, t.shape) if n > 1)
    if gpurt.device_count() > 1:
        other = view(torch.randn(33, 65, device="cuda:1"))
        assert interop.view(other) is None  # not the current device: the Python intake
        array = gpurt.asarray(other)
        assert array.device.index == 1
        np.testing.assert_array_equal(array.to_numpy(), other.cpu().numpy())
