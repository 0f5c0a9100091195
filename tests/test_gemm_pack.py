"""The packed route (kernels/_gemm_pack.py): operands whose rows TMA cannot read are copied
into 128-byte rows of the stream's workspace, then a TMA kernel runs on the copies. CPU: the
copies' geometry, the cost model's choice, the workspace's scratch. GPU: results against
float64 on poisoned outputs in every layout, offset views, beta, split-K and decode kernels
behind the copies, the planned path, two streams and graph capture."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import pytest

import gpurt
import test_gemm_planned as planned_tests
from test_gemm import check_replays, device, no_tuning, poisoned, rand, reference, rel_err  # noqa: F401
from test_gemm_planned import driver  # noqa: F401  (the fake driver)
from test_launch_fake_driver import fake  # noqa: F401  (the fake driver's)

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
plans = importlib.import_module("gpurt.kernels._gemm_plan")
routes = importlib.import_module("gpurt.kernels._gemm_route")
pack = importlib.import_module("gpurt.kernels._gemm_pack")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
workspace = importlib.import_module("gpurt.kernels._gemm_workspace")
Problem = tune.Problem
BF16, TF32 = tune.DT_BF16, tune.DT_TF32


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    monkeypatch.delenv("GPURT_GEMM_DISABLE", raising=False)


# ---- CPU ---------------------------------------------------------------------------------------


def test_copies_only_what_tma_cannot_read():
    """4099-wide 16-bit rows (8198 bytes) are copied into 8320-byte rows, one copy after the
    other from 128-byte boundaries; aligned operands stay; an unaligned base is copied too;
    a base that is not a whole element from 0 cannot be copied element-wise."""
    a = (0x1000, 4099, True, 4099, 4099)  # (ptr, ld, kmajor, rows, k): row-major 4099 x 4099
    b = (0x9000000, 4099, False, 4099, 4099)
    first, second = pack.copies_for([a, b], 2)
    assert (first.which, first.offset, first.width, first.rows, first.src_ld, first.pitch) == \
        (0, 0, 4099, 4099, 4099, 4160)
    assert second.which == 1 and second.offset == 4160 * 2 * 4099 and second.offset % 128 == 0
    assert pack.scratch_bytes((first, second), 2) == second.offset + 4160 * 2 * 4099
    aligned = (0x1000, 4096, True, 4099, 4096)
    assert pack.copies_for([aligned, (0x2000, 4096, False, 4096, 4096)], 2) == ()
    (only,) = pack.copies_for([aligned, (0x2000, 4099, False, 4096, 4096)], 2)
    assert (only.which, only.offset, only.width, only.rows) == (1, 0, 4096, 4096)
    (m_major,) = pack.copies_for([(0x1000, 300, False, 300, 70), (0x80, 64, True, 9, 64)], 2)
    assert (m_major.width, m_major.rows, m_major.pitch) == (300, 70, 320)
    (offset,) = pack.copies_for([(0x1002, 4096, True, 10, 4095), (0x80, 64, True, 9, 64)], 2)
    assert offset.which == 0 and offset.src_ld == 4096 and offset.pitch == 4096
    assert pack.copies_for([(0x1001, 4099, True, 10, 10), (0x80, 64, True, 9, 64)], 2) == ()
    (fp32,) = pack.copies_for([(0x1004, 4099, True, 10, 4099), (0x80, 64, True, 9, 64)], 4)
    assert fp32.pitch == 4128 and fp32.pitch * 4 % 128 == 0


def test_the_packed_plan_reads_the_copies():
    """Each copied operand becomes its copy (no array, a 128-byte aligned placeholder at its
    offset, the copy's pitch, the same layout); the other stays as it was."""
    a = plans.Operand("a", 0x1002, 4099, True)
    b = plans.Operand("b", 0x2000, 4096, False)
    plan = plans.Plan(a, b, 4099, 4096, 4099, "out", 4096, None, 0, BF16, 0)
    copies = pack.copies_for([(a.ptr, a.ld, a.kmajor, 4099, 4099),
                              (b.ptr, b.ld, b.kmajor, 4096, 4099)], 2)
    packed = pack.packed_plan(plan, copies)
    assert packed.b is b and plan.a is a  # the plan itself is left alone
    assert (packed.a.array, packed.a.ptr, packed.a.ld, packed.a.kmajor) == \
        (None, pack.PLACEHOLDER, 4160, True)
    assert packed.a.ptr % 128 == 0 and (packed.m, packed.n, packed.k) == (4099, 4096, 4099)


def _problems(m: int, n: int, k: int, dt: int = BF16) -> tuple[Any, Any]:
    """(the problem on unaligned rows, the same on packed ones), an H100."""
    split = Problem(m, n, k, dt, True, False, False, False, (9, 0), 132, pitch128=False)
    return split, dataclasses.replace(split, vec=True, tma=True, pitch128=True)


def _pays(m: int, n: int, k: int, dt: int = BF16) -> bool:
    split, packed = _problems(m, n, k, dt)
    itemsize = 4 if dt == TF32 else 2
    copies = pack.copies_for([(itemsize, k, True, m, k), (itemsize, n, False, n, k)], itemsize)
    return pack.pays(tune.heuristic(split), split, tune.heuristic(packed), packed, copies)


@pytest.mark.parametrize("dims,dt,expected", [
    ((4099, 4099, 4099), BF16, True), ((4099, 4099, 4099), TF32, True),
    ((4096, 4099, 4096), BF16, True), ((4096, 4096, 4099), BF16, True),
    ((2053, 3001, 1999), BF16, True), ((2053, 3001, 1999), TF32, True),
    ((1031, 1029, 1027), BF16, True), ((512, 4099, 4099), BF16, True),
    # decode shapes (an H100, session 8 padc): split-K mma on the rows as they are beats the
    # copies + decode up to M = 16 (37.4 against 40.3 us at M = 1, 42.6 against 43.9 at 16);
    # from M = 64 the copies win (43.8 against 65.7; 128: 46.0 against 131; TF32 64: 87.4
    # against 92.9, 128: 89.1 against 233)
    ((1, 4099, 4099), BF16, False), ((8, 4099, 4099), BF16, False),
    ((16, 4099, 4099), BF16, False), ((64, 4099, 4099), BF16, True),
    ((128, 4099, 4099), BF16, True), ((64, 4099, 4099), TF32, True),
    ((128, 4099, 4099), TF32, True),
    ((1, 4099, 4099), TF32, False), ((16, 4099, 4099), TF32, False),  # no TMA kernel for them
    ((127, 257, 61), BF16, False), ((127, 257, 61), TF32, False),  # the copy launch costs more
    ((130, 150, 77), BF16, False), ((300, 8, 700), BF16, False), ((8, 1000, 3000), BF16, False),
    ((16, 256, 8192), BF16, False),
])
def test_the_cost_model_packs_big_problems_only(dims, dt, expected):
    assert _pays(*dims, dt) is expected


def test_the_model_charges_each_family():
    """Skinny streams the big operand (at 0.7 TB/s on split rows, near copy speed on 16-byte
    rows), split-K mma at 0.9 TB/s there before its math, and so is the heuristic's choice
    on split rows; an mma grid of few CTAs runs below the device's rate; no copies or no TMA
    kernel behind them: no packed route."""
    split, packed = _problems(16, 4099, 4099)
    skinny = tune._skinny_config(tune._skinny.heuristic(split))
    on_split = pack.estimate_us(skinny, split)
    assert 40 < on_split < 60  # 46.7-51.1 us measured on an H100
    assert pack.estimate_us(skinny, dataclasses.replace(split, vec=True)) < on_split / 3
    mma = tune.heuristic(split)
    assert mma.kernel == "mma" and mma.split_k > 1
    assert 38 < pack.estimate_us(mma, split) < 46  # 42.6 us measured
    assert tune.heuristic(dataclasses.replace(split, vec=True, tma=False)).kernel == "skinny"
    few, many = _problems(128, 4099, 4099)[0], _problems(4099, 4099, 4099)[0]
    mma_few, mma_many = tune.heuristic(few), tune.heuristic(many)
    rate = [2 * p.macs / pack.estimate_us(c, p) for c, p in ((mma_few, few), (mma_many, many))]
    assert rate[0] < rate[1] / 3  # 17 against 114 TFLOP/s measured
    copies = pack.copies_for([(2, 4099, True, 16, 4099), (2, 4099, False, 4099, 4099)], 2)
    assert pack.pays(skinny, split, tune.heuristic(packed), packed, copies)
    assert not pack.pays(mma, split, tune.heuristic(packed), packed, copies)
    assert not pack.pays(skinny, split, mma_many, packed, copies)  # no TMA kernel behind
    assert not pack.pays(skinny, split, tune.heuristic(packed), packed, ())
    assert pack.estimate_us(tune.heuristic(dataclasses.replace(split, dt=tune.DT_F32)),
                            split) is None  # exact fp32: simt, no TMA kernel to copy for


def test_a_small_a_alone_is_copied():
    """M x 4096 x 4099 bf16 (A's rows split, the weight's aligned): copying A costs a few
    us and decode then runs at full speed (22 us against 41-44 for split-K mma at M = 2..16,
    an H100), so the route is taken."""
    for m in (2, 16, 128):
        split = Problem(m, 4096, 4099, BF16, True, False, False, False, (9, 0), 132,
                        pitch128=False)
        packed = dataclasses.replace(split, vec=True, tma=True)
        copies = pack.copies_for([(2, 4099, True, m, 4099), (0x1000, 4096, False, 4096, 4099)],
                                 2)
        assert [c.which for c in copies] == [0]
        assert pack.pays(tune.heuristic(split), split, tune.heuristic(packed), packed, copies)


@pytest.mark.parametrize("packed_ms,plain_ms,expected", [
    (0.038, 0.086, False),  # 29x11003x4099 bf16 (an H100): 38 + 75 us of copies against 86
    (0.015, 0.099, True),   # 97x4093x4099's shape of times: the copies pay
    (None, 0.086, None), (0.038, None, None),  # a route without a time: the cost model's
])
def test_the_route_follows_the_tuners_times(monkeypatch, packed_ms, plain_ms, expected):
    """Where the tuner has times for both routes, the packed kernel plus the copies' modelled
    time (here 3 + 72 us for B's 4099 x 11003 bf16) is weighed against the problem's own
    best, whatever the cost model would say."""
    choosing = importlib.import_module("gpurt.kernels._gemm_choose")
    split, packed = _problems(29, 11003, 4099)
    copies = pack.copies_for([(2, 4099, True, 29, 4099), (2, 11003, False, 11003, 4099)], 2)
    assert 70 < pack.copy_us(copies, 2) < 80
    configs = {False: tune.heuristic(split), True: tune.heuristic(packed)}
    times = {False: plain_ms, True: packed_ms}
    monkeypatch.setattr(choosing, "choose", lambda plan, problem, *args: configs[problem.tma])
    monkeypatch.setattr(choosing, "timed_ms", lambda index, problem: times[problem.tma])
    plan = dataclasses.make_dataclass("Plan", ["index", "itemsize"])(0, 2)
    got = routes._timed_route(plan, split, None, packed, copies, None)
    assert got == (None if expected is None else (expected, configs[expected]))


def test_the_copy_kernel_is_among_the_prebuilt_programs():
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    found = [p for p in launch.programs("sm_90a") if p[0] == pack.SOURCE]
    assert found == [(pack.SOURCE, ("gemm_pack<unsigned short>",), "sm_90"),
                     (pack.SOURCE, ("gemm_pack<unsigned int>",), "sm_90")]
    assert not any(p[0] == pack.SOURCE for p in launch.programs("sm_80"))


@pytest.mark.parametrize("config,copy_ab,copy_c", [
    (planned_tests.CONFIGS[2], True, False), (planned_tests.CONFIGS[3], True, False),
    (planned_tests.CONFIGS[2], True, True), (planned_tests.CONFIGS[3], False, True)],
    ids=["wgmma", "wgmma-split2", "wgmma-AB-C", "wgmma-split2-C"])
def test_planned_packed_launches_what_packed_call_launch_does(
        driver: Any, config: Any, copy_ab: bool, copy_c: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """On the fake driver: each planned packed call hands the driver the copy launch (both
    operands, the stream's scratch as their target), the GEMM kernel on the copies (into
    the scratch's C where C is copied back) and C's copy back, exactly as PackedCall.launch
    does; split-K's partials come from the same workspace."""
    m, n, k = planned_tests.M, planned_tests.N, planned_tests.K
    copies = pack.copies_for([(0x1000002, k + 1, True, m, k), (0x2000002, n + 3, False, n, k)],
                             2) if copy_ab else ()
    assert [(c.width, c.pitch) for c in copies] == ([(k, k), (n, n)] if copy_ab else [])
    c_copy = pack.c_copy_for(0x3000002, n + 1, m, n, 2, pack.scratch_bytes(copies, 2)) \
        if copy_c else None
    packed = planned_tests._Plan(planned_tests._Op(k, True), planned_tests._Op(n, False))
    if c_copy is not None:
        assert (c_copy.width, c_copy.rows, c_copy.src_ld, c_copy.pitch) == (n, m, n + 1, n)
        packed.ldc = c_copy.pitch
    problem = Problem(m, n, k, tune.DT_F16, True, False, True, True, (9, 0), 132)
    inner = planned_tests.launch_mod.make_call(packed, problem, config, 0x3000000)
    kernel = planned_tests.launch_mod.compile_kernels(pack.SOURCE, ("gemm_pack<unsigned short>",),
                                                      "sm_90")[0]
    everything = copies + ((c_copy,) if c_copy else ())
    call = pack.PackedCall(inner, copies, kernel, pack.copy_grid(copies, 132),
                           pack.scratch_bytes(everything, 2), m, n, c_copy=c_copy,
                           c_grid=pack.copy_grid(everything[-1:], 132))
    planned_tests._layouts(driver, inner.kernels + (kernel,))
    rooms: list[int] = []
    counters = inner.counters if config.split_k > 1 else 0

    def taken(index: int, handle: Any, partials: int, tickets: int, scratch: int) -> Any:
        assert (index, scratch) == (0, call.scratch)
        want = (workspace.partials_for(config.split_k, m, n), counters) if counters else (0, 0)
        assert (partials, tickets) == want
        rooms.append(0x9000000 + 0x1000000 * (len(rooms) % 3))
        return workspace.Workspace((), rooms[-1] + 0x800000, rooms[-1], tickets, partials,
                                   rooms[-1] + 0x400000, scratch)

    monkeypatch.setattr(workspace, "take", taken)
    pointers = [(0x1000002 + 0x100000 * i, 0x2000002 + 0x100000 * i, 0x3000002 + 0x100 * i,
                 0x3000002 if i == 1 else 0) for i in range(3)]
    planned = pack.planned_packed(call, *pointers[0])
    for a, b, out, cin in pointers:
        planned(None, a, b, out, cin, 1.5, 0.0 if cin == 0 else -0.5)
    got = list(driver.launches)
    driver.launches.clear()
    rooms.clear()
    for a, b, out, cin in pointers:
        call.launch(a, b, out, cin, 1.5, 0.0 if cin == 0 else -0.5, None)
    per_call = int(copy_ab) + 1 + int(copy_c)
    assert got == driver.launches and len(got) == per_call * len(pointers)
    assert call.label().endswith("pack" + ("AB" if copy_ab else "") + ("C" if copy_c else ""))


def test_c_is_copied_where_its_stores_would_cost_more():
    """C's rows that TMA cannot write (4099 bf16 = 8198 bytes) go to 128-byte rows after the
    operands' copies and are copied back, where the wgmma kernel's element-wise stores into
    them would cost more than the copy (an H100 saved 29-74 us at 4099^2 C, 19 at
    2053 x 3001, 1.7 at 1031 x 1029: under the 2 us the model asks for); small C, aligned C
    and kernels other than wgmma keep writing C directly."""
    wgmma = tune._WGMMA[0]
    c_copy = pack.c_copy_for(0x3000000, 4099, 4096, 4099, 2, 1000)
    assert (c_copy.which, c_copy.offset, c_copy.width, c_copy.rows, c_copy.src_ld,
            c_copy.pitch) == (2, 1024, 4099, 4096, 4099, 4160)
    assert pack.c_pays(wgmma, c_copy, 0x3000000, 2)
    assert pack.copy_us((c_copy,), 2) < 35  # ~27 us of copy for ~140 saved
    assert pack.c_copy_for(0x3000000, 4096, 4096, 4099, 2, 0) is None  # TMA-ready rows
    assert pack.c_copy_for(0x3000001, 4096, 4096, 4099, 2, 0) is None  # not whole elements
    assert not pack.c_pays(tune._MMA[0], c_copy, 0x3000000, 2)
    assert not pack.c_pays(wgmma, None, 0x3000000, 2)
    small = pack.c_copy_for(0x3000000, 261, 133, 261, 2, 0)
    assert not pack.c_pays(wgmma, small, 0x3000000, 2)
    middle = pack.c_copy_for(0x3000000, 1029, 1031, 1029, 2, 0)
    assert not pack.c_pays(wgmma, middle, 0x3000000, 2)
    assert pack.c_pays(wgmma, pack.c_copy_for(0x3000000, 3001, 2053, 3001, 2, 0), 0x3000000, 2)
    paired = pack.c_copy_for(0x3000000, 4098, 4096, 4098, 2, 0)  # 8196-byte rows
    assert pack.c_pays(wgmma, paired, 0x3000000, 2)  # saved 17.5 us on an H100
    tf32 = pack.c_copy_for(0x3000000, 4099, 4096, 4099, 4, 0)
    assert pack.c_pays(tune._WGMMA_TF32[0], tf32, 0x3000000, 4)  # saved 7.2 us


# ---- GPU -----------------------------------------------------------------------------------------

TOL = {"bfloat16": 1e-2, "float16": 5e-3, "float32": 5e-3}


def _hopper() -> None:
    if gpurt.get_device_capability() != (9, 0):
        pytest.skip("the packed route runs TMA kernels: sm_90 only")


def _operand(rng, rows: int, cols: int, dtype: Any, offset: int) -> tuple[Any, Any]:
    """(host values, a device view of them ``offset`` elements into rows one longer)."""
    host = rand(rng, (rows, cols), dtype)
    if not offset:
        return host, device(host)
    wide = np.zeros((rows, cols + offset), dtype=host.dtype)
    wide[:, offset:] = host
    return host, device(wide)[:, offset:]


def _check(rng, m, n, k, dtype, trans_a, trans_b, config=None, offset=0, beta=0.0, tf32=False):
    a, da = _operand(rng, k if trans_a else m, m if trans_a else k, dtype, offset)
    b, db = _operand(rng, n if trans_b else k, k if trans_b else n, dtype, offset)
    c = rand(rng, (m, n), dtype)
    for _ in range(2):  # the first call plans, the second runs the planned launches
        out = device(c) if beta else poisoned((m, n), dtype)
        gemm_mod.gemm(da, db, out=out, beta=beta, trans_a=trans_a, trans_b=trans_b,
                      config=config, allow_tf32=tf32)
        want = reference(a, b, trans_a, trans_b, beta=beta, c=c)
        err = rel_err(out.numpy(), want)
        assert err < TOL[np.dtype(dtype).name], (m, n, k, trans_a, trans_b, config, err)


def _plans() -> list[Any]:
    """The calls gemm has planned (Call or PackedCall)."""
    return [entry[0] for entry in gemm_mod._calls.values()]


LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32], ids=["16-bit", "32-bit"])
def test_the_copy_kernel_moves_rows_of_any_alignment(gpu_state, dtype):
    """gemm_pack on its own: rows of every width around a 16-byte chunk's edges, starting at
    every element of a block, pitches odd and even, into 128-byte-pitched rows (16-byte
    chunks) and back into rows of the source's alignment (16-byte chunks where that is
    aligned, else element by element): the rows exact, nothing written past them."""
    itemsize = np.dtype(dtype).itemsize
    per = 16 // itemsize
    kernel = pack.copy_kernel(tune.DT_F32 if itemsize == 4 else BF16, 0)
    rng = np.random.default_rng(5)
    for width in (1, per - 1, per, per + 1, 3 * per + 1, 61, 64, 257):
        for shift in range(per):
            rows, ld = 37, width + shift + 3
            host = rng.integers(1, 1 << (8 * itemsize - 1), size=(rows + 1) * ld + per,
                                dtype=dtype)
            src = gpurt.asarray(host)
            pitch = -(-width * itemsize // 128) * 128 // itemsize
            dst = gpurt.asarray(np.zeros(rows * pitch, dtype=dtype))
            back = gpurt.asarray(np.zeros((rows + 1) * ld + per, dtype=dtype))
            copy = pack.PackCopy(0, 0, width, rows, ld, pitch)
            args, _, _ = pack.copy_arguments((copy,), src.ptr + shift * itemsize, 0, dst.ptr)
            kernel(pack.copy_grid((copy,), 132), 256, args)
            back_args = pack.copy_back_arguments(
                pack.PackCopy(2, 0, width, rows, ld, pitch), dst.ptr,
                back.ptr + shift * itemsize)
            kernel(pack.copy_grid((copy,), 132), 256, back_args)
            gpurt.synchronize()
            want = host[shift:shift + rows * ld].reshape(rows, ld)[:, :width]
            got = dst.numpy().reshape(rows, pitch)
            assert np.array_equal(got[:, :width], want), (width, shift)
            assert not got[:, width:].any(), (width, shift)
            again = back.numpy()[shift:shift + rows * ld].reshape(rows, ld)
            assert np.array_equal(again[:, :width], want) and not again[:, width:].any()
            assert not back.numpy()[:shift].any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gpurt.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_forced_tma_configs_run_on_copies(gpu_state, no_tuning, dtype):
    """A TMA config forced on rows TMA cannot read runs on copies: every layout, odd edges,
    a K tail, views one element into their rows (unaligned bases), beta with C in, the TMA
    and plain-store epilogues (C's rows are unaligned too: plain stores)."""
    _hopper()
    rng = np.random.default_rng(41)
    for config in (tune._WGMMA[5], tune._WGMMA[0]):
        for trans_a, trans_b in LAYOUTS:
            _check(rng, 133, 261, 203, dtype, trans_a, trans_b, config)
            _check(rng, 130, 99, 77, dtype, trans_a, trans_b, config, offset=1, beta=0.5)
    labels = {routes.label(call) for call in _plans()}
    assert any(label.endswith("packAB") for label in labels), labels


@pytest.mark.gpu
def test_tf32_configs_run_on_copies(gpu_state, no_tuning):
    """TF32's wgmma (one operand K-major; B N-major turns the product around) on copies."""
    _hopper()
    rng = np.random.default_rng(43)
    for config in (tune._WGMMA_TF32[0], tune._WGMMA_TF32[3]):
        for trans_a, trans_b in LAYOUTS:
            if trans_a and not trans_b:  # neither operand K-major: no TF32 wgmma
                continue
            _check(rng, 133, 261, 203, np.float32, trans_a, trans_b, config, tf32=True)
            _check(rng, 70, 300, 99, np.float32, trans_a, trans_b, config, offset=1,
                   beta=-1.0, tf32=True)


@pytest.mark.gpu
def test_split_k_and_decode_behind_the_copies(gpu_state, no_tuning):
    """The split-K wgmma kernel (its partials and counters from the same workspace as the
    copies) and the decode kernel run on copies too."""
    _hopper()
    rng = np.random.default_rng(47)
    split = dataclasses.replace(tune._WGMMA[1], split_k=3)
    for trans_a, trans_b in LAYOUTS:
        _check(rng, 136, 264, 1027, gpurt.bfloat16, trans_a, trans_b, split)
    aligned = gemm_mod.gemm_eligible_configs(gpurt.empty((64, 1024), dtype=gpurt.bfloat16),
                                             gpurt.empty((1024, 2048), dtype=gpurt.bfloat16))
    decode = next(c for c in aligned if c.kernel == "decode")
    _check(rng, 64, 2051, 1027, gpurt.bfloat16, False, False, decode)
    _check(rng, 64, 2051, 1027, gpurt.bfloat16, False, True, decode, beta=1.0)


@pytest.mark.gpu
def test_gemm_takes_the_packed_route_where_it_pays(gpu_state, no_tuning):
    """1031 x 1029 x 1027 bf16 (rows of 2054 and 2058 bytes: not 16-byte multiples) runs on
    copies by itself, in every layout; gemm_config says which kernel; 127 x 257 x 61 keeps
    the mma path; GPURT_GEMM_DISABLE=pack turns the route off."""
    _hopper()
    rng = np.random.default_rng(53)
    for trans_a, trans_b in LAYOUTS:
        gemm_mod.clear_plans()
        _check(rng, 1031, 1029, 1027, gpurt.bfloat16, trans_a, trans_b)
        (call,) = _plans()
        assert isinstance(call, pack.PackedCall) and call.config.kernel == "wgmma"
    a = device(rand(rng, (1031, 1027), gpurt.bfloat16))
    b = device(rand(rng, (1027, 1029), gpurt.bfloat16))
    assert gemm_mod.gemm_config(a, b).kernel == "wgmma"
    copied = [c for c in gemm_mod.gemm_eligible_configs(a, b) if c.kernel == "wgmma"]
    assert len(copied) == 1  # the one TMA config offered on copies (property tests, sweep)
    _check(rng, 131, 129, 127, gpurt.bfloat16, True, False, copied[0], offset=1, beta=0.5)
    gemm_mod.clear_plans()
    _check(rng, 127, 257, 61, gpurt.bfloat16, False, False)
    (call,) = _plans()
    assert not isinstance(call, pack.PackedCall)


@pytest.mark.gpu
def test_the_switch_turns_the_route_off(gpu_state, no_tuning, monkeypatch):
    _hopper()
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "pack")
    gemm_mod.clear_plans()
    rng = np.random.default_rng(59)
    _check(rng, 1031, 1029, 1027, gpurt.bfloat16, False, False)
    (call,) = _plans()
    assert not isinstance(call, pack.PackedCall) and call.config.kernel == "mma"
    gemm_mod.clear_plans()


@pytest.mark.gpu
def test_copies_on_two_streams_in_memory_stats_and_in_a_graph(gpu_state, no_tuning):
    """Each stream keeps its own scratch (in memory_stats, reused call after call, dropped by
    clear_plans); a capturing stream copies into the graph's own memory per call, so each
    replay reads the inputs as they are then."""
    _hopper()
    rng = np.random.default_rng(61)
    m, n, k = 1031, 1029, 1027
    gemm_mod.clear_plans()
    streams = [gpurt.Stream(), gpurt.Stream()]
    pairs = [(rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16))
             for _ in streams]
    operands = [(device(a), device(b)) for a, b in pairs]
    gpurt.synchronize()
    before = gpurt.memory_allocated()
    kept = []
    for _ in range(2):
        outs = [poisoned((m, n), gpurt.bfloat16) for _ in streams]
        gpurt.synchronize()
        for (da, db), out, stream in zip(operands, outs, streams):
            gemm_mod.gemm(da, db, out=out, stream=stream)
        gpurt.synchronize()
        for (a, b), out in zip(pairs, outs):
            assert rel_err(out.numpy(), reference(a, b)) < 1e-2
        kept.append(workspace.kept_bytes())
    scratch = (m + k) * 1088 * 2  # A's m rows and B's k rows, 1088-element pitches
    assert kept[0] == kept[1] >= 2 * scratch  # the second round reused each stream's scratch
    assert gpurt.memory_allocated() - before >= kept[1]  # in memory_stats
    da, db = operands[0]
    out = poisoned((m, n), gpurt.bfloat16)
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=streams[0]):
        gemm_mod.gemm(da, db, out=out, stream=streams[0])
    check_replays(graph, da, db, out, rng)
    del graph
    gemm_mod.clear_plans()
    assert workspace.kept_bytes() == 0


@pytest.mark.gpu
def test_tf32_without_out_keeps_cs_shape(gpu_state, no_tuning):
    """The second call of a signature makes its output from the plan: (M x N) also where the
    TF32 wgmma kernel computes C^T = B^T A^T (an N-major B), on copies or not."""
    _hopper()
    rng = np.random.default_rng(67)
    for m, n, k in ((300, 400, 500), (1031, 1029, 1027)):  # aligned rows; rows to copy
        a, b = rand(rng, (m, k), np.float32), rand(rng, (k, n), np.float32)
        for _ in range(2):
            out = gemm_mod.gemm(device(a), device(b), allow_tf32=True)
            assert out.shape == (m, n)
            assert rel_err(out.numpy(), reference(a, b)) < 5e-3


# ---- C copied back (C's rows that TMA cannot write) ----------------------------------------------


def _check_c(rng, m, n, k, dtype, trans_a=False, trans_b=False, *, beta=0.0, out_offset=0,
             out_t=False, in_place=True, config=None, tf32=False):
    """gemm into an output whose rows TMA cannot write: ``out_offset`` elements into rows
    two elements longer (an odd pitch for odd N; the columns around it must keep their
    values), or column-major
    (``out_t``); beta with c = out (``in_place``) or a separate c. Returns the planned call."""
    a, b = rand(rng, (k, m) if trans_a else (m, k), dtype), rand(rng, (n, k) if trans_b else
                                                                 (k, n), dtype)
    c = rand(rng, (m, n), dtype)
    shape = (n, m) if out_t else (m, n)
    wide_host = rand(rng, (shape[0], shape[1] + 2 + out_offset), dtype)
    for _ in range(2):  # the first call plans, the second runs the planned launches
        wide = device(wide_host)
        if not beta:  # poison what gemm writes
            view = wide[:, out_offset:out_offset + shape[1]]
            view.copy_(poisoned(shape, dtype))
        out = wide[:, out_offset:out_offset + shape[1]]
        out = out.T if out_t else out
        if beta:
            out.copy_(device(c))
        given_c = None if in_place else device(c)
        gemm_mod.gemm(device(a), device(b), out=out, beta=beta, c=given_c, trans_a=trans_a,
                      trans_b=trans_b, config=config, allow_tf32=tf32)
        want = reference(a, b, trans_a, trans_b, beta=beta, c=c)
        got = out.numpy()
        err = rel_err(got, want)
        assert err < TOL[np.dtype(dtype).name], (m, n, k, trans_a, trans_b, beta, err)
        rest = wide.numpy().astype(np.float64)
        keep = np.ones(rest.shape, dtype=bool)
        keep[:, out_offset:out_offset + shape[1]] = False
        np.testing.assert_array_equal(rest[keep], wide_host.astype(np.float64)[keep])
    (call,) = _plans()
    gemm_mod.clear_plans()
    return call


def _copies_c(call: Any) -> bool:
    return isinstance(call, pack.PackedCall) and call.c_copy is not None


def _always_copy_c(monkeypatch) -> None:
    """C copied back wherever it can be (the model's choice is pinned by the CPU tests; at
    1031 x 1029 it saves 1.7 us, under the model's 2 us minimum)."""
    monkeypatch.setattr(pack, "c_pays", lambda config, c_copy, *args: c_copy is not None
                        and config.kernel == "wgmma")
    gemm_mod.clear_plans()


@pytest.fixture
def copy_c(monkeypatch):
    _always_copy_c(monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gpurt.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_c_is_copied_back_in_every_layout(gpu_state, no_tuning, copy_c, dtype):
    """1031 x 1029 x 1027 (A, B and C on rows TMA cannot use): the kernel writes C into the
    scratch and the copy kernel moves it into C, in every layout, with beta (c = out, and a
    separate c), into a view one element into its rows, and into a column-major C; the
    columns around the view keep their values."""
    _hopper()
    rng = np.random.default_rng(71)
    for trans_a, trans_b in LAYOUTS:
        call = _check_c(rng, 1031, 1029, 1027, dtype, trans_a, trans_b)
        assert _copies_c(call) and call.label().endswith("packABC"), call.label()
    assert _copies_c(_check_c(rng, 1031, 1029, 1027, dtype, beta=0.5, out_offset=1))
    assert _copies_c(_check_c(rng, 1031, 1029, 1027, dtype, beta=-1.0, in_place=False))
    assert _copies_c(_check_c(rng, 1029, 1031, 1027, dtype, out_t=True, beta=0.25))


@pytest.mark.gpu
def test_c_alone_is_copied_back_behind_aligned_operands(gpu_state, no_tuning, monkeypatch):
    """A and B on aligned rows (no operand copy), C 1029 wide: only C goes through the
    scratch (forced configs with and without the TMA-store epilogue too); 133 x 261 keeps
    writing C directly (the copy would cost more)."""
    _hopper()
    rng = np.random.default_rng(73)
    bf16 = gpurt.bfloat16
    assert not _copies_c(_check_c(rng, 133, 261, 1024, bf16, trans_b=True))
    _always_copy_c(monkeypatch)
    call = _check_c(rng, 1031, 1029, 1024, bf16, trans_b=True)
    assert _copies_c(call) and call.copies == () and call.label().endswith("packC")
    for config in (tune._WGMMA[0], tune._WGMMA[5]):
        forced = _check_c(rng, 1031, 1029, 1024, bf16, trans_b=True, config=config, beta=0.5)
        assert _copies_c(forced) and forced.config == config


@pytest.mark.gpu
def test_tf32_c_is_copied_back(gpu_state, no_tuning, copy_c):
    """TF32's wgmma, also where it computes C^T = B^T A^T (an N-major B), into the scratch's
    C and back; beta with c = out."""
    _hopper()
    rng = np.random.default_rng(79)
    for trans_a, trans_b in ((False, False), (False, True), (True, True)):
        call = _check_c(rng, 1031, 1029, 1027, np.float32, trans_a, trans_b, tf32=True,
                        beta=0.5 if trans_b else 0.0)
        assert _copies_c(call), call


@pytest.mark.gpu
def test_c_copied_back_in_a_graph(gpu_state, no_tuning, copy_c):
    """Captured, the copies, the kernel and C's copy back replay with the inputs and C's
    values of each replay (beta = 1: C accumulates), from the graph's own scratch."""
    _hopper()
    rng = np.random.default_rng(83)
    m, n, k = 1031, 1029, 1027
    bf16 = gpurt.bfloat16
    da, db = device(rand(rng, (m, k), bf16)), device(rand(rng, (k, n), bf16))
    out = gpurt.empty((m, n), dtype=bf16)
    stream = gpurt.Stream()
    gemm_mod.gemm(da, db, out=out, beta=1.0, stream=stream)  # plans outside the capture
    stream.synchronize()
    assert _copies_c(_plans()[0])
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        gemm_mod.gemm(da, db, out=out, beta=1.0, stream=stream)
    for _ in range(2):
        a, b, c = rand(rng, (m, k), bf16), rand(rng, (k, n), bf16), rand(rng, (m, n), bf16)
        da.copy_(device(a))
        db.copy_(device(b))
        out.copy_(device(c))
        gpurt.synchronize()
        graph.replay()
        gpurt.synchronize()
        assert rel_err(out.numpy(), reference(a, b, beta=1.0, c=c)) < 1e-2
    del graph
    gemm_mod.clear_plans()
