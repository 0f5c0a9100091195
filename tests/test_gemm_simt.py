"""The fp32 SIMT GEMM's session-9 paths: the split-K ending spread over a tile's CTAs (a
cooperative launch, kernels/gemm_simt.cu's splitk_spread) against the last-CTA ending and
float64, in a CUDA graph too; tiles of 3 warp rows (96 or 192 threads: loaders whose copies
do not divide evenly); and the chooser's picks at issue 17's shapes (CPU)."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import gpurt
from test_gemm import (
    _assert_counters_zero,
    check_replays,
    device,
    poisoned,
    rand,
    reference,
    rel_err,
)

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
sms_mod = importlib.import_module("gpurt.kernels._sms")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

# 3 warp rows: 192 threads (8 x 8 and 8 x 16 outputs a thread) and 96 (8 x 16)
THREE_ROWS = [Config("simt", 96, 128, 16, stages=3), Config("simt", 96, 128, 16, 32, 128, stages=3),
              Config("simt", 192, 128, 16, 32, 128, stages=3), tune._SIMT[8]]
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.fixture
def spread_spy(monkeypatch):
    """The cooperative flags of the gemm launches made while it is in use, plans cleared
    before and after (a plan keeps the ending it was made with)."""
    seen: list[bool] = []
    real = gemm_launch._main_config

    def spy(call):
        seen.append(call.spread)
        return real(call)

    monkeypatch.setattr(gemm_launch, "_main_config", spy)
    gemm_mod.clear_plans()
    yield seen
    gemm_mod.clear_plans()


def _operands(rng, m, n, k, trans_a, trans_b, offset):
    """A, B and Cin on the device, as views at an element offset into larger arrays when
    ``offset`` (pitches and bases not 16-byte aligned), with their host copies."""
    pad = 3 if offset else 0
    a = rand(rng, (k, m + pad) if trans_a else (m, k + pad), np.float32)
    b = rand(rng, (n, k + pad) if trans_b else (k, n + pad), np.float32)
    c = rand(rng, (m, n), np.float32)
    a_view, b_view = a[:, pad:], b[:, pad:]
    da, db = device(a), device(b)
    return (da[:, pad:], db[:, pad:], device(c)), (a_view, b_view, c)


def _run(config, dev, host, m, n, trans_a, trans_b):
    out = poisoned((m, n), np.float32)
    gemm_mod.gemm(dev[0], dev[1], out=out, trans_a=trans_a, trans_b=trans_b, alpha=0.75,
                  beta=-1.25, c=dev[2], config=config)
    want = reference(host[0], host[1], trans_a, trans_b, alpha=0.75, beta=-1.25, c=host[2])
    got = out.numpy()
    assert rel_err(got, want) < 1e-5, (config.label(), m, n, trans_a, trans_b)
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("config,m,n,k", [
    (Config("simt", 64, 128, 8, stages=4, split_k=4), 131, 261, 1003),
    (Config("simt", 128, 256, 16, 32, 128, stages=3, split_k=8), 137, 300, 2056),
    (Config("simt", 32, 256, 16, 32, 128, stages=3, split_k=5), 45, 519, 777),
    (Config("simt", 96, 128, 16, stages=3, split_k=3), 200, 130, 520),
    (Config("simt", 64, 64, 8, stages=4, split_k=16), 70, 65, 4096),
    (dataclasses.replace(tune._SIMT[7], split_k=16), 17, 300, 4099),
], ids=lambda v: v.label().replace(" ", "_") if isinstance(v, Config) else str(v))
def test_spread_ending_matches_last_cta_ending(gpu_state, spread_spy, monkeypatch, config, m,
                                               n, k):
    """Both endings of every layout, odd sizes (edge tiles, N % 4 = 1, 2, 3: partial sums
    in rows padded to 4 floats), offset views, alpha/beta/Cin: right against float64, and the
    same bits (both sum the slices in slice order); the spread one really launched
    cooperatively, and the ticket counters are back at zero after each."""
    rng = np.random.default_rng(41)
    for index, (trans_a, trans_b) in enumerate(LAYOUTS):
        dev, host = _operands(rng, m, n, k, trans_a, trans_b, offset=index % 2 == 1)
        got = {}
        for spread in (True, False):
            monkeypatch.setattr(gemm_launch, "SPREAD_SPLIT_K", spread)
            gemm_mod.clear_plans()
            spread_spy.clear()
            got[spread] = _run(config, dev, host, m, n, trans_a, trans_b)
            assert spread_spy and all(spread_spy) if spread else not any(spread_spy), \
                config.label()
            _assert_counters_zero()
        assert got[True].tobytes() == got[False].tobytes(), config.label()


@pytest.mark.gpu
def test_spread_ending_in_a_graph_and_past_one_wave(gpu_state, spread_spy):
    """The cooperative launch captured and replayed on fresh inputs; a grid larger than the
    GPU holds at once takes the last-CTA ending instead (a cooperative launch could not)."""
    rng = np.random.default_rng(43)
    config = Config("simt", 128, 256, 16, 32, 128, stages=3, split_k=8)
    m, n, k = 128, 520, 4096
    a, b = rand(rng, (m, k), np.float32), rand(rng, (k, n), np.float32)
    da, db, out = device(a), device(b), poisoned((m, n), np.float32)
    gemm_mod.gemm(da, db, out=out, config=config)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm_mod.gemm(da, db, out=out, config=config)
    check_replays(graph, da, db, out, rng, config.label(), np.float32, 1e-5)
    del graph
    assert spread_spy and all(spread_spy)
    _assert_counters_zero()
    spread_spy.clear()
    sms = gpurt.get_device_properties().multi_processor_count
    big = dataclasses.replace(config, split_k=2)
    m = 128 * (sms // 2 + 1)  # tiles x 2 slices > the SMs' one CTA each
    a, b = rand(rng, (m, 256), np.float32), rand(rng, (256, 256), np.float32)
    out = poisoned((m, 256), np.float32)
    gemm_mod.gemm(device(a), device(b), out=out, config=big)
    assert rel_err(out.numpy(), reference(a, b)) < 1e-5
    assert not any(spread_spy)
    _assert_counters_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("base", THREE_ROWS, ids=lambda c: c.label().replace(" ", "_"))
def test_three_warp_row_tiles(gpu_state, base):
    """Tiles of 3 warp rows in every layout, edges in M, N and K, offset views (4-byte
    copies), a K shorter than one tile, unsplit and split."""
    rng = np.random.default_rng(47)
    for index, (trans_a, trans_b) in enumerate(LAYOUTS):
        for m, n, k, split in [(2 * base.bm + 37, base.bn + 68, 203, 1),
                               (base.bm - 5, 2 * base.bn + 3, 7, 1),
                               (base.bm + 1, base.bn + 4, 1000, 3)]:
            dev, host = _operands(rng, m, n, k, trans_a, trans_b, offset=index % 2 == 1)
            _run(dataclasses.replace(base, split_k=split), dev, host, m, n, trans_a, trans_b)
    _assert_counters_zero()


class _Affinity:
    """cuCtxGetExecAffinity's answer: (result, param) with param.param.smCount.val."""

    def __init__(self, ok: bool, sms: int) -> None:
        count = type("Count", (), {"val": sms})()
        self.answer = (sms_mod.cu.CUresult.CUDA_SUCCESS if ok
                       else sms_mod.cu.CUresult.CUDA_ERROR_NOT_SUPPORTED,
                       type("Param", (), {"param": type("U", (), {"smCount": count})()})())


@pytest.mark.parametrize("ok, sms, want", [(True, 40, 40), (True, 0, 132), (True, 200, 132),
                                           (False, 40, 132)])
def test_usable_sms_follow_the_contexts_execution_affinity(monkeypatch, ok, sms, want):
    # under MPS with an active thread percentage the context holds fewer SMs than the device:
    # a cooperative launch sized for 132 would be refused, so the spread ending must not count them
    import contextlib

    fake = _Affinity(ok, sms)
    monkeypatch.setattr(sms_mod, "_usable", {})
    monkeypatch.setattr(sms_mod.gpurt, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(sms_mod.cu, "cuCtxGetExecAffinity", lambda kind: fake.answer)
    assert sms_mod.usable_sms(3, 132) == want
    assert sms_mod.usable_sms(3, 132) == want  # cached per device


@pytest.mark.gpu
def test_usable_sms_are_the_devices_without_mps():
    index = gpurt.current_device()
    sms_mod._usable.pop(index, None)
    sms = gpurt.get_device_properties(index).multi_processor_count
    assert sms_mod.usable_sms(index, sms) == sms
