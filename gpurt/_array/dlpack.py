"""DLPack in ctypes: the C structs, dtype codes, and making / consuming capsules.

Producer side: :func:`export_capsule` builds a ``DLManagedTensor`` (capsule ``"dltensor"``)
or a ``DLManagedTensorVersioned`` (``"dltensor_versioned"``) around a pointer and keeps a
Python object (the array) alive until the consumer calls the deleter, or, for a capsule
nobody consumed, until the capsule itself dies. Consumer side: :func:`consume_capsule`
reads a capsule, renames it ``"used_..."`` as the protocol requires and returns an
:class:`Imported` whose ``release()`` calls the producer's deleter once.

No driver calls here; everything is exercised on a CPU with numpy's own DLPack support.
"""

from __future__ import annotations

import ctypes
import enum
import struct
from typing import Any

import numpy as np

from . import dtypes as _dtypes

__all__: list[str] = []  # internal module

VERSION = (1, 0)  # the struct layout we produce and understand (any 1.x)
FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1


class DLDeviceType(enum.IntEnum):
    """The DLPack device types gpurt names in messages."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLROCM = 10
    kDLROCMHost = 11
    kDLCUDAManaged = 13
    kDLOneAPI = 14


def device_type_name(code: int) -> str:
    try:
        return DLDeviceType(code).name
    except ValueError:
        return f"device type {code}"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    """Legacy (pre-1.0) managed tensor; ``deleter`` is ``void (*)(DLManagedTensor*)``."""

    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    """DLPack >= 1.0 managed tensor, with a version and flags in front."""

    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# The same structs as byte layouts (native alignment, checked against the classes above):
# a tensor is exported by packing one buffer and consumed by unpacking one, which costs a
# fraction of reading and writing ctypes fields one by one.
_TENSOR_FIELDS = "PiiiBBHPPQ"  # data, device (type, id), ndim, dtype (code, bits, lanes),
#                                shape, strides, byte_offset
_LEGACY = struct.Struct("@" + _TENSOR_FIELDS + "PP")  # ..., manager_ctx, deleter
_VERSIONED = struct.Struct("@IIPPQ" + _TENSOR_FIELDS)  # version, manager_ctx, deleter, flags
if (_LEGACY.size, _VERSIONED.size) != (ctypes.sizeof(DLManagedTensor),
                                        ctypes.sizeof(DLManagedTensorVersioned)):
    raise ImportError("gpurt's DLPack byte layouts do not match the C structs here")

_dims_layouts: dict[int, struct.Struct] = {}
_byte_arrays: dict[int, Any] = {}


def _dims_layout(count: int) -> struct.Struct:
    """``count`` int64 values (shapes and strides)."""
    layout = _dims_layouts.get(count)
    if layout is None:
        layout = _dims_layouts[count] = struct.Struct(f"@{count}q")
    return layout


def _bytes_type(size: int) -> Any:
    """The ctypes type of ``size`` bytes (ctypes makes a new one per size: kept here)."""
    kind = _byte_arrays.get(size)
    if kind is None:
        kind = _byte_arrays[size] = ctypes.c_char * size
    return kind


def _unpack_at(layout: struct.Struct, address: int) -> tuple[Any, ...]:
    """Read ``layout`` from memory at ``address``."""
    return layout.unpack_from(_bytes_type(layout.size).from_address(address))


# ---- dtypes: the table in gpurt._array.dtypes, both directions -------------------------------

_TO_DL: dict[np.dtype, tuple[int, int]] = {
    dt: (code, dt.itemsize * 8) for dt, code in _dtypes.DLPACK_CODES.items()
}
_FROM_DL: dict[tuple[int, int], np.dtype] = {v: k for k, v in _TO_DL.items()}


def to_dl_dtype(dtype: np.dtype) -> tuple[int, int]:
    """(type code, bits) of a supported numpy dtype."""
    try:
        return _TO_DL[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} has no DLPack type code in gpurt") from None


def from_dl_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    """numpy dtype of a DLPack (code, bits, lanes); a clear error for the rest."""
    if lanes != 1:
        raise TypeError(f"vector DLPack dtypes (lanes={lanes}) are not supported")
    try:
        return _FROM_DL[(code, bits)]
    except KeyError:
        raise TypeError(f"unsupported DLPack dtype (code={code}, bits={bits})") from None


# ---- capsules through the C API (own prototypes: never mutate ctypes.pythonapi) --------

_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", _api))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_SetName", _api)
)
_capsule_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_GetName", _api)
)

# Capsule names must outlive every capsule, also those a consumer frees during interpreter
# shutdown; the bytes are kept in a tuple that is deliberately never freed (see below).
NAME = b"dltensor"
NAME_VERSIONED = b"dltensor_versioned"
USED_NAME = b"used_dltensor"
USED_NAME_VERSIONED = b"used_dltensor_versioned"

# Exports alive on the consumer's side: address of the managed struct -> (the buffer that
# holds it, followed by its shape and strides; the object kept alive). The deleter pops
# the entry.
_exports: dict[int, tuple[Any, Any]] = {}


def _release_export(address: int | None, _pop: Any = _exports.pop) -> None:
    """The C deleter of every tensor we export (legacy and versioned alike)."""
    try:
        if address:
            _pop(address, None)
    except Exception:  # a deleter must never raise into C
        pass


def _capsule_destructor(capsule: int | None) -> None:
    """PyCapsule destructor: frees our export if no consumer renamed (took) the capsule."""
    try:
        name = _capsule_get_name(capsule)
        if name == NAME_VERSIONED or name == NAME:
            _release_export(_capsule_get_pointer(capsule, name))
    except Exception:
        pass


_DELETER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_deleter = _DELETER_TYPE(_release_export)
_destructor = _DELETER_TYPE(_capsule_destructor)
_DELETER_ADDRESS = ctypes.cast(_deleter, ctypes.c_void_p).value
_DESTRUCTOR_ADDRESS = ctypes.cast(_destructor, ctypes.c_void_p).value
# Consumers may call our deleter (and capsules may die) while the interpreter shuts down,
# after this module is gone: keep the callbacks and names alive for the whole process.
_IMMORTAL = (_deleter, _destructor, NAME, NAME_VERSIONED, USED_NAME, USED_NAME_VERSIONED)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_IMMORTAL))

# Calling a producer's deleter: keep the GIL held (PYFUNCTYPE), which is safe whether or
# not the producer's deleter takes the GIL itself.
_CALL_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


def live_exports() -> int:
    """Number of exported tensors whose deleter has not run yet (for tests)."""
    return len(_exports)


def export_capsule(
    data: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: np.dtype,
    device: tuple[int, int],
    keep_alive: Any,
    versioned: bool,
    copied: bool = False,
) -> Any:
    """A new DLPack capsule describing ``data`` (strides in bytes, as numpy) on ``device``
    = (device_type, device_id); ``keep_alive`` lives until the tensor is deleted."""
    itemsize = dtype.itemsize
    code, bits = to_dl_dtype(dtype)
    ndim = len(shape)
    element_strides = []
    for stride in strides:
        if stride % itemsize:
            raise BufferError(
                f"stride {stride} bytes is not a multiple of the item size {itemsize}; "
                "DLPack strides count elements"
            )
        element_strides.append(stride // itemsize)
    # one buffer: the managed tensor, then its shape and its strides (int64 each)
    layout = _VERSIONED if versioned else _LEGACY
    head = layout.size
    buffer = _bytes_type(head + 16 * ndim)()
    address = ctypes.addressof(buffer)
    shape_at = address + head
    strides_at = shape_at + 8 * ndim
    device_type, device_id = device
    if versioned:
        layout.pack_into(buffer, 0, VERSION[0], VERSION[1], 0, _DELETER_ADDRESS,
                         FLAG_IS_COPIED if copied else 0, data, device_type, device_id, ndim,
                         code, bits, 1, shape_at, strides_at, 0)
        name = NAME_VERSIONED
    else:
        layout.pack_into(buffer, 0, data, device_type, device_id, ndim, code, bits, 1,
                         shape_at, strides_at, 0, 0, _DELETER_ADDRESS)
        name = NAME
    if ndim:
        _dims_layout(2 * ndim).pack_into(buffer, head, *shape, *element_strides)
    _exports[address] = (buffer, keep_alive)
    try:
        return _capsule_new(address, name, _DESTRUCTOR_ADDRESS)
    except BaseException:
        _release_export(address)
        raise


class Imported:
    """A consumed DLPack tensor: its layout (strides in bytes) and the producer's deleter,
    called once by :meth:`release`."""

    __slots__ = ("data", "shape", "strides", "dtype", "device_type", "device_id",
                 "read_only", "_managed", "_deleter")

    def __init__(self, data: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 dtype: np.dtype, device: tuple[int, int], read_only: bool,
                 managed: int, deleter: int | None) -> None:
        self.data = data
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device_type, self.device_id = device
        self.read_only = read_only
        self._managed = managed
        self._deleter = deleter

    def release(self) -> None:
        """Call the producer's deleter (once; later calls do nothing)."""
        deleter, self._deleter = self._deleter, None
        if deleter:
            call = _deleter_calls.get(deleter)
            if call is None:
                call = _deleter_calls[deleter] = _CALL_DELETER(deleter)
            call(self._managed)


# Producers' deleters as callables, by address (a library has one or two).
_deleter_calls: dict[int, Any] = {}


def _capsule_name(capsule: Any) -> bytes:
    """Which DLPack name ``capsule`` carries; clear errors for consumed or foreign ones."""
    if type(capsule).__name__ != "PyCapsule":
        raise TypeError(f"expected a DLPack capsule, got {type(capsule).__name__}")
    name = _capsule_get_name(id(capsule))
    if name == NAME_VERSIONED or name == NAME:
        return name
    if name == USED_NAME_VERSIONED or name == USED_NAME:
        raise ValueError(
            "this DLPack capsule was already consumed (its tensor belongs to another "
            "array now); call __dlpack__ again for a new one"
        )
    raise TypeError("the capsule is not a DLPack tensor (name is not 'dltensor')")


def consume_capsule(capsule: Any) -> Imported:
    """Read a DLPack capsule and take ownership of its tensor (renaming the capsule
    ``used_...``). Everything is validated before the rename, so a rejected capsule is
    still freed by its own destructor."""
    name = _capsule_name(capsule)
    address = _capsule_get_pointer(id(capsule), name)
    if not address:
        raise ValueError("the DLPack capsule holds a NULL tensor")
    versioned = name == NAME_VERSIONED
    if versioned:
        (major, minor, _, deleter, flags, data, device_type, device_id, ndim, code, bits,
         lanes, shape_at, strides_at, byte_offset) = _unpack_at(_VERSIONED, address)
        if major != VERSION[0]:
            raise BufferError(
                f"DLPack {major}.{minor} tensors are not supported (gpurt reads DLPack "
                f"{VERSION[0]}.x)"
            )
    else:
        (data, device_type, device_id, ndim, code, bits, lanes, shape_at, strides_at,
         byte_offset, _, deleter) = _unpack_at(_LEGACY, address)
        flags = 0
    dtype = from_dl_dtype(code, bits, lanes)
    itemsize = dtype.itemsize
    if ndim:
        dims = _dims_layout(ndim)
        shape = _unpack_at(dims, shape_at)
        if strides_at:
            strides = tuple([stride * itemsize for stride in _unpack_at(dims, strides_at)])
        else:  # NULL strides: compact row-major
            step, reversed_strides = itemsize, []
            for dim in reversed(shape):
                reversed_strides.append(step)
                step *= dim
            strides = tuple(reversed(reversed_strides))
    else:
        shape = strides = ()
    imported = Imported(data + byte_offset, shape, strides, dtype,
                        (device_type, device_id), bool(flags & FLAG_READ_ONLY), address,
                        deleter)
    used = USED_NAME_VERSIONED if versioned else USED_NAME
    if _capsule_set_name(id(capsule), used) != 0:
        raise RuntimeError("could not mark the DLPack capsule as consumed")
    return imported
