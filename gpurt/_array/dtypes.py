"""The element types gpurt arrays hold: one table (numpy dtype, DLPack type code) and the
parser that turns any dtype spelling into one of them."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

# The dtype names, re-exported by gpurt.array (gpurt.float32 ...) as numpy dtype objects.
__all__ = [
    "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
]

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)

# dtype -> DLPack DLDataTypeCode (kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4,
# kDLComplex=5, kDLBool=6); the bit width is always the item size.
DLPACK_CODES: dict[np.dtype, int] = {
    bool_: 6, int8: 0, int16: 0, int32: 0, int64: 0, uint8: 1, uint16: 1, uint32: 1, uint64: 1,
    float16: 2, bfloat16: 4, float32: 2, float64: 2, complex64: 5, complex128: 5,
}
SUPPORTED: tuple[np.dtype, ...] = tuple(DLPACK_CODES)

# Every spelling seen so far -> dtype, so that the hot path is one dict lookup.
CACHE: dict[Any, np.dtype] = {float: float64, int: int64, bool: bool_, complex: complex128}
for _dt in SUPPORTED:
    CACHE[_dt] = CACHE[_dt.type] = CACHE[_dt.name] = _dt
CACHE["<V2"] = bfloat16  # ml_dtypes' and torch's __cuda_array_interface__ typestr for bf16


def as_dtype(dtype: Any) -> np.dtype:
    """A supported numpy dtype from a numpy dtype or type, a name or typestr, or a torch
    dtype (matched by name, torch is never imported); TypeError for anything else."""
    try:
        return CACHE[dtype]
    except (KeyError, TypeError):
        pass
    name = str(dtype)
    if name.startswith("torch."):
        resolved = CACHE.get(name[len("torch."):])
    else:
        try:
            resolved = CACHE.get(np.dtype(dtype))
        except TypeError:
            resolved = None
    if resolved is None:
        names = ", ".join(dt.name for dt in SUPPORTED)
        raise TypeError(f"unsupported dtype {dtype!r}; gpurt arrays hold one of: {names}")
    try:
        CACHE[dtype] = resolved
    except TypeError:  # an unhashable spelling is resolved again next time
        pass
    return resolved
