"""Streams and events (gpurt/streams.py).

CPU tests run the real bookkeeping against a pretend two-GPU driver (tests/_fakes.py):
per-thread/per-device current streams, context managers, ownership and release, host
callbacks through their real C trampoline. GPU tests prove ordering with real work: a stream
held back by cuStreamWaitValue32 on mapped pinned memory, released by the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

import gpurt

# the fake_* fixtures are used by name
from _fakes import FakeContexts, FakeDriver, device_module, fake_driver_fixture, fake_gpus_fixture  # noqa: F401
from _threads import in_thread
from gpurt import streams
from gpurt._core import state
from gpurt._core.driver import CudaUnavailableError, check
from gpurt._streams import handles as _handles

NO_DRIVER = pytest.mark.skipif(gpurt.is_available(), reason="checks behaviour without a driver")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_with_repo() -> dict[str, str]:
    """The environment for a child Python that must import this checkout's gpurt."""
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


@contextlib.contextmanager
def caught_unraisable() -> Iterator[list[BaseException | None]]:
    """Collect what reaches ``sys.unraisablehook`` (how ctypes reports a callback's error)."""
    reported: list[BaseException | None] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda info: reported.append(info.exc_value)
    try:
        yield reported
    finally:
        sys.unraisablehook = previous


# ================================ CPU: no driver ================================


@NO_DRIVER
@pytest.mark.parametrize(
    "make",
    [
        lambda: gpurt.Stream(),
        lambda: gpurt.Stream(priority=-1),
        lambda: gpurt.ExternalStream(0),
        lambda: gpurt.current_stream(),
        lambda: gpurt.default_stream(),
        lambda: gpurt.Stream.priority_range(),
        lambda: gpurt.Event().record(),
        lambda: gpurt.Event(interprocess=True).ipc_handle(),
    ],
)
def test_no_driver_raises_clear_error(make: Callable[[], Any]) -> None:
    with pytest.raises(CudaUnavailableError, match="no NVIDIA driver was found"):
        make()


def test_event_is_lazy_and_needs_no_driver() -> None:
    event = gpurt.Event(enable_timing=True)
    assert event.query() is True
    event.synchronize()
    assert event.cuda_event == 0 and event.handle is None and event.device is None
    assert "uninitialized" in repr(event)
    with pytest.raises(RuntimeError, match="never recorded"):
        event.elapsed_time(gpurt.Event(enable_timing=True))


def test_event_flag_errors() -> None:
    with pytest.raises(ValueError, match="interprocess Event cannot record timing"):
        gpurt.Event(enable_timing=True, interprocess=True)
    with pytest.raises(ValueError, match="enable_timing=True"):
        gpurt.Event().elapsed_time(gpurt.Event(enable_timing=True))
    with pytest.raises(ValueError, match="interprocess=True"):
        gpurt.Event().ipc_handle()
    with pytest.raises(ValueError, match="64 bytes"):
        gpurt.Event.from_ipc_handle(0, b"short")


def test_public_names() -> None:
    for name in streams.__all__:
        assert getattr(gpurt, name) is getattr(streams, name)
    assert "current_stream_handle" not in streams.__all__


# ================================ CPU: fake driver ================================


def test_stream_created_non_blocking_on_its_device(fake_driver: FakeDriver,
                                                   fake_gpus: FakeContexts) -> None:
    s = gpurt.Stream(device=1, priority=-3)
    handle = s.cuda_stream
    info = fake_driver.streams[handle]
    assert info["device"] == 1 and info["flags"] == int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert fake_gpus.bound == 0, "the current device's context must be bound again"
    assert s.device_index == 1 and s.device == gpurt.Device(1)
    assert s.priority == -3 and int(s.handle) == handle
    assert s.__cuda_stream__() == (0, handle)
    assert f"{handle:#x}" in repr(s) and "cuda:1" in repr(s)
    assert gpurt.Stream(priority=-100).priority == -5  # clamped by the driver
    assert gpurt.Stream.priority_range() == (0, -5)
    with pytest.raises(TypeError):
        gpurt.Stream(priority=1.5)  # type: ignore[arg-type]


def test_equality_and_hash(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream(device=1)
    same = gpurt.ExternalStream(s.cuda_stream, device=1)
    assert same == s and hash(same) == hash(s) and len({s, same}) == 1
    assert gpurt.ExternalStream(s, device=1) == s  # through __cuda_stream__
    assert gpurt.ExternalStream(s.cuda_stream, device=0) != s
    assert gpurt.Stream(device=1) != s
    assert s != s.cuda_stream
    assert gpurt.default_stream(0) == gpurt.ExternalStream(0, device=0)


def test_default_and_current_stream(fake_driver: FakeDriver) -> None:
    default = gpurt.current_stream()
    assert default is gpurt.default_stream() is gpurt.default_stream("cuda:0")
    assert default.cuda_stream == 0 and streams.current_stream_handle(0) == 0
    s = gpurt.Stream()
    gpurt.set_stream(s)
    assert gpurt.current_stream() is s and gpurt.current_stream(0) is s
    assert streams.current_stream_handle(0) == s.cuda_stream
    gpurt.set_stream(None)  # no-op, as in torch
    assert gpurt.current_stream() is s
    gpurt.set_stream(default)
    assert gpurt.current_stream() is default and streams.current_stream_handle(0) == 0


def test_every_change_of_a_current_stream_drops_the_threads_place(
        fake_driver: FakeDriver) -> None:
    """gpurt.device keeps a per-thread record of the current device and its current stream
    (gpurt/_array/ownership.py's place); whatever changes a current stream drops it."""
    s, s1 = gpurt.Stream(), gpurt.Stream(device=1)
    context = gpurt.stream(s)
    changes: list[Callable[[], Any]] = [
        lambda: gpurt.set_stream(s), lambda: gpurt.set_stream(gpurt.default_stream()),
        lambda: gpurt.set_stream(s1), lambda: gpurt.set_device(0),
        context.__enter__, lambda: context.__exit__(None, None, None),
        s.__enter__, lambda: s.__exit__(None, None, None),
    ]
    for change in changes:
        state.remember_place(("place",))
        change()
        assert state.current_place() is None
    with gpurt.stream(s1):
        state.remember_place(("place",))
    assert state.current_place() is None  # the exit restored device 0 and its stream


def test_current_stream_is_per_device(fake_driver: FakeDriver) -> None:
    s0, s1 = gpurt.Stream(device=0), gpurt.Stream(device=1)
    gpurt.set_stream(s0)
    gpurt.set_stream(s1)  # torch: also makes device 1 current
    assert gpurt.current_device() == 1
    assert gpurt.current_stream() is s1 and gpurt.current_stream(0) is s0
    assert streams.current_stream_handle(0) == s0.cuda_stream
    assert streams.current_stream_handle(1) == s1.cuda_stream
    gpurt.set_device(0)
    assert gpurt.current_stream() is s0


def test_current_stream_is_per_thread(fake_driver: FakeDriver) -> None:
    s, t = gpurt.Stream(), gpurt.Stream()
    gpurt.set_stream(s)

    def other() -> tuple[bool, int, bool]:
        fresh = gpurt.current_stream() is gpurt.default_stream()
        handle = streams.current_stream_handle(0)
        gpurt.set_stream(t)
        return fresh, handle, gpurt.current_stream() is t

    assert in_thread(other) == (True, 0, True)
    assert gpurt.current_stream() is s


def test_with_stream_restores_on_exception(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    with pytest.raises(KeyError), s as entered:
        assert entered is s and gpurt.current_stream() is s
        raise KeyError("boom")
    assert gpurt.current_stream() is gpurt.default_stream()
    assert streams.current_stream_handle(0) == 0
    assert streams.THREAD.streams.saved == []
    with pytest.raises(KeyError), gpurt.stream(s):
        raise KeyError("boom")
    assert gpurt.current_stream() is gpurt.default_stream()


def test_contexts_nest_and_are_reusable(fake_driver: FakeDriver) -> None:
    a, b = gpurt.Stream(), gpurt.Stream()
    with a:
        with b:
            with a:
                assert gpurt.current_stream() is a
            assert gpurt.current_stream() is b
            with gpurt.stream(None) as none:
                assert none is None and gpurt.current_stream() is b
        assert gpurt.current_stream() is a
    assert gpurt.current_stream() is gpurt.default_stream()
    ctx = gpurt.stream(b)
    assert isinstance(ctx, gpurt.StreamContext)
    for _ in range(2):  # a StreamContext and a Stream are reusable
        with ctx as entered:
            assert entered is b and gpurt.current_stream() is b
        with a:
            assert gpurt.current_stream() is a
    assert gpurt.current_stream() is gpurt.default_stream()


def test_context_on_other_device_restores_both_devices(fake_driver: FakeDriver) -> None:
    s0, s1 = gpurt.Stream(device=0), gpurt.Stream(device=1)
    gpurt.set_stream(s0)
    with gpurt.stream(s1):
        assert gpurt.current_device() == 1
        assert gpurt.current_stream() is s1 and gpurt.current_stream(0) is s0
    assert gpurt.current_device() == 0
    assert gpurt.current_stream() is s0
    assert gpurt.current_stream(1) is gpurt.default_stream(1)
    assert streams.current_stream_handle(1) == 0
    with pytest.raises(ArithmeticError), s1:
        gpurt.set_stream(gpurt.Stream(device=1))  # changed inside the block ...
        raise ArithmeticError("boom")
    assert gpurt.current_stream(1) is gpurt.default_stream(1)  # ... and restored exactly
    assert gpurt.current_device() == 0


def test_same_stream_entered_on_two_threads(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    inside, leave = threading.Barrier(2), threading.Event()

    def other() -> bool:
        with s:
            inside.wait(10)
            leave.wait(10)
        return gpurt.current_stream() is gpurt.default_stream()

    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(other()))
    worker.start()
    try:
        with s:
            inside.wait(10)
        assert gpurt.current_stream() is gpurt.default_stream()  # left first, other inside
    finally:
        leave.set()
        worker.join(10)
    assert results == [True]


def test_close_is_idempotent_and_later_use_is_a_clear_error(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    handle = s.cuda_stream
    assert streams.live_handles()["stream"] == 1
    s.close()
    s.close()
    assert fake_driver.names().count("cuStreamDestroy") == 1
    assert not fake_driver.streams[handle]["alive"]
    assert streams.live_handles()["stream"] == 0
    assert "closed" in repr(s)
    for use in (s.query, s.synchronize, s.record_event, lambda: s.launch_host_func(print),
                lambda: gpurt.set_stream(s), lambda: s.__enter__(), lambda: s.cuda_stream,
                lambda: gpurt.Event().record(s), lambda: gpurt.default_stream().wait_stream(s)):
        with pytest.raises(RuntimeError, match="closed"):
            use()
    assert hash(s) == hash((0, handle))  # still hashable after close


def test_close_refused_while_current(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    with s, pytest.raises(RuntimeError, match="current stream"):
        s.close()
    gpurt.set_stream(s)
    with pytest.raises(RuntimeError, match="current stream"):
        s.close()
    gpurt.set_stream(gpurt.default_stream())
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with s:
            entered.set()
            leave.wait(10)

    worker = threading.Thread(target=hold)
    worker.start()
    try:
        assert entered.wait(10)
        with pytest.raises(RuntimeError, match="current stream"):
            s.close()
    finally:
        leave.set()
        worker.join(10)
    s.close()
    assert fake_driver.names().count("cuStreamDestroy") == 1


def test_finalizer_queues_release_until_a_safe_point(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    handle = s.cuda_stream
    del s
    gc.collect()
    assert "cuStreamDestroy" not in fake_driver.names()  # the finalizer only queued it
    assert len(_handles._pending) == 1
    keep = gpurt.Stream()  # creating a stream is a safe point
    assert not fake_driver.streams[handle]["alive"] and len(_handles._pending) == 0
    for _ in range(500):
        gpurt.Stream()
        gpurt.Event().record(keep)
    gc.collect()
    keep.close()  # closing is a safe point too
    assert streams.live_handles() == {"stream": 0, "event": 0}
    alive = [h for h, info in fake_driver.streams.items() if info["alive"]]
    assert alive == [] and all(not e["alive"] for e in fake_driver.events.values())


@pytest.fixture
def stream_hooks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Only the test's own before-destroy hooks (gpurt.memory's is tested in test_memory)."""
    hooks: list[Any] = []
    monkeypatch.setattr(_handles, "_stream_hooks", hooks)
    return hooks


def test_hooks_finish_with_a_stream_before_it_is_destroyed(fake_driver: FakeDriver,
                                                          stream_hooks: list[Any]) -> None:
    seen: list[tuple[int, int, bool]] = []

    def hook(index: int, handle: int) -> bool:
        seen.append((index, handle, fake_driver.streams[handle]["alive"]))
        return True

    _handles.before_stream_destroy(hook)
    _handles.before_stream_destroy(hook)  # registered once
    closed, dropped = gpurt.Stream(device=1), gpurt.Stream()
    handles = [closed.cuda_stream, dropped.cuda_stream]
    closed.close()
    del dropped
    gc.collect()
    _handles.release_pending()
    assert seen == [(1, handles[0], True), (0, handles[1], True)]  # alive when asked
    assert not any(fake_driver.streams[h]["alive"] for h in handles)
    gpurt.Event().record(gpurt.default_stream())
    gpurt.ExternalStream(0xABC0).close()
    assert len(seen) == 2  # events and borrowed streams are not the hooks' business


def test_a_stream_whose_hook_must_wait_is_destroyed_at_a_later_safe_point(
        fake_driver: FakeDriver, stream_hooks: list[Any]) -> None:
    ready = [False]
    asked: list[int] = []

    def hook(index: int, handle: int) -> bool:
        asked.append(handle)
        return ready[0]

    _handles.before_stream_destroy(hook)
    s = gpurt.Stream()
    handle = s.cuda_stream
    s.close()  # e.g. a graph capture is underway: the allocator cannot record now
    assert fake_driver.streams[handle]["alive"] and streams.live_handles()["stream"] == 1
    assert "closed" in repr(s)
    other = gpurt.Stream()  # a safe point: asked again (once), still waiting
    other_handle = other.cuda_stream
    assert asked == [handle, handle] and fake_driver.streams[handle]["alive"]
    ready[0] = True
    other.close()  # the next safe point: now both go
    assert not fake_driver.streams[handle]["alive"]
    assert not fake_driver.streams[other_handle]["alive"]
    assert streams.live_handles()["stream"] == 0 and len(_handles._pending) == 0


def test_in_host_callback_is_true_only_inside_callbacks(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    seen: list[bool] = []
    s.launch_host_func(lambda: seen.append(_handles.in_host_callback()))
    s.synchronize()
    assert seen == [True] and not _handles.in_host_callback()


def test_borrowed_streams_are_never_destroyed(fake_driver: FakeDriver) -> None:
    default = gpurt.default_stream()
    default.close()
    external = gpurt.ExternalStream(0xABC0)
    external.close()
    del external
    gc.collect()
    gpurt.Stream().close()
    assert fake_driver.names().count("cuStreamDestroy") == 1  # only the owned one
    default.synchronize()  # still usable
    assert streams.live_handles()["stream"] == 0


def test_driver_calls_bind_the_streams_device(fake_driver: FakeDriver,
                                              fake_gpus: FakeContexts) -> None:
    s1 = gpurt.Stream(device=1)
    d1 = gpurt.default_stream(1)
    fake_driver.calls.clear()
    s1.synchronize()
    d1.synchronize()  # handle 0 means "the bound context's NULL stream": must be device 1
    gpurt.Event().record(d1)
    assert [(name, bound) for name, bound, _ in fake_driver.calls] == [
        ("cuStreamSynchronize", 1), ("cuStreamSynchronize", 1), ("cuEventCreate", 1),
        ("cuEventRecord", 1)]
    assert fake_gpus.bound == 0 and gpurt.current_device() == 0


def test_wait_stream_records_waits_and_frees_an_event(fake_driver: FakeDriver) -> None:
    a, b = gpurt.Stream(device=0), gpurt.Stream(device=1)
    fake_driver.calls.clear()
    a.wait_stream(b)
    names = fake_driver.names()
    assert names == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy"]
    (_, bound_create, _), (_, _, rec), (_, bound_wait, wait), _ = fake_driver.calls
    assert bound_create == 1 and rec[1] == b.cuda_stream
    assert bound_wait == 0 and wait == (a.cuda_stream, rec[0])
    fake_driver.calls.clear()
    a.wait_stream(a)
    assert fake_driver.calls == []
    assert streams.live_handles()["event"] == 0


def test_event_created_lazily_on_the_recording_stream_device(fake_driver: FakeDriver) -> None:
    event = gpurt.Event(blocking=True)
    assert fake_driver.calls == []
    s1 = gpurt.Stream(device=1)
    assert s1.record_event(event) is event
    assert event.device == gpurt.Device(1) and event.cuda_event != 0
    flags = fake_driver.events[event.cuda_event]["flags"]
    event_flags = cu.CUevent_flags
    assert flags == int(event_flags.CU_EVENT_DISABLE_TIMING | event_flags.CU_EVENT_BLOCKING_SYNC)
    with pytest.raises(ValueError, match="created on cuda:1"):
        event.record(gpurt.Stream(device=0))
    gpurt.Stream(device=0).wait_event(event)  # waiting across devices is allowed
    assert fake_driver.names()[-1] == "cuStreamWaitEvent"
    assert isinstance(gpurt.current_stream().record_event(), gpurt.Event)
    timing = gpurt.Event(enable_timing=True)
    timing.record()
    assert fake_driver.events[timing.cuda_event]["flags"] == 0


def test_query_maps_not_ready_to_false(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    event = s.record_event()
    fake_driver.ready = False
    assert s.query() is False and event.query() is False
    fake_driver.ready = True
    assert s.query() is True and event.query() is True


def test_elapsed_time(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    start, end = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="end event was never recorded"):
        start.record(s)
        start.elapsed_time(end)
    end.record(s)
    fake_driver.ready = False
    with pytest.raises(RuntimeError, match="not completed yet"):
        start.elapsed_time(end)
    fake_driver.ready = True
    assert start.elapsed_time(end) == 1.5
    with pytest.raises(ValueError, match="end event was not"):
        start.elapsed_time(s.record_event())


def test_event_close(fake_driver: FakeDriver) -> None:
    never = gpurt.Event()
    never.close()
    never.close()
    assert fake_driver.calls == []
    with pytest.raises(RuntimeError, match="closed"):
        never.record(gpurt.Stream())
    event = gpurt.Stream().record_event()
    handle = event.cuda_event
    event.close()
    event.close()
    assert fake_driver.names().count("cuEventDestroy") == 1
    assert not fake_driver.events[handle]["alive"] and "closed" in repr(event)
    for use in (event.query, event.synchronize, event.wait, event.record):
        with pytest.raises(RuntimeError, match="closed"):
            use()


def test_ipc_handle_round_trip(fake_driver: FakeDriver) -> None:
    event = gpurt.Event(interprocess=True)
    data = event.ipc_handle()  # created on the current device on demand, as in torch
    assert isinstance(data, bytes) and len(data) == 64
    flags = fake_driver.events[event.cuda_event]["flags"]
    assert flags & int(cu.CUevent_flags.CU_EVENT_INTERPROCESS)
    assert flags & int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    opened = gpurt.Event.from_ipc_handle("cuda:1", data)
    assert fake_driver.events[opened.cuda_event]["opened_from"] == event.cuda_event
    assert opened.interprocess and opened.device == gpurt.Device(1)
    gpurt.Stream(device=1).wait_event(opened)
    opened.close()
    assert streams.live_handles()["event"] == 1


def test_host_callbacks_run_in_order_and_are_then_released(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    ran: list[tuple[int, str]] = []

    class Callback:
        def __init__(self, i: int) -> None:
            self.i = i

        def __call__(self) -> None:
            ran.append((self.i, threading.current_thread().name))

    callbacks = [Callback(i) for i in range(5)]
    refs = [weakref.ref(cb) for cb in callbacks]
    for cb in callbacks:
        s.launch_host_func(cb)
    del callbacks, cb
    gc.collect()
    assert all(ref() is not None for ref in refs), "callables must live until they ran"
    assert ran == [] and _handles.pending_callbacks() == 5
    s.synchronize()
    assert [i for i, _ in ran] == list(range(5))
    assert all(name != threading.current_thread().name for _, name in ran)
    gc.collect()
    assert all(ref() is None for ref in refs) and _handles.pending_callbacks() == 0
    with pytest.raises(TypeError, match="callable"):
        s.launch_host_func(42)  # type: ignore[arg-type]


def test_host_callback_exception_is_reported_not_fatal(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    ran: list[int] = []

    def boom() -> None:
        raise ValueError("callback failed")

    s.launch_host_func(lambda: ran.append(1))
    s.launch_host_func(boom)
    s.launch_host_func(lambda: ran.append(3))
    with caught_unraisable() as reported:
        s.synchronize()
    assert ran == [1, 3]
    assert len(reported) == 1 and isinstance(reported[0], ValueError)
    assert _handles.pending_callbacks() == 0


def test_host_callbacks_captured_into_a_graph_run_on_every_replay(
        fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    fake_driver.capturing.add(s.cuda_stream)
    ran: list[int] = []
    s.launch_host_func(lambda: ran.append(1))
    fake_driver.capturing.clear()
    for _ in range(3):
        fake_driver.replay_host_work(s.cuda_stream)
    assert ran == [1, 1, 1] and _handles.pending_callbacks() == 0


def test_failed_host_launch_drops_the_callable(fake_driver: FakeDriver) -> None:
    fake_driver.fail_host_launch = True
    with pytest.raises(gpurt.CudaError, match="CUDA_ERROR_INVALID_HANDLE"):
        gpurt.Stream().launch_host_func(lambda: None)
    assert _handles.pending_callbacks() == 0


def test_current_stream_is_cheap(fake_driver: FakeDriver) -> None:
    gpurt.set_stream(gpurt.Stream())
    n = 20000

    def per_call(fn: Callable[[], Any]) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n)
        return best * 1e9

    handle = streams.current_stream_handle
    assert per_call(lambda: handle(0)) < 1000  # ns, generous for slow CI machines
    assert per_call(gpurt.current_stream) < 2000


# ================================ GPU ================================

WAIT_GEQ = int(cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)

SPIN_SOURCE = rb"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


class HostFlags:
    """32-bit flags in mapped pinned host memory: the host writes, streams wait on them."""

    def __init__(self, count: int = 16) -> None:
        gpurt.set_device(0)
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        self.ptr = int(check(cu.cuMemHostAlloc(4 * count, flags)))
        self.values = (ctypes.c_uint32 * count).from_address(self.ptr)
        self.device_ptr = int(check(cu.cuMemHostGetDevicePointer(self.ptr, 0)))
        for i in range(count):
            self.values[i] = 0

    def dev(self, slot: int) -> Any:
        return cu.CUdeviceptr(self.device_ptr + 4 * slot)

    def free(self) -> None:
        check(cu.cuMemFreeHost(self.ptr))


@pytest.fixture
def host_flags() -> Iterator[HostFlags]:
    flags = HostFlags()
    yield flags
    gpurt.synchronize()
    flags.free()


@contextlib.contextmanager
def held(stream: gpurt.Stream, flags: HostFlags, slot: int = 0) -> Iterator[Callable[[], None]]:
    """Hold ``stream`` back until the yielded function (or the block's end) releases it."""
    flags.values[slot] = 0
    check(cu.cuStreamWaitValue32(stream.handle, flags.dev(slot), 1, WAIT_GEQ))

    def release() -> None:
        flags.values[slot] = 1

    try:
        yield release
    finally:
        release()  # never leave a stream blocked, whatever the test did
        stream.synchronize()


@pytest.fixture
def stream_state() -> Iterator[None]:
    """Restore this thread's current streams after a GPU test."""
    before = {i: gpurt.current_stream(i) for i in range(gpurt.device_count())}
    yield
    for stream in before.values():
        gpurt.set_stream(stream)
    gpurt.set_device(0)


@pytest.fixture(scope="module")
def spin_kernel() -> Iterator[Any]:
    """``spin_ns(ns)``: a one-thread kernel that busy-waits ``ns`` nanoseconds of globaltimer."""
    gpurt.set_device(0)
    prog = check(nvrtc.nvrtcCreateProgram(SPIN_SOURCE, b"spin.cu", 0, [], []))
    try:
        arch = f"--gpu-architecture={gpurt.get_arch(0)}".encode()
        check(nvrtc.nvrtcCompileProgram(prog, 1, [arch]))
        size = check(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = bytearray(size)  # never b" " * size: NVRTC writes into it
        check(nvrtc.nvrtcGetCUBIN(prog, cubin))
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    module = check(cu.cuModuleLoadData(bytes(cubin)))
    yield check(cu.cuModuleGetFunction(module, b"spin_ns"))
    gpurt.set_device(0)
    check(cu.cuModuleUnload(module))


def spin(kernel: Any, stream: gpurt.Stream, ms: float) -> None:
    args = ((int(ms * 1e6),), (ctypes.c_uint64,))
    check(cu.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream.handle, args, 0))


gpu = pytest.mark.usefixtures("gpu_state", "stream_state")


@pytest.mark.gpu
@gpu
def test_gpu_stream_ordering_through_an_event(host_flags: HostFlags) -> None:
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    with held(s1, host_flags) as release:
        event = s1.record_event()
        s2.wait_event(event)
        check(cu.cuStreamWriteValue32(s2.handle, host_flags.dev(1), 2, 0))
        done2 = s2.record_event()
        time.sleep(0.05)
        assert not s1.query() and not event.query()
        assert not s2.query() and not done2.query()
        assert host_flags.values[1] == 0, "s2 ran before the event it waits on"
        release()
        s2.synchronize()
        assert host_flags.values[1] == 2
        assert s1.query() and event.query() and s2.query() and done2.query()


@pytest.mark.gpu
@gpu
def test_gpu_wait_stream(host_flags: HostFlags) -> None:
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    with held(s1, host_flags) as release:
        s2.wait_stream(s1)
        check(cu.cuStreamWriteValue32(s2.handle, host_flags.dev(1), 7, 0))
        time.sleep(0.05)
        assert host_flags.values[1] == 0 and not s2.query()
        release()
        s2.synchronize()
        assert host_flags.values[1] == 7


@pytest.mark.gpu
@gpu
def test_gpu_independent_streams_do_not_wait(host_flags: HostFlags) -> None:
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    with held(s1, host_flags):
        check(cu.cuStreamWriteValue32(s2.handle, host_flags.dev(1), 5, 0))
        deadline = time.monotonic() + 10
        while not s2.query() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert s2.query(), "s2 was serialised behind the held stream"
        assert host_flags.values[1] == 5 and not s1.query()


@pytest.mark.gpu
@gpu
def test_gpu_elapsed_time_matches_host_timing(spin_kernel: Any) -> None:
    s = gpurt.Stream()
    start, end = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
    spin(spin_kernel, s, 1.0)  # warm up
    s.synchronize()
    t0 = time.perf_counter()
    start.record(s)
    spin(spin_kernel, s, 20.0)
    end.record(s)
    end.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3
    device_ms = start.elapsed_time(end)
    assert 19.5 <= device_ms <= host_ms + 0.5, (device_ms, host_ms)
    assert device_ms < 40.0


@pytest.mark.gpu
@gpu
def test_gpu_elapsed_time_errors(host_flags: HostFlags) -> None:
    s = gpurt.Stream()
    start, end = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
    with held(s, host_flags):
        start.record(s)
        end.record(s)
        with pytest.raises(RuntimeError, match="not completed yet"):
            start.elapsed_time(end)
    assert start.elapsed_time(end) >= 0.0
    with pytest.raises(ValueError, match="enable_timing"):
        start.elapsed_time(s.record_event())


@pytest.mark.gpu
@gpu
def test_gpu_host_callbacks_run_in_order_after_prior_work(host_flags: HostFlags) -> None:
    s = gpurt.Stream()
    ran: list[int] = []

    def boom() -> None:
        raise ValueError("callback failed")

    with caught_unraisable() as reported, held(s, host_flags) as release:
        for i in range(3):
            s.launch_host_func(lambda i=i: ran.append(i))
        s.launch_host_func(boom)
        s.launch_host_func(lambda: ran.append(3))
        time.sleep(0.05)
        assert ran == [], "a host callback ran before the work ahead of it"
        release()
        s.synchronize()
    assert ran == [0, 1, 2, 3]
    assert len(reported) == 1 and isinstance(reported[0], ValueError)
    assert _handles.pending_callbacks() == 0


@pytest.mark.gpu
@gpu
def test_gpu_host_callback_in_a_captured_graph_runs_on_every_replay() -> None:
    s = gpurt.Stream()
    ran: list[int] = []
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    check(cu.cuStreamBeginCapture(s.handle, mode))
    try:
        s.launch_host_func(lambda: ran.append(len(ran)))
    finally:
        graph = check(cu.cuStreamEndCapture(s.handle))
    try:
        assert ran == []
        graph_exec = check(cu.cuGraphInstantiate(graph, 0))
        try:
            for _ in range(3):
                check(cu.cuGraphLaunch(graph_exec, s.handle))
            s.synchronize()
        finally:
            check(cu.cuGraphExecDestroy(graph_exec))
    finally:
        check(cu.cuGraphDestroy(graph))
    assert ran == [0, 1, 2]


@pytest.mark.gpu
@gpu
def test_gpu_context_managers_across_threads() -> None:
    s, t = gpurt.Stream(), gpurt.Stream()
    default = gpurt.default_stream()
    with s:
        assert gpurt.current_stream() is s
        assert streams.current_stream_handle(0) == s.cuda_stream != 0

        def other() -> tuple[bool, bool]:
            fresh = gpurt.current_stream() == default
            with t:
                inside = gpurt.current_stream() is t
                t.synchronize()
            return fresh, inside and gpurt.current_stream() == default

        assert in_thread(other) == (True, True)
        assert gpurt.current_stream() is s
        with pytest.raises(OSError), t:
            raise OSError("boom")
        assert gpurt.current_stream() is s
    assert gpurt.current_stream() is default and streams.current_stream_handle(0) == 0


@pytest.mark.gpu
@gpu
def test_gpu_default_stream() -> None:
    default = gpurt.default_stream()
    assert default.cuda_stream == 0 and in_thread(gpurt.current_stream) == default
    event = default.record_event()
    event.synchronize()
    assert default.query() and event.query()
    default.close()  # never destroyed
    default.synchronize()


@pytest.mark.gpu
@gpu
def test_gpu_priorities() -> None:
    least, greatest = gpurt.Stream.priority_range()
    assert least == 0 and greatest < 0
    assert gpurt.Stream(priority=greatest).priority == greatest
    assert gpurt.Stream(priority=greatest - 100).priority == greatest  # clamped
    assert gpurt.Stream(priority=least + 100).priority == least
    assert gpurt.Stream().priority == 0


@pytest.mark.gpu
@gpu
def test_gpu_close_and_finalizers_release_handles() -> None:
    release = _handles.release_pending
    release()
    base = streams.live_handles()
    for _ in range(300):
        s = gpurt.Stream()
        s.record_event().synchronize()
        s.close()
    for _ in range(300):
        gpurt.Stream().record_event(gpurt.Event(enable_timing=True))
    gc.collect()
    release()
    assert streams.live_handles() == base
    s = gpurt.Stream()
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.synchronize()


@pytest.mark.gpu
@gpu
def test_gpu_external_stream_is_borrowed(host_flags: HostFlags) -> None:
    gpurt.set_device(0)
    raw = check(cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    try:
        external = gpurt.ExternalStream(int(raw))
        assert external.device_index == 0 and external.cuda_stream == int(raw)
        with held(external, host_flags) as release:
            assert not external.query()
            release()
        external.close()
        del external
        gc.collect()
        _handles.release_pending()
        check(cu.cuStreamQuery(raw))  # still a valid stream: we never destroyed it
    finally:
        check(cu.cuStreamDestroy(raw))


@pytest.mark.gpu
@gpu
def test_gpu_torch_sees_our_stream(host_flags: HostFlags) -> None:
    torch = pytest.importorskip("torch")
    s = gpurt.Stream()
    theirs = torch.cuda.ExternalStream(s.cuda_stream, device=torch.device("cuda", 0))
    x = torch.ones(1 << 20, device="cuda")
    # Launch torch's kernel once before the hold: with lazy module loading its first launch
    # loads the module, which waits for the device, and the held stream never finishes.
    (x * 2).sum().item()
    torch.cuda.current_stream().synchronize()  # not torch.cuda.synchronize(): see the hold
    with held(s, host_flags) as release:
        with torch.cuda.stream(theirs):
            y = x * 2  # queued behind the hold on our stream
        assert not theirs.query()
        release()
        theirs.synchronize()
    assert s.query() and float(y.sum()) == 2.0 * (1 << 20)


@pytest.mark.gpu
@gpu
def test_gpu_event_ipc_across_processes(host_flags: HostFlags) -> None:
    s = gpurt.Stream()
    event = gpurt.Event(interprocess=True)
    child_source = (
        "import sys, gpurt\n"
        "try:\n"
        "    e = gpurt.Event.from_ipc_handle(0, bytes.fromhex(sys.argv[1]))\n"
        "except gpurt.CudaError as exc:\n"
        "    print('error', exc.name, flush=True); sys.exit(0)\n"
        "print('query', e.query(), flush=True)\n"
        "sys.stdin.readline()\n"
        "e.synchronize()\n"
        "print('query', e.query(), flush=True)\n"
    )
    with held(s, host_flags) as release:
        event.record(s)
        child = subprocess.Popen([sys.executable, "-c", child_source, event.ipc_handle().hex()],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env_with_repo())
        assert child.stdin is not None and child.stdout is not None
        try:
            def line() -> str:
                ready, _, _ = select.select([child.stdout], [], [], 60)
                assert ready, "child process did not answer"
                return child.stdout.readline().strip()

            first = line()
            if first.startswith("error CUDA_ERROR_NOT_SUPPORTED"):
                pytest.skip("CUDA IPC events are not supported here")
            assert first == "query False", first
            release()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert line() == "query True"
        finally:
            release()
            child.stdin.close()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
    assert event.query()


@pytest.mark.gpu
@gpu
def test_gpu_streams_on_two_devices(host_flags: HostFlags) -> None:
    if gpurt.device_count() < 2:
        pytest.skip("needs two GPUs")
    s0, s1 = gpurt.Stream(device=0), gpurt.Stream(device=1)
    gpurt.set_stream(s0)
    with s1:
        assert gpurt.current_device() == 1 and gpurt.current_stream(0) is s0
    assert gpurt.current_device() == 0 and gpurt.current_stream(1) == gpurt.default_stream(1)
    with held(s0, host_flags) as release:
        s1.wait_event(s0.record_event())  # a device-1 stream waits on a device-0 event
        check(cu.cuStreamWriteValue32(s1.handle, host_flags.dev(1), 9, 0))
        time.sleep(0.05)
        assert host_flags.values[1] == 0 and not s1.query()
        release()
        s1.synchronize()
        assert host_flags.values[1] == 9
    with pytest.raises(ValueError, match="created on cuda:0"):
        s1.record_event(s0.record_event())


def test_as_stream_handle_takes_every_kind_of_stream(fake_driver: FakeDriver) -> None:
    """gpurt.as_stream_handle, the one conversion from a stream object to its raw handle."""
    class TorchLike:
        cuda_stream = 1234

    class CoreLike:
        def __cuda_stream__(self):
            return (0, 99)

    class CupyLike:
        ptr = 77

    s = gpurt.Stream()
    assert gpurt.as_stream_handle(5) == 5
    assert gpurt.as_stream_handle(cu.CUstream(6)) == 6
    assert gpurt.as_stream_handle(s) == int(s.cuda_stream) != 0
    assert gpurt.as_stream_handle(TorchLike()) == 1234
    assert gpurt.as_stream_handle(CoreLike()) == 99
    assert gpurt.as_stream_handle(CupyLike()) == 77
    assert gpurt.as_stream_handle(None) == 0  # the current stream: the legacy default
    with s:
        assert gpurt.as_stream_handle(None) == gpurt.as_stream_handle(None, 0) == int(s.cuda_stream)
    for bad in ("stream", 1.5, True, object()):
        with pytest.raises(TypeError, match="expected a stream"):
            gpurt.as_stream_handle(bad)


def test_as_stream_wraps_foreign_streams(fake_driver: FakeDriver) -> None:
    s = gpurt.Stream()
    assert gpurt.as_stream(s) is s
    assert gpurt.as_stream(None) is gpurt.current_stream()
    external = gpurt.as_stream(1234, device=1)
    assert isinstance(external, gpurt.ExternalStream)
    assert int(external.cuda_stream) == 1234 and external.device_index == 1
