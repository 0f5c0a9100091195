"""Expandable segments (``GPURT_ALLOC_CONF=expandable_segments:True``): torch's cure for
fragmentation, with torch's rules and statistics.

Instead of one cuMemAlloc per segment, each (pool, stream) gets a large reserved address
range (cuMemAddressReserve, 9/8 of the device's memory) whose pages -- 2 MiB in the small
pool, 20 MiB in the large pool -- are backed by physical memory (cuMemCreate + cuMemMap)
only where blocks need them. A request that no cached block fits grows the segment in place
at its lowest address with room (free mapped space followed by unmapped space), so memory
freed at the end of a segment is reused by larger requests later instead of stranding a
fixed-size segment; empty_cache (and the out-of-memory retry) unmaps the whole pages of
free blocks and gives them back.

The blocks of an expandable segment form one address-ordered list like a fixed segment's,
covering the whole reserved range; ranges without memory are *unmapped* blocks (``mapped``
False; neither free nor allocated), kept per pool and stream in address order. As in torch:
- with expandable segments on, a large-pool block is split whenever 512 B or more remain;
- the best fit counts a free block followed by unmapped space as that much bigger, so it
  is chosen only when no block fits better;
- mapping a page adds to ``reserved_bytes`` and ``num_device_alloc`` (``segment`` counts
  stay 0: no cuMemAlloc), unmapping subtracts and counts ``num_device_free``;
  ``inactive_split`` never counts blocks of expandable segments (their free pages can always
  be returned);
- memory_snapshot shows each run of mapped blocks as one segment with ``is_expandable``;
- graph-private pools keep fixed segments.
"""

from __future__ import annotations

import bisect
from typing import Any

from .._core.captures import CAPTURES
from . import stats as ms
from .blocks import Block, BlockPool, FreeBlocks
from .history import capture_frames
from .segments import LARGE_BUFFER, SMALL_BUFFER, SegmentCache

__all__: list[str] = []


class ExpandableSegment:
    """One reserved address range, backed page by page."""

    __slots__ = ("base", "size", "page", "stream")

    def __init__(self, base: int, size: int, page: int, stream: int) -> None:
        self.base = base
        self.size = size
        self.page = page
        self.stream = stream

    def pages_covering(self, ptr: int, size: int) -> tuple[int, int]:
        """(start, length) of the fewest whole pages covering [ptr, ptr + size)."""
        first = (ptr - self.base) // self.page
        end = -(-(ptr + size - self.base) // self.page)
        return self.base + first * self.page, (end - first) * self.page

    def pages_inside(self, ptr: int, size: int) -> tuple[int, int]:
        """(start, length) of the whole pages inside [ptr, ptr + size); length may be 0."""
        first = -(-(ptr - self.base) // self.page)
        end = (ptr + size - self.base) // self.page
        return self.base + first * self.page, max(end - first, 0) * self.page

    def __repr__(self) -> str:
        return f"ExpandableSegment(0x{self.base:x}, {self.size}, page={self.page})"


def _allocatable(block: Block | None) -> bool:
    """Free, or unmapped (torch: not allocated, no events, no stream uses)."""
    return block is not None and (block.is_free or not block.mapped)


class ExpandableSegments(SegmentCache):
    """The expandable-segment part of the segment cache. Methods expect the caller to hold
    the allocator's lock and to have materialized any parked block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address_space = 0  # bytes reserved per segment (set at the first)

    # ---- the unmapped index ----------------------------------------------------------

    def _add_unmapped(self, block: Block) -> None:
        block.mapped = False
        block.is_free = False
        blocks = block.pool.unmapped.setdefault(block.stream, [])
        bisect.insort(blocks, block, key=_address)

    def _remove_unmapped(self, block: Block) -> None:
        blocks = block.pool.unmapped[block.stream]
        del blocks[bisect.bisect_left(blocks, block.ptr, key=_address)]

    def _unmapped_blocks(self) -> list[Block]:
        return [b for pool in self._pools() for blocks in pool.unmapped.values() for b in blocks]

    # ---- growing ---------------------------------------------------------------------

    def _expandable_block(self, pool: BlockPool, rsize: int, stream: int) -> Block | None:
        """A free mapped block of at least ``rsize`` bytes, taken out of the free index,
        made by mapping pages of an expandable segment (torch's
        try_allocate_expandable_block); None when the device is out of memory."""
        candidate = self._find_expandable(pool, rsize, stream)
        if candidate is None:
            return None
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, rsize)):
            return None
        while candidate.size < rsize:  # free, then unmapped: map what is missing
            following = candidate.next
            assert following is not None and not following.mapped
            if not self._map_block(following, min(rsize - candidate.size, following.size)):
                return None
            candidate = following  # it absorbed the free block before it
        self._remove_free(candidate)
        return candidate

    def _find_expandable(self, pool: BlockPool, rsize: int, stream: int) -> Block | None:
        """The lowest-addressed run of free and unmapped blocks with ``rsize`` bytes of room
        (torch's find_expandable_block), or the unmapped block of a new segment."""
        for block in pool.unmapped.get(stream, ()):
            start = block.prev if _allocatable(block.prev) else block
            room = 0
            probe: Block | None = start
            while room < rsize and _allocatable(probe):
                room += probe.size  # type: ignore[union-attr]
                probe = probe.next  # type: ignore[union-attr]
            if room >= rsize:
                return start
        page = SMALL_BUFFER if pool.is_small else LARGE_BUFFER
        if not self._address_space:
            total = self.backend.mem_get_info()[1]
            self._address_space = total + total // 8
        size = -(-self._address_space // page) * page
        base = self.backend.reserve(size)
        if base is None:
            return None
        segment = ExpandableSegment(base, size, page, stream)
        self._expandables[base] = segment
        block = Block(base, size, stream, pool)
        block.expandable = segment
        self._add_unmapped(block)
        return block

    def _map_block(self, block: Block, size: int) -> bool:
        """Back the first ``size`` bytes of unmapped ``block`` (rounded up to pages) with
        memory and make them a free block, merged with a free neighbour (torch's
        map_block). False when the device is out of memory."""
        segment = block.expandable
        start, length = segment.pages_covering(block.ptr, size)
        assert start == block.ptr and 0 < length <= block.size
        if not self.backend.map(start, length, segment.page, CAPTURES.count > 0):
            return False
        self._remove_unmapped(block)
        block.mapped = True
        if length < block.size:
            rest = Block(block.ptr + length, block.size - length, block.stream, block.pool)
            rest.expandable = segment
            self._link(block, rest, block.next)
            self._add_unmapped(rest)
            block.size = length
        self._absorb_neighbours(block)
        self._insert_free(block.pool, block)
        self._reserved += length
        self.stats.change(block.pool.stats, length * ms.RESERVED_BYTES, 0)
        self.stats.num_device_alloc += 1
        if self.history.trace:
            self.trace.record("segment_map", start, length, block.stream, capture_frames())
        return True

    def _expandable_fit(self, index: FreeBlocks, block: Block) -> Block | None:
        """torch's best fit among blocks of expandable segments: a free block followed by
        unmapped space counts as that much bigger, so a later block that is smaller that
        way wins. With expandable segments turned off since, their blocks are skipped."""
        if not self._expandable:
            return next((b for b in index.after(block) if b.expandable is None), None)
        for following in index.after(block):
            if block.expandable is None or _room(following) >= _room(block):
                break
            block = following
        return block

    # ---- shrinking -------------------------------------------------------------------

    def _unmap_free(self, blocks: list[Block]) -> None:
        """Give back the whole pages of these free blocks, and the address range of every
        segment left with no memory at all (torch's release_blocks for expandable ones)."""
        for block in blocks:
            self._unmap_block(block)
            if block.prev is None and block.next is None and not block.mapped:
                self._release_expandable(block)

    def _unmap_block(self, block: Block) -> None:
        """Unmap the pages inside free ``block``; what is left on either side stays free
        (torch's unmap_block)."""
        segment = block.expandable
        start, length = segment.pages_inside(block.ptr, block.size)
        if not length:
            return
        self.backend.unmap(start, length, segment.page)
        self._remove_free(block)
        before = start - block.ptr
        after = block.size - before - length
        if before:
            head = Block(block.ptr, before, block.stream, block.pool)
            head.expandable = segment
            self._link(block.prev, head, block)
            self._insert_free(block.pool, head)
        if after:
            tail = Block(start + length, after, block.stream, block.pool)
            tail.expandable = segment
            self._link(block, tail, block.next)
            self._insert_free(block.pool, tail)
        block.ptr, block.size = start, length
        block.mapped = False
        self._absorb_neighbours(block)
        self._add_unmapped(block)
        self._reserved -= length
        self.stats.change(block.pool.stats, 0, length * ms.RESERVED_BYTES)
        self.stats.num_device_free += 1
        if self.history.trace:
            frames = capture_frames() if self.history.free_frames else None
            self.trace.record("segment_unmap", start, length, block.stream, frames)

    def _release_expandable(self, block: Block) -> None:
        """Free the address range of a segment that has no memory mapped any more."""
        segment = block.expandable
        assert block.ptr == segment.base and block.size == segment.size
        self._remove_unmapped(block)
        del self._expandables[segment.base]
        self.backend.unreserve(segment.base, segment.size)

    # ---- list surgery ----------------------------------------------------------------

    @staticmethod
    def _link(before: Block | None, block: Block, after: Block | None) -> None:
        """Put ``block`` between ``before`` and ``after`` in the address-ordered list."""
        block.prev, block.next = before, after
        if before is not None:
            before.next = block
        if after is not None:
            after.prev = block

    def _absorb_neighbours(self, block: Block) -> None:
        """Merge into ``block`` its neighbours in the same state (both free, or both
        unmapped), taking them out of their index (torch's try_merge_blocks, twice)."""
        for other in (block.prev, block.next):
            if other is None or other.mapped != block.mapped:
                continue
            if other.mapped:
                if not other.is_free:
                    continue
                self._remove_free(other)
            else:
                self._remove_unmapped(other)
            if other is block.prev:
                block.ptr = other.ptr
                self._link(other.prev, block, block.next)
            else:
                self._link(block.prev, block, other.next)
            block.size += other.size
            other.prev = other.next = None

    # ---- inspection ------------------------------------------------------------------

    def expandable_segment_of(self, ptr: int) -> ExpandableSegment | None:
        """The expandable segment whose address range holds ``ptr``, None for memory of
        fixed segments. Legacy IPC (cuIpcGetMemHandle) cannot export the memory of an
        expandable segment: its pages are cuMemCreate allocations (exportable as POSIX file
        descriptors with cuMemExportToShareableHandle instead)."""
        for segment in list(self._expandables.values()):
            if segment.base <= ptr < segment.base + segment.size:
                return segment
        return None

    def _expandable_runs(self, blocks: list[Block]) -> list[tuple[Block, ...]]:
        """Each run of mapped blocks of every expandable segment, given every mapped block
        (what torch's snapshot reports as one segment each)."""
        heads = [b for b in blocks if b.expandable is not None
                 and (b.prev is None or not b.prev.mapped)]
        runs = []
        for head in heads:
            run = []
            block: Block | None = head
            while block is not None and block.mapped:
                run.append(block)
                block = block.next
            runs.append(tuple(run))
        return runs


def _room(block: Block) -> int:
    """A free block's size plus the unmapped space right after it."""
    after = block.next
    return block.size + (after.size if after is not None and not after.mapped else 0)


def _address(block: Block) -> int:
    return block.ptr
