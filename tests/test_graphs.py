"""Tests for gpurt.graphs (CUDAGraph, graph(), pools, graphed callables, kernel-node updates).

CPU: argument packing, dependency order, capture errors and modes, and the whole capture /
replay / reset / garbage-collection life cycle with its private-pool reference counting over
a fake driver and allocator (tests/_graph_fakes.py). GPU: the same promises on the real
driver with NVRTC kernels, checked bit for bit against eager runs and against numpy.
"""

from __future__ import annotations

import ctypes
import gc
import struct
import threading
import types

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt
from _graph_fakes import FakeGraphs, fake_driver, fake_gpus, fake_graphs  # noqa: F401
from gpurt._core.captures import CAPTURES
from gpurt._core.driver import CudaError, check
from gpurt._graphs import capture as _capture
from gpurt._graphs.nodes import KernelNode, pack_arg, topological_order


def driver_error(name: str, call: str) -> CudaError:
    code = int(getattr(cu.CUresult, name))
    return CudaError(code, name, "operation not permitted when stream is capturing", call)


# ---- CPU: pure helpers ---------------------------------------------------------------


class FakeDeviceArray:
    def __init__(self, ptr: int) -> None:
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (4,), "version": 3}


def test_finalizer_releases_wait_for_the_last_capture(monkeypatch) -> None:
    """A module's unload and a communicator's destroy, finalized during a capture, are queued
    and run once no capture is underway (CPU: the driver and NCCL calls recorded)."""
    from gpurt._launch import module as _module
    from gpurt._streams import handles as _handles
    from gpurt.distributed import _nccl

    done: list[object] = []
    monkeypatch.setattr(_module.cu, "cuLibraryUnload", done.append)
    fake = types.SimpleNamespace(comm_destroy=done.append, comm_abort=done.append)
    monkeypatch.setattr(_nccl, "bindings", lambda: fake)
    before = CAPTURES.deferred()
    CAPTURES.add(1)
    try:
        _module._unload(["library"])
        _nccl._release("comm", False)
        _nccl._release("hung comm", True)  # an abort is never held back
        assert done == ["hung comm"] and CAPTURES.deferred() == before + 2
        CAPTURES.run_deferred()  # still capturing: nothing runs
        assert done == ["hung comm"]
    finally:
        CAPTURES.add(-1)
    _capture.drain_deferred()
    assert done == ["hung comm", "library", "comm"] and CAPTURES.deferred() == 0
    _module._unload(["now"])  # no capture: at once
    assert done[-1] == "now"
    monkeypatch.setattr(_handles, "in_host_callback", lambda: True)
    _module._unload(["in a callback"])  # waits, and a drain there does not spin on it
    CAPTURES.run_deferred()
    assert done[-1] == "now" and CAPTURES.deferred() == 1
    monkeypatch.setattr(_handles, "in_host_callback", lambda: False)
    CAPTURES.run_deferred()
    assert done[-1] == "in a callback" and CAPTURES.deferred() == 0


def test_pack_arg_follows_the_parameter_size() -> None:
    assert pack_arg(FakeDeviceArray(0x7F00), 8, 0) == (0x7F00).to_bytes(8, "little")
    assert pack_arg(None, 8, 0) == bytes(8)
    assert pack_arg(-3, 4, 1) == struct.pack("<i", -3)
    assert pack_arg(2**32 - 1, 4, 1) == struct.pack("<I", 2**32 - 1)
    assert pack_arg(7, 8, 1) == struct.pack("<q", 7)
    assert pack_arg(True, 1, 2) == b"\x01"
    assert pack_arg(1.5, 4, 3) == struct.pack("<f", 1.5)
    assert pack_arg(1.1, 8, 3) == struct.pack("<d", 1.1)
    assert pack_arg(np.float16(2.5), 2, 3) == np.float16(2.5).tobytes()
    assert pack_arg(np.int64(-9), 8, 3) == struct.pack("<q", -9)
    assert pack_arg(ctypes.c_uint16(513), 2, 4) == struct.pack("<H", 513)
    assert pack_arg(b"\x01\x02\x03", 3, 5) == b"\x01\x02\x03"


@pytest.mark.parametrize(
    "value, size, error, words",
    [
        (FakeDeviceArray(16), 4, TypeError, "8-byte"),
        (2**31 * 4, 4, ValueError, "does not fit"),
        (1.0, 1, TypeError, "float"),
        (np.float32(1), 8, TypeError, "4-byte"),
        (np.zeros(3, np.float32), 8, TypeError, "host numpy array"),
        ("text", 8, TypeError, "cannot pass str"),
        (b"\x00", 4, TypeError, "1-byte"),
    ],
)
def test_pack_arg_rejects_what_would_be_garbage(value, size, error, words) -> None:
    with pytest.raises(error, match=words) as info:
        pack_arg(value, size, 2)
    assert "kernel parameter 2" in str(info.value)


def test_topological_order_keeps_launch_order_among_ready_nodes() -> None:
    assert topological_order([5, 3, 9], [(5, 3), (3, 9)]) == [5, 3, 9]
    # listed out of order but chained: the edges win
    assert topological_order([9, 3, 5], [(5, 3), (3, 9)]) == [5, 3, 9]
    # a fork (1 -> 2, 1 -> 3) and join (2, 3 -> 4): ties by listing order
    assert topological_order([1, 3, 2, 4], [(1, 2), (1, 3), (2, 4), (3, 4)]) == [1, 3, 2, 4]
    assert topological_order([], []) == []
    with pytest.raises(ValueError, match="cycle"):
        topological_order([1, 2], [(1, 2), (2, 1)])


def test_capture_error_names_the_illegal_call() -> None:
    exc = driver_error("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "cuCtxSynchronize")
    err = _capture.capture_error(exc, 0x1234, aborted=True)
    assert isinstance(err, gpurt.GraphCaptureError) and isinstance(err, CudaError)
    assert err.name == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" and err.code == exc.code
    text = str(err)
    assert "cuCtxSynchronize is not allowed while a CUDA graph capture is in progress" in text
    assert "0x1234" in text and "aborted" in text
    unjoined = driver_error("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "cuStreamEndCapture")
    assert "joined back" in str(_capture.capture_error(unjoined, 1, aborted=True))
    wrong = driver_error("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "cuStreamEndCapture")
    assert "aborted" not in str(_capture.capture_error(wrong, 1, aborted=False))


def test_update_error_explains_what_may_change() -> None:
    exc = driver_error("CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "cuGraphExecUpdate")
    err = _capture.update_error(exc, "CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED", "")
    assert isinstance(err, gpurt.GraphUpdateError)
    assert "TOPOLOGY_CHANGED" in str(err) and "same nodes and edges" in str(err)


def test_modes_and_pool_handles_are_validated() -> None:
    assert set(_capture.MODES) == {"global", "thread_local", "relaxed"}
    with pytest.raises(ValueError, match="capture_error_mode must be one of"):
        gpurt.CUDAGraph().capture_begin(capture_error_mode="loose")
    with pytest.raises(ValueError, match="capture_error_mode"):
        gpurt.stream_capture_mode("strict")
    for bad in ((1,), (1, 2, 3), [0, 1], (0, "1"), (True, 1), None):
        with pytest.raises(TypeError, match="graph_pool_handle"):
            _capture.pool_id(bad)
    assert _capture.pool_id((0, 7)) == (0, 7)


def test_an_empty_graph_touches_no_driver() -> None:
    g = gpurt.CUDAGraph()
    assert repr(g) == "CUDAGraph(empty)"
    for call in (g.replay, g.pool, g.raw_cuda_graph, g.kernel_nodes, lambda: g.debug_dump("x")):
        with pytest.raises(RuntimeError, match="capture"):
            call()
    with pytest.raises(RuntimeError, match="without a matching capture_begin"):
        g.capture_end()
    g.reset()  # a no-op
    g.reset()
    if not gpurt.is_initialized():
        assert gpurt.is_current_stream_capturing() is False


def test_make_graphed_callables_checks_arguments_first() -> None:
    with pytest.raises(ValueError, match="2 callables but 1"):
        gpurt.make_graphed_callables((abs, abs), ((1,),))
    with pytest.raises(TypeError, match="tuple of arguments"):
        gpurt.make_graphed_callables(abs, [1])
    with pytest.raises(TypeError, match="expected a callable"):
        gpurt.make_graphed_callables((abs, 3), ((1,), (2,)))
    with pytest.raises(ValueError, match="num_warmup_iters"):
        gpurt.make_graphed_callables(abs, (1,), num_warmup_iters=-1)


class HostStatic(gpurt.Array):
    """A float32 gpurt.Array over a pretend address, on the current stream unless told,
    that records what copy_ is asked to copy into it."""

    def __init__(self, shape: tuple[int, ...], ptr: int = 0x100, contiguous: bool = False,
                 stream=None) -> None:
        self.shape, self.dtype, self.device = shape, np.dtype(np.float32), gpurt.Device(0)
        self.strides = tuple(4 * int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        self.stream = gpurt.current_stream() if stream is None else stream
        self.ptr, self._contiguous, self._owner = ptr, contiguous, None
        self.copied: list[object] = []

    def copy_(self, src: object, non_blocking: bool = False) -> HostStatic:
        self.copied.append(src)
        return self


def test_graphed_inputs_are_copied_in_order_on_the_current_stream(fake_graphs) -> None:
    fg = fake_graphs
    static = HostStatic((8,), ptr=0x1000, contiguous=True)
    fn = gpurt.GraphedCallable(abs, types.SimpleNamespace(replay=lambda: None), (static,), None)
    same = HostStatic((8,), ptr=0x2000, contiguous=True)
    fn(same)
    assert fg.driver.copies == [(0x1000, 0x2000, 32, 0)]
    assert "cuStreamWaitEvent" not in fg.streams.names()
    side = gpurt.Stream()
    produced_elsewhere = HostStatic((8,), ptr=0x3000, contiguous=True, stream=side)
    fn(produced_elsewhere)  # the current stream waits for the producer first
    assert fg.driver.copies[-1] == (0x1000, 0x3000, 32, 0)
    assert fg.streams.names()[-3:] == ["cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy"]
    with side:  # replay and copy follow the current stream
        fn(same)
    assert fg.driver.copies[-1] == (0x1000, 0x2000, 32, side.cuda_stream)


def test_graphed_callable_copies_inputs_checks_constants_and_replays(fake_graphs) -> None:
    replays = []
    static, out, foreign = HostStatic((4,)), object(), FakeDeviceArray(0x500)
    fake_graph = types.SimpleNamespace(replay=lambda: replays.append(1))
    fn = gpurt.GraphedCallable(abs, fake_graph, (static, 2.0, foreign), out)  # type: ignore
    new = np.ones(4, np.float32)
    assert fn(new, 2.0, foreign) is out and static.copied == [new] and replays == [1]
    assert fn(static, 2.0, foreign) is out and static.copied == [new]  # its own buffer
    with pytest.raises(ValueError, match=r"argument 0: expected shape \(4,\), got \(5,\)"):
        fn(np.ones(5, np.float32), 2.0, foreign)
    with pytest.raises(ValueError, match="baked into the graph"):
        fn(new, 3.0, foreign)
    with pytest.raises(ValueError, match="argument 2 .* baked into the graph"):
        fn(new, 2.0, FakeDeviceArray(0x500))  # a foreign array: only the same object
    with pytest.raises(TypeError, match="captured with 3 arguments, got 1"):
        fn(new)
    assert replays == [1, 1]


# ---- CPU: private-pool rules through the allocator core over a fake backend -------------


class HostBackend:
    """Segments are address ranges; events complete at once; every call is recorded.
    ``capture_ids`` says which capture a stream takes part in."""

    def __init__(self) -> None:
        self._next = 1 << 32
        self.segments: dict[int, int] = {}
        self.calls: list[str] = []
        self.capture_ids: dict[int, int] = {}

    def malloc(self, size: int, capturing: bool, stream: int = 0) -> int | None:
        self.calls.append("malloc")
        ptr, self._next = self._next, self._next + size + (1 << 24)
        self.segments[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        self.calls.append("free")
        del self.segments[ptr]

    def mem_get_info(self) -> tuple[int, int]:
        return (1 << 34, 1 << 34)

    def event_create(self) -> object:
        self.calls.append("event_create")
        return object()

    def event_record(self, event: object, stream: int) -> None:
        self.calls.append("event_record")

    def event_query(self, event: object) -> bool:
        self.calls.append("event_query")
        return True

    def event_synchronize(self, event: object) -> None:
        self.calls.append("event_synchronize")

    def event_destroy(self, event: object) -> None:
        self.calls.append("event_destroy")

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def may_record_events(self) -> bool:
        return True

    def capture_id(self, stream: int) -> int | None:
        return self.capture_ids.get(stream)

    def oom_error(self, message: str) -> BaseException:
        return MemoryError(message)


@pytest.fixture
def core():
    allocator_core = pytest.importorskip("gpurt._memory.allocator")
    from gpurt._memory.config import AllocatorConfig

    backend = HostBackend()
    return types.SimpleNamespace(
        alloc=allocator_core.CachingAllocator(0, backend, AllocatorConfig()), backend=backend
    )


def reserved(alloc) -> int:
    return alloc.nested_stats()["reserved_bytes"]["all"]["current"]


def allocated(alloc) -> int:
    return alloc.nested_stats()["allocated_bytes"]["all"]["current"]


class Capture:
    """retain + begin on entry, end on exit: what CUDAGraph.capture_begin/end do."""

    def __init__(self, alloc, pool, stream: int) -> None:
        self.alloc, self.pool, self.stream = alloc, pool, stream

    def __enter__(self) -> Capture:
        self.alloc.retain_pool(self.pool)
        self.alloc.begin_allocate_to_pool(self.pool, self.stream)
        return self

    def __exit__(self, *exc: object) -> None:
        self.alloc.end_allocate_to_pool(self.pool)


def test_pool_captured_blocks_never_serve_eager_allocations(core) -> None:
    alloc, stream, size = core.alloc, 0x50, 4096
    cached = alloc.malloc(size, stream)
    alloc.free(cached)  # a cached block in the normal pool, on the capturing stream
    with Capture(alloc, (0, 1), stream):
        assert alloc.captures_underway()
        inside = alloc.malloc(size, stream)
        temp = alloc.malloc(size, stream)
        other_stream = alloc.malloc(size, 0x60)  # not captured: normal pool
        assert inside != cached and temp != cached
        alloc.free(temp)  # back to the private pool
    assert not alloc.captures_underway()
    eager = [alloc.malloc(size, stream) for _ in range(64)]
    assert temp not in eager and inside not in eager and cached in eager
    with Capture(alloc, (0, 1), stream):  # the same pool shares its free blocks
        assert alloc.malloc(size, stream) == temp
    for ptr in eager + [other_stream]:
        alloc.free(ptr)


def test_a_side_stream_that_joined_the_capture_allocates_from_its_pool(core) -> None:
    alloc, backend, stream, side = core.alloc, core.backend, 0x50, 0x58
    with Capture(alloc, (0, 5), stream):
        backend.capture_ids.update({stream: 7, side: 7})  # side waited on the capture
        joined = alloc.malloc(4096, side)
        backend.capture_ids.pop(side)  # a stream outside the capture
        outside = alloc.malloc(4096, side)
    pools = {b["address"]: tuple(seg["segment_pool_id"]) for seg in alloc.snapshot()
             for b in seg["blocks"]}
    assert pools[joined] == (0, 5) and pools[outside] == (0, 0)
    alloc.free(joined)
    alloc.free(outside)
    alloc.release_pool((0, 5))
    alloc.empty_cache()
    assert backend.segments == {}


def test_pool_memory_is_counted_and_returned_after_the_last_release(core) -> None:
    alloc, backend, stream = core.alloc, core.backend, 0x50
    base_reserved, base_allocated = reserved(alloc), allocated(alloc)
    with Capture(alloc, (0, 2), stream):
        out = alloc.malloc(1 << 20, stream)
        alloc.free(alloc.malloc(1 << 16, stream))
    assert allocated(alloc) == base_allocated + (1 << 20)
    assert reserved(alloc) > base_reserved
    alloc.retain_pool((0, 2))  # a second graph shares the pool
    alloc.release_pool((0, 2))
    alloc.empty_cache()
    assert reserved(alloc) > base_reserved  # still retained by one graph
    alloc.release_pool((0, 2))
    alloc.empty_cache()
    assert reserved(alloc) > base_reserved  # `out` is still allocated in it
    alloc.free(out)
    alloc.empty_cache()
    assert reserved(alloc) == base_reserved and allocated(alloc) == base_allocated
    assert backend.segments == {}


def test_unsafe_allocator_work_waits_for_the_capture_to_end(core) -> None:
    alloc, backend, stream = core.alloc, core.backend, 0x50
    used_elsewhere = alloc.malloc(4096, stream)
    alloc.record_stream(used_elsewhere, 0x70)
    spare = alloc.malloc(4096, 0x80)
    alloc.free(spare)
    with Capture(alloc, (0, 3), stream):
        backend.calls.clear()
        alloc.free(used_elsewhere)  # needs an event on stream 0x70: not now
        alloc.empty_cache()  # frees segments: not now
        alloc.malloc(4096, stream)
        assert set(backend.calls) <= {"malloc"}
    alloc.release_pool((0, 3))
    alloc.malloc(512, 0x90)  # the next call after the capture does the deferred work
    alloc.flush()
    assert "event_record" in backend.calls or "event_synchronize" in backend.calls


# ---- CPU: the life cycle over a fake driver and allocator ------------------------------


def capture_kernels(fg: FakeGraphs, g: gpurt.CUDAGraph, count: int = 2, **kw) -> None:
    with gpurt.graph(g, **kw):
        stream = gpurt.current_stream()
        for i in range(count):
            fg.driver.launch_kernel(stream.cuda_stream, [8, 4], [bytes(8), struct.pack("<f", i)])


def test_capture_routes_allocations_to_a_retained_private_pool(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    before = gpurt.current_stream()
    g = gpurt.CUDAGraph()
    with gpurt.graph(g) as captured:
        assert captured is g and gpurt.is_current_stream_capturing()
        capture_stream = gpurt.current_stream()
        assert capture_stream != before
        pool = g.pool()
        assert fg.pools.routing == {(0, capture_stream.cuda_stream): pool}
        assert fg.pools.refs[(0, pool)] == 1
        assert _capture.captures_active() == 1
        fg.driver.launch_kernel(capture_stream.cuda_stream, [8], [bytes(8)])
    assert gpurt.current_stream() == before and not gpurt.is_current_stream_capturing()
    assert fg.pools.routing == {} and _capture.captures_active() == 0
    assert [c for c, _ in fg.pools.calls] == ["empty_cache", "retain", "begin", "end"]
    flags = int(cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
    assert f"cuGraphInstantiate(flags={flags})" in fg.driver.calls
    assert fg.driver.calls[0] == "sync"  # graph() synchronizes before capturing
    assert "pool=(0, 1)" in repr(g)


def test_replay_runs_on_the_current_stream(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    capture_kernels(fg, g)
    g.replay()
    s = gpurt.Stream()
    with s:
        g.replay()
    exec_ = g.raw_cuda_graph_exec()
    assert fg.driver.launches == [(exec_, 0), (exec_, s.cuda_stream)]


def test_reset_destroys_handles_and_releases_the_pool(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    capture_kernels(fg, g)
    pool = g.pool()
    g.replay()
    g.reset()
    assert fg.pools.refs[(0, pool)] == 0
    assert fg.driver.live(fg.driver.execs) == 0 and fg.driver.live(fg.driver.graphs) == 0
    assert fg.driver.calls[-2:] == ["cuGraphExecDestroy", "cuGraphDestroy"]
    g.reset()  # idempotent
    assert fg.pools.calls.count(("release", pool)) == 1
    capture_kernels(fg, g)  # the object captures again, into a new pool
    assert g.pool() != pool and fg.pools.held() == 1


def test_garbage_collection_releases_the_graph(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    capture_kernels(fg, g)
    pool = g.pool()
    del g
    gc.collect()
    assert fg.pools.refs[(0, pool)] == 0 and fg.driver.live(fg.driver.execs) == 0
    assert fg.driver.live(fg.driver.graphs) == 0


def test_a_release_during_capture_waits_for_the_capture_to_end(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    first = gpurt.CUDAGraph()
    capture_kernels(fg, first)
    first.replay()
    first_pool = first.pool()
    second = gpurt.CUDAGraph()
    with gpurt.graph(second):
        fg.driver.launch_kernel(gpurt.current_stream().cuda_stream, [8], [bytes(8)])
        del first
        gc.collect()
        assert _capture.pending_releases() == 1
        assert fg.pools.refs[(0, first_pool)] == 1  # nothing released during capture
        assert "cuGraphExecDestroy" not in fg.driver.calls
    assert _capture.pending_releases() == 0 and fg.pools.refs[(0, first_pool)] == 0
    assert fg.driver.live(fg.driver.execs) == 1  # only the second graph's


def test_a_shared_pool_lives_until_its_last_graph_goes(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    handle = gpurt.graph_pool_handle()
    assert handle != gpurt.graph_pool_handle()
    g1, g2 = gpurt.CUDAGraph(), gpurt.CUDAGraph()
    capture_kernels(fg, g1, pool=handle)
    capture_kernels(fg, g2, pool=g1.pool())
    assert g1.pool() == g2.pool() == handle and fg.pools.refs[(0, handle)] == 2
    g1.reset()
    assert fg.pools.refs[(0, handle)] == 1
    g2.replay()
    g2.reset()
    assert fg.pools.refs[(0, handle)] == 0


def test_an_illegal_call_aborts_the_capture_cleanly(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    before = gpurt.current_stream()
    g = gpurt.CUDAGraph()
    with pytest.raises(gpurt.GraphCaptureError) as info:
        with gpurt.graph(g):
            stream = gpurt.current_stream()
            fg.driver.break_capture(stream.cuda_stream)
            raise driver_error("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "cuCtxSynchronize")
    text = str(info.value)
    assert "cuCtxSynchronize is not allowed while a CUDA graph capture" in text
    assert isinstance(info.value.__cause__, CudaError)
    assert gpurt.current_stream() == before and _capture.captures_active() == 0
    assert fg.pools.held() == 0 and fg.pools.routing == {} and not fg.driver.capturing
    assert repr(g) == "CUDAGraph(empty)"
    capture_kernels(fg, g)  # the same object and stream capture fine afterwards
    g.replay()


def test_other_errors_in_the_body_pass_through_unchanged(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    with pytest.raises(KeyError, match="mine"):
        with gpurt.graph(g):
            fg.driver.launch_kernel(gpurt.current_stream().cuda_stream, [8], [bytes(8)])
            raise KeyError("mine")
    # the valid partial graph was ended and destroyed, its pool released
    assert fg.driver.live(fg.driver.graphs) == 0 and fg.pools.held() == 0
    assert not fg.driver.capturing and _capture.captures_active() == 0


def test_an_invalidated_capture_fails_at_capture_end(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    with gpurt.Stream() as s:
        g.capture_begin()
        fg.driver.break_capture(s.cuda_stream)
        with pytest.raises(gpurt.GraphCaptureError, match="invalidated the capture"):
            g.capture_end()
    assert fg.pools.held() == 0 and _capture.captures_active() == 0


def test_capture_end_on_another_thread_leaves_the_capture_running(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    errors: list[BaseException] = []
    with gpurt.Stream() as s:
        g.capture_begin()
        fg.driver.launch_kernel(s.cuda_stream, [8], [bytes(8)])
        worker = threading.Thread(target=lambda: _collect(errors, g.capture_end))
        worker.start()
        worker.join()
        assert isinstance(errors[0], gpurt.GraphCaptureError)
        assert "another thread" in str(errors[0]) and "aborted" not in str(errors[0])
        assert fg.pools.held() == 1  # still capturing, still routed
        g.capture_end()
    g.replay()


def _collect(errors: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        errors.append(exc)


def test_capture_begin_refuses_the_default_stream_and_failed_begins_release(fake_graphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    assert fg.pools.calls == []
    fg.driver.begin_result = cu.CUresult.CUDA_ERROR_INVALID_VALUE
    with gpurt.Stream():
        with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
            g.capture_begin()
    assert fg.pools.held() == 0 and fg.pools.routing == {} and _capture.captures_active() == 0
    fg.driver.begin_result = cu.CUresult.CUDA_SUCCESS
    capture_kernels(fg, g)
    with pytest.raises(RuntimeError, match="reset"):
        capture_kernels(fg, g)


def test_capture_modes_reach_the_driver(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    seen = []
    for name in ("global", "thread_local", "relaxed"):
        g = gpurt.CUDAGraph()
        with gpurt.graph(g, capture_error_mode=name):
            stream = gpurt.current_stream().cuda_stream
            seen.append(fg.driver.capturing[stream]["mode"])
            fg.driver.launch_kernel(stream, [8], [bytes(8)])
    assert seen == [_capture.MODES[n] for n in ("global", "thread_local", "relaxed")]
    with gpurt.stream_capture_mode("relaxed"):
        with gpurt.stream_capture_mode("thread_local"):
            assert fg.driver.thread_modes[threading.get_ident()] == _capture.MODES["thread_local"]
        assert fg.driver.thread_modes[threading.get_ident()] == _capture.MODES["relaxed"]
    assert fg.driver.thread_modes[threading.get_ident()] == _capture.MODES["global"]


def test_an_empty_capture_warns(fake_graphs: FakeGraphs) -> None:
    g = gpurt.CUDAGraph()
    with pytest.warns(UserWarning, match="graph is empty"):
        with gpurt.graph(g):
            pass
    g.replay()  # an empty graph is still a valid graph


def test_debug_dump_writes_dot(fake_graphs: FakeGraphs, tmp_path) -> None:
    g = gpurt.CUDAGraph()
    capture_kernels(fake_graphs, g)
    g.debug_dump(tmp_path / "plain.dot")
    g.enable_debug_mode()
    g.debug_dump(str(tmp_path / "verbose.dot"))
    assert (tmp_path / "plain.dot").read_text().startswith("digraph")
    assert "flags=1" in (tmp_path / "verbose.dot").read_text()


def test_kernel_nodes_set_args_pack_by_the_real_layout(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    capture_kernels(fg, g, count=3)
    nodes = g.kernel_nodes()
    assert [n.index for n in nodes] == [0, 1, 2] and isinstance(nodes[0], KernelNode)
    node = nodes[1]
    assert node.param_sizes == (8, 4) and node.grid == (4, 1, 1) and node.block == (256, 1, 1)
    assert node.name == f"kernel_{int(node._node):x}" and node.shared_mem == 0
    assert node.args == (bytes(8), struct.pack("<f", 1))
    target = FakeDeviceArray(0xABC000)
    node.set_args(target, 2.5)
    key = (g.raw_cuda_graph_exec(), int(node._node))
    assert fg.driver.exec_params[key] == [(0xABC000).to_bytes(8, "little"), struct.pack("<f", 2.5)]
    assert node.args == tuple(fg.driver.exec_params[key])  # the graph node follows the exec
    node.set_arg(1, np.float32(-1))
    assert fg.driver.exec_params[key][0] == (0xABC000).to_bytes(8, "little")
    assert fg.driver.exec_params[key][1] == struct.pack("<f", -1)
    typed = types.SimpleNamespace(pack=lambda *args, device: struct.pack("<Qf", 0xDEF000, 9.0))
    node.set_args(target, 9, kernel=typed)  # the kernel's own conversion, sliced by layout
    assert fg.driver.exec_params[key] == [(0xDEF000).to_bytes(8, "little"), struct.pack("<f", 9)]
    short = types.SimpleNamespace(pack=lambda *args, device: bytes(8))
    with pytest.raises(TypeError, match="same kernel"):
        node.set_args(target, 9, kernel=short)
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        node.set_args(target)
    with pytest.raises(IndexError, match="no parameter 2"):
        node.set_arg(2, 0)
    state = g._live()
    kept = state.keepalive[("args", int(node._node))]
    assert kept[0] is target  # the graph keeps what its kernels now point into
    g.reset()
    assert state.keepalive == {}
    with pytest.raises(RuntimeError, match="holds no captured graph"):
        node.set_arg(1, 0.0)


def test_a_graph_collected_on_the_callback_thread_is_released_later(
    fake_graphs: FakeGraphs,
) -> None:
    fg = fake_graphs
    g = gpurt.CUDAGraph()
    capture_kernels(fg, g)
    state, pool = g._state, g.pool()
    g._finalizer.detach()  # released below as its finalizer would be, on the driver's thread
    stream = gpurt.Stream()
    stream.launch_host_func(lambda: _capture.release(state))
    stream.synchronize()  # the fake driver runs host functions on a thread of its own
    assert _capture.pending_releases() == 1 and fg.pools.refs[(0, pool)] == 1
    _capture.drain_deferred()
    assert _capture.pending_releases() == 0 and fg.pools.refs[(0, pool)] == 0
    g._state = None


def test_make_graphed_callables_warms_up_then_captures_in_one_pool(fake_graphs: FakeGraphs) -> None:
    fg = fake_graphs
    log: list[tuple[str, int]] = []

    def first(x: HostStatic) -> str:
        stream = gpurt.current_stream().cuda_stream
        log.append(("first", stream))
        fg.driver.launch_kernel(stream, [8], [bytes(8)])
        return "first-out"

    def second(x: HostStatic, scale: float) -> str:
        log.append(("second", gpurt.current_stream().cuda_stream))
        fg.driver.launch_kernel(gpurt.current_stream().cuda_stream, [8], [bytes(8)])
        return "second-out"

    x = HostStatic((3,))
    f1, f2 = gpurt.make_graphed_callables((first, second), ((x,), (x, 0.5)), num_warmup_iters=2)
    assert [name for name, _ in log] == ["first", "first", "second", "second", "first", "second"]
    assert f1.graph.pool() == f2.graph.pool() and fg.pools.refs[(0, f1.graph.pool())] == 2
    new = np.zeros(3, np.float32)
    assert f1(new) == "first-out" and f2(new, 0.5) == "second-out"
    assert x.copied == [new, new]
    assert len(fg.driver.launches) == 2
    single = gpurt.make_graphed_callables(first, (x,), num_warmup_iters=0)
    assert isinstance(single, gpurt.GraphedCallable) and single(x) == "first-out"


# ---- GPU -------------------------------------------------------------------------------

SOURCE = r"""
extern "C" __global__ void axpb(float* y, const float* x, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void mul(float* out, const float* x, const float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * y[i];
}
"""
N = 1 << 16  # 256 KiB of float32: small-pool blocks
rng = np.random.default_rng()


@pytest.fixture(scope="module")
def k():
    """The test kernels, compiled and loaded on the device (loading is not captured)."""
    module = gpurt.compile(SOURCE)
    kernels = types.SimpleNamespace(axpb=module["axpb"], mul=module["mul"])
    a = gpurt.zeros(256)
    axpb(kernels, a, a, 1.0, 0.0, n=256)
    kernels.mul(1, 256, (a, a, a, np.int32(256)))
    gpurt.synchronize()
    return kernels


@pytest.fixture
def gpu(gpu_state):
    """Each GPU test starts and ends with no capture underway and nothing in flight."""
    gpurt.synchronize()
    yield
    gc.collect()
    gpurt.synchronize()
    assert _capture.captures_active() == 0 and _capture.pending_releases() == 0
    assert not gpurt.is_current_stream_capturing()


def rand(n: int = N) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def poisoned(n: int = N) -> gpurt.Array:
    return gpurt.asarray(np.full(n, np.nan, np.float32))


def host(a) -> np.ndarray:
    gpurt.synchronize()
    return a.numpy()


def upload(dst, data: np.ndarray) -> None:
    dst.copy_(data)
    gpurt.synchronize()


def axpb(k, y, x, a: float, b: float, n: int = N, stream=None) -> None:
    args = (y, x, np.float32(a), np.float32(b), np.int32(n))
    k.axpb(((n + 255) // 256,), (256,), args, stream=stream)


def mul(k, out, x, y, n: int = N) -> None:
    k.mul(((n + 255) // 256,), (256,), (out, x, y, np.int32(n)))


def work(k, x, w):
    """(1.5 x - 0.25) * w through a temporary, allocating its output."""
    t = gpurt.empty(N)
    axpb(k, t, x, 1.5, -0.25)
    out = gpurt.empty(N)
    mul(k, out, t, w)
    return out


def capture(g, fn, *args, **kw):
    with gpurt.graph(g, **kw):
        return fn(*args)


def overlaps(a, lo: int, hi: int) -> bool:
    return a.ptr < hi and lo < a.ptr + a.nbytes


@pytest.mark.gpu
def test_replay_is_bit_identical_to_eager_also_with_new_inputs(k, gpu) -> None:
    x_host, w_host = rand(), rand()
    x, w = gpurt.asarray(x_host), gpurt.asarray(w_host)
    eager = host(work(k, x, w))
    reference = (1.5 * x_host.astype(np.float64) - 0.25) * w_host
    np.testing.assert_allclose(eager, reference, rtol=1e-5, atol=1e-6)
    g = gpurt.CUDAGraph()
    out = capture(g, work, k, x, w)
    for trial in range(3):
        if trial:  # overwrite the static inputs in place
            upload(x, rand())
            upload(w, rand())
        upload(out, np.full(N, np.nan, np.float32))
        g.replay()
        assert np.array_equal(host(out), host(work(k, x, w)))
    with gpurt.Stream() as side:  # replay on any stream of the device
        upload(out, np.full(N, np.nan, np.float32))
        g.replay()
        side.synchronize()
    assert np.array_equal(host(out), host(work(k, x, w)))


@pytest.mark.gpu
def test_private_pool_blocks_never_reach_eager_allocations(k, gpu) -> None:
    x = gpurt.asarray(rand())
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        tmp = gpurt.empty(N)
        axpb(k, tmp, x, 2.0, 1.0)
        out = gpurt.empty(N)
        axpb(k, out, tmp, 3.0, 0.0)
        tmp_lo, tmp_hi = tmp.ptr, tmp.ptr + tmp.nbytes
        del tmp  # freed back to the private pool, never to the normal one
    eager = [poisoned() for _ in range(24)]  # 6 MiB: more than a small-pool segment
    for a in eager:
        assert not overlaps(a, tmp_lo, tmp_hi) and not overlaps(a, out.ptr, out.ptr + out.nbytes)
    g.replay()
    want = 3.0 * (2.0 * host(x) + 1.0)
    np.testing.assert_allclose(host(out), want, rtol=1e-6)
    assert all(np.isnan(host(a)).all() for a in eager)  # the replay wrote none of them


@pytest.mark.gpu
@pytest.mark.parametrize("release", ["reset", "gc"])
def test_graph_memory_is_counted_and_returned(k, gpu, release: str) -> None:
    x = gpurt.asarray(rand())
    gpurt.empty_cache()
    allocated, reserved = gpurt.memory_allocated(), gpurt.memory_reserved()
    segments = gpurt.memory_stats()["segment.all.current"]
    g = gpurt.CUDAGraph()
    out = capture(g, work, k, x, x)
    assert gpurt.memory_allocated() == allocated + out.nbytes  # the temporary was freed
    assert gpurt.memory_reserved() > reserved
    assert gpurt.memory_stats()["segment.all.current"] > segments
    gpurt.empty_cache()  # a live graph's pool is not cache: it stays
    assert gpurt.memory_allocated() == allocated + out.nbytes
    assert gpurt.memory_reserved() > reserved
    g.replay()
    del out
    if release == "reset":
        g.reset()
    else:
        del g
        gc.collect()
    gpurt.empty_cache()
    assert gpurt.memory_allocated() == allocated
    assert gpurt.memory_reserved() == reserved


@pytest.mark.gpu
def test_graphs_share_a_pool_until_the_last_one_goes(k, gpu) -> None:
    x = gpurt.asarray(rand())
    gpurt.empty_cache()
    reserved = gpurt.memory_reserved()
    handle = gpurt.graph_pool_handle()
    g1, g2 = gpurt.CUDAGraph(), gpurt.CUDAGraph()
    out1 = capture(g1, work, k, x, x, pool=handle)
    grown = gpurt.memory_reserved()
    out2 = capture(g2, work, k, x, x, pool=g1.pool())
    assert g2.pool() == handle
    assert gpurt.memory_reserved() == grown  # g2's blocks came from the shared segment
    del out1
    g1.reset()
    gpurt.empty_cache()
    assert gpurt.memory_reserved() == grown  # g2 still holds the pool
    upload(out2, np.full(N, np.nan, np.float32))
    g2.replay()
    assert np.array_equal(host(out2), host(work(k, x, x)))
    del out2
    g2.reset()
    gpurt.empty_cache()
    assert gpurt.memory_reserved() == reserved


ILLEGAL = {
    "device synchronize": (lambda s, a: gpurt.synchronize(), "cuCtxSynchronize"),
    "stream synchronize": (lambda s, a: s.synchronize(), "cuStreamSynchronize"),
    "event query": (lambda s, a: s.record_event().query(), "cuEventQuery"),
    # a host read (a.numpy()) is refused before any driver call, leaving the capture going:
    # tests/test_capture_reads.py
    "driver allocation": (lambda s, a: check(cu.cuMemAlloc(1 << 20), "cuMemAlloc"), "cuMemAlloc"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(ILLEGAL))
def test_illegal_work_during_capture_raises_and_recovers(k, gpu, case: str) -> None:
    action, call = ILLEGAL[case]
    x = gpurt.asarray(rand())
    gc.collect()  # arrays of earlier tests in reference cycles go now, not in the middle
    gpurt.empty_cache()
    allocated, reserved = gpurt.memory_allocated(), gpurt.memory_reserved()
    g = gpurt.CUDAGraph()
    a = pool = None
    with pytest.raises(gpurt.GraphCaptureError) as info:
        with gpurt.graph(g):
            pool = g.pool()
            a = gpurt.empty(N)
            axpb(k, a, x, 2.0, 1.0)
            action(gpurt.current_stream(), a)
    text = str(info.value)
    assert "graph capture" in text and call in text and "aborted" in text
    assert not gpurt.is_current_stream_capturing() and _capture.captures_active() == 0
    # `a` lives in the aborted capture's private pool: counted while it is alive ...
    assert gpurt.memory_allocated() == allocated + a.nbytes
    del a, info  # the traceback's frames hold `a` too
    gc.collect()
    gpurt.empty_cache()
    # ... and nothing of the aborted capture is left: no allocation, no cached segment
    assert gpurt.memory_allocated() == allocated and gpurt.memory_reserved() == reserved
    assert not [s for s in gpurt.memory_snapshot() if s["segment_pool_id"] == list(pool)]
    out = capture(g, work, k, x, x)  # the same graph object and stream work again
    g.replay()
    assert np.array_equal(host(out), host(work(k, x, x)))


@pytest.mark.gpu
def test_an_unjoined_fork_fails_at_capture_end_and_streams_stay_usable(k, gpu) -> None:
    x_host = rand()
    x, y = gpurt.asarray(x_host), poisoned()
    side = gpurt.Stream()
    g = gpurt.CUDAGraph()
    with pytest.raises(gpurt.GraphCaptureError, match="joined back"):
        with gpurt.graph(g):
            side.wait_stream(gpurt.current_stream())  # side joins the capture...
            axpb(k, y, x, 2.0, 0.0, stream=side)  # ...and never rejoins
    axpb(k, y, x, 2.0, 0.0, stream=side)
    side.synchronize()
    assert np.array_equal(host(y), 2.0 * x_host)
    # joined properly, the fork is captured and replayed
    joined = gpurt.CUDAGraph()
    z = poisoned()
    with gpurt.graph(joined):
        main = gpurt.current_stream()
        side.wait_stream(main)
        axpb(k, z, x, 3.0, 0.0, stream=side)
        main.wait_stream(side)
    joined.replay()
    assert np.array_equal(host(z), np.float32(3.0) * x_host)


@pytest.mark.gpu
def test_a_side_stream_that_joins_the_capture_allocates_from_the_graphs_pool(k, gpu) -> None:
    x_host = rand()
    x = gpurt.asarray(x_host)
    side = gpurt.Stream()
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        main = gpurt.current_stream()
        side.wait_stream(main)  # side joins the capture (same capture id)
        with side:
            y = gpurt.empty(N)  # allocated on side, during the capture
            axpb(k, y, x, 2.0, 1.0)
        main.wait_stream(side)
    (segment,) = [s for s in gpurt.memory_snapshot()
                  if s["address"] <= y.ptr < s["address"] + s["total_size"]]
    assert segment["segment_pool_id"] == list(g.pool())  # not the eager pool
    eager = [poisoned() for _ in range(24)]  # more than a small-pool segment
    assert not any(overlaps(a, y.ptr, y.ptr + y.nbytes) for a in eager)
    upload(y, np.full(N, np.nan, np.float32))
    g.replay()
    np.testing.assert_array_equal(host(y), np.float32(2.0) * x_host + np.float32(1.0))
    assert all(np.isnan(host(a)).all() for a in eager)


@pytest.mark.gpu
def test_capture_error_modes(k, gpu) -> None:
    x = gpurt.asarray(rand())
    relaxed = gpurt.CUDAGraph()
    with gpurt.graph(relaxed, capture_error_mode="relaxed"):
        axpb(k, gpurt.empty(N), x, 1.0, 0.0)
        ptr = check(cu.cuMemAlloc(4096), "cuMemAlloc")  # allowed in relaxed mode
    check(cu.cuMemFree(ptr), "cuMemFree")
    relaxed.replay()
    # a global capture, with this thread switched to relaxed for one call
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        axpb(k, gpurt.empty(N), x, 1.0, 0.0)
        with gpurt.stream_capture_mode("relaxed"):
            ptr = check(cu.cuMemAlloc(4096), "cuMemAlloc")
    check(cu.cuMemFree(ptr), "cuMemFree")
    # thread_local: another thread may allocate while this one captures
    results: list[object] = []

    def other_thread() -> None:
        gpurt.set_device(0)
        try:
            results.append(check(cu.cuMemAlloc(4096), "cuMemAlloc"))
        except Exception as exc:  # noqa: BLE001 - reported below
            results.append(exc)

    local = gpurt.CUDAGraph()
    with gpurt.graph(local, capture_error_mode="thread_local"):
        axpb(k, gpurt.empty(N), x, 1.0, 0.0)
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert not isinstance(results[0], Exception), results[0]
    check(cu.cuMemFree(results[0]), "cuMemFree")
    local.replay()


@pytest.mark.gpu
def test_capturing_status_is_per_stream_and_thread(k, gpu) -> None:
    seen: list[bool] = []
    g = gpurt.CUDAGraph()
    assert not gpurt.is_current_stream_capturing()
    with gpurt.graph(g):
        axpb(k, gpurt.empty(N), gpurt.empty(N), 1.0, 0.0)
        seen.append(gpurt.is_current_stream_capturing())
        worker = threading.Thread(target=lambda: seen.append(gpurt.is_current_stream_capturing()))
        worker.start()
        worker.join()
    assert seen == [True, False]
    with pytest.raises(RuntimeError, match="non-default stream"):
        gpurt.CUDAGraph().capture_begin()


@pytest.mark.gpu
def test_frees_and_releases_during_capture_are_deferred(k, gpu) -> None:
    x = gpurt.asarray(rand())
    first = gpurt.CUDAGraph()
    capture(first, work, k, x, x)
    first.replay()
    doomed = gpurt.asarray(rand())
    other = gpurt.Stream()
    axpb(k, doomed, x, 1.0, 0.0, stream=other)
    doomed.record_stream(other)
    second = gpurt.CUDAGraph()
    with gpurt.graph(second):
        out = work(k, x, x)
        del doomed  # its cross-stream use must not be queried during capture
        del first
        gc.collect()
        assert _capture.pending_releases() == 1  # no synchronize during capture
    assert _capture.pending_releases() == 0
    second.replay()
    assert np.array_equal(host(out), host(work(k, x, x)))


@pytest.mark.gpu
def test_a_module_collected_during_capture_is_unloaded_after_it(k, gpu) -> None:
    """A module and its kernels form a reference cycle, so the garbage collector frees them
    whenever it runs, mid-capture too (once compile's memory cache has let go of them: a
    suite's tests clear it); cuLibraryUnload then would invalidate the capture."""
    x = gpurt.asarray(rand())
    doomed = gpurt.compile(SOURCE, program_name="doomed.cu")
    axpb(types.SimpleNamespace(axpb=doomed["axpb"]), gpurt.empty(N), x, 1.0, 0.0)  # loaded
    gpurt.synchronize()
    gpurt.nvrtc.clear_cache()  # (k's module lives on through its kernels)
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        out = work(k, x, x)
        del doomed
        gc.collect()
        assert CAPTURES.deferred() >= 1  # the unload waits
    assert CAPTURES.deferred() == 0
    g.replay()
    assert np.array_equal(host(out), host(work(k, x, x)))


@pytest.mark.gpu
def test_kernel_node_arguments_change_without_recapture(k, gpu) -> None:
    x1, y1 = gpurt.asarray(rand()), poisoned()
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        axpb(k, y1, x1, 2.0, 1.0)
        mul(k, y1, y1, x1)
    first, second = g.kernel_nodes()
    assert (first.name, second.name) == ("axpb", "mul")
    assert first.param_sizes == (8, 8, 4, 4, 4) and second.param_sizes == (8, 8, 8, 4)
    assert first.grid == (N // 256, 1, 1) and first.block == (256, 1, 1)
    assert struct.unpack("<f", first.args[2]) == (2.0,)
    x2_host = rand()
    x2, y2 = gpurt.asarray(x2_host), poisoned()
    first.set_args(y2, x2, 3.0, 0.5, N)  # Python numbers packed by the kernel's layout
    second.set_args(y2, y2, x2, N, kernel=k.mul)  # packed by mul's declared types
    g.replay()
    want = gpurt.empty(N)
    axpb(k, want, x2, 3.0, 0.5)
    mul(k, want, want, x2)
    assert np.array_equal(host(y2), host(want))
    assert np.isnan(host(y1)).all()  # the old target is no longer written
    first.set_arg(2, np.float32(-1.0))
    g.replay()
    axpb(k, want, x2, -1.0, 0.5)
    mul(k, want, want, x2)
    assert np.array_equal(host(y2), host(want))
    with pytest.raises(TypeError, match="host numpy array"):
        first.set_arg(1, x2_host)


@pytest.mark.gpu
def test_update_takes_a_recaptured_graph_or_says_why_not(k, gpu) -> None:
    x1, x2 = gpurt.asarray(rand()), gpurt.asarray(rand())
    g1, g2 = gpurt.CUDAGraph(), gpurt.CUDAGraph()
    out1 = capture(g1, work, k, x1, x1)
    out2 = capture(g2, work, k, x2, x2)
    g1.update(g2)
    g2.reset()  # g1 keeps g2's pool: out2 lives there
    del g2
    gc.collect()
    upload(out1, np.full(N, np.nan, np.float32))
    upload(out2, np.full(N, np.nan, np.float32))
    g1.replay()
    assert np.array_equal(host(out2), host(work(k, x2, x2)))
    assert np.isnan(host(out1)).all()
    pointer = struct.unpack("<Q", g1.kernel_nodes()[1].args[0])[0]
    assert pointer == out2.ptr  # the graph's own nodes follow the update
    g3 = gpurt.CUDAGraph()
    with gpurt.graph(g3):
        out3 = work(k, x1, x1)
        axpb(k, out3, out3, 1.0, 1.0)  # one more node
    with pytest.raises(gpurt.GraphUpdateError, match="CU_GRAPH_EXEC_UPDATE_ERROR"):
        g1.update(g3)


@pytest.mark.gpu
def test_debug_dump_writes_the_graph_as_dot(k, gpu, tmp_path) -> None:
    g = gpurt.CUDAGraph()
    g.enable_debug_mode()
    x = gpurt.asarray(rand())
    capture(g, work, k, x, x)
    path = tmp_path / "graph.dot"
    g.debug_dump(path)
    text = path.read_text()
    assert text.lstrip().startswith("digraph") and "axpb" in text and "mul" in text


@pytest.mark.gpu
def test_graphed_callables_match_eager_on_fresh_inputs(k, gpu) -> None:
    def scaled_product(x, w, scale):
        t = gpurt.empty(N)
        axpb(k, t, x, scale, 0.0)
        out = gpurt.empty(N)
        mul(k, out, t, w)
        return out

    def shift(y):
        out = gpurt.empty(N)
        axpb(k, out, y, 1.0, 2.0)
        return out

    x, w = gpurt.asarray(rand()), gpurt.asarray(rand())
    f = gpurt.make_graphed_callables(scaled_product, (x, w, 0.75))
    for _ in range(3):
        nx, nw = gpurt.asarray(rand()), gpurt.asarray(rand())
        got = f(nx, nw, 0.75)
        assert got is f.static_outputs
        assert np.array_equal(host(got), host(scaled_product(nx, nw, 0.75)))
    host_input = rand()
    assert np.array_equal(
        host(f(host_input, nw, 0.75)), host(scaled_product(gpurt.asarray(host_input), nw, 0.75))
    )
    with pytest.raises(ValueError, match="expected shape"):
        f(gpurt.asarray(rand(N // 2)), nw, 0.75)
    first, second = gpurt.make_graphed_callables(
        (scaled_product, shift), ((x, w, 2.0), (gpurt.empty(N),))
    )
    assert first.graph.pool() == second.graph.pool()
    nx = gpurt.asarray(rand())
    result = host(second(first(nx, w, 2.0)))
    assert np.array_equal(result, host(shift(scaled_product(nx, w, 2.0))))


@pytest.mark.gpu
def test_graphs_run_on_torch_memory(k, gpu) -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(N, device="cuda")
    y = torch.full((N,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        axpb(k, y, x, 2.0, 1.0)  # torch tensors as kernel arguments
    for _ in range(2):
        x.copy_(torch.randn(N, device="cuda"))
        torch.cuda.synchronize()
        g.replay()
        gpurt.synchronize()
        want = x.double() * 2.0 + 1.0
        assert torch.allclose(y.double(), want, rtol=1e-6, atol=1e-6)
