"""The allocator core (gpurt/_memory/allocator.py) on a CPU, over a fake host-memory backend.

The same core runs on the GPU over cuMemAlloc (tests/test_memory.py replays traces through
it and torch). Here: torch's policy rule by rule, property tests with hypothesis (no
overlap, every block inside a segment, statistics equal a recount, nothing handed out
twice, OOM leaves things consistent), and agreement with a naive model of torch's
allocator on every statistic and pointer."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator_model import FakeBackend, KiB, MiB, NaiveTorchModel
from gpurt._core.captures import CAPTURES
from gpurt._memory import allocator as _allocator
from gpurt._memory import stats as ms
from gpurt._memory.allocator import CachingAllocator
from gpurt._memory.config import AllocatorConfig, parse
from gpurt._memory.history import HistorySettings

S0, S1, S2 = 0, 7, 9  # stream handles


def make(config: AllocatorConfig = AllocatorConfig(), capacity: int = 1 << 34,
         history: HistorySettings | None = None) -> tuple[CachingAllocator, FakeBackend]:
    backend = FakeBackend(capacity)
    return CachingAllocator(0, backend, config, history), backend


def flat(allocator: CachingAllocator) -> dict:
    return ms.flatten(allocator.nested_stats())


def recount(allocator: CachingAllocator, backend: FakeBackend) -> None:
    """Check the structure and that every current statistic equals a recount."""
    expect = {(f, p): 0 for f in ms.POOL_FAMILIES for p in ("small_pool", "large_pool")}
    segments = allocator.segments()
    fixed = [c for c in segments if c[0].expandable is None]
    assert {c[0].ptr: sum(b.size for b in c) for c in fixed} == backend.live
    runs = [c for c in segments if c[0].expandable is not None]
    assert sum(b.size for c in runs for b in c) == sum(backend.pages.values())
    for run in runs:  # mapped runs of expandable segments are whole pages, all mapped
        page, base = run[0].expandable.page, run[0].expandable.base
        assert (run[0].ptr - base) % page == 0 and sum(b.size for b in run) % page == 0
        assert all(a in backend.pages for a in range(run[0].ptr, run[-1].ptr, page))
        assert run[0].prev is None or not run[0].prev.mapped
        assert run[-1].next is None or not run[-1].next.mapped
    seen = set()
    for chain in segments:
        pool = "small_pool" if chain[0].pool.is_small else "large_pool"
        expandable = chain[0].expandable is not None
        expect[("segment", pool)] += not expandable
        expect[("reserved_bytes", pool)] += sum(b.size for b in chain)
        for i, block in enumerate(chain):
            assert block.ptr not in seen, "a block appears twice"
            seen.add(block.ptr)
            if i:
                assert chain[i - 1].ptr + chain[i - 1].size == block.ptr, "gap or overlap"
                assert chain[i - 1].next is block and block.prev is chain[i - 1]
            assert block.stream == chain[0].stream and block.pool is chain[0].pool
            assert block.size > 0 and block.size % 512 == 0
            if block.is_free:
                assert not block.allocated
                index = block.pool.by_stream[block.stream]
                assert index.buckets[block.size].count(block) == 1
                if i and chain[i - 1].is_free:
                    raise AssertionError("two free neighbours were not merged")
                if len(chain) > 1 and not expandable:
                    expect[("inactive_split", pool)] += 1
                    expect[("inactive_split_bytes", pool)] += block.size
            else:
                expect[("active", pool)] += 1
                expect[("active_bytes", pool)] += block.size
                expect[("requested_bytes", pool)] += block.requested
                if block.allocated:
                    expect[("allocation", pool)] += 1
                    expect[("allocated_bytes", pool)] += block.size
    stats = flat(allocator)
    for (family, pool), value in expect.items():
        assert stats[f"{family}.{pool}.current"] == value, (family, pool)
        other = "large_pool" if pool == "small_pool" else "small_pool"
        assert stats[f"{family}.all.current"] == value + expect[(family, other)]
    for key, value in stats.items():
        if key.endswith(".peak"):
            assert value >= stats[key[:-5] + ".current"], key


# ---- torch's policy, rule by rule ---------------------------------------------------------


def test_rounding_and_segment_sizes():
    a, backend = make()
    sizes = {}
    for request in (1, 511, 512, 513, 1 * MiB, 1 * MiB + 1, 9 * MiB, 10 * MiB, 10 * MiB + 1):
        ptr = a.malloc(request, S0)
        sizes[request] = a.allocation_size_of(ptr)
        a.free(ptr)
        a.empty_cache()
    assert sizes[1] == sizes[511] == sizes[512] == 512
    assert sizes[513] == 1024
    assert sizes[1 * MiB] == 1 * MiB
    assert sizes[1 * MiB + 1] == 1 * MiB + 512
    assert sizes[10 * MiB + 1] == 10 * MiB + 512  # split from a 12 MiB segment
    a.malloc(4 * KiB, S0)
    a.malloc(10 * MiB + 1, S0)
    a.malloc(2 * MiB, S0)  # does not fit the 2 MiB - 512 B left of the 12 MiB segment
    assert sorted(backend.live.values()) == [2 * MiB, 12 * MiB, 20 * MiB]


def test_zero_and_negative_sizes():
    a, backend = make()
    assert a.malloc(0, S0) == 0
    a.free(0)
    with pytest.raises(ValueError):
        a.malloc(-1, S0)
    assert not backend.live


def test_small_blocks_share_a_segment_and_merge_back():
    a, backend = make()
    p = [a.malloc(1000, S0) for _ in range(4)]
    assert len(backend.live) == 1
    assert [x - p[0] for x in p] == [0, 1024, 2048, 3072]
    stats = flat(a)
    assert stats["inactive_split.small_pool.current"] == 1
    assert stats["inactive_split_bytes.small_pool.current"] == 2 * MiB - 4096
    for ptr in (p[1], p[3], p[0], p[2]):
        a.free(ptr)
        recount(a, backend)
    stats = flat(a)
    assert stats["inactive_split.all.current"] == 0
    assert stats["allocation.all.current"] == 0
    assert stats["reserved_bytes.all.current"] == 2 * MiB


def test_large_split_rule():
    a, backend = make()
    x = a.malloc(19 * MiB, S0)  # 1 MiB left in the 20 MiB segment: not worth a split
    assert a.allocation_size_of(x) == 20 * MiB
    y = a.malloc(18 * MiB, S0)  # 2 MiB left: split
    assert a.allocation_size_of(y) == 18 * MiB
    stats = flat(a)
    assert stats["allocated_bytes.large_pool.current"] == 38 * MiB
    assert stats["requested_bytes.large_pool.current"] == 37 * MiB
    recount(a, backend)


def test_best_fit_smallest_then_lowest_address():
    a, backend = make()
    blocks = [a.malloc(s, S0) for s in (3 * MiB, 2 * MiB, 3 * MiB, 2 * MiB, 4 * MiB)]
    keep = a.malloc(2 * MiB, S0)
    for ptr in blocks[::2]:  # free 3, 3, 4 MiB (separated by live 2 MiB blocks)
        a.free(ptr)
    assert a.malloc(3 * MiB, S0) == blocks[0]
    assert a.malloc(3 * MiB, S0) == blocks[2]
    assert a.malloc(3 * MiB + 512, S0) == blocks[4]
    del keep
    recount(a, backend)


def test_blocks_stay_with_their_stream():
    a, backend = make()
    p = a.malloc(4 * KiB, S0)
    a.free(p)
    q = a.malloc(4 * KiB, S1)
    assert len(backend.live) == 2 and q != p
    assert a.malloc(4 * KiB, S0) == p
    recount(a, backend)


# ---- record_stream ------------------------------------------------------------------------


def test_record_stream_defers_reuse_until_the_event_completes():
    a, backend = make()
    p = a.malloc(8 * KiB, S0)
    a.record_stream(p, S1)
    a.record_stream(p, S0)  # the allocation stream itself needs nothing
    backend.launch(S1)
    a.free(p)
    assert backend.calls.count("event_record") == 1  # recorded at free time, as torch does
    backend.launch(S1)  # work queued after the free is not waited for
    stats = flat(a)
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["active_bytes.all.current"] == 8 * KiB  # pending, still active
    state = {b["state"] for s in a.snapshot() for b in s["blocks"] if b["address"] == p}
    assert state == {"active_pending_free"}
    q = a.malloc(8 * KiB, S0)  # the event has not completed: the block is not free yet
    assert q != p
    backend.done[S1] = 1  # the work before the free is done, the later work is not
    a.free(q)
    r = a.malloc(8 * KiB, S0)  # event done: p comes back (lowest address)
    assert r == p
    recount(a, backend)


def test_a_free_where_recording_is_unsafe_records_at_the_next_allocation():
    """On the driver's callback thread or under another device's context (a finalizer can
    run there), and while a capture is underway, free() never calls the backend."""
    a, backend = make()
    p = a.malloc(8 * KiB, S0)
    a.record_stream(p, S1)
    backend.launch(S1)
    backend.recording_allowed = False
    calls = list(backend.calls)
    a.free(p)
    assert backend.calls == calls, "free() must not call the backend here"
    backend.launch(S1)
    backend.recording_allowed = True
    q = a.malloc(8 * KiB, S0)  # records now, after both launches
    assert q != p and backend.calls.count("event_record") == 1
    backend.done[S1] = 1
    a.free(q)
    r = a.malloc(8 * KiB, S0)
    assert r != p  # the second launch is waited for too
    backend.complete(S1)
    a.free(r)
    assert a.malloc(8 * KiB, S0) == p
    recount(a, backend)


def test_a_free_whose_recording_fails_waits_for_the_next_allocation():
    a, backend = make()
    p = a.malloc(8 * KiB, S0)
    a.record_stream(p, S1)

    def failing() -> bool:
        raise RuntimeError("CUDA_ERROR_DEINITIALIZED")

    backend.may_record_events = failing
    a.free(p)  # a finalizer at shutdown, say: never raises
    assert flat(a)["active_bytes.all.current"] == 8 * KiB
    del backend.may_record_events
    a.malloc(512, S0)
    assert "event_record" in backend.calls
    recount(a, backend)


def test_record_stream_of_an_interior_pointer_and_errors():
    a, _ = make()
    p = a.malloc(64 * KiB, S0)
    a.record_stream(p + 100, S2)
    with pytest.raises(ValueError):
        a.record_stream(p + 64 * KiB + 1 << 30, S2)
    a.free(p)
    with pytest.raises(ValueError, match="already freed"):
        a.free(p)


def test_empty_cache_synchronizes_pending_blocks():
    a, backend = make()
    p = a.malloc(3 * MiB, S0)
    a.record_stream(p, S1)
    backend.launch(S1)
    a.free(p)
    a.empty_cache()
    stats = flat(a)
    assert stats["reserved_bytes.all.current"] == 0
    assert stats["active.all.current"] == 0
    assert stats["num_sync_all_streams"] == 1
    assert "event_synchronize" in backend.calls


# ---- streams that are destroyed -------------------------------------------------------------
# (FakeBackend raises Segfault, a BaseException, for an event recorded on a destroyed stream)


@pytest.mark.parametrize("when", ["allocated", "freed, events not recorded yet"])
def test_a_destroyed_streams_uses_are_recorded_before_it_goes(when):
    """The `gpurt demo` crash: record_stream on a side stream, the stream is closed, the
    block freed, the next allocation recorded an event on the dead stream."""
    a, backend = make()
    p = a.malloc(4 * KiB, S0)
    a.record_stream(p, S2)
    backend.launch(S2)
    if when != "allocated":
        backend.recording_allowed = False  # e.g. freed by a finalizer under another context
        a.free(p)
        backend.recording_allowed = True
    assert a.retire_stream(a.device, S2)
    assert backend.calls.count("event_record") == 2  # the use, and the guard for S2's blocks
    backend.destroy(S2)
    if when == "allocated":
        a.free(p)
    q = a.malloc(4 * KiB, S0)  # would have recorded on S2 here
    assert q != p  # S2's work before it was destroyed has not finished
    backend.complete(S2)  # the driver finishes a destroyed stream's work
    a.free(q)
    assert a.malloc(4 * KiB, S0) == p
    assert not a._retired and not a._events
    recount(a, backend)


def test_a_new_stream_with_a_dead_streams_handle_waits_for_its_work():
    a, backend = make()
    p = a.malloc(64 * KiB, S1)
    backend.launch(S1)  # work on S1 still uses p ...
    a.free(p)  # ... which is cached for S1: fine while S1 orders everything
    assert a.retire_stream(a.device, S1)
    backend.destroy(S1)
    backend.create(S1)  # the driver hands the handle out again
    assert a.malloc(64 * KiB, S1) == p
    assert backend.calls[-2:] == ["event_query", "event_synchronize"]  # waited first
    assert backend.done[S1] == 1
    a.free(p)
    # once the old stream's work has finished, nothing waits
    a.retire_stream(a.device, S1)
    backend.complete(S1)
    calls = len(backend.calls)
    assert a.malloc(64 * KiB, S1) == p
    assert "event_synchronize" not in backend.calls[calls:] and not a._retired
    recount(a, backend)


def test_retiring_a_stream_nobody_used_on_another_device_does_nothing():
    a, backend = make()
    p = a.malloc(4 * KiB, S0)
    a.record_stream(p, S1)
    calls = list(backend.calls)
    assert a.retire_stream(a.device + 1, S2)
    assert backend.calls == calls
    assert a.retire_stream(a.device + 1, S1)  # another device's stream used here
    assert backend.calls == calls + ["event_record"] and not a._retired
    a.free(p)


def test_retiring_waits_while_a_capture_is_underway_or_the_lock_stays_busy(monkeypatch):
    a, backend = make()
    p = a.malloc(4 * KiB, S0)
    a.record_stream(p, S2)
    a.begin_allocate_to_pool((0, 3), S1)
    try:
        assert not a.retire_stream(a.device, S2)  # no event during a capture
        assert "event_record" not in backend.calls
    finally:
        a.end_allocate_to_pool((0, 3))
    monkeypatch.setattr(_allocator, "RETIRE_WAIT", 0.01)
    with a._lock:  # held by a thread busy in the allocator (or this one, re-entered)
        assert not a.retire_stream(a.device, S2)
    assert a.retire_stream(a.device, S2)
    backend.destroy(S2)
    a.free(p)
    a.malloc(4 * KiB, S0)
    recount(a, backend)


# ---- out of memory ------------------------------------------------------------------------


def test_oom_frees_cache_retries_then_raises_consistently():
    a, backend = make(capacity=64 * MiB)
    cached = a.malloc(30 * MiB, S0)
    a.free(cached)  # cached, unused
    big = a.malloc(50 * MiB, S0)  # needs the cache released, then a retry
    stats = flat(a)
    assert stats["num_alloc_retries"] == 1 and stats["num_device_free"] == 1
    before = {k: v for k, v in flat(a).items()}
    with pytest.raises(MemoryError) as info:
        a.malloc(40 * MiB, S0)
    message = str(info.value)
    for text in ("Tried to allocate 40.00 MiB", "total capacity of 64.00 MiB",
                 "14.00 MiB is free", "50.00 MiB is allocated", "reserved by gpurt"):
        assert text in message, (text, message)
    after = flat(a)
    assert after["num_ooms"] == 1
    assert {k: v for k, v in after.items() if "num_" not in k} == {
        k: v for k, v in before.items() if "num_" not in k}
    recount(a, backend)
    a.free(big)
    assert a.malloc(40 * MiB, S0)  # usable afterwards
    recount(a, backend)


def test_oom_message_hints_at_fragmentation():
    a, _ = make(capacity=44 * MiB)
    keep = [a.malloc(12 * MiB, S0), a.malloc(12 * MiB, S0)]
    parts = [a.malloc(2 * MiB, S0) for _ in range(10)]  # split 20 MiB segments
    for ptr in parts[::2]:
        a.free(ptr)
    with pytest.raises(MemoryError, match="fragmented"):
        a.malloc(4 * MiB, S0)
    del keep


def test_per_process_fraction_limits_reserved_memory():
    a, _ = make(capacity=100 * MiB)
    a.set_memory_fraction(0.5)
    a.malloc(40 * MiB, S0)
    with pytest.raises(MemoryError, match="50.00 MiB allowed"):
        a.malloc(20 * MiB, S0)
    assert a.memory_fraction == 0.5


# ---- configuration: max_split_size, rounding, garbage collection --------------------------


def test_max_split_size_keeps_oversize_blocks_whole():
    a, backend = make(parse("max_split_size_mb:40"))
    p = a.malloc(100 * MiB, S0)
    a.free(p)
    q = a.malloc(30 * MiB, S0)  # smaller than max_split: never carved from the 100 MiB block
    assert q != p
    r = a.malloc(90 * MiB, S0)  # oversize request: the 100 MiB block is within 20 MiB
    assert r == p and a.allocation_size_of(r) == 100 * MiB
    stats = flat(a)
    assert stats["max_split_size"] == 40 * MiB
    assert stats["oversize_allocations.current"] == 1
    assert stats["oversize_segments.current"] == 1
    a.free(r)
    s = a.malloc(60 * MiB, S0)  # 100 >= 60 + 20: a new segment
    assert s != p
    recount(a, backend)


def test_oversize_cached_blocks_are_released_before_a_full_flush():
    a, backend = make(parse("max_split_size_mb:20"), capacity=120 * MiB)
    small = a.malloc(4 * MiB, S0)  # 20 MiB segment
    a.free(small)
    for ptr in [a.malloc(30 * MiB, S0) for _ in range(3)]:
        a.free(ptr)
    a.malloc(60 * MiB, S0)  # released two 30 MiB oversize blocks, kept the rest
    stats = flat(a)
    assert stats["num_alloc_retries"] == 0
    assert stats["num_device_free"] == 2
    recount(a, backend)


def test_roundup_power2_divisions():
    a, _ = make(parse("roundup_power2_divisions:4"))
    assert a.allocation_size_of(a.malloc(1200 * KiB, S0)) == 1280 * KiB
    # torch's list form: "K:v" sets the interval of K MiB (and all below, for the first
    # entry); ">:v" sets the last named interval and everything above.
    b, _ = make(parse("roundup_power2_divisions:[1:1,2:1,>:2]"))
    assert b.allocation_size_of(b.malloc(1200 * KiB, S0)) == 1200 * KiB  # 1 MiB interval: off
    assert b.allocation_size_of(b.malloc(5 * MiB, S0)) == 6 * MiB


def test_garbage_collection_frees_old_cached_blocks():
    a, backend = make(parse("garbage_collection_threshold:0.5"), capacity=100 * MiB)
    a.set_memory_fraction(1.0)
    old = [a.malloc(14 * MiB, S0) for _ in range(4)]
    for ptr in old:
        a.free(ptr)
    for _ in range(5):  # age the cached blocks
        a.free(a.malloc(4 * KiB, S0))
    a.malloc(30 * MiB, S0)  # reserved 58 MiB > 50 MiB threshold: collect before growing
    stats = flat(a)
    assert stats["num_device_free"] >= 1
    assert stats["num_alloc_retries"] == 0
    recount(a, backend)


def test_uncached_mode_returns_segments_at_the_next_call():
    a, backend = make(AllocatorConfig(caching=False))
    p = a.malloc(4 * KiB, S0)
    q = a.malloc(4 * KiB, S0)
    assert len(backend.live) == 2 and backend.live[p] == 4 * KiB
    a.free(p)
    assert "free" not in backend.calls  # frees never call the backend
    a.malloc(8 * KiB, S0)
    assert p not in backend.live and q in backend.live


# ---- graph-private pools ------------------------------------------------------------------


def test_private_pool_routing_and_release():
    a, backend = make()
    pool = (0, 1)
    a.retain_pool(pool)
    a.begin_allocate_to_pool(pool, S1)
    assert a.captures_underway() and CAPTURES.count == 1
    try:
        eager = a.malloc(4 * KiB, S0)  # other streams keep using the default pools
        g1 = a.malloc(4 * KiB, S1)
        g2 = a.malloc(3 * MiB, S1)
        a.free(g1)  # back to the private pool
        g3 = a.malloc(4 * KiB, S1)
        assert g3 == g1
        a.empty_cache()  # illegal during capture: deferred
        assert "free" not in backend.calls
    finally:
        a.end_allocate_to_pool(pool)
    assert CAPTURES.count == 0
    assert len(backend.live) == 3
    a.free(g3)
    a.free(g2)
    other = a.malloc(4 * KiB, S1)  # eager on the same stream: never from the private pool
    assert backend.live.get(other - (other - min(backend.live)) ) is not None
    assert other not in (g1, g2, g3)
    stats = flat(a)
    assert stats["segment.all.current"] == 4  # deferred empty_cache kept what is in use
    a.release_pool(pool)
    a.empty_cache()
    assert all(p not in backend.live for p in (g1, g2))
    with pytest.raises(RuntimeError):
        a.release_pool(pool)
    a.free(eager)
    a.free(other)
    a.empty_cache()
    assert not backend.live
    recount(a, backend)


def test_streams_that_join_a_capture_allocate_from_its_pool():
    """Routing by capture id, as torch does: a side stream that waited on the capturing
    stream is part of the capture, and its allocations must come from the private pool."""
    a, backend = make()
    a.retain_pool((0, 4))
    a.begin_allocate_to_pool((0, 4), S1)  # before the capture begins: no id yet
    try:
        backend.capture_ids.update({S1: 41, S2: 41, 23: 42})  # S2 joined; 23: another capture
        on_capture = a.malloc(4 * KiB, S1)
        joined = a.malloc(4 * KiB, S2)
        other_capture = a.malloc(4 * KiB, 23)
        eager = a.malloc(4 * KiB, S0)
    finally:
        a.end_allocate_to_pool((0, 4))
    pool_of = {b["address"]: tuple(s["segment_pool_id"]) for s in a.snapshot()
               for b in s["blocks"]}
    assert pool_of[on_capture] == pool_of[joined] == (0, 4)
    assert pool_of[other_capture] == pool_of[eager] == (0, 0)
    calls = backend.calls.count("capture_id")
    a.free(a.malloc(4 * KiB, S2))  # no capture underway: no capture-info query
    assert backend.calls.count("capture_id") == calls
    for ptr in (on_capture, joined, other_capture, eager):
        a.free(ptr)
    a.release_pool((0, 4))
    a.empty_cache()
    assert not backend.live


def test_frees_with_stream_uses_wait_for_the_capture_to_end():
    a, backend = make()
    p = a.malloc(4 * KiB, S0)
    a.record_stream(p, S2)
    a.retain_pool((0, 2))
    a.begin_allocate_to_pool((0, 2), S1)
    try:
        a.free(p)
        a.malloc(4 * KiB, S1)
        assert "event_record" not in backend.calls and "event_query" not in backend.calls
        with pytest.raises(RuntimeError):
            a.begin_allocate_to_pool((0, 2), S1)
    finally:
        a.end_allocate_to_pool((0, 2))
    with pytest.raises(RuntimeError):
        a.end_allocate_to_pool((0, 2))
    a.malloc(512, S0)
    assert "event_record" in backend.calls


# ---- finalizers, threads, history ---------------------------------------------------------


def test_free_with_the_lock_held_is_queued_and_done_later():
    a, backend = make()
    p = a.malloc(4 * KiB, S0)
    with a._lock:  # as if a finalizer ran inside an allocator call
        a.free(p)
        assert a._queued
    assert flat(a)["allocation.all.current"] == 0  # statistics drain the queue
    q = a.malloc(4 * KiB, S0)
    assert q == p
    recount(a, backend)


def test_threads_hammering_malloc_and_free():
    a, backend = make()
    errors = []

    def work(seed: int) -> None:
        try:
            sizes = [512 * (1 + (seed * 7 + i * 13) % 4000) for i in range(300)]
            live = []
            for i, size in enumerate(sizes):
                live.append(a.malloc(size, S0 if i % 2 else S1))
                if len(live) > 20:
                    a.free(live.pop(0))
            for ptr in live:
                a.free(ptr)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    a.flush()
    assert flat(a)["allocation.all.current"] == 0
    recount(a, backend)
    a.empty_cache()
    assert not backend.live


def test_history_records_events_and_frames():
    history = HistorySettings()
    history.configure("all", "all", "python", 100)
    a, _ = make(history=history)
    p = a.malloc(4 * KiB, S0)
    snapshot = a.snapshot()
    block = next(b for s in snapshot for b in s["blocks"] if b["address"] == p)
    assert block["state"] == "active_allocated"
    assert any(f["name"] == "test_history_records_events_and_frames" for f in block["frames"])
    a.free(p)
    a.empty_cache()
    actions = [e["action"] for e in a.trace.as_json()]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed",
                       "empty_cache", "segment_free"]
    assert all(e["time_us"] > 0 for e in a.trace.as_json())
    history.configure(None, None, "python", 1)
    assert not history.enabled


def test_snapshot_layout():
    a, _ = make()
    p = a.malloc(4 * KiB, S0)
    (segment,) = a.snapshot()
    assert segment["segment_type"] == "small" and segment["total_size"] == 2 * MiB
    assert segment["allocated_size"] == 4 * KiB and segment["active_size"] == 4 * KiB
    assert segment["segment_pool_id"] == [0, 0] and segment["stream"] == S0
    assert [b["state"] for b in segment["blocks"]] == ["active_allocated", "inactive"]
    assert segment["blocks"][0]["address"] == p == segment["address"]


def test_peaks_and_resets_follow_torch():
    a, _ = make()
    p = a.malloc(3 * MiB, S0)
    a.free(p)
    q = a.malloc(1 * MiB, S0)
    stats = flat(a)
    assert stats["allocated_bytes.all.peak"] == 3 * MiB
    assert stats["allocated_bytes.all.allocated"] == 4 * MiB
    assert stats["allocated_bytes.all.freed"] == 3 * MiB
    a.reset_peak_stats()
    assert flat(a)["allocated_bytes.all.peak"] == 1 * MiB
    a.reset_accumulated_stats()
    stats = flat(a)
    assert stats["allocated_bytes.all.allocated"] == 0 == stats["allocated_bytes.all.freed"]
    assert stats["num_device_alloc"] == 0
    a.free(q)
    stats = flat(a)
    assert stats["allocated_bytes.all.freed"] == 1 * MiB
    assert stats["allocated_bytes.all.current"] == 0


# ---- property tests: random traces --------------------------------------------------------

sizes = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(4 * KiB, 1 * MiB + 4 * KiB),
    st.integers(1 * MiB, 12 * MiB),
    st.integers(12 * MiB, 48 * MiB),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes, st.sampled_from([S0, S0, S0, S1])),
        st.tuples(st.just("free"), st.integers(0, 10**6), st.none()),
        st.tuples(st.just("free_last"), st.none(), st.none()),
        st.tuples(st.just("cycle"), sizes, st.sampled_from([S0, S1])),
        st.tuples(st.just("record"), st.integers(0, 10**6), st.sampled_from([S1, S2])),
        st.tuples(st.just("launch"), st.sampled_from([S1, S2]), st.none()),
        st.tuples(st.just("complete"), st.sampled_from([S1, S2]), st.none()),
        st.tuples(st.just("empty_cache"), st.none(), st.none()),
        st.tuples(st.just("destroy"), st.sampled_from([S1, S2]), st.none()),
        st.tuples(st.just("create"), st.sampled_from([S1, S2]), st.none()),
        st.tuples(st.sampled_from(["reset_peak", "reset_accumulated"]), st.none(), st.none()),
    ),
    min_size=10,
    max_size=150,
)
configs = st.sampled_from(["", "max_split_size_mb:24", "roundup_power2_divisions:4",
                           "max_split_size_mb:20,roundup_power2_divisions:[1:2,8:4,>:1]",
                           "expandable_segments:True",
                           "expandable_segments:True,max_split_size_mb:24"])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=ops, conf=configs, capacity=st.sampled_from([96 * MiB, 1 << 34]))
def test_random_traces_match_the_naive_torch_model(trace, conf, capacity):
    replay(trace, conf, capacity)


@pytest.mark.parametrize("seed", range(8))
def test_long_random_traces_match_the_naive_torch_model(seed):
    """Long traces reach states that short hypothesis examples rarely do."""
    rng = random.Random(seed)
    trace = []
    for _ in range(1500):
        kind = rng.random()
        if kind < 0.45:
            band = rng.choice([(1, 4 * KiB), (4 * KiB, 1 * MiB + 4 * KiB), (1 * MiB, 12 * MiB),
                               (12 * MiB, 40 * MiB)])
            trace.append(("malloc", rng.randint(*band), rng.choice([S0, S0, S0, S1])))
        elif kind < 0.7:
            trace.append(("free", rng.randrange(10**6), None))
        elif kind < 0.8:
            trace.append(("free_last", None, None))
        elif kind < 0.85:
            trace.append(("cycle", rng.choice([512, 4 * KiB, 1 * MiB, 3 * MiB, 64 * MiB]), S0))
        elif kind < 0.9:
            trace.append(("record", rng.randrange(10**6), rng.choice([S1, S2])))
        elif kind < 0.97:
            trace.append((rng.choice(["launch", "complete"]), rng.choice([S1, S2]), None))
        elif kind < 0.98:
            trace.append((rng.choice(["destroy", "create"]), rng.choice([S1, S2]), None))
        elif kind < 0.99:
            trace.append((rng.choice(["reset_peak", "reset_accumulated"]), None, None))
        else:
            trace.append(("empty_cache", None, None))
    replay(trace, ["", "max_split_size_mb:24", "roundup_power2_divisions:4",
                   "expandable_segments:True"][seed % 4],
           [256 * MiB, 1 << 34][(seed // 4) % 2], check_every=25)


def _malloc_both(a: CachingAllocator, model: NaiveTorchModel, size: int,
                 stream: int) -> int | None:
    """The same request to the allocator and to the model: both give the same pointer, or
    both run out of memory (None)."""
    got = expected = None
    try:
        got = a.malloc(size, stream)
    except MemoryError:
        pass
    try:
        expected = model.malloc(size, stream)
    except MemoryError:
        pass
    assert got == expected
    return got


def replay(trace: list, conf: str, capacity: int, check_every: int = 1) -> None:
    config = parse(conf)
    a, backend = make(config, capacity)
    model_backend = FakeBackend(capacity)
    model = NaiveTorchModel(model_backend, config)
    live: list[int] = []
    for op, x, y in trace:
        if y in backend.destroyed or (op == "launch" and x in backend.destroyed):
            continue  # nothing is enqueued on a destroyed stream
        if op == "malloc":
            got = _malloc_both(a, model, x, y)
            if got:
                live.append(got)
        elif op == "free" and live:
            ptr = live.pop(x % len(live))
            a.free(ptr)
            model.free(ptr)
        elif op == "free_last" and live:
            ptr = live.pop()
            a.free(ptr)
            model.free(ptr)
        elif op == "cycle":  # the parked-block path: the same request again and again
            for _ in range(3):
                got = _malloc_both(a, model, x, y)
                if got:
                    a.free(got)
                    model.free(got)
        elif op == "record" and live:
            ptr = live[x % len(live)]
            a.record_stream(ptr, y)
            model.record_stream(ptr, y)
        elif op in ("launch", "complete"):
            getattr(backend, op)(x)
            getattr(model_backend, op)(x)
        elif op == "destroy" and x not in backend.destroyed:  # Stream.close(), in effect
            assert a.retire_stream(a.device, x)
            model.retire_stream(x)
            backend.destroy(x)
        elif op == "create":  # a new stream that gets the destroyed one's handle
            backend.create(x)
        elif op == "empty_cache":
            a.empty_cache()
            model.empty_cache()
        elif op in ("reset_peak", "reset_accumulated"):
            getattr(a, f"{op}_stats")()
            getattr(model, f"{op}_stats")()
        if check_every == 1 or op == "empty_cache" or len(live) % check_every == 0:
            assert flat(a) == ms.flatten(model.nested())
            recount(a, backend)
    assert flat(a) == ms.flatten(model.nested())
    for ptr in live:
        a.free(ptr)
    for stream in (S1, S2):
        backend.complete(stream)
    a.empty_cache()
    stats = flat(a)
    assert stats["reserved_bytes.all.current"] == 0 and not backend.live
    assert stats["active.all.current"] == 0 and stats["allocation.all.current"] == 0


def test_parked_block_is_invisible_to_everything_else():
    """Every way of looking at or changing the allocator sees ordinary state while a block
    is parked (allocated or free)."""
    for poke in ("snapshot", "record", "neighbour", "other_size", "empty", "stats", "double"):
        a, backend = make()
        keep = a.malloc(8 * KiB, S0)
        p = a.malloc(4 * KiB, S0)
        a.free(p)
        p = a.malloc(4 * KiB, S0)  # from the cache: parked allocated, rest parked free
        assert a._hot is not None
        a.free(p)  # parked free
        p2 = a.malloc(4 * KiB, S0)
        assert p2 == p
        if poke == "snapshot":
            states = [b["state"] for s in a.snapshot() for b in s["blocks"]]
            assert states == ["active_allocated", "active_allocated", "inactive"]
        elif poke == "record":
            a.record_stream(p2, S1)
            backend.launch(S1)
            a.free(p2)
            assert flat(a)["active.all.current"] == 2
        elif poke == "neighbour":
            a.free(keep)
            a.free(p2)
            assert flat(a)["inactive_split.all.current"] == 0
        elif poke == "other_size":
            q = a.malloc(4 * KiB + 512, S0)
            assert q == p2 + 4 * KiB
        elif poke == "empty":
            a.free(p2)
            a.free(keep)
            a.empty_cache()
            assert not backend.live
        elif poke == "stats":
            assert a.allocation_size_of(p2) == 4 * KiB and a.owns(p2)
            assert flat(a)["allocation.all.current"] == 2
        elif poke == "double":
            a.free(p2)
            with pytest.raises(ValueError):
                a.free(p2)
        recount(a, backend)


def test_parked_round_trips_are_counted_in_every_statistic():
    """The parked block's frees and allocations are settled into the statistics exactly,
    whichever state it is in when they are read, and peaks reset while it is parked move
    again when it is allocated."""
    a, backend = make()
    model = NaiveTorchModel(FakeBackend(1 << 34))
    keep = _malloc_both(a, model, 8 * KiB, S0)
    for _ in range(2):
        p = _malloc_both(a, model, 4 * KiB, S0)
        for trips in range(5):
            a.free(p)
            model.free(p)
            assert flat(a) == ms.flatten(model.nested()), trips  # read while parked free
            a.reset_peak_stats()
            model.reset_peak_stats()
            assert _malloc_both(a, model, 4 * KiB, S0) == p  # the peaks move again
            assert flat(a) == ms.flatten(model.nested()), trips  # read while allocated
        a.reset_accumulated_stats()
        model.reset_accumulated_stats()
        a.free(p)
        model.free(p)
        assert flat(a) == ms.flatten(model.nested())
    a.free(keep)
    model.free(keep)
    assert flat(a) == ms.flatten(model.nested())
    recount(a, backend)


def test_release_pool_from_a_finalizer_inside_an_allocator_call_is_queued():
    a, backend = make()
    a.retain_pool((0, 5))
    with a._lock:  # as if a graph's finalizer ran while this thread allocates
        a.release_pool((0, 5))
    assert a._private[(0, 5)].use_count == 1  # not yet
    a.malloc(512, S0)
    assert (0, 5) not in a._private


def test_a_use_on_a_stream_that_cannot_record_falls_back_to_a_full_sync():
    a, backend = make()
    p = a.malloc(4 * KiB, S0)
    a.record_stream(p, S2)
    backend.launch(S2)

    def broken(event, stream):
        raise RuntimeError("CUDA_ERROR_INVALID_HANDLE")

    backend.event_record = broken
    a.free(p)
    assert a.malloc(4 * KiB, S0) == p  # synchronized, so the block was reusable at once
    assert "synchronize" in backend.calls
    recount(a, backend)


def test_captured_frames_leave_out_all_of_gpurt():
    """Frames of gpurt's own modules (the fronts and every subpackage) are not the caller's:
    the innermost recorded frame is the code that asked for memory."""
    import os

    import gpurt
    from gpurt._memory.history import capture_frames

    namespace = {"capture_frames": capture_frames}
    front = os.path.join(os.path.dirname(gpurt.__file__), "memory.py")  # as if gpurt.memory
    exec(compile("def alloc():\n    return capture_frames()\n", front, "exec"), namespace)
    frames = namespace["alloc"]()
    assert frames and frames[0][0] == __file__
