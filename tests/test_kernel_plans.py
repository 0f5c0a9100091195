"""The bundled kernels' per-signature plans (GPU): a repeated call reuses the plan of its
signature and still gives the right answer for new pointers, alpha and beta; checks that
depend on the pointers (overlaps) still run; alignment changes choose anew; clear_plans()
re-reads the settings."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import gpurt
from _kernel_cases import GemmCase, SoftmaxCase, run_gemm, run_softmax

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
softmax_mod = importlib.import_module("gpurt.kernels.softmax")

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh_plans(monkeypatch):
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    gemm_mod.clear_plans()
    softmax_mod.clear_plans()
    yield
    gemm_mod.clear_plans()
    softmax_mod.clear_plans()


def test_repeated_gemm_reuses_its_plan_with_new_data(gpu_state):
    rng = np.random.default_rng(1)
    case = GemmCase(33, 129, 67, "bfloat16", out_layout=(False, 0, 0), alpha=0.5, beta=-1.0,
                    c_is_out=True)
    run_gemm(case, None, rng)
    assert len(gemm_mod._calls) == 1
    for alpha, beta in [(1.0, 0.5), (-2.0, 1.0)]:  # new buffers, alpha and beta: same plan
        run_gemm(GemmCase(**{**case.__dict__, "alpha": alpha, "beta": beta}), None, rng)
    assert len(gemm_mod._calls) == 1
    run_gemm(GemmCase(**{**case.__dict__, "a_layout": (False, 1, 0)}), None, rng)
    assert len(gemm_mod._calls) == 2  # another alignment: another plan


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "tf32"])
def test_repeated_gemm_with_allocated_and_column_major_outputs(gpu_state, dtype):
    rng = np.random.default_rng(2)
    for _ in range(3):
        run_gemm(GemmCase(300, 257, 129, dtype, True, False), None, rng)
        run_gemm(GemmCase(300, 257, 129, dtype, out_layout=(True, 2, 3)), None, rng)
        run_gemm(GemmCase(7, 4099, 1000, dtype), None, rng)  # split-K


def test_cached_plan_still_refuses_overlapping_out(gpu_state):
    a = gpurt.asarray(np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32))
    b = gpurt.asarray(np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32))
    big = gpurt.empty((16, 8))
    gemm_mod.gemm(a, b, out=big[:8])
    with pytest.raises(ValueError, match="overlaps"):
        gemm_mod.gemm(big[:8], b, out=big[:8])  # the planned signature, out over a
    assert len(gemm_mod._calls) == 1


def test_cached_plan_with_c_overlapping_out_copies_c(gpu_state):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.standard_normal((5, 8)).astype(np.float32)
    store = rng.standard_normal((7, 8)).astype(np.float32)
    a, b = gpurt.asarray(x), gpurt.asarray(y)
    gemm_mod.gemm(a, b, out=gpurt.empty((6, 8)), beta=1.0, c=gpurt.asarray(store[1:].copy()))
    assert len(gemm_mod._calls) == 1
    dev = gpurt.asarray(store)
    gemm_mod.gemm(a, b, out=dev[:6], beta=1.0, c=dev[1:])  # c is out one row down
    want = x.astype(np.float64) @ y + store[1:]
    np.testing.assert_allclose(dev.to_numpy()[:6], want, rtol=1e-5, atol=1e-5)


def test_clear_plans_rereads_the_settings(gpu_state, monkeypatch):
    rng = np.random.default_rng(6)
    a = gpurt.asarray(rng.standard_normal((256, 256)).astype(np.float16))
    b = gpurt.asarray(rng.standard_normal((256, 256)).astype(np.float16))
    gemm_mod.gemm(a, b)
    (call, *_), = gemm_mod._calls.values()
    monkeypatch.setenv("GPURT_GEMM_DISABLE", call.config.kernel)
    gemm_mod.gemm(a, b)
    (same, *_), = gemm_mod._calls.values()
    assert same.config == call.config  # settings are read when a plan is made
    gemm_mod.clear_plans()
    gemm_mod.gemm(a, b)
    (new, *_), = gemm_mod._calls.values()
    assert new.config.kernel != call.config.kernel


@pytest.mark.parametrize("m, n, k", [(16, 1000, 4096), (1000, 16, 4096), (8, 72, 64),
                                     (72, 8, 64)])
def test_repeated_skinny_gemm_launches_its_planned_launch_with_new_data(gpu_state, m, n, k,
                                                                         monkeypatch):
    """Both orientations (S = op(a) or op(b)^T) and a K split over a cluster (the first
    shape): the planned launch (Kernel.planned) must put each pointer and scalar in place.
    (These shapes are the decode family's on Hopper: it is turned off here.)"""
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "decode")
    gemm_mod.clear_plans()
    rng = np.random.default_rng(8)
    for alpha in (1.0, 0.5, -1.5):
        run_gemm(GemmCase(m, n, k, "bfloat16", alpha=alpha), None, rng)
    for alpha, beta in [(1.0, 1.0), (0.5, -2.0), (2.0, 0.5)]:
        run_gemm(GemmCase(m, n, k, "bfloat16", out_layout=(False, 0, 0), alpha=alpha,
                          beta=beta, c_is_out=True), None, rng)
    assert len(gemm_mod._calls) == 2
    for call, _, _, planned, _ in gemm_mod._calls.values():
        assert call.config.kernel == "skinny" and planned is not None


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "softmax_backward",
                                "log_softmax_backward"])
def test_repeated_softmax_reuses_its_plan(gpu_state, op):
    rng = np.random.default_rng(7)
    for given_out in (False, True, False):
        run_softmax(SoftmaxCase(op, "float32", 5, 4099, (0, 0, 0), given_out), rng)
        run_softmax(SoftmaxCase(op, "bfloat16", 3, 600001, (0, 0, 0), given_out), rng)
    assert len(softmax_mod._calls) == 4
    run_softmax(SoftmaxCase(op, "float32", 5, 4099, (1, 1, 1), True), rng)
    assert len(softmax_mod._calls) == 5


def test_torch_inputs_through_the_plans(gpu_state):
    torch = pytest.importorskip("torch")
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 1000, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        got = gemm_mod.gemm(a, w)
        out = torch.empty(16, 1000, device="cuda", dtype=torch.bfloat16)
        assert gemm_mod.gemm(a, w, out=out) is out
        probs = softmax_mod.softmax(out)
    want = (a.double() @ w.double())
    assert float((out.double() - want).norm() / want.norm()) < 1e-2
    host = np.asarray(got.to_numpy(), dtype=np.float64)
    assert np.linalg.norm(host - want.cpu().numpy()) / float(want.norm()) < 1e-2
    ref = torch.softmax(out.float(), -1).cpu().numpy()
    assert np.abs(np.asarray(probs.to_numpy(), dtype=np.float64) - ref).max() < 1e-2
