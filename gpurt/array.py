"""Device arrays: a strided ndarray over one device allocation, host<->device copies, and
zero-copy interop through ``__cuda_array_interface__`` (v3) and DLPack, both ways.

An :class:`Array` is metadata (``ptr``, ``shape``, byte ``strides``, numpy ``dtype``,
``device``, the ``stream`` it was made on) plus a reference to what keeps its memory
alive. The array that allocated or imported the memory is its owner: its death returns
the block to the caching allocator (``gpurt.memory``) or releases the consumed DLPack
tensor; views hold the owner (or the foreign CAI array), so memory lives exactly as long
as the last array over it (gpurt/_array/ownership.py).

Copies are stream ordered on the destination array's stream (the source array's stream
is made to wait first when it differs) and go through ``cuMemcpy*Async``; a copy that
involves host memory waits for completion unless ``non_blocking=True`` (truly
asynchronous when the host buffer is pinned; the driver makes pageable copies safe).
The copies themselves are gpurt/_array/arraycopy.py.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import memory
from ._array import copies as _copy
from ._array import dlpack as _dlpack
from ._array import dtypes as _dtypes
from ._array import interop as _interop
from ._array import layout as _layout
from ._array.arraycopy import _check_match, _copy_device, _host_copy, _wait_for
from ._array.dlpack import DLDeviceType
from ._array.dtypes import *  # noqa: F403 (the dtype names, re-exported below)
from ._array.dtypes import CACHE as _DTYPES
from ._array.dtypes import as_dtype as _as_dtype
from ._array.ownership import FINALIZERS as _finalizers
from ._array.ownership import (
    device_object,
    own_import,
    owner_of,
    place,
    place_on,
    remember_current_place,
)
from ._core.captures import CAPTURES
from ._core.state import current_place
from .device import Device, DeviceLike, _index, bind_context

__all__ = [
    "Array", "empty", "zeros", "full", "empty_like", "zeros_like", "full_like", "asarray",
    "from_numpy", "from_dlpack", *_dtypes.__all__,
]

# ---- the array -------------------------------------------------------------------------


class Array:
    """A strided n-dimensional array in device memory (numpy's conventions: ``strides``
    in bytes, C order by default). Made by :func:`empty`, :func:`zeros`, :func:`full`,
    :func:`asarray`, :func:`from_numpy`, :func:`from_dlpack` and by slicing."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "stream", "_owner",
                 "_contiguous", "__weakref__")

    ptr: int  # address of element 0: what kernels receive
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    device: Device
    stream: Any  # gpurt.Stream
    _owner: Any  # None for the owner itself; views hold the owner (or the CAI producer)
    _contiguous: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "gpurt.Array is not built directly: use gpurt.empty/zeros/full/asarray/"
            "from_numpy/from_dlpack"
        )

    # -- metadata ----------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return _layout.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return _layout.prod(self.shape) * self.dtype.itemsize

    def data_ptr(self) -> int:
        """Address of element 0 (torch's name)."""
        return self.ptr

    def is_contiguous(self) -> bool:
        """True when the array is C-contiguous."""
        return self._contiguous

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"gpurt.Array(shape={self.shape}, dtype={self.dtype.name}, "
                f"device='{self.device}', ptr={self.ptr:#x})")

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "gpurt.Array lives in device memory and is not converted implicitly; "
            "call .numpy() for a host copy"
        )

    def __reduce__(self) -> Any:
        raise TypeError("device arrays cannot be pickled; pickle arr.numpy() instead")

    # -- views ---------------------------------------------------------------------------

    def _view(self, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> Array:
        return _make(self.ptr + offset, shape, strides, self.dtype, self.device, self.stream,
                     owner_of(self), _layout.is_contiguous(shape, strides, self.dtype.itemsize))

    def __getitem__(self, key: Any) -> Array:
        """Basic indexing (ints, slices with steps, ``...``, ``None``): a view, no copy."""
        shape, strides = self.shape, self.strides
        if shape and self._contiguous:  # a row or a block of rows stays contiguous
            kind = type(key)
            if kind is int and -shape[0] <= key < shape[0]:
                offset = (key + shape[0] if key < 0 else key) * strides[0]
                return _make(self.ptr + offset, shape[1:], strides[1:], self.dtype,
                             self.device, self.stream, owner_of(self), True)
            if kind is slice and key.step is None:
                start, stop, _ = key.indices(shape[0])
                if stop > start:
                    return _make(self.ptr + start * strides[0], (stop - start,) + shape[1:],
                                 strides, self.dtype, self.device, self.stream,
                                 owner_of(self), True)
        return self._view(*_layout.basic_index(shape, strides, key))

    def __setitem__(self, key: Any, value: Any) -> None:
        target = self[key]
        if isinstance(value, (int, float, complex, np.generic)):
            target.fill_(value)
        else:
            target.copy_(value)

    def __iter__(self) -> Iterator[Array]:
        for i in range(len(self)):
            yield self[i]

    def reshape(self, *shape: Any) -> Array:
        """Same data, new shape (one ``-1`` allowed); a view when the array is
        contiguous, else a contiguous copy (torch's rule)."""
        newshape = _layout.infer_reshape(self.size, shape)
        source = self if self._contiguous else self.clone()
        return source._view(0, newshape, _layout.contiguous_strides(newshape, self.itemsize))

    def view(self, *args: Any) -> Array:
        """``view(*shape)``: a reshaped view of a contiguous array (never copies);
        ``view(dtype)``: the same bytes as another dtype (the last dimension rescales
        when the item sizes differ)."""
        if len(args) == 1 and not isinstance(args[0], (numbers.Integral, tuple, list)):
            return self._view_as_dtype(_as_dtype(args[0]))
        if not self._contiguous:
            raise ValueError(
                f"view(shape) needs a contiguous array, this one has strides {self.strides}; "
                "use reshape() (which copies) or contiguous() first"
            )
        return self.reshape(*args)

    def _view_as_dtype(self, dtype: np.dtype) -> Array:
        old, new = self.itemsize, dtype.itemsize
        shape, strides = self.shape, self.strides
        if old != new:
            if not self._contiguous or not shape or (shape[-1] * old) % new:
                raise ValueError(
                    f"cannot view a {self.dtype.name} array of shape {shape} as {dtype.name}: "
                    "the last dimension must be contiguous and its bytes divisible by "
                    f"{new}"
                )
            shape = shape[:-1] + (shape[-1] * old // new,)
            strides = _layout.contiguous_strides(shape, new)
        return _make(self.ptr, shape, strides, dtype, self.device, self.stream, owner_of(self),
                     self._contiguous)

    def transpose(self, *axes: Any) -> Array:
        """A view with the axes permuted (reversed when none are given), like numpy."""
        shape, strides = self.shape, self.strides
        if not axes:
            return self._view(0, shape[::-1], strides[::-1])
        perm = _layout.transpose_axes(len(shape), axes)
        return self._view(0, tuple([shape[a] for a in perm]), tuple([strides[a] for a in perm]))

    @property
    def T(self) -> Array:
        return self.transpose()

    def contiguous(self) -> Array:
        """This array if it is C-contiguous, else a contiguous copy."""
        return self if self._contiguous else self.clone()

    def clone(self) -> Array:
        """A contiguous copy on the same device and stream."""
        out = empty(self.shape, self.dtype, self.device.index, self.stream)
        return out.copy_(self)

    def to(self, device: DeviceLike, stream: Any = None, copy: bool = False) -> Array:
        """This array on ``device`` (torch's ``tensor.to(device)``): itself if it is there
        already (unless ``copy``), else a contiguous copy made on ``stream`` (default: that
        device's current stream) after this array's stream."""
        index = _index(device)
        if index == self.device.index and not copy:
            return self
        return empty(self.shape, self.dtype, index, stream).copy_(self)

    # -- copies --------------------------------------------------------------------------

    def copy_(self, src: Any, non_blocking: bool = False) -> Array:
        """Copy ``src`` into this array, in place, on this array's stream; ``src`` is an
        Array, a foreign device array (read zero-copy), host data (numpy array, list) or
        a scalar. Dtypes and shapes must match (no casting on the device). Host copies
        are synchronous unless ``non_blocking`` (keep the host buffer alive and
        unchanged until the stream has passed the copy)."""
        kind = type(src)
        if kind is np.ndarray:  # host data, the commonest source: no foreign-array probes
            host = src
        elif isinstance(src, Array):
            _copy_device(self, src)
            return self
        elif isinstance(src, (int, float, complex, np.generic)):
            return self.fill_(src)
        else:
            device_src = _device_view(src, None)
            if device_src is not None:
                _copy_device(self, device_src)
                return self
            if hasattr(src, "dtype"):  # an array-like keeps its dtype, which must match
                host = np.asarray(src)
            else:  # a (nested) sequence of numbers becomes this array's dtype
                host = np.asarray(src, dtype=self.dtype)
        _check_match(self, host.dtype, host.shape, "copy_")
        if CAPTURES.threads:
            CAPTURES.refuse_host_access("Array.copy_() from host memory")
        if not host.flags.c_contiguous:
            host = np.ascontiguousarray(host)
        _host_copy(self, host, True, non_blocking)
        return self

    def to_numpy(self, out: np.ndarray | None = None, non_blocking: bool = False) -> np.ndarray:
        """Copy to host memory (``out`` if given: same shape and dtype) and return it.
        Synchronous unless ``non_blocking`` and ``out`` is C-contiguous, in which case the
        data is there once the array's stream is synchronized."""
        if CAPTURES.threads:
            CAPTURES.refuse_host_access("Array.to_numpy()")
        if out is None:
            target = out = np.empty(self.shape, self.dtype)
        else:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
            _check_match(self, out.dtype, out.shape, "to_numpy")
            flags = out.flags
            if not flags.writeable:
                raise ValueError("to_numpy: out is read-only")
            target = out if flags.c_contiguous else np.empty(self.shape, self.dtype)
        _host_copy(self, target, False, non_blocking and target is out)
        if target is not out:
            out[...] = target
        return out

    def numpy(self) -> np.ndarray:
        """A host copy as a numpy array (torch's name; synchronous)."""
        if CAPTURES.threads:
            CAPTURES.refuse_host_access("Array.numpy()")
        return self.to_numpy()

    def item(self) -> Any:
        """The single element as a Python scalar (a synchronous copy)."""
        if self.size != 1:
            raise ValueError(f"item() needs an array with one element, this one has {self.size}")
        if CAPTURES.threads:
            CAPTURES.refuse_host_access("Array.item()")
        return self.to_numpy().reshape(()).item()

    def fill_(self, value: Any) -> Array:
        """Set every element to ``value`` (cuMemsetD8/D16/D32Async on the array's
        stream; 8- and 16-byte patterns as pitched 32-bit memsets)."""
        pattern = np.asarray(value, dtype=self.dtype).tobytes()
        if not self.size:
            return self
        if not self._contiguous:
            return self.copy_(full(self.shape, value, self.dtype, self.device.index, self.stream))
        bind_context(self.device.index)
        _copy.fill(self.ptr, pattern, self.size, self.stream.cuda_stream)
        return self

    def zero_(self) -> Array:
        return self.fill_(0)

    def record_stream(self, stream: Any) -> None:
        """Mark the memory as used by ``stream``: the allocator will not reuse it before
        the work queued there when it is freed has finished (torch's record_stream)."""
        memory.record_stream_at(self.ptr, self.device.index, stream)

    # -- interop -------------------------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3: a zero-copy description for CuPy, Numba, torch...
        ``stream`` is this array's stream (1 for the legacy default stream)."""
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None if self._contiguous else self.strides,
            "version": 3,
            "stream": self.stream.cuda_stream or 1,
        }

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        return (DLDeviceType.kDLCUDA, self.device.index)

    def __dlpack__(self, stream: int | None = None, *,
                   max_version: tuple[int, int] | None = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        """Export as a DLPack capsule (zero-copy unless ``copy``). ``stream`` is the
        consumer's stream: it is made to wait for this array's stream (None means the
        legacy default stream, -1 means no synchronisation)."""
        index = self.device.index
        if dl_device is not None:
            wanted = (int(dl_device[0]), int(dl_device[1]))
            if wanted != (DLDeviceType.kDLCUDA, index):
                raise BufferError(
                    f"this array lives on cuda:{index}; it cannot be exported to "
                    f"{_dlpack.device_type_name(wanted[0])} {wanted[1]} (use .numpy() for a "
                    "host copy)"
                )
        if stream is not None and (not isinstance(stream, int) or isinstance(stream, bool)):
            raise TypeError(f"stream must be an int or None, got {type(stream).__name__}")
        if stream == 0:
            raise ValueError("stream 0 is ambiguous in DLPack; use 1 for the legacy default stream")
        source = self.clone() if copy else self
        if stream != -1:
            _wait_for(index, 1 if stream is None else stream, source.stream.cuda_stream)
        versioned = max_version is not None and int(max_version[0]) >= 1
        return _dlpack.export_capsule(source.ptr, source.shape, source.strides, source.dtype,
                                      (DLDeviceType.kDLCUDA, index), source, versioned,
                                      copied=bool(copy))


_new = object.__new__
_ref = weakref.ref


def _make(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype,
          device: Device, stream: Any, owner: Any, contiguous: bool) -> Array:
    """The constructor: fills the slots, validates nothing (callers did). :func:`empty`
    repeats this body inline, on the hot path of every new array."""
    array = _new(Array)
    array.ptr = ptr
    array.shape = shape
    array.strides = strides
    array.dtype = dtype
    array.device = device
    array.stream = stream
    array._owner = owner
    array._contiguous = contiguous
    return array


# ---- factories -------------------------------------------------------------------------


def empty(shape: Any, dtype: Any = _dtypes.float32, device: DeviceLike = None,
          stream: Any = None) -> Array:
    """A new uninitialised C-contiguous array from the caching allocator, on ``device``
    (default: current) and ``stream`` (default: that device's current stream)."""
    try:
        dt = _DTYPES[dtype]
    except (KeyError, TypeError):
        dt = _as_dtype(dtype)
    itemsize = dt.itemsize
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    if type(shape) is int and shape >= 0:  # the commonest shapes, inlined: n and (m, n)
        dims, strides, nbytes = (shape,), (itemsize,), shape * itemsize
    elif type(shape) is tuple and len(shape) == 2 and type(shape[0]) is int \
            and type(shape[1]) is int and shape[0] >= 0 and shape[1] >= 0:
        dims, strides = shape, (shape[1] * itemsize, itemsize)
        nbytes = shape[0] * strides[0]
    else:
        dims, strides, nbytes = _layout.contiguous_layout(shape, itemsize)
    if stream is None:  # this thread's place, most often: its current device and stream
        where = current_place() if device is None else None
        if where is None:
            where = place(device)
    else:
        where = place_on(stream, device)
    _, handle, stream, on, malloc, release = where
    ptr = malloc(nbytes, handle) if nbytes else 0
    # _make's body, inlined: this is the hot path of every new array
    array = _new(Array)
    array.ptr = ptr
    array.shape = dims
    array.strides = strides
    array.dtype = dt
    array.device = on
    array.stream = stream
    array._owner = None
    array._contiguous = True
    if ptr:
        _finalizers[_ref(array, release)] = ptr
    return array


def zeros(shape: Any, dtype: Any = _dtypes.float32, device: DeviceLike = None,
          stream: Any = None) -> Array:
    """A new array of zeros (cuMemsetD8Async on its stream)."""
    array = empty(shape, dtype, device, stream)
    if array.ptr:
        bind_context(array.device.index)
        _copy.fill(array.ptr, b"\0", array.nbytes, array.stream.cuda_stream)
    return array


def _scalar_dtype(value: Any) -> np.dtype:
    """torch's default dtype for a fill value: bool, int64, float32 or complex64."""
    if isinstance(value, np.generic):
        return _as_dtype(value.dtype)
    if isinstance(value, bool):
        return _dtypes.bool_
    if isinstance(value, int):
        return _dtypes.int64
    if isinstance(value, complex):
        return _dtypes.complex64
    return _dtypes.float32


def full(shape: Any, fill_value: Any, dtype: Any = None, device: DeviceLike = None,
         stream: Any = None) -> Array:
    """A new array with every element ``fill_value`` (dtype inferred like torch)."""
    dt = _scalar_dtype(fill_value) if dtype is None else dtype
    return empty(shape, dt, device, stream).fill_(fill_value)


def _like_dtype_device(proto: Any, dtype: Any, device: DeviceLike) -> tuple[Any, DeviceLike]:
    dt = _as_dtype(proto.dtype) if dtype is None else dtype
    if device is None and isinstance(proto, Array):
        device = proto.device.index
    return dt, device


def empty_like(proto: Any, dtype: Any = None, device: DeviceLike = None,
               stream: Any = None) -> Array:
    """An uninitialised array with ``proto``'s shape and dtype (and device, for Arrays)."""
    dt, device = _like_dtype_device(proto, dtype, device)
    return empty(tuple(proto.shape), dt, device, stream)


def zeros_like(proto: Any, dtype: Any = None, device: DeviceLike = None,
               stream: Any = None) -> Array:
    """An array of zeros with ``proto``'s shape and dtype (and device, for Arrays)."""
    dt, device = _like_dtype_device(proto, dtype, device)
    return zeros(tuple(proto.shape), dt, device, stream)


def full_like(proto: Any, fill_value: Any, dtype: Any = None, device: DeviceLike = None,
              stream: Any = None) -> Array:
    """An array filled with ``fill_value``, with ``proto``'s shape and dtype."""
    dt, device = _like_dtype_device(proto, dtype, device)
    return full(tuple(proto.shape), fill_value, dt, device, stream)


def from_numpy(ndarray: np.ndarray, device: DeviceLike = None, stream: Any = None) -> Array:
    """A device copy of a numpy array (synchronous)."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(ndarray).__name__}")
    array = empty(ndarray.shape, ndarray.dtype, device, stream)
    return array.copy_(ndarray)


def asarray(obj: Any, dtype: Any = None, device: DeviceLike = None, stream: Any = None,
            copy: bool | None = None) -> Array:
    """An Array for ``obj``: the same Array, a zero-copy view of a foreign device array
    (``__cuda_array_interface__`` or DLPack), a copy on ``device`` of an array that lives
    on another, or a device copy of host data. ``copy=True`` always copies; ``copy=False``
    refuses what must be copied."""
    if stream is None and dtype is None and device is None and not copy:
        array = _interop.view(obj)  # a plain torch tensor, read in C: the hot path
        if array is not None:
            return array
    wanted = None if dtype is None else _as_dtype(dtype)
    array = obj if isinstance(obj, Array) else _device_view(obj, stream)
    if array is not None:
        if wanted is not None and wanted != array.dtype:
            raise TypeError(
                f"asarray: the device array is {array.dtype.name}, not {wanted.name}; "
                "gpurt does not convert dtypes on the device"
            )
        if device is not None and _index(device) != array.device.index:
            if copy is False:
                raise ValueError(f"asarray(copy=False): the array lives on {array.device}, "
                                 f"not on device {device!r}; a copy is needed")
            return array.to(device, stream)
        return array.clone() if copy else array
    if copy is False:
        raise ValueError(
            f"asarray(copy=False): {type(obj).__name__} is host data; it must be copied to "
            "the device (a CUDA array exposes __cuda_array_interface__ or __dlpack__)"
        )
    host = np.asarray(obj, dtype=wanted)
    return empty(host.shape, host.dtype, device, stream).copy_(host)


# ---- foreign device arrays -------------------------------------------------------------


def _wrap(foreign: _interop.Foreign) -> Array:
    """The root Array over a foreign array: it holds the CAI producer, or releases the
    consumed DLPack tensor when it dies."""
    array = _make(foreign.ptr, foreign.shape, foreign.strides, foreign.dtype,
                  device_object(foreign.device_index), foreign.stream, foreign.keep,
                  _layout.is_contiguous(foreign.shape, foreign.strides, foreign.dtype.itemsize))
    if foreign.imported is not None:
        own_import(array, foreign.imported)
    return array


def _device_view(obj: Any, stream: Any) -> Array | None:
    """A zero-copy Array over a foreign device array, or None when ``obj`` is host data."""
    fields = _interop.torch_fields(obj, stream)  # a plain torch tensor: the hot path
    if fields is not None:
        if current_place() is None:  # the next such tensor is read in C (_interop.view)
            remember_current_place()
        ptr, shape, strides, dtype, index, consumer, contiguous = fields
        return _make(ptr, shape, strides, dtype, device_object(index), consumer, obj,
                     contiguous)
    foreign = _interop.describe(obj, stream)
    return None if foreign is None else _wrap(foreign)


def from_dlpack(obj: Any, *, device: DeviceLike = None, copy: bool | None = None,
                stream: Any = None) -> Array:
    """Zero-copy Array over a DLPack producer's CUDA memory (anything with ``__dlpack__``,
    or a capsule). The producer orders its work before ``stream`` (default: the current
    stream); its deleter runs when the last view dies. ``copy=True`` copies. A plain torch
    tensor on the current device and stream is read in C instead (the Array its export would
    describe, holding the tensor), with no capsule."""
    if stream is None and device is None and not copy:
        array = _interop.view(obj)
        if array is not None:
            return array
    array = _wrap(_interop.from_dlpack(obj, stream))
    if device is not None and _index(device) != array.device.index:
        raise ValueError(f"the array lives on {array.device}, not on device {device!r}")
    return array.clone() if copy else array
