"""The bundled kernels under gpurt.amp.autocast (kernels/_autocast.py): the state's torch
semantics and the dispatch rules on any machine (fake arrays, a recording cast), the
results against torch.autocast's in the same process on a GPU."""

from __future__ import annotations

import importlib
import threading
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401  (fixture)
from gpurt import amp
from gpurt.amp import autocast
from gpurt.kernels import _autocast

gemm_module = importlib.import_module("gpurt.kernels.gemm")  # the package exports the functions
softmax_module = importlib.import_module("gpurt.kernels.softmax")

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)

# ---- the state -------------------------------------------------------------------------------


def test_state_follows_torch_nesting_rules() -> None:
    assert not amp.is_autocast_enabled() and not amp.ANY_ENABLED
    assert amp.get_autocast_dtype() == F16  # torch's default for CUDA
    with autocast(BF16):
        assert amp.ANY_ENABLED and amp.is_autocast_enabled()
        assert not amp.is_autocast_enabled("cpu")
        with autocast():  # dtype=None: the current one
            assert amp.get_autocast_dtype() == BF16
        with autocast(enabled=False):
            assert not amp.is_autocast_enabled() and amp.get_autocast_dtype() == BF16
            with autocast(F16):
                assert amp.is_autocast_enabled() and amp.get_autocast_dtype() == F16
            assert not amp.is_autocast_enabled()
        assert amp.is_autocast_enabled() and amp.get_autocast_dtype() == BF16
    assert not amp.ANY_ENABLED and amp.get_autocast_dtype() == F16
    with autocast(BF16, enabled=False):  # a disabled region still sets the dtype, as torch
        assert not amp.ANY_ENABLED and amp.get_autocast_dtype() == BF16
    with pytest.raises(TypeError, match="bool"):
        autocast(BF16, enabled=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        autocast(np.float64)


def test_cache_enabled_is_saved_and_restored() -> None:
    assert amp.is_autocast_cache_enabled()
    with autocast(BF16, cache_enabled=False):
        assert not amp.is_autocast_cache_enabled()
        with autocast(BF16):  # None: inherits the current setting
            assert not amp.is_autocast_cache_enabled()
        with autocast(BF16, cache_enabled=True):
            assert amp.is_autocast_cache_enabled()
        assert not amp.is_autocast_cache_enabled()
    assert amp.is_autocast_cache_enabled()
    amp.set_autocast_cache_enabled(False)
    try:
        assert not autocast(BF16).cache_enabled
    finally:
        amp.set_autocast_cache_enabled(True)


def test_the_flag_counts_regions_of_all_threads_and_errors_restore() -> None:
    inside, leave = threading.Event(), threading.Event()
    seen: list[bool] = []

    def worker() -> None:
        with autocast(BF16):
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(10)
    # another thread's region sets the flag; this thread's own state stays off
    seen += [amp.ANY_ENABLED, amp.is_autocast_enabled()]
    leave.set()
    thread.join()
    assert seen == [True, False] and not amp.ANY_ENABLED
    with pytest.raises(RuntimeError), autocast(BF16):
        raise RuntimeError("boom")
    assert not amp.ANY_ENABLED and not amp.is_autocast_enabled()

    region = autocast(BF16)

    @region
    def recurse(depth: int) -> list[Any]:  # one instance entered again while inside
        here = [(amp.is_autocast_enabled(), amp.get_autocast_dtype())]
        return here + (recurse(depth - 1) if depth else [])

    assert recurse(2) == [(True, BF16)] * 3
    assert not amp.ANY_ENABLED and amp.get_autocast_dtype() == F16


# ---- dispatch rules (fake arrays) --------------------------------------------------------------


class FakeArray:
    def __init__(self, dtype: Any, name: str = "") -> None:
        self.dtype = np.dtype(dtype)
        self.name = name

    def __repr__(self) -> str:
        return f"FakeArray({self.dtype.name}, {self.name!r})"


@pytest.fixture
def casts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, np.dtype, Any]]:
    """Every cast the dispatch asks for: (source, dtype, stream); the cast returns a new
    FakeArray of that dtype."""
    made: list[tuple[Any, np.dtype, Any]] = []

    def cast(x: Any, dtype: np.dtype, stream: Any = None) -> FakeArray:
        made.append((x, dtype, stream))
        return FakeArray(dtype, f"cast of {x.name}")

    monkeypatch.setattr(_autocast, "cast", cast)
    monkeypatch.setattr(_autocast, "_array",
                        lambda x: x if isinstance(x, FakeArray) else None)
    return made


def test_gemm_inputs_cast_every_eligible_float_to_the_autocast_dtype(casts) -> None:
    a, b, c = FakeArray(F32, "a"), FakeArray(F16, "b"), FakeArray(F32, "c")
    assert _autocast.gemm_inputs(a, b, c, 1.0, None) == (a, b, c)  # outside autocast
    assert casts == []
    with autocast(BF16):
        ca, cb, cc = _autocast.gemm_inputs(a, b, c, 0.5, "s")
        assert [x.dtype for x in (ca, cb, cc)] == [BF16] * 3
        assert casts == [(a, BF16, "s"), (b, BF16, "s"), (c, BF16, "s")]
        casts.clear()
        _, _, unread = _autocast.gemm_inputs(a, b, c, 0.0, None)  # beta == 0: c is not read
        assert unread is c and len(casts) == 2
        casts.clear()
        same = FakeArray(BF16, "bf16")
        wide, ints = FakeArray(np.float64, "f64"), FakeArray(np.int32, "i32")
        host = np.ones((2, 2), np.float32)
        for x in (same, wide, ints, host):  # not eligible, or already there: as given
            assert _autocast.gemm_inputs(x, x, None, 0.0, None)[:2] == (x, x)
        assert casts == []
        with autocast(F16):
            assert _autocast.gemm_inputs(same, a, None, 0.0, None)[0].dtype == F16
        with autocast(enabled=False):
            casts.clear()
            assert _autocast.gemm_inputs(a, b, c, 1.0, None) == (a, b, c)
            assert casts == []


def test_softmax_input_follows_fp32_set_opt_dtype(casts) -> None:
    x16, x32 = FakeArray(BF16, "x16"), FakeArray(F32, "x32")
    assert _autocast.softmax_input(x16, None, None, None) is x16  # outside autocast
    up = _autocast.softmax_input(x16, F32, None, "s")  # dtype=: cast first, as torch
    assert up.dtype == F32 and casts == [(x16, F32, "s")]
    casts.clear()
    with autocast(F16):
        assert _autocast.softmax_input(x16, None, None, None).dtype == F32
        assert _autocast.softmax_input(x32, None, None, None) is x32
        assert _autocast.softmax_input(x16, BF16, None, None) is x16  # dtype= kept
        assert _autocast.softmax_input(x16, None, "out", None) is x16  # out=: no autocast
        assert _autocast.softmax_input(x32, F16, None, None).dtype == F16
        f64 = FakeArray(np.float64, "f64")
        assert _autocast.softmax_input(f64, None, None, None) is f64  # not eligible
    assert [(x.name, dt) for x, dt, _ in casts] == [("x16", F32), ("x32", F16)]
    with pytest.raises(TypeError, match="dtype must be float32, float16 or bfloat16"):
        _autocast.softmax_input(x16, np.float64, None, None)
    assert _autocast.softmax_input(x16, "float32", None, None).dtype == F32  # a name


def test_torch_dtypes_name_softmax_dtype(casts) -> None:
    class TorchDtype:  # matched by name, as gpurt takes torch dtypes everywhere
        def __str__(self) -> str:
            return "torch.float16"

    got = _autocast.softmax_input(FakeArray(BF16, "x"), TorchDtype(), None, None)
    assert got.dtype == F16


class Reached(Exception):
    pass


def test_kernels_reach_the_dispatch_only_when_they_must(monkeypatch) -> None:
    def reached(*args: Any) -> Any:
        raise Reached(args)

    monkeypatch.setattr(_autocast, "gemm_inputs", reached)
    monkeypatch.setattr(_autocast, "softmax_input", reached)
    host = np.ones((2, 2), np.float32)
    for call in (lambda: gemm_module.gemm(host, host),
                 lambda: softmax_module.softmax(host), lambda: softmax_module.log_softmax(host)):
        with pytest.raises(TypeError):  # outside autocast: the kernels' own checks
            call()
        with autocast(BF16), pytest.raises(Reached):
            call()
    with autocast(BF16), pytest.raises(TypeError):  # out=: gemm does not autocast
        gemm_module.gemm(host, host, out=host)
    with pytest.raises(Reached):  # dtype= reaches the dispatch outside autocast too
        softmax_module.softmax(host, dtype=np.float32)


@pytest.mark.parametrize("source", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_the_cast_kernel_compiles_for_every_pair(source, sm90) -> None:
    """The cast is one ElementwiseKernel: every source/target pair, contiguous or a
    transposed view, plans and compiles through NVRTC for sm_90 here."""
    kernel = _autocast.cast_kernel()
    for target in (F32, F16, BF16):
        x = fake_array((300, 260), source)
        view = fake_array((260, 300), source, strides=x.strides[::-1])
        for inp in (x, view):
            out = fake_array(tuple(inp.shape), target, ptr=1 << 26)
            plan = kernel._plan([inp], [out])
            assert plan is not None


# ---- on a GPU, against torch.autocast -------------------------------------------------------


def _torch() -> Any:
    try:
        import torch
    except Exception as exc:  # ImportError, or a torch that fails while importing
        pytest.skip(f"torch does not import here: {exc!r}")
    return torch


def _bf16_close(got: Any, want: Any, torch: Any) -> None:
    """Values within a few units of the 16-bit dtype's last place (both sides rounded the
    same fp32-accumulated sums, perhaps summed in another order)."""
    got = torch.from_dlpack(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    tol = 2e-2 if want.dtype == torch.bfloat16 else 2e-3
    scale = want.double().abs().max().item()
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_gemm_matches_torch_autocast(dtype_name, gpu_state) -> None:
    torch = _torch()
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(20)
    a = torch.randn(96, 200, device="cuda", generator=gen)
    b = torch.randn(120, 200, device="cuda", generator=gen)  # used as b.T: a view
    c = torch.randn(96, 120, device="cuda", generator=gen)
    a16 = a.to(torch.float16)  # held: gpurt's casts read it after this line
    with autocast(getattr(gpurt, dtype_name)):
        ours = gemm_module.gemm(a, b.T)
        ours_addmm = gemm_module.gemm(a, b, trans_b=True, alpha=0.5, beta=2.0, c=c)
        mixed = gemm_module.gemm(a16, b.T)  # fp16 and fp32: both cast
    with torch.autocast("cuda", dtype=dtype):
        theirs = a @ b.T
        theirs_addmm = torch.addmm(c, a, b.T, beta=2.0, alpha=0.5)
        theirs_mixed = a16 @ b.T
    torch.cuda.synchronize()
    _bf16_close(ours, theirs, torch)
    _bf16_close(ours_addmm, theirs_addmm, torch)
    _bf16_close(mixed, theirs_mixed, torch)
    # and against float64 of the rounded inputs
    want = a.to(dtype).double() @ b.to(dtype).double().T
    _bf16_close(ours, want.to(dtype), torch)


@pytest.mark.gpu
def test_gemm_with_out_does_not_autocast(gpu_state) -> None:
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(21)
    a = torch.randn(64, 72, device="cuda", generator=gen)
    b = torch.randn(72, 48, device="cuda", generator=gen)
    out = torch.full((64, 48), float("nan"), device="cuda")
    theirs = torch.full((64, 48), float("nan"), device="cuda")
    with autocast(gpurt.bfloat16):
        result = gemm_module.gemm(a, b, out=out)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.mm(a, b, out=theirs)  # torch: out= variants do not autocast
    torch.cuda.synchronize()
    assert result is out and theirs.dtype == torch.float32
    want = a.double() @ b.double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)  # fp32, not bf16
    torch.testing.assert_close(out, theirs, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_matches_torch_autocast(op, gpu_state) -> None:
    torch = _torch()
    ours_fn = getattr(softmax_module, op)
    theirs_fn = getattr(torch, op)
    gen = torch.Generator(device="cuda").manual_seed(22)
    x = (torch.randn(33, 1000, device="cuda", generator=gen) * 4).to(torch.bfloat16)
    x32 = x.float()  # held: gpurt's cast reads it after this line
    with autocast(gpurt.bfloat16):
        up = ours_fn(x)
        kept = ours_fn(x, dtype=gpurt.bfloat16)
        half = ours_fn(x32, dtype=np.float16)
        cols = ours_fn(x, dim=0)
        same = ours_fn(x32)  # float32 stays float32
    with torch.autocast("cuda", dtype=torch.bfloat16):
        t_up = theirs_fn(x, -1)
        t_kept = theirs_fn(x, -1, dtype=torch.bfloat16)
        t_half = theirs_fn(x32, -1, dtype=torch.float16)
        t_cols = theirs_fn(x, 0)
    torch.cuda.synchronize()
    assert t_up.dtype == torch.float32 and up.dtype == F32
    torch.testing.assert_close(torch.from_dlpack(up), t_up, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_dlpack(cols), t_cols, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_dlpack(same), t_up, rtol=1e-5, atol=1e-5)
    _bf16_close(kept, t_kept, torch)
    _bf16_close(half, t_half, torch)
    want = theirs_fn(x.double(), -1)
    torch.testing.assert_close(torch.from_dlpack(up).double(), want, rtol=1e-5, atol=1e-5)
    out = torch.full_like(x, float("nan"))
    with autocast(gpurt.bfloat16):
        ours_fn(x, out=out)  # out=: no autocast, a bf16 result in out
    torch.cuda.synchronize()
    _bf16_close(out, theirs_fn(x, -1), torch)


@pytest.mark.gpu
def test_casts_are_torchs_and_run_on_the_calls_stream(gpu_state) -> None:
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(23)
    x = torch.randn(300, 257, device="cuda", generator=gen) * 1e3
    for source in (x, x.T, x.to(torch.float16)):  # a transposed view too
        for target, torch_target in ((gpurt.bfloat16, torch.bfloat16), (F16, torch.float16)):
            got = _autocast.cast(gpurt.asarray(source), np.dtype(target))
            torch.cuda.synchronize()
            assert got.is_contiguous()
            assert torch.equal(torch.from_dlpack(got), source.to(torch_target))
    stream = gpurt.Stream()
    a = torch.randn(128, 64, device="cuda", generator=gen)
    b = torch.randn(64, 256, device="cuda", generator=gen)
    torch.cuda.synchronize()
    with autocast(gpurt.bfloat16):
        result = gemm_module.gemm(a, b, stream=stream)
    stream.synchronize()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        theirs = a @ b
    _bf16_close(result, theirs, torch)


@pytest.mark.gpu
def test_autocast_calls_replay_in_a_cuda_graph(gpu_state) -> None:
    """softmax(gemm(x, w)) under autocast, captured: the casts, the bf16 gemm and the fp32
    softmax all replay on new inputs (float64 reference of the bf16-rounded operands)."""
    rng = np.random.default_rng()
    x = gpurt.asarray(rng.standard_normal((64, 256)).astype(np.float32))
    w = gpurt.asarray((rng.standard_normal((256, 128)) / 16).astype(np.float32))
    step = lambda: softmax_module.softmax(gemm_module.gemm(x, w))  # noqa: E731
    with autocast(gpurt.bfloat16):
        step()  # plans, kernels and casts made outside the capture
        g = gpurt.CUDAGraph()
        with gpurt.graph(g):
            y = step()
    assert y.dtype == F32
    for _ in range(2):
        xs = rng.standard_normal((64, 256)).astype(np.float32)
        ws = (rng.standard_normal((256, 128)) / 16).astype(np.float32)
        x.copy_(xs)
        w.copy_(ws)
        g.replay()
        gpurt.synchronize()
        h = xs.astype(BF16).astype(np.float64) @ ws.astype(BF16).astype(np.float64)
        h = h.astype(BF16).astype(np.float64)  # gemm's bf16 result
        e = np.exp(h - h.max(axis=1, keepdims=True))
        np.testing.assert_allclose(y.numpy(), e / e.sum(axis=1, keepdims=True),
                                   rtol=3e-2, atol=1e-6)
