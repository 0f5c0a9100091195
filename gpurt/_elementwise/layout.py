"""Shapes and strides of generated kernels: numpy broadcasting, strides in elements with
zeros for broadcast dimensions, and the collapse of dimensions that index memory alike for
every array (so most strided problems run with one or two dimensions of index arithmetic)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_DIMS", "broadcast_shape", "collapse", "element_strides", "normalize_axes"]

MAX_DIMS = 8  # dimensions of index arithmetic a strided kernel handles after collapsing

Shape = tuple[int, ...]


def broadcast_shape(shapes: Sequence[Shape]) -> Shape:
    """numpy's broadcast of ``shapes``; ValueError naming them when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        for axis, size in enumerate(shape, ndim - len(shape)):
            if size == result[axis] or size == 1:
                continue
            if result[axis] != 1:
                listed = ", ".join(str(tuple(s)) for s in shapes)
                raise ValueError(f"shapes {listed} do not broadcast (dimension {axis}: "
                                 f"{result[axis]} vs {size})")
            result[axis] = size
    return tuple(result)


def element_strides(shape: Shape, strides: Shape, itemsize: int, out_shape: Shape,
                    what: str) -> Shape:
    """The strides in elements of an array of ``shape``/byte ``strides`` broadcast to
    ``out_shape`` (0 along broadcast dimensions)."""
    lead = len(out_shape) - len(shape)
    result = [0] * len(out_shape)
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        if size == 1:
            continue
        if stride % itemsize:
            raise ValueError(f"{what}: stride {stride} is not a multiple of the item size "
                             f"{itemsize}")
        result[lead + axis] = stride // itemsize
    return tuple(result)


def collapse(shape: Shape, strides: Sequence[Shape]) -> tuple[Shape, tuple[Shape, ...]]:
    """Drop size-1 dimensions and merge neighbours that every array steps through as one
    (``stride[d] == stride[d+1] * shape[d+1]``). Returns the new shape and strides."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    new_shape: list[int] = []
    new_strides: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if new_shape and all(s[-1] == old[d] * shape[d] for s, old in zip(new_strides, strides)):
            new_shape[-1] *= shape[d]
            for s, old in zip(new_strides, strides):
                s[-1] = old[d]
            continue
        new_shape.append(shape[d])
        for s, old in zip(new_strides, strides):
            s.append(old[d])
    return tuple(new_shape), tuple(tuple(s) for s in new_strides)


def normalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """Sorted non-negative axes (all when ``axis`` is None); numpy's errors for bad ones."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    result = []
    for a in axes:
        if not isinstance(a, int) or not -ndim <= a < max(ndim, 1):
            raise ValueError(f"axis {a!r} is out of bounds for an array of {ndim} dimensions")
        a %= max(ndim, 1)
        if a in result:
            raise ValueError(f"axis {a} is repeated in {axis!r}")
        result.append(a)
    return tuple(sorted(result))
