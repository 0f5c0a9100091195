"""Expandable segments (gpurt/_memory/expandable.py) on a CPU, over the fake backend's
reserved address ranges and mapped pages.

torch's rules one by one (segments grow in place, pages are given back by empty_cache and
by the out-of-memory retry, best fit counts the unmapped space after a free block, the
statistics torch keeps and leaves out), and random traces that must keep every structural
invariant and every statistic equal to a recount. tests/test_memory.py compares the same
rules with torch's allocator on the GPU."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from allocator_model import FakeBackend, KiB, MiB
from gpurt._memory.allocator import CachingAllocator
from gpurt._memory.config import AllocatorConfigError, parse, parse_settings
from gpurt._memory.history import HistorySettings
from test_allocator import S0, S1, S2, flat, ops, recount

EXPANDABLE = parse("expandable_segments:True")
PAGE = 20 * MiB  # large-pool page


def make(capacity: int = 1 << 34, conf: str = "expandable_segments:True",
         history: HistorySettings | None = None) -> tuple[CachingAllocator, FakeBackend]:
    backend = FakeBackend(capacity)
    return CachingAllocator(0, backend, parse(conf), history), backend


def test_config_accepts_expandable_segments():
    assert EXPANDABLE.expandable_segments and EXPANDABLE.expandable
    assert not parse("expandable_segments:True", no_caching=True).expandable
    assert parse_settings("expandable_segments:False") == {"expandable_segments": False}
    with pytest.raises(AllocatorConfigError, match="expandable_segments"):
        parse("expandable_segments:1")


def test_a_segment_grows_in_place_page_by_page():
    a, backend = make()
    first = a.malloc(5 * MiB, S0)
    second = a.malloc(30 * MiB, S0)
    third = a.malloc(7 * MiB, S0)
    assert second == first + 5 * MiB and third == second + 30 * MiB  # one address range
    assert backend.calls.count("reserve") == 1 and not backend.live
    assert sum(backend.pages.values()) == 3 * PAGE  # 42 MiB in 20 MiB pages
    stats = flat(a)
    assert stats["reserved_bytes.large_pool.current"] == 3 * PAGE
    assert stats["segment.all.current"] == 0  # no cuMemAlloc segment, as in torch
    assert stats["inactive_split.all.current"] == 0
    assert stats["num_device_alloc"] == 3  # one map for the 5, one per growth
    recount(a, backend)


def test_freed_space_at_the_end_serves_a_larger_request():
    """The fragmentation case: fixed segments need a new 40 MiB segment, an expandable one
    grows the freed tail by the missing pages."""
    sizes = [(12 * MiB, 18 * MiB), (40 * MiB,)]
    reserved = {}
    for conf in ("", "expandable_segments:True"):
        a, backend = make(conf=conf)
        keep = a.malloc(sizes[0][0], S0)
        temp = a.malloc(sizes[0][1], S0)
        a.free(temp)
        big = a.malloc(sizes[1][0], S0)
        if conf:
            assert big == temp  # grown in place from the freed block
        reserved[conf] = flat(a)["reserved_bytes.all.peak"]
        a.free(keep)
        a.free(big)
        recount(a, backend)
    assert reserved["expandable_segments:True"] == 3 * PAGE < reserved[""]


def test_empty_cache_unmaps_free_pages_and_releases_empty_segments():
    a, backend = make()
    ptrs = [a.malloc(15 * MiB, S0) for _ in range(4)]  # 60 MiB: pages 0..2
    a.free(ptrs[1])  # [15, 30) MiB: holds no whole page
    a.free(ptrs[2])  # now [15, 45): holds page 1 ([20, 40))
    a.empty_cache()
    assert sorted(backend.pages) == [ptrs[0], ptrs[0] + 2 * PAGE]
    stats = flat(a)
    assert stats["reserved_bytes.all.current"] == 2 * PAGE
    assert stats["num_device_free"] == 1 and stats["num_sync_all_streams"] == 1
    assert "synchronize" in backend.calls  # unmapping waits for the device
    recount(a, backend)
    assert len(a.snapshot()) == 2  # two mapped runs of one expandable segment
    for p in (ptrs[0], ptrs[3]):
        a.free(p)
    a.empty_cache()
    assert not backend.pages and not backend.reserved  # address space given back too
    recount(a, backend)


def test_the_segment_of_a_pointer_is_known():
    a, _ = make(conf="")
    fixed = a.malloc(4 * KiB, S0)
    a.set_config(EXPANDABLE)
    grown = a.malloc(5 * MiB, S0)
    segment = a.expandable_segment_of(grown + 100)
    assert segment is not None and segment.base == grown and segment.page == PAGE
    assert a.expandable_segment_of(fixed) is None


def test_snapshot_marks_expandable_segments():
    a, _ = make()
    small = a.malloc(100, S0)
    large = a.malloc(3 * MiB, S0)
    segments = a.snapshot()
    assert sorted(s["segment_type"] for s in segments) == ["large", "small"]
    for s in segments:
        assert s["is_expandable"] is True
        assert s["total_size"] == (2 * MiB if s["segment_type"] == "small" else PAGE)
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    states = {b["address"]: b["state"] for s in segments for b in s["blocks"]}
    assert states[small] == states[large] == "active_allocated"


def test_large_blocks_split_down_to_512_bytes():
    """With expandable segments torch splits large-pool blocks whenever 512 B remain."""
    a, _ = make()
    p = a.malloc(PAGE - 1 * MiB, S0)  # fixed segments: the 1 MiB rest would not be split
    assert a.allocation_size_of(p) == PAGE - 1 * MiB
    q = a.malloc(1 * MiB + 512, S0)  # a large request that fits no free block: grows
    assert q == p + PAGE - 1 * MiB


def test_best_fit_counts_unmapped_space_after_a_free_block():
    """Of two free blocks that fit, the one with less room to grow wins (torch's
    expandable_size), even when it is bigger now."""
    a, _ = make()
    hole = a.malloc(7 * MiB, S0)
    a.malloc(2 * MiB, S0)
    a.malloc(5 * MiB, S0)  # leaves a free 6 MiB tail before the unmapped rest
    a.free(hole)  # a 7 MiB hole between allocations: room 7 MiB
    assert a.malloc(6 * MiB, S0) == hole  # not the 6 MiB tail, which can grow


def test_out_of_memory_retry_unmaps_cached_pages():
    a, backend = make(capacity=60 * MiB)
    small = [a.malloc(512 * KiB, S0) for _ in range(12)]  # 6 MiB: 3 small pages
    for p in small:
        a.free(p)
    big = a.malloc(40 * MiB, S0)  # 2 large pages fit beside the small ones
    a.free(big)
    huge = a.malloc(60 * MiB, S0)  # needs every page: the cached ones are unmapped first
    stats = flat(a)
    assert stats["num_alloc_retries"] == 1 and stats["num_device_free"] >= 2
    assert stats["reserved_bytes.all.current"] == 60 * MiB
    recount(a, backend)
    with pytest.raises(MemoryError, match="out of memory"):
        a.malloc(20 * MiB, S0)
    recount(a, backend)
    a.free(huge)


def test_turning_expandable_segments_off_at_run_time():
    a, backend = make()
    p = a.malloc(5 * MiB, S0)
    a.free(p)
    a.set_config(parse(""))
    q = a.malloc(5 * MiB, S0)  # not from the expandable segment's cached block
    assert backend.live and q in backend.live
    recount(a, backend)
    a.free(q)
    a.set_config(EXPANDABLE)
    assert a.malloc(5 * MiB, S0) == q  # as tight as p's block, and p's can grow: q wins
    recount(a, backend)


def test_expandable_segments_stay_off_without_caching():
    backend = FakeBackend()
    a = CachingAllocator(0, backend, parse("", no_caching=True))
    a.set_config(EXPANDABLE)  # as _set_allocator_settings does for every allocator
    p = a.malloc(5 * MiB, S0)
    assert p in backend.live and not backend.reserved and not a.config.caching


def test_history_records_maps_and_unmaps():
    history = HistorySettings()
    history.configure("all", "all", "python", 1000)
    a, _ = make(history=history)
    p = a.malloc(5 * MiB, S0)
    a.free(p)
    a.empty_cache()
    actions = [e["action"] for e in a.trace.as_json()]
    assert actions == ["segment_map", "alloc", "free_requested", "free_completed",
                       "empty_cache", "segment_unmap"]


def test_graph_private_pools_keep_fixed_segments():
    a, backend = make()
    a.begin_allocate_to_pool((0, 1), S1)
    p = a.malloc(5 * MiB, S1)
    a.end_allocate_to_pool((0, 1))
    assert p in backend.live and not backend.pages
    (segment,) = a.snapshot()
    assert segment["is_expandable"] is False and segment["segment_pool_id"] == [0, 1]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=ops)
def test_random_traces_keep_expandable_segments_consistent(trace):
    capacity = 120 * MiB
    a, backend = make(capacity)
    live: list[int] = []
    for op, x, y in trace:
        if y in backend.destroyed or (op == "launch" and x in backend.destroyed):
            continue
        if op in ("malloc", "cycle"):
            for _ in range(1 if op == "malloc" else 3):
                try:
                    ptr = a.malloc(x, y)
                except MemoryError:
                    break
                if op == "cycle":
                    a.free(ptr)
                else:
                    live.append(ptr)
        elif op in ("free", "free_last") and live:
            a.free(live.pop(x % len(live) if op == "free" else -1))
        elif op == "record" and live:
            a.record_stream(live[x % len(live)], y)
        elif op in ("launch", "complete"):
            getattr(backend, op)(x)
        elif op == "destroy" and x not in backend.destroyed:
            assert a.retire_stream(a.device, x)
            backend.destroy(x)
        elif op == "create":
            backend.create(x)
        elif op == "empty_cache":
            a.empty_cache()
        elif op in ("reset_peak", "reset_accumulated"):
            getattr(a, f"{op}_stats")()
        recount(a, backend)
        assert flat(a)["reserved_bytes.all.current"] == sum(backend.pages.values()) + sum(
            backend.live.values())
    for ptr in live:
        a.free(ptr)
    for stream in (S1, S2):
        backend.complete(stream)
    a.empty_cache()
    stats = flat(a)
    assert stats["reserved_bytes.all.current"] == 0 and stats["active.all.current"] == 0
    assert not backend.pages and not backend.reserved and not backend.live


# ---- on the GPU: cuMemAddressReserve / cuMemCreate / cuMemMap ------------------------------

SCALE = r"""
extern "C" __global__ void scale(float* x, float a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}"""


@pytest.fixture
def expandable(no_kept_memory):
    """Expandable segments on (at run time, as torch's _set_allocator_settings), empty
    caches before and after (and no memory kept by earlier tests: a kept reduction counter
    left a small segment that served this test's small block instead of a new expandable one)."""
    import gpurt
    from gpurt import memory as mem

    gpurt.init()
    gpurt.synchronize()
    gpurt.empty_cache()
    mem._set_allocator_settings("expandable_segments:True")
    try:
        yield gpurt
    finally:
        mem._set_allocator_settings("expandable_segments:False")
        gpurt.synchronize()
        gpurt.empty_cache()


@pytest.mark.gpu
def test_real_expandable_segments_hold_data_and_give_memory_back(expandable):
    import numpy as np
    from cuda.bindings import driver as cu

    gpurt = expandable
    base = gpurt.memory_stats()
    free_before = gpurt.mem_get_info()[0]
    rng = np.random.default_rng(7)
    sizes = [5 * MiB + 3, 30 * MiB, 100, 45 * MiB]  # the 30 MiB one spans a page boundary
    ptrs = [gpurt.caching_allocator_alloc(n) for n in sizes]
    assert ptrs[1] == ptrs[0] + 5 * MiB + 512  # grown in place, right after the first
    datas = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    for ptr, data in zip(ptrs, datas):
        assert int(cu.cuMemcpyHtoD(ptr, data.ctypes.data, data.nbytes)[0]) == 0
    for ptr, data in zip(ptrs, datas):
        out = np.full(data.nbytes, 0xAB, np.uint8)
        assert int(cu.cuMemcpyDtoH(out.ctypes.data, ptr, data.nbytes)[0]) == 0
        np.testing.assert_array_equal(out, data)
    stats = gpurt.memory_stats()
    assert stats["segment.all.current"] == base["segment.all.current"]  # no cuMemAlloc
    assert stats["reserved_bytes.large_pool.current"] - \
        base["reserved_bytes.large_pool.current"] == 5 * PAGE  # 5 + 30 + 45 MiB: grew 3 times
    segments = [s for s in gpurt.memory_snapshot() if s["is_expandable"]]
    assert {s["segment_type"] for s in segments} == {"small", "large"}
    alone = "PYTEST_XDIST_WORKER" not in os.environ  # else other workers move the free memory
    assert not alone or gpurt.mem_get_info()[0] <= free_before - 5 * PAGE
    for ptr in ptrs:
        gpurt.caching_allocator_delete(ptr)
    gpurt.empty_cache()
    after = gpurt.memory_stats()
    assert after["reserved_bytes.all.current"] == base["reserved_bytes.all.current"]
    assert after["num_device_free"] - base["num_device_free"] == 2  # one unmap per pool
    assert not alone or gpurt.mem_get_info()[0] >= free_before - 2 * MiB  # the pages went back
    assert not [s for s in gpurt.memory_snapshot() if s["is_expandable"]]


@pytest.mark.gpu
def test_kernels_read_and_write_arrays_in_expandable_segments(expandable):
    import numpy as np

    gpurt = expandable
    scale = gpurt.RawKernel(SCALE, "scale")
    rng = np.random.default_rng(3)
    host = [rng.standard_normal(n).astype(np.float32) for n in (3 << 20, 7 << 20 | 5)]
    arrays = [gpurt.asarray(h) for h in host]  # 12 and 28 MiB: the second crosses pages
    for a in arrays:
        scale(((a.size + 255) // 256,), (256,), (a, 2.0, a.size))
    gpurt.synchronize()
    for a, h in zip(arrays, host):
        np.testing.assert_array_equal(a.to_numpy(), (h.astype(np.float64) * 2).astype(np.float32))
    (segment,) = [s for s in gpurt.memory_snapshot()
                  if any(b["address"] == arrays[1].data_ptr() for b in s["blocks"])]
    assert segment["is_expandable"] and segment["total_size"] % PAGE == 0
