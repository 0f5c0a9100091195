"""Element types of generated kernels: the C type each dtype is stored as and computed in,
torch's type promotion, and the parser of CuPy-style parameter lists ("T x, raw float32 y").

float16 and bfloat16 are stored as ``__half`` / ``__nv_bfloat16`` but computed in ``float``
(torch's "opmath" type): a value is converted to float when loaded and back when stored, so
user code never meets the ambiguous mixed ``__half``/``int`` operators of cuda_fp16.h.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

_BOOL, _INT64 = np.dtype(np.bool_), np.dtype(np.int64)
_F16, _BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)

__all__ = [
    "COMPUTE",
    "STORAGE",
    "TYPE_NAMES",
    "Param",
    "check_dtype",
    "parse_params",
    "promote",
    "result_type",
    "scalar_dtype",
]

# dtype -> (storage C type, compute C type)
_TYPES: dict[np.dtype, tuple[str, str]] = {
    _BOOL: ("bool", "bool"),
    np.dtype(np.int8): ("signed char", "signed char"),
    np.dtype(np.int16): ("short", "short"),
    np.dtype(np.int32): ("int", "int"),
    _INT64: ("long long", "long long"),
    np.dtype(np.uint8): ("unsigned char", "unsigned char"),
    np.dtype(np.uint16): ("unsigned short", "unsigned short"),
    np.dtype(np.uint32): ("unsigned int", "unsigned int"),
    np.dtype(np.uint64): ("unsigned long long", "unsigned long long"),
    _F16: ("__half", "float"),
    _BF16: ("__nv_bfloat16", "float"),
    _F32: ("float", "float"),
    _F64: ("double", "double"),
}
STORAGE = {dt: types[0] for dt, types in _TYPES.items()}
COMPUTE = {dt: types[1] for dt, types in _TYPES.items()}

# CuPy's type names in parameter lists -> dtype
TYPE_NAMES: dict[str, np.dtype] = {dt.name: dt for dt in _TYPES}
TYPE_NAMES.update({"bool": _BOOL, "float": _F32, "double": _F64, "half": _F16,
                   "int": np.dtype(np.int32), "uint": np.dtype(np.uint32), "bf16": _BF16})

_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2}  # bool < integer < floating


def check_dtype(dtype: Any, what: str) -> np.dtype:
    """``dtype`` as a supported numpy dtype, or TypeError naming ``what``."""
    dt = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    if dt not in _TYPES:
        raise TypeError(f"{what} has dtype {dt.name}, which elementwise kernels do not support "
                        f"(supported: {', '.join(d.name for d in _TYPES)})")
    return dt


def _category(dt: np.dtype) -> int:
    return _CATEGORY[dt.kind]


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """torch's promotion of two array dtypes: bool < integers < floats; any float wins over
    any integer; float16 with bfloat16 gives float32; integers follow numpy (uint8 with
    int8 gives int16). uint64 with a signed integer has no integer type: TypeError."""
    if a == b:
        return a
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:
        if {a, b} == {_F16, _BF16}:
            return _F32
        return a if a.itemsize >= b.itemsize else b
    result = np.promote_types(a, b)
    if result.kind == "f":
        raise TypeError(f"{a.name} and {b.name} have no common integer type")
    return result


def scalar_dtype(value: Any) -> np.dtype | None:
    """The dtype a Python/numpy scalar stands for (numpy scalars keep theirs), or None."""
    if isinstance(value, np.generic):
        return check_dtype(value.dtype, "a numpy scalar")
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return _INT64
    if isinstance(value, float):
        return _F64
    return None


def result_type(arrays: Sequence[np.dtype], scalars: Sequence[np.dtype]) -> np.dtype:
    """torch's result type of arrays and Python scalars: the arrays' promoted dtype, unless
    a scalar is of a higher category (bool < int < float), which then gives that category's
    default (int64, float32). Without arrays the scalars decide (float: float32)."""
    if not arrays:
        kinds = [_category(s) for s in scalars]
        return (_BOOL, _INT64, _F32)[max(kinds)] if kinds else _F32
    result = arrays[0]
    for dt in arrays[1:]:
        result = promote(result, dt)
    top = max((_category(s) for s in scalars), default=0)
    if top > _category(result):
        result = (_BOOL, _INT64, _F32)[top]
    return result


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a CuPy-style list: ``[raw] type name``. ``dtype`` is None for a
    type placeholder (``ctype`` then names it, e.g. "T")."""

    name: str
    ctype: str
    dtype: np.dtype | None
    raw: bool


_PARAM = re.compile(r"^(?:(raw)\s+)?([A-Za-z_]\w*)\s+([A-Za-z_]\w*)$")
_RESERVED = {"i"}


def parse_params(text: str, what: str) -> tuple[Param, ...]:
    """Parse ``"T x, raw float32 y"`` into Params; ValueError naming the bad entry."""
    params: list[Param] = []
    if not text.strip():
        return ()
    for entry in text.split(","):
        match = _PARAM.match(entry.strip())
        if match is None:
            raise ValueError(f"{what}: cannot parse parameter {entry.strip()!r} "
                             "(expected '[raw] type name')")
        raw, ctype, name = match.groups()
        if name in _RESERVED or name.startswith("_"):
            raise ValueError(f"{what}: parameter name {name!r} is reserved")
        if any(p.name == name for p in params):
            raise ValueError(f"{what}: parameter {name!r} appears twice")
        params.append(Param(name, ctype, TYPE_NAMES.get(ctype), raw is not None))
    return tuple(params)
