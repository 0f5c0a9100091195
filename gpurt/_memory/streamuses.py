"""Blocks used on other streams (``record_stream``) and the events that guard them: the
part of the caching allocator that talks to streams (torch's insert_events/process_events).

A freed block with stream uses is *pending*: an event is recorded on every stream that used
it, and the block returns to its pool once all of them have completed. Recording happens at
free time where that is safe, else at the next allocation; queries happen at allocations.

Streams are destroyed while blocks still remember them, and the driver does not report an
event recorded on a destroyed stream: the process crashes. So :meth:`StreamUses._retire_uses`
runs before gpurt destroys a stream (through CachingAllocator.retire_stream): it records
the events those blocks need now and keeps them as :class:`~gpurt._memory.blocks.RetiredUse`
entries, and records one more event after the stream's last work, which a new stream that
gets the same handle from the driver waits for before blocks cached for the old one serve it.
"""

from __future__ import annotations

import collections
from typing import Any, cast

from .._core.captures import CAPTURES
from .blocks import Block, RetiredUse
from .expandable import ExpandableSegments

__all__: list[str] = []


class StreamUses(ExpandableSegments):
    """Events for cross-stream uses of blocks. Methods expect the caller to hold the
    allocator's lock and to have materialized any parked block (see CachingAllocator)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # stream -> (event, block)
        self._events: dict[int, collections.deque[tuple[Any, Block]]] = {}
        self._event_pool: list[Any] = []
        self._needs_events: list[Block] = []  # freed with stream uses, events not recorded yet
        self._retired: dict[int, Any] = {}  # destroyed stream -> event after its last work

    def _free_block(self, block: Block) -> None:
        """Return a block to its pool (CachingAllocator's, with merging and statistics)."""
        raise NotImplementedError

    def _record_at_free(self, block: Block) -> bool:
        """Record the events of a freed block's stream uses now, where that is safe; False
        when they must wait for the next allocation (a capture is underway, this is the
        driver's callback thread, another device's context is current, or the driver
        failed: a free, often run by a finalizer, never raises for that)."""
        if CAPTURES.count:
            return False
        try:
            if not self.backend.may_record_events():
                return False
            self._record_uses(block)
        except Exception:
            return not block.stream_uses  # the uses not recorded yet wait for the next call
        return True

    def _insert_events(self) -> None:
        blocks, self._needs_events = self._needs_events, []
        for i, block in enumerate(blocks):
            try:
                self._record_uses(block)
            except BaseException:
                self._needs_events[:0] = blocks[i:] if block.stream_uses else blocks[i + 1:]
                raise

    def _record_uses(self, block: Block) -> None:
        """torch's insert_events: an event on every stream that used ``block`` (a retired
        stream's was recorded before it was destroyed); the block goes back to its pool
        when all of them have completed. On an error the uses not yet recorded stay."""
        uses = list(block.stream_uses or ())
        block.stream_uses = None
        for i, use in enumerate(uses):
            if type(use) is RetiredUse:
                stream, event = use.stream, use.event
            else:
                stream = cast(int, use)
                try:
                    event = self._record_now(stream)
                except BaseException:
                    block.stream_uses = set(uses[i:])
                    raise
                if event is None:
                    continue
            block.event_count += 1
            self._events.setdefault(stream, collections.deque()).append((event, block))
        if block.event_count == 0:
            self._free_block(block)

    def _record_now(self, stream: int) -> Any | None:
        """An event recorded on ``stream`` now, or None when the driver refused to record
        there (a stream from outside gpurt that its owner destroyed, say) and the device was
        synchronized instead, so that every use has finished."""
        event = self._event_pool.pop() if self._event_pool else self.backend.event_create()
        try:
            self.backend.event_record(event, stream)
        except Exception:
            self._event_pool.append(event)
            self.backend.synchronize()
            return None
        return event

    def _outlive_retired(self, stream: int) -> None:
        """Before a block cached for ``stream`` serves it again: ``stream`` is a new stream
        with the handle of a destroyed one, which must have finished first."""
        event = self._retired.pop(stream)
        if not self.backend.event_query(event):
            self.backend.event_synchronize(event)
        self._event_pool.append(event)

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
        for stream, event in list(self._retired.items()):
            if self.backend.event_query(event):
                del self._retired[stream]
                self._event_pool.append(event)

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

    def _retire_uses(self, stream: int, users: list[Block], own_device: bool) -> bool:
        """Finish with ``stream`` before it is destroyed. ``users``: allocated blocks used on
        it; pending blocks whose events wait to be recorded are found here. Each gets an event
        recorded on ``stream`` now in place of the use; when ``stream`` belongs to this
        device, one more event guards the blocks cached for it. False during a capture (no
        event may be recorded then): the caller keeps the stream and asks again later."""
        users = users + [b for b in self._needs_events if b.stream_uses and stream in b.stream_uses]
        if not users and not own_device:
            return True
        if CAPTURES.count:
            return False
        for block in users:
            if block.stream_uses is None:  # (users are blocks used on ``stream``)
                continue
            block.stream_uses.discard(stream)
            event = self._record_now(stream)
            if event is not None:  # else the device was synchronized: the use is over
                block.stream_uses.add(RetiredUse(self.device, stream, event))
        if own_device:
            event = self._record_now(stream)
            if event is not None:
                earlier = self._retired.pop(stream, None)
                if earlier is not None:
                    self._event_pool.append(earlier)
                self._retired[stream] = event
        return True

    def _pending_blocks(self) -> list[Block]:
        """Blocks freed but still in use on other streams."""
        blocks = list(self._needs_events)
        seen = {id(b) for b in blocks}
        for queue in self._events.values():
            for _, block in queue:
                if id(block) not in seen:
                    seen.add(id(block))
                    blocks.append(block)
        return blocks
