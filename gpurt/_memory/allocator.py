"""The caching allocator's bookkeeping core: PyTorch's native policy over a raw backend.

Pure Python, no driver: it runs over a small :class:`~gpurt._memory.segments.Backend` (segments,
events, mem_get_info), so the same code is tested on a CPU over host memory and used on the
GPU over cuMemAlloc. The policy is torch's CUDACachingAllocator, decision for decision:

- sizes round up to 512 B (or to power-of-two divisions, ``roundup_power2_divisions``);
  requests <= 1 MiB come from the small pool in 2 MiB segments, larger ones from the large
  pool in 20 MiB segments below 10 MiB, else rounded up to 2 MiB (gpurt/_memory/segments.py);
- best fit by (stream, size, address); a block is split when the rest is worth keeping
  (>= 512 B in the small pool, > 1 MiB in the large pool, and never blocks of
  ``max_split_size`` or more); freed neighbours merge; blocks never change stream;
- a block used on other streams (``record_stream``) is reused only after events recorded
  on those streams at free time have completed;
- during graph capture, allocations on a capturing stream (or on a stream that joined its
  capture) come from that graph's private pool, and everything unsafe while capturing
  (freeing segments, event queries, syncs) waits until no capture is underway.

Frees are safe from finalizers: ``free`` records the events of a block's stream uses at
once, as torch does, only where that is safe (no capture underway, not on the driver's
callback thread, this device's context already current); otherwise they are recorded at the
next allocation. If the lock is busy (another thread, or a finalizer run by the garbage
collector inside an allocator call) the pointer is queued and freed at the next call.
Before gpurt destroys a stream it owns, :meth:`CachingAllocator.retire_stream` finishes
with it (gpurt/_memory/streamuses.py says how), so no event is ever recorded on a dead stream.

The hot path. Python pays for every call and attribute, so ``malloc`` and ``free`` are
written out in full, statistics are packed integers (gpurt/_memory/stats.py), and the commonest
pattern, freeing a block and asking again for the same size on the same stream, is served
from a *parked* block: when the last allocation was cut from free block F (leaving rest R)
and is freed again with nothing else touched in between, torch would merge it back into F
and hand out the same address next time. The allocator remembers that instead of doing it:
F (or R) is *parked*, free in every sense but not yet in the free-block index. A free or
allocation of the parked block only flips a flag and counts the flip; the statistics owe
the flips' exact vectors (those the full path computed) and are *settled* before anything
reads or changes them. Peaks need no check in between: both states of the block were
counted by the full path, and resetting the peaks unparks. Any other operation first
*unparks* (settles, merges and indexes for real), so all other code sees ordinary state.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

from .._core.captures import CAPTURES
from . import stats as ms
from .blocks import Block, BlockPool
from .config import AllocatorConfig
from .history import HistorySettings, capture_frames
from .privatepools import PrivatePools
from .protocol import RETIRE_WAIT
from .segments import MIN_BLOCK, SMALL_SIZE, Backend

__all__: list[str] = []

_ALLOC_COUNTS = ms.ALLOC_COUNTS
_ALLOC_BYTES = ms.ALLOC_BYTES
_REQUESTED_SHIFT = ms.REQUESTED_SHIFT
_SPLIT = ms.SPLIT
_SPLIT_BYTES = ms.SPLIT_BYTES


class CachingAllocator(PrivatePools):
    """The caching allocator of one device. Thread-safe (one lock). A DeviceAllocator
    (gpurt/_memory/protocol.py)."""

    def __init__(self, device: int, backend: Backend, config: AllocatorConfig,
                 history: HistorySettings | None = None) -> None:
        super().__init__(device, backend, config, history)
        self._lock = threading.Lock()
        self._allocated: dict[int, Block] = {}
        # frees that could not take the lock, and release_pool calls likewise
        self._queued: collections.deque[int] = collections.deque()
        self._queued_releases: collections.deque[Any] = collections.deque()
        self._work = False  # deferred work waits (events, empty_cache, uncached frees)
        self._empty_cache_wanted = False
        self._round_pow2 = config.rounds_to_power2
        self._gc_counting = False
        self._plain = config.caching  # no capture, no garbage collection: parking allowed
        # The parked block (see the module docstring): ``_hot`` (at ``_hot_ptr``) was cut
        # from free block F for a request of ``_hot_size`` bytes on ``_hot_stream``, leaving
        # ``_hot_rest`` (or None). ``_hot_free``: F is free (parked whole); else ``_hot`` is
        # allocated (but not in ``_allocated``: see owns) and ``_hot_rest`` is parked. The
        # flags of ``_hot`` itself are brought up to date when it is unparked.
        # ``_hot_inc``/``_hot_dec``: the allocation's statistics vectors (into ``_hot_stats``);
        # ``_hot_flips``: frees and allocations of the parked block not yet counted in them.
        self._hot: Block | None = None
        self._hot_rest: Block | None = None
        self._hot_ptr = -1
        self._hot_free = False
        self._hot_size = -1
        self._hot_stream = -1
        self._hot_stats: ms.PoolStats = self.stats.small  # (meaningless until a block parks)
        self._hot_inc = self._hot_dec = 0
        self._hot_flips = 0

    # ---- allocation ------------------------------------------------------------------

    def malloc(self, size: int, stream: int) -> int:
        """A device pointer to ``size`` bytes for use on ``stream`` (0 for size 0)."""
        lock = self._lock
        lock.acquire()
        try:
            # The parked block again (its size is positive; with deferred work waiting, the
            # full path runs after that work: it unparks, as any other operation does).
            if (self._hot_free and size == self._hot_size and stream == self._hot_stream
                    and not self._work and not self.history.on):
                self._hot_free = False  # same address, same counts (settled later)
                self._hot_flips += 1
                return self._hot_ptr
            if size <= 0:
                if size == 0:
                    return 0
                raise ValueError(f"cannot allocate a negative number of bytes ({size})")
            if self._work:
                self._service()
            return self._malloc(size, stream)
        finally:
            if self._queued:
                self._drain_queue()
            lock.release()

    def _malloc(self, size: int, stream: int) -> int:
        """The full allocation path (torch's malloc + alloc_found_block)."""
        if self._hot is not None:
            self._unpark()
        if self._retired and stream in self._retired and CAPTURES.count == 0:
            self._outlive_retired(stream)
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
            block = index.lower_bound(rsize)
            if block is not None and block.expandable is not None:
                block = self._expandable_fit(index, block)
            if block is not None:
                max_split = self._max_split
                if rsize < max_split:
                    if block.size >= max_split:
                        block = None  # no oversize block for a smaller request
                elif block.size >= rsize + self.config.max_non_split_rounding_size:
                    block = None
                if block is not None:
                    index.remove(block)
        from_cache = block is not None
        if block is None:
            block = self._new_segment(pool, rsize, stream)
        return self._alloc_found_block(block, pool, size, rsize, stream, from_cache)

    def _alloc_found_block(self, block: Block, pool: BlockPool, size: int, rsize: int,
                           stream: int, from_cache: bool) -> int:
        """torch's alloc_found_block: split off the rest if worth it, count, park or record."""
        block.is_free = False
        remaining = block.size - rsize
        if pool.is_small or self._expandable:
            split = remaining >= MIN_BLOCK
        else:
            split = remaining > SMALL_SIZE and rsize < self._max_split
        # inactive_split counts split blocks of fixed segments only (as torch does)
        was_split = block.expandable is None and (block.prev is not None or block.next is not None)
        rest = None
        increase = decrease = 0
        if split:
            rest = self._spare.pop() if self._spare else Block(0, 0, 0, pool)
            rest.ptr = block.ptr + rsize
            rest.size = remaining
            rest.stream = stream
            rest.pool = pool
            rest.requested = 0
            rest.expandable = block.expandable
            rest.prev = block
            rest.next = after = block.next
            if after is not None:
                after.prev = rest
            block.next = rest
            block.size = rsize
            rest.is_free = True
            if was_split:
                decrease = rsize * _SPLIT_BYTES  # an inactive split block shrinks
            elif block.expandable is None:
                increase = _SPLIT + remaining * _SPLIT_BYTES  # a new inactive split block
        elif was_split:
            decrease = _SPLIT + block.size * _SPLIT_BYTES  # an inactive split turns active
        used = block.size  # more than rsize when the rest was not worth splitting off
        vector = _ALLOC_COUNTS + used * _ALLOC_BYTES + (size << _REQUESTED_SHIFT)
        if used >= self._max_split:
            vector += ms.OVERSIZE_ALLOCATION
        increase += vector
        block.allocated = True
        block.requested = size
        block.vector = vector
        ptr = block.ptr
        self.stats.change(pool.stats, increase, decrease)
        if from_cache and self._plain and not self._captures:
            # park the rest: the next free of this block can restore F without the index
            self._hot, self._hot_rest, self._hot_ptr, self._hot_free = block, rest, ptr, False
            self._hot_size, self._hot_stream, self._hot_stats = size, stream, pool.stats
            self._hot_inc, self._hot_dec = increase, decrease
        else:
            self._allocated[ptr] = block
            if rest is not None:
                self._insert_free(pool, rest)
        if self.history.on:
            if self.history.alloc_frames:
                block.frames = frames = capture_frames()
                if self.history.trace:
                    self.trace.record("alloc", ptr, size, stream, frames)
            if self.history.observer is not None:
                self.history.observer.allocated(ptr, block.size)
        return ptr

    def _settle(self) -> None:
        """Count the parked block's flips in the statistics. They alternate (a free, an
        allocation, ...), so an odd count ends in the state the block is in now."""
        flips = self._hot_flips
        if not flips:
            return
        self._hot_flips = 0
        frees = allocations = flips >> 1
        if flips & 1:
            if self._hot_free:
                frees += 1
            else:
                allocations += 1
        inc, dec = self._hot_inc, self._hot_dec  # a free is the allocation reversed
        self.stats.change(self._hot_stats, allocations * inc + frees * dec,
                          allocations * dec + frees * inc)

    def _unpark(self) -> None:
        """Make the parked block ordinary: settle its statistics, merge and index it as the
        full path would."""
        self._settle()
        block: Block = self._hot  # type: ignore[assignment]  # (only called while parked)
        rest = self._hot_rest
        self._hot = self._hot_rest = None
        self._hot_ptr = -1
        if self._hot_free:  # F = block + rest, free
            self._hot_free = False
            block.allocated = False
            if rest is not None:
                block.size += rest.size
                block.next = after = rest.next
                if after is not None:
                    after.prev = block
                rest.prev = rest.next = rest.frames = None
                self._spare.append(rest)
            self._insert_free(block.pool, block)
        else:  # block allocated, rest free
            block.allocated = True
            block.is_free = False
            self._allocated[block.ptr] = block
            if rest is not None:
                self._insert_free(rest.pool, rest)

    # ---- free ------------------------------------------------------------------------

    def free(self, ptr: int) -> None:
        """Free an allocation. Never calls the backend; queues when the lock is busy."""
        if not ptr:
            return
        lock = self._lock
        if not lock.acquire(False):
            self._queued.append(ptr)
            self._work = True
            return
        try:
            if ptr == self._hot_ptr and not self._hot_free and not self.history.on:
                self._hot_free = True  # back to F: the allocation reversed (settled later)
                self._hot_flips += 1
            else:
                self._free(ptr)
        finally:
            if self._queued:
                self._drain_queue()
            lock.release()

    def _drain_queue(self) -> None:
        queued = self._queued
        while queued:
            ptr = queued.popleft()
            if not ptr:
                continue  # the wake-up left by a queued release_pool
            try:
                self._free(ptr)
            except ValueError:
                pass  # a bad pointer from a finalizer: nobody to tell
        while self._queued_releases:
            try:
                self._release_pool(self._queued_releases.popleft())
            except RuntimeError:
                pass

    def _free(self, ptr: int) -> None:
        """The full free path: history, stream uses, the uncached mode."""
        if self._hot is not None:
            self._unpark()
        block = self._allocated.pop(ptr, None)
        if block is None:
            raise ValueError(
                f"0x{ptr:x} is not an allocation of gpurt's caching allocator on device "
                f"{self.device} (already freed, or never allocated here)"
            )
        block.allocated = False
        history = self.history
        if history.observer is not None:
            history.observer.freed(ptr, block.size)
        if history.trace:
            frames = capture_frames() if history.free_frames else block.frames
            self.trace.record("free_requested", ptr, block.requested, block.stream, frames)
        if block.stream_uses:
            # allocated -> pending: events are recorded on the using streams (now if that is
            # safe, else at the next allocation), and the block returns to its pool when they
            # have all completed.
            part = ms.ALLOCATION + block.size * ms.ALLOCATED_BYTES
            if block.size >= self._max_split:
                part += ms.OVERSIZE_ALLOCATION
            self.stats.change(block.pool.stats, 0, part)
            block.vector -= part
            if not self._record_at_free(block):
                self._needs_events.append(block)
            self._work = True  # events to record or to poll
            return
        self._free_block(block)
        if not self._caching:
            self._work = True  # return the segment to the backend at the next safe point

    def _free_block(self, block: Block) -> None:
        """Return a block to its pool, merging free neighbours (torch's free_block)."""
        if self._hot is not None:
            self._unpark()
        pool = block.pool
        splits = split_bytes = 0
        prev = block.prev
        if prev is not None and prev.is_free:
            self._remove_free(prev)
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
            self._remove_free(after)
            block.size += after.size
            block.next = beyond = after.next
            if beyond is not None:
                beyond.prev = block
            splits -= 1
            split_bytes -= after.size
            after.prev = after.next = after.frames = None
            self._spare.append(after)
        self._insert_free(pool, block)
        if block.prev is not None or block.next is not None:
            splits += 1
            split_bytes += block.size
        if block.expandable is not None:
            splits = split_bytes = 0  # not counted for expandable segments (see expandable.py)
        increase, decrease = 0, block.vector
        block.vector = 0
        if splits > 0:
            increase = splits * _SPLIT
        elif splits < 0:
            decrease -= splits * _SPLIT
        if split_bytes > 0:
            increase += split_bytes * _SPLIT_BYTES
        elif split_bytes < 0:
            decrease -= split_bytes * _SPLIT_BYTES
        self.stats.change(pool.stats, increase, decrease)
        if self.history.trace:
            frames = capture_frames() if self.history.free_frames else block.frames
            self.trace.record("free_completed", block.ptr, block.requested, block.stream, frames)
        block.frames = None

    # ---- streams and events ----------------------------------------------------------

    def record_stream(self, ptr: int, stream: int) -> None:
        """Mark the allocation holding ``ptr`` as used on ``stream`` (torch's recordStream)."""
        with self._lock:
            if self._hot is not None:
                self._unpark()
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

    def owns(self, ptr: int) -> bool:
        """True when ``ptr`` is a live allocation of this allocator."""
        return ptr in self._allocated or (ptr == self._hot_ptr and not self._hot_free)

    def _block_containing(self, ptr: int) -> Block | None:
        for block in self._allocated.values():
            if block.ptr <= ptr < block.ptr + block.size:
                return block
        return None

    def retire_stream(self, device: int, stream: int) -> bool:
        """Finish with ``stream`` before gpurt destroys it (see the module docstring and
        :meth:`_retire_uses`). False when that has to wait (a capture is underway, or the
        lock stayed busy): the stream must then be kept and this asked again later."""
        if not self._lock.acquire(timeout=RETIRE_WAIT):
            return False
        try:
            if self._queued:
                self._drain_queue()
            if self._hot is not None:
                self._unpark()
            users = [b for b in self._allocated.values()
                     if b.stream_uses and stream in b.stream_uses]
            done = self._retire_uses(stream, users, device == self.device)
            self._work = self._work or bool(self._retired)
            return done
        finally:
            if self._queued:
                self._drain_queue()
            self._lock.release()

    def _service(self) -> None:
        """Deferred work: queued frees, and, when no capture is underway, recording and
        polling events, a wanted empty_cache, segments of the uncached mode."""
        if self._queued:
            self._drain_queue()
        if CAPTURES.count == 0:
            if self._needs_events:
                self._insert_events()
            if self._events or self._retired:
                self._process_events()
            if self._empty_cache_wanted:
                self._empty_cache_wanted = False
                self._release_cached_blocks()
            if not self._caching:
                self._release_unsplit(self._small)
                self._release_unsplit(self._large)
        self._work = bool(self._needs_events or self._events or self._retired
                          or self._empty_cache_wanted
                          or (not self._caching and bool(super()._all_blocks())))

    def _release_cached_blocks(self) -> None:
        if self._hot is not None:
            self._unpark()
        self._synchronize_and_free_events()
        super()._release_cached_blocks()

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
            if self._hot is not None:
                self._unpark()
            self._fraction = fraction
            self._allowed = int(fraction * total)
            self._fraction_set = True
            self._gc_counting = self.config.garbage_collection_threshold > 0
            self._plain = self._caching and not self._gc_counting

    def set_config(self, config: AllocatorConfig) -> None:
        """New settings at run time (torch's _set_allocator_settings). Blocks already
        cached keep their kind: turning expandable segments off leaves existing ones in
        use until they are freed, but no new request is served from them."""
        with self._lock:
            if self._hot is not None:
                self._unpark()
            # caching is fixed at creation (GPURT_NO_CACHING, or change_current_allocator)
            self.config = config = dataclasses.replace(config, caching=self._caching)
            self._max_split = config.max_split_size
            self._round_pow2 = config.rounds_to_power2
            self._expandable = config.expandable
            self._gc_counting = self._fraction_set and config.garbage_collection_threshold > 0
            self._plain = self._caching and not self._gc_counting

    @property
    def memory_fraction(self) -> float:
        return self._fraction

    def reset_peak_stats(self) -> None:
        with self._lock:
            if self._hot is not None:
                self._unpark()  # the parked block's states were checked against the old peaks
            self.stats.reset_peak()

    def reset_accumulated_stats(self) -> None:
        with self._lock:
            self._settle()
            self.stats.reset_accumulated()

    def nested_stats(self) -> dict[str, Any]:
        """torch.cuda.memory_stats_as_nested_dict for this device."""
        with self._lock:
            if self._queued:
                self._drain_queue()
            self._settle()
            return self.stats.as_nested_dict(self.config.max_split_size_stat)

    def allocation_size_of(self, ptr: int) -> int:
        """Size of the block allocated at ``ptr``."""
        if ptr == self._hot_ptr and not self._hot_free:
            block: Block | None = self._hot
        else:
            block = self._allocated.get(ptr)
        if block is None:
            raise ValueError(f"0x{ptr:x} is not a live allocation on device {self.device}")
        return block.size

    # ---- inspection ------------------------------------------------------------------

    def _all_blocks(self) -> list[Block]:
        """Every block: free, allocated and pending."""
        return super()._all_blocks() + list(self._allocated.values()) + self._pending_blocks()

    def segments(self) -> list[tuple[Block, ...]]:
        """Each segment as its blocks in address order."""
        with self._lock:
            if self._hot is not None:
                self._unpark()
            return self._segment_chains(self._all_blocks())

    def snapshot(self) -> list[dict[str, Any]]:
        """Segments with their blocks, as torch.cuda.memory_snapshot() lists them."""
        with self._lock:
            if self._queued:
                self._drain_queue()
            if self._hot is not None:
                self._unpark()
            return self._snapshot_dicts(self._all_blocks())

