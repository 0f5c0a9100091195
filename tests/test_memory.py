"""gpurt.memory: configuration, the public API before and after CUDA starts, the driver
backends, pinned host memory, and agreement with torch's allocator on the GPU.

CPU tests need no driver; ``@pytest.mark.gpu`` tests run on the GPU machine. The policy
itself is tested in depth on the CPU in tests/test_allocator.py."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt
from _fakes import fake_driver_fixture, fake_gpus_fixture  # noqa: F401
from gpurt import memory as mem
from gpurt._elementwise import counters as fold_counters
from gpurt._memory import config as _allocconf
from gpurt._memory import summary as _memsummary
from gpurt.device import bind_context

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def ok(result: tuple):
    assert int(result[0]) == 0, result[0]
    return result[1] if len(result) == 2 else result[1:]


# ---- configuration (CPU) ----------------------------------------------------------------


def test_config_defaults_are_torchs():
    config = _allocconf.parse(None)
    assert config.backend == "native" and config.caching
    assert config.max_split_size_stat == -1
    assert config.max_non_split_rounding_size == 20 * MiB
    assert config.garbage_collection_threshold == 0.0
    assert not config.rounds_to_power2


def test_config_parses_torch_keys():
    config = _allocconf.parse(
        "backend:cudaMallocAsync, max_split_size_mb:128,garbage_collection_threshold:0.6,"
        "roundup_power2_divisions:[256:1,512:2,>:8],max_non_split_rounding_mb:64,"
        "expandable_segments:False,release_lock_on_cudamalloc:True"
    )
    assert config.backend == "cudaMallocAsync"
    assert config.max_split_size == 128 * MiB and config.max_split_size_stat == 128 * MiB
    assert config.garbage_collection_threshold == 0.6
    assert config.max_non_split_rounding_size == 64 * MiB
    table = config.roundup_power2_divisions
    assert table[:8] == (1,) * 8 and table[8] == 1 and table[9:] == (8,) * 7
    assert _allocconf.parse("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16


@pytest.mark.parametrize("text, key", [
    ("max_split_size_mb:10", "max_split_size_mb"),
    ("max_split_size_mb:lots", "max_split_size_mb"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold"),
    ("garbage_collection_threshold:x", "garbage_collection_threshold"),
    ("roundup_power2_divisions:3", "roundup_power2_divisions"),
    ("roundup_power2_divisions:[3:2]", "roundup_power2_divisions"),
    ("roundup_power2_divisions:[256:1", "roundup_power2_divisions"),
    ("backend:magic", "backend"),
    ("expandable_segments:yes", "expandable_segments"),
    ("max_split_size_mb", "max_split_size_mb"),
    ("no_such_key:1", "no_such_key"),
])
def test_config_errors_name_the_key(text, key):
    with pytest.raises(_allocconf.AllocatorConfigError, match=key):
        _allocconf.parse(text)
    assert issubclass(mem.AllocatorConfigError, ValueError)


def test_config_from_environment(monkeypatch):
    monkeypatch.setenv("GPURT_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.setenv("GPURT_NO_CACHING", "1")
    config = _allocconf.from_environment()
    assert config.max_split_size == 64 * MiB and not config.caching
    monkeypatch.setenv("GPURT_NO_CACHING", "0")
    assert _allocconf.from_environment().caching


def test_roundup_helper_matches_torchs_example():
    # torch's comment: 1200 with 4 divisions between 1024 and 2048 rounds to 1280
    assert _allocconf.roundup_power2_next_division(1200, 4) == 1280
    assert _allocconf.roundup_power2_next_division(1024, 4) == 1024
    assert _allocconf.roundup_power2_next_division(1280, 4) == 1280


# ---- the public API without a driver (CPU) ----------------------------------------------

needs_no_driver = pytest.mark.skipif(gpurt.is_available(), reason="checks the no-driver path")


@needs_no_driver
def test_functions_return_zeros_before_cuda_starts():
    assert mem.memory_stats() == {} and mem.memory_stats_as_nested_dict() == {}
    for fn in (mem.memory_allocated, mem.max_memory_allocated, mem.memory_reserved,
               mem.max_memory_reserved):
        assert fn() == 0
    mem.reset_peak_memory_stats()
    mem.reset_accumulated_memory_stats()
    mem.empty_cache()
    assert mem.get_per_process_memory_fraction() == 1.0
    assert mem.memory_snapshot() == []
    assert mem._snapshot() == {"segments": [], "device_traces": []}
    assert "Allocated memory" in mem.memory_summary()
    assert not mem.captures_underway(0)


@needs_no_driver
def test_allocating_without_a_driver_fails_clearly():
    with pytest.raises(gpurt.CudaUnavailableError, match="driver"):
        mem.caching_allocator_alloc(1024)
    with pytest.raises(gpurt.CudaUnavailableError):
        gpurt.pinned_empty(16)


def test_dump_snapshot_writes_json(tmp_path):
    path = tmp_path / "snap.json"
    mem._dump_snapshot(str(path))
    doc = json.loads(path.read_text())
    assert set(doc) == {"segments", "device_traces"}


def test_record_memory_history_validates_arguments():
    with pytest.raises(ValueError):
        mem._record_memory_history(enabled="sometimes")
    with pytest.raises(ValueError):
        mem._record_memory_history(context="nope")
    with pytest.raises(ValueError):
        mem._record_memory_history(stacks="cpp")
    mem._record_memory_history(enabled=None)


def test_pool_ids_are_fresh_pairs():
    a, b = mem.new_pool_id(), mem.new_pool_id()
    assert isinstance(a, tuple) and len(a) == 2 and a != b


def test_data_ptr_of_arrays_and_pointers():
    class WithDataPtr:
        def data_ptr(self):
            return 4096

    class WithInterface:
        __cuda_array_interface__ = {"data": (8192, False)}

    assert mem._data_ptr(1) == 1
    assert mem._data_ptr(WithDataPtr()) == 4096
    assert mem._data_ptr(WithInterface()) == 8192
    with pytest.raises(TypeError):
        mem._data_ptr("x")


def test_summary_layout_and_units():
    stats = {"allocated_bytes.all.current": 3 * GiB, "allocated_bytes.all.peak": 4 * GiB,
             "allocation.all.current": 12, "allocation.all.peak": 900_000, "num_ooms": 2}
    text = _memsummary.summary_table(stats, 0)
    assert "GPU reserved memory" in text and "from small pool" in text
    assert "3072 MiB" in text and "4096 MiB" in text and "CUDA OOMs: 2" in text
    short = _memsummary.summary_table(stats, 0, abbreviated=True)
    assert "from small pool" not in short and "\x1b[" not in short
    assert "expandable" not in text
    assert "expandable segments: on" in _memsummary.summary_table(stats, 0, expandable=True)


def test_host_memory_stats_keys_match_torch():
    keys = set(gpurt.host_memory_stats())
    for family in ("allocations", "allocated_bytes", "active_requests", "active_bytes"):
        assert {f"{family}.{f}" for f in ("current", "peak", "allocated", "freed")} <= keys
    for timing in ("host_alloc_time", "host_free_time"):
        assert {f"{timing}.{f}" for f in ("total", "max", "min", "count", "avg")} <= keys
    assert {"num_host_alloc", "num_host_free"} <= keys


# ---- on the GPU ---------------------------------------------------------------------------


def _run_file(script: str, args: list[str], env: dict | None = None, timeout: int = 120) -> str:
    """Run a Python script in a fresh process (fresh allocators); return its stdout."""
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    result = subprocess.run([sys.executable, script, *args], env=full_env,
                            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _run(code: str, env: dict | None = None, timeout: int = 120) -> str:
    """Run Python code in a fresh process (fresh allocators); return its stdout."""
    return _run_file("-c", [textwrap.dedent(code)], env, timeout)


def _fill(ptr: int, data: np.ndarray) -> None:
    ok(cu.cuMemcpyHtoD(ptr, data.ctypes.data, data.nbytes))


def _read(ptr: int, nbytes: int) -> np.ndarray:
    out = np.full(nbytes, 0xAB, np.uint8)  # poisoned
    ok(cu.cuMemcpyDtoH(out.ctypes.data, ptr, nbytes))
    return out


@pytest.fixture
def fresh(no_kept_memory):
    """Empty caches and reset statistics before and after a GPU test (after dropping the
    memory earlier tests of this process left allocated: conftest.no_kept_memory)."""
    gpurt.reset_peak_memory_stats()
    gpurt.reset_accumulated_memory_stats()
    yield
    mem._record_memory_history(enabled=None)
    gpurt.synchronize()
    gpurt.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("conf", ["", "max_split_size_mb:64,roundup_power2_divisions:4",
                                  "expandable_segments:True"])
def test_statistics_equal_torch_on_random_traces(conf):
    """The same traces through torch and gpurt, each in a fresh process: every shared
    memory_stats() key and every segment layout equal at every checkpoint."""
    pytest.importorskip("torch")
    sys.path.insert(0, HERE)
    try:
        import memory_vs_torch
    finally:
        sys.path.remove(HERE)
    seeds = list(range(5))
    env = {"PYTORCH_CUDA_ALLOC_CONF": conf, "GPURT_ALLOC_CONF": conf}
    script = os.path.join(HERE, "memory_vs_torch.py")
    records = {}
    for which in ("torch", "gpurt"):
        out = _run_file(script, [which, *map(str, seeds)], env, timeout=300)
        records[which] = json.loads(out.strip().splitlines()[-1])
    report = memory_vs_torch.compare(seeds, records["torch"], records["gpurt"])
    assert report["keys"] > 100
    if report["missing_in_gpurt"]:  # keys a newer torch added: worth knowing, not a mismatch
        warnings.warn(f"torch keys gpurt lacks: {report['missing_in_gpurt']}", stacklevel=1)
    assert report["ok"], "\n".join(report["problems"])


@pytest.mark.gpu
def test_memory_is_real_and_statistics_follow(fresh):
    base_allocated, base_reserved = gpurt.memory_allocated(), gpurt.memory_reserved()
    base_count = gpurt.memory_stats()["allocation.all.current"]
    rng = np.random.default_rng(1)
    sizes = [100, 4 * KiB, 1 * MiB, 3 * MiB + 7, 64 * MiB]
    ptrs = [gpurt.caching_allocator_alloc(n) for n in sizes]
    datas = [rng.integers(0, 255, n, dtype=np.uint8) for n in sizes]
    for ptr, data in zip(ptrs, datas):
        _fill(ptr, data)
    for ptr, data in zip(ptrs, datas):
        np.testing.assert_array_equal(_read(ptr, data.nbytes), data)
    stats = gpurt.memory_stats()
    assert stats["allocation.all.current"] == base_count + len(sizes)
    assert gpurt.memory_allocated() >= base_allocated + sum(sizes)
    assert gpurt.memory_reserved() >= gpurt.memory_allocated()
    free_before, _ = gpurt.mem_get_info()
    for ptr in ptrs:
        gpurt.caching_allocator_delete(ptr)
    assert gpurt.memory_allocated() == base_allocated
    assert gpurt.memory_reserved() > base_reserved
    gpurt.empty_cache()
    assert gpurt.memory_reserved() == base_reserved
    assert gpurt.mem_get_info()[0] > free_before
    assert "Allocated memory" in gpurt.memory_summary()


def _wait_flag():
    """A pinned flag and a function that makes a stream wait for it (cuStreamWaitValue32)."""
    host = ok(cu.cuMemHostAlloc(4, 0x02))  # CU_MEMHOSTALLOC_DEVICEMAP
    flag = ctypes.c_uint32.from_address(int(host))
    flag.value = 0
    dev = ok(cu.cuMemHostGetDevicePointer(host, 0))

    def hold(stream):
        ok(cu.cuStreamWaitValue32(stream, dev, 1, 0))  # CU_STREAM_WAIT_VALUE_GEQ

    return host, flag, hold


@pytest.mark.gpu
def test_record_stream_waits_for_real_work(fresh):
    gpurt.init()
    bind_context(gpurt.current_device())
    side = ok(cu.cuStreamCreate(1))
    host, flag, hold = _wait_flag()
    base = gpurt.memory_stats()
    try:
        ptr = gpurt.caching_allocator_alloc(256 * KiB)
        hold(side)  # the side stream is stuck until the flag is set
        ok(cu.cuMemsetD8Async(ptr, 7, 256 * KiB, side))
        gpurt.record_stream(ptr, int(side))
        gpurt.caching_allocator_delete(ptr)
        stats = gpurt.memory_stats()
        assert stats["active_bytes.all.current"] == base["active_bytes.all.current"] + 256 * KiB
        assert stats["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
        again = [gpurt.caching_allocator_alloc(256 * KiB) for _ in range(2)]
        assert ptr not in again  # still in use on the side stream: not handed out
        for p in again:
            gpurt.caching_allocator_delete(p)
        states = {b["state"] for s in gpurt.memory_snapshot() for b in s["blocks"]
                  if b["address"] == ptr}
        assert states == {"active_pending_free"}
        flag.value = 1
        ok(cu.cuStreamSynchronize(side))
        gpurt.caching_allocator_delete(gpurt.caching_allocator_alloc(512))  # polls events
        stats = gpurt.memory_stats()
        assert stats["active_bytes.all.current"] == base["active_bytes.all.current"]
        states = {b["state"] for s in gpurt.memory_snapshot() for b in s["blocks"]
                  if b["address"] == ptr}
        assert "active_pending_free" not in states
        assert (_read(ptr, 256 * KiB) == 7).all()  # the delayed work did run, into our block
    finally:
        flag.value = 1
        ok(cu.cuStreamSynchronize(side))
        ok(cu.cuStreamDestroy(side))
        ok(cu.cuMemFreeHost(host))


@pytest.mark.gpu
def test_out_of_memory_is_clear_and_recoverable(fresh):
    _, total = gpurt.mem_get_info()
    keep = gpurt.caching_allocator_alloc(8 * MiB)
    before = gpurt.memory_stats()
    with pytest.raises(gpurt.OutOfMemoryError) as info:
        gpurt.caching_allocator_alloc(total + GiB)
    err = info.value
    assert isinstance(err, MemoryError) and err.name == "CUDA_ERROR_OUT_OF_MEMORY"
    text = str(err)
    for part in ("CUDA out of memory", "Tried to allocate", "total capacity", "is free",
                 "allocated by gpurt", "reserved by gpurt but unallocated"):
        assert part in text, text
    after = gpurt.memory_stats()
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    ptr = gpurt.caching_allocator_alloc(4 * MiB)  # still usable
    _fill(ptr, np.arange(4 * MiB, dtype=np.uint8))
    gpurt.caching_allocator_delete(ptr)
    gpurt.caching_allocator_delete(keep)


@pytest.mark.gpu
def test_per_process_fraction(fresh):
    try:
        gpurt.set_per_process_memory_fraction(0.01)
        assert gpurt.get_per_process_memory_fraction() == 0.01
        _, total = gpurt.mem_get_info()
        with pytest.raises(gpurt.OutOfMemoryError, match="allowed"):
            gpurt.caching_allocator_alloc(int(total * 0.02))
    finally:
        gpurt.set_per_process_memory_fraction(1.0)
    with pytest.raises(ValueError):
        gpurt.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError):
        gpurt.set_per_process_memory_fraction(1)


@pytest.mark.gpu
def test_threads_hammering_the_allocator(fresh):
    base = gpurt.memory_allocated()
    errors = []

    def work(seed):
        try:
            gpurt.set_device(0)  # binds the context for the raw driver calls below
            rng = np.random.default_rng(seed)
            live = []
            for _ in range(400):
                n = int(rng.choice([512, 4 * KiB, 200 * KiB, 2 * MiB, 12 * MiB]))
                ptr = gpurt.caching_allocator_alloc(n)
                ok(cu.cuMemsetD8(ptr, seed, n))
                live.append((ptr, n))
                if len(live) > 8:
                    p, size = live.pop(0)
                    assert (_read(p, min(size, 4096)) == seed).all()
                    gpurt.caching_allocator_delete(p)
            for p, _ in live:
                gpurt.caching_allocator_delete(p)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s + 1,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert gpurt.memory_allocated() == base


@pytest.mark.gpu
def test_delete_from_a_finalizer(fresh):
    class Owner:
        pass

    base = gpurt.memory_allocated()
    owner = Owner()
    ptr = gpurt.caching_allocator_alloc(1 * MiB)
    weakref.finalize(owner, gpurt.caching_allocator_delete, ptr)
    assert gpurt.memory_allocated() == base + 1 * MiB
    del owner
    assert gpurt.memory_allocated() == base


@pytest.mark.gpu
def test_history_and_snapshot_of_real_allocations(fresh, tmp_path):
    mem._record_memory_history("all", max_entries=1000)
    ptr = gpurt.caching_allocator_alloc(3 * MiB)
    snap = mem._snapshot()
    block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == ptr)
    assert block["state"] == "active_allocated" and block["requested_size"] == 3 * MiB
    names = [f["name"] for f in block["frames"]]
    assert "test_history_and_snapshot_of_real_allocations" in names
    gpurt.caching_allocator_delete(ptr)
    trace = mem._snapshot()["device_traces"][gpurt.current_device()]
    assert [e["action"] for e in trace][-3:] == ["alloc", "free_requested", "free_completed"]
    mem._dump_snapshot(str(tmp_path / "s.json"))
    assert json.loads((tmp_path / "s.json").read_text())["device_traces"]


@pytest.mark.gpu
def test_private_pool_during_a_real_capture(fresh):
    bind_context(gpurt.current_device())
    index = gpurt.current_device()
    stream = ok(cu.cuStreamCreate(1))
    pool = mem.new_pool_id()
    mem.retain_pool(index, pool)
    mem.begin_allocate_to_pool(index, pool, int(stream))
    ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    try:
        ptr = gpurt.caching_allocator_alloc(5 * MiB, stream=int(stream))  # cuMemAlloc, relaxed
        ok(cu.cuMemsetD8Async(ptr, 1, 5 * MiB, stream))
        gpurt.caching_allocator_delete(ptr)
        gpurt.empty_cache()  # deferred, not illegal
    finally:
        graph = ok(cu.cuStreamEndCapture(stream))
        mem.end_allocate_to_pool(index, pool)
    assert mem.captures_underway(index) is False
    (segment,) = [s for s in gpurt.memory_snapshot() if s["segment_pool_id"] == list(pool)]
    assert segment["total_size"] == 20 * MiB
    eager = gpurt.caching_allocator_alloc(5 * MiB, stream=int(stream))
    assert not segment["address"] <= eager < segment["address"] + segment["total_size"]
    gpurt.caching_allocator_delete(eager)
    ok(cu.cuGraphDestroy(graph))
    mem.release_pool(index, pool)
    gpurt.empty_cache()
    assert not [s for s in gpurt.memory_snapshot() if s["segment_pool_id"] == list(pool)]
    ok(cu.cuStreamDestroy(stream))


@pytest.mark.gpu
def test_pinned_host_allocator(fresh):
    base = gpurt.host_memory_stats()
    a = gpurt.pinned_empty((1000,), np.float32)
    assert gpurt.is_pinned(a) and not gpurt.is_pinned(np.zeros(10))
    a[:] = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    stats = gpurt.host_memory_stats()
    assert stats["active_requests.current"] == base["active_requests.current"] + 1
    assert stats["active_bytes.current"] == base["active_bytes.current"] + 4096
    dptr = gpurt.caching_allocator_alloc(a.nbytes)
    ok(cu.cuMemcpyHtoDAsync(dptr, a.ctypes.data, a.nbytes, 0))
    ok(cu.cuStreamSynchronize(0))
    out = np.frombuffer(_read(dptr, a.nbytes).tobytes(), np.float32)
    np.testing.assert_array_equal(out, a)
    address = a.ctypes.data
    view = a[10:20]
    del a
    assert gpurt.host_memory_stats()["active_requests.current"] == stats["active_requests.current"]
    del view  # the last view frees the block
    assert gpurt.host_memory_stats()["active_requests.current"] == base["active_requests.current"]
    b = gpurt.pinned_empty((1000,), np.float32)
    assert b.ctypes.data == address  # reused from the cache
    host_allocs = gpurt.host_memory_stats()["num_host_alloc"]
    c = gpurt.pin_memory(np.arange(10.0))
    np.testing.assert_array_equal(c, np.arange(10.0))
    gpurt.host_record_stream(b, 0)
    del b, c
    gpurt.host_empty_cache()
    after = gpurt.host_memory_stats()
    assert after["num_host_free"] >= 1 and after["num_host_alloc"] >= host_allocs
    gpurt.caching_allocator_delete(dptr)


@pytest.mark.gpu
def test_cuda_malloc_async_backend():
    out = _run("""
        import json, gpurt
        from cuda.bindings import driver as cu
        assert gpurt.get_allocator_backend() == "cudaMallocAsync"
        p = gpurt.caching_allocator_alloc(3 << 20)
        q = gpurt.caching_allocator_alloc(1000)
        assert cu.cuMemsetD8(p, 5, 3 << 20)[0] == 0
        s = gpurt.memory_stats()
        assert s["allocated_bytes.all.current"] == (3 << 20) + 1000, s
        assert s["allocation.all.current"] == 2
        assert s["reserved_bytes.all.current"] >= s["allocated_bytes.all.current"]
        gpurt.record_stream(p, 0)
        gpurt.caching_allocator_delete(p)
        gpurt.caching_allocator_delete(q)
        s = gpurt.memory_stats()
        assert s["allocated_bytes.all.current"] == 0 and s["allocated_bytes.all.peak"] > 0
        gpurt.empty_cache()
        try:
            gpurt.caching_allocator_alloc(gpurt.mem_get_info()[1] * 2)
        except gpurt.OutOfMemoryError as e:
            assert "cuMemAllocAsync" in str(e)
        else:
            raise AssertionError("no OOM")
        print(json.dumps(gpurt.memory_stats()["num_ooms"]))
    """, {"GPURT_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert out.strip().splitlines()[-1] == "1"


@pytest.mark.gpu
def test_no_caching_mode():
    out = _run("""
        import gpurt
        p = gpurt.caching_allocator_alloc(4096)
        q = gpurt.caching_allocator_alloc(4096)
        s = gpurt.memory_stats()
        assert s["segment.all.current"] == 2 and s["reserved_bytes.all.current"] == 8192, s
        gpurt.caching_allocator_delete(p)
        gpurt.caching_allocator_delete(q)
        r = gpurt.caching_allocator_alloc(512)  # the next call returns freed segments
        s = gpurt.memory_stats()
        assert s["segment.all.current"] == 1 and s["num_device_free"] == 2, s
        print("ok")
    """, {"GPURT_NO_CACHING": "1"})
    assert out.strip().endswith("ok")


@pytest.mark.gpu
def test_bad_configuration_is_reported_on_first_use():
    env = dict(os.environ, GPURT_ALLOC_CONF="max_split_size_mb:1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = "import gpurt; gpurt.caching_allocator_alloc(1)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode != 0 and "max_split_size_mb" in result.stderr


@pytest.mark.gpu
def test_stats_before_first_allocation_are_zero_dicts(fresh):
    stats = gpurt.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["max_split_size"] == -1 or stats["max_split_size"] > 0
    assert len(stats) > 100


@pytest.mark.gpu
def test_allocation_speed_is_sane(fresh):
    """Not the benchmark: a guard against an accidental slow path (e.g. a driver call)."""
    for n in (4 * KiB, 1 * MiB, 64 * MiB):
        gpurt.caching_allocator_delete(gpurt.caching_allocator_alloc(n))
        start = time.perf_counter()
        for _ in range(2000):
            gpurt.caching_allocator_delete(gpurt.caching_allocator_alloc(n))
        per_call = (time.perf_counter() - start) / 2000
        assert per_call < 20e-6, (n, per_call)


@pytest.mark.gpu
def test_forked_child_gets_the_fork_error_instead_of_cached_blocks(fresh):
    """A child forked after CUDA started must not be handed the parent's cached blocks:
    every way of allocating raises the clear fork error (not a pointer into the parent's
    context), also on the parked-block fast path and with an explicit stream."""
    sys.path.insert(0, HERE)
    try:
        from test_driver import FORK_MESSAGE, describe, run_in_fork
    finally:
        sys.path.remove(HERE)
    stream = gpurt.Stream()
    for _ in range(3):  # cache (and park) 4 KiB blocks on both streams
        pair = gpurt.empty(1024, gpurt.float32), gpurt.empty(1024, gpurt.float32, stream=stream)
        gpurt.caching_allocator_delete(gpurt.caching_allocator_alloc(4 * KiB))
        del pair

    def child() -> str:
        calls = [lambda: gpurt.empty(1024, gpurt.float32),
                 lambda: gpurt.empty(1024, gpurt.float32, stream=stream),
                 lambda: gpurt.caching_allocator_alloc(4 * KiB),
                 lambda: gpurt.caching_allocator_alloc(4 * KiB, 0, 0)]
        return "\n".join(describe(call) for call in calls)

    results = run_in_fork(child).splitlines()
    assert len(results) == 4, results
    for line in results:
        assert line.startswith("CudaUnavailableError") and FORK_MESSAGE in line, line
    x = gpurt.empty(1024, gpurt.float32, stream=stream)  # the parent still allocates
    assert x.ptr and gpurt.memory_allocated() >= 4 * KiB
    del x
    stream.synchronize()


@pytest.mark.gpu
def test_arrays_created_and_dropped_in_a_loop_keep_statistics_exact(fresh):
    """gpurt.empty + del of the same size (the allocator's parked-block fast path, whose
    statistics are settled lazily) leaves the same statistics as torch's rules give."""
    base = gpurt.memory_stats()
    for _ in range(1001):
        x = gpurt.empty(1024, gpurt.float32)
        del x
    keep = gpurt.empty(1024, gpurt.float32)
    stats = gpurt.memory_stats()
    assert stats["allocation.all.current"] == base["allocation.all.current"] + 1
    assert stats["allocated_bytes.all.current"] == base["allocated_bytes.all.current"] + 4 * KiB
    assert stats["allocation.all.allocated"] == base["allocation.all.allocated"] + 1002
    assert stats["allocated_bytes.all.freed"] == base["allocated_bytes.all.freed"] + 1001 * 4 * KiB
    assert stats["requested_bytes.all.allocated"] == \
        base["requested_bytes.all.allocated"] + 1002 * 4 * KiB
    del keep
    gpurt.reset_peak_memory_stats()
    now = gpurt.memory_allocated()
    assert gpurt.max_memory_allocated() == now
    y = gpurt.empty(1024, gpurt.float32)  # the same block again: the reset peak moves
    assert gpurt.max_memory_allocated() == now + 4 * KiB
    del y


class _Recording:
    """An allocator's record_stream that records, or refuses memory it does not hold."""

    def __init__(self, holds: bool) -> None:
        self.device, self.holds, self.calls = 0, holds, []

    def record_stream(self, ptr: int, stream: int) -> None:
        if not self.holds:
            raise ValueError(f"0x{ptr:x} is not inside a live allocation")
        self.calls.append((ptr, stream))


def test_array_record_stream_takes_one_allocator_call(fake_driver: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Array.record_stream with a gpurt Stream is one call of its device's allocator with the
    stream's handle; other streams and memory that allocator does not hold go the general way,
    with its errors."""
    from _elementwise_fakes import fake_array

    ours = _Recording(holds=True)
    monkeypatch.setattr(mem, "_allocators", {0: ours})
    array, stream = fake_array((4,), ptr=0x4000), gpurt.Stream()
    array.record_stream(stream)
    array.record_stream(stream.cuda_stream)  # an int handle: the general way, same call
    assert ours.calls == [(0x4000, stream.cuda_stream)] * 2
    with pytest.raises(TypeError, match="expected a stream"):
        array.record_stream("stream")
    monkeypatch.setattr(mem, "_allocators", {0: _Recording(holds=False)})
    with pytest.raises(ValueError, match="not inside memory from gpurt's caching allocator"):
        array.record_stream(stream)


@pytest.mark.gpu
def test_array_record_stream_defers_reuse(fresh):
    """Array.record_stream with a gpurt Stream (one allocator call): the freed block waits
    for the work queued on that stream before it is handed out again."""
    stream = gpurt.Stream()
    host, flag, hold = _wait_flag()
    try:
        array = gpurt.empty(64 * KiB // 4)
        hold(stream.cuda_stream)  # the stream is stuck until the flag is set
        array.record_stream(stream)
        ptr = array.ptr
        del array
        states = {b["state"] for s in gpurt.memory_snapshot() for b in s["blocks"]
                  if b["address"] == ptr}
        assert states == {"active_pending_free"}
        assert gpurt.empty(64 * KiB // 4).ptr != ptr  # still in use on the stream
    finally:
        flag.value = 1
        stream.synchronize()
        ok(cu.cuMemFreeHost(host))
