"""Reading foreign device arrays without copying: the consumer side of the CUDA Array
Interface (v3) and of DLPack. Each returns a :class:`Foreign` description that
gpurt.array wraps into an Array; the producer's work is ordered before our stream's
(the CAI ``stream`` field through an event, DLPack by handing the producer our stream).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import streams
from ..device import bind_context
from . import copies as _copy
from . import dlpack as _dlpack
from . import layout as _layout
from .dlpack import DLDeviceType
from .dtypes import as_dtype

__all__: list[str] = []  # internal module


class Foreign(NamedTuple):
    """A foreign device array as gpurt sees it; ``keep`` must stay alive as long as the
    memory is used (the CAI producer), or ``imported`` must be released once (DLPack)."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    device_index: int
    stream: Any  # the gpurt Stream that may use the data
    keep: Any
    imported: _dlpack.Imported | None


def describe(obj: Any, stream: Any) -> Foreign | None:
    """``obj`` as a foreign device array, or None when it is host data (gpurt.array tries
    :func:`torch_fields` first)."""
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception:
        if not hasattr(obj, "__dlpack__"):
            raise
        cai = None  # e.g. a dtype the producer cannot describe this way: DLPack may
    if cai is not None:
        return from_cuda_array_interface(obj, cai, stream)
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    on_cuda = dlpack_device is not None and int(dlpack_device()[0]) == DLDeviceType.kDLCUDA
    return from_dlpack(obj, stream) if on_cuda and hasattr(obj, "__dlpack__") else None


# ---- torch tensors: read from the tensor itself --------------------------------------------
# torch's __cuda_array_interface__ costs microseconds per call (and its DLPack export more);
# the tensor's own accessors say the same in a fraction of that. Only the plain case is taken
# here: a dense CUDA tensor of a dtype gpurt has, needing no gradient, whose producer stream
# (torch's current stream on its device) is the stream that will use it, so no ordering is
# needed; everything else goes the general way, with the same results and errors.

_torch: Any = None  # the torch module once it is imported by the user (never imported here)
_tensor_type: Any = None  # torch.Tensor, once seen
_strided: Any = None  # torch.strided
_raw_stream: Any = None  # torch._C._cuda_getCurrentRawStream (None where torch lacks it)
_torch_dtypes: dict[Any, np.dtype] = {}
_complex_dtypes: set[Any] = set()  # torch's complex dtypes (only those carry a conjugate bit)


def _no_view(obj: Any) -> Any:
    return None


# The compiled reader of torch tensors: gpurt._launch._claunch's Dispatcher, registered by the
# launch layer above (gpurt/_launch/planned.py) where the extension is built, and told torch's
# types here once the intake meets torch. ``view(obj)`` is then its view: the Array that
# gpurt.asarray makes of a plain CUDA torch tensor on the current device and stream, read in
# C (torch_fields' checks, in _claunch_torch.c), or None for anything else.
_reader: Any = None
view: Callable[[Any], Any] = _no_view


def use_reader(reader: Any) -> None:
    """Let ``reader`` (a Dispatcher) read torch tensors from now on, told torch's types now or
    when the intake first meets torch."""
    global _reader
    _reader = reader
    _tell_reader()


def torch_entries() -> dict[Any, tuple[int, int, np.dtype]]:
    """torch dtype -> (dtype.num, itemsize, numpy dtype) of the dtypes a reader takes (not the
    complex ones, which may carry a conjugate bit)."""
    return {t: (d.num, d.itemsize, d) for t, d in _torch_dtypes.items()
            if t not in _complex_dtypes}


def tell_torch(reader: Any) -> bool:
    """Give ``reader`` (a Dispatcher) torch's types once the intake has met torch: True, or
    False before that."""
    if _tensor_type is None or _raw_stream is None:
        return False
    reader.set_torch(_tensor_type, torch_entries(), _strided, _raw_stream)
    return True


def _tell_reader() -> None:
    global view
    if _reader is not None and tell_torch(_reader):
        view = _reader.view


def _torch_tensor_type() -> Any:
    global _torch, _tensor_type, _strided, _raw_stream
    if _torch is None:
        _torch = sys.modules.get("torch")
        if _torch is None or not hasattr(_torch, "Tensor"):
            _torch = None
            return None
        for name in ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32",
                     "int64", "uint8", "bool", "complex64", "complex128"):
            if hasattr(_torch, name):
                _torch_dtypes[getattr(_torch, name)] = as_dtype(name)
                if name.startswith("complex"):
                    _complex_dtypes.add(getattr(_torch, name))
        _strided = _torch.strided
        _raw_stream = getattr(_torch._C, "_cuda_getCurrentRawStream", None)
        _tensor_type = _torch.Tensor
        _tell_reader()
    return _tensor_type


def torch_fields(t: Any, stream: Any) -> tuple[Any, ...] | None:
    """(ptr, shape, strides, dtype, device index, consumer stream, contiguous) of a plain CUDA
    torch tensor, read from its own accessors; None for anything else (then the general way
    takes it). The hot path of every torch tensor handed to gpurt: the conjugate bit is read
    only for complex dtypes (the only ones torch sets it on), and byte strides come from a
    cache keyed by torch's element strides (a fifth of the time of multiplying them out,
    measured on a CPU with torch 2.13)."""
    if type(t) is not _tensor_type and (_tensor_type is not None
                                        or type(t) is not _torch_tensor_type()):
        return None
    torch_dtype = t.dtype
    dtype = _torch_dtypes.get(torch_dtype)
    if (dtype is None or not t.is_cuda or t.requires_grad or t.layout is not _strided
            or (torch_dtype in _complex_dtypes and t.is_conj()) or t.is_neg()
            or _raw_stream is None):
        return None
    index = t.get_device()
    consumer = streams.current_stream(index) if stream is None else \
        _consumer_stream(index, stream)
    if _raw_stream(index) != consumer.cuda_stream:
        return None
    shape = tuple(t.shape)
    stride = t.stride()
    try:
        strides = _byte_strides[stride, dtype.itemsize]
    except (KeyError, TypeError):  # a new layout (or strides that are not a tuple)
        strides = _remember_strides(stride, dtype.itemsize)
    ptr = t.data_ptr() if 0 not in shape else 0
    return ptr, shape, strides, dtype, index, consumer, t.is_contiguous()


_byte_strides: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}
_MAX_STRIDES = 1024  # layouts remembered; past that the cache starts afresh


def _remember_strides(stride: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """``stride`` (in elements of ``itemsize`` bytes) in bytes, remembered for the next call."""
    strides = tuple([int(s) * itemsize for s in stride])
    if len(_byte_strides) >= _MAX_STRIDES:
        _byte_strides.clear()
    _byte_strides[tuple(stride), itemsize] = strides
    return strides


def _from_torch(t: Any, stream: Any) -> Foreign | None:
    """A plain CUDA torch tensor read without its array interfaces, or None to go the
    general way."""
    fields = torch_fields(t, stream)
    if fields is None:
        return None
    ptr, shape, strides, dtype, index, consumer, _ = fields
    return Foreign(ptr, shape, strides, dtype, index, consumer, t, None)


def _consumer_stream(index: int, stream: Any) -> Any:
    """The stream that will use the data: ``stream`` (checked) or the current one."""
    if stream is None:
        return streams.current_stream(index)
    if stream.device_index != index:
        raise ValueError(
            f"the array lives on cuda:{index}, the stream on cuda:{stream.device_index}"
        )
    return stream


def from_cuda_array_interface(obj: Any, cai: dict[str, Any], stream: Any) -> Foreign:
    """Read a ``__cuda_array_interface__`` dict; our stream waits for the producer's
    ``stream`` (v3; None means no synchronisation is needed)."""
    if cai.get("mask") is not None:
        raise ValueError("masked arrays (a 'mask' in __cuda_array_interface__) are not supported")
    shape = _layout.normalize_shape(cai["shape"])
    dtype = as_dtype(cai["typestr"])
    ptr = int(cai["data"][0] or 0)
    raw_strides = cai.get("strides")
    if raw_strides is None:
        strides = _layout.contiguous_strides(shape, dtype.itemsize)
    else:
        strides = tuple(int(s) for s in raw_strides)
        if len(strides) != len(shape):
            raise ValueError(f"__cuda_array_interface__ strides {strides} do not match {shape}")
    if ptr:
        index = _copy.pointer_device(ptr)
        stream = _consumer_stream(index, stream)
    else:  # an empty array has no address, hence no device of its own
        stream = streams.current_stream() if stream is None else stream
        index = stream.device_index
    producer = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    if producer is not None:
        if int(producer) == 0:
            raise ValueError("__cuda_array_interface__ stream 0 is not allowed (1 means the "
                             "legacy default stream)")
        if int(producer) != stream.cuda_stream:
            bind_context(index)
            _copy.wait_for(index, stream.cuda_stream, int(producer))
    return Foreign(ptr, shape, strides, dtype, index, stream, obj, None)


def from_dlpack(obj: Any, stream: Any) -> Foreign:
    """Consume a DLPack producer (anything with ``__dlpack__``, or a capsule). We pass
    our stream so that the producer orders its work before it (DLPack's handshake)."""
    if type(obj).__name__ == "PyCapsule":
        imported = _dlpack.consume_capsule(obj)
    else:
        if not hasattr(obj, "__dlpack__"):
            raise TypeError(f"{type(obj).__name__} does not support DLPack (no __dlpack__)")
        dev_type, dev_id = obj.__dlpack_device__()
        dev_type, dev_id = int(dev_type), int(dev_id)
        if dev_type != DLDeviceType.kDLCUDA:
            raise TypeError(
                f"from_dlpack needs a CUDA device array; this {type(obj).__name__} is on "
                f"{_dlpack.device_type_name(dev_type)} (use gpurt.asarray to copy host data)"
            )
        stream = _consumer_stream(dev_id, stream)
        handle = stream.cuda_stream or 1  # 1: the legacy default stream in DLPack terms
        try:
            capsule = obj.__dlpack__(stream=handle, max_version=_dlpack.VERSION)
        except TypeError:  # a producer older than DLPack 1.0's keywords
            capsule = obj.__dlpack__(stream=handle)
        imported = _dlpack.consume_capsule(capsule)
    try:
        if imported.device_type != DLDeviceType.kDLCUDA:
            raise TypeError(
                "from_dlpack needs a CUDA device tensor; this one is on "
                f"{_dlpack.device_type_name(imported.device_type)}"
            )
        stream = _consumer_stream(imported.device_id, stream)
    except BaseException:
        imported.release()
        raise
    return Foreign(imported.data, imported.shape, imported.strides, imported.dtype,
                   imported.device_id, stream, None, imported)
