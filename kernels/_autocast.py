"""The bundled kernels under :class:`gpurt.amp.autocast`, with torch's autocast rules for the
matching ops (aten/src/ATen/autocast_mode.cpp):

- gemm is torch's mm/matmul/addmm, in the lower-precision list: every floating input but
  float64 (a, b, and c when it is read) is cast to the autocast dtype, so the result comes
  in that dtype (accumulated in fp32, as always). Nothing is cached: torch caches only
  casts of leaf tensors that require grad, which gpurt cannot take.
- softmax and log_softmax are torch's "fp32_set_opt_dtype" ops: without ``dtype=`` a
  float16/bfloat16/float32 input runs as ``dtype=float32`` (an fp32 result); an explicit
  ``dtype=`` is kept.
- Calls given ``out=`` do not autocast (torch: "a.addmm(b, c, out=d)" cannot autocast),
  nor do the backward passes (torch's are in no autocast list).

gemm.py and softmax.py reach this module through one guarded line each, so that outside
autocast their cost is reading ``gpurt.amp.ANY_ENABLED``. Casts run on the call's stream
through one gpurt ElementwiseKernel (compiled once per dtype pair and layout class).
"""

from __future__ import annotations

import contextlib
from typing import Any

import ml_dtypes
import numpy as np

import gpurt
from gpurt import amp
from gpurt._array.dtypes import as_dtype

__all__ = ["cast", "cast_kernel", "gemm_inputs", "softmax_input", "SOFTMAX_DTYPES"]

_F32 = np.dtype(np.float32)
_ELIGIBLE = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), _F32})
SOFTMAX_DTYPES = _ELIGIBLE  # what the softmax kernels compute in
_cast_kernel: Any = None


def _array(x: Any) -> Any:
    """``x`` as a gpurt Array, or None when gpurt cannot view it (the kernel's own checks
    then report it)."""
    if isinstance(x, gpurt.Array):
        return x
    if x is None or isinstance(x, np.ndarray):
        return None
    try:
        return gpurt.asarray(x, copy=False)
    except Exception:  # noqa: BLE001 (not a device array: the kernel says so)
        return None


def _on(index: int, stream: Any) -> contextlib.AbstractContextManager[Any]:
    """The call's device and stream made current for the cast (nothing when they are)."""
    stack = contextlib.ExitStack()
    if index != gpurt.current_device():
        stack.enter_context(gpurt.device(index))
    if stream is not None:
        stack.enter_context(gpurt.stream(gpurt.as_stream(stream, index)))
    return stack


def cast(x: Any, dtype: np.dtype, stream: Any = None) -> Any:
    """A new C-contiguous gpurt Array with ``x``'s values in ``dtype`` (round to nearest
    even), computed on ``stream`` (default: the current stream) on ``x``'s device."""
    index = x.device.index
    with _on(index, stream):
        y = gpurt.empty(tuple(x.shape), dtype=dtype, device=index)
        if y.size:
            cast_kernel()(x, y)
    return y


def cast_kernel() -> Any:
    """The ElementwiseKernel every cast runs (``y = x``, rounding to nearest even as torch's
    ``.to(dtype)``), made at its first use."""
    global _cast_kernel
    if _cast_kernel is None:
        _cast_kernel = gpurt.ElementwiseKernel("T x", "U y", "y = x", "gpurt_autocast_cast")
    return _cast_kernel


def gemm_inputs(a: Any, b: Any, c: Any, beta: float, stream: Any) -> tuple[Any, Any, Any]:
    """(a, b, c) for a gemm without ``out`` on this thread: cast to the autocast dtype inside
    an enabled autocast (c only when ``beta`` reads it), else as given."""
    if not amp.is_autocast_enabled():
        return a, b, c
    dtype = amp.get_autocast_dtype()
    cast_a, cast_b = _lower(a, dtype, stream), _lower(b, dtype, stream)
    return cast_a, cast_b, (_lower(c, dtype, stream) if beta != 0.0 else c)


def _lower(x: Any, dtype: np.dtype, stream: Any) -> Any:
    """``x`` cast to ``dtype`` if eligible; else ``x`` as viewed (imported once, not again
    by the kernel), or as given when gpurt cannot view it."""
    array = _array(x)
    if array is None or array.dtype not in _ELIGIBLE or array.dtype == dtype:
        return x if array is None else array
    return cast(array, dtype, stream)


def softmax_input(x: Any, dtype: Any, out: Any, stream: Any) -> Any:
    """``x`` for softmax/log_softmax: cast to ``dtype`` when given (torch's ``dtype=``: the
    input is cast first), else to float32 inside an enabled autocast when ``out`` is None
    and ``x`` is float16/bfloat16."""
    if dtype is None:
        if out is not None or not amp.is_autocast_enabled():
            return x
        target = _F32
    else:
        target = as_dtype(dtype)  # numpy or torch dtypes, names
        if target not in SOFTMAX_DTYPES:
            raise TypeError(f"softmax's dtype must be float32, float16 or bfloat16, "
                            f"got {target.name}")
    array = _array(x)
    if array is None:
        return x
    if array.dtype == target or (dtype is None and array.dtype not in _ELIGIBLE):
        return array
    return cast(array, target, stream)
