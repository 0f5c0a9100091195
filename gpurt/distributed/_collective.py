"""Arrays in NCCL calls: argument checks and stream ordering, shared by gpurt.comm (one
process, several GPUs) and gpurt.distributed (one process per GPU).

An NCCL call runs on one stream per device. Arrays made on another stream are ordered
first (the NCCL stream waits for the array's stream), and afterwards the allocator is told
that the NCCL stream used them (``record_stream``), so freeing an input right after the
call never hands its memory out while NCCL still reads it. Arrays the allocator does not
own (a torch tensor, say) get the reverse wait instead: their own stream waits for NCCL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._array import copies as _copy
from ..array import Array, asarray
from ..device import bind_context
from ..streams import Stream

__all__: list[str] = []  # internal module


def device_array(obj: Any, what: str, name: str) -> Array:
    """``obj`` as a gpurt Array without copying (gpurt arrays, or foreign device arrays
    through ``__cuda_array_interface__``/DLPack); TypeError for host data."""
    if isinstance(obj, Array):
        return obj
    try:
        return asarray(obj, copy=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what}: {name} must be a device array (gpurt.Array, or a torch/"
                        f"CuPy/JAX array on the GPU), got {type(obj).__name__}: {exc}") from None


def flat(array: Array, what: str, name: str) -> Array:
    """``array`` itself, checked to be one flat buffer as NCCL needs."""
    if not array.is_contiguous():
        raise ValueError(f"{what}: {name} must be contiguous (NCCL reads and writes flat "
                         f"buffers); pass {name}.contiguous()")
    return array


def flat_arrays(objs: Iterable[Any], what: str, label: str) -> list[Array]:
    """:func:`flat` over ``device_array`` of each of ``objs``, named ``label[i]`` in errors
    (the names are only built for an error: this runs on every collective)."""
    arrays = []
    for i, obj in enumerate(objs):
        a = obj if isinstance(obj, Array) else device_array(obj, what, f"{label}[{i}]")
        arrays.append(a if a.is_contiguous() else flat(a, what, f"{label}[{i}]"))
    return arrays


def same_layout(arrays: Iterable[Array], what: str) -> None:
    """Check that all ``arrays`` share a shape and a dtype; ValueError/TypeError naming
    the odd one."""
    items = list(arrays)
    shape, dtype = items[0].shape, items[0].dtype
    for i, a in enumerate(items[1:], 1):
        if a.dtype != dtype:
            raise TypeError(f"{what}: array {i} is {a.dtype.name}, array 0 is {dtype.name}")
        if a.shape != shape:
            raise ValueError(f"{what}: array {i} has shape {a.shape}, array 0 has {shape}")


def before(stream: Stream, arrays: Iterable[Array]) -> None:
    """Make ``stream`` wait for the work queued so far on each array's own stream."""
    handle = stream.cuda_stream
    for a in arrays:
        if a.stream is stream:  # the common case, decided without a property call
            continue
        producer = a.stream.cuda_stream
        if producer != handle:
            index = stream.device.index
            bind_context(index)
            _copy.wait_for(index, handle, producer)


def after(stream: Stream, arrays: Iterable[Array]) -> None:
    """Record that ``stream`` used each array (see the module docstring)."""
    handle = stream.cuda_stream
    for a in arrays:
        if a.stream is stream:
            continue
        consumer = a.stream.cuda_stream
        if consumer == handle:
            continue
        try:
            a.record_stream(stream)
        except ValueError:  # not the allocator's memory: its stream waits for ours
            index = stream.device.index
            bind_context(index)
            _copy.wait_for(index, consumer, handle)
