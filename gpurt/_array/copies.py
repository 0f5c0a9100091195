"""Stream-ordered memory traffic over raw addresses: strided copies between device and
host memory, fills, the event handshake that orders one stream after another, and which
device an address belongs to.

Callers (gpurt.array, gpurt._array.arraycopy) bind the right context first and pass raw stream
handles. Every driver result goes through ``_driver.check``.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from .._core import syncdebug
from .._core.driver import check
from .._sanitizer import hooks as csan
from ..device import bind_context, current_device, primary_index
from . import layout as _layout

__all__: list[str] = []  # internal module

_HOST = cu.CUmemorytype.CU_MEMORYTYPE_HOST
_DEVICE = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
_NO_TIMING = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)

# ---- host addresses ----------------------------------------------------------------------
#
# ``ndarray.ctypes.data`` builds a ctypes object per call (0.8 us, more than the rest of a
# small copy's Python work). numpy's array struct starts with the object header followed
# by ``char *data`` (PyArrayObject_fields, what PyArray_DATA reads), so the address is one
# pointer-sized read at a fixed offset from the object. Checked once at import against
# ``ctypes.data``; any mismatch (an unusual build) keeps the slow, documented way.

_read_pointer = ctypes.c_void_p.from_address
_DATA_OFFSET = object.__basicsize__


def host_address(host: np.ndarray) -> int:
    """Address of element 0 of the numpy array ``host``."""
    return _read_pointer(id(host) + _DATA_OFFSET).value or 0


def _ctypes_address(host: np.ndarray) -> int:
    return host.ctypes.data


_probe = np.arange(3, dtype=np.int64)[1:]  # a view: its data is not where its buffer starts
if host_address(_probe) != _probe.ctypes.data:
    host_address = _ctypes_address  # an unusual numpy or CPython build
del _probe


# ---- stream ordering ---------------------------------------------------------------------

# Events for wait_for, per device: recording an idle event again is what torch's event pool
# does; the wait enqueued by cuStreamWaitEvent keeps the record it saw, so an event can go
# back to the pool right after the wait. Each is used by one thread at a time.
_idle_events: dict[int, list[Any]] = {}


def wait_for(index: int, consumer: int, producer: int, producer_index: int | None = None) -> None:
    """Make stream ``consumer`` of device ``index`` (whose context is bound) wait for the
    work queued so far on ``producer`` (raw handles; 0 and 1 both mean the legacy default
    stream) through an event (cuEventRecord + cuStreamWaitEvent). Nothing to do when they
    are the same stream. ``producer`` may be a stream of another device,
    ``producer_index``: its event is recorded in that device's context, and the wait is
    queued back in ``index``'s (which is bound again on return)."""
    across = producer_index is not None and producer_index != index
    if not across and (consumer == producer or (consumer <= 1 and producer <= 1)):
        return
    home = producer_index if across and producer_index is not None else index
    if csan.ON:
        csan.TRACKER.stream_wait(consumer, producer, index, home)
    if across:
        bind_context(home)  # the event is made and recorded in the producer's context
    idle = _idle_events.setdefault(home, [])
    try:
        event = idle.pop()
    except IndexError:
        event = check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate")
    try:
        check(cu.cuEventRecord(event, producer), "cuEventRecord")
        if across:
            bind_context(index)
        check(cu.cuStreamWaitEvent(consumer, event, 0), "cuStreamWaitEvent")
    finally:
        idle.append(event)
        if across:
            bind_context(index)


# ---- copies and fills --------------------------------------------------------------------


def _record_copy(dst: int, dst_on_device: bool, src: int, src_on_device: bool,
                 stream: int) -> None:
    """Tell the sanitizer (when on) that a copy on ``stream`` reads ``src`` and writes ``dst``."""
    kind = {(True, True): "device to device", (True, False): "host to device",
            (False, True): "device to host"}.get((dst_on_device, src_on_device), "host")
    csan.copy(dst if dst_on_device else 0, src if src_on_device else 0, stream, f"copy ({kind})")


def copy_bytes(dst: int, dst_on_device: bool, src: int, src_on_device: bool, nbytes: int,
               stream: int) -> None:
    """Copy ``nbytes`` contiguous bytes on ``stream``: one cuMemcpy{HtoD,DtoH,DtoD}Async."""
    if csan.ON:
        _record_copy(dst, dst_on_device, src, src_on_device, stream)
    _copy_bytes(dst, dst_on_device, src, src_on_device, nbytes, stream)


def _copy_bytes(dst: int, dst_on_device: bool, src: int, src_on_device: bool, nbytes: int,
                stream: int) -> None:
    if dst_on_device and src_on_device:
        check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")
    elif dst_on_device:
        check(cu.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")
    elif src_on_device:
        check(cu.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")
    else:
        raise ValueError("host-to-host copies are numpy's job")


def copy_peer(dst: int, dst_context: Any, src: int, src_context: Any, nbytes: int,
              stream: int) -> None:
    """Copy ``nbytes`` contiguous bytes from one device's memory to another's on ``stream``
    (cuMemcpyPeerAsync: over NVLink/PCIe with peer access, staged by the driver without)."""
    if csan.ON:
        csan.copy(dst, src, stream, "copy (device to peer device)")
    check(cu.cuMemcpyPeerAsync(dst, dst_context, src, src_context, nbytes, stream),
          "cuMemcpyPeerAsync")


def copy(dst: int, dst_on_device: bool, dst_strides: tuple[int, ...], src: int,
         src_on_device: bool, src_strides: tuple[int, ...], shape: tuple[int, ...],
         itemsize: int, stream: int) -> None:
    """Copy the strided array ``src`` into ``dst`` (same shape) on ``stream``: one
    cuMemcpy{HtoD,DtoH,DtoD}Async when both are contiguous, else the copies planned by
    :func:`gpurt._array.layout.plan_copy` (rows, and pitched blocks through cuMemcpy2DAsync)."""
    size = _layout.prod(shape)
    if not size:
        return
    if csan.ON:
        _record_copy(dst, dst_on_device, src, src_on_device, stream)
    if _layout.is_contiguous(shape, dst_strides, itemsize) and _layout.is_contiguous(
        shape, src_strides, itemsize
    ):
        _copy_bytes(dst, dst_on_device, src, src_on_device, size * itemsize, stream)
        return
    for c in _layout.plan_copy(shape, dst_strides, src_strides, itemsize):
        d, s = dst + c.dst_offset, src + c.src_offset
        if c.height == 1:
            _copy_bytes(d, dst_on_device, s, src_on_device, c.width, stream)
            continue
        params = cu.CUDA_MEMCPY2D()
        if src_on_device:
            params.srcMemoryType, params.srcDevice = _DEVICE, s
        else:
            params.srcMemoryType, params.srcHost = _HOST, s
        if dst_on_device:
            params.dstMemoryType, params.dstDevice = _DEVICE, d
        else:
            params.dstMemoryType, params.dstHost = _HOST, d
        params.srcPitch, params.dstPitch = c.src_pitch, c.dst_pitch
        params.WidthInBytes, params.Height = c.width, c.height
        check(cu.cuMemcpy2DAsync(params, stream), "cuMemcpy2DAsync")


def fill(ptr: int, pattern: bytes, count: int, stream: int) -> None:
    """Fill ``count`` contiguous items with the item bytes ``pattern`` on ``stream``: one
    cuMemsetD8/D16/D32Async in the widest unit the pattern repeats in, else (8- and
    16-byte items) one pitched cuMemsetD2D32Async per 32-bit word of the item."""
    if csan.ON:
        csan.access(stream, (), ((ptr, None),), "fill")
    size = len(pattern)
    if pattern == pattern[:1] * size:
        check(cu.cuMemsetD8Async(ptr, pattern[0], count * size, stream), "cuMemsetD8Async")
    elif size % 2 == 0 and pattern == pattern[:2] * (size // 2):
        value = int.from_bytes(pattern[:2], "little")
        check(cu.cuMemsetD16Async(ptr, value, count * size // 2, stream), "cuMemsetD16Async")
    elif size % 4 == 0 and pattern == pattern[:4] * (size // 4):
        value = int.from_bytes(pattern[:4], "little")
        check(cu.cuMemsetD32Async(ptr, value, count * size // 4, stream), "cuMemsetD32Async")
    else:  # word w of every item: a column of 32-bit values ``size`` bytes apart
        for word in range(size // 4):
            value = int.from_bytes(pattern[4 * word: 4 * word + 4], "little")
            check(cu.cuMemsetD2D32Async(ptr + 4 * word, size, value, 1, count, stream),
                  "cuMemsetD2D32Async")


def synchronize(stream: int) -> None:
    """Wait until everything queued on ``stream`` has finished (cuStreamSynchronize): the
    wait of a blocking copy to or from host memory (a sync debug mode site)."""
    if syncdebug.LEVEL:
        syncdebug.warn_or_error_on_sync("a copy between device and host memory that waits")
    check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    if csan.ON:
        csan.TRACKER.stream_synchronize(stream, csan.bound_device())


def download(dst: int, src: int, nbytes: int) -> None:
    """Copy ``nbytes`` from device to host memory on the legacy default stream and wait
    for it: cuMemcpyDtoH returns once the copy, queued after all earlier work of that
    stream, has completed (the same as cuMemcpyDtoHAsync + cuStreamSynchronize on it, in
    one driver call)."""
    if syncdebug.LEVEL:
        syncdebug.warn_or_error_on_sync("a copy from device to host memory that waits")
    if csan.ON:
        csan.copy(0, src, 0, "copy (device to host)")
    check(cu.cuMemcpyDtoH(dst, src, nbytes), "cuMemcpyDtoH")
    if csan.ON:
        csan.TRACKER.stream_synchronize(0, csan.bound_device())


def pointer_device(ptr: int) -> int:
    """Ordinal of the device whose memory ``ptr`` is (cuPointerGetAttribute); TypeError
    for host memory, pinned or not."""
    bind_context(current_device())  # initialises CUDA; the query wants a current context
    attr = cu.CUpointer_attribute
    err, kind = cu.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    # Not through check(): an error here only means the driver does not know the address.
    if int(err) != 0 or int(kind) == int(_HOST):
        where = "host memory" if int(err) == 0 else "not memory the CUDA driver knows"
        raise TypeError(f"address {ptr:#x} is {where}; a device array is needed here")
    # cuda-bindings 13.3 read CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as 0 for memory on device
    # 1 of an H200 pair, where the driver called through ctypes said 1; the owning context
    # decides instead, where there is one.
    context = check(cu.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_CONTEXT, ptr),
                    "cuPointerGetAttribute")
    if int(context):
        return context_device(context)
    ordinal = check(cu.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
                    "cuPointerGetAttribute")
    return int(ordinal)


def context_device(context: Any) -> int:
    """Ordinal of the device of ``context``: a primary context gpurt holds, else asked of
    the driver (cuCtxPushCurrent + cuCtxGetDevice + cuCtxPopCurrent)."""
    index = primary_index(context)
    if index is not None:
        return index
    check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent")
    try:
        device = check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
    finally:
        check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
    return int(device)
