"""Test helpers for the allocator core: a fake host-memory backend (segments, and reserved
ranges with mapped pages for expandable segments) and a deliberately naive model of torch's
caching allocator (plain lists and one Stat object per statistic; expandable segments written
after torch's try_allocate_expandable_block, map_block and unmap_block), which the optimized
core must agree with on every statistic and every pointer."""

from __future__ import annotations

from typing import Any

from gpurt._memory import stats as ms
from gpurt._memory.config import (
    UNLIMITED,
    AllocatorConfig,
    divisions_for,
    roundup_power2_next_division,
)

KiB, MiB = 1 << 10, 1 << 20


class Segfault(BaseException):
    """What the real driver does when an event is recorded on a destroyed stream: no error
    code, the process dies. A BaseException, so no ``except Exception`` can hide it."""


class FakeBackend:
    """Segments are address ranges in a pretend address space with a capacity; streams
    have a work counter, events complete when the test says so (or on synchronize).
    ``destroy(stream)`` kills a stream: any later event recorded on it is a Segfault."""

    def __init__(self, capacity: int = 1 << 34) -> None:
        self.capacity = capacity
        self.next = 1 << 40
        self.live: dict[int, int] = {}
        self.queued: dict[int, int] = {}  # stream -> work items enqueued
        self.done: dict[int, int] = {}  # stream -> work items completed
        self.events_created = 0
        self.calls: list[str] = []
        self.capturing_calls = 0
        self.destroyed: set[int] = set()
        self.recording_allowed = True  # what may_record_events() answers
        self.capture_ids: dict[int, int] = {}  # stream -> id of the capture it is part of
        self.reserved: dict[int, int] = {}  # expandable segments' address ranges
        self.pages: dict[int, int] = {}  # mapped page address -> page size

    def destroy(self, stream: int) -> None:
        """The stream is destroyed; its queued work still completes when told to."""
        self.destroyed.add(stream)

    def create(self, stream: int) -> None:
        """A new stream gets a handle the driver used before (its work counter goes on)."""
        self.destroyed.discard(stream)

    def used(self) -> int:
        return sum(self.live.values()) + sum(self.pages.values())

    def malloc(self, size: int, capturing: bool, stream: int = 0) -> int | None:
        self.calls.append("malloc")
        if capturing:
            self.capturing_calls += 1
        if self.used() + size > self.capacity:
            return None
        ptr = self.next
        self.next += size + 2 * MiB  # a gap, so separate segments never look contiguous
        self.live[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        self.calls.append("free")
        del self.live[ptr]

    # expandable segments: address space is free to reserve, pages count against capacity
    def reserve(self, size: int) -> int | None:
        self.calls.append("reserve")
        ptr = -(-self.next // (2 * MiB)) * (2 * MiB) + 2 * MiB  # 2 MiB aligned, as the driver's
        self.next = ptr + size + 2 * MiB
        self.reserved[ptr] = size
        return ptr

    def map(self, ptr: int, size: int, page: int, capturing: bool) -> bool:
        self.calls.append("map")
        if capturing:
            self.capturing_calls += 1
        assert size > 0 and size % page == 0 and any(
            base <= ptr and ptr + size <= base + n for base, n in self.reserved.items())
        if self.used() + size > self.capacity:
            return False
        for address in range(ptr, ptr + size, page):
            assert address not in self.pages, "page mapped twice"
            self.pages[address] = page
        return True

    def unmap(self, ptr: int, size: int, page: int) -> None:
        self.calls.append("unmap")
        self.synchronize()  # as the driver backend does before unmapping
        for address in range(ptr, ptr + size, page):
            del self.pages[address]

    def unreserve(self, ptr: int, size: int) -> None:
        self.calls.append("unreserve")
        assert self.reserved.pop(ptr) == size
        assert not any(ptr <= p < ptr + size for p in self.pages), "unreserved mapped pages"

    def mem_get_info(self) -> tuple[int, int]:
        return self.capacity - self.used(), self.capacity

    def launch(self, stream: int) -> None:
        self.queued[stream] = self.queued.get(stream, 0) + 1

    def complete(self, stream: int) -> None:
        self.done[stream] = self.queued.get(stream, 0)

    def event_create(self) -> list:
        self.events_created += 1
        return [0, 0]

    def event_record(self, event: list, stream: int) -> None:
        if stream in self.destroyed:
            raise Segfault(f"cuEventRecord on destroyed stream {stream}")
        self.calls.append("event_record")
        event[0], event[1] = stream, self.queued.get(stream, 0)

    def event_query(self, event: list) -> bool:
        self.calls.append("event_query")
        return self.done.get(event[0], 0) >= event[1]

    def event_synchronize(self, event: list) -> None:
        self.calls.append("event_synchronize")
        self.done[event[0]] = max(self.done.get(event[0], 0), event[1])

    def event_destroy(self, event: list) -> None:
        pass

    def synchronize(self) -> None:
        self.calls.append("synchronize")
        self.done.update(self.queued)

    def may_record_events(self) -> bool:
        return self.recording_allowed

    def capture_id(self, stream: int) -> int | None:
        self.calls.append("capture_id")
        return self.capture_ids.get(stream)

    def oom_error(self, message: str) -> BaseException:
        return MemoryError(message)


class _Block:
    def __init__(self, ptr: int, size: int, stream: int, small: bool) -> None:
        self.ptr, self.size, self.stream, self.small = ptr, size, stream, small
        self.requested = 0
        self.allocated = False
        self.pending = False
        self.segment = ptr  # base address of the segment
        self.expandable = False  # part of an expandable segment (based at ``segment``)
        self.mapped = True


class NaiveTorchModel:
    """torch's policy, written as plainly as possible (slow, obviously right)."""

    def __init__(self, backend: FakeBackend, config: AllocatorConfig = AllocatorConfig()) -> None:
        self.backend = backend
        self.config = config
        self.blocks: list[_Block] = []  # every block of every segment
        self.segment_sizes: dict[int, int] = {}
        self.stats = {(f, p): ms.Stat() for f in ms.POOL_FAMILIES for p in ms.POOL_TYPES}
        self.oversize = {f: ms.Stat() for f in ("oversize_allocations", "oversize_segments")}
        self.counters = dict.fromkeys(("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                                       "num_device_alloc", "num_device_free"), 0)
        self.uses: dict[int, set[Any]] = {}  # ptr of allocated block -> other streams
        # (a use on a stream destroyed since is (stream, work count when it was destroyed))
        self.retired: dict[int, int] = {}  # destroyed stream -> its work count then
        self.unrecorded: list[tuple[_Block, set[int]]] = []  # events wait for a safe point
        self.events: dict[int, list[tuple[int, _Block]]] = {}  # stream -> (work count, block)
        self.event_count: dict[int, int] = {}  # id(block) -> outstanding events
        self.pages: dict[int, tuple[int, int]] = {}  # expandable segment -> (page, size)

    # -- statistics
    def _change(self, small: bool, family: str, amount: int) -> None:
        for pool in ("all", "small_pool" if small else "large_pool"):
            stat = self.stats[(family, pool)]
            if amount > 0:
                stat.increase(amount)
            elif amount < 0:
                stat.decrease(-amount)

    def nested(self) -> dict[str, Any]:
        max_split = -1 if self.config.max_split_size == UNLIMITED else self.config.max_split_size
        out: dict[str, Any] = dict(self.counters, max_split_size=max_split)
        for f in ms.POOL_FAMILIES:
            out[f] = {p: self.stats[(f, p)].as_dict() for p in ms.POOL_TYPES}
        for f, stat in self.oversize.items():
            out[f] = stat.as_dict()
        return out

    # -- structure helpers
    def _segment(self, base: int) -> list[_Block]:
        return sorted((b for b in self.blocks if b.segment == base), key=lambda b: b.ptr)

    def _is_split(self, block: _Block) -> bool:
        return len(self._segment(block.segment)) > 1

    def _free_list(self, small: bool, stream: int) -> list[_Block]:
        free = [b for b in self.blocks if not b.allocated and not b.pending and b.mapped
                and b.small == small and b.stream == stream]
        return sorted(free, key=lambda b: (b.size, b.ptr))

    def _neighbour(self, block: _Block, step: int) -> _Block | None:
        seg = self._segment(block.segment)
        i = seg.index(block) + step
        return seg[i] if 0 <= i < len(seg) else None

    def _room(self, block: _Block) -> int:
        after = self._neighbour(block, 1)
        return block.size + (after.size if after is not None and not after.mapped else 0)

    def _pick(self, fits: list[_Block]) -> _Block | None:
        """torch's get_free_block among the blocks that fit, expandable ones included."""
        if not fits[0].expandable:
            return fits[0]
        if not self.config.expandable:
            return next((b for b in fits if not b.expandable), None)
        i = 0
        while fits[i].expandable and i + 1 < len(fits) and \
                self._room(fits[i + 1]) < self._room(fits[i]):
            i += 1
        return fits[i]

    def _round(self, size: int) -> int:
        if size < 512:
            return 512
        d = divisions_for(self.config, size)
        if d > 1 and size > 512 * d:
            return roundup_power2_next_division(size, d)
        return (size + 511) // 512 * 512

    # -- operations
    def malloc(self, size: int, stream: int) -> int:
        if size == 0:
            return 0
        self.process_events()
        if stream in self.retired:  # a new stream with a dead one's handle: wait for it
            count = self.retired.pop(stream)
            self.backend.done[stream] = max(self.backend.done.get(stream, 0), count)
        rsize = self._round(size)
        small = rsize <= MiB
        max_split = self.config.max_split_size
        block = None
        fits = [b for b in self._free_list(small, stream) if b.size >= rsize]
        cand = self._pick(fits) if fits else None
        if cand is not None:
            rounding = self.config.max_non_split_rounding_size
            ok = not (rsize < max_split and cand.size >= max_split)
            ok = ok and not (rsize >= max_split and cand.size >= rsize + rounding)
            block = cand if ok else None
        if block is None:
            if small:
                alloc = 2 * MiB
            else:
                alloc = 20 * MiB if rsize < 10 * MiB else -(-rsize // (2 * MiB)) * 2 * MiB
            if self.config.expandable:
                alloc = rsize  # grow an expandable segment by that much instead
            block = self._alloc_segment(alloc, stream, small, retry=False)
            if block is None and self._release_available(small, stream, rsize):
                block = self._alloc_segment(alloc, stream, small, retry=False)
            if block is None:
                self.empty_cache()
                block = self._alloc_segment(alloc, stream, small, retry=True)
            if block is None:
                self.counters["num_ooms"] += 1
                raise MemoryError("out of memory")
        remaining = block.size - rsize
        if small or self.config.expandable:
            split = remaining >= 512
        else:
            split = remaining > MiB and rsize < max_split
        was_split = self._is_split(block)
        if block.expandable:
            pass  # inactive_split leaves expandable segments out
        elif split:
            rest = _Block(block.ptr + rsize, remaining, stream, small)
            rest.segment = block.segment
            self.blocks.append(rest)
            block.size = rsize
            if was_split:
                self._change(small, "inactive_split_bytes", -rsize)
            else:
                self._change(small, "inactive_split_bytes", remaining)
                self._change(small, "inactive_split", 1)
        elif was_split:
            self._change(small, "inactive_split_bytes", -block.size)
            self._change(small, "inactive_split", -1)
        if block.expandable and split:
            rest = _Block(block.ptr + rsize, remaining, stream, small)
            rest.segment, rest.expandable = block.segment, True
            self.blocks.append(rest)
            block.size = rsize
        block.allocated = True
        block.requested = size
        for f, v in (("allocation", 1), ("allocated_bytes", block.size), ("active", 1),
                     ("active_bytes", block.size), ("requested_bytes", size)):
            self._change(small, f, v)
        if block.size >= max_split:
            self.oversize["oversize_allocations"].increase(1)
        return block.ptr

    def _alloc_segment(self, size: int, stream: int, small: bool, retry: bool) -> _Block | None:
        if retry:
            self.counters["num_alloc_retries"] += 1
        if self.config.expandable:
            return self._grow(size, stream, small)
        ptr = self.backend.malloc(size, False)
        if ptr is None:
            return None
        block = _Block(ptr, size, stream, small)
        self.blocks.append(block)
        self.segment_sizes[ptr] = size
        self._change(small, "segment", 1)
        self._change(small, "reserved_bytes", size)
        if size >= self.config.max_split_size:
            self.oversize["oversize_segments"].increase(1)
        self.counters["num_device_alloc"] += 1
        return block

    def _release(self, block: _Block) -> None:
        self.backend.free(block.ptr)
        self.blocks.remove(block)
        del self.segment_sizes[block.ptr]
        self._change(block.small, "segment", -1)
        self._change(block.small, "reserved_bytes", -block.size)
        if block.size >= self.config.max_split_size:
            self.oversize["oversize_segments"].decrease(1)
        self.counters["num_device_free"] += 1

    def _release_available(self, small: bool, stream: int, rsize: int) -> bool:
        max_split = self.config.max_split_size
        if max_split == UNLIMITED:
            return False
        free = [b for b in self._free_list(small, stream) if not b.expandable]
        key = max(rsize, max_split)
        fits = [b for b in free if b.size >= key]
        if fits:
            self._release(fits[0])
            return True
        released = 0
        for b in reversed(free):
            if released >= key or b.size < max_split:
                break
            released += b.size
            self._release(b)
        return released >= key

    def free(self, ptr: int) -> None:
        block = next(b for b in self.blocks if b.ptr == ptr and b.allocated)
        block.allocated = False
        self._change(block.small, "allocation", -1)
        self._change(block.small, "allocated_bytes", -block.size)
        if block.size >= self.config.max_split_size:
            self.oversize["oversize_allocations"].decrease(1)
        uses = self.uses.pop(ptr, set())
        if uses:
            block.pending = True
            self.unrecorded.append((block, uses))
            self._record_pending()  # at free time, as torch does
            return
        self._free_block(block)

    def _free_block(self, block: _Block) -> None:
        block.pending = False
        original, requested = block.size, block.requested
        seg = self._segment(block.segment)
        i = seg.index(block)
        net_n = net_b = 0
        for j in (i - 1, i + 1):
            if 0 <= j < len(seg):
                other = seg[j]
                if not other.allocated and not other.pending and other.mapped:
                    block.ptr = min(block.ptr, other.ptr)
                    block.size += other.size
                    self.blocks.remove(other)
                    net_n -= 1
                    net_b -= other.size
        if self._is_split(block):
            net_n += 1
            net_b += block.size
        if block.expandable:
            net_n = net_b = 0
        self._change(block.small, "inactive_split", net_n)
        self._change(block.small, "inactive_split_bytes", net_b)
        self._change(block.small, "active", -1)
        self._change(block.small, "active_bytes", -original)
        self._change(block.small, "requested_bytes", -requested)

    def record_stream(self, ptr: int, stream: int) -> None:
        block = next(b for b in self.blocks if b.ptr == ptr and b.allocated)
        if stream != block.stream:
            self.uses.setdefault(ptr, set()).add(stream)

    def retire_stream(self, stream: int) -> None:
        """The stream is about to be destroyed: uses on it become what it has queued now."""
        count = self.backend.queued.get(stream, 0)
        for uses in self.uses.values():
            if stream in uses:
                uses.discard(stream)
                uses.add((stream, count))
        self.retired[stream] = count

    def _record_pending(self) -> None:
        for block, uses in self.unrecorded:
            for use in uses:
                if isinstance(use, tuple):
                    stream, work = use
                else:
                    stream, work = use, self.backend.queued.get(use, 0)
                self.events.setdefault(stream, []).append((work, block))
            self.event_count[id(block)] = len(uses)
        self.unrecorded = []

    def _event_done(self, block: _Block) -> None:
        self.event_count[id(block)] -= 1
        if self.event_count[id(block)] == 0:
            del self.event_count[id(block)]
            self._free_block(block)

    def process_events(self) -> None:
        self._record_pending()
        for stream in list(self.events):
            queue = self.events[stream]
            while queue and self.backend.done.get(stream, 0) >= queue[0][0]:
                self._event_done(queue.pop(0)[1])
            if not queue:
                del self.events[stream]
        for stream, count in list(self.retired.items()):
            if self.backend.done.get(stream, 0) >= count:
                del self.retired[stream]

    def empty_cache(self) -> None:
        self.counters["num_sync_all_streams"] += 1
        self._record_pending()
        for stream, queue in self.events.items():
            for count, block in queue:
                self.backend.done[stream] = max(self.backend.done.get(stream, 0), count)
                self._event_done(block)
        self.events.clear()
        for block in list(self.blocks):
            alone = len(self._segment(block.segment)) == 1
            if not block.allocated and not block.pending and alone and not block.expandable:
                self._release(block)
        for block in list(self.blocks):
            if block.expandable and block.mapped and not block.allocated and not block.pending:
                self._unmap(block)

    # -- expandable segments, torch's way
    def _allocatable(self, block: _Block | None) -> bool:
        return block is not None and not block.allocated and not block.pending

    def _grow(self, rsize: int, stream: int, small: bool) -> _Block | None:
        """torch's try_allocate_expandable_block: a free block of >= rsize, out of the free
        list (here: the caller uses it at once)."""
        unmapped = sorted((b for b in self.blocks if not b.mapped and b.small == small
                           and b.stream == stream), key=lambda b: b.ptr)
        cand = None
        for block in unmapped:
            before = self._neighbour(block, -1)
            start = before if self._allocatable(before) else block
            room, probe = 0, start
            while probe is not None and room < rsize and self._allocatable(probe):
                room += probe.size
                probe = self._neighbour(probe, 1)
            if room >= rsize:
                cand = start
                break
        if cand is None:
            page = 2 * MiB if small else 20 * MiB
            total = self.backend.capacity
            size = -(-(total + total // 8) // page) * page
            base = self.backend.reserve(size)
            cand = _Block(base, size, stream, small)
            cand.expandable, cand.mapped = True, False
            self.blocks.append(cand)
            self.pages[base] = (page, size)
        if not cand.mapped:
            cand = self._map(cand, min(cand.size, rsize))
        while cand is not None and cand.size < rsize:
            after = self._neighbour(cand, 1)
            cand = self._map(after, min(rsize - cand.size, after.size))
        return cand

    def _merge(self, block: _Block) -> _Block:
        """Merge the neighbours in block's state into it (free with free, unmapped with
        unmapped)."""
        for step in (-1, 1):
            other = self._neighbour(block, step)
            if other is not None and other.mapped == block.mapped and \
                    (not block.mapped or self._allocatable(other)):
                block.ptr = min(block.ptr, other.ptr)
                block.size += other.size
                self.blocks.remove(other)
        return block

    def _map(self, block: _Block, size: int) -> _Block | None:
        page = self.pages[block.segment][0]
        length = -(-size // page) * page
        if not self.backend.map(block.ptr, length, page, False):
            return None
        if length < block.size:
            rest = _Block(block.ptr + length, block.size - length, block.stream, block.small)
            rest.segment, rest.expandable, rest.mapped = block.segment, True, False
            self.blocks.append(rest)
            block.size = length
        block.mapped = True
        self._change(block.small, "reserved_bytes", length)
        self.counters["num_device_alloc"] += 1
        return self._merge(block)

    def _unmap(self, block: _Block) -> None:
        """torch's unmap_block (+ release_expandable_segment when nothing is left)."""
        page, total = self.pages[block.segment]
        first = -(-(block.ptr - block.segment) // page)
        end = (block.ptr + block.size - block.segment) // page
        if first >= end:
            return
        start, length = block.segment + first * page, (end - first) * page
        self.backend.unmap(start, length, page)
        for ptr, size in ((block.ptr, start - block.ptr),
                          (start + length, block.ptr + block.size - start - length)):
            if size:
                piece = _Block(ptr, size, block.stream, block.small)
                piece.segment, piece.expandable = block.segment, True
                self.blocks.append(piece)
        block.ptr, block.size, block.mapped = start, length, False
        self._merge(block)
        self._change(block.small, "reserved_bytes", -length)
        self.counters["num_device_free"] += 1
        if block.size == total:
            self.backend.unreserve(block.segment, total)
            self.blocks.remove(block)
            del self.pages[block.segment]

    def reset_peak_stats(self) -> None:
        for stat in [*self.stats.values(), *self.oversize.values()]:
            stat.reset_peak()

    def reset_accumulated_stats(self) -> None:
        for stat in [*self.stats.values(), *self.oversize.values()]:
            stat.reset_accumulated()
        self.counters = dict.fromkeys(self.counters, 0)
