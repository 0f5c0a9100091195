"""The ``backend:cudaMallocAsync`` allocator: device memory from CUDA's stream-ordered pool
(cuMemAllocAsync/cuMemFreeAsync), a peer of the caching allocator. Every driver result goes
through :func:`gpurt._core.driver.check` (see gpurt/_memory/driver.py).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

from cuda.bindings import driver as cu

from .._core import syncdebug
from .._core.captures import CAPTURES
from .._core.driver import check
from ..device import bind_context
from . import stats as ms
from .blocks import RetiredUse
from .driver import _NO_TIMING, _OOM, out_of_memory_error
from .history import DeviceTrace, HistorySettings, capture_frames, frames_json
from .protocol import retire

__all__ = ["AsyncAllocator"]


class AsyncAllocator:
    """A DeviceAllocator (gpurt/_memory/protocol.py) for ``backend:cudaMallocAsync``:
    allocations from the device's default memory pool with
    cuMemAllocAsync/cuMemFreeAsync, which caches freed memory itself.

    Statistics are honest rather than complete, as in torch: counts and bytes of live
    allocations are exact (kept here), reserved bytes are the pool's own figures
    (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT/HIGH); segment and split statistics stay 0.
    Frees are queued and issued at the next allocation or flush (never from the caller of
    free, which may be a finalizer); a block used on other streams makes its stream wait on
    events recorded on them before cuMemFreeAsync."""

    def __init__(self, index: int, history: HistorySettings) -> None:
        self.device = index
        bind_context(index)
        dev = check(cu.cuDeviceGet(index), "cuDeviceGet")
        self._pool = check(cu.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool")
        threshold = cu.cuuint64_t((1 << 64) - 1)  # keep freed memory cached in the pool
        check(cu.cuMemPoolSetAttribute(
            self._pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold),
            "cuMemPoolSetAttribute")
        self._lock = threading.Lock()
        self._live: dict[int, list[Any]] = {}  # ptr -> [size, stream, requested, uses, frames]
        self._queued: collections.deque[int] = collections.deque()
        self._stats = {name: ms.Stat() for name in
                       ("allocation", "active", "allocated_bytes", "active_bytes",
                        "requested_bytes")}
        self.num_ooms = 0
        self._fraction = 1.0
        self._limit: int | None = None
        self._captures: list[tuple[Any, int]] = []
        self.history = history
        self.trace = DeviceTrace(history.max_entries)

    def malloc(self, size: int, stream: int) -> int:
        if size <= 0:
            if size == 0:
                return 0
            raise ValueError(f"cannot allocate a negative number of bytes ({size})")
        with self._lock:
            self._drain()
            used = self._stats["allocated_bytes"].current
            if self._limit is not None and used + size > self._limit:
                raise self._oom(size, "the per-process memory fraction would be exceeded")
            bind_context(self.device)
            result = cu.cuMemAllocAsync(size, stream)
            if int(result[0]) == _OOM and CAPTURES.count == 0:
                if syncdebug.LEVEL:
                    syncdebug.warn_or_error_on_sync("an allocation retried after cuCtxSynchronize")
                check(cu.cuCtxSynchronize(), "cuCtxSynchronize")  # let pending frees land
                result = cu.cuMemAllocAsync(size, stream)
            if int(result[0]) == _OOM:
                raise self._oom(size, "")
            ptr = int(check(result, "cuMemAllocAsync"))
            frames = capture_frames() if self.history.alloc_frames else None
            self._live[ptr] = [size, stream, size, None, frames]
            for name in self._stats:
                self._stats[name].increase(1 if name in ("allocation", "active") else size)
            if self.history.trace:
                self.trace.record("alloc", ptr, size, stream, frames)
            if self.history.observer is not None:
                self.history.observer.allocated(ptr, size)
            return ptr

    def free(self, ptr: int) -> None:
        if ptr:
            self._queued.append(ptr)

    def _drain(self) -> None:
        """Issue queued frees (caller holds the lock); waits while a capture is underway."""
        if CAPTURES.count:
            return
        while self._queued:
            ptr = self._queued.popleft()
            entry = self._live.pop(ptr, None)
            if entry is None:
                continue
            size, stream, _, uses, frames = entry
            bind_context(self.device)
            for use in uses or ():
                if type(use) is RetiredUse:  # recorded before its stream was destroyed
                    event = use.event
                    check(cu.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")
                else:
                    event = check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate")
                    if int(cu.cuEventRecord(event, use)[0]) == 0:
                        check(cu.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")
                    else:  # a stream from outside gpurt, destroyed: wait for everything
                        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
                check(cu.cuEventDestroy(event), "cuEventDestroy")
            check(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
            for name in self._stats:
                self._stats[name].decrease(1 if name in ("allocation", "active") else size)
            if self.history.observer is not None:
                self.history.observer.freed(ptr, size)
            if self.history.trace:
                self.trace.record("free_requested", ptr, size, stream, frames)
                self.trace.record("free_completed", ptr, size, stream, frames)

    def flush(self) -> None:
        with self._lock:
            self._drain()

    def owns(self, ptr: int) -> bool:
        return ptr in self._live

    def record_stream(self, ptr: int, stream: int) -> None:
        with self._lock:
            entry = self._live.get(ptr) or next(
                (e for p, e in self._live.items() if p <= ptr < p + e[0]), None)
            if entry is None:
                raise ValueError(f"0x{ptr:x} is not inside a live allocation on device "
                                 f"{self.device}")
            if stream != entry[1]:
                entry[3] = (entry[3] or set()) | {stream}

    def retire_stream(self, device: int, stream: int) -> bool:
        """Finish with ``stream`` before gpurt destroys it: for allocations used on it, or
        made on it (their free is ordered on that stream), record an event on it now, which
        the free waits for instead; those made on it are then freed on the legacy default
        stream. False when that must wait (see gpurt/_memory/protocol.py's retire)."""

        def users() -> list[list[Any]]:
            return [e for e in self._live.values() if e[1] == stream or (e[3] and stream in e[3])]

        def record(entries: Sequence[list[Any]]) -> None:
            bind_context(self.device)
            for entry in entries:
                event = check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate")
                check(cu.cuEventRecord(event, stream), "cuEventRecord")
                uses = (entry[3] or set()) - {stream}
                uses.add(RetiredUse(self.device, stream, event))
                entry[3] = uses
                if entry[1] == stream:
                    entry[1] = 0

        return retire(self._lock, users, record)

    def empty_cache(self) -> None:
        """Issue queued frees, synchronize, and trim the pool (wraps cuMemPoolTrimTo)."""
        with self._lock:
            if CAPTURES.count:
                return
            self._drain()
            bind_context(self.device)
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            check(cu.cuMemPoolTrimTo(self._pool, 0), "cuMemPoolTrimTo")
            if self.history.trace:
                self.trace.record("empty_cache", 0, 0, 0, capture_frames())

    def _pool_attribute(self, name: str) -> int:
        attr = getattr(cu.CUmemPool_attribute, name)
        return int(check(cu.cuMemPoolGetAttribute(self._pool, attr), "cuMemPoolGetAttribute"))

    def nested_stats(self) -> dict[str, Any]:
        with self._lock:
            self._drain()
            nested = ms.empty_nested_stats(-1)
            for name, stat in self._stats.items():
                nested[name]["all"] = stat.as_dict()
            reserved = nested["reserved_bytes"]["all"]
            reserved["current"] = self._pool_attribute("CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT")
            reserved["peak"] = self._pool_attribute("CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH")
            nested["num_ooms"] = self.num_ooms
            return nested

    def reset_peak_stats(self) -> None:
        with self._lock:
            for stat in self._stats.values():
                stat.reset_peak()
            zero = cu.cuuint64_t(0)
            for name in ("CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH", "CU_MEMPOOL_ATTR_USED_MEM_HIGH"):
                check(cu.cuMemPoolSetAttribute(self._pool, getattr(cu.CUmemPool_attribute, name),
                                               zero), "cuMemPoolSetAttribute")

    def reset_accumulated_stats(self) -> None:
        with self._lock:
            for stat in self._stats.values():
                stat.reset_accumulated()
            self.num_ooms = 0

    def set_memory_fraction(self, fraction: float) -> None:
        bind_context(self.device)
        _, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        self._fraction = fraction
        self._limit = int(fraction * int(total))

    @property
    def memory_fraction(self) -> float:
        return self._fraction

    def _oom(self, size: int, why: str) -> BaseException:
        self.num_ooms += 1
        bind_context(self.device)
        free, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        fmt = ms.format_size
        used = self._stats["allocated_bytes"].current
        reserved = self._pool_attribute("CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT")
        if self.history.trace:
            self.trace.record("oom", int(free), size, 0, capture_frames())
        message = (
            f"CUDA out of memory. Tried to allocate {fmt(size)} with cuMemAllocAsync"
            f"{' (' + why + ')' if why else ''}. GPU {self.device} has a total capacity of "
            f"{fmt(int(total))} of which {fmt(int(free))} is free. {fmt(used)} is allocated "
            f"by gpurt and {fmt(max(reserved - used, 0))} is reserved by the pool but "
            "unallocated (gpurt.empty_cache() trims it)."
        )
        return out_of_memory_error(message, "cuMemAllocAsync")

    # Graph capture: cuMemAllocAsync is captured as a memory node, so no private pools
    # are needed; only the bookkeeping that says a capture is underway is kept.

    def begin_allocate_to_pool(self, pool_id: Any, stream: int) -> None:
        with self._lock:
            self._captures.append((pool_id, stream))
            CAPTURES.add(1)

    def end_allocate_to_pool(self, pool_id: Any) -> None:
        with self._lock:
            for i, (pid, _) in enumerate(self._captures):
                if pid == pool_id:
                    del self._captures[i]
                    CAPTURES.add(-1)
                    return
            raise RuntimeError(f"not allocating to private pool {pool_id!r}")

    def retain_pool(self, pool_id: Any) -> None:
        pass

    def release_pool(self, pool_id: Any) -> None:
        pass

    def captures_underway(self) -> bool:
        return bool(self._captures)

    def snapshot(self) -> list[dict[str, Any]]:
        """Each live allocation as a one-block segment (the pool's layout is not visible)."""
        with self._lock:
            return [
                {"device": self.device, "address": ptr, "total_size": size,
                 "allocated_size": size, "active_size": size, "requested_size": req,
                 "stream": stream, "segment_type": "large" if size > (1 << 20) else "small",
                 "segment_pool_id": [0, 0], "is_expandable": False, "frames": [],
                 "blocks": [{"address": ptr, "size": size, "requested_size": req,
                             "state": "active_allocated", "frames": frames_json(frames)}]}
                for ptr, (size, stream, req, _, frames) in sorted(self._live.items())
            ]
