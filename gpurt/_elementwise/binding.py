"""The arguments of one call of a CuPy-style kernel: which are arrays and which scalars,
the dtypes type placeholders ("T") stand for, and the output dtypes.

CuPy's rules: a placeholder takes the dtype of the arrays passed for it, which must agree
(TypeError otherwise); a placeholder that only scalars stand for takes the scalar's dtype
(Python int: int64, float: float64, bool: bool); an output's placeholder may be bound by a
given output array. An array passed for a parameter of a fixed type is converted when
read, if numpy allows the cast under 'same_kind'; scalars are converted to the parameter's
type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..array import Array
from . import api as gpurt
from .plan import as_array
from .types import Param, check_dtype, scalar_dtype

__all__ = ["PASSED_AS_IS", "as_value", "bind", "is_scalar", "returned", "split_args"]


_SCALARS = (bool, int, float, np.generic)


def is_scalar(value: Any) -> bool:
    """True for Python and numpy scalars (the values passed by value)."""
    return isinstance(value, _SCALARS)


PASSED_AS_IS = frozenset({Array, bool, int, float})


def as_value(arg: Any, what: str) -> Any:
    """An argument as a kernel value: an Array or scalar as is, a device array as an Array."""
    if type(arg) in PASSED_AS_IS or isinstance(arg, _SCALARS):  # is_scalar, one call less
        return arg
    return as_array(arg, what)


def split_args(args: Sequence[Any], n_in: int, n_out: int,
               name: str) -> tuple[list[Any], list[Any], list[Any] | None]:
    """(input values, output Arrays or None, outputs as given or None when none were) from
    a call's arguments: ``n_in`` inputs, then optionally all ``n_out`` outputs. Device
    arrays become Arrays. On the hot path of every call."""
    if len(args) == n_in:
        values = [a if type(a) in PASSED_AS_IS else as_value(a, f"argument {k}")
                  for k, a in enumerate(args)]
        return values, [None] * n_out, None
    if len(args) != n_in + n_out:
        raise TypeError(f"kernel {name!r} takes {n_in} inputs (and optionally {n_out} "
                        f"outputs), got {len(args)} arguments")
    values = [a if type(a) in PASSED_AS_IS else as_value(a, f"argument {k}")
              for k, a in enumerate(args[:n_in])]
    given = list(args[n_in:])
    outs = [o if o is None or type(o) is gpurt.Array else as_array(o, f"output {k}")
            for k, o in enumerate(given)]
    return values, outs, given


def returned(outputs: list[Any], given: list[Any] | None) -> list[Any]:
    """What a call returns: its outputs, the caller's own objects where it passed them."""
    if given is None:
        return outputs
    return [g if g is not None else o for g, o in zip(given, outputs)]


def _dtype_of(value: Any, what: str) -> np.dtype:
    if type(value) is gpurt.Array:
        return check_dtype(value.dtype, what)
    found = scalar_dtype(value)
    if found is None:
        raise TypeError(f"{what} must be an array or a scalar, got {type(value).__name__}")
    return found


def bind(in_params: Sequence[Param], out_params: Sequence[Param], values: Sequence[Any],
         outs: Sequence[Any], name: str) -> tuple[dict[str, np.dtype], list[np.dtype]]:
    """The dtype of every placeholder and of every output (CuPy's rules, above)."""
    bound: dict[str, np.dtype] = {}
    for param, value in zip(in_params, values):
        if param.raw and type(value) is not gpurt.Array:
            raise TypeError(f"kernel {name!r}: raw parameter {param.name!r} needs an array, "
                            f"got {type(value).__name__}")
        what = f"kernel {name!r}: argument {param.name!r}"
        dtype = _dtype_of(value, what)
        if param.dtype is not None:
            if type(value) is gpurt.Array and not _castable(dtype, param.dtype):
                raise TypeError(f"{what} is {dtype.name}; it cannot be read as "
                                f"{param.dtype.name} (numpy's 'same_kind' rule)")
            continue
        if type(value) is gpurt.Array:
            known = bound.get(param.ctype)
            if known is not None and known != dtype:
                raise TypeError(f"{what} is {dtype.name} but {param.ctype} is already "
                                f"{known.name}")
            bound[param.ctype] = dtype
    for param, value in zip(in_params, values):
        if param.dtype is None and param.ctype not in bound:
            bound[param.ctype] = _dtype_of(value, param.name)
    out_dtypes = []
    for param, out in zip(out_params, outs):
        if param.dtype is not None:
            out_dtypes.append(param.dtype)
            continue
        if out is not None:
            dtype = check_dtype(out.dtype, f"output {param.name!r}")
            known = bound.setdefault(param.ctype, dtype)
            if known != dtype:
                raise TypeError(f"kernel {name!r}: output {param.name!r} is {dtype.name} but "
                                f"{param.ctype} is {known.name}")
        if param.ctype not in bound:
            raise TypeError(f"kernel {name!r}: the type {param.ctype} of output "
                            f"{param.name!r} is not known from the inputs; pass the output")
        out_dtypes.append(bound[param.ctype])
    return bound, out_dtypes


def _castable(src: np.dtype, dst: np.dtype) -> bool:
    if src == dst:
        return True
    if src.kind == "V" or dst.kind == "V":  # bfloat16 (numpy does not know its kind)
        return dst.kind in "fV"
    return bool(np.can_cast(src, dst, "same_kind"))


def param_dtype(param: Param, bound: dict[str, np.dtype]) -> np.dtype | None:
    """The dtype a parameter stands for in this call."""
    return param.dtype if param.dtype is not None else bound.get(param.ctype)
