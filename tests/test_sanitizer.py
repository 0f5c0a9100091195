"""gpurt.sanitizer: planted races of each kind (write-read, read-write, write-write) across
streams are caught, and the same operations ordered by an event, a stream wait or a
synchronize are not; pointers into an allocation count as it; graph captures are checked at
replay; kernel launches record ``const T*`` parameters as reads and others as writes.

Most of it runs on the CPU against the tracker with made-up streams and allocations (the
allocators report real ones; here the test reports them), and the launch hook on the fake
driver of test_launch_fake_driver.py, on both launch paths. The GPU tests at the end plant
the same races with real kernels, copies and graphs."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

import gpurt
from _fakes import fake_driver_fixture, fake_gpus_fixture  # noqa: F401  (fixtures)
from allocator_model import FakeBackend
from gpurt import sanitizer
from gpurt._core import syncdebug
from gpurt._memory.allocator import CachingAllocator
from gpurt._memory.config import AllocatorConfig
from gpurt._memory.history import HistorySettings
from gpurt._sanitizer import hooks
from gpurt._sanitizer.clocks import stream_key
from gpurt._sanitizer.tracker import Tracker
from test_array import FakeStream, fake_gpu, host_gpu  # noqa: F401  (fixtures)
from test_launch_fake_driver import SOURCE, FakeDriver, fake

S1, S2, S3 = 0x7100, 0x7200, 0x7300  # made-up stream handles (non-blocking streams)
A, B = 0x10_0000, 0x20_0000  # made-up allocations of 4 KiB


def make_tracker() -> Tracker:
    tracker = Tracker()
    tracker.allocated(A, 4096)
    tracker.allocated(B, 4096)
    return tracker


def launch(tracker: Tracker, stream: int, reads: tuple[int, ...] = (),
           writes: tuple[int, ...] = (), what: str = "kernel k", raise_now: bool = True) -> list:
    return tracker.access(stream, 0, [(p, i) for i, p in enumerate(reads)],
                          [(p, len(reads) + i) for i, p in enumerate(writes)], what, raise_now)


@pytest.mark.parametrize("first, second, kind", [
    ("write", "read", "write-read"),
    ("read", "write", "read-write"),
    ("write", "write", "write-write"),
])
def test_each_kind_of_race_across_streams_is_caught(first: str, second: str, kind: str) -> None:
    tracker = make_tracker()
    ops = {"read": lambda s: launch(tracker, s, reads=(A,)),
           "write": lambda s: launch(tracker, s, writes=(A,))}
    assert ops[first](S1) == []
    found = ops[second](S2)
    assert [f.kind for f in found] == [kind]
    assert (found[0].previous.stream, found[0].current.stream) == (S1, S2)
    assert found[0].start == A and found[0].size == 4096


@pytest.mark.parametrize("order", ["event", "stream_wait", "stream_sync", "event_sync",
                                   "device_sync"])
def test_each_ordering_fixes_the_race(order: str) -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(A,))
    if order == "event":
        tracker.event_record(1, S1, 0)
        tracker.event_wait(1, S2, 0)
    elif order == "stream_wait":
        tracker.stream_wait(S2, S1, 0)
    elif order == "stream_sync":
        tracker.stream_synchronize(S1, 0)
    elif order == "event_sync":
        tracker.event_record(1, S1, 0)
        tracker.event_synchronize(1)
    else:
        tracker.device_synchronize(0)
    assert launch(tracker, S2, reads=(A,)) == []
    host_waited = order.endswith("sync")  # then every stream is ordered after the write
    third = launch(tracker, S3, reads=(A,))
    assert [f.kind for f in third] == ([] if host_waited else ["write-read"])
    found = launch(tracker, S1, writes=(A,))  # S1 was not ordered after the reads
    assert [f.kind for f in found] == ["read-write"] * (2 if host_waited else 1)


def test_an_event_recorded_before_the_write_does_not_order_it() -> None:
    tracker = make_tracker()
    tracker.event_record(1, S1, 0)
    launch(tracker, S1, writes=(A,))
    tracker.event_wait(1, S2, 0)
    assert [f.kind for f in launch(tracker, S2, reads=(A,))] == ["write-read"]


def test_ordering_is_transitive_through_a_third_stream() -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(A,))
    tracker.stream_wait(S2, S1, 0)
    tracker.event_record(5, S2, 0)
    tracker.event_wait(5, S3, 0)
    assert launch(tracker, S3, reads=(A,)) == []


def test_same_stream_and_other_allocations_never_conflict() -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(A,))
    assert launch(tracker, S1, reads=(A,), writes=(A,)) == []
    assert launch(tracker, S2, writes=(B,)) == []
    assert launch(tracker, S2, reads=(B + 100,), writes=(0x9999_0000, 0)) == []  # untracked


def test_pointers_into_the_middle_count_as_the_allocation() -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(A + 4000,))
    assert tracker.allocation_of(A + 4095) == (A, 4096)
    assert tracker.allocation_of(A + 4096) is None
    assert [f.kind for f in launch(tracker, S2, reads=(A + 8,))] == ["write-read"]


def test_a_raised_race_records_nothing() -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(A,))
    seq = tracker.clocks.seq
    assert launch(tracker, S2, writes=(A, B)) != []
    assert tracker.clocks.seq == seq  # not queued: no new operation, B untouched
    assert launch(tracker, S3, writes=(B,)) == []
    # the warning mode records it: the next access on S1 conflicts with S2's write
    assert launch(tracker, S2, writes=(A,), raise_now=False) != []
    assert [f.kind for f in launch(tracker, S1, reads=(A,))] == ["write-read"]


def test_a_free_forgets_the_history_of_the_memory() -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(A,))
    tracker.freed(A, 4096)
    assert tracker.allocation_of(A) is None
    assert launch(tracker, S2, reads=(A,)) == []  # untracked now
    tracker.allocated(A, 1024)  # reused (the allocator ordered the reuse)
    assert launch(tracker, S2, writes=(A,)) == []
    assert tracker.allocation_of(A + 2000) is None


def test_the_legacy_stream_orders_blocking_streams_but_not_non_blocking_ones() -> None:
    blocking_stream = 0x7700
    tracker = Tracker(blocking=lambda handle: handle == blocking_stream)
    tracker.allocated(A, 4096)
    launch(tracker, blocking_stream, writes=(A,))
    assert launch(tracker, 0, reads=(A,)) == []  # the legacy stream waits for blocking ones
    assert launch(tracker, blocking_stream, reads=(A,)) == []
    launch(tracker, 0, writes=(A,))
    assert launch(tracker, blocking_stream, reads=(A,)) == []  # and they wait for it
    assert [f.kind for f in launch(tracker, S1, reads=(A,))] == ["write-read"]  # non-blocking


def test_default_streams_are_per_device() -> None:
    assert stream_key(0, 0) == stream_key(1, 0) != stream_key(0, 1)
    assert stream_key(2, 0) != stream_key(0, 0)
    assert stream_key(S1, 3) == S1
    tracker = make_tracker()
    tracker.access(0, 0, [], [(A, 0)], "kernel k", True)
    assert [f.kind for f in tracker.access(0, 1, [(A, 0)], [], "kernel k", True)] == ["write-read"]


def test_graph_capture_is_checked_at_replay() -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(A,))
    tracker.capture_begin(S2, 0)
    assert launch(tracker, S2, reads=(A,), writes=(B,), what="kernel captured") == []
    tracker.event_record(7, S2, 0)  # fork the capture into S3
    tracker.event_wait(7, S3, 0)
    assert launch(tracker, S3, writes=(A,), what="kernel forked") == []
    tracker.stream_wait(S2, S3, 0)
    log = tracker.capture_end(S2, 0)
    assert log is not None and len(log.entries) == 3
    assert launch(tracker, S3, reads=(B,)) == []  # S3 left the capture: checked again
    found = tracker.replay(log, S1, 0, True)
    assert [f.kind for f in found] == ["read-write"]  # S3's read of B, replay writes B
    tracker.stream_wait(S1, S3, 0)
    assert tracker.replay(log, S1, 0, True) == []  # A is written by the replay on S1
    found = launch(tracker, S2, reads=(A,))
    assert [f.kind for f in found] == ["write-read"]
    assert "graph replay (kernel captured, kernel forked)" in found[0].previous.what


def test_the_report_names_both_accesses() -> None:
    tracker = make_tracker()
    launch(tracker, S1, writes=(B, A), what="kernel producer")
    found = launch(tracker, S2, reads=(A,), what="kernel consumer")
    text = str(hooks.SanitizerError(found))
    assert "unordered write-read on the allocation at 0x100000 (4096 bytes)" in text
    assert f"reading argument 0 of kernel consumer on stream {S2:#x}" in text
    assert f"writing argument 1 of kernel producer on stream {S1:#x}" in text
    assert text.count("in test_the_report_names_both_accesses") == 2  # both stacks
    assert "found = launch(tracker, S2" in text  # with source lines


def test_threads_record_at_once() -> None:
    tracker = make_tracker()
    for i in range(8):
        tracker.allocated(0x100_0000 + i * 4096, 4096)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            mine, stream = 0x100_0000 + i * 4096, 0x9000 + i
            for n in range(300):
                assert launch(tracker, stream, reads=(A,), writes=(mine,)) == []
                if n % 50 == 0:  # frees and allocations reported meanwhile, as finalizers do
                    tracker.freed(mine, 4096)
                    tracker.allocated(mine, 4096)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [f.kind for f in launch(tracker, S1, writes=(A,))] == ["read-write"] * 8


@pytest.mark.parametrize("text, const", [
    ("const float*", True), ("float const*", True), ("const float* __restrict__", True),
    ("const float* const", True), ("float*", False), ("float* const", False),
    ("const float**", False), ("float const* const*", True), ("const __nv_bfloat16*", True),
    ("int", False),
])
def test_const_pointers_are_reads(text: str, const: bool) -> None:
    assert sanitizer.reads_only(text) is const


def test_the_caching_allocator_reports_allocations_and_frees() -> None:
    history = HistorySettings()
    allocator = CachingAllocator(0, FakeBackend(), AllocatorConfig(), history)
    tracker = Tracker()
    history.watch(tracker)
    first = allocator.malloc(1000, S1)  # rounded up to 1024 in a 2 MiB segment
    second = allocator.malloc(3000, S1)
    assert tracker.allocation_of(first + 999) == (first, 1024)
    assert tracker.allocation_of(second + 2000) == (second, 3072)
    launch(tracker, S1, writes=(first,))
    allocator.free(first)
    assert tracker.allocation_of(first) is None
    again = allocator.malloc(1000, S1)  # the same block back (the parked path is off)
    assert again == first and tracker.allocation_of(first) == (first, 1024)
    assert launch(tracker, S2, reads=(again,)) == []  # the old write was forgotten
    history.watch(None)
    assert not history.on


# ---- the front: enable, record, warn, environment -----------------------------------------


@pytest.fixture
def sanitized() -> Iterator[None]:
    """The sanitizer on (raising) from a clean slate, then back as it was (GPURT_SANITIZER
    may have turned it on for the whole run)."""
    was_on, was_raising = sanitizer.is_enabled(), hooks.RAISE
    sanitizer.enable_cuda_sanitizer("raise")
    sanitizer.reset()
    yield
    sanitizer.reset()
    if was_on:
        sanitizer.enable_cuda_sanitizer("raise" if was_raising else "warn")
    else:
        sanitizer.disable_cuda_sanitizer()


def test_record_raises_then_warns_by_option(sanitized: None) -> None:
    hooks.TRACKER.allocated(A, 4096)
    sanitizer.record("producer", writes=(A + 16,), stream=S1)
    with pytest.raises(sanitizer.SanitizerError, match="unordered write-read") as info:
        sanitizer.record("consumer", reads=(None, A), stream=S2)
    assert "reading input 1 of consumer" in str(info.value)
    assert [u.kind for u in info.value.unordered] == ["write-read"]
    sanitizer.enable_cuda_sanitizer("warn")
    with pytest.warns(sanitizer.SanitizerWarning, match="unordered write-read") as seen:
        sanitizer.record("consumer", reads=(A,), stream=S2)
    assert seen[0].filename == __file__  # pointed at the caller
    with pytest.raises(ValueError, match='"raise" or "warn"'):
        sanitizer.enable_cuda_sanitizer("loud")


def test_record_is_a_no_op_while_off() -> None:
    if sanitizer.is_enabled():
        pytest.skip("the sanitizer is on for the whole run")
    sanitizer.record("anything", reads=(A,), writes=("not even a pointer",), stream=S1)


def test_disable_forgets_everything(sanitized: None) -> None:
    hooks.TRACKER.allocated(A, 4096)
    sanitizer.record("producer", writes=(A,), stream=S1)
    sanitizer.disable_cuda_sanitizer()
    assert not sanitizer.is_enabled() and not hooks.ON
    assert hooks.TRACKER.allocation_of(A) is None
    sanitizer.enable_cuda_sanitizer()
    hooks.TRACKER.allocated(A, 4096)
    sanitizer.record("consumer", reads=(A,), stream=S2)  # the earlier write is forgotten


@pytest.mark.parametrize("value, on, raising", [("1", True, True), ("warn", True, False),
                                                ("0", False, True), ("", False, True)])
def test_the_environment_variable_turns_it_on_at_import(value: str, on: bool,
                                                        raising: bool) -> None:
    code = ("import gpurt; from gpurt._sanitizer import hooks; "
            "print(gpurt.sanitizer.is_enabled(), hooks.RAISE)")
    env = dict(os.environ, GPURT_SANITIZER=value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == [str(on), str(raising)]


def test_copies_and_fills_are_recorded(host_gpu, sanitized: None) -> None:
    x = np.arange(128, dtype=np.float32)
    a = gpurt.empty(128)  # on the default stream
    side = FakeStream(0xBEE)
    b = gpurt.empty(128, stream=side)
    for array in (a, b):
        hooks.TRACKER.allocated(array.ptr, array.nbytes)  # the fake allocator reports nothing
    a.copy_(x)  # host to device on the default stream, waited for
    b[1:].copy_(a[1:])  # b's stream waits for a's, then reads a
    with pytest.raises(sanitizer.SanitizerError, match="read-write") as info:
        a.fill_(2.0)  # a's stream never waited for b's read
    (race,) = info.value.unordered
    assert race.current.describe() == "writing fill on stream 0x0"
    assert race.previous.describe() == "reading copy (device to device) on stream 0xbee"
    np.testing.assert_array_equal(b[1:].to_numpy(), x[1:])  # b's stream is waited for
    a.fill_(2.0)  # ... which orders the read before the fill
    np.testing.assert_array_equal(a.to_numpy(), np.full(128, 2.0, np.float32))


def test_gpurt_streams_and_events_order_accesses(fake_driver, sanitized: None) -> None:
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    hooks.TRACKER.allocated(A, 4096)
    sanitizer.record("producer", writes=(A,), stream=s1)
    with pytest.raises(sanitizer.SanitizerError, match="write-read"):
        sanitizer.record("consumer", reads=(A,), stream=s2)
    s2.wait_stream(s1)  # an Event recorded on s1, waited for by s2
    sanitizer.record("consumer", reads=(A,), stream=s2)
    with pytest.raises(sanitizer.SanitizerError, match="read-write"):
        sanitizer.record("producer", writes=(A,), stream=s1)
    s1.wait_event(s2.record_event())
    sanitizer.record("producer", writes=(A,), stream=s1)
    done = s1.record_event()
    sanitizer.record("late", writes=(A,), stream=s1)  # after the event: not covered by it
    done.synchronize()
    with pytest.raises(sanitizer.SanitizerError, match="write-read"):
        sanitizer.record("consumer", reads=(A,), stream=s2)
    s1.synchronize()
    sanitizer.record("consumer", reads=(A,), stream=s2)


def test_stream_synchronize_is_a_sync_debug_site(fake_driver, sync_mode: None) -> None:
    s = gpurt.Stream()
    event = s.record_event()
    gpurt.set_sync_debug_mode("warn")
    with pytest.warns(UserWarning, match=r"synchronizing CUDA operation: Stream.synchronize\(\)"):
        s.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        event.synchronize()  # as torch's Event.synchronize: not a site
    gpurt.set_sync_debug_mode("error")
    calls = len(fake_driver.calls)
    with pytest.raises(RuntimeError, match="synchronizing CUDA operation"):
        s.synchronize()
    assert len(fake_driver.calls) == calls  # raised before waiting


# ---- kernel launches on the fake driver (both launch paths) --------------------------------


def test_launches_record_const_pointers_as_reads(fake: FakeDriver, sanitized: None) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]  # (a, const x, const y, out, n)
    hooks.TRACKER.allocated(A, 4096)
    hooks.TRACKER.allocated(B, 4096)
    kernel(1, 32, (1.0, A, A + 64, B, 8), stream=S1)
    kernel(1, 32, (1.0, A, A, 0x5555_0000, 8), stream=S2)  # reads of A: no conflict
    with pytest.raises(sanitizer.SanitizerError) as info:
        kernel(1, 32, (1.0, B + 4, A, 0x5555_0000, 8), stream=S2)
    (race,) = info.value.unordered
    assert race.kind == "write-read"
    assert race.current.describe() == f"reading argument 1 of kernel axpy on stream {S2:#x}"
    assert race.previous.describe() == f"writing argument 3 of kernel axpy on stream {S1:#x}"
    text = str(info.value)  # the stacks end at the launching lines, not inside gpurt
    assert "kernel(1, 32, (1.0, B + 4, A, 0x5555_0000, 8), stream=S2)" in text
    assert "kernel(1, 32, (1.0, A, A + 64, B, 8), stream=S1)" in text
    assert "_hooked" not in text and "_on_launch" not in text
    assert len(fake.launches) == 2  # the racing launch was not queued
    with pytest.raises(sanitizer.SanitizerError, match="read-write"):
        kernel(1, 32, (1.0, B, B, A, 8), stream=S3)  # writes A, read on S1 and S2
    hooks.TRACKER.stream_wait(S3, S1, 0)
    hooks.TRACKER.stream_wait(S3, S2, 0)
    kernel(1, 32, (1.0, B, B, A, 8), stream=S3)
    assert len(fake.launches) == 3


# ---- sync debug mode ----------------------------------------------------------------------


@pytest.fixture
def sync_mode() -> Iterator[None]:
    before = gpurt.get_sync_debug_mode()
    yield
    gpurt.set_sync_debug_mode(before)


def test_sync_debug_mode_values(sync_mode: None) -> None:
    for value, level in (("warn", 1), ("error", 2), ("default", 0), (1, 1), (2, 2), (0, 0)):
        gpurt.set_sync_debug_mode(value)
        assert gpurt.get_sync_debug_mode() == level
    for bad in ("loud", 3, -1, True, 1.0, None):
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            gpurt.set_sync_debug_mode(bad)
    assert gpurt.get_sync_debug_mode() == 0


def test_sync_debug_mode_warns_or_raises(sync_mode: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        syncdebug.warn_or_error_on_sync("a test")  # default: silent
    gpurt.set_sync_debug_mode("warn")
    with pytest.warns(UserWarning, match="called a synchronizing CUDA operation: a test") as seen:
        syncdebug.warn_or_error_on_sync("a test")
    assert seen[0].filename == __file__
    gpurt.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match="called a synchronizing CUDA operation: a test"):
        syncdebug.warn_or_error_on_sync("a test")


# ---- on the GPU ---------------------------------------------------------------------------

KERNELS = r"""
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""
N = 1 << 16


@pytest.fixture
def kernels(gpu_state: None) -> dict[str, gpurt.Kernel]:
    module = gpurt.compile(KERNELS)
    return {"scale": module["scale"], "spin": module["spin"]}


def _random(n: int = N) -> gpurt.Array:
    return gpurt.asarray(np.random.default_rng().standard_normal(n).astype(np.float32))


@pytest.mark.gpu
@pytest.mark.races
def test_gpu_kernel_races_are_caught_and_fixed_by_an_event(kernels: dict, sanitized: None
                                                           ) -> None:
    scale = kernels["scale"]
    x, y, z = _random(), gpurt.empty(N), gpurt.empty(N)
    gpurt.synchronize()
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    grid = (N // 256,)
    scale(grid, (256,), (x, y, 2.0, N), stream=s1)  # writes y on s1
    with pytest.raises(sanitizer.SanitizerError, match="write-read") as info:
        scale(grid, (256,), (y[1:], z, 3.0, N - 1), stream=s2)  # reads y (a view) on s2
    assert f"on stream {s1.cuda_stream:#x}" in str(info.value)
    with pytest.raises(sanitizer.SanitizerError, match="write-write"):
        scale(grid, (256,), (x, y, 3.0, N), stream=s2)
    event = s1.record_event()
    s2.wait_event(event)
    z.fill_(np.nan)  # poisoned on the default stream, ordered before s2 below
    s2.wait_stream(gpurt.default_stream())
    scale(grid, (256,), (y, z, 3.0, N), stream=s2)
    with pytest.raises(sanitizer.SanitizerError, match="write-read"):
        z.to_numpy()  # z's stream (the default one) has not waited for s2
    s2.synchronize()
    np.testing.assert_allclose(z.to_numpy(), 6.0 * x.to_numpy().astype(np.float64), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.races
def test_gpu_copies_and_fills_are_recorded(kernels: dict, sanitized: None) -> None:
    x, y = _random(), gpurt.empty(N)
    gpurt.synchronize()
    s1 = gpurt.Stream()
    y.fill_(1.0)  # on y's stream, the default stream
    with pytest.raises(sanitizer.SanitizerError, match="write-write"):
        kernels["scale"]((N // 256,), (256,), (x, y, 2.0, N), stream=s1)
    s1.wait_stream(gpurt.default_stream())
    kernels["scale"]((N // 256,), (256,), (x, y, 2.0, N), stream=s1)  # writes y on s1
    with pytest.raises(sanitizer.SanitizerError, match="write-write"):
        y.copy_(x)  # on the default stream
    gpurt.default_stream().wait_stream(s1)
    y.copy_(x)
    np.testing.assert_array_equal(y.to_numpy(), x.to_numpy())


@pytest.mark.gpu
@pytest.mark.races
def test_gpu_graph_replay_is_ordered_by_its_stream(kernels: dict, sanitized: None) -> None:
    scale = kernels["scale"]
    x, y = _random(), gpurt.empty(N)
    gpurt.synchronize()
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        scale((N // 256,), (256,), (x, y, 2.0, N))
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    s1.wait_stream(gpurt.default_stream())
    with s1:
        graph.replay()  # writes y on s1
    w = gpurt.empty(N, stream=s2)
    with pytest.raises(sanitizer.SanitizerError, match="write-read") as info:
        scale((N // 256,), (256,), (y, w, 1.0, N), stream=s2)
    assert [u.kind for u in info.value.unordered] == ["write-read"]
    assert "graph replay (kernel scale)" in str(info.value)
    s2.wait_stream(s1)
    z = gpurt.empty(N, stream=s2)
    scale((N // 256,), (256,), (y, z, 0.5, N), stream=s2)
    s2.synchronize()
    np.testing.assert_allclose(z.to_numpy(), x.to_numpy().astype(np.float64), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.races
def test_gpu_bundled_softmax_records_its_operands(kernels: dict, sanitized: None) -> None:
    from gpurt.kernels import softmax

    x, y = _random(64 * 256).reshape(64, 256), gpurt.empty((64, 256))
    gpurt.synchronize()
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    kernels["scale"]((64,), (256,), (x, x, 2.0, 64 * 256), stream=s1)  # writes x on s1
    with pytest.raises(sanitizer.SanitizerError, match="write-read"):
        softmax(x, out=y, stream=s2)
    s2.wait_stream(s1)
    softmax(x, out=y, stream=s2)
    s2.synchronize()


@pytest.mark.gpu
@pytest.mark.races
def test_gpu_bundled_gemm_records_operands_hidden_in_tma_descriptors(
        gpu_state: None, sanitized: None, monkeypatch: pytest.MonkeyPatch) -> None:
    gemm_mod = importlib.import_module("gpurt.kernels.gemm")  # the module, not the function

    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    gemm_mod.clear_plans()  # plans remember the settings they were made under
    rng = np.random.default_rng()
    a_host = rng.standard_normal((512, 256)).astype(np.float32).astype(gpurt.bfloat16)
    b_host = rng.standard_normal((256, 384)).astype(np.float32).astype(gpurt.bfloat16)
    s1, s2 = gpurt.Stream(), gpurt.Stream()
    a = gpurt.empty((512, 256), dtype=gpurt.bfloat16, stream=s1)
    a.copy_(a_host, non_blocking=True)  # writes a on s1, not waited for
    b = gpurt.asarray(b_host)
    out = gpurt.full((512, 384), np.nan, dtype=gpurt.bfloat16, stream=s2)
    with pytest.raises(sanitizer.SanitizerError, match="write-read") as info:
        gemm_mod.gemm(a, b, out=out, stream=s2)
    assert "reading input 0 of gemm" in str(info.value)
    s2.wait_stream(s1)
    gemm_mod.gemm(a, b, out=out, stream=s2)
    got = out.to_numpy().astype(np.float64)  # on out's stream, s2
    want = a_host.astype(np.float64) @ b_host.astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    gemm_mod.clear_plans()


@pytest.mark.gpu
def test_gpu_sync_debug_mode_sites(kernels: dict, sync_mode: None) -> None:
    x = _random()
    s = gpurt.Stream()
    event = s.record_event()
    gpurt.set_sync_debug_mode("warn")
    for call in (lambda: x.to_numpy(), lambda: x[:1].item(), s.synchronize,
                 lambda: x.copy_(np.zeros(N, np.float32))):
        with pytest.warns(UserWarning, match="called a synchronizing CUDA operation"):
            call()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpurt.synchronize()  # explicit device and event synchronizes don't, as in torch
        event.synchronize()
        x.to_numpy(out=np.empty(N, np.float32), non_blocking=True)
    gpurt.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match="called a synchronizing CUDA operation"):
        x.to_numpy()
    gpurt.set_sync_debug_mode("default")
    assert np.isfinite(x.to_numpy()).all()
