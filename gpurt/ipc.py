"""Sharing Arrays between processes on one machine (CUDA legacy IPC), like torch's CUDA
tensors through multiprocessing, and :func:`ipc_collect`.

The exporter calls :func:`export_array`: it gets the legacy IPC handle of the cuMemAlloc
allocation (a caching-allocator segment) holding the array (wraps cuMemGetAddressRange and
cuIpcGetMemHandle), records an interprocess event on the array's stream so importers see
its finished writes, and returns an :class:`IpcHandle`: plain bytes that pickle by value.
Another process calls :func:`open_array` and gets an Array with the same shape, strides
and dtype on the same physical device (found by UUID), over the same memory: writes on
either side are seen by the other once ordered (synchronize, or an event).

Lifetime rules (docs/ipc.md):

- The exporter keeps the block alive from the export until every importer has closed,
  even if it drops its own arrays: the export holds the array's memory, and only
  :func:`ipc_collect` in the exporter gives it back, once the shared counter of open
  importers (gpurt/_ipc/counter.py) reads zero. An importer that dies without closing
  keeps the block until the exporter exits.
- An importer closes when its last Array over the export is garbage collected; the close
  itself (synchronize the device, cuIpcCloseMemHandle, count down) is a driver call, so it
  runs at the next safe point: :func:`ipc_collect`, the next :func:`open_array`, or exit.
- One export is for ``importers`` processes (default 1); export again for more. A process
  cannot open its own export (CUDA forbids it): use the array itself.
- Only cuMemAlloc memory can be exported this way: memory of expandable segments and of
  the cudaMallocAsync backend is refused with a clear error.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import os
import threading
import weakref
from typing import Any

from cuda.bindings import driver as cu

from ._array import layout as _layout
from ._array.interop import Foreign
from ._array.ownership import owner_of
from ._core.driver import CudaError
from ._core.fork import at_fork_in_child, renew_after_fork
from ._ipc import counter as _counter
from ._ipc.handle import IPC_HANDLE_BYTES, TOKEN_BYTES, IpcHandle
from ._streams.handles import call
from .array import Array, _wrap
from .device import _uuid_text, device_count, get_device_properties, synchronize
from .streams import Event, current_stream

__all__ = ["IpcHandle", "export_array", "open_array", "ipc_collect"]

_lock = threading.RLock()
renew_after_fork(globals(), _lock=threading.RLock)


# ---- the exporting side ------------------------------------------------------------------


class _Export:
    """One export: what keeps the block alive, the event, and the counter of importers."""

    __slots__ = ("keep", "event", "fd", "token")

    def __init__(self, keep: Any, event: Event, fd: int, token: bytes) -> None:
        self.keep = keep
        self.event = event
        self.fd = fd
        self.token = token


_exports: dict[bytes, _Export] = {}  # token -> export, until ipc_collect finds it closed


def _segment_of(ptr: int, index: int) -> tuple[int, int]:
    """(base, size) of the driver allocation holding ``ptr`` (wraps cuMemGetAddressRange)."""
    base, size = call(index, "cuMemGetAddressRange", cu.cuMemGetAddressRange, ptr)
    return int(base), int(size)


def _mem_handle(base: int, index: int) -> bytes:
    """The legacy IPC handle of the allocation at ``base``; ValueError for memory that
    legacy IPC cannot share (VMM / expandable segments, stream-ordered pools)."""
    try:
        handle = call(index, "cuIpcGetMemHandle", cu.cuIpcGetMemHandle, base)
    except CudaError as exc:
        raise ValueError(
            "this array's memory cannot be shared with legacy CUDA IPC: it is not a plain "
            "cuMemAlloc allocation (memory of expandable segments or of the "
            "backend:cudaMallocAsync allocator is not exportable this way); allocate it "
            f"from gpurt's default caching allocator to share it ({exc})"
        ) from exc
    return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)


def export_array(array: Array, importers: int = 1) -> IpcHandle:
    """A handle another process opens with :func:`open_array`; the block stays allocated
    until ``importers`` processes have opened and closed it and :func:`ipc_collect` runs
    here. The array's pending writes are ordered before the importers' use."""
    if not isinstance(array, Array):
        raise TypeError(f"export_array takes a gpurt.Array, got {type(array).__name__}")
    if type(importers) is not int or importers < 1:
        raise ValueError(f"importers must be a positive int, got {importers!r}")
    if not array.nbytes:
        raise ValueError("an empty array has no memory to share; send its shape instead")
    index = array.device.index
    base, size = _segment_of(array.ptr, index)
    mem = _mem_handle(base, index)
    event = Event(interprocess=True)
    event.record(array.stream)
    token = os.urandom(TOKEN_BYTES)
    handle = IpcHandle(
        device_uuid=_uuid_bytes(index), mem_handle=mem, event_handle=event.ipc_handle(),
        offset=array.ptr - base, segment_size=size, shape=array.shape,
        strides=array.strides, dtype=array.dtype, pid=os.getpid(), token=token)
    fd = _counter.create(os.getpid(), token, importers)
    with _lock:
        _exports[token] = _Export(owner_of(array), event, fd, token)
    return handle


def _collect_exports() -> int:
    """Release every export whose importers have all closed; how many were released."""
    with _lock:
        done = [e for e in _exports.values() if _counter.read(e.fd) == 0]
        for export in done:
            del _exports[export.token]
            os.close(export.fd)
            _counter.remove(os.getpid(), export.token)
    return len(done)  # the blocks go back to the allocator as ``keep`` dies


# ---- the importing side ------------------------------------------------------------------


class _Mapping:
    """One opened allocation of another process, shared by every import of it here."""

    __slots__ = ("index", "base", "size", "users")

    def __init__(self, index: int, base: int, size: int) -> None:
        self.index = index
        self.base = base
        self.size = size
        self.users = 0


class _Import:
    """Held by every Array over one import (as their owner); its death queues the close."""

    __slots__ = ("key", "export", "__weakref__")

    def __init__(self, key: tuple[int, bytes], export: tuple[int, bytes]) -> None:
        self.key = key  # the mapping: (device, memory handle)
        self.export = export  # the export: (exporter pid, token)


_mappings: dict[tuple[int, bytes], _Mapping] = {}  # (device, memory handle) -> mapping
# (exporter pid, token) -> [the export's counter fd, live imports of it here]: this process
# counts as one importer however often it opens the same export
_counters: dict[tuple[int, bytes], list[int]] = {}
_closing: collections.deque[tuple[tuple[int, bytes], tuple[int, bytes]]] = collections.deque()


def _queue_close(key: tuple[int, bytes], export: tuple[int, bytes]) -> None:
    """The finalizer of an import: no driver call, only a note for the next safe point."""
    _closing.append((key, export))


def _device_with_uuid(uuid: bytes) -> int:
    wanted = _uuid_text(uuid)
    for index in range(device_count()):
        if get_device_properties(index).uuid == wanted:
            return index
    raise ValueError(f"IPC handle: no visible device has UUID {wanted} (CUDA_VISIBLE_DEVICES "
                     "may hide the exporter's device from this process)")


def _uuid_bytes(index: int) -> bytes:
    return bytes.fromhex(get_device_properties(index).uuid.replace("-", ""))


def _map(index: int, mem: bytes) -> _Mapping:
    """The mapping of ``mem`` on device ``index``, opened on first use (wraps
    cuIpcOpenMemHandle and cuMemGetAddressRange for the true size)."""
    key = (index, mem)
    mapping = _mappings.get(key)
    if mapping is None:
        raw = cu.CUipcMemHandle()
        ctypes.memmove(raw.getPtr(), mem, IPC_HANDLE_BYTES)
        flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        base = int(call(index, "cuIpcOpenMemHandle", cu.cuIpcOpenMemHandle, raw, flags))
        _, size = _segment_of(base, index)
        mapping = _mappings[key] = _Mapping(index, base, size)
    return mapping


def _unmap(key: tuple[int, bytes]) -> None:
    mapping = _mappings.pop(key)
    call(mapping.index, "cuIpcCloseMemHandle", cu.cuIpcCloseMemHandle, mapping.base)


def open_array(handle: IpcHandle | bytes, stream: Any = None) -> Array:
    """The Array another process exported with :func:`export_array`, on its device and
    ``stream`` (default: that device's current stream), which first waits for the
    exporter's writes. Accepts the handle or its bytes (validated either way)."""
    if not isinstance(handle, IpcHandle):
        handle = IpcHandle.from_bytes(handle)
    if handle.pid == os.getpid():
        raise ValueError("this process exported the handle itself; CUDA cannot open its own "
                         "IPC handles: use the exported array")
    _close_pending()
    index = _device_with_uuid(handle.device_uuid)
    export = (handle.pid, handle.token)
    with _lock:
        counted = _counters.get(export)
        fd = _counter.open_existing(*export) if counted is None else counted[0]
        try:
            mapping = _map(index, handle.mem_handle)
        except BaseException:
            if counted is None:
                os.close(fd)
            raise
        mapping.users += 1
        if counted is None:
            counted = _counters[export] = [fd, 0]
        counted[1] += 1
        keep = _Import((index, handle.mem_handle), export)
    weakref.finalize(keep, _queue_close, keep.key, export)
    lo, hi = _layout.byte_extent(handle.shape, handle.strides, handle.dtype.itemsize)
    if handle.offset + hi > mapping.size:  # the handle lied about the allocation's size
        raise ValueError(f"IPC handle: the array's bytes end at {handle.offset + hi}, past "
                         f"the {mapping.size}-byte allocation that was opened")
    target = current_stream(index) if stream is None else stream
    event = Event.from_ipc_handle(index, handle.event_handle)
    target.wait_event(event)
    return _wrap(Foreign(mapping.base + handle.offset, handle.shape, handle.strides,
                         handle.dtype, index, target, keep, None))


def _close_pending() -> None:
    """Run the closes queued by dropped imports: finish the device's work on the memory,
    unmap it when no import here uses it, and count the exporter's importers down once
    this process holds nothing of the export."""
    with _lock:
        synced: set[int] = set()
        while _closing:
            key, export = _closing.popleft()
            try:
                mapping = _mappings.get(key)
                if mapping is None:  # forgotten after a fork
                    continue
                if mapping.index not in synced:
                    synchronize(mapping.index)
                    synced.add(mapping.index)
                mapping.users -= 1
                if mapping.users == 0:
                    _unmap(key)
            finally:
                _release_count(export)


def _release_count(export: tuple[int, bytes]) -> None:
    counted = _counters.get(export)
    if counted is None:  # forgotten after a fork
        return
    counted[1] -= 1
    if counted[1] == 0:
        del _counters[export]
        _counter.decrement(counted[0])


def ipc_collect() -> None:
    """Finish with shared memory (torch.cuda.ipc_collect): as an importer, close the
    imports whose Arrays are gone; as an exporter, give back the blocks whose importers
    have all closed."""
    _close_pending()
    _collect_exports()


def _at_exit() -> None:
    """Importers count down what they still hold (their mappings die with the process);
    exporters remove their counter files."""
    try:
        _close_pending()
    except Exception:  # the driver may be going away: counting down matters more
        pass
    for fd, _ in list(_counters.values()):
        try:
            _counter.decrement(fd)
        except OSError:
            pass
    _counters.clear()
    for export in list(_exports.values()):
        _counter.remove(os.getpid(), export.token)


atexit.register(_at_exit)


def _forget_after_fork() -> None:
    """A forked child owns none of the parent's exports and imports: at its exit it must
    not count the parent's importers down nor touch its counter files."""
    _exports.clear()
    _mappings.clear()
    _closing.clear()
    _counters.clear()


at_fork_in_child("ipc", _forget_after_fork)
