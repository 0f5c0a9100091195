"""The allocator protocol: what gpurt.memory asks of every allocator, and the parts of it
that the three allocators (CachingAllocator, AsyncAllocator for device memory;
PinnedAllocator for pinned host memory) share.

Every allocator:
- ``free(ptr)`` never calls the driver (a finalizer may call it anywhere): work it cannot do
  now is queued and done at the next call that holds the lock;
- ``retire_stream(device, stream)`` runs before gpurt destroys ``stream`` of ``device``: it
  records now the events it would later have recorded on that stream. It returns False when
  that must wait -- the lock stays busy for :data:`RETIRE_WAIT` seconds, or a graph capture
  is underway (gpurt/_core/captures.py): the stream is then kept and retired later;
- does nothing a global-mode capture forbids (free memory, query, record or synchronize
  events) while a capture is underway: ``CAPTURES.count`` gates that work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from .._core.captures import CAPTURES
from .history import DeviceTrace

__all__ = ["RETIRE_WAIT", "Allocator", "DeviceAllocator", "retire"]

RETIRE_WAIT = 1.0  # seconds retire_stream waits for the lock before asking to be called again

T = TypeVar("T")


class Allocator(Protocol):
    """What every gpurt allocator does (see the module docstring)."""

    def free(self, ptr: int) -> None: ...
    def retire_stream(self, device: int, stream: int) -> bool: ...
    def empty_cache(self) -> None: ...
    def nested_stats(self) -> dict[str, Any]: ...


class DeviceAllocator(Allocator, Protocol):
    """A device memory allocator: what gpurt.memory and gpurt.graphs call."""

    device: int
    trace: DeviceTrace  # the allocator's event ring buffer (gpurt/_memory/history.py)

    @property
    def memory_fraction(self) -> float: ...

    def malloc(self, size: int, stream: int) -> int: ...
    def flush(self) -> None: ...
    def owns(self, ptr: int) -> bool: ...
    def record_stream(self, ptr: int, stream: int) -> None: ...
    def set_memory_fraction(self, fraction: float) -> None: ...
    def reset_peak_stats(self) -> None: ...
    def reset_accumulated_stats(self) -> None: ...
    def begin_allocate_to_pool(self, pool_id: Any, stream: int) -> None: ...
    def end_allocate_to_pool(self, pool_id: Any) -> None: ...
    def retain_pool(self, pool_id: Any) -> None: ...
    def release_pool(self, pool_id: Any) -> None: ...
    def captures_underway(self) -> bool: ...
    def snapshot(self) -> list[dict[str, Any]]: ...


def retire(lock: threading.Lock, users: Callable[[], Sequence[T]],
           record: Callable[[Sequence[T]], None], wait: float = RETIRE_WAIT) -> bool:
    """The shape of ``retire_stream``: under ``lock`` (waiting at most ``wait`` seconds),
    find the ``users`` of the stream; with none, done; during a capture, not now (False);
    else ``record`` their events."""
    if not lock.acquire(timeout=wait):
        return False
    try:
        found = users()
        if not found:
            return True
        if CAPTURES.count:
            return False
        record(found)
        return True
    finally:
        lock.release()
