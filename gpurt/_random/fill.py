"""Random fills and dropout on device arrays (gpurt Arrays, or torch/CuPy arrays viewed
without a copy), through the kernels of random.cu.

Each call validates everything (dtype, parameters, layout, generator and stream device)
and compiles its kernel before it takes its draw from the generator, so a refused call
leaves the generator where it was. Every call advances the generator's offset by 4
(one Philox block per element block: docs/random.md); an empty array draws nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import array as _array
from ..device import current_device
from ..device import device as _device_ctx
from . import kernels
from .generator import Generator, default_generator, stream_handle

__all__ = ["INCREMENT", "bernoulli_", "dropout", "normal_", "randint_", "uniform_"]

INCREMENT = 4  # offset advance per call: one Philox block (4 words) per element block
_FLOATS = frozenset({"float32", "float16", "bfloat16"})
_INTEGERS = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})
_U64 = (1 << 64) - 1
_BERNOULLI = _FLOATS | _INTEGERS | {"bool"}


def _target(obj: Any, what: str) -> Any:
    if isinstance(obj, _array.Array):
        return obj
    try:
        return _array.asarray(obj, copy=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a device array (gpurt, torch, CuPy...), got "
                        f"{type(obj).__name__}: {exc}") from exc


def _check_dtype(arr: Any, allowed: frozenset[str], what: str) -> None:
    if arr.dtype.name not in allowed:
        raise TypeError(f"{what} fills {', '.join(sorted(allowed))} arrays, not {arr.dtype.name}")


def _generator(generator: Generator | None, index: int) -> Generator:
    if generator is None:
        return default_generator(index)
    if not isinstance(generator, Generator):
        raise TypeError(f"generator must be a gpurt.Generator, got {type(generator).__name__}")
    if generator.device != index:
        raise ValueError(f"the generator is for cuda:{generator.device}, the array is on "
                         f"cuda:{index}")
    return generator


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _probability(p: Any, name: str, *, below_one: bool = False) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(p).__name__}")
    p = float(p)
    if not (0.0 <= p < 1.0 if below_one else 0.0 <= p <= 1.0):
        raise ValueError(f"{name} must be in [0, 1{')' if below_one else ']'}, got {p}")
    return p


def _launch(template: str, arrays: tuple[Any, ...], n: int, block: int, layouts: tuple[bytes, ...],
            args: tuple[Any, ...], generator: Generator | None, stream: Any) -> None:
    """Draw and launch ``template`` over ``n`` elements in stores of ``block`` elements
    (``arrays[0]`` sets the dtype and device); everything that can fail does so before the
    draw."""
    first = arrays[0]
    index = first.device.index
    gen = _generator(generator, index)
    handle = stream_handle(stream, index)
    kernel = kernels.kernel(template, first.dtype, index)
    grid = kernels.grid_for(kernel, index, (n + block - 1) // block)
    state = bytes(gen.draw(INCREMENT, handle))
    call = (*arrays, n, *layouts, state, *args)
    if current_device() == index:
        kernel(grid, kernels.THREADS, call, stream=handle)
    else:
        with _device_ctx(index):
            kernel(grid, kernels.THREADS, call, stream=handle)


def _threshold(p: np.float32) -> int:
    """The kernels' Bernoulli test: ``u < p`` (u = (w >> 8) * 2^-24) is ``w < threshold``."""
    return math.ceil(float(p) * 2**24) << 8


def _layout(arr: Any, block: int, written: bool = True) -> bytes:
    return kernels.layout(arr.shape, arr.strides, arr.itemsize, arr.ptr, block, written)


def _fill(template: str, arr: Any, k: int, args: tuple[Any, ...], generator: Generator | None,
          stream: Any) -> None:
    """Launch a fill whose Philox block gives ``k`` elements (random.cu's Dist::K)."""
    block = kernels.per_store(arr.itemsize, k)
    _launch(template, (arr,), arr.size, block, (_layout(arr, block),), args, generator, stream)


def uniform_(out: Any, low: float = 0.0, high: float = 1.0, *,
             generator: Generator | None = None, stream: Any = None) -> Any:
    """Fill ``out`` (float32/float16/bfloat16) with uniform values ``low + u*(high - low)``,
    u in [0, 1) with 24 random bits (16 for the 16-bit dtypes: 8 values per Philox block),
    computed in float32 and rounded to ``out``'s dtype."""
    arr = _target(out, "out")
    _check_dtype(arr, _FLOATS, "uniform_")
    low, high = _real(low, "low"), _real(high, "high")
    if not low < high:
        raise ValueError(f"uniform_ needs low < high, got low={low}, high={high}")
    scale = np.float32(high - low)
    if not np.isfinite(scale):
        raise ValueError(f"high - low = {high - low} overflows float32")
    if arr.size:
        _fill("fill_uniform", arr, 8 if arr.itemsize == 2 else 4, (np.float32(low), scale),
              generator, stream)
    return out


def normal_(out: Any, mean: float = 0.0, std: float = 1.0, *,
            generator: Generator | None = None, stream: Any = None) -> Any:
    """Fill ``out`` (float32/float16/bfloat16) with normal values (Box-Muller from
    correctly rounded float32 operations, ``mean + std*z`` fused, rounded to ``out``'s
    dtype; docs/random.md)."""
    arr = _target(out, "out")
    _check_dtype(arr, _FLOATS, "normal_")
    mean, std = _real(mean, "mean"), _real(std, "std")
    if std < 0:
        raise ValueError(f"normal_ needs std >= 0, got {std}")
    if arr.size:
        _fill("fill_normal", arr, 4, (np.float32(mean), np.float32(std)), generator, stream)
    return out


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _as_int64(value: int) -> int:
    """``value`` (in [-2^63, 2^64)) as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _divisor(span: int) -> tuple[np.uint32, np.uint32]:
    """(magic32, sh1 | sh2 << 8) of gpurt::randint32_div's quotient by ``span`` (1 <= span
    <= 2^32; 2^32 takes the word itself and needs none): Granlund and Montgomery's figure
    4.1 with l = ceil(log2 span)."""
    if span >= 1 << 32:
        return np.uint32(0), np.uint32(0)
    bits = (span - 1).bit_length()
    magic = ((1 << 32) * ((1 << bits) - span)) // span + 1
    return np.uint32(magic), np.uint32(min(bits, 1) | max(bits - 1, 0) << 8)


def randint_(out: Any, low: int, high: int | None = None, *,
             generator: Generator | None = None, stream: Any = None) -> Any:
    """Fill ``out`` (an integer dtype) with integers in [low, high) (``randint_(out, n)``:
    [0, n)): ``low + w % (high - low)`` with one 32-bit word w per element when the range
    is at most 2^32, else one 64-bit word (two words) per element."""
    arr = _target(out, "out")
    _check_dtype(arr, _INTEGERS, "randint_")
    if high is None:
        low, high = 0, low
    low, high = _integer(low, "low"), _integer(high, "high")
    if not low < high:
        raise ValueError(f"randint_ needs low < high, got low={low}, high={high}")
    info = np.iinfo(arr.dtype)
    if low < info.min or high - 1 > info.max:
        raise ValueError(f"[{low}, {high}) does not fit {arr.dtype.name} "
                         f"([{info.min}, {info.max}])")
    span = high - low
    if not arr.size:
        return out
    if span > 1 << 32:
        _fill("fill_randint64", arr, 2, (_as_int64(low), span & _U64), generator, stream)
    else:
        _fill("fill_randint32", arr, 4, (_as_int64(low), span & 0xFFFFFFFF, *_divisor(span)),
              generator, stream)
    return out


def bernoulli_(out: Any, p: float = 0.5, *, generator: Generator | None = None,
               stream: Any = None) -> Any:
    """Fill ``out`` with 1 (True) where ``u < p`` (u uniform in [0, 1), p rounded to
    float32) and 0 elsewhere; ``out`` may be bool, an integer or a float dtype."""
    arr = _target(out, "out")
    _check_dtype(arr, _BERNOULLI, "bernoulli_")
    p = _probability(p, "p")
    if arr.size:
        _fill("fill_bernoulli", arr, 4, (_threshold(np.float32(p)),), generator, stream)
    return out


def _like(arr: Any, given: Any, dtype: Any, what: str) -> Any:
    if given is None:
        return _array.empty(arr.shape, dtype, device=arr.device.index)
    made = _target(given, what)
    if made.shape != arr.shape or made.dtype != np.dtype(dtype):
        raise ValueError(f"{what} must have shape {arr.shape} and dtype {np.dtype(dtype).name}, "
                         f"got {made.shape} {made.dtype.name}")
    if made.device != arr.device:
        raise ValueError(f"{what} is on {made.device}, x on {arr.device}")
    return made


def dropout(x: Any, p: float = 0.5, *, out: Any = None, mask: Any = None,
            generator: Generator | None = None, stream: Any = None) -> tuple[Any, Any]:
    """Dropout: ``out = x * (1/(1-p))`` where kept (``u < 1-p``), 0 elsewhere, and
    ``mask`` (bool) = kept. x is float32/float16/bfloat16, p in [0, 1). Returns
    ``(out, mask)``: gpurt Arrays made here unless given (any layout, x's shape)."""
    arr = _target(x, "x")
    _check_dtype(arr, _FLOATS, "dropout")
    p = _probability(p, "p", below_one=True)
    result = _like(arr, out, arr.dtype, "out")
    kept = _like(arr, mask, np.bool_, "mask")
    target, flags = _target(result, "out"), _target(kept, "mask")
    if arr.size:
        block = kernels.per_store(arr.itemsize, 4)
        layouts = (_layout(arr, block, written=False), _layout(target, block),
                   _layout(flags, block))
        _launch("dropout", (arr, target, flags), arr.size, block, layouts,
                (_threshold(np.float32(1.0 - p)), np.float32(1.0 / (1.0 - p))), generator,
                stream)
    return result, kept
