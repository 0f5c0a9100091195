"""The caching allocator's bookkeeping core: PyTorch's native policy over a raw backend.

Pure Python, no driver: it runs over a small :class:`Backend` (malloc/free of segments,
events, mem_get_info), so the same code is tested on a CPU over host memory and used on the
GPU over cuMemAlloc. The policy is torch's CUDACachingAllocator, decision for decision:

- sizes round up to 512 B (or to power-of-two divisions, ``roundup_power2_divisions``);
  requests <= 1 MiB come from the small pool in 2 MiB segments, larger ones from the large
  pool in 20 MiB segments below 10 MiB, else rounded up to 2 MiB;
- best fit by (stream, size, address); a block is split when the rest is worth keeping
  (>= 512 B in the small pool, > 1 MiB in the large pool, and never blocks of
  ``max_split_size`` or more); freed neighbours merge; blocks never change stream;
- a block used on other streams (``record_stream``) is reused only after events recorded
  on those streams at free time have completed;
- when the backend is out of memory: free cached oversize blocks, then all cached unsplit
  blocks (after synchronizing outstanding events), retry, and only then raise;
- during graph capture, allocations on a capturing stream come from that graph's private
  pool, and everything unsafe while capturing (freeing segments, event queries, syncs) waits
  until no capture is underway.

Frees never call the backend: ``free`` only moves bookkeeping, so it is safe from
finalizers; if the lock is busy (another thread, or a finalizer run by the garbage collector
inside an allocator call) the pointer is queued and freed at the next call.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Iterator, Protocol

from . import _memstats as ms
from ._allocconf import UNLIMITED, AllocatorConfig, divisions_for, roundup_power2_next_division
from ._blocks import Block, BlockPool, FreeBlocks, PrivatePool
from ._memhistory import DeviceTrace, HistorySettings, capture_frames, frames_json

__all__: list[str] = []

MIN_BLOCK = 512  # every size is rounded up to a multiple of this
SMALL_SIZE = 1 << 20  # largest request served by the small pool
SMALL_BUFFER = 2 << 20  # small pool segment size
MIN_LARGE_ALLOC = 10 << 20  # requests below this share 20 MiB segments
ROUND_LARGE = 2 << 20  # larger segments are rounded up to this
LARGE_BUFFER = 20 << 20

_BIAS = ms.BIAS
_ALLOC_COUNTS = ms.ALLOC_COUNTS
_ALLOC_BYTES = ms.ALLOC_BYTES
_REQUESTED_SHIFT = ms.REQUESTED_SHIFT
_SPLIT = ms.SPLIT
_SPLIT_BYTES = ms.SPLIT_BYTES


class Backend(Protocol):
    """What the allocator needs from the device (real: cuMemAlloc & co; tests: host memory)."""

    def malloc(self, size: int, capturing: bool) -> int | None:
        """A new segment of ``size`` bytes, or None when out of memory. ``capturing``: a
        graph capture is underway somewhere (use relaxed capture mode for the call)."""

    def free(self, ptr: int) -> None: ...
    def mem_get_info(self) -> tuple[int, int]: ...
    def event_create(self) -> Any: ...
    def event_record(self, event: Any, stream: int) -> None: ...
    def event_query(self, event: Any) -> bool: ...
    def event_synchronize(self, event: Any) -> None: ...
    def event_destroy(self, event: Any) -> None: ...

    def oom_error(self, message: str) -> BaseException:
        """The exception to raise when the allocator gives up."""


class _Captures:
    """Graph captures underway in the whole process: while any is, no allocator does
    anything that is illegal during a (global-mode) capture."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n


CAPTURES = _Captures()


def allocation_size(size: int) -> int:
    """Segment size for a rounded request (torch's get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class CachingAllocator:
    """The caching allocator of one device. Thread-safe (one lock)."""

    def __init__(self, device: int, backend: Backend, config: AllocatorConfig,
                 history: HistorySettings | None = None) -> None:
        self.device = device
        self.backend = backend
        self.config = config
        self.stats = ms.DeviceStats()
        self._small = BlockPool(True, self.stats.small)
        self._large = BlockPool(False, self.stats.large)
        self._allocated: dict[int, Block] = {}
        self._segments: dict[int, tuple[int, Any]] = {}  # base -> (size, frames)
        self._private: dict[Any, PrivatePool] = {}
        self._captures: list[tuple[Any, int]] = []  # (pool id, capturing stream)
        self._events: dict[int, Deque[tuple[Any, Block]]] = {}
        self._event_pool: list[Any] = []
        self._needs_events: list[Block] = []  # freed with stream uses, events not recorded yet
        self._queued: Deque[int] = collections.deque()  # frees that could not take the lock
        self._work = False  # deferred work waits (events, empty_cache, uncached frees)
        self._empty_cache_wanted = False
        self._spare: list[Block] = []  # recycled Block objects
        self._lock = threading.Lock()
        self._reserved = 0  # torch's total_allocated_memory
        self._fraction = 1.0
        self._allowed = 0  # torch's allowed_memory_maximum, when a fraction is set
        self._fraction_set = False
        self.history = history if history is not None else HistorySettings()
        self.trace = DeviceTrace(self.history.max_entries)
        self._max_split = config.max_split_size
        self._round_pow2 = config.rounds_to_power2
        self._caching = config.caching
        self._gc_counting = False

    # ---- allocation ------------------------------------------------------------------

    def malloc(self, size: int, stream: int) -> int:
        """A device pointer to ``size`` bytes for use on ``stream`` (0 for size 0).

        The hot path is written out in one function on purpose: every Python call and
        attribute lookup shows in the allocation time."""
        if size <= 0:
            if size == 0:
                return 0
            raise ValueError(f"cannot allocate a negative number of bytes ({size})")
        lock = self._lock
        lock.acquire()
        try:
            if self._work or self._queued:
                self._service()
            if size < MIN_BLOCK:
                rsize = MIN_BLOCK
            elif self._round_pow2:
                rsize = self._round(size)
            else:
                rsize = (size + MIN_BLOCK - 1) & -MIN_BLOCK
            if self._captures:
                pool = self._capture_pool(rsize, stream)
            else:
                pool = self._small if rsize <= SMALL_SIZE else self._large
            if self._gc_counting:
                pool.gc_calls += 1
            block = None
            index = pool.by_stream.get(stream)
            if index is not None and self._caching:
                buckets = index.buckets
                bucket = buckets.get(rsize)
                if bucket:  # exact fit: the lowest address of this size
                    block = bucket[0]
                    del bucket[0]
                else:
                    block = index.lower_bound(rsize)
                    if block is not None:
                        max_split = self._max_split
                        if rsize < max_split:
                            if block.size >= max_split:
                                block = None  # no oversize block for a smaller request
                        elif block.size >= rsize + self.config.max_non_split_rounding_size:
                            block = None
                        if block is not None:
                            bucket = buckets[block.size]
                            if bucket[0] is block:
                                del bucket[0]
                            else:
                                bucket.remove(block)
            if block is None:
                block = self._new_segment(pool, rsize, stream)
            block.is_free = False

            # alloc_found_block: split off the rest if worth keeping, then count.
            remaining = block.size - rsize
            if pool.is_small:
                split = remaining >= MIN_BLOCK
            else:
                split = remaining > SMALL_SIZE and rsize < self._max_split
            was_split = block.prev is not None or block.next is not None
            if split:
                rest = self._spare.pop() if self._spare else Block(0, 0, 0, pool)
                rest.ptr = block.ptr + rsize
                rest.size = remaining
                rest.stream = stream
                rest.pool = pool
                rest.requested = 0
                rest.prev = block
                rest.next = after = block.next
                if after is not None:
                    after.prev = rest
                block.next = rest
                block.size = rsize
                if index is None:
                    index = pool.by_stream[stream] = FreeBlocks()
                bucket = index.buckets.get(remaining)
                if bucket is not None and (not bucket or bucket[-1].ptr < rest.ptr):
                    bucket.append(rest)
                else:
                    index.add(rest)
                rest.is_free = True
                rest.gc_base = pool.gc_calls
                if was_split:
                    increase = 0
                    decrease = rsize * _SPLIT_BYTES  # an inactive split block shrinks
                else:
                    increase = _SPLIT + remaining * _SPLIT_BYTES  # a new inactive split block
                    decrease = 0
            elif was_split:
                increase = 0
                decrease = _SPLIT + block.size * _SPLIT_BYTES  # an inactive split turns active
            else:
                increase = decrease = 0
            used = block.size  # more than rsize when the rest was not worth splitting off
            if block.requested == size and block.vector_size == used:
                vector = block.last_vector  # the same request again: reuse its counts
            else:
                vector = _ALLOC_COUNTS + used * _ALLOC_BYTES + (size << _REQUESTED_SHIFT)
                if used >= self._max_split:
                    vector += ms.OVERSIZE_ALLOCATION
                block.requested = size
                block.vector_size = used
                block.last_vector = vector
            block.allocated = True
            block.vector = vector
            ptr = block.ptr
            self._allocated[ptr] = block
            stats = pool.stats
            increase += vector
            delta = decrease - increase
            stats.inc += increase
            slack = stats.slack + delta
            stats.slack = slack
            device_stats = self.stats
            all_slack = device_stats.all_slack + delta
            device_stats.all_slack = all_slack
            if (slack & all_slack & _BIAS) != _BIAS:
                device_stats.refresh_peaks()
            if self.history.alloc_frames:
                self._record_alloc(block, size)
            return ptr
        finally:
            if self._queued:
                self._drain_queue()
            lock.release()

    def _round(self, size: int) -> int:
        divisions = divisions_for(self.config, size)
        if divisions > 1 and size > MIN_BLOCK * divisions:
            return roundup_power2_next_division(size, divisions)
        return (size + MIN_BLOCK - 1) & -MIN_BLOCK

    def _capture_pool(self, rsize: int, stream: int) -> BlockPool:
        for pool_id, capturing in self._captures:
            if capturing == stream:
                private = self._private[pool_id]
                return private.small if rsize <= SMALL_SIZE else private.large
        return self._small if rsize <= SMALL_SIZE else self._large

    def _insert_free(self, pool: BlockPool, block: Block) -> None:
        index = pool.by_stream.get(block.stream)
        if index is None:
            index = pool.by_stream[block.stream] = FreeBlocks()
        index.add(block)
        block.is_free = True
        block.gc_base = pool.gc_calls

    def _remove_free(self, block: Block) -> None:
        block.pool.by_stream[block.stream].remove(block)
        block.is_free = False

    # ---- new segments, out of memory -------------------------------------------------

    def _new_segment(self, pool: BlockPool, rsize: int, stream: int) -> Block:
        """A fresh segment for ``rsize``, releasing cached memory and retrying as torch
        does; raises the backend's OOM error when nothing helps."""
        size = allocation_size(rsize) if self._caching else rsize
        safe = CAPTURES.count == 0
        if self._fraction_set and self.config.garbage_collection_threshold > 0 and safe:
            self._garbage_collect()
        block = self._alloc_segment(pool, size, stream, retry=False)
        if block is None and safe and self._release_available(pool, rsize, stream):
            block = self._alloc_segment(pool, size, stream, retry=False)
        if block is None and safe:
            self._release_cached_blocks()
            block = self._alloc_segment(pool, size, stream, retry=True)
        if block is None:
            raise self._out_of_memory(pool, rsize, size, stream)
        return block

    def _alloc_segment(self, pool: BlockPool, size: int, stream: int, retry: bool) -> Block | None:
        if retry:
            self.stats.num_alloc_retries += 1
        if self._fraction_set and self._reserved + size > self._allowed:
            return None
        ptr = self.backend.malloc(size, CAPTURES.count > 0)
        if ptr is None:
            return None
        if pool.owner is not None:
            pool.owner.segments += 1
        self._reserved += size
        block = Block(ptr, size, stream, pool)
        frames = capture_frames() if self.history.alloc_frames else None
        self._segments[ptr] = (size, frames)
        vector = ms.SEGMENT + size * ms.RESERVED_BYTES
        if size >= self._max_split:
            vector += ms.OVERSIZE_SEGMENT
        self.stats.change(pool.stats, vector, 0)
        self.stats.num_device_alloc += 1
        if self.history.trace:
            self.trace.record("segment_alloc", ptr, size, stream, frames)
        return block

    def _release_segment(self, block: Block) -> None:
        """Give a free, unsplit block (a whole segment) back to the backend."""
        self.backend.free(block.ptr)
        self._remove_free(block)
        pool = block.pool
        if pool.owner is not None:
            pool.owner.segments -= 1
        self._reserved -= block.size
        del self._segments[block.ptr]
        vector = ms.SEGMENT + block.size * ms.RESERVED_BYTES
        if block.size >= self._max_split:
            vector += ms.OVERSIZE_SEGMENT
        self.stats.change(pool.stats, 0, vector)
        self.stats.num_device_free += 1
        if self.history.trace:
            frames = capture_frames() if self.history.free_frames else None
            self.trace.record("segment_free", block.ptr, block.size, block.stream, frames)

    def _release_available(self, pool: BlockPool, rsize: int, stream: int) -> bool:
        """Free cached oversize blocks of this stream, enough for ``rsize`` if possible
        (torch's release_available_cached_blocks)."""
        if self._max_split == UNLIMITED:
            return False
        index = pool.by_stream.get(stream)
        if index is None:
            return False
        key = max(rsize, self._max_split)
        block = index.lower_bound(key)
        if block is not None:
            self._release_segment(block)
            return True
        released = 0
        for block in reversed(list(index)):
            if released >= key or block.size < self._max_split:
                break
            released += block.size
            self._release_segment(block)
        return released >= key

    def _release_cached_blocks(self) -> None:
        """Synchronize outstanding events, then free every cached unsplit block, also of
        private pools no graph uses any more (torch's release_cached_blocks)."""
        self._synchronize_and_free_events()
        for pool in (self._large, self._small):
            self._release_unsplit(pool)
        for pool_id, private in list(self._private.items()):
            if private.use_count == 0 and not self._capturing_to(pool_id):
                self._release_unsplit(private.small)
                self._release_unsplit(private.large)
                if private.segments == 0:
                    del self._private[pool_id]

    def _release_unsplit(self, pool: BlockPool) -> None:
        for block in list(pool.free_blocks()):
            if block.prev is None and block.next is None:
                self._release_segment(block)

    def _garbage_collect(self) -> None:
        """Free old unsplit large blocks once reserved memory passes the threshold
        fraction of the allowed memory (torch's garbage_collect_cached_blocks)."""
        threshold = int(self.config.garbage_collection_threshold * self._allowed)
        if self._reserved <= threshold:
            return
        target = self._reserved - threshold
        pool = self._large
        candidates = [b for b in pool.free_blocks() if b.prev is None and b.next is None]
        if not candidates:
            return
        total_age = sum(pool.gc_calls - b.gc_base for b in candidates)
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for block in list(pool.free_blocks()):
                age = pool.gc_calls - block.gc_base
                if block.prev is None and block.next is None and age >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_segment(block)

    def _out_of_memory(self, pool: BlockPool, rsize: int, size: int, stream: int) -> BaseException:
        free, total = self.backend.mem_get_info()
        self.stats.num_ooms += 1
        if self.history.trace:
            self.trace.record("oom", free, rsize, stream, capture_frames())
        allocated = self.stats.current("allocated_bytes")
        reserved = self.stats.current("reserved_bytes")
        private_free = sum(p.small.free_bytes() + p.large.free_bytes()
                           for p in self._private.values())
        fmt = ms.format_size
        allowed = f"{fmt(self._allowed)} allowed; " if self._fraction_set else ""
        private = (f"with {fmt(private_free)} cached in private pools (CUDA graphs), "
                   if private_free else "")
        unallocated = reserved - allocated - private_free
        message = (
            f"CUDA out of memory. Tried to allocate {fmt(rsize)} (a {fmt(size)} "
            f"{pool.kind}-pool segment). GPU {self.device} has a total capacity of "
            f"{fmt(total)} of which {fmt(free)} is free. {allowed}Of the allocated memory "
            f"{fmt(allocated)} is allocated by gpurt, {private}and {fmt(unallocated)} is "
            "reserved by gpurt but unallocated."
        )
        if unallocated >= rsize:
            message += (
                " Reserved but unallocated memory is at least the request: the cache is "
                "fragmented. GPURT_ALLOC_CONF=max_split_size_mb:<N> (or "
                "garbage_collection_threshold:<0..1>) stops large cached blocks from being "
                "split; gpurt.empty_cache() returns unused cached memory."
            )
        return self.backend.oom_error(message)

    # ---- free ------------------------------------------------------------------------

    def free(self, ptr: int) -> None:
        """Free an allocation. Never calls the backend; queues when the lock is busy."""
        if not ptr:
            return
        lock = self._lock
        if not lock.acquire(False):
            self._queued.append(ptr)
            return
        try:
            block = self._allocated.get(ptr)
            if block is None or block.stream_uses or self.history.trace or not self._caching:
                self._free(ptr)
            else:
                del self._allocated[ptr]
                block.allocated = False
                self._free_block(block)
        finally:
            if self._queued:
                self._drain_queue()
            lock.release()

    def _drain_queue(self) -> None:
        queued = self._queued
        while queued:
            ptr = queued.popleft()
            try:
                self._free(ptr)
            except ValueError:
                pass  # a bad pointer from a finalizer: nobody to tell

    def _free(self, ptr: int) -> None:
        """free() in full: history, stream uses, the uncached mode."""
        block = self._allocated.pop(ptr, None)
        if block is None:
            raise ValueError(
                f"0x{ptr:x} is not an allocation of gpurt's caching allocator on device "
                f"{self.device} (already freed, or never allocated here)"
            )
        block.allocated = False
        history = self.history
        if history.trace:
            frames = capture_frames() if history.free_frames else block.frames
            self.trace.record("free_requested", ptr, block.requested, block.stream, frames)
        if block.stream_uses:
            # allocated -> pending: events are recorded on the using streams at the next
            # safe point, and the block returns to its pool when they have all completed.
            part = ms.ALLOCATION + block.size * ms.ALLOCATED_BYTES
            if block.size >= self._max_split:
                part += ms.OVERSIZE_ALLOCATION
            self.stats.change(block.pool.stats, 0, part)
            block.vector -= part
            self._needs_events.append(block)
            self._work = True
            return
        self._free_block(block)
        if not self._caching:
            self._work = True  # return the segment to the backend at the next safe point

    def _free_block(self, block: Block) -> None:
        """Return a block to its pool, merging free neighbours, and count it (torch's
        free_block; written out like malloc because frees are as hot)."""
        pool = block.pool
        index = pool.by_stream.get(block.stream)
        if index is None:
            index = pool.by_stream[block.stream] = FreeBlocks()
        buckets = index.buckets
        splits = split_bytes = 0
        prev = block.prev
        if prev is not None and prev.is_free:
            bucket = buckets[prev.size]
            if bucket[0] is prev:
                del bucket[0]
            else:
                bucket.remove(prev)
            block.ptr = prev.ptr
            block.size += prev.size
            block.prev = before = prev.prev
            if before is not None:
                before.next = block
            splits = -1
            split_bytes = -prev.size
            prev.prev = prev.next = prev.frames = None
            self._spare.append(prev)
        after = block.next
        if after is not None and after.is_free:
            bucket = buckets[after.size]
            if bucket[0] is after:
                del bucket[0]
            else:
                bucket.remove(after)
            block.size += after.size
            block.next = beyond = after.next
            if beyond is not None:
                beyond.prev = block
            splits -= 1
            split_bytes -= after.size
            after.prev = after.next = after.frames = None
            self._spare.append(after)
        size = block.size
        bucket = buckets.get(size)
        if bucket is not None and (not bucket or bucket[-1].ptr < block.ptr):
            bucket.append(block)
        else:
            index.add(block)
        block.is_free = True
        block.gc_base = pool.gc_calls
        if block.prev is not None or block.next is not None:
            splits += 1
            split_bytes += size
        decrease = block.vector
        block.vector = 0
        increase = 0
        if splits:
            if splits > 0:
                increase = splits * _SPLIT
            else:
                decrease -= splits * _SPLIT
        if split_bytes:
            if split_bytes > 0:
                increase += split_bytes * _SPLIT_BYTES
            else:
                decrease -= split_bytes * _SPLIT_BYTES
        stats = pool.stats
        device_stats = self.stats
        delta = decrease - increase
        slack = stats.slack + delta
        stats.slack = slack
        all_slack = device_stats.all_slack + delta
        device_stats.all_slack = all_slack
        if increase:
            stats.inc += increase
            if (slack & all_slack & _BIAS) != _BIAS:
                device_stats.refresh_peaks()
        if self.history.trace:
            frames = capture_frames() if self.history.free_frames else block.frames
            self.trace.record("free_completed", block.ptr, block.requested, block.stream, frames)
        block.frames = None

    # ---- streams and events ----------------------------------------------------------

    def record_stream(self, ptr: int, stream: int) -> None:
        """Mark the allocation holding ``ptr`` as used on ``stream`` (torch's recordStream)."""
        with self._lock:
            block = self._allocated.get(ptr) or self._block_containing(ptr)
            if block is None:
                raise ValueError(
                    f"0x{ptr:x} is not inside a live allocation of gpurt's caching allocator "
                    f"on device {self.device}"
                )
            if stream == block.stream:
                return  # uses on the allocation stream need no synchronization
            if block.stream_uses is None:
                block.stream_uses = set()
            block.stream_uses.add(stream)

    def _block_containing(self, ptr: int) -> Block | None:
        for block in self._allocated.values():
            if block.ptr <= ptr < block.ptr + block.size:
                return block
        return None

    def _service(self) -> None:
        """Deferred work: queued frees, and, when no capture is underway, recording and
        polling events, a wanted empty_cache, segments of the uncached mode."""
        if self._queued:
            self._drain_queue()
        if CAPTURES.count == 0:
            if self._needs_events:
                self._insert_events()
            if self._events:
                self._process_events()
            if self._empty_cache_wanted:
                self._empty_cache_wanted = False
                self._release_cached_blocks()
            if not self._caching:
                self._release_unsplit(self._small)
                self._release_unsplit(self._large)
        self._work = bool(self._needs_events or self._events or self._empty_cache_wanted
                          or self._uncached_leftovers())

    def _uncached_leftovers(self) -> bool:
        if self._caching:
            return False
        return any(True for _ in self._small.free_blocks()) or any(
            True for _ in self._large.free_blocks())

    def _insert_events(self) -> None:
        blocks, self._needs_events = self._needs_events, []
        for block in blocks:
            uses, block.stream_uses = block.stream_uses or set(), None
            for stream in uses:
                event = self._event_pool.pop() if self._event_pool else self.backend.event_create()
                self.backend.event_record(event, stream)
                block.event_count += 1
                self._events.setdefault(stream, collections.deque()).append((event, block))
            if block.event_count == 0:
                self._free_block(block)

    def _process_events(self) -> None:
        for stream in list(self._events):
            queue = self._events[stream]
            while queue:
                event, block = queue[0]
                if not self.backend.event_query(event):
                    break
                queue.popleft()
                self._event_pool.append(event)
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
            if not queue:
                del self._events[stream]

    def _synchronize_and_free_events(self) -> None:
        self.stats.num_sync_all_streams += 1
        if self._needs_events:
            self._insert_events()
        for queue in self._events.values():
            for event, block in queue:
                self.backend.event_synchronize(event)
                self._event_pool.append(event)
                block.event_count -= 1
                if block.event_count == 0:
                    self._free_block(block)
        self._events.clear()

    # ---- cache control ---------------------------------------------------------------

    def empty_cache(self) -> None:
        """Return every cached unsplit segment to the backend (synchronizes outstanding
        events first). During a graph capture this waits until no capture is underway."""
        with self._lock:
            if self.history.trace:
                self.trace.record("empty_cache", 0, self._reserved, 0, capture_frames())
            if CAPTURES.count:
                self._empty_cache_wanted = True
                self._work = True
                return
            if self._queued:
                self._drain_queue()
            self._release_cached_blocks()

    def flush(self) -> None:
        """Do deferred work now (frees queued from finalizers, completed events)."""
        with self._lock:
            self._service()

    def set_memory_fraction(self, fraction: float) -> None:
        """Cap this process's reserved memory at ``fraction`` of the device's total."""
        _, total = self.backend.mem_get_info()
        with self._lock:
            self._fraction = fraction
            self._allowed = int(fraction * total)
            self._fraction_set = True
            self._gc_counting = self.config.garbage_collection_threshold > 0

    @property
    def memory_fraction(self) -> float:
        return self._fraction

    def reset_peak_stats(self) -> None:
        with self._lock:
            self.stats.reset_peak()

    def reset_accumulated_stats(self) -> None:
        with self._lock:
            self.stats.reset_accumulated()

    def nested_stats(self) -> dict[str, Any]:
        """torch.cuda.memory_stats_as_nested_dict for this device."""
        with self._lock:
            if self._queued:
                self._drain_queue()
            return self.stats.as_nested_dict(self.config.max_split_size_stat)

    def allocation_size_of(self, ptr: int) -> int:
        """Size of the block allocated at ``ptr`` (for callers that track bytes)."""
        block = self._allocated.get(ptr)
        if block is None:
            raise ValueError(f"0x{ptr:x} is not a live allocation on device {self.device}")
        return block.size

    # ---- graph-private pools ---------------------------------------------------------

    def begin_allocate_to_pool(self, pool_id: Any, stream: int) -> None:
        """Route allocations on ``stream`` to private pool ``pool_id`` (made if new)."""
        with self._lock:
            if self._capturing_to(pool_id):
                raise RuntimeError(f"already allocating to private pool {pool_id!r}")
            self._private_pool(pool_id)
            self._captures.append((pool_id, stream))
            CAPTURES.add(1)

    def end_allocate_to_pool(self, pool_id: Any) -> None:
        with self._lock:
            for i, (pid, _) in enumerate(self._captures):
                if pid == pool_id:
                    del self._captures[i]
                    CAPTURES.add(-1)
                    self._work = True
                    return
            raise RuntimeError(f"not allocating to private pool {pool_id!r}")

    def retain_pool(self, pool_id: Any) -> None:
        """One more reference to private pool ``pool_id`` (made if new)."""
        with self._lock:
            self._private_pool(pool_id).use_count += 1

    def release_pool(self, pool_id: Any) -> None:
        """One reference less. At zero, the pool's cached segments are freed by the next
        empty_cache (or an out-of-memory retry), as torch does; blocks still allocated
        return to the pool when freed and are released the same way."""
        with self._lock:
            private = self._private.get(pool_id)
            if private is None or private.use_count <= 0:
                raise RuntimeError(f"release_pool: private pool {pool_id!r} is not retained")
            private.use_count -= 1
            if private.use_count == 0 and private.segments == 0 and not self._capturing_to(pool_id):
                del self._private[pool_id]

    def captures_underway(self) -> bool:
        return bool(self._captures)

    def _capturing_to(self, pool_id: Any) -> bool:
        return any(pid == pool_id for pid, _ in self._captures)

    def _private_pool(self, pool_id: Any) -> PrivatePool:
        private = self._private.get(pool_id)
        if private is None:
            private = self._private[pool_id] = PrivatePool(pool_id, self.stats.small,
                                                           self.stats.large)
        return private

    # ---- inspection ------------------------------------------------------------------

    def _pools(self) -> Iterator[BlockPool]:
        yield self._small
        yield self._large
        for private in self._private.values():
            yield private.small
            yield private.large

    def all_blocks(self) -> list[Block]:
        """Every block: free, allocated and pending."""
        blocks = [b for pool in self._pools() for b in pool.free_blocks()]
        blocks += self._allocated.values()
        blocks += self._needs_events
        seen = {id(b) for b in blocks}
        for queue in self._events.values():
            for _, block in queue:
                if id(block) not in seen:
                    seen.add(id(block))
                    blocks.append(block)
        return blocks

    def segments(self) -> list[tuple[Block, ...]]:
        """Each segment as its blocks in address order."""
        with self._lock:
            return self._segment_blocks()

    def _segment_blocks(self) -> list[tuple[Block, ...]]:
        by_ptr = {b.ptr: b for b in self.all_blocks()}
        result = []
        for base in sorted(self._segments):
            chain = []
            block: Block | None = by_ptr[base]
            while block is not None:
                chain.append(block)
                block = block.next
            result.append(tuple(chain))
        return result

    def snapshot(self) -> list[dict[str, Any]]:
        """Segments with their blocks, as torch.cuda.memory_snapshot() lists them."""
        with self._lock:
            if self._queued:
                self._drain_queue()
            pool_ids = {}
            for private in self._private.values():
                pool_ids[id(private.small)] = pool_ids[id(private.large)] = private.id
            segments = []
            for chain in self._segment_blocks():
                head = chain[0]
                size, frames = self._segments[head.ptr]
                blocks = []
                allocated = active = requested = 0
                for b in chain:
                    state = ("active_allocated" if b.allocated else
                             "inactive" if b.is_free else "active_pending_free")
                    blocks.append({"address": b.ptr, "size": b.size,
                                   "requested_size": b.requested, "state": state,
                                   "frames": frames_json(b.frames)})
                    if b.allocated:
                        allocated += b.size
                    if not b.is_free:
                        active += b.size
                        requested += b.requested
                pool_id = pool_ids.get(id(head.pool), (0, 0))
                segments.append({
                    "device": self.device, "address": head.ptr, "total_size": size,
                    "allocated_size": allocated, "active_size": active,
                    "requested_size": requested, "stream": head.stream,
                    "segment_type": head.pool.kind, "segment_pool_id": list(pool_id),
                    "is_expandable": False, "frames": frames_json(frames), "blocks": blocks,
                })
            return segments

    def _record_alloc(self, block: Block, size: int) -> None:
        block.frames = frames = capture_frames()
        if self.history.trace:
            self.trace.record("alloc", block.ptr, size, block.stream, frames)
