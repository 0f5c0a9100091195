"""A caching allocator for pinned (page-locked) host memory, for fast asynchronous copies.

Like torch's CachingHostAllocator: sizes round up to a power of two and each size has a free
list; a new block is a cuMemHostAlloc of that size; a freed block used by streams
(``host_record_stream``) is reused only after events recorded on them complete; nothing is
split. Statistics use torch's host_memory_stats keys. Frees never call the driver (they are
safe from finalizers): events for stream uses are recorded at the next allocation (none
while a graph capture is underway), or, for a stream gpurt is about to destroy, at once.
"""

from __future__ import annotations

import collections
import ctypes
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from cuda.bindings import driver as cu

from .._core.captures import CAPTURES
from .._core.driver import check
from .._core.fork import renew_after_fork
from ..device import bind_context, current_device
from ..streams import as_stream_handle
from . import stats as ms
from .blocks import RetiredUse
from .driver import event_query
from .protocol import retire

__all__ = [
    "pinned_empty",
    "pin_memory",
    "is_pinned",
    "caching_host_allocator_alloc",
    "caching_host_allocator_delete",
    "host_record_stream",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "reset_peak_host_memory_stats",
    "reset_accumulated_host_memory_stats",
    "host_empty_cache",
]

_PORTABLE = 1  # CU_MEMHOSTALLOC_PORTABLE: usable from every context
_NO_TIMING = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)


class _HostBlock:
    __slots__ = ("ptr", "size", "allocated", "event_count", "streams")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr = ptr
        self.size = size
        self.allocated = True
        self.event_count = 0
        self.streams: set[tuple[int, int] | RetiredUse] | None = None  # (device, stream)


class PinnedAllocator:
    """The process's pinned host memory cache (one for all devices); an Allocator
    (gpurt/_memory/protocol.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, _HostBlock] = {}
        self._free: dict[int, list[_HostBlock]] = collections.defaultdict(list)
        self._needs_events: list[_HostBlock] = []
        self._events: collections.deque[tuple[Any, _HostBlock]] = collections.deque()
        self._queued: collections.deque[int] = collections.deque()
        self.allocations = ms.Stat()
        self.allocated_bytes = ms.Stat()
        self.active_requests = ms.Stat()
        self.active_bytes = ms.Stat()
        self.alloc_time = ms.DurationStat()
        self.free_time = ms.DurationStat()

    def malloc(self, size: int) -> int:
        """Pinned memory of at least ``size`` bytes (wraps cuMemHostAlloc on a miss)."""
        if size <= 0:
            if size == 0:
                return 0
            raise ValueError(f"cannot allocate a negative number of bytes ({size})")
        rounded = 1 << (size - 1).bit_length()
        with self._lock:
            self._drain_queue()
            self._process_events()
            free = self._free.get(rounded)
            if free:
                block = free.pop()
                block.allocated = True
            else:
                bind_context(current_device())
                start = time.perf_counter_ns()
                ptr = int(check(cu.cuMemHostAlloc(rounded, _PORTABLE), "cuMemHostAlloc"))
                self.alloc_time.add((time.perf_counter_ns() - start) // 1000)
                block = self._blocks[ptr] = _HostBlock(ptr, rounded)
                self.allocations.increase(1)
                self.allocated_bytes.increase(rounded)
            self.active_requests.increase(1)
            self.active_bytes.increase(rounded)
            return block.ptr

    def free(self, ptr: int) -> None:
        """Give a block back; never calls the driver, queues when the lock is busy."""
        if not ptr:
            return
        if not self._lock.acquire(False):
            self._queued.append(ptr)
            return
        try:
            self._free_locked(ptr)
            self._drain_queue()
        finally:
            self._lock.release()

    def _drain_queue(self) -> None:
        while self._queued:
            try:
                self._free_locked(self._queued.popleft())
            except ValueError:
                pass

    def _free_locked(self, ptr: int) -> None:
        block = self._blocks.get(ptr)
        if block is None or not block.allocated:
            raise ValueError(f"0x{ptr:x} is not a live pinned allocation of gpurt")
        block.allocated = False
        if block.streams:
            self._needs_events.append(block)
        else:
            self._release(block)

    def _release(self, block: _HostBlock) -> None:
        self._free[block.size].append(block)
        self.active_requests.decrease(1)
        self.active_bytes.decrease(block.size)

    def record_stream(self, ptr: int, stream: int, device: int) -> bool:
        """Note a use of the block holding ``ptr`` on ``stream``; False if not ours."""
        with self._lock:
            block = self.block_of(ptr)
            if block is None:
                return False
            if block.streams is None:
                block.streams = set()
            block.streams.add((device, stream))
            return True

    def block_of(self, ptr: int) -> _HostBlock | None:
        block = self._blocks.get(ptr)
        if block is not None:
            return block
        for block in self._blocks.values():
            if block.ptr <= ptr < block.ptr + block.size:
                return block
        return None

    def retire_stream(self, device: int, stream: int) -> bool:
        """Before gpurt destroys ``stream``: record the events of the blocks used on it now
        (see gpurt/_memory/streamuses.py). False when that must wait (see
        gpurt/_memory/protocol.py's retire)."""
        use = (device, stream)

        def users() -> list[_HostBlock]:
            return [b for b in self._blocks.values() if b.streams and use in b.streams]

        def record(blocks: Sequence[_HostBlock]) -> None:
            for block in blocks:
                assert block.streams is not None
                block.streams.discard(use)
                block.streams.add(RetiredUse(device, stream, self._record(device, stream)))
            bind_context(current_device())

        return retire(self._lock, users, record)

    @staticmethod
    def _record(device: int, stream: int) -> Any:
        bind_context(device)
        event = check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate")
        check(cu.cuEventRecord(event, stream), "cuEventRecord")
        return event

    def _process_events(self) -> None:
        """Record the events of freed blocks' stream uses; release the blocks whose events
        have completed. Waits while a graph capture is underway."""
        if CAPTURES.count:
            return
        for block in self._needs_events:
            for use in block.streams or ():
                event = use.event if type(use) is RetiredUse else self._record(*cast(Any, use))
                block.event_count += 1
                self._events.append((event, block))
            block.streams = None
            if block.event_count == 0:
                self._release(block)
        if self._needs_events:
            bind_context(current_device())
        self._needs_events = []
        pending: collections.deque[tuple[Any, _HostBlock]] = collections.deque()
        while self._events:
            event, block = self._events.popleft()
            if not event_query(event):
                pending.append((event, block))
                continue
            check(cu.cuEventDestroy(event), "cuEventDestroy")
            block.event_count -= 1
            if block.event_count == 0:
                self._release(block)
        self._events = pending

    def empty_cache(self) -> None:
        """Free every cached pinned block (wraps cuMemFreeHost); nothing while a graph
        capture is underway (cuMemFreeHost synchronizes)."""
        with self._lock:
            if CAPTURES.count:
                return
            self._drain_queue()
            self._process_events()
            for blocks in self._free.values():
                for block in blocks:
                    start = time.perf_counter_ns()
                    check(cu.cuMemFreeHost(block.ptr), "cuMemFreeHost")
                    self.free_time.add((time.perf_counter_ns() - start) // 1000)
                    del self._blocks[block.ptr]
                    self.allocations.decrease(1)
                    self.allocated_bytes.decrease(block.size)
            self._free.clear()

    def nested_stats(self) -> dict[str, Any]:
        with self._lock:
            self._drain_queue()
            return {
                "num_host_alloc": self.allocations.allocated,
                "num_host_free": self.allocations.freed,
                "allocations": self.allocations.as_dict(),
                "allocated_bytes": self.allocated_bytes.as_dict(),
                "active_requests": self.active_requests.as_dict(),
                "active_bytes": self.active_bytes.as_dict(),
                "host_alloc_time": self.alloc_time.as_dict(),
                "host_free_time": self.free_time.as_dict(),
            }

    def reset_peak(self) -> None:
        with self._lock:
            for stat in (self.allocations, self.allocated_bytes, self.active_requests,
                         self.active_bytes, self.alloc_time, self.free_time):
                stat.reset_peak()

    def reset_accumulated(self) -> None:
        with self._lock:
            for stat in (self.allocations, self.allocated_bytes, self.active_requests,
                         self.active_bytes, self.alloc_time, self.free_time):
                stat.reset_accumulated()


_host = PinnedAllocator()
renew_after_fork(_host, _lock=threading.Lock)


def host_allocator() -> PinnedAllocator:
    """The process's pinned host memory allocator."""
    return _host


def retire_stream(device: int, stream: int) -> bool:
    """gpurt.memory's stream-destroy hook for pinned memory (see PinnedAllocator)."""
    return _host.retire_stream(device, stream)


def caching_host_allocator_alloc(size: int) -> int:
    """Pinned host memory from gpurt's cache: an int address (0 for size 0)."""
    return _host.malloc(int(size))


def caching_host_allocator_delete(ptr: int) -> None:
    """Return pinned memory from :func:`caching_host_allocator_alloc` to the cache."""
    _host.free(int(ptr))


def pinned_empty(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised numpy array in pinned memory from gpurt's cache (freed when the
    array and all its views are gone)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    ptr = _host.malloc(nbytes)
    buffer = (ctypes.c_char * nbytes).from_address(ptr)
    weakref.finalize(buffer, _host.free, ptr)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def pin_memory(array: Any) -> np.ndarray:
    """A copy of ``array`` in pinned memory (like torch's Tensor.pin_memory())."""
    source = np.asarray(array)
    out = pinned_empty(source.shape, source.dtype)
    out[...] = source
    return out


def _host_pointer(obj: Any) -> int:
    if isinstance(obj, int):
        return obj
    return int(np.asarray(obj).__array_interface__["data"][0])


def is_pinned(obj: Any) -> bool:
    """True when ``obj`` (a numpy array or an address) is in page-locked host memory."""
    ptr = _host_pointer(obj)
    with _host._lock:
        if _host.block_of(ptr) is not None:
            return True
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    try:
        result = cu.cuPointerGetAttribute(attr, ptr)
    except Exception:  # no driver
        return False
    return int(result[0]) == 0 and int(result[1]) == int(cu.CUmemorytype.CU_MEMORYTYPE_HOST)


def host_record_stream(obj: Any, stream: Any) -> None:
    """Keep the pinned block holding ``obj`` from reuse until the work now queued on
    ``stream`` (a gpurt Stream, or a raw handle or foreign stream of the current device)
    has finished."""
    handle = as_stream_handle(stream)
    device = int(getattr(stream, "device_index", current_device()))
    if not _host.record_stream(_host_pointer(obj), handle, device):
        raise ValueError("host_record_stream: not pinned memory from gpurt's host allocator")


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """torch.cuda.host_memory_stats_as_nested_dict for gpurt's pinned allocator."""
    return _host.nested_stats()


def host_memory_stats() -> dict[str, Any]:
    """Pinned allocator statistics with torch's keys ('allocated_bytes.current', ...)."""
    return ms.flatten(_host.nested_stats())


def reset_peak_host_memory_stats() -> None:
    _host.reset_peak()


def reset_accumulated_host_memory_stats() -> None:
    _host.reset_accumulated()


def host_empty_cache() -> None:
    """Give all cached, unused pinned memory back to the driver."""
    _host.empty_cache()
