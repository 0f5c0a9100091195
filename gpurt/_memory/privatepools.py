"""Private pools of the caching allocator: those of CUDA graphs (allocations of a capture go
to the graph's pool) and those of MemPools (allocations of a thread inside use_mem_pool go to
the pool). The routes themselves are :class:`~gpurt._memory.segments.CaptureRoute`; this is
the part of :class:`~gpurt._memory.allocator.CachingAllocator` that opens, closes and counts
them, under the allocator's lock.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from .._core.captures import CAPTURES
from .blocks import Block
from .segments import CaptureRoute
from .streamuses import StreamUses

__all__: list[str] = []


class PrivatePools(StreamUses):
    """Graph and MemPool routing (see the module docstring). The lock, the queues and the
    parked block belong to CachingAllocator."""

    _lock: threading.Lock
    _hot: Block | None
    _queued: collections.deque[int]
    _queued_releases: collections.deque[Any]
    _work: bool

    def _unpark(self) -> None:
        raise NotImplementedError  # CachingAllocator

    def _drain_queue(self) -> None:
        raise NotImplementedError  # CachingAllocator

    def begin_allocate_to_pool(self, pool_id: Any, stream: int) -> None:
        """Route allocations of the capture on ``stream`` to private pool ``pool_id`` (made
        if new): those on ``stream`` and, once the capture has begun, on every stream that
        joined it (torch's beginAllocateToPool with its capture-id filter)."""
        with self._lock:
            if self._capturing_to(pool_id):
                raise RuntimeError(f"already allocating to private pool {pool_id!r}")
            if self._hot is not None:
                self._unpark()
            capture_id = self.backend.capture_id(stream)
            self._private_pool(pool_id)
            self._captures.append(CaptureRoute(pool_id, stream, capture_id))
            CAPTURES.add(1)

    def end_allocate_to_pool(self, pool_id: Any) -> None:
        with self._lock:
            for i, route in enumerate(self._captures):
                if route.pool_id == pool_id and route.thread is None:
                    del self._captures[i]
                    CAPTURES.add(-1)
                    self._work = True
                    return
            raise RuntimeError(f"not allocating to private pool {pool_id!r}")

    def begin_thread_pool(self, pool_id: Any) -> None:
        """Until :meth:`end_thread_pool`, this thread's allocations (outside captures) come
        from private pool ``pool_id``, which must exist (gpurt.use_mem_pool). Nests."""
        with self._lock:
            if pool_id not in self._private:
                raise RuntimeError(f"private pool {pool_id!r} does not exist on device "
                                   f"{self.device}")
            if self._hot is not None:
                self._unpark()
            self._captures.append(CaptureRoute(pool_id, 0, None, threading.get_ident()))

    def end_thread_pool(self, pool_id: Any) -> None:
        thread = threading.get_ident()
        with self._lock:
            for i in range(len(self._captures) - 1, -1, -1):
                route = self._captures[i]
                if route.pool_id == pool_id and route.thread == thread:
                    del self._captures[i]
                    return
            raise RuntimeError(f"this thread is not allocating to private pool {pool_id!r}")

    def retain_pool(self, pool_id: Any, backend: Any = None) -> None:
        """One more reference to private pool ``pool_id`` (made if new; its segments come
        from ``backend`` when given, a MemPool's pluggable allocator)."""
        with self._lock:
            private = self._private_pool(pool_id)
            private.use_count += 1
            if backend is not None:
                private.backend = backend

    def release_pool(self, pool_id: Any) -> None:
        """One reference less. At zero, the pool's cached segments are freed by the next
        empty_cache (or an out-of-memory retry), as torch does; blocks still allocated
        return to the pool when freed and are released the same way. Safe from finalizers
        (queued like a free when the lock is busy)."""
        if not self._lock.acquire(False):
            self._queued_releases.append(pool_id)
            self._queued.append(0)  # makes the next call drain the queues
            self._work = True
            return
        try:
            self._release_pool(pool_id)
        finally:
            if self._queued:
                self._drain_queue()
            self._lock.release()

    def _release_pool(self, pool_id: Any) -> None:
        private = self._private.get(pool_id)
        if private is None or private.use_count <= 0:
            raise RuntimeError(f"release_pool: private pool {pool_id!r} is not retained")
        private.use_count -= 1
        if private.use_count == 0 and private.segments == 0 and not self._capturing_to(pool_id):
            del self._private[pool_id]

    def pool_use_count(self, pool_id: Any) -> int:
        """References to private pool ``pool_id`` (0 when it does not exist)."""
        private = self._private.get(pool_id)
        return 0 if private is None else private.use_count

    def captures_underway(self) -> bool:
        return any(route.thread is None for route in self._captures)
