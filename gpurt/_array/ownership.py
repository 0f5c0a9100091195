"""How Arrays own device memory: where a new array's memory comes from, who keeps it alive,
and how it goes back.

The array that allocated or imported memory (the root, ``_owner is None``) owns it; every
view holds the root (or, over a foreign CAI array, the foreign object) in ``_owner``, so the
memory lives exactly as long as the last array over it (:func:`owner_of`).

The root's death runs one finalizer: a plain weak reference with a callback,
weakref.finalize's own mechanism at a fraction of its cost (every ``gpurt.empty`` pays it).
:data:`FINALIZERS` maps each such reference to what it releases (a block's address, or a
consumed DLPack tensor) and keeps the reference alive until it has called back: a reference
that dies in the same garbage cycle as its array would never call back. Finalizers never
raise into the code that dropped the array and never call the driver (the allocator's
``free`` only does bookkeeping, and queues when its lock is busy).

A *place* is everything gpurt.empty needs to know about where a new array goes, as one plain
tuple (unpacking a tuple is the cheapest read Python has)::

    (device index, raw stream handle, Stream, Device, the allocator's malloc, the finalizer)

The place of this thread's current device and that device's current stream is kept in
the per-thread state (gpurt/_core/state.py's ``place``), which drops it whenever either changes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from .. import memory, streams
from .._core.driver import is_forked_child
from .._core.fork import at_fork_in_child
from .._core.state import current_place, remember_place
from ..device import Device, DeviceLike, _index, current_device

__all__: list[str] = []  # internal module

FINALIZERS: dict[weakref.ref, Any] = {}

Malloc = Callable[[int, int], int]  # (size, stream handle) -> device pointer
Release = Callable[[weakref.ref], None]  # a root array's finalizer
Place = tuple[int, int, Any, Device, Malloc, Release]


def owner_of(array: Any) -> Any:
    """What keeps ``array``'s memory alive: the object its views must hold."""
    owner = array._owner
    return array if owner is None else owner


def _release_import(ref: weakref.ref, _pop: Any = FINALIZERS.pop) -> None:
    """Calls a consumed DLPack tensor's deleter when the root array over it dies."""
    try:
        _pop(ref).release()
    except Exception:  # finalizers never raise into whatever code dropped the array
        pass


def own_import(array: Any, imported: Any) -> None:
    """Make the root ``array`` release the consumed DLPack tensor ``imported`` (its
    ``release()``) when it dies."""
    FINALIZERS[weakref.ref(array, _release_import)] = imported


# ---- devices and their allocators ----------------------------------------------------------

_devices: dict[int, Device] = {}
_allocators: dict[int, tuple[Malloc, Release]] = {}


def device_object(index: int) -> Device:
    """The one Device object of ordinal ``index`` that arrays share."""
    device = _devices.get(index)
    if device is None:
        device = _devices[index] = Device(index)
    return device


def _allocator(index: int) -> tuple[Malloc, Release]:
    """Device ``index``'s allocator as new arrays use it: its ``malloc``, and the finalizer
    that returns a root array's block to it. Made once per device: memory.allocator_for's
    allocator is never replaced."""
    found = _allocators.get(index)
    if found is None:
        allocator = memory.allocator_for(index)
        free, pop = allocator.free, FINALIZERS.pop

        def release(ref: weakref.ref) -> None:
            try:
                free(pop(ref))
            except Exception:  # finalizers never raise into whatever code dropped the array
                pass

        found = _allocators[index] = (allocator.malloc, release)
    return found


def _forget_allocators_after_fork() -> None:
    """In a child forked after CUDA started, new arrays must reach the fork error (see
    memory._forget_allocators_after_fork), not the parent's allocators."""
    if is_forked_child():
        _allocators.clear()


at_fork_in_child("array places", _forget_allocators_after_fork)


def device_index(device: DeviceLike) -> int:
    """``_index(device)`` with the cheap spellings first: an ordinal already seen and
    "cuda" (the current device)."""
    if type(device) is int and device in _devices:
        return device
    if type(device) is str and device == "cuda":
        return current_device()
    return _index(device)


# ---- places ----------------------------------------------------------------------------


def place(device: DeviceLike = None) -> Place:
    """Where a new array on ``device`` (default: the current device) goes: that device's
    current stream on this thread. The current device's place is remembered."""
    found = current_place()
    if found is not None and (device is None or type(device) is str and device == "cuda"
                              or type(device) is int and device == found[0]):
        return found
    current = current_device()
    index = current if device is None else device_index(device)
    if index == current:
        stream = streams.current_stream()  # no argument: no second validation of index
    else:
        stream = streams.current_stream(index)
    found = (index, stream.cuda_stream, stream, device_object(index), *_allocator(index))
    if index == current:
        remember_place(found)
    return found


def remember_current_place() -> None:
    """Make and remember this thread's place where the current device's allocator is in use
    already (so nothing is created): gpurt.asarray's C reader of torch tensors needs it."""
    if current_place() is None and current_device() in _allocators:
        place()


def place_on(stream: Any, device: DeviceLike) -> Place:
    """Where a new array on ``stream`` goes; ``device``, when given, must be its device."""
    index = stream.device_index
    if device is not None and device_index(device) != index:
        raise ValueError(f"stream {stream!r} belongs to cuda:{index}, "
                         f"not to device {device!r}")
    return (index, stream.cuda_stream, stream, device_object(index), *_allocator(index))
