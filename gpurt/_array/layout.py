"""Shape and stride arithmetic for strided arrays (numpy's conventions, strides in bytes).

Pure Python, no driver: everything here is unit tested on a CPU against numpy. The copy
planner turns a strided copy into the fewest 1-D/2-D memcpy calls the driver can do
(``cuMemcpyAsync`` rows, ``cuMemcpy2DAsync`` pitched blocks), looping over what is left.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__: list[str] = []  # internal module

Shape = tuple[int, ...]

# A strided copy may cost one driver call per outer index; beyond this many the layout is
# too scattered to copy without a kernel and we say so instead of issuing a storm of calls.
MAX_COPY_CALLS = 1 << 16


def normalize_shape(shape: Any) -> Shape:
    """``shape`` (an int or a sequence of ints) as a tuple of non-negative ints."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        dims: Sequence[Any] = (shape,)
    elif isinstance(shape, (tuple, list)):
        dims = shape
    else:
        try:
            dims = (operator.index(shape),)
        except TypeError:
            try:
                dims = tuple(shape)
            except TypeError:
                raise TypeError(
                    f"shape must be an int or a sequence of ints, got {type(shape).__name__}"
                ) from None
    out = []
    for dim in dims:
        if isinstance(dim, bool):
            raise TypeError(f"shape entries must be ints, got {dim!r} in {shape!r}")
        try:
            n = operator.index(dim)
        except TypeError:
            raise TypeError(
                f"shape entries must be ints, got {type(dim).__name__} in {shape!r}"
            ) from None
        if n < 0:
            raise ValueError(f"negative dimension {n} in shape {tuple(dims)!r}")
        out.append(n)
    return tuple(out)


def contiguous_strides(shape: Shape, itemsize: int) -> Shape:
    """C-order strides in bytes; ranks 0-3 (nearly every array) without a loop."""
    n = len(shape)
    if n == 1:
        return (itemsize,)
    if n == 2:
        return (shape[1] * itemsize, itemsize)
    if n == 0:
        return ()
    if n == 3:
        inner = shape[2] * itemsize
        return (shape[1] * inner, inner, itemsize)
    strides = [itemsize] * n
    step = itemsize
    for axis in range(n - 1, 0, -1):
        step *= shape[axis]
        strides[axis - 1] = step
    return tuple(strides)


def contiguous_layout(shape: Any, itemsize: int) -> tuple[Shape, Shape, int]:
    """(shape, strides, nbytes) of a new C-contiguous array of ``shape`` (any spelling);
    tuples of plain non-negative ints take a short path (floats and bools, which hash
    and compare like ints, do not)."""
    if type(shape) is tuple:
        strides = []
        step = itemsize
        for dim in reversed(shape):
            if type(dim) is not int or dim < 0:
                break
            strides.append(step)
            step *= dim
        else:
            strides.reverse()
            return shape, tuple(strides), step
    dims = normalize_shape(shape)
    return dims, contiguous_strides(dims, itemsize), prod(dims) * itemsize


def prod(shape: Shape) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size


def is_contiguous(shape: Shape, strides: Shape, itemsize: int) -> bool:
    """C-contiguity as numpy defines it: strides of size-1 dims do not matter and an
    empty array is contiguous."""
    step = itemsize
    ok = True
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim == 0:
            return True
        if dim != 1 and stride != step:
            ok = False
        step *= dim
    return ok


def byte_extent(shape: Shape, strides: Shape, itemsize: int) -> tuple[int, int]:
    """Half-open byte range [lo, hi) relative to element 0 that the array touches."""
    lo = hi = 0
    for dim, stride in zip(shape, strides):
        if dim == 0:
            return (0, 0)
        if stride < 0:
            lo += (dim - 1) * stride
        else:
            hi += (dim - 1) * stride
    return (lo, hi + itemsize)


def basic_index(shape: Shape, strides: Shape, key: Any) -> tuple[int, Shape, Shape]:
    """numpy basic indexing (ints, slices with steps, ``...``, ``None``) on a strided
    layout: returns (byte offset of the new element 0, new shape, new strides)."""
    items = key if isinstance(key, tuple) else (key,)
    n_used = 0
    ellipsis_at = -1
    for i, item in enumerate(items):
        if item is Ellipsis:
            if ellipsis_at >= 0:
                raise IndexError("an index can only have a single ellipsis ('...')")
            ellipsis_at = i
        elif item is not None:
            n_used += 1
    ndim = len(shape)
    if n_used > ndim:
        raise IndexError(
            f"too many indices: array is {ndim}-dimensional, but {n_used} were indexed"
        )
    if ellipsis_at >= 0:
        fill = (slice(None),) * (ndim - n_used)
        items = items[:ellipsis_at] + fill + items[ellipsis_at + 1 :]
    else:
        items = items + (slice(None),) * (ndim - n_used)
    offset = 0
    axis = 0
    new_shape: list[int] = []
    new_strides: list[int] = []
    for item in items:
        if item is None:
            new_shape.append(1)
            new_strides.append(0)
            continue
        dim, stride = shape[axis], strides[axis]
        if isinstance(item, slice):
            start, stop, step = item.indices(dim)
            length = len(range(start, stop, step))
            new_shape.append(length)
            if length:
                new_strides.append(stride * step)
                offset += start * stride
            else:  # an empty slice keeps the axis' stride and moves nothing, like numpy
                new_strides.append(stride)
        else:
            if isinstance(item, bool):
                raise TypeError("boolean indices are not supported (only basic indexing)")
            try:
                i = operator.index(item)
            except TypeError:
                raise TypeError(
                    "only basic indexing is supported (ints, slices, '...', None); "
                    f"got {type(item).__name__}"
                ) from None
            if not -dim <= i < dim:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {dim}")
            offset += (i + dim if i < 0 else i) * stride
        axis += 1
    return offset, tuple(new_shape), tuple(new_strides)


def infer_reshape(size: int, newshape: Any) -> Shape:
    """The target shape of a reshape, with one ``-1`` inferred; sizes must agree."""
    if isinstance(newshape, tuple) and len(newshape) == 1 and not isinstance(newshape[0], int):
        newshape = newshape[0]
    dims = list(newshape) if isinstance(newshape, (tuple, list)) else [newshape]
    unknown = [i for i, d in enumerate(dims) if d == -1]
    if len(unknown) > 1:
        raise ValueError("can only specify one unknown dimension (-1) in reshape")
    if unknown:
        known = prod(normalize_shape([d for d in dims if d != -1]))
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of size {size} into shape {tuple(dims)}")
        dims[unknown[0]] = size // known
    shape = normalize_shape(dims)
    if prod(shape) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
    return shape


def transpose_axes(ndim: int, axes: Sequence[Any]) -> tuple[int, ...]:
    """Validated permutation; empty ``axes`` reverses the order (numpy's default)."""
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = axes[0]
    if not axes:
        return tuple(range(ndim - 1, -1, -1))
    perm = tuple(operator.index(a) + (ndim if operator.index(a) < 0 else 0) for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise ValueError(f"axes {tuple(axes)} are not a permutation of {ndim} dimensions")
    return perm


class Copy(NamedTuple):
    """One driver copy: ``height`` rows of ``width`` bytes; rows ``*_pitch`` bytes apart.
    ``height == 1`` is a plain 1-D copy."""

    dst_offset: int
    src_offset: int
    width: int
    height: int
    dst_pitch: int
    src_pitch: int


def _merge_dims(shape: Shape, dst: Shape, src: Shape) -> tuple[list[int], list[int], list[int]]:
    """Drop size-1 dims and fuse neighbours that are contiguous in both layouts."""
    dims: list[int] = []
    ds: list[int] = []
    ss: list[int] = []
    for n, a, b in zip(shape, dst, src):
        if n == 1:
            continue
        if dims and ds[-1] == a * n and ss[-1] == b * n:
            dims[-1] *= n
            ds[-1] = a
            ss[-1] = b
        else:
            dims.append(n)
            ds.append(a)
            ss.append(b)
    return dims, ds, ss


def plan_copy(shape: Shape, dst_strides: Shape, src_strides: Shape, itemsize: int) -> list[Copy]:
    """Driver copies that move every element of ``src`` to ``dst`` (same shape), offsets in
    bytes from each array's element 0. Axes reversed in both layouts are flipped first so
    pitches stay non-negative. Raises ValueError when the layout needs too many calls."""
    if prod(shape) == 0:
        return []
    dst_base = src_base = 0
    fdst, fsrc = list(dst_strides), list(src_strides)
    for axis, n in enumerate(shape):
        if fdst[axis] < 0 and fsrc[axis] < 0:
            dst_base += (n - 1) * fdst[axis]
            src_base += (n - 1) * fsrc[axis]
            fdst[axis], fsrc[axis] = -fdst[axis], -fsrc[axis]
    dims, ds, ss = _merge_dims(shape, tuple(fdst), tuple(fsrc))
    width = itemsize
    if dims and ds[-1] == itemsize and ss[-1] == itemsize:
        width = dims.pop() * itemsize
        ds.pop()
        ss.pop()
    height, dst_pitch, src_pitch = 1, width, width
    if dims and ds[-1] >= width and ss[-1] >= width:
        height, dst_pitch, src_pitch = dims.pop(), ds.pop(), ss.pop()
    calls = prod(tuple(dims))
    if calls > MAX_COPY_CALLS:
        raise ValueError(
            f"this strided layout (shape {shape}, strides {dst_strides} <- {src_strides}) "
            f"would need {calls} copy calls; copy through a contiguous array instead"
        )
    copies = []
    for index in itertools.product(*(range(n) for n in dims)):
        dst_offset = dst_base + sum(i * stride for i, stride in zip(index, ds))
        src_offset = src_base + sum(i * stride for i, stride in zip(index, ss))
        copies.append(Copy(dst_offset, src_offset, width, height, dst_pitch, src_pitch))
    return copies
