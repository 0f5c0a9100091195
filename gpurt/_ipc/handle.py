"""The bytes that carry a shared Array from one process to another, and their parser.

A handle names one cuMemAlloc allocation (its legacy CUDA IPC handle), where the array
starts in it, the array's shape, byte strides and dtype, the device (by UUID, since device
ordinals differ between processes), an interprocess event that orders the exporter's writes
before the importer's reads, and the exporter's pid and token that name the shared counter
of open importers (gpurt/_ipc/counter.py).

A handle comes from another process: everything in it is untrusted. :meth:`IpcHandle.from_bytes`
checks the length, magic, version and every field's range before anything is opened, and
pickling goes through it too (``__reduce__``), so a handle sent through multiprocessing is
validated in the receiver exactly like one read from a socket. No driver calls here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import layout as _layout
from .._array.dtypes import SUPPORTED

__all__ = ["IpcHandle", "MAX_NDIM"]

MAGIC = b"GPURTIPC"
VERSION = 1
MAX_NDIM = 32
IPC_HANDLE_BYTES = 64  # CUipcMemHandle and CUipcEventHandle
TOKEN_BYTES = 16
MAX_BYTES = 1 << 56  # no device allocation comes near; bounds every size and offset
# magic, version, ndim, pid, device uuid, memory handle, event handle, offset,
# segment size, token, dtype name
_FIXED = struct.Struct("<8sHHI16s64s64sQQ16s16s")
_DTYPES = {dt.name: dt for dt in SUPPORTED}


@dataclass(frozen=True)
class IpcHandle:
    """An exported Array: made by :func:`gpurt.ipc.export_array`, opened in another
    process by :func:`gpurt.ipc.open_array`. Plain data, validated on construction;
    :meth:`to_bytes` / :meth:`from_bytes` give its wire form, which pickling uses."""

    device_uuid: bytes
    mem_handle: bytes
    event_handle: bytes
    offset: int  # bytes from the allocation's base to element 0
    segment_size: int  # the allocation's size when it was exported
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in bytes
    dtype: np.dtype
    pid: int  # the exporting process
    token: bytes  # names the exporter's counter of open importers

    def __post_init__(self) -> None:
        _check_bytes("device_uuid", self.device_uuid, 16)
        _check_bytes("mem_handle", self.mem_handle, IPC_HANDLE_BYTES)
        _check_bytes("event_handle", self.event_handle, IPC_HANDLE_BYTES)
        _check_bytes("token", self.token, TOKEN_BYTES)
        if not any(self.token):
            raise ValueError("IPC handle: the token is all zeros")
        if not isinstance(self.dtype, np.dtype) or _DTYPES.get(self.dtype.name) != self.dtype:
            raise ValueError(f"IPC handle: unsupported dtype {self.dtype!r}")
        _check_int("pid", self.pid, 1, 1 << 32)
        _check_int("segment_size", self.segment_size, 1, MAX_BYTES)
        _check_int("offset", self.offset, 0, self.segment_size)
        _check_layout(self.shape, self.strides, self.dtype.itemsize)
        itemsize = self.dtype.itemsize
        if self.offset % itemsize:
            raise ValueError(f"IPC handle: offset {self.offset} is not a multiple of the "
                             f"item size {itemsize}")
        lo, hi = _layout.byte_extent(self.shape, self.strides, itemsize)
        if hi <= lo:
            raise ValueError(f"IPC handle: the array of shape {self.shape} has no elements")
        if self.offset + lo < 0 or self.offset + hi > self.segment_size:
            raise ValueError(
                f"IPC handle: the array's bytes [{self.offset + lo}, {self.offset + hi}) lie "
                f"outside its allocation of {self.segment_size} bytes"
            )

    @property
    def nbytes(self) -> int:
        return _layout.prod(self.shape) * self.dtype.itemsize

    def to_bytes(self) -> bytes:
        """The wire form: a fixed header, then shape and strides as int64."""
        ndim = len(self.shape)
        head = _FIXED.pack(MAGIC, VERSION, ndim, self.pid, self.device_uuid, self.mem_handle,
                           self.event_handle, self.offset, self.segment_size, self.token,
                           self.dtype.name.encode("ascii"))
        return head + struct.pack(f"<{2 * ndim}q", *self.shape, *self.strides)

    @classmethod
    def from_bytes(cls, data: Any) -> IpcHandle:
        """Parse and validate a handle from :meth:`to_bytes`; ValueError naming the first
        problem for anything else (wrong length, magic, version, or a field out of range)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"an IPC handle is bytes, got {type(data).__name__}")
        raw = bytes(data)
        if len(raw) < _FIXED.size:
            raise ValueError(f"IPC handle: {len(raw)} bytes is shorter than the "
                             f"{_FIXED.size}-byte header")
        (magic, version, ndim, pid, uuid, mem, event, offset, segment, token,
         dtype_name) = _FIXED.unpack_from(raw)
        if magic != MAGIC:
            raise ValueError("IPC handle: not a gpurt IPC handle (bad magic)")
        if version != VERSION:
            raise ValueError(f"IPC handle: version {version}; this gpurt reads version "
                             f"{VERSION}")
        if ndim > MAX_NDIM:
            raise ValueError(f"IPC handle: {ndim} dimensions, at most {MAX_NDIM}")
        expected = _FIXED.size + 16 * ndim
        if len(raw) != expected:
            raise ValueError(f"IPC handle: {len(raw)} bytes; a {ndim}-d handle has {expected}")
        dims = struct.unpack_from(f"<{2 * ndim}q", raw, _FIXED.size)
        name = _ascii(dtype_name)
        dtype = _DTYPES.get(name)
        if dtype is None:
            raise ValueError(f"IPC handle: unsupported dtype {name or dtype_name!r}")
        return cls(uuid, mem, event, offset, segment, tuple(dims[:ndim]), tuple(dims[ndim:]),
                   dtype, pid, token)

    def __reduce__(self) -> Any:
        # by value, and back through from_bytes: the receiver validates what it gets
        return (IpcHandle.from_bytes, (self.to_bytes(),))


def _ascii(field: bytes) -> str:
    try:
        return field.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        return ""


def _check_bytes(name: str, value: Any, size: int) -> None:
    if not isinstance(value, bytes) or len(value) != size:
        raise ValueError(f"IPC handle: {name} must be {size} bytes")


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    """``lo <= value <= hi`` for a plain int (bool refused)."""
    if type(value) is not int or not lo <= value <= hi:
        raise ValueError(f"IPC handle: {name}={value!r} is outside [{lo}, {hi}]")


def _check_layout(shape: Any, strides: Any, itemsize: int) -> None:
    if not isinstance(shape, tuple) or not isinstance(strides, tuple):
        raise ValueError("IPC handle: shape and strides must be tuples")
    if len(shape) != len(strides) or len(shape) > MAX_NDIM:
        raise ValueError(f"IPC handle: shape {shape} and strides {strides} do not match "
                         f"(at most {MAX_NDIM} dimensions)")
    for dim, stride in zip(shape, strides):
        _check_int("a dimension", dim, 0, MAX_BYTES)
        _check_int("a stride", stride, -MAX_BYTES, MAX_BYTES)
        if stride % itemsize:
            raise ValueError(f"IPC handle: stride {stride} is not a multiple of the item "
                             f"size {itemsize}")
