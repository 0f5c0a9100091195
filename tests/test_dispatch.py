"""gpurt.nvrtc.dispatch (gpurt/_launch/_claunch_dispatch.c) on the CPU: a repeated call's key,
lookup, outputs and launch in C. Its keys equal gpurt.nvrtc.plan_key's, for gpurt Arrays and
for plain CUDA torch tensors (keyed as the Array gpurt.asarray makes of them: the stand-in
torch of test_torch_fields.py); everything it does not take returns None with nothing done;
errors of the launch or the allocation propagate. ElementwiseKernel, ReductionKernel and
jiterator calls repeat through it on the fake driver of test_launch_fake_driver.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt
from _elementwise_fakes import fake_array, sm90  # noqa: F401
from _fakes import fake_driver_fixture, fake_gpus_fixture  # noqa: F401
from gpurt._array.ownership import FINALIZERS, device_object
from gpurt._core.state import THREAD
from gpurt._elementwise import plan as eplan
from gpurt._launch import path as _launchpath
from gpurt._launch import planned as gplanned
from test_elementwise_planned import _sizes, driver  # noqa: F401
from test_launch_fake_driver import FakeDriver, fake  # noqa: F401
from test_torch_fields import RAW, FakeTensor, torch  # noqa: F401

pytestmark = pytest.mark.skipif(_launchpath.claunch is None,
                                reason="the C extension gpurt._launch._claunch is not built")


class Recorder:
    """A launch that records what it is called with (or raises ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.error = error

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)
        if self.error is not None:
            raise self.error


def _dispatcher(made: list[Any]) -> Any:
    def alloc(shape: tuple[int, ...], dtype: Any, device: int) -> Any:
        array = fake_array(shape, dtype, ptr=0x9000_0000 + 0x1000 * len(made))
        made.append((array, device))
        return array

    return _launchpath.claunch.Dispatcher(gpurt.Array, THREAD, alloc)


def test_keys_are_plan_keys_with_the_addresses(fake_gpus: Any) -> None:
    d = _dispatcher([])
    a, b = fake_array((4, 8), ptr=0x1004), fake_array((8,), np.float16, ptr=0x2000)
    key, addresses = d.key(1, -1, a, None, b, True)
    assert key == gplanned.plan_key(1, -1, a, None, b, True)
    assert addresses == (0, 0, 0x1004, 0, 0x2000, 0)
    assert d.key(a, b) != d.key(b, a)


@pytest.mark.parametrize("item", [1.5, np.float32(2), [1], np.zeros(3), "x", 2**64, object()])
def test_other_items_are_left_to_the_caller(fake_gpus: Any, item: Any) -> None:
    d = _dispatcher([])
    launch = Recorder()
    a = fake_array((4,))
    table = {gplanned.plan_key(a, None): (launch, (0, 1), (1,), (((4,), np.float32, 0),))}
    assert d.key(a, item) is None and d(table, a, item) is None and not launch.calls


def test_an_entry_allocates_missing_outputs_and_launches(fake_gpus: Any) -> None:
    made: list[Any] = []
    d = _dispatcher(made)
    launch = Recorder()
    x, given = fake_array((4, 8), ptr=0x1000), fake_array((4, 8), ptr=0x5000)
    entry = (launch, (2, 2, 4), (4,), (((4, 8), np.float32, 1),))
    table = {gplanned.plan_key(0, -1, x, None, None): entry,
             gplanned.plan_key(0, -1, x, None, given): entry}
    (out,) = d(table, 0, -1, x, None, None)
    assert made == [(out, 1)] and out.shape == (4, 8)
    assert d(table, 0, -1, x, None, given) == (given,)
    assert launch.calls == [(None, 0x1000, 0x1000, out.ptr), (None, 0x1000, 0x1000, 0x5000)]
    assert d(table, 0, -2, x, None, None) is None and len(launch.calls) == 2  # not planned


def test_errors_of_the_launch_and_allocation_propagate(fake_gpus: Any) -> None:
    x = fake_array((4,))
    key = gplanned.plan_key(x, None)
    d = _dispatcher([])
    with pytest.raises(RuntimeError, match="refused"):
        d({key: (Recorder(RuntimeError("refused")), (0, 1), (1,), (((4,), np.float32, 0),))},
          x, None)

    def no_memory(*args: Any) -> Any:
        raise MemoryError("out of memory")

    launch = Recorder()
    starved = _launchpath.claunch.Dispatcher(gpurt.Array, THREAD, no_memory)
    with pytest.raises(MemoryError):
        starved({key: (launch, (0, 1), (1,), (((4,), np.float32, 0),))}, x, None)
    assert not launch.calls


@pytest.mark.parametrize("entry, message", [
    ("launch", "entries are"),
    ((Recorder(), (0, 7), (1,), (((4,), np.float32, 0),)), "position 7"),
    ((Recorder(), (0, 1), (1,), ()), "entries are"),
    ((Recorder(), (0, 1), (1,), ([4],)), "allocs must be tuples"),
])
def test_malformed_entries_raise(fake_gpus: Any, entry: Any, message: str) -> None:
    x = fake_array((4,))
    with pytest.raises(TypeError, match=message):
        _dispatcher([])({gplanned.plan_key(x, None): entry}, x, None)


# ---- torch tensors -----------------------------------------------------------------------


def _torch_dispatcher(torch: Any) -> Any:
    from gpurt._array import interop

    interop._torch_tensor_type()
    d = _launchpath.claunch.Dispatcher(gpurt.Array, THREAD, gpurt.empty, FINALIZERS)
    d.set_torch(interop._tensor_type, interop.torch_entries(), interop._strided,
                interop._raw_stream)
    return d


@pytest.mark.parametrize("shape, stride, dtype", [((37, 65), (65, 1), "float32"),
                                                  ((65, 37), (1, 65), "float16"),
                                                  ((4, 1, 3), (3, 7, 1), "bfloat16")])
def test_a_tensor_is_keyed_as_its_array(torch: Any, shape: Any, stride: Any,
                                        dtype: str) -> None:
    d = _torch_dispatcher(torch)
    t = FakeTensor(shape, stride, dtype, ptr=0x7000_0008)
    key, addresses = d.key(3, t, None)
    assert key == gplanned.plan_key(3, gpurt.asarray(t), None)
    assert addresses == (0, 0x7000_0008, 0)


@pytest.mark.parametrize("change", [
    dict(requires_grad=True), dict(layout="sparse_coo"), dict(dtype="float8"),
    dict(is_cuda=False), dict(neg=True), dict(dtype="complex64"), dict(shape=(0, 4)),
])
def test_tensors_the_array_path_would_not_take_as_they_are_are_left(torch: Any,
                                                                    change: dict) -> None:
    if "layout" in change:
        change["layout"] = getattr(torch, change["layout"])
    d = _torch_dispatcher(torch)
    assert d.key(FakeTensor(change.pop("shape", (4, 4)), (4, 1), **change)) is None


def test_another_current_torch_stream_is_left(torch: Any) -> None:
    d = _torch_dispatcher(torch)
    t = FakeTensor((4, 4), (4, 1))
    assert d.key(t) is not None
    RAW["stream"] = 0x1234  # torch's current stream is not gpurt's: the data needs ordering
    assert d.key(t) is None


def test_a_tensor_on_the_second_gpu_is_keyed_there(torch: Any) -> None:
    d = _torch_dispatcher(torch)
    t = FakeTensor((8,), (1,), device=1)
    RAW["stream"] = 0x1234
    assert d.key(t) is None  # torch's stream there is not gpurt's current one
    RAW["stream"] = gpurt.current_stream(1).cuda_stream
    assert d.key(t)[0] == gplanned.plan_key(gpurt.asarray(t))
    assert d.key(t)[0] != d.key(FakeTensor((8,), (1,), device=0))[0]


@pytest.mark.parametrize("shape, stride, dtype", [((37, 65), (65, 1), "float32"),
                                                  ((65, 37), (1, 65), "float16"),
                                                  ((4, 1, 3), (3, 7, 1), "bfloat16"),
                                                  ((), (), "int32")])
def test_view_is_the_array_asarray_makes(torch: Any, shape: Any, stride: Any, dtype: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """dispatcher.view (gpurt.asarray's first try) makes of a plain tensor the Array that the
    Python intake (torch_fields) makes, with the thread's place's stream and Device."""
    from gpurt._array import ownership
    from gpurt.array import _device_view

    d = _torch_dispatcher(torch)
    t = FakeTensor(shape, stride, dtype, ptr=0x7000_0010)
    # no allocator in use (on a GPU machine earlier tests made one): the intake leaves no place
    monkeypatch.setattr(ownership, "_allocators", {})
    THREAD.__dict__.pop("place", None)  # fake_gpus puts the thread's state back
    want = _device_view(t, None)
    assert d.view(t) is None  # no place yet: the Python intake takes it
    THREAD.place = (0, RAW["stream"], want.stream, want.device) + FakePlace().place[4:]
    got = d.view(t)
    assert type(got) is gpurt.Array and got._owner is t and got.stream is want.stream
    for name in ("ptr", "shape", "strides", "dtype", "device", "_contiguous"):
        assert getattr(got, name) == getattr(want, name), name
    assert type(got.shape) is tuple and got.device is want.device
    from gpurt._array import interop

    interop.view, saved = d.view, interop.view
    try:  # gpurt.asarray's and gpurt.from_dlpack's first try
        assert gpurt.asarray(t).ptr == gpurt.from_dlpack(t).ptr == got.ptr
        assert gpurt.asarray(t, copy=False)._owner is t
    finally:
        interop.view = saved
    assert d.view(want) is None and d.view(np.zeros(3)) is None
    assert d.view(FakeTensor(shape, stride, dtype, device=1)) is None  # not the place's device
    RAW["stream"] = 0x1234  # torch's current stream is not gpurt's: the data needs ordering
    assert d.view(t) is None


def test_the_python_intake_remembers_the_place_for_the_reader(
        torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor the Python intake takes leaves this thread's place behind (for the C reader's
    next call) where the device's allocator is in use; it never creates an allocator."""
    from gpurt._array import ownership
    from gpurt.array import _device_view

    d, t = _torch_dispatcher(torch), FakeTensor((4, 4), (4, 1))
    THREAD.__dict__.pop("place", None)  # fake_gpus puts the thread's state back
    monkeypatch.setattr(ownership, "_allocators", {})
    assert _device_view(t, None) is not None and "place" not in THREAD.__dict__
    assert d.view(t) is None
    fake = FakePlace()
    ownership._allocators[0] = (fake.malloc, fake.release)
    _device_view(t, None)
    assert THREAD.place[0] == 0 and THREAD.place[4:] == (fake.malloc, fake.release)
    assert d.view(t).ptr == t.data_ptr() and not fake.calls


def test_add_dispatch_learns_torch_from_the_intake(torch: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = _dispatcher([])
    monkeypatch.setattr(gplanned, "_dispatcher", fresh)
    t = FakeTensor((4,), (1,))
    array = gpurt.asarray(t)  # the intake meets torch
    table: dict[Any, Any] = {}
    launch = Recorder()
    gplanned.add_dispatch(table, gplanned.plan_key(array, None), launch, (0, 1), (1,),
                          [((4,), np.float32, 0)])
    assert fresh.tensor_type is type(t)
    (out,) = fresh(table, t, None)
    assert launch.calls == [(None, t.data_ptr(), out.ptr)]
    gplanned.add_dispatch(table, ("a", "tuple"), launch, (0,), (), ())  # not a C key: ignored
    assert len(table) == 1

    class Other(FakeTensor):
        pass

    from gpurt._array import interop

    monkeypatch.setattr(interop, "_tensor_type", Other)  # the intake met another torch
    gplanned.add_dispatch(table, gplanned.plan_key(array, None), Recorder(), (0,), (), ())
    assert fresh.tensor_type is Other and table[gplanned.plan_key(array, None)][0] is launch


# ---- the kernels' repeated calls ---------------------------------------------------------


def _count_signatures(monkeypatch: pytest.MonkeyPatch, *modules: Any) -> list[int]:
    counted = [0]
    real = eplan.signature

    def signature(values: Any, outs: Any) -> Any:
        counted[0] += 1
        return real(values, outs)

    for module in modules:
        monkeypatch.setattr(module, "signature", signature)
    return counted


@pytest.mark.usefixtures("sm90")
def test_elementwise_repeats_through_dispatch(driver: FakeDriver,  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import gpurt.elementwise as elementwise

    counted = _count_signatures(monkeypatch, elementwise)
    k = gpurt.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "dispatch_axpy")
    x, y, z = (fake_array((1000,), ptr=p << 20) for p in (1, 2, 3))
    _sizes(driver, k._plan([x, y], [z]).kernel)
    assert k(x, y, z) is z and counted[0] == 1
    launches = len(driver.launches)
    x2, y2, z2 = (fake_array((1000,), ptr=p << 20) for p in (4, 5, 6))
    assert k(x2, y2, z2) is z2 and counted[0] == 1  # dispatched: no Python signature
    assert len(driver.launches) == launches + 1
    assert k(x2, 2.0, z2) is z2 and counted[0] == 2  # a scalar: the Python path
    with pytest.raises(TypeError, match="takes 2 inputs"):
        k(x2)
    driver.result = cu.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(gpurt.CudaError, match="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        k(x2, y2, z2)  # refused by the driver while dispatched: raised as from any launch
    assert counted[0] == 2


@pytest.mark.usefixtures("sm90")
def test_jiterator_repeats_through_dispatch(driver: FakeDriver,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    counted = _count_signatures(monkeypatch, gpurt.jiterator)
    fn = gpurt.jiterator._create_jit_fn(
        "template <typename T> T daxpy(T x, T y) { return x * 2 + y; }")
    x, y, z = (fake_array((256,), ptr=p << 20) for p in (1, 2, 3))
    _sizes(driver, fn._plan([x, y], [z], 2, []).kernel)
    assert fn(x, y, out=z) is z and fn(y, x, out=z) is z and fn(x, x, out=[z]) is z
    assert counted[0] == 1 and len(driver.launches) == 3
    with pytest.raises(ValueError, match="out= needs 1 arrays"):
        fn(x, out=(y, z))  # the items of fn(x, y, out=z), but not its call


@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("axis", [-1, 1])
def test_reductions_repeat_through_dispatch(driver: FakeDriver,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch, axis: int) -> None:
    import gpurt.elementwise as elementwise

    counted = _count_signatures(monkeypatch, elementwise)
    k = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "dispatch_sum")
    x, y = fake_array((32, 1000), ptr=1 << 20), fake_array((32,), ptr=2 << 20)
    _sizes(driver, k._plan([x], [y], axis, False).kernel)
    assert k(x, y, axis=axis) is y and k(x, y, axis=axis) is y
    assert counted[0] == 1 and len(driver.launches) == 2
    assert k(x, y, axis=[axis]) is y and counted[0] == 2  # a list: the Python path


@pytest.mark.usefixtures("sm90")
def test_several_outputs_repeat_through_dispatch(driver: FakeDriver,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import gpurt.elementwise as elementwise

    counted = _count_signatures(monkeypatch, elementwise)
    k = gpurt.ElementwiseKernel("T x", "T s, T d", "s = x + x; d = x - x", "dispatch_two")
    x, s, d = (fake_array((64,), ptr=p << 20) for p in (1, 2, 3))
    _sizes(driver, k._plan([x], [s, d]).kernel)
    for _ in range(3):
        assert k(x, s, d) == (s, d)
    quiet = gpurt.ElementwiseKernel("T x", "T s, T d", "s = x + x; d = x - x", "dispatch_two",
                                    no_return=True)
    assert quiet(x, s, d) is None and quiet(x, s, d) is None
    assert counted[0] == 2 and len(driver.launches) == 5


# ---- outputs made in C ---------------------------------------------------------------------


class FakePlace:
    """A thread place (gpurt/_array/ownership.py) whose malloc and finalizer record calls."""

    def __init__(self, index: int = 0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.stream = object()
        self.place = (index, 0x77, self.stream, device_object(index), self.malloc, self.release)

    def malloc(self, nbytes: int, handle: int) -> int:
        self.calls.append(("malloc", nbytes, handle))
        return 0x5000_0000 + 0x1000 * len(self.calls)

    def release(self, ref: Any) -> None:
        self.calls.append(("free", FINALIZERS.pop(ref)))


def _made_entry(launch: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    alloc = (shape, np.float32, 0)
    return (launch, (0, 1), (1,), (alloc,), (gplanned._output_layout(*alloc),))


def test_outputs_made_in_c_are_what_gpurt_empty_makes(fake_gpus: Any) -> None:
    """An output dispatch makes from C (make_output) is the Array gpurt.empty makes from the
    same place: the same allocator call, slots and finalizer (so the statistics agree)."""
    fake = FakePlace()
    THREAD.place = fake.place  # fake_gpus puts the thread's state back
    alloc = Recorder()
    d = _launchpath.claunch.Dispatcher(gpurt.Array, THREAD, alloc, FINALIZERS)
    launch, x = Recorder(), fake_array((33, 7), ptr=0x1000)
    (out,) = d({gplanned.plan_key(x, None): _made_entry(launch, (33, 7))}, x, None)
    want = gpurt.empty((33, 7), np.float32, 0)
    assert not alloc.calls and type(out) is gpurt.Array
    assert fake.calls == [("malloc", 33 * 7 * 4, 0x77)] * 2
    assert launch.calls == [(None, 0x1000, out.ptr)] and out.ptr != want.ptr
    for name in ("shape", "strides", "dtype", "device", "stream", "_owner"):
        assert getattr(out, name) == getattr(want, name), name
    assert out.stream is fake.stream and out.is_contiguous() and out.device is want.device
    ptr = out.ptr
    del out
    assert fake.calls[-1] == ("free", ptr)


def test_outputs_elsewhere_come_from_alloc(fake_gpus: Any) -> None:
    """Where this thread's place is another device's (or there is none), alloc makes the
    output; an allocation error propagates with nothing launched."""
    made: list[Any] = []
    d = _launchpath.claunch.Dispatcher(gpurt.Array, THREAD,
                                       lambda *a: made.append(a) or fake_array((4,)),
                                       FINALIZERS)
    x, launch = fake_array((4,)), Recorder()
    table = {gplanned.plan_key(x, None): _made_entry(launch, (4,))}
    THREAD.place = FakePlace(1).place  # fake_gpus puts the thread's state back
    d(table, x, None)
    assert made == [((4,), np.float32, 0)] and len(launch.calls) == 1
    fake = FakePlace()

    def no_memory(nbytes: int, handle: int) -> int:
        raise MemoryError("out of memory")

    THREAD.place = fake.place[:4] + (no_memory, fake.release)
    with pytest.raises(MemoryError):
        d(table, x, None)
    assert len(launch.calls) == 1 and len(made) == 1
