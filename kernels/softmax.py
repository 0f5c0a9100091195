"""Softmax and log-softmax over the last dimension, forward and backward, on gpurt.

``softmax(x)``, ``log_softmax(x)``, ``softmax_backward(grad_out, out)`` and
``log_softmax_backward(grad_out, out)`` take gpurt Arrays or any device array gpurt can view
without a copy (torch tensors, CuPy arrays: ``__dlpack__`` / ``__cuda_array_interface__``), of
float32, float16 or bfloat16 (accumulating in float32), C-contiguous, with any number of leading
dimensions. They return a new gpurt Array, or write into ``out``/``grad_in`` when one is given.

Each call reads every input element once and writes every output element once: the kernels in
softmax.cu keep a row on chip between its reduction and its outputs. :func:`choose_variant`
picks how a row is spread over threads from its length, the dtype and the operation:

``rows``     a group of up to 32 lanes per row (several rows per CTA; warp shuffles only), or a
             whole CTA of up to 512 threads per row;
``cluster``  a thread-block cluster of 2-8 CTAs per row sharing the row's max and sum through
             distributed shared memory (sm_90 and newer);
``split``    rows longer than a cluster holds (about 131k elements forward, 65k backward): a
             per-chunk reduction into a small workspace, then a second launch that re-reads the
             chunk and writes it (the only variant that reads its inputs twice).

Each variant is compiled once per device architecture through :func:`gpurt.compile` (cached on
disk by gpurt) and kept in memory afterwards.

Semantics follow torch: a row of only ``-inf`` gives NaN, NaN inputs give a NaN row, ``dim``
must name the last dimension (or one followed only by size-1 dimensions; move the axis last
with a contiguous copy otherwise). Non-contiguous inputs raise ValueError rather than copying.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import numpy as np

import gpurt

from ._softmax_plan import (
    LOG_SOFTMAX,
    LOG_SOFTMAX_BACKWARD,
    MAX_GRID_X,
    SOFTMAX,
    SOFTMAX_BACKWARD,
    SOURCE_PATH,
    RowsView,
    dtype_code,
    Variant,
    choose_variant,
    rows_view,
    widest_vec,
)

__all__ = [
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "Variant",
    "choose_variant",
    "compile_variant",
]

# ---- compilation -------------------------------------------------------------------------------

_source: Optional[str] = None
_kernels: dict[tuple[str, Variant], tuple[Any, ...]] = {}
_lock = threading.Lock()


def source() -> str:
    """The CUDA source of every variant (softmax.cu)."""
    global _source
    if _source is None:
        _source = SOURCE_PATH.read_text()
    return _source


def compile_variant(variant: Variant, arch: Optional[str] = None) -> Any:
    """Compile ``variant`` through gpurt.compile (for ``arch``, default: the current device)
    and return the Module."""
    return gpurt.compile(source(), name_expressions=variant.names(), arch=arch)


def _kernels_for(variant: Variant, arch: str) -> tuple[Any, ...]:
    key = (arch, variant)
    found = _kernels.get(key)
    if found is None:
        with _lock:
            found = _kernels.get(key)
            if found is None:
                module = compile_variant(variant, arch)
                found = _kernels[key] = tuple(module[name] for name in variant.names())
    return found


# ---- arrays ------------------------------------------------------------------------------------


def _as_array(obj: Any, what: str) -> Any:
    if isinstance(obj, gpurt.Array):
        return obj
    try:
        return gpurt.asarray(obj)
    except Exception as exc:
        raise TypeError(
            f"{what} must be a gpurt Array or a device array (torch, CuPy...), "
            f"got {type(obj).__name__}: {exc}"
        ) from exc


def _check_like(ref: Any, other: Any, what: str, ref_name: str) -> None:
    if tuple(other.shape) != tuple(ref.shape) or np.dtype(other.dtype) != np.dtype(ref.dtype):
        raise ValueError(
            f"{what} has shape {tuple(other.shape)} and dtype {other.dtype}; "
            f"{ref_name} has shape {tuple(ref.shape)} and dtype {ref.dtype}"
        )
    if other.device != ref.device:
        raise ValueError(f"{what} is on {other.device}, {ref_name} on {ref.device}")


def _plan(op: int, inputs: Sequence[Any], dim: int) -> RowsView:
    """Check dtype, shape, layout and devices of the inputs; return their rows x cols."""
    first = inputs[0]
    dtype_code(first.dtype)
    view = rows_view(first.shape, first.strides, np.dtype(first.dtype).itemsize, dim)
    for other in inputs[1:]:
        rows_view(other.shape, other.strides, np.dtype(other.dtype).itemsize, dim)
    return view


def _output(ref: Any, given: Any, what: str, ref_name: str, stream: Any) -> tuple[Any, Any]:
    """(array to write, object to return): ``given`` checked against ``ref``, or a new one."""
    if given is None:
        made = gpurt.empty(tuple(ref.shape), dtype=ref.dtype, device=ref.device, stream=stream)
        return made, made
    array = _as_array(given, what)
    _check_like(ref, array, what, ref_name)
    rows_view(array.shape, array.strides, np.dtype(array.dtype).itemsize, -1)
    return array, given


def _run(op: int, inputs: Sequence[Any], dim: int, out: Any, out_name: str,
         stream: Any) -> Any:
    """Validate, make or check the output, choose the variant and launch; return the
    output (``out`` itself when given)."""
    view = _plan(op, inputs, dim)
    target, returned = _output(inputs[0], out, out_name, "the input", stream)
    if view.rows == 0 or view.cols == 0:
        return returned
    index = target.device.index
    if index == gpurt.current_device():
        _launch(op, inputs, target, view, index, stream)
    else:
        with gpurt.device(index):
            _launch(op, inputs, target, view, index, stream)
    return returned


def _launch(op: int, inputs: Sequence[Any], out: Any, view: RowsView, index: int,
            stream: Any) -> None:
    major, _ = gpurt.get_device_capability(index)
    itemsize = np.dtype(out.dtype).itemsize
    vec = widest_vec(view.cols, itemsize, [a.ptr for a in (*inputs, out)])
    variant = choose_variant(view.cols, out.dtype, op, vec=vec, clusters=major >= 9)
    grid = variant.grid(view.rows, view.cols)
    if grid > MAX_GRID_X:
        raise ValueError(f"{view.rows} rows of {view.cols} need more than one launch")
    kernels = _kernels_for(variant, gpurt.get_arch(index))
    a = inputs[0]
    b = inputs[-1]  # backward: dy; forward: unused (x again)
    rows, cols = np.int64(view.rows), np.int32(view.cols)
    block, smem = variant.threads, variant.shared_mem
    if variant.kind != "split":
        kernels[0](grid, block, (a, b, out, rows, cols), shared_mem=smem, stream=stream)
        return
    chunks = np.int32(variant.chunks(view.cols))
    partials = gpurt.empty((grid, 2), dtype=np.float32, device=out.device, stream=stream)
    kernels[0](grid, block, (a, b, partials, rows, cols, chunks), shared_mem=smem, stream=stream)
    kernels[1](grid, block, (a, b, out, partials, rows, cols, chunks), shared_mem=smem,
               stream=stream)


# ---- public API --------------------------------------------------------------------------------


def softmax(x: Any, dim: int = -1, out: Any = None, stream: Any = None) -> Any:
    """``exp(x) / sum(exp(x))`` over ``dim`` (the last dimension), like torch.softmax.

    ``x``: float32/float16/bfloat16, C-contiguous gpurt Array or torch/CuPy array. Returns
    ``out`` when given (same shape and dtype; may be ``x`` itself), else a new gpurt Array.
    Runs on ``stream`` (default: gpurt's current stream)."""
    return _run(SOFTMAX, (_as_array(x, "x"),), dim, out, "out", stream)


def log_softmax(x: Any, dim: int = -1, out: Any = None, stream: Any = None) -> Any:
    """``x - max - log(sum(exp(x - max)))`` over ``dim``, like torch.log_softmax."""
    return _run(LOG_SOFTMAX, (_as_array(x, "x"),), dim, out, "out", stream)


def _backward(op: int, grad_out: Any, out: Any, dim: int, grad_in: Any, stream: Any) -> Any:
    y = _as_array(out, "out")
    dy = _as_array(grad_out, "grad_out")
    _check_like(y, dy, "grad_out", "out")
    return _run(op, (y, dy), dim, grad_in, "grad_in", stream)


def softmax_backward(grad_out: Any, out: Any, dim: int = -1, *, grad_in: Any = None,
                     stream: Any = None) -> Any:
    """Gradient of softmax from its output ``out`` and ``grad_out``:
    ``out * (grad_out - sum(grad_out * out))`` in one kernel (torch's _softmax_backward_data).
    Returns ``grad_in`` when given, else a new gpurt Array."""
    return _backward(SOFTMAX_BACKWARD, grad_out, out, dim, grad_in, stream)


def log_softmax_backward(grad_out: Any, out: Any, dim: int = -1, *, grad_in: Any = None,
                         stream: Any = None) -> Any:
    """Gradient of log_softmax from its output ``out`` and ``grad_out``:
    ``grad_out - exp(out) * sum(grad_out)`` in one kernel."""
    return _backward(LOG_SOFTMAX_BACKWARD, grad_out, out, dim, grad_in, stream)
