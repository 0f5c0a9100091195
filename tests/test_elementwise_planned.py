"""Elementwise and reduction plans launch through planned launches (Kernel.planned): on the
fake driver of test_launch_fake_driver.py, on both launch paths, a repeated call must hand the
driver exactly what a plain launch of the same kernel with the call's pointers and scalars
would, on every call (not only the first), and registered launch hooks must still see every
launch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401
from _fakes import fake_gpus_fixture  # noqa: F401
from gpurt._elementwise import codegen, counters, reduction
from gpurt._elementwise.reduce_codegen import BLOCK
from gpurt._launch import planned as gplanned
from gpurt._launch.args import build_plan
from gpurt._streams import kept as kept_mod
from gpurt._streams.kept import KeptPerStream
from test_launch_fake_driver import FakeDriver, fake  # noqa: F401

pytestmark = pytest.mark.usefixtures("sm90")


@pytest.fixture
def driver(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:  # noqa: F811
    monkeypatch.setattr(gplanned, "current_device", lambda: 0)
    monkeypatch.setattr(fake, "cuLibraryGetKernel", lambda library, name: (0, ("kernel", name)))
    return fake


def _sizes(driver: FakeDriver, kernel: Any) -> None:
    """Tell the fake driver the parameter sizes of ``kernel``."""
    plan = build_plan(kernel.name, kernel.params, None)
    driver.sizes[kernel.name.encode()] = [p.size for p in plan.params]


def _replay(driver: FakeDriver, kernel: Any, grid: Any, block: int, args: tuple) -> tuple:
    """What the driver gets from a plain launch of ``kernel`` with ``args``."""
    kernel(grid, block, args)
    return driver.launches.pop()


def test_elementwise_calls_launch_what_a_plain_launch_does(driver: FakeDriver) -> None:
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "ew_axpy")
    calls = [(0x100000, 0x200000, 0x300000), (0x400000, 0x500000, 0x600000),
             (0x700010, 0x800010, 0x900010)]  # same alignment: one plan
    plan = None
    for x, y, z in calls:
        xs, ys, zs = (fake_array((1000,), ptr=p) for p in (x, y, z))
        if plan is None:
            plan = k._plan([xs, ys], [zs])
            _sizes(driver, plan.kernel)
        assert k(xs, ys, zs) is zs
    assert len(k._plans) == 1
    plan = next(iter(k._plans.values()))
    got = list(driver.launches)
    driver.launches.clear()
    expected = [_replay(driver, plan.kernel, plan.grid, codegen.THREADS, (*c, *plan.tail))
                for c in calls]
    assert got == expected


def test_elementwise_scalars_vary_and_hooks_see_every_launch(driver: FakeDriver) -> None:
    k = gpurt.ElementwiseKernel("T x, float32 a", "T z", "z = x * a", "ew_scale")
    x, z = fake_array((64,)), fake_array((64,), ptr=1 << 24)
    _sizes(driver, k._plan([x, 1.5], [z]).kernel)
    seen: list[str] = []

    def hook(kernel: Any, handle: int, when: str) -> None:
        seen.append(when)

    k(x, 1.5, z)
    gpurt.add_launch_hook(hook)
    try:
        k(x, -3.25, z)
    finally:
        gpurt.remove_launch_hook(hook)
    k(x, 0.5, z)
    plan = next(iter(k._plans.values()))
    got = list(driver.launches)
    driver.launches.clear()
    expected = [_replay(driver, plan.kernel, plan.grid, codegen.THREADS,
                        (x.ptr, a, z.ptr, *plan.tail)) for a in (1.5, -3.25, 0.5)]
    assert got == expected and seen == ["begin", "end"]


def test_jiterator_calls_repeat_one_plan(driver: FakeDriver) -> None:
    fn = gpurt.jiterator._create_jit_fn(
        "template <typename T> T axpy(T x, T y) { return x * 2 + y; }")
    x, y, z = (fake_array((256,), ptr=p << 20) for p in (1, 2, 3))
    _sizes(driver, fn._plan([x, y], [z], 2, []).kernel)
    fn(x, y, out=z)
    fn(y, x, out=z)
    assert len(fn._plans) == 1 and len(driver.launches) == 2
    assert driver.launches[0][-1] != driver.launches[1][-1]


@pytest.mark.parametrize("fold, keep", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("shape, axis", [((32, 1000), -1), ((4, 1 << 20), 1)])
def test_reductions_launch_what_a_plain_launch_does(driver: FakeDriver, shape: tuple, axis: int,
                                                    fold: bool, keep: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reduction, "FOLD", fold)  # a split's last block or a finish kernel
    monkeypatch.setattr(counters, "KEEP", keep)  # the stream's kept counters, or new ones
    monkeypatch.setattr(counters, "_kept", KeptPerStream(counters.MAX_KEPT))
    monkeypatch.setattr(kept_mod, "stream_is_capturing", lambda index, handle: False)
    r = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "ew_sum")
    x, y = fake_array(shape), fake_array((shape[0],), ptr=1 << 28)
    plan = r._plan([x], [y], axis, False)
    partials = (0x7000000, 0x7100000)  # a split's partials, new ones per call
    tickets = (0x7200000, 0x7300000)  # and a folding split's zeroed counters (kept: one)
    made, zeroed = iter(partials), iter(tickets)
    monkeypatch.setattr(gpurt._elementwise.api, "empty",
                        lambda *a, **k: fake_array((1,), ptr=next(made)))
    monkeypatch.setattr(gpurt._elementwise.api, "zeros",
                        lambda n, *a, **k: fake_array((n,), np.uint32, ptr=next(zeroed)))
    for kernel in (plan.kernel, plan.finish):
        if kernel is not None:
            _sizes(driver, kernel)
    r(x, y, axis=axis)
    r(x, y, axis=axis)
    got = list(driver.launches)
    driver.launches.clear()
    if plan.partial is None:
        args = (x.ptr, y.ptr, *plan.middle, *plan.out_strides)
        assert got == [_replay(driver, plan.kernel, plan.grid, BLOCK, args)] * 2
        return
    expected = []
    for partial, counter in zip(partials, tickets[:1] * 2 if keep else tickets):
        if fold:
            expected.append(_replay(driver, plan.kernel, plan.grid, BLOCK,
                                    (x.ptr, partial, counter, y.ptr, *plan.middle,
                                     *plan.out_strides)))
            continue
        expected.append(_replay(driver, plan.kernel, plan.grid, BLOCK,
                                (x.ptr, partial, *plan.middle)))
        expected.append(_replay(driver, plan.finish, plan.finish_grid, BLOCK,
                                (partial, *plan.finish_head, y.ptr, *plan.finish_dims,
                                 *plan.out_strides)))
    assert plan.fold == fold and (plan.finish is None) == fold
    assert got == expected and got[0] != got[-1]


def test_fold_counters_are_kept_per_stream_but_not_in_captures(monkeypatch) -> None:
    made = iter(range(1 << 20, 1 << 30, 1 << 20))
    monkeypatch.setattr(gpurt._elementwise.api, "zeros",
                        lambda n, *a, **k: fake_array((n,), np.uint32, ptr=next(made)))
    stream, capturing = [7], [False]
    monkeypatch.setattr(gpurt._elementwise.api, "current_stream_handle",
                        lambda index: stream[0])
    monkeypatch.setattr(kept_mod, "stream_is_capturing", lambda index, handle: capturing[0])
    monkeypatch.setattr(counters, "_kept", KeptPerStream(counters.MAX_KEPT))
    assert counters.KEEP
    first = counters.take(0, 67)
    assert counters.take(0, 67) is first and counters.take(0, 5) is first  # zeroed once
    stream[0] = 9
    other = counters.take(0, 67)
    assert other is not first and counters.take(0, 67) is other  # another stream's
    capturing[0] = True
    assert counters.take(0, 67) not in (first, other)  # a graph's own, zeroed in the graph
    capturing[0] = False
    stream[0] = 2  # CU_STREAM_PER_THREAD: a stream per thread behind one handle
    assert counters.take(0, 67).ptr != counters.take(0, 67).ptr
    stream[0] = 7
    assert counters.take(0, 67) is first
    grown = counters.take(0, 100)  # more than the stream keeps: a new, larger array
    assert grown is not first and grown.shape[0] >= 134 and counters.take(0, 67) is grown
    assert counters.kept_bytes() == grown.nbytes + other.nbytes
    for handle in range(10, 10 + counters.MAX_KEPT):  # the oldest streams are dropped
        stream[0] = handle
        counters.take(0, 1)
    kept = counters._kept.keys()
    assert len(kept) == counters.MAX_KEPT and (0, 9) not in kept
    monkeypatch.setattr(counters, "KEEP", False)
    assert counters.take(0, 1) is not counters.take(0, 1)
    counters.clear()
    assert counters.kept_bytes() == 0
