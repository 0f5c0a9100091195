"""Device arrays: a strided ndarray over one device allocation, host<->device copies, and
zero-copy interop through ``__cuda_array_interface__`` (v3) and DLPack, both ways.

An :class:`Array` is metadata (``ptr``, ``shape``, byte ``strides``, numpy ``dtype``,
``device``, the ``stream`` it was made on) plus a reference to what owns its memory: a
small owner object whose death returns the block to the caching allocator
(``gpurt.memory``), the foreign array it views, or a consumed DLPack tensor. Views share
the owner, so memory lives exactly as long as the last array that uses it.

Copies are stream ordered on the destination array's stream (the source array's stream
is made to wait first when it differs) and go through ``cuMemcpy*Async``; a copy that
involves host memory waits for completion unless ``non_blocking=True`` (truly
asynchronous when the host buffer is pinned; the driver makes pageable copies safe).
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator

import numpy as np
from cuda.bindings import driver as cu

from . import _dlpack, _driver, _layout, memory, streams
from ._dlpack import DLDeviceType
from ._driver import check
from .device import Device, DeviceLike, _index, bind_context, current_device

__all__ = [
    "Array",
    "empty",
    "zeros",
    "full",
    "empty_like",
    "zeros_like",
    "full_like",
    "asarray",
    "from_numpy",
    "from_dlpack",
    "bool_",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]

# ---- dtypes ----------------------------------------------------------------------------

(bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64,
 float16, float32, float64, bfloat16, complex64, complex128) = _dlpack.SUPPORTED_DTYPES

# Every spelling seen so far -> numpy dtype; the hot path is one dict lookup.
_DTYPES: dict[Any, np.dtype] = {float: float64, int: int64, bool: bool_, complex: complex128}
for _dt in _dlpack.SUPPORTED_DTYPES:
    _DTYPES[_dt] = _DTYPES[_dt.type] = _DTYPES[_dt.name] = _dt
_DTYPES["<V2"] = bfloat16  # ml_dtypes' and torch's __cuda_array_interface__ typestr for bf16


def _as_dtype(dtype: Any) -> np.dtype:
    """A supported numpy dtype from a numpy dtype/type, a name, or a torch dtype."""
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        pass
    name = str(dtype)
    if name.startswith("torch."):  # torch.float32 -> float32 without importing torch
        resolved = _DTYPES.get(name[6:])
    else:
        try:
            resolved = _DTYPES.get(np.dtype(dtype))
        except TypeError:
            resolved = None
    if resolved is None:
        names = ", ".join(dt.name for dt in _dlpack.SUPPORTED_DTYPES)
        raise TypeError(f"unsupported dtype {dtype!r}; gpurt arrays hold one of: {names}")
    try:
        _DTYPES[dtype] = resolved
    except TypeError:  # unhashable spelling: fine, just not cached
        pass
    return resolved


# ---- ownership -------------------------------------------------------------------------


class _Owner:
    """What every array over one allocation holds (the base and all its views); when
    the last of them dies, the owner's finalizer releases the memory."""

    __slots__ = ("__weakref__",)


class _Finalizer(weakref.ref):
    """A weak reference to an :class:`_Owner` that calls ``release(arg)`` when the owner
    dies: weakref.finalize's mechanism at a third of its cost, because every
    ``gpurt.empty`` pays it. The registry keeps it alive until it has run."""

    __slots__ = ("release", "arg")


_finalizers: set[_Finalizer] = set()


def _finalize(ref: _Finalizer, _discard: Any = _finalizers.discard) -> None:
    _discard(ref)
    try:
        ref.release(ref.arg)
    except BaseException:  # finalizers never raise into whatever code dropped the array
        pass


def _new_owner(release: Any, arg: Any) -> _Owner:
    owner = _Owner()
    ref = _Finalizer(owner, _finalize)
    ref.release = release
    ref.arg = arg
    _finalizers.add(ref)
    return owner


_devices: dict[int, Device] = {}


def _device(index: int) -> Device:
    device = _devices.get(index)
    if device is None:
        device = _devices[index] = Device(index)
    return device


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
                     self._owner,
                     _layout.is_contiguous(shape, strides, self.dtype.itemsize))

    def __getitem__(self, key: Any) -> Array:
        """Basic indexing (ints, slices with steps, ``...``, ``None``): a view, no copy."""
        return self._view(*_layout.basic_index(self.shape, self.strides, key))

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
        if len(args) == 1 and not isinstance(args[0], (int, tuple, list)):
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
        return _make(self.ptr, shape, strides, dtype, self.device, self.stream, self._owner,
                     self._contiguous)

    def transpose(self, *axes: Any) -> Array:
        """A view with the axes permuted (reversed when none are given), like numpy."""
        perm = _layout.transpose_axes(self.ndim, axes)
        return self._view(0, tuple(self.shape[a] for a in perm),
                          tuple(self.strides[a] for a in perm))

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

    # -- copies --------------------------------------------------------------------------

    def copy_(self, src: Any, non_blocking: bool = False) -> Array:
        """Copy ``src`` into this array, in place, on this array's stream; ``src`` is an
        Array, a foreign device array (read zero-copy), host data (numpy array, list) or
        a scalar. Dtypes and shapes must match (no casting on the device). Host copies
        are synchronous unless ``non_blocking`` (keep the host buffer alive and
        unchanged until the stream has passed the copy)."""
        if isinstance(src, Array):
            _copy_device(self, src)
            return self
        if isinstance(src, (int, float, complex, np.generic)):
            return self.fill_(src)
        device_src = _device_view(src, None)
        if device_src is not None:
            _copy_device(self, device_src)
            return self
        if isinstance(src, np.ndarray):
            host = src
        else:
            host = np.asarray(src, dtype=self.dtype)
        _check_match(self, host.dtype, host.shape, "copy_")
        if not host.flags.c_contiguous:
            host = np.ascontiguousarray(host)
        _host_copy(self, host, to_device=True, non_blocking=non_blocking)
        return self

    def to_numpy(self, out: np.ndarray | None = None, non_blocking: bool = False) -> np.ndarray:
        """Copy to host memory (``out`` if given: same shape and dtype) and return it.
        Synchronous unless ``non_blocking`` and ``out`` is C-contiguous, in which case the
        data is there once the array's stream is synchronized."""
        if out is None:
            target = out = np.empty(self.shape, self.dtype)
        else:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
            _check_match(self, out.dtype, out.shape, "to_numpy")
            if not out.flags.writeable:
                raise ValueError("to_numpy: out is read-only")
            target = out if out.flags.c_contiguous else np.empty(self.shape, self.dtype)
        _host_copy(self, target, to_device=False,
                   non_blocking=non_blocking and target is out)
        if target is not out:
            out[...] = target
        return out

    def numpy(self) -> np.ndarray:
        """A host copy as a numpy array (torch's name; synchronous)."""
        return self.to_numpy()

    def item(self) -> Any:
        """The single element as a Python scalar (a synchronous copy)."""
        if self.size != 1:
            raise ValueError(f"item() needs an array with one element, this one has {self.size}")
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
        _memset(self.ptr, pattern, self.size, self.stream.cuda_stream)
        return self

    def zero_(self) -> Array:
        return self.fill_(0)

    def record_stream(self, stream: Any) -> None:
        """Mark the memory as used by ``stream``: the allocator will not reuse it before
        the work queued there when it is freed has finished (torch's record_stream)."""
        memory.record_stream(self, stream)

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

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
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


def _make(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype,
          device: Device, stream: Any, owner: Any, contiguous: bool) -> Array:
    """The one constructor: fills the slots, validates nothing (callers did)."""
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


def _contiguous_layout(shape: Any, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, strides, nbytes) of a new C-contiguous array; an int or a 1-2-d tuple of
    plain ints takes a short path."""
    kind = type(shape)
    if kind is int:
        if shape >= 0:
            return (shape,), (itemsize,), shape * itemsize
    elif kind is tuple:
        rank = len(shape)
        if rank == 2:
            rows, cols = shape
            if type(rows) is int and type(cols) is int and rows >= 0 and cols >= 0:
                return shape, (cols * itemsize, itemsize), rows * cols * itemsize
        elif rank == 1:
            (count,) = shape
            if type(count) is int and count >= 0:
                return shape, (itemsize,), count * itemsize
    dims = _layout.normalize_shape(shape)
    return dims, _layout.contiguous_strides(dims, itemsize), _layout.prod(dims) * itemsize


def _target(device: DeviceLike, stream: Any) -> tuple[int, Any]:
    """(device index, stream) for a new array: the stream's device, the given device's
    current stream, or the current device and stream."""
    if stream is None:
        if device is None:
            stream = streams.current_stream()
            return stream.device_index, stream
        index = _index(device)
        return index, streams.current_stream(index)
    index = stream.device_index
    if device is not None and _index(device) != index:
        raise ValueError(f"stream {stream!r} belongs to cuda:{index}, not to device {device!r}")
    return index, stream


def empty(shape: Any, dtype: Any = float32, device: DeviceLike = None, stream: Any = None) -> Array:
    """A new uninitialised C-contiguous array from the caching allocator, on ``device``
    (default: current) and ``stream`` (default: that device's current stream)."""
    try:
        dt = _DTYPES[dtype]
    except (KeyError, TypeError):
        dt = _as_dtype(dtype)
    dims, strides, nbytes = _contiguous_layout(shape, dt.itemsize)
    if stream is None and device is None:
        stream = streams.current_stream()
        index = stream.device_index
    else:
        index, stream = _target(device, stream)
    if nbytes:
        ptr = memory.caching_allocator_alloc(nbytes, index, stream)
        owner: Any = _new_owner(memory.caching_allocator_delete, ptr)
    else:
        ptr, owner = 0, None
    return _make(ptr, dims, strides, dt, _devices.get(index) or _device(index), stream, owner,
                 True)


def zeros(shape: Any, dtype: Any = float32, device: DeviceLike = None, stream: Any = None) -> Array:
    """A new array of zeros (cuMemsetD8Async on its stream)."""
    array = empty(shape, dtype, device, stream)
    if array.ptr:
        bind_context(array.device.index)
        check(cu.cuMemsetD8Async(array.ptr, 0, array.nbytes, array.stream.cuda_stream),
              "cuMemsetD8Async")
    return array


def _scalar_dtype(value: Any) -> np.dtype:
    """torch's default dtype for a fill value: bool, int64, float32 or complex64."""
    if isinstance(value, np.generic):
        return _as_dtype(value.dtype)
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    if isinstance(value, complex):
        return complex64
    return float32


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
    (``__cuda_array_interface__`` or DLPack), or a device copy of host data. ``copy=True``
    always copies; ``copy=False`` refuses host data, which must be copied."""
    wanted = None if dtype is None else _as_dtype(dtype)
    array = obj if isinstance(obj, Array) else _device_view(obj, stream)
    if array is not None:
        if wanted is not None and wanted != array.dtype:
            raise TypeError(
                f"asarray: the device array is {array.dtype.name}, not {wanted.name}; "
                "gpurt does not convert dtypes on the device"
            )
        if device is not None and _index(device) != array.device.index:
            raise ValueError(
                f"asarray: the array lives on {array.device}, not on device {device!r} "
                "(cross-device copies are not supported here)"
            )
        return array.clone() if copy else array
    if copy is False:
        raise ValueError(
            f"asarray(copy=False): {type(obj).__name__} is host data; it must be copied to "
            "the device (a CUDA array exposes __cuda_array_interface__ or __dlpack__)"
        )
    host = np.asarray(obj, dtype=wanted)
    return empty(host.shape, host.dtype, device, stream).copy_(host)


# ---- importing foreign device arrays ---------------------------------------------------


def _device_view(obj: Any, stream: Any) -> Array | None:
    """A zero-copy Array over a foreign device array, or None when ``obj`` is host data."""
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception:
        if not hasattr(obj, "__dlpack__"):
            raise
        cai = None  # e.g. a dtype the producer cannot describe here: DLPack may
    if cai is not None:
        return _from_cuda_array_interface(obj, cai, stream)
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None and hasattr(obj, "__dlpack__"):
        if int(dlpack_device()[0]) == DLDeviceType.kDLCUDA:
            return from_dlpack(obj, stream=stream)
    return None


def _pointer_device(ptr: int) -> int:
    """Ordinal of the device that owns ``ptr``; TypeError for host memory."""
    _driver.init()
    attr = cu.CUpointer_attribute
    err, kind = cu.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    # An error here means the driver does not know the address: it is not CUDA memory.
    if int(err) != 0 or int(kind) == int(cu.CUmemorytype.CU_MEMORYTYPE_HOST):
        where = "host memory" if int(err) == 0 else "not memory the CUDA driver knows"
        raise TypeError(f"address {ptr:#x} is {where}; a device array is needed here")
    return int(check(cu.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
                     "cuPointerGetAttribute"))


def _from_cuda_array_interface(obj: Any, cai: dict[str, Any], stream: Any) -> Array:
    """Zero-copy view of a CUDA Array Interface producer (kept alive by the view); our
    stream waits for the producer's ``stream`` (v3) before anything uses the data."""
    if cai.get("mask") is not None:
        raise ValueError("masked arrays (a 'mask' in __cuda_array_interface__) are not supported")
    shape = _layout.normalize_shape(cai["shape"])
    dtype = _as_dtype(cai["typestr"])
    ptr = int(cai["data"][0] or 0)
    raw_strides = cai.get("strides")
    if raw_strides is None:
        strides = _layout.contiguous_strides(shape, dtype.itemsize)
    else:
        strides = tuple(int(s) for s in raw_strides)
        if len(strides) != len(shape):
            raise ValueError(f"__cuda_array_interface__ strides {strides} do not match {shape}")
    if ptr:
        index = _pointer_device(ptr)
        if stream is not None and stream.device_index != index:
            raise ValueError(f"the array lives on cuda:{index}, the stream on another device")
        if stream is None:
            stream = streams.current_stream(index)
    else:
        index, stream = _target(None, stream)
    producer = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    if producer is not None:
        if int(producer) == 0:
            raise ValueError("__cuda_array_interface__ stream 0 is not allowed (1 means the "
                             "legacy default stream)")
        _wait_for(index, stream.cuda_stream, int(producer))
    return _make(ptr, shape, strides, dtype, _device(index), stream, obj,
                 _layout.is_contiguous(shape, strides, dtype.itemsize))


def from_dlpack(obj: Any, *, device: DeviceLike = None, copy: bool | None = None,
                stream: Any = None) -> Array:
    """Zero-copy Array over a DLPack producer's CUDA memory (anything with ``__dlpack__``,
    or a capsule). The producer makes our stream wait for its work; its memory is
    released through its deleter when the last view dies. ``copy=True`` copies."""
    if type(obj).__name__ == "PyCapsule":
        imported = _dlpack.consume_capsule(obj)
    else:
        if not hasattr(obj, "__dlpack__"):
            raise TypeError(f"{type(obj).__name__} does not support DLPack (no __dlpack__)")
        dev_type, dev_id = (int(x) for x in obj.__dlpack_device__())
        if dev_type != DLDeviceType.kDLCUDA:
            raise TypeError(
                f"from_dlpack needs a CUDA device array; this {type(obj).__name__} is on "
                f"{_dlpack.device_type_name(dev_type)} (use gpurt.asarray to copy host data)"
            )
        if stream is None:
            stream = streams.current_stream(dev_id)
        elif stream.device_index != dev_id:
            raise ValueError(f"the array lives on cuda:{dev_id}, the stream on another device")
        handle = stream.cuda_stream or 1  # 1: the legacy default stream in DLPack terms
        try:
            capsule = obj.__dlpack__(stream=handle, max_version=_dlpack.VERSION)
        except TypeError:  # a producer older than DLPack 1.0's keywords
            capsule = obj.__dlpack__(stream=handle)
        imported = _dlpack.consume_capsule(capsule)
    try:
        array = _from_imported(imported, stream)
    except BaseException:
        imported.release()
        raise
    if device is not None and _index(device) != array.device.index:
        raise ValueError(f"the array lives on {array.device}, not on device {device!r}")
    return array.clone() if copy else array


def _from_imported(imported: _dlpack.Imported, stream: Any) -> Array:
    if imported.device_type != DLDeviceType.kDLCUDA:
        raise TypeError(
            "from_dlpack needs a CUDA device tensor; this one is on "
            f"{_dlpack.device_type_name(imported.device_type)}"
        )
    index = imported.device_id
    if stream is None:
        stream = streams.current_stream(index)
    owner = _new_owner(_dlpack.Imported.release, imported)
    return _make(imported.data, imported.shape, imported.strides, imported.dtype,
                 _device(index), stream, owner,
                 _layout.is_contiguous(imported.shape, imported.strides, imported.dtype.itemsize))


# ---- driver work -----------------------------------------------------------------------


def _wait_for(index: int, consumer: int, producer: int) -> None:
    """Make stream ``consumer`` wait for the work queued so far on ``producer`` (raw
    handles; 0 and 1 both mean the legacy default stream): an event recorded on the
    producer and waited on by the consumer (cuEventRecord + cuStreamWaitEvent)."""
    if consumer == producer or (consumer <= 1 and producer <= 1):
        return
    bind_context(index)
    flags = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    event = check(cu.cuEventCreate(flags), "cuEventCreate")
    try:
        check(cu.cuEventRecord(event, producer), "cuEventRecord")
        check(cu.cuStreamWaitEvent(consumer, event, 0), "cuStreamWaitEvent")
    finally:
        check(cu.cuEventDestroy(event), "cuEventDestroy")


def _check_match(dst: Array, dtype: np.dtype, shape: tuple[int, ...], what: str) -> None:
    if dtype != dst.dtype:
        raise TypeError(
            f"{what}: dtype mismatch: the array is {dst.dtype.name}, the other side is "
            f"{np.dtype(dtype).name} (gpurt does not convert dtypes on the device)"
        )
    if tuple(shape) != dst.shape:
        raise ValueError(f"{what}: shape mismatch: the array is {dst.shape}, "
                         f"the other side is {tuple(shape)}")


_MT_HOST = cu.CUmemorytype.CU_MEMORYTYPE_HOST
_MT_DEVICE = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE


def _run_copies(copies: list[_layout.Copy], dst: int, dst_device: bool, src: int,
                src_device: bool, stream: int) -> None:
    """Issue planned copies: cuMemcpy{HtoD,DtoH,DtoD}Async rows, cuMemcpy2DAsync blocks."""
    for c in copies:
        d, s = dst + c.dst_offset, src + c.src_offset
        if c.height == 1:
            if dst_device and src_device:
                check(cu.cuMemcpyDtoDAsync(d, s, c.width, stream), "cuMemcpyDtoDAsync")
            elif dst_device:
                check(cu.cuMemcpyHtoDAsync(d, s, c.width, stream), "cuMemcpyHtoDAsync")
            else:
                check(cu.cuMemcpyDtoHAsync(d, s, c.width, stream), "cuMemcpyDtoHAsync")
            continue
        params = cu.CUDA_MEMCPY2D()
        if src_device:
            params.srcMemoryType, params.srcDevice = _MT_DEVICE, s
        else:
            params.srcMemoryType, params.srcHost = _MT_HOST, s
        if dst_device:
            params.dstMemoryType, params.dstDevice = _MT_DEVICE, d
        else:
            params.dstMemoryType, params.dstHost = _MT_HOST, d
        params.srcPitch, params.dstPitch = c.src_pitch, c.dst_pitch
        params.WidthInBytes, params.Height = c.width, c.height
        check(cu.cuMemcpy2DAsync(params, stream), "cuMemcpy2DAsync")


def _copy_device(dst: Array, src: Array) -> None:
    """Device-to-device copy on ``dst``'s stream, after ``src``'s stream."""
    _check_match(dst, src.dtype, src.shape, "copy_")
    index = dst.device.index
    if src.device.index != index:
        raise ValueError(f"copy_: the arrays live on different devices ({src.device} -> "
                         f"{dst.device}); cross-device copies are not supported here")
    if not dst.ptr or not src.size:
        return
    if src._owner is dst._owner and _overlap(dst, src):
        src = src.clone()
    stream = dst.stream.cuda_stream
    _wait_for(index, stream, src.stream.cuda_stream)
    bind_context(index)
    if dst._contiguous and src._contiguous:
        check(cu.cuMemcpyDtoDAsync(dst.ptr, src.ptr, dst.nbytes, stream), "cuMemcpyDtoDAsync")
    else:
        copies = _layout.plan_copy(dst.shape, dst.strides, src.strides, dst.itemsize)
        _run_copies(copies, dst.ptr, True, src.ptr, True, stream)


def _overlap(a: Array, b: Array) -> bool:
    a_lo, a_hi = _layout.byte_extent(a.shape, a.strides, a.itemsize)
    b_lo, b_hi = _layout.byte_extent(b.shape, b.strides, b.itemsize)
    return a.ptr + a_lo < b.ptr + b_hi and b.ptr + b_lo < a.ptr + a_hi


def _host_copy(array: Array, host: np.ndarray, to_device: bool, non_blocking: bool) -> None:
    """Copy between ``array`` and the C-contiguous ``host`` buffer on the array's stream;
    waits for it unless ``non_blocking``."""
    if not array.size:
        return
    bind_context(array.device.index)
    stream = array.stream.cuda_stream
    host_ptr = host.ctypes.data
    if array._contiguous:
        if to_device:
            check(cu.cuMemcpyHtoDAsync(array.ptr, host_ptr, array.nbytes, stream),
                  "cuMemcpyHtoDAsync")
        else:
            check(cu.cuMemcpyDtoHAsync(host_ptr, array.ptr, array.nbytes, stream),
                  "cuMemcpyDtoHAsync")
    elif to_device:
        copies = _layout.plan_copy(array.shape, array.strides, host.strides, array.itemsize)
        _run_copies(copies, array.ptr, True, host_ptr, False, stream)
    else:
        copies = _layout.plan_copy(array.shape, host.strides, array.strides, array.itemsize)
        _run_copies(copies, host_ptr, False, array.ptr, True, stream)
    if not non_blocking:
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")


def _memset(ptr: int, pattern: bytes, count: int, stream: int) -> None:
    """Fill ``count`` contiguous items with the item bytes ``pattern``, using the widest
    unit the pattern repeats in (8/16/32 bits) or one pitched 32-bit memset per word."""
    size = len(pattern)
    if pattern == pattern[:1] * size:
        check(cu.cuMemsetD8Async(ptr, pattern[0], count * size, stream), "cuMemsetD8Async")
    elif size % 2 == 0 and pattern == pattern[:2] * (size // 2):
        value = int.from_bytes(pattern[:2], "little")
        check(cu.cuMemsetD16Async(ptr, value, count * size // 2, stream), "cuMemsetD16Async")
    elif size % 4 == 0 and pattern == pattern[:4] * (size // 4):
        value = int.from_bytes(pattern[:4], "little")
        check(cu.cuMemsetD32Async(ptr, value, count * size // 4, stream), "cuMemsetD32Async")
    else:  # 8- or 16-byte items: word w of every item, items ``size`` bytes apart
        for word in range(size // 4):
            value = int.from_bytes(pattern[4 * word: 4 * word + 4], "little")
            check(cu.cuMemsetD2D32Async(ptr + 4 * word, size, value, 1, count, stream),
                  "cuMemsetD2D32Async")
