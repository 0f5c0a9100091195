"""Pluggable allocators: device memory from functions the user provides, in place of
cuMemAlloc (torch's CUDAPluggableAllocator, change_current_allocator, MemPool(allocator)).

A :class:`PluggableAllocator` is two functions with torch's signatures, streams passed as
handles (ints): ``malloc(size, device, stream) -> pointer`` and
``free(pointer, size, device, stream)``. :class:`CUDAPluggableAllocator` takes them from a
shared library, as torch does. :class:`PluggableBackend` puts them under gpurt's caching
core as its segment source: with ``gpurt.change_current_allocator`` every allocation on a
device is one call (no caching, as in torch, so the functions see every request; gpurt's
statistics stay complete); a ``MemPool(allocator)`` caches blocks cut from segments that
its functions return. Frees reach the user's ``free`` only at the allocator's next call
(never from a finalizer), with the size and stream its ``malloc`` was given.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from .._core.driver import OutOfMemoryError
from ..device import bind_context
from .driver import DriverBackend, out_of_memory_error

__all__ = ["PluggableAllocator", "CUDAPluggableAllocator"]

Malloc = Callable[[int, int, int], Any]
Free = Callable[[int, int, int, int], Any]


class PluggableAllocator:
    """Device memory from ``malloc(size, device, stream) -> int`` and
    ``free(ptr, size, device, stream)``: give the two callables, or subclass and define
    the two methods. ``malloc`` returns 0 (or None) when it is out of memory."""

    def __init__(self, malloc: Malloc | None = None, free: Free | None = None) -> None:
        if malloc is not None or free is not None:
            if not callable(malloc) or not callable(free):
                raise TypeError("PluggableAllocator needs two callables: malloc(size, device, "
                                "stream) -> pointer and free(pointer, size, device, stream)")
            self._malloc_fn: Malloc | None = malloc
            self._free_fn: Free | None = free
        elif type(self).malloc is PluggableAllocator.malloc:
            raise TypeError("PluggableAllocator needs malloc and free callables (or a "
                            "subclass that defines the malloc and free methods)")

    @classmethod
    def from_object(cls, obj: Any) -> PluggableAllocator:
        """An allocator over any object with ``malloc`` and ``free`` methods of the
        signatures above."""
        malloc, free = getattr(obj, "malloc", None), getattr(obj, "free", None)
        if not callable(malloc) or not callable(free):
            raise TypeError(f"a {type(obj).__name__} has no malloc and free methods")
        return cls(malloc, free)

    def malloc(self, size: int, device: int, stream: int) -> Any:
        return self._malloc_fn(size, device, stream)  # type: ignore[misc]

    def free(self, ptr: int, size: int, device: int, stream: int) -> Any:
        return self._free_fn(ptr, size, device, stream)  # type: ignore[misc]


class CUDAPluggableAllocator(PluggableAllocator):
    """torch.cuda.memory.CUDAPluggableAllocator: the functions come from the shared library
    ``path_to_so_file``: ``void* alloc(ssize_t size, int device, cudaStream_t stream)`` and
    ``void free(void* ptr, ssize_t size, int device, cudaStream_t stream)``."""

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str) -> None:
        library = ctypes.CDLL(str(path_to_so_file))
        try:
            alloc, free = getattr(library, alloc_fn_name), getattr(library, free_fn_name)
        except AttributeError as exc:
            raise ValueError(f"{path_to_so_file}: {exc}") from None
        alloc.restype = ctypes.c_void_p
        alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        free.restype = None
        free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self._library = library  # keeps the functions loaded
        super().__init__(alloc, free)


class PluggableBackend(DriverBackend):
    """The caching core's backend (gpurt/_memory/segments.py) with segments from a
    :class:`PluggableAllocator`; events and synchronization stay the driver's."""

    def __init__(self, index: int, allocator: PluggableAllocator) -> None:
        super().__init__(index)
        self.allocator = allocator
        self._segments: dict[int, tuple[int, int]] = {}  # ptr -> (size, stream)

    def malloc(self, size: int, capturing: bool, stream: int = 0) -> int | None:
        """The user's malloc; None when it returns 0 or None (out of memory)."""
        bind_context(self.index)  # the device current while it runs, as torch sets it
        ptr = self.allocator.malloc(size, self.index, stream)
        if ptr is None or ptr == 0:
            return None
        if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr < 0:
            raise TypeError(f"the pluggable allocator's malloc returned {ptr!r}; expected a "
                            "device pointer (int), or 0 when out of memory")
        if ptr in self._segments:
            raise ValueError(f"the pluggable allocator's malloc returned 0x{ptr:x}, which is "
                             "still in use (not freed yet)")
        self._segments[ptr] = (size, stream)
        return ptr

    def free(self, ptr: int) -> None:
        size, stream = self._segments.pop(ptr)
        bind_context(self.index)
        self.allocator.free(ptr, size, self.index, stream)

    def reserve(self, size: int) -> int | None:
        return None  # (expandable segments are off with a pluggable allocator)

    def oom_error(self, message: str) -> OutOfMemoryError:
        return out_of_memory_error(message, "the pluggable allocator's malloc")
