"""Where the caching allocator's memory comes from and goes back to: segments.

:class:`SegmentCache` owns the block pools (small, large and graph-private), the segments
taken from the backend, the per-process memory fraction, and torch's policy for getting a
new segment: garbage-collect old cached blocks past a threshold, try the backend, free
cached oversize blocks and retry, free every cached unsplit block and retry, and only then
report out of memory. :class:`gpurt._memory.allocator.CachingAllocator` builds the allocation
policy on top. No driver here: segments come from a :class:`Backend`. Expandable segments
(gpurt/_memory/expandable.py) extend this class.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Protocol

from .._core import syncdebug
from .._core.captures import CAPTURES
from . import stats as ms
from .blocks import Block, BlockPool, FreeBlocks, PrivatePool
from .config import UNLIMITED, AllocatorConfig, divisions_for, roundup_power2_next_division
from .history import DeviceTrace, HistorySettings, capture_frames, frames_json

__all__: list[str] = []

MIN_BLOCK = 512  # every size is rounded up to a multiple of this
SMALL_SIZE = 1 << 20  # largest request served by the small pool
SMALL_BUFFER = 2 << 20  # small pool segment size
MIN_LARGE_ALLOC = 10 << 20  # requests below this share 20 MiB segments
ROUND_LARGE = 2 << 20  # larger segments are rounded up to this
LARGE_BUFFER = 20 << 20


class Backend(Protocol):
    """What the allocator needs from the device (real: cuMemAlloc & co; tests: host memory)."""

    def malloc(self, size: int, capturing: bool, stream: int = 0) -> int | None:
        """A new segment of ``size`` bytes for use on ``stream``, or None when out of
        memory. ``capturing``: a graph capture is underway somewhere (use relaxed capture
        mode for the call)."""

    def free(self, ptr: int) -> None: ...
    def mem_get_info(self) -> tuple[int, int]: ...
    def event_create(self) -> Any: ...
    def event_record(self, event: Any, stream: int) -> None: ...
    def event_query(self, event: Any) -> bool: ...
    def event_synchronize(self, event: Any) -> None: ...
    def event_destroy(self, event: Any) -> None: ...

    def synchronize(self) -> None:
        """Wait for all work on the device (when an event cannot be recorded)."""

    def may_record_events(self) -> bool:
        """True when this thread may record events for this device right now, without
        binding another context (False on the driver's host-callback thread)."""

    def capture_id(self, stream: int) -> int | None:
        """Id of the graph capture ``stream`` takes part in, None when it captures nothing."""

    def oom_error(self, message: str) -> BaseException:
        """The exception to raise when the allocator gives up."""

    # expandable segments (gpurt/_memory/expandable.py)
    def reserve(self, size: int) -> int | None:
        """Reserve ``size`` bytes of address space, no memory (None when refused). Pages
        are counted from the start of the range, which needs no alignment beyond the
        driver's own."""

    def map(self, ptr: int, size: int, page: int, capturing: bool) -> bool:
        """Back [ptr, ptr + size) of reserved space with new memory in pages of ``page``
        bytes, readable and writable by this device; False (nothing mapped) when out of
        memory. ``capturing`` as for :meth:`malloc`."""

    def unmap(self, ptr: int, size: int, page: int) -> None:
        """Wait for the device, then unmap and free the pages of [ptr, ptr + size)."""

    def unreserve(self, ptr: int, size: int) -> None:
        """Give back address space from :meth:`reserve` (nothing mapped in it)."""


class CaptureRoute:
    """Allocations of one graph capture go to private pool ``pool_id``: those on ``stream``
    (the capturing stream) and on any stream that joined the capture (same ``capture_id``,
    looked up once the capture has begun), as torch routes them. With ``thread`` set, the
    route of ``use_mem_pool`` instead: every allocation of that thread (torch's
    beginAllocateCurrentThreadToPool)."""

    __slots__ = ("pool_id", "stream", "capture_id", "thread")

    def __init__(self, pool_id: Any, stream: int, capture_id: int | None,
                 thread: int | None = None) -> None:
        self.pool_id = pool_id
        self.stream = stream
        self.capture_id = capture_id
        self.thread = thread


def allocation_size(size: int) -> int:
    """Segment size for a rounded request (torch's get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class SegmentCache:
    """Block pools and segments of one device. Methods expect the caller to hold the
    allocator's lock and to have materialized any parked block (see CachingAllocator)."""

    def __init__(self, device: int, backend: Backend, config: AllocatorConfig,
                 history: HistorySettings | None) -> None:
        self.device = device
        self.backend = backend
        self.config = config
        self.stats = ms.DeviceStats()
        self._small = BlockPool(True, self.stats.small)
        self._large = BlockPool(False, self.stats.large)
        self._private: dict[Any, PrivatePool] = {}
        self._captures: list[CaptureRoute] = []
        self._segments: dict[int, tuple[int, Any]] = {}  # base -> (size, frames)
        self._expandables: dict[int, Any] = {}  # base -> ExpandableSegment
        self._spare: list[Block] = []  # recycled Block objects
        self._reserved = 0  # torch's total_allocated_memory
        self._fraction = 1.0
        self._allowed = 0  # torch's allowed_memory_maximum, when a fraction is set
        self._fraction_set = False
        self._max_split = config.max_split_size
        self._caching = config.caching
        self._expandable = config.expandable
        self.history = history if history is not None else HistorySettings()
        self.trace = DeviceTrace(self.history.max_entries)

    # ---- the free-block index --------------------------------------------------------

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

    def _pools(self) -> Iterator[BlockPool]:
        yield self._small
        yield self._large
        for private in self._private.values():
            yield private.small
            yield private.large

    def _round(self, size: int) -> int:
        """torch's round_size with roundup_power2_divisions in effect."""
        divisions = divisions_for(self.config, size)
        if divisions > 1 and size > MIN_BLOCK * divisions:
            return roundup_power2_next_division(size, divisions)
        return (size + MIN_BLOCK - 1) & -MIN_BLOCK

    # ---- graph-private pools ---------------------------------------------------------

    def _capture_pool(self, rsize: int, stream: int) -> BlockPool:
        """The pool for an allocation on ``stream`` while captures are underway: the private
        pool of the capture that ``stream`` is part of, else the default pool."""
        route = self._route_of(stream)
        if route is None:
            return self._small if rsize <= SMALL_SIZE else self._large
        private = self._private[route.pool_id]
        return private.small if rsize <= SMALL_SIZE else private.large

    def _route_of(self, stream: int) -> CaptureRoute | None:
        """The capture that ``stream`` takes part in, else the innermost use_mem_pool of
        this thread."""
        captures = [route for route in self._captures if route.thread is None]
        for route in captures:
            if route.stream == stream:
                return route
        # a side stream that joined a capture?
        capture_id = self.backend.capture_id(stream) if captures else None
        if capture_id is not None:
            for route in captures:
                if route.capture_id is None:  # routed before its capture began
                    route.capture_id = self.backend.capture_id(route.stream)
                if route.capture_id == capture_id:
                    return route
        thread = threading.get_ident()
        return next((r for r in reversed(self._captures) if r.thread == thread), None)

    def _capturing_to(self, pool_id: Any) -> bool:
        """A capture or a use_mem_pool routes allocations to ``pool_id`` now."""
        return any(route.pool_id == pool_id for route in self._captures)

    def _private_pool(self, pool_id: Any) -> PrivatePool:
        private = self._private.get(pool_id)
        if private is None:
            private = self._private[pool_id] = PrivatePool(pool_id, self.stats.small,
                                                           self.stats.large)
        return private

    # ---- new segments ----------------------------------------------------------------

    def _new_segment(self, pool: BlockPool, rsize: int, stream: int) -> Block:
        """A fresh segment for ``rsize``, releasing cached memory and retrying as torch
        does; raises the backend's OOM error when nothing helps."""
        size = allocation_size(rsize) if self._caching else rsize
        safe = CAPTURES.count == 0
        if self._fraction_set and self.config.garbage_collection_threshold > 0 and safe:
            self._garbage_collect()
        block = self._alloc_segment(pool, size, rsize, stream, retry=False)
        if block is None and safe and self._release_available(pool, rsize, stream):
            block = self._alloc_segment(pool, size, rsize, stream, retry=False)
        if block is None and safe:
            if syncdebug.LEVEL:  # freeing the cache synchronizes the device
                syncdebug.warn_or_error_on_sync("an allocation that frees the cache and retries")
            self._release_cached_blocks()
            block = self._alloc_segment(pool, size, rsize, stream, retry=True)
        if block is None:
            raise self._out_of_memory(pool, rsize, size, stream)
        return block

    def _alloc_segment(self, pool: BlockPool, size: int, rsize: int, stream: int,
                       retry: bool) -> Block | None:
        """A new segment of ``size`` bytes (or, with expandable segments, a free block of
        ``rsize`` bytes grown in one), None when out of memory (torch's alloc_block)."""
        if retry:
            self.stats.num_alloc_retries += 1
        if self._fraction_set and self._reserved + size > self._allowed:
            return None
        if self._expandable and pool.owner is None:
            return self._expandable_block(pool, rsize, stream)
        source = self.backend if pool.owner is None or pool.owner.backend is None \
            else pool.owner.backend  # a MemPool's own allocator
        ptr = source.malloc(size, CAPTURES.count > 0, stream)
        if ptr is None:
            return None
        if pool.owner is not None:
            pool.owner.segments += 1
        self._reserved += size
        block = Block(ptr, size, stream, pool)
        frames = capture_frames() if self.history.alloc_frames else None
        self._segments[ptr] = (size, frames)
        self.stats.change(pool.stats, self._segment_vector(size), 0)
        self.stats.num_device_alloc += 1
        if self.history.trace:
            self.trace.record("segment_alloc", ptr, size, stream, frames)
        return block

    def _expandable_block(self, pool: BlockPool, rsize: int, stream: int) -> Block | None:
        raise NotImplementedError  # gpurt/_memory/expandable.py

    def _unmap_free(self, blocks: list[Block]) -> None:
        raise NotImplementedError  # gpurt/_memory/expandable.py

    def _unmapped_blocks(self) -> list[Block]:
        raise NotImplementedError  # gpurt/_memory/expandable.py

    def _expandable_runs(self, blocks: list[Block]) -> list[tuple[Block, ...]]:
        raise NotImplementedError  # gpurt/_memory/expandable.py

    def _segment_vector(self, size: int) -> int:
        vector = ms.SEGMENT + size * ms.RESERVED_BYTES
        if size >= self._max_split:
            vector += ms.OVERSIZE_SEGMENT
        return vector

    # ---- giving memory back ----------------------------------------------------------

    def _release_segment(self, block: Block) -> None:
        """Give a free, unsplit block (a whole segment) back to the backend."""
        pool = block.pool
        owner = pool.owner
        (self.backend if owner is None or owner.backend is None else owner.backend).free(block.ptr)
        self._remove_free(block)
        if pool.owner is not None:
            pool.owner.segments -= 1
        self._reserved -= block.size
        del self._segments[block.ptr]
        self.stats.change(pool.stats, 0, self._segment_vector(block.size))
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
        if block is not None and block.expandable is None:
            self._release_segment(block)
            return True
        released = 0
        for block in reversed(list(index)):
            if released >= key or block.size < self._max_split:
                break
            if block.expandable is None:  # (pages of expandable ones go at a full flush)
                released += block.size
                self._release_segment(block)
        return released >= key

    def _release_cached_blocks(self) -> None:
        """Free every cached unsplit block, also of private pools no graph uses any more
        (torch's release_cached_blocks; CachingAllocator synchronizes events first)."""
        for pool in (self._large, self._small):
            self._release_unsplit(pool)
        for pool_id, private in list(self._private.items()):
            if private.use_count == 0 and not self._capturing_to(pool_id):
                self._release_unsplit(private.small)
                self._release_unsplit(private.large)
                if private.segments == 0:
                    del self._private[pool_id]

    def _release_unsplit(self, pool: BlockPool) -> None:
        """Free the pool's cached unsplit blocks and unmap the free pages of its
        expandable segments (torch's release_blocks)."""
        expandable = []
        for block in list(pool.free_blocks()):
            if block.expandable is not None:
                expandable.append(block)
            elif block.prev is None and block.next is None:
                self._release_segment(block)
        if expandable:
            self._unmap_free(expandable)

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
        """Count the OOM and build the backend's exception with a torch-like message."""
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
                "fragmented. GPURT_ALLOC_CONF=expandable_segments:True grows segments in "
                "place instead; max_split_size_mb:<N> (or garbage_collection_threshold:<0..1>) "
                "stops large cached blocks from being split; gpurt.empty_cache() returns "
                "unused cached memory."
            )
        return self.backend.oom_error(message)

    # ---- inspection ------------------------------------------------------------------

    def _all_blocks(self) -> list[Block]:
        """Free blocks of every pool (CachingAllocator adds allocated and pending ones)."""
        return [b for pool in self._pools() for b in pool.free_blocks()]

    def _segment_chains(self, blocks: list[Block]) -> list[tuple[Block, ...]]:
        """Each segment as its blocks in address order, given every mapped block; each
        run of mapped blocks of an expandable segment counts as one segment (as in torch's
        snapshot). Sorted by address."""
        by_ptr = {b.ptr: b for b in blocks}
        result = []
        for base in self._segments:
            chain = []
            block: Block | None = by_ptr[base]
            while block is not None:
                chain.append(block)
                block = block.next
            result.append(tuple(chain))
        if self._expandables:
            result += self._expandable_runs(blocks)
        result.sort(key=lambda chain: chain[0].ptr)
        return result

    def _snapshot_dicts(self, blocks: list[Block]) -> list[dict[str, Any]]:
        """torch.cuda.memory_snapshot()'s segment dicts, given every block."""
        pool_ids = {}
        for private in self._private.values():
            pool_ids[id(private.small)] = pool_ids[id(private.large)] = private.id
        segments = []
        for chain in self._segment_chains(blocks):
            head = chain[0]
            if head.expandable is None:
                size, frames = self._segments[head.ptr]
            else:
                size, frames = sum(b.size for b in chain), None
            entries = []
            allocated = active = requested = 0
            for b in chain:
                state = ("active_allocated" if b.allocated else
                         "inactive" if b.is_free else "active_pending_free")
                entries.append({"address": b.ptr, "size": b.size, "requested_size": b.requested,
                                "state": state, "frames": frames_json(b.frames)})
                if b.allocated:
                    allocated += b.size
                if not b.is_free:
                    active += b.size
                    requested += b.requested
            segments.append({
                "device": self.device, "address": head.ptr, "total_size": size,
                "allocated_size": allocated, "active_size": active,
                "requested_size": requested, "stream": head.stream,
                "segment_type": head.pool.kind,
                "segment_pool_id": list(pool_ids.get(id(head.pool), (0, 0))),
                "is_expandable": head.expandable is not None, "frames": frames_json(frames),
                "blocks": entries,
            })
        return segments
