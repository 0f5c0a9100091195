"""gpurt.amp: the per-thread autocast state on any machine; GradScaler's kernels compiled
for sm_90 here and compared with torch's own AMP ops on a GPU."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import gpurt
from gpurt.amp import UPDATE_SOURCE, GradScaler, autocast, unscale_source

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_autocast_nests_restores_and_is_per_thread() -> None:
    assert not gpurt.amp.is_autocast_enabled()
    with autocast(np.float16):
        assert gpurt.amp.is_autocast_enabled()
        assert gpurt.amp.get_autocast_dtype() == np.float16
        seen = []
        worker = threading.Thread(target=lambda: seen.append(gpurt.amp.is_autocast_enabled()))
        worker.start()
        worker.join()
        assert seen == [False]
        with autocast(enabled=False):  # dtype=None: the current one, as torch
            assert not gpurt.amp.is_autocast_enabled()
            assert gpurt.amp.get_autocast_dtype() == np.float16
        assert gpurt.amp.get_autocast_dtype() == np.float16
    with pytest.raises(RuntimeError), autocast(BF16):
        raise RuntimeError("boom")
    assert not gpurt.amp.is_autocast_enabled()

    @autocast(BF16)
    def inside() -> bool:
        return gpurt.amp.is_autocast_enabled()

    assert inside() and not gpurt.amp.is_autocast_enabled()
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        autocast(np.float32)


def test_scaler_kernels_compile_and_options_are_checked() -> None:
    gpurt.compile(UPDATE_SOURCE, arch="sm_90")
    for dtypes in ([np.float32], [np.float16, BF16, np.float64, np.float32]):
        source = unscale_source([np.dtype(d) for d in dtypes])
        gpurt.compile(source, arch="sm_90")
        assert source.count("_unscale(p") == len(dtypes)
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=1.5)
    disabled = GradScaler(enabled=False)
    assert disabled.get_scale() == 1.0 and disabled.scale("anything") == "anything"


@pytest.mark.gpu
def test_unscale_and_update_match_torch(gpu_state) -> None:
    torch = pytest.importorskip("torch")
    grads = [torch.randn(3000, device="cuda") * 1000,
             torch.randn(37, device="cuda", dtype=torch.float16) * 100,
             torch.randn(5000, device="cuda", dtype=torch.bfloat16) * 100,
             torch.randn(1025, device="cuda", dtype=torch.float64) * 1000]
    scaler = GradScaler(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.25,
                        growth_interval=2)
    scale = torch.full((1,), 1024.0, device="cuda")
    tracker = torch.zeros(1, dtype=torch.int32, device="cuda")
    for step in range(6):
        ours = [g.clone() for g in grads]
        theirs = [g.clone() for g in grads]
        if step in (2, 3):
            bad = float("inf") if step == 2 else float("nan")
            for t in (ours[step - 1], theirs[step - 1]):
                t[5] = bad
        found = scaler.unscale_(ours)
        found_t = torch.zeros(1, device="cuda")
        inv = scale.double().reciprocal().float()
        for t in theirs:
            if t.dtype == torch.bfloat16:  # torch's kernel has no bfloat16: its arithmetic
                found_t.fill_(max(float(found_t), float((~t.isfinite()).any())))
                t.copy_((t.float() * inv).to(t.dtype))
            else:
                torch._amp_foreach_non_finite_check_and_unscale_([t], found_t, inv)
        torch.cuda.synchronize()
        assert float(found.numpy()[0]) == float(found_t.item()), step
        for a, b in zip(ours, theirs):
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), (step, a.dtype)
        scaler.update()
        torch._amp_update_scale_(scale, tracker, found_t, 2.0, 0.25, 2)
        torch.cuda.synchronize()
        assert scaler.get_scale() == scale.item(), step
        assert scaler.get_growth_tracker() == tracker.item(), step
        assert scaler.found_inf_value() == 0.0


@pytest.mark.gpu
def test_scale_multiplies_by_the_device_scale(gpu_state) -> None:
    torch = pytest.importorskip("torch")
    scaler = GradScaler(init_scale=8.0)
    loss = torch.randn(17, device="cuda", dtype=torch.float16)
    scaled = scaler.scale(loss)
    torch.testing.assert_close(torch.from_dlpack(scaled), loss * 8.0)
    many = scaler.scale([loss, loss.float()])
    assert isinstance(many, list) and many[1].dtype == np.float32
    scaler.update(new_scale=3.0)
    assert scaler.get_scale() == 3.0
    with pytest.raises(TypeError, match="floating"):
        scaler.unscale_([torch.ones(3, dtype=torch.int32, device="cuda")])
    with pytest.raises(ValueError, match="contiguous"):
        scaler.unscale_([torch.ones(3, 4, device="cuda").t()])
