"""Blocks used on streams that are destroyed (gpurt/_memory/streamuses.py and the stream-destroy
hook that gpurt.memory registers with gpurt.streams).

The crash this guards against: ``record_stream`` on a side stream, the stream is closed (or
dropped and collected), the block is freed, and the next allocation recorded an event on
the destroyed stream -- which the driver does not report, it crashes the process.

CPU: gpurt.Stream over the fake driver of tests/_fakes.py, with the real caching core over a
fake backend that treats an event recorded on a destroyed stream as that crash; the same
for the pinned-memory and cudaMallocAsync allocators. GPU: the same story on the real
driver, with the side stream held by cuStreamWaitValue32 to prove the block waits for it.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt
from _fakes import FakeDriver, fake_driver_fixture, fake_gpus_fixture  # noqa: F401
from allocator_model import FakeBackend, KiB, Segfault
from gpurt import memory as mem
from gpurt._memory import async_pool as _async_pool
from gpurt._memory import blocks as _blocks
from gpurt._memory import driver as _backend
from gpurt._memory import pinned as _pinned
from gpurt._memory.allocator import CachingAllocator
from gpurt._memory.config import AllocatorConfig
from gpurt._streams import handles as _handles
from gpurt.device import bind_context

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- CPU: gpurt.Stream over the fake driver, the caching core over a fake backend -------


class DriverBackend(FakeBackend):
    """FakeBackend whose streams are the fake driver's: an event recorded on one the fake
    driver has destroyed is a Segfault, as on the real driver."""

    def __init__(self, driver: FakeDriver) -> None:
        super().__init__()
        self.driver = driver

    def event_record(self, event: list, stream: int) -> None:
        info = self.driver.streams.get(stream)
        if info is not None and not info["alive"]:
            raise Segfault(f"cuEventRecord on destroyed stream 0x{stream:x}")
        super().event_record(event, stream)


@pytest.fixture
def memory_hooks(fake_gpus: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put gpurt.memory's stream hook back after the fakes cleared the real hooks."""
    monkeypatch.setattr(_handles, "_stream_hooks", [mem._retire_stream])


@pytest.fixture
def fake_allocator(fake_driver: FakeDriver, memory_hooks: None,
                   monkeypatch: pytest.MonkeyPatch) -> Any:
    """gpurt.memory with one caching allocator (device 0) over :class:`DriverBackend`."""
    backend = DriverBackend(fake_driver)
    allocator = CachingAllocator(0, backend, AllocatorConfig())
    monkeypatch.setattr(mem, "_allocators", {0: allocator})
    monkeypatch.setattr(mem, "_only", [allocator.free])
    return allocator, backend


def destroy(holder: list[gpurt.Stream], how: str) -> None:
    """Close the stream in ``holder`` (its only reference), or drop it and let the next
    safe point destroy it."""
    stream = holder.pop()
    if how == "close":
        stream.close()
    else:
        del stream
        gc.collect()
        gpurt.Stream()  # creating a stream is a safe point


class MoreDriver:
    """The streams' fake driver plus the few calls the pinned and async allocators make."""

    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.freed: list[tuple[int, int]] = []
        self.buffers: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)

    def cuMemFreeAsync(self, ptr: int, stream: Any) -> tuple:
        self.freed.append((int(ptr), int(stream)))
        return (cu.CUresult.CUDA_SUCCESS,)

    def cuMemHostAlloc(self, size: int, flags: int) -> tuple:
        self.buffers.append(ctypes.create_string_buffer(size))
        return cu.CUresult.CUDA_SUCCESS, ctypes.addressof(self.buffers[-1])


@pytest.mark.parametrize("how", ["close", "drop"])
@pytest.mark.parametrize("order", ["free after", "free before"])
def test_a_used_stream_that_goes_away_never_crashes_the_allocator(
        fake_allocator: Any, fake_driver: FakeDriver, how: str, order: str) -> None:
    allocator, backend = fake_allocator
    side = [gpurt.Stream()]
    handle = side[0].cuda_stream
    ptr = mem.caching_allocator_alloc(4 * KiB)  # on the default stream
    mem.record_stream(ptr, side[0])
    backend.launch(handle)  # work on the side stream that reads the block
    if order == "free before":
        mem.caching_allocator_delete(ptr)
    destroy(side, how)
    assert not fake_driver.streams[handle]["alive"]
    if order == "free after":
        mem.caching_allocator_delete(ptr)
    other = mem.caching_allocator_alloc(4 * KiB)  # `gpurt demo` crashed here
    assert other != ptr  # the destroyed stream's work has not finished yet
    backend.complete(handle)  # the driver still runs it
    mem.caching_allocator_delete(other)
    assert mem.caching_allocator_alloc(4 * KiB) == ptr
    assert gpurt.memory_stats()["active.all.current"] == 1


@pytest.mark.usefixtures("memory_hooks")
def test_a_stream_closed_during_a_capture_lives_until_the_capture_ends(
        fake_allocator: Any, fake_driver: FakeDriver) -> None:
    allocator, backend = fake_allocator
    side = gpurt.Stream()
    handle = side.cuda_stream
    ptr = mem.caching_allocator_alloc(4 * KiB)
    mem.record_stream(ptr, side)
    allocator.begin_allocate_to_pool((0, 77), 0x4240)  # a capture on another stream
    try:
        side.close()
        assert fake_driver.streams[handle]["alive"]  # kept: no event may be recorded now
        assert "event_record" not in backend.calls
        assert _handles.live_handles()["stream"] == 1
    finally:
        allocator.end_allocate_to_pool((0, 77))
    gpurt.Stream().close()  # the next safe point
    assert not fake_driver.streams[handle]["alive"]
    assert _handles.live_handles()["stream"] == 0
    mem.caching_allocator_delete(ptr)
    mem.caching_allocator_delete(mem.caching_allocator_alloc(4 * KiB))


def test_release_pool_from_a_finalizer_creates_no_allocator(
        fake_gpus: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mem, "_allocators", {})
    mem.release_pool(0, (0, 123))  # a graph collected after its allocator never existed
    assert mem._allocators == {}


@pytest.mark.usefixtures("memory_hooks")
def test_pinned_blocks_used_on_a_closed_stream(fake_driver: FakeDriver,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    host = _pinned.PinnedAllocator()
    monkeypatch.setattr(_pinned, "_host", host)
    monkeypatch.setattr(_pinned, "cu", MoreDriver(fake_driver))
    monkeypatch.setattr(_pinned, "bind_context", fake_driver.contexts.bind)
    monkeypatch.setattr(_pinned, "event_query",
                        lambda event: int(fake_driver.cuEventQuery(event)[0]) == 0)
    monkeypatch.setattr(mem, "_allocators", {})
    buffer = ctypes.create_string_buffer(4096)
    ptr = ctypes.addressof(buffer)
    host._blocks[ptr] = _pinned._HostBlock(ptr, 4096)  # as if from cuMemHostAlloc
    side = gpurt.Stream()
    handle = side.cuda_stream
    gpurt.host_record_stream(ptr, side)
    side.close()
    names = fake_driver.names()
    assert names.index("cuEventRecord") < names.index("cuStreamDestroy")
    assert not fake_driver.streams[handle]["alive"]
    host.free(ptr)
    fake_driver.ready = False
    assert host.malloc(100) != ptr  # recorded before the close, not completed: not reusable
    fake_driver.ready = True
    assert host.malloc(4096) == ptr  # the event the close recorded has completed
    recorded = [args for name, _, args in fake_driver.calls if name == "cuEventRecord"]
    assert len(recorded) == 1  # nothing was ever recorded on the destroyed stream


@pytest.mark.usefixtures("memory_hooks")
def test_cuda_malloc_async_frees_after_a_closed_streams_work(
        fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = MoreDriver(fake_driver)
    monkeypatch.setattr(_async_pool, "cu", driver)
    monkeypatch.setattr(_async_pool, "bind_context", fake_driver.contexts.bind)
    allocator = _async_pool.AsyncAllocator.__new__(_async_pool.AsyncAllocator)  # no memory pool
    allocator.device = 0
    allocator._lock = threading.Lock()
    allocator._queued = collections.deque()
    allocator._stats = {}
    allocator.history = mem._history
    monkeypatch.setattr(mem, "_allocators", {0: allocator})
    side, user = gpurt.Stream(), gpurt.Stream()
    made_on, used_on = side.cuda_stream, user.cuda_stream
    allocator._live = {0x1000: [512, made_on, 512, None, None],  # made on side
                       0x2000: [512, 0, 512, {used_on}, None]}  # used on user
    side.close()
    user.close()
    assert allocator._live[0x1000][1] == 0  # its free goes to the legacy stream now
    for ptr in (0x1000, 0x2000):
        (use,) = allocator._live[ptr][3]
        assert isinstance(use, _blocks.RetiredUse)
    allocator.free(0x1000)
    allocator.free(0x2000)
    before = len(fake_driver.calls)
    allocator._drain()
    later = fake_driver.calls[before:]
    assert [name for name, _, _ in later].count("cuEventRecord") == 0
    assert [name for name, _, _ in later].count("cuStreamWaitEvent") == 2
    assert driver.freed == [(0x1000, 0), (0x2000, 0)]


def test_driver_backend_records_at_free_only_under_its_own_context(
        monkeypatch: pytest.MonkeyPatch) -> None:
    current = [0x700]

    class Contexts:
        @staticmethod
        def cuCtxGetCurrent() -> tuple:
            return cu.CUresult.CUDA_SUCCESS, cu.CUcontext(current[0])

    monkeypatch.setattr(_backend, "cu", Contexts)
    monkeypatch.setattr(_backend, "primary_context", lambda index: cu.CUcontext(0x700 + index))
    backend = _backend.DriverBackend(0)
    assert backend.may_record_events()
    current[0] = 0x701  # device 1's context is bound (a finalizer inside its driver call)
    assert not backend.may_record_events()
    current[0] = 0x700
    monkeypatch.setattr(_backend, "in_host_callback", lambda: True)
    assert not backend.may_record_events()  # no CUDA call on the driver's callback thread


def test_driver_backend_reads_the_capture_id(monkeypatch: pytest.MonkeyPatch) -> None:
    status = cu.CUstreamCaptureStatus
    answers = {
        0x10: (cu.CUresult.CUDA_SUCCESS, status.CU_STREAM_CAPTURE_STATUS_ACTIVE, 42, None, [], 0),
        0x20: (cu.CUresult.CUDA_SUCCESS, status.CU_STREAM_CAPTURE_STATUS_NONE, 0, None, [], 0),
        0x30: (cu.CUresult.CUDA_SUCCESS, status.CU_STREAM_CAPTURE_STATUS_INVALIDATED, 43, None,
               [], 0),
        0: (cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,),
        0x40: (cu.CUresult.CUDA_ERROR_INVALID_HANDLE,),
    }

    class Captures:
        @staticmethod
        def cuStreamGetCaptureInfo(stream: int) -> tuple:
            return answers[int(stream)]

    monkeypatch.setattr(_backend, "cu", Captures)
    monkeypatch.setattr(_backend, "bind_context", lambda index: None)
    backend = _backend.DriverBackend(0)
    assert backend.capture_id(0x10) == 42
    assert backend.capture_id(0x20) is None and backend.capture_id(0x30) is None
    assert backend.capture_id(0) is None  # the legacy stream is in no capture
    with pytest.raises(gpurt.CudaError, match="cuStreamGetCaptureInfo"):
        backend.capture_id(0x40)


# ---- GPU ---------------------------------------------------------------------------------


def _wait_flag() -> tuple[Any, Any, Any]:
    """A mapped pinned flag and ``hold(stream)``: the stream waits until the flag is 1
    (cuStreamWaitValue32)."""
    host = check_ok(cu.cuMemHostAlloc(4, 0x02))  # CU_MEMHOSTALLOC_DEVICEMAP
    flag = ctypes.c_uint32.from_address(int(host))
    flag.value = 0
    dev = check_ok(cu.cuMemHostGetDevicePointer(host, 0))

    def hold(stream: Any) -> None:
        check_ok(cu.cuStreamWaitValue32(stream, dev, 1, 0))  # CU_STREAM_WAIT_VALUE_GEQ

    return host, flag, hold


def check_ok(result: tuple) -> Any:
    assert int(result[0]) == 0, result[0]
    return result[1] if len(result) == 2 else result[1:]


def _read(ptr: int, nbytes: int) -> np.ndarray:
    out = np.full(nbytes, 0xAB, np.uint8)  # poisoned
    check_ok(cu.cuMemcpyDtoH(out.ctypes.data, ptr, nbytes))
    return out


def _state(ptr: int) -> set[str]:
    return {b["state"] for s in gpurt.memory_snapshot() for b in s["blocks"]
            if b["address"] == ptr}


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["close", "drop"])
@pytest.mark.parametrize("order", ["free after", "free before"])
def test_gpu_record_stream_then_the_stream_goes_away(gpu_state: None, how: str, order: str) -> None:
    gpurt.synchronize()
    gpurt.empty_cache()
    bind_context(gpurt.current_device())
    host, flag, hold = _wait_flag()
    size = 256 * KiB
    side = [gpurt.Stream()]
    try:
        ptr = gpurt.caching_allocator_alloc(size)
        check_ok(cu.cuMemsetD8(ptr, 1, size))
        hold(side[0].handle)  # the side stream is stuck until the flag is set
        check_ok(cu.cuMemsetD8Async(ptr, 7, size, side[0].handle))
        gpurt.record_stream(ptr, side[0])
        if order == "free before":
            gpurt.caching_allocator_delete(ptr)
        destroy(side, how)  # its queued work survives cuStreamDestroy
        if order == "free after":
            gpurt.caching_allocator_delete(ptr)
        again = [gpurt.caching_allocator_alloc(size) for _ in range(3)]  # no crash here
        assert ptr not in again  # the destroyed stream's memset has not run yet
        for p in again:
            gpurt.caching_allocator_delete(p)
        assert _state(ptr) == {"active_pending_free"}
        flag.value = 1
        check_ok(cu.cuCtxSynchronize())
        deadline = time.monotonic() + 10
        while "active_pending_free" in _state(ptr) and time.monotonic() < deadline:
            gpurt.caching_allocator_delete(gpurt.caching_allocator_alloc(512))  # polls events
            time.sleep(0.001)
        assert "active_pending_free" not in _state(ptr)
        assert (_read(ptr, size) == 7).all()  # the held work ran, into our block, before reuse
    finally:
        flag.value = 1
        check_ok(cu.cuCtxSynchronize())
        check_ok(cu.cuMemFreeHost(host))
        gpurt.empty_cache()


@pytest.mark.gpu
def test_gpu_arrays_like_the_demo(gpu_state: None) -> None:
    """`gpurt demo`'s step: arrays used on two streams, record_stream, the streams
    dropped with the function's locals, then allocations on a new stream."""
    rng = np.random.default_rng()
    data = rng.standard_normal(1 << 18).astype(np.float32)

    def step() -> gpurt.Array:
        s1, s2 = gpurt.Stream(), gpurt.Stream()
        with s1:
            x = gpurt.asarray(data)
        s2.wait_stream(s1)
        y = gpurt.empty(x.shape)
        check_ok(cu.cuMemcpyDtoDAsync(y.ptr, x.ptr, x.nbytes, s2.handle))
        x.record_stream(s2)
        y.record_stream(s2)
        s2.synchronize()
        return y

    for _ in range(5):
        y = step()
        gc.collect()
        with gpurt.Stream():  # a safe point: the dropped streams are destroyed here
            z = gpurt.asarray(data)  # allocations after the destroy: the demo crashed here
            np.testing.assert_array_equal(z.to_numpy(), data)
        np.testing.assert_array_equal(y.to_numpy(), data)
    gpurt.synchronize()


@pytest.mark.gpu
def test_gpu_pinned_and_async_backend_survive_a_closed_stream() -> None:
    code = textwrap.dedent("""
        import gc, numpy as np, gpurt
        from cuda.bindings import driver as cu
        assert gpurt.get_allocator_backend() == "cudaMallocAsync"
        for round in range(3):
            side = gpurt.Stream()
            p = gpurt.caching_allocator_alloc(1 << 20, stream=side)  # made on side
            q = gpurt.caching_allocator_alloc(1 << 20)
            assert cu.cuMemsetD8Async(q, 3, 1 << 20, side.handle)[0] == 0
            gpurt.record_stream(q, side)
            pinned = gpurt.pinned_empty(1024, np.float32)
            gpurt.host_record_stream(pinned, side)
            side.close()
            gpurt.caching_allocator_delete(p)
            gpurt.caching_allocator_delete(q)
            del pinned
            gc.collect()
            gpurt.caching_allocator_delete(gpurt.caching_allocator_alloc(4096))
            gpurt.pinned_empty(1024, np.float32)
        gpurt.synchronize()
        print("ok")
    """)
    env = dict(os.environ, GPURT_ALLOC_CONF="backend:cudaMallocAsync",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), \
        result.stdout[-2000:] + result.stderr[-3000:]
