"""Blocks, the best-fit index of free blocks, block pools and graph-private pools.

A *segment* is one allocation from the backend (cuMemAlloc), or one reserved address range
of an expandable segment (gpurt/_memory/expandable.py); it is cut into *blocks* that form a
doubly linked list in address order (``prev``/``next``). Free blocks of a pool are
indexed per stream by (size, address), which is the order torch's ``BlockComparatorSize``
gives them, so ``lower_bound`` picks the same block torch would.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from .stats import PoolStats

__all__: list[str] = []


class Block:
    """A piece of a segment: allocated, free (in its pool's index) or pending (freed, but
    still in use by streams recorded with record_stream)."""

    __slots__ = (
        "ptr", "size", "requested", "stream", "pool", "prev", "next",
        "allocated", "is_free", "event_count", "stream_uses", "gc_base", "vector", "frames",
        "vector_size", "last_vector", "expandable", "mapped",
    )

    def __init__(self, ptr: int, size: int, stream: int, pool: BlockPool) -> None:
        self.ptr = ptr
        self.size = size
        self.requested = 0
        self.stream = stream
        self.pool = pool
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.is_free = False
        self.event_count = 0
        self.stream_uses: set[int | RetiredUse] | None = None
        self.gc_base = 0
        self.vector = 0  # packed statistics charged while allocated/active (see _memstats)
        self.frames: tuple | None = None
        self.vector_size = 0  # block size that last_vector was computed for
        self.last_vector = 0
        self.expandable: Any = None  # the ExpandableSegment this block is part of, if any
        self.mapped = True  # False: address space of an expandable segment with no memory

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    @property
    def active(self) -> bool:
        """Allocated, or freed but waiting for other streams (torch's "active")."""
        return not self.is_free

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("free" if self.is_free else "pending")
        if not self.mapped:
            state = "unmapped"
        return f"Block(0x{self.ptr:x}, {self.size}, stream={self.stream}, {state})"


class RetiredUse:
    """A use of a block on a stream that gpurt has destroyed since (``record_stream``): the
    event recorded on that stream just before, standing in for it. The stream handle is
    kept only as a key; nothing may be enqueued on it any more."""

    __slots__ = ("device", "stream", "event")

    def __init__(self, device: int, stream: int, event: Any) -> None:
        self.device = device
        self.stream = stream
        self.event = event

    def __repr__(self) -> str:
        return f"RetiredUse(cuda:{self.device}, stream=0x{self.stream:x})"


class FreeBlocks:
    """Free blocks of one stream in one pool, ordered by (size, address).

    ``buckets`` maps a size to its blocks sorted by address; ``sizes`` lists the bucket
    sizes in order. Emptied buckets are kept (a block of that size usually comes back soon,
    and keeping them makes the alloc/free cycle free of list insertions) and swept away
    when a search has to step over many of them."""

    __slots__ = ("sizes", "buckets")

    _SWEEP_AFTER = 16

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.buckets: dict[int, list[Block]] = {}

    def add(self, block: Block) -> None:
        size = block.size
        bucket = self.buckets.get(size)
        if bucket is None:
            self.buckets[size] = [block]
            bisect.insort(self.sizes, size)
        elif not bucket or bucket[-1].ptr < block.ptr:
            bucket.append(block)
        else:
            bucket.insert(bisect.bisect_left(bucket, block.ptr, key=_address), block)

    def remove(self, block: Block) -> None:
        bucket = self.buckets[block.size]
        if bucket[0] is block:
            del bucket[0]
        else:
            bucket.remove(block)

    def lower_bound(self, size: int) -> Block | None:
        """The smallest free block of at least ``size`` bytes (lowest address first)."""
        bucket = self.buckets.get(size)
        if bucket:
            return bucket[0]
        sizes, buckets = self.sizes, self.buckets
        start = bisect.bisect_left(sizes, size)
        skipped = 0
        found = None
        for i in range(start, len(sizes)):
            bucket = buckets[sizes[i]]
            if bucket:
                found = bucket[0]
                break
            skipped += 1
        if skipped > self._SWEEP_AFTER:
            self.sweep()
        return found

    def sweep(self) -> None:
        """Drop empty buckets."""
        self.sizes = [s for s in self.sizes if self.buckets[s]]
        self.buckets = {s: self.buckets[s] for s in self.sizes}

    def after(self, block: Block) -> Iterator[Block]:
        """The blocks that follow ``block`` (which is in the index) in (size, address) order."""
        bucket = self.buckets[block.size]
        yield from bucket[bucket.index(block) + 1:]
        sizes = self.sizes
        for i in range(bisect.bisect_right(sizes, block.size), len(sizes)):
            yield from self.buckets[sizes[i]]

    def __iter__(self) -> Iterator[Block]:
        """Blocks in (size, address) order; safe to remove blocks while iterating."""
        for size in list(self.sizes):
            yield from list(self.buckets[size])

    def __len__(self) -> int:
        return sum(len(b) for b in self.buckets.values())


def _address(block: Block) -> int:
    return block.ptr


class BlockPool:
    """Free blocks of one kind (small <= 1 MiB, or large) of the default pools or of one
    graph-private pool, indexed per stream. ``unmapped``: per stream, the blocks of
    expandable segments that have no memory mapped, in address order."""

    __slots__ = ("is_small", "stats", "owner", "by_stream", "gc_calls", "unmapped")

    def __init__(self, is_small: bool, stats: PoolStats, owner: PrivatePool | None = None) -> None:
        self.is_small = is_small
        self.stats = stats  # the small or large statistics this pool counts into
        self.owner = owner
        self.by_stream: dict[int, FreeBlocks] = {}
        self.gc_calls = 0  # torch's get_free_blocks_call_count (garbage collection ages)
        self.unmapped: dict[int, list[Block]] = {}

    def free_blocks(self) -> Iterator[Block]:
        for index in list(self.by_stream.values()):
            yield from index

    def free_bytes(self) -> int:
        return sum(b.size for b in self.free_blocks())

    @property
    def kind(self) -> str:
        return "small" if self.is_small else "large"


class PrivatePool:
    """A graph's private pool, or a MemPool's: its own segments, never shared with other
    allocations. ``use_count`` counts retain_pool/release_pool references; ``segments`` the
    backend allocations it holds (torch's cudaMalloc_count); ``backend`` where they come
    from when not the allocator's own (a MemPool's pluggable allocator)."""

    __slots__ = ("id", "use_count", "segments", "small", "large", "backend")

    def __init__(self, pool_id: Any, small_stats: PoolStats, large_stats: PoolStats) -> None:
        self.id = pool_id
        self.use_count = 0
        self.segments = 0
        self.backend: Any = None
        self.small = BlockPool(True, small_stats, self)
        self.large = BlockPool(False, large_stats, self)
