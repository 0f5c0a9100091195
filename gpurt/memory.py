"""Device memory: the caching allocator, its statistics and history (torch.cuda's names).

One allocator per device, created on first use from ``GPURT_ALLOC_CONF`` (torch's
PYTORCH_CUDA_ALLOC_CONF keys; see gpurt/_memory/config.py) and ``GPURT_NO_CACHING=1``. The
default backend is gpurt's port of torch's caching allocator (gpurt/_memory/allocator.py), whose
statistics match ``torch.cuda.memory_stats()`` key for key; ``backend:cudaMallocAsync``
uses CUDA's stream-ordered pool instead. Everything here returns zeros/empty before CUDA is
initialised instead of failing. Pinned host memory has its own cache (gpurt/_memory/pinned.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from ._core.driver import is_forked_child, is_initialized
from ._core.fork import at_fork_in_child, renew_after_fork
from ._core.state import THREAD
from ._memory import config as _allocconf
from ._memory import pinned as _pinned
from ._memory import stats as ms
from ._memory.allocator import CachingAllocator
from ._memory.async_pool import AsyncAllocator
from ._memory.driver import DriverBackend
from ._memory.history import HistorySettings
from ._memory.pinned import *  # noqa: F401,F403
from ._memory.pinned import __all__ as _pinned_all
from ._memory.pluggable import CUDAPluggableAllocator, PluggableAllocator, PluggableBackend
from ._memory.protocol import Allocator, DeviceAllocator
from ._memory.summary import summary_table
from ._streams.handles import before_stream_destroy
from .device import _index, current_device, device_count
from .streams import Stream, as_stream_handle

__all__ = [
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "record_stream",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "empty_cache",
    "memory_summary",
    "memory_snapshot",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
    "get_allocator_backend",
    "AllocatorConfigError",
    "MemPool",
    "use_mem_pool",
    "PluggableAllocator",
    "CUDAPluggableAllocator",
    "change_current_allocator",
    "get_current_allocator",
    *_pinned_all,
]

AllocatorConfigError = _allocconf.AllocatorConfigError
PoolId = tuple  # (int, int), like torch's graph_pool_handle()

_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)
_allocators: dict[int, DeviceAllocator] = {}
_only: list[Any] = []  # the free method while exactly one allocator exists (fast path)
_config: _allocconf.AllocatorConfig | None = None
_history = HistorySettings()
_pool_ids = itertools.count(1)
_current_allocator: PluggableAllocator | None = None  # change_current_allocator's


def _forget_allocators_after_fork() -> None:
    """A child forked after CUDA started cannot use the parent's device memory: forget the
    allocators, so that its next allocation goes through _driver.init() and raises the
    clear fork error instead of handing out one of the parent's cached blocks. (Arrays the
    child inherited still return their blocks to the forgotten allocators: bookkeeping
    only.)"""
    if is_forked_child():  # set by the driver's at-fork step, which runs first
        _allocators.clear()
        _only.clear()


at_fork_in_child("allocators", _forget_allocators_after_fork)


def _settings() -> _allocconf.AllocatorConfig:
    global _config
    if _config is None:
        _config = _allocconf.from_environment()
    return _config


def _create(index: int) -> DeviceAllocator:
    with _lock:
        allocator: DeviceAllocator | None = _allocators.get(index)
        if allocator is None:
            config = _settings()
            if _current_allocator is not None:  # every request to the user's malloc
                config = dataclasses.replace(config, caching=False, expandable_segments=False)
                backend = PluggableBackend(index, _current_allocator)
                allocator = CachingAllocator(index, backend, config, _history)
            elif config.backend == "cudaMallocAsync":
                allocator = AsyncAllocator(index, _history)
            else:
                allocator = CachingAllocator(index, DriverBackend(index), config, _history)
            _allocators[index] = allocator
            _only[:] = [allocator.free] if len(_allocators) == 1 else []
    return allocator


def _allocator(device: Any = None) -> DeviceAllocator:
    index = current_device() if device is None else _index(device)
    return _allocators.get(index) or _create(index)


def allocator_for(index: int) -> DeviceAllocator:
    """The allocator of device ``index`` (an ordinal; created on first use, never replaced).
    Its ``malloc(size, stream_handle) -> ptr`` and ``free(ptr)`` are the direct entry points
    of hot paths such as gpurt.empty; ``free`` never calls the driver (safe from finalizers)
    and raises ValueError only for a pointer it does not own."""
    return _allocators.get(index) or _create(_index(index))


# ---- allocation ----------------------------------------------------------------------


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocate ``size`` bytes on ``device`` for use on ``stream`` (default: the current
    stream of that device) from the caching allocator; returns the device pointer.
    Raises gpurt.OutOfMemoryError when even freeing the cache does not help."""
    # Fast paths first: None or an int ordinal whose allocator exists (validated when it
    # was created), None or an int stream handle.
    allocators = _allocators
    allocator: DeviceAllocator | None
    if device is None:
        index = current_device()
        allocator = allocators.get(index) or _create(index)
    else:
        allocator = allocators.get(device) if type(device) is int else None
        if allocator is None:
            index = _index(device)
            allocator = allocators.get(index) or _create(index)
        else:
            index = device
    if stream is None:  # current_stream_handle(index), inlined
        return allocator.malloc(size, THREAD.streams.handles.get(index, 0))
    if type(stream) is int:
        return allocator.malloc(size, stream)
    return allocator.malloc(size, as_stream_handle(stream, index))


def caching_allocator_delete(ptr: int) -> None:
    """Free memory from :func:`caching_allocator_alloc`. Safe to call from finalizers: it
    never calls the driver (deferred work runs at the next allocation)."""
    only = _only
    if only:
        only[0](ptr)
        return
    for allocator in list(_allocators.values()):
        if allocator.owns(ptr):
            allocator.free(ptr)
            return
    if ptr:
        raise ValueError(f"0x{ptr:x} was not allocated by gpurt's caching allocator")


def _data_ptr(obj: Any) -> int:
    if isinstance(obj, int):
        return obj
    if hasattr(obj, "data_ptr"):
        return int(obj.data_ptr())
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    raise TypeError(f"expected a device pointer or array, got {type(obj).__name__}")


def record_stream_at(ptr: int, index: int, stream: Any) -> None:
    """:func:`record_stream` of ``ptr`` in memory of device ``index`` (Array.record_stream):
    with a gpurt Stream, one call of that device's allocator; anything else, or memory that
    allocator does not hold, goes the general way (which explains every error)."""
    allocator = _allocators.get(index)
    if allocator is not None and type(stream) is Stream:
        try:
            allocator.record_stream(ptr, stream._ident)
            return
        except ValueError:
            pass
    record_stream(ptr, stream)


def record_stream(obj: Any, stream: Any) -> None:
    """Mark the allocation behind ``obj`` (a pointer, or anything with ``data_ptr()`` or
    ``__cuda_array_interface__``) as used on ``stream``: when it is freed, its memory is
    reused only after the work queued on ``stream`` up to then has completed."""
    ptr = _data_ptr(obj)
    for allocator in list(_allocators.values()):
        try:
            allocator.record_stream(ptr, as_stream_handle(stream, allocator.device))
            return
        except ValueError:
            continue
    raise ValueError(f"0x{ptr:x} is not inside memory from gpurt's caching allocator")


def _retire_stream(device_index: int, handle: int) -> bool:
    """Runs before gpurt destroys one of its streams: every allocator records now what it
    would later have recorded on that stream (see gpurt/_memory/streamuses.py). False asks
    gpurt.streams to keep the stream and try again at its next safe point. Never raises."""
    done = True
    allocators: list[Allocator] = [*_allocators.values(), _pinned.host_allocator()]
    for allocator in allocators:
        try:
            done = allocator.retire_stream(device_index, handle) and done
        except Exception as exc:  # noqa: BLE001 - the device is failing; say so, carry on
            warnings.warn(f"gpurt: finishing with a stream before destroying it: {exc}",
                          RuntimeWarning, stacklevel=2)
    return done


before_stream_destroy(_retire_stream)


# ---- statistics ----------------------------------------------------------------------


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """DeviceAllocator statistics of ``device`` as nested dicts (torch's layout); {} before CUDA
    is initialised."""
    if not is_initialized():
        return {}
    index = current_device() if device is None else _index(device)
    allocator = _allocators.get(index)
    if allocator is None:
        return ms.empty_nested_stats(_settings().max_split_size_stat)
    return allocator.nested_stats()


def memory_stats(device: Any = None) -> dict[str, Any]:
    """DeviceAllocator statistics of ``device`` with torch's flat keys, sorted, e.g.
    ``'allocated_bytes.all.current'``; {} before CUDA is initialised."""
    return ms.flatten(memory_stats_as_nested_dict(device))


def memory_allocated(device: Any = None) -> int:
    """Bytes currently allocated to callers on ``device``."""
    return int(memory_stats(device).get("allocated_bytes.all.current", 0))


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset."""
    return int(memory_stats(device).get("allocated_bytes.all.peak", 0))


def memory_reserved(device: Any = None) -> int:
    """Bytes reserved from the driver by the allocator on ``device`` (cached included)."""
    return int(memory_stats(device).get("reserved_bytes.all.current", 0))


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since start or the last reset."""
    return int(memory_stats(device).get("reserved_bytes.all.peak", 0))


def _existing(device: Any) -> DeviceAllocator | None:
    if not is_initialized():
        return None
    index = current_device() if device is None else _index(device)
    return _allocators.get(index)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Make every "peak" statistic equal its current value."""
    allocator = _existing(device)
    if allocator is not None:
        allocator.reset_peak_stats()


def reset_max_memory_allocated(device: Any = None) -> None:
    """Deprecated torch name of :func:`reset_peak_memory_stats`."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zero the "allocated"/"freed" totals and the event counters (num_ooms, ...)."""
    allocator = _existing(device)
    if allocator is not None:
        allocator.reset_accumulated_stats()


def empty_cache() -> None:
    """Return cached, unused device memory of every device to the driver (synchronizes
    with outstanding cross-stream uses first). Waits until graph captures end."""
    for allocator in list(_allocators.values()):
        allocator.empty_cache()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limit this process's allocator on ``device`` to ``fraction`` of its total memory;
    going over raises OutOfMemoryError (wraps cuMemGetInfo for the total)."""
    if not isinstance(fraction, float):
        raise TypeError(f"fraction must be a float, got {type(fraction).__name__}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be within [0, 1], got {fraction}")
    _allocator(device).set_memory_fraction(fraction)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by :func:`set_per_process_memory_fraction` (1.0 by default)."""
    allocator = _existing(device)
    return 1.0 if allocator is None else allocator.memory_fraction


def _set_allocator_settings(settings: str) -> None:
    """Change GPURT_ALLOC_CONF keys at run time, like torch.cuda.memory._set_allocator_settings
    (e.g. ``"expandable_segments:False"``): the keys given replace the current ones for
    every device's allocator, existing or future. The backend cannot change once an
    allocator exists."""
    global _config
    changes = _allocconf.parse_settings(settings)
    with _lock:
        current = _settings()
        config = dataclasses.replace(current, **changes)  # type: ignore[arg-type]
        if config.backend != current.backend and _allocators:
            raise AllocatorConfigError(
                "backend: cannot change the allocator backend after the first allocation")
        _config = config
        for allocator in _allocators.values():
            if isinstance(allocator, CachingAllocator):
                allocator.set_config(config)


def get_allocator_backend() -> str:
    """'native' or 'cudaMallocAsync', from GPURT_ALLOC_CONF."""
    return _settings().backend


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics like torch.cuda.memory_summary(): readable in
    a terminal and as plain text."""
    index = current_device() if device is None and is_initialized() else (
        0 if device is None else _index(device))
    stats = memory_stats(index) or ms.flatten(ms.empty_nested_stats())
    return summary_table(stats, index, abbreviated, _settings().expandable)


# ---- snapshots and history -----------------------------------------------------------


def memory_snapshot() -> list[dict[str, Any]]:
    """Every device's segments with their blocks and states, like torch.cuda.memory_snapshot()."""
    segments: list[dict[str, Any]] = []
    for index in sorted(_allocators):
        segments += _allocators[index].snapshot()
    return segments


def _record_memory_history(enabled: Any = "all", context: Any = "all", stacks: str = "python",
                           max_entries: int = 100000, device: Any = None) -> None:
    """Start (or with ``enabled=None`` stop and clear) recording allocator events and the
    Python frames behind them, in a ring buffer of ``max_entries`` per device.
    ``enabled``: "all" (events + live-block frames) or "state" (frames only)."""
    _history.configure(enabled, context, stacks, max_entries)
    for allocator in list(_allocators.values()):
        allocator.trace.resize(_history.max_entries)
        if not _history.enabled:
            allocator.trace.clear()


def watch_allocations(observer: Any) -> list[tuple[int, int]]:
    """Tell ``observer`` of every allocation and free of device memory from now on
    (``observer.allocated(ptr, size)``, ``observer.freed(ptr, size)``, called under an
    allocator's lock; None stops it); returns the (address, size) of the live allocations.
    The stream sanitizer's source of allocation ranges."""
    _history.watch(observer)
    if observer is None:
        return []
    live: list[tuple[int, int]] = []
    for allocator in list(_allocators.values()):
        for segment in allocator.snapshot():
            live.extend((block["address"], block["size"]) for block in segment["blocks"]
                        if block["state"] == "active_allocated")
    return live


def _snapshot(device: Any = None) -> dict[str, Any]:
    """{"segments": [...], "device_traces": [[...] per device]} as JSON-ready dicts."""
    if not is_initialized():
        return {"segments": [], "device_traces": []}
    traces = []
    for index in range(device_count()):
        allocator = _allocators.get(index)
        traces.append(allocator.trace.as_json() if allocator is not None else [])
    return {"segments": memory_snapshot(), "device_traces": traces}


def _dump_snapshot(filename: str | os.PathLike[str] = "gpurt_snapshot.json") -> None:
    """Write :func:`_snapshot` as JSON (never pickle) to ``filename``."""
    with open(filename, "w") as fh:
        json.dump(_snapshot(), fh)


# ---- memory pools and pluggable allocators ---------------------------------------------


def change_current_allocator(allocator: PluggableAllocator) -> None:
    """Serve every gpurt allocation, on every device, from ``allocator`` (a
    :class:`PluggableAllocator` or :class:`CUDAPluggableAllocator`), as
    torch.cuda.memory.change_current_allocator: each request calls its malloc (no caching;
    frees reach its free at the allocator's next call). Only before gpurt's first device
    allocation: raises RuntimeError after it."""
    global _current_allocator
    if not isinstance(allocator, PluggableAllocator):
        raise TypeError(f"expected a gpurt.PluggableAllocator, got {type(allocator).__name__}")
    with _lock:
        if _allocators:
            raise RuntimeError(
                "change_current_allocator: gpurt has already allocated device memory (devices "
                f"{sorted(_allocators)}); the allocator can only be changed before the first "
                "allocation (torch: \"Can't swap an already initialized allocator\")")
        _current_allocator = allocator


def get_current_allocator() -> PluggableAllocator | None:
    """The allocator given to :func:`change_current_allocator`; None for gpurt's own."""
    return _current_allocator


def _caching_allocator(index: int, what: str) -> CachingAllocator:
    allocator = _allocator(index)
    if not isinstance(allocator, CachingAllocator):
        raise RuntimeError(f"{what} needs gpurt's caching allocator; GPURT_ALLOC_CONF selects "
                           f"backend:{get_allocator_backend()}")
    return allocator


class MemPool:
    """torch.cuda.MemPool: a private pool of the caching allocator on the current device.
    Allocations made inside :func:`use_mem_pool` come from it and return to it when freed;
    no other allocation uses its memory. With ``allocator`` (a :class:`PluggableAllocator`)
    its segments come from that allocator's malloc instead of cuMemAlloc. The pool lives as
    long as this object or a use_mem_pool block of it, and its cached memory goes back at
    the empty_cache after that."""

    def __init__(self, allocator: PluggableAllocator | None = None) -> None:
        if allocator is not None and not isinstance(allocator, PluggableAllocator):
            raise TypeError(
                f"allocator must be a gpurt.PluggableAllocator, got {type(allocator).__name__}")
        self._device = current_device()
        owner = _caching_allocator(self._device, "MemPool")
        self._id = new_pool_id()
        self._allocator = allocator
        backend = None if allocator is None else PluggableBackend(self._device, allocator)
        owner.retain_pool(self._id, backend)
        weakref.finalize(self, release_pool, self._device, self._id)

    @property
    def id(self) -> PoolId:
        """The pool's id, a pair of ints (like graph_pool_handle())."""
        return self._id

    @property
    def allocator(self) -> PluggableAllocator | None:
        return self._allocator

    @property
    def device(self) -> int:
        return self._device

    def use_count(self) -> int:
        """References to the pool: this object and each use_mem_pool block of it."""
        return _caching_allocator(self._device, "MemPool").pool_use_count(self._id)

    def snapshot(self) -> list[dict[str, Any]]:
        """The pool's segments, as :func:`memory_snapshot` lists them."""
        return [s for s in memory_snapshot() if tuple(s["segment_pool_id"]) == self._id]

    def memory_stats(self) -> dict[str, int]:
        """The pool's current statistics with memory_stats()' keys (".current" ones of the
        families a snapshot shows: segments, reserved, allocated, active, requested)."""
        stats: dict[str, int] = {}
        for segment in self.snapshot():
            kind = segment["segment_type"] + "_pool"
            blocks = segment["blocks"]
            live = [b for b in blocks if b["state"] != "inactive"]
            values = {
                "segment": 1, "reserved_bytes": segment["total_size"],
                "allocation": sum(b["state"] == "active_allocated" for b in blocks),
                "allocated_bytes": segment["allocated_size"], "active": len(live),
                "active_bytes": segment["active_size"],
                "requested_bytes": segment["requested_size"],
            }
            for family, value in values.items():
                for pool in ("all", kind):
                    key = f"{family}.{pool}.current"
                    stats[key] = stats.get(key, 0) + value
        return dict(sorted(stats.items()))

    def __repr__(self) -> str:
        return f"MemPool(id={self._id}, device={self._device})"


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[MemPool]:
    """Route this thread's allocations on ``device`` (default: the current one) to ``pool``
    until the block ends (torch.cuda.use_mem_pool). Other threads are not affected; blocks
    nest (the innermost pool wins); a graph capture still allocates from its own pool."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool expects a gpurt.MemPool, got {type(pool).__name__}")
    index = current_device() if device is None else _index(device)
    if index != pool.device:
        raise ValueError(f"{pool!r} belongs to device {pool.device}, not device {index}")
    owner = _caching_allocator(index, "use_mem_pool")
    owner.retain_pool(pool.id)
    try:
        owner.begin_thread_pool(pool.id)
    except BaseException:
        owner.release_pool(pool.id)
        raise
    try:
        yield pool
    finally:
        owner.end_thread_pool(pool.id)
        owner.release_pool(pool.id)


# ---- graph-private pools (used by gpurt.graphs) --------------------------------------


def new_pool_id() -> PoolId:
    """A fresh private-pool id, like torch's graph_pool_handle() value."""
    return (0, next(_pool_ids))


def begin_allocate_to_pool(device_index: int, pool_id: PoolId, stream_handle: int) -> None:
    """Until :func:`end_allocate_to_pool`, allocations on ``stream_handle`` (a capturing
    stream) and on the streams that join its capture come from private pool ``pool_id``
    (created if new, with no reference)."""
    _allocator(device_index).begin_allocate_to_pool(pool_id, int(stream_handle))


def end_allocate_to_pool(device_index: int, pool_id: PoolId) -> None:
    """Stop routing allocations to ``pool_id``; deferred frees and events run afterwards."""
    _allocator(device_index).end_allocate_to_pool(pool_id)


def retain_pool(device_index: int, pool_id: PoolId) -> None:
    """Add a reference to private pool ``pool_id`` (created if new)."""
    _allocator(device_index).retain_pool(pool_id)


def release_pool(device_index: int, pool_id: PoolId) -> None:
    """Drop a reference; at zero the pool's unused segments go back to the driver at the
    next empty_cache (or out-of-memory retry), as in torch. Safe from finalizers: no driver
    call, no new allocator, queued when the allocator is busy."""
    allocator = _allocators.get(device_index)
    if allocator is not None:
        allocator.release_pool(pool_id)


def captures_underway(device_index: int) -> bool:
    """True while some capture routes allocations of ``device_index`` to a private pool."""
    allocator = _allocators.get(device_index)
    return allocator is not None and allocator.captures_underway()
