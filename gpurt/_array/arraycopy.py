"""Copies into and out of Arrays (the copy_/to_numpy/__dlpack__ side of gpurt.array): checks
that both sides match, device-to-device copies on one device or across two, and copies
between an Array and a host buffer.

Copies are stream ordered on the destination array's stream (the source array's stream
is made to wait first when it differs) and go through ``cuMemcpy*Async``; a copy that
involves host memory waits for completion unless ``non_blocking=True`` (truly
asynchronous when the host buffer is pinned; the driver makes pageable copies safe).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..device import bind_context, current_device, enable_peer_access, primary_context
from . import copies as _copy
from . import layout as _layout
from .ownership import owner_of

# gpurt.array imports this module, not the reverse: its Array is typed by name only here.
Array = Any

__all__: list[str] = []  # internal module


def _check_match(dst: Array, dtype: np.dtype, shape: tuple[int, ...], what: str) -> None:
    if dtype is not dst.dtype and dtype != dst.dtype:
        raise TypeError(
            f"{what}: dtype mismatch: the array is {dst.dtype.name}, the other side is "
            f"{np.dtype(dtype).name} (gpurt does not convert dtypes on the device)"
        )
    if tuple(shape) != dst.shape:
        raise ValueError(f"{what}: shape mismatch: the array is {dst.shape}, "
                         f"the other side is {tuple(shape)}")


def _wait_for(index: int, consumer: int, producer: int) -> None:
    """Order stream ``consumer`` after the work queued on ``producer`` (device ``index``)."""
    if consumer != producer:
        bind_context(index)
        _copy.wait_for(index, consumer, producer)


def _copy_device(dst: Array, src: Array) -> None:
    """Device-to-device copy on ``dst``'s stream, after ``src``'s stream."""
    _check_match(dst, src.dtype, src.shape, "copy_")
    index = dst.device.index
    if not src.size:
        return
    if src.device.index != index:
        _copy_across(dst, src)
        return
    overlapping = owner_of(src) is owner_of(dst) and _overlap(dst, src)
    if overlapping:  # copy through a temporary, as numpy's assignment semantics require
        src = src.clone()
    stream = dst.stream.cuda_stream
    _wait_for(index, stream, src.stream.cuda_stream)
    bind_context(index)
    if dst._contiguous and src._contiguous:
        _copy.copy_bytes(dst.ptr, True, src.ptr, True, dst.nbytes, stream)
    else:
        _copy.copy(dst.ptr, True, dst.strides, src.ptr, True, src.strides, dst.shape,
                   dst.dtype.itemsize, stream)
    if overlapping and src.stream.cuda_stream != stream:
        src.record_stream(dst.stream)  # the temporary is read on dst's stream


def _copy_across(dst: Array, src: Array) -> None:
    """Copy between devices: one cuMemcpyPeerAsync on ``dst``'s stream after ``src``'s
    stream, which then waits for the copy (so ``src`` may be freed at once). Strided sides
    go through a contiguous temporary on their own device."""
    if not src._contiguous:
        src = src.clone()
    if not dst._contiguous:  # through a contiguous copy of src made on dst's device and stream
        dst.copy_(src.to(dst.device, dst.stream))
        return
    here, there = dst.device.index, src.device.index
    enable_peer_access(here, there)  # the direct path where there is one
    dst_stream, src_stream = dst.stream.cuda_stream, src.stream.cuda_stream
    _copy.wait_for(here, dst_stream, src_stream, there)  # leaves ``here`` bound
    _copy.copy_peer(dst.ptr, primary_context(here), src.ptr, primary_context(there),
                    src.nbytes, dst_stream)
    _copy.wait_for(there, src_stream, dst_stream, here)
    bind_context(current_device())


def _overlap(a: Array, b: Array) -> bool:
    a_lo, a_hi = _layout.byte_extent(a.shape, a.strides, a.itemsize)
    b_lo, b_hi = _layout.byte_extent(b.shape, b.strides, b.itemsize)
    return a.ptr + a_lo < b.ptr + b_hi and b.ptr + b_lo < a.ptr + a_hi


def _host_copy(array: Array, host: np.ndarray, to_device: bool, non_blocking: bool) -> None:
    """Copy between ``array`` and the C-contiguous ``host`` buffer (same shape and dtype)
    on the array's stream: one cuMemcpy{HtoD,DtoH}Async when the array is contiguous too,
    then, unless ``non_blocking``, cuStreamSynchronize, as torch does for pageable memory.
    A synchronous download on the legacy default stream is the one call cuMemcpyDtoH."""
    nbytes = host.nbytes
    if not nbytes:
        return
    bind_context(array.device.index)
    stream = array.stream.cuda_stream
    host_ptr = _copy.host_address(host)
    if array._contiguous:
        if to_device:
            _copy.copy_bytes(array.ptr, True, host_ptr, False, nbytes, stream)
        elif stream == 0 and not non_blocking:  # the default stream: copy and wait at once
            _copy.download(host_ptr, array.ptr, nbytes)
            return
        else:
            _copy.copy_bytes(host_ptr, False, array.ptr, True, nbytes, stream)
    elif to_device:
        _copy.copy(array.ptr, True, array.strides, host_ptr, False, host.strides, array.shape,
                   array.itemsize, stream)
    else:
        _copy.copy(host_ptr, False, host.strides, array.ptr, True, array.strides, array.shape,
                   array.itemsize, stream)
    if not non_blocking:
        _copy.synchronize(stream)
