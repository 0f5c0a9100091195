"""Softmax and log-softmax, forward and backward, on gpurt.

``softmax(x)``, ``log_softmax(x)``, ``softmax_backward(grad_out, out)`` and
``log_softmax_backward(grad_out, out)`` take gpurt Arrays or device arrays that gpurt views
without a copy (torch tensors, CuPy arrays: ``__cuda_array_interface__`` / ``__dlpack__``) of
float32, float16 or bfloat16 (accumulating in float32), with any number of leading dimensions.
They return a new gpurt Array, or write into ``out`` / ``grad_in`` and return it.

Each call reads every input element once and writes every output element once: the kernels in
softmax.cu keep a row in registers between its reduction and its outputs.
:func:`choose_variant` picks how rows are spread over threads from the row length, the dtype
and the operation (lane groups for short rows, one CTA per row, a thread-block cluster sharing
a row through distributed shared memory on sm_90, the longest of those also keeping part of
the row in shared memory, and for rows longer than a cluster holds -- 524k float32
elements forward, 262k backward; 16-bit rows past one CTA, 64k elements -- chunks of one CTA
each that take a row's chunks in order from a ticket (counters in the stream's kept
workspace, which the kernels leave zero) and wait for each other's partials, reading their
inputs once (16-bit forward: the rows at a launch's two ends in chunks of half size,
softmax_ends.cu), for some rows in a persistent grid that loads the next chunk while the current
one waits and writes; launches of few rows take small chunks even where one CTA or a cluster
would hold a row; before sm_90, or where a row's chunks cannot all be resident, a
two-launch split that reads its inputs twice).
Each variant is compiled once per architecture through :func:`gpurt.compile`
(cached on disk by gpurt); :func:`precompile` builds many in one NVRTC program.

Semantics follow torch: a row of only ``-inf`` gives NaN, NaN in a row gives a NaN row.
``dim`` may be any dimension: other than the last (with a size above 1 after it), the input
is copied with that axis last and the result is returned as a view in the input's axis
order (``out`` is then not accepted). Non-contiguous inputs are copied to a contiguous
array first; ``out`` must be contiguous. Host arrays are refused (TypeError).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

import gpurt
import gpurt.nvrtc
from gpurt import amp

from . import _autocast
from . import _gemm_workspace as workspace
from ._sms import usable_sms
from ._softmax_plan import (
    LOG_SOFTMAX,
    LOG_SOFTMAX_BACKWARD,
    MAX_GRID_X,
    SOFTMAX,
    SOFTMAX_BACKWARD,
    RowsView,
    Variant,
    choose_variant,
    dtype_code,
    row_access,
    rows_view,
    source_text,
)

__all__ = [
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "Variant",
    "choose_variant",
    "compile_variant",
    "precompile",
    "clear_plans",
]

# ---- compilation -------------------------------------------------------------------------------

_source: str | None = None
_NON_PORTABLE = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
_kernels: dict[tuple[str, str], Any] = {}  # (arch, name expression) -> Kernel
_lock = threading.Lock()
# a forked child gets a fresh lock (a parent thread may have held this one at the fork)
os.register_at_fork(after_in_child=lambda: globals().update(_lock=threading.Lock()))


def source() -> str:
    """The CUDA source of every variant (softmax.cu, then softmax_ends.cu)."""
    global _source
    if _source is None:
        _source = source_text()
    return _source


def compile_variant(variant: Variant, arch: str | None = None,
                    options: Sequence[str] = ()) -> Any:
    """Compile ``variant`` through gpurt.compile (for ``arch``, default: the current device)
    and return the Module."""
    return gpurt.compile(source(), options=options, name_expressions=variant.names(),
                         arch=arch, program_name="softmax.cu")


def precompile(variants: Iterable[Variant], arch: str | None = None) -> Any:
    """Compile many variants in one NVRTC program (one disk-cache entry) and use its kernels
    from now on; returns the Module. Worth it before a first use of many row lengths."""
    variants = list(dict.fromkeys(variants))
    names = tuple(dict.fromkeys(n for v in variants for n in v.names()))
    arch = arch or gpurt.get_arch()
    module = gpurt.compile(source(), name_expressions=names, arch=arch, program_name="softmax.cu")
    with _lock:
        for name in names:
            _kernels.setdefault((arch, name), module[name])
    return module


def _kernels_for(variant: Variant, arch: str) -> list[Any]:
    names = variant.names()
    found = [_kernels.get((arch, name)) for name in names]
    if None in found:
        module = compile_variant(variant, arch)
        with _lock:
            found = [_kernels.setdefault((arch, name), module[name]) for name in names]
    return found


# ---- arrays and streams ------------------------------------------------------------------------


def _as_array(obj: Any, what: str) -> Any:
    if isinstance(obj, gpurt.Array):
        return obj
    try:
        return gpurt.asarray(obj, copy=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a device array (gpurt, torch, CuPy...), "
                        f"got {type(obj).__name__}: {exc}") from exc


def _check_like(ref: Any, other: Any, what: str, ref_name: str) -> None:
    if tuple(other.shape) != tuple(ref.shape) or np.dtype(other.dtype) != np.dtype(ref.dtype):
        raise ValueError(f"{what} has shape {tuple(other.shape)} and dtype {other.dtype}; "
                         f"{ref_name} has shape {tuple(ref.shape)} and dtype {ref.dtype}")
    if other.device != ref.device:
        raise ValueError(f"{what} is on {other.device}, {ref_name} on {ref.device}")


def _last_axis_order(shape: Sequence[int], dim: int) -> tuple[int, ...] | None:
    """The axis order that puts ``dim`` last, or None when ``dim`` already spans the rows
    (it is the last dimension, or only size-1 dimensions follow it)."""
    ndim = len(shape)
    if ndim == 0:
        return None
    if not -ndim <= dim < ndim:
        rows_view(shape, None, 1, dim)  # raises torch's IndexError
    dim %= ndim
    if all(size == 1 for size in shape[dim + 1:]):
        return None
    return tuple(a for a in range(ndim) if a != dim) + (dim,)


@dataclasses.dataclass(frozen=True)
class _Call:
    """The launch of one variant for inputs of one signature (shape, strides, dtype, device,
    16-byte alignment of every array, op, dim): between calls only the arrays change.
    ``planned``: the launches checked and packed once (Kernel.planned), taking the stream
    handle (None: the current stream) and the pointers of the two inputs, the output (and the
    split's partials, or the ticket's counters and partials)."""

    planned: tuple[Any, ...]
    grid: int
    chunks: int  # split, ticket: chunks per row (0: one launch, nothing else)
    index: int
    # ticket: (float32 partials, zeroed counters the kernel leaves zero) from the
    # stream's kept workspace (kernels/_gemm_workspace.py): no memset per call
    room: tuple[int, int] = (0, 0)
    single: Any = dataclasses.field(init=False)  # the one planned launch; None: split, ticket

    def __post_init__(self) -> None:
        object.__setattr__(self, "single", None if self.chunks else self.planned[0])

    def launch(self, a: Any, b: Any, out: Any, stream: Any) -> None:
        handle = None if stream is None else gpurt.as_stream(stream, self.index).cuda_stream
        if not self.chunks:
            self.planned[0](handle, a.ptr, b.ptr, out.ptr)
            return
        if self.room[1]:  # counters the kernel leaves zero: no memset per call
            with workspace.LOCK:
                space = workspace.take(self.index, handle, *self.room)
                self.planned[0](handle, a.ptr, b.ptr, out.ptr, space.counters, space.partials)
            return
        alloc = None if stream is None else gpurt.as_stream(stream, self.index)
        partials = gpurt.empty((self.grid, 2), dtype=np.float32, device=self.index,
                               stream=alloc)
        self.planned[0](handle, a.ptr, b.ptr, partials.ptr)
        self.planned[1](handle, a.ptr, b.ptr, out.ptr, partials.ptr)


# Planned calls by signature (gpurt.nvrtc.plan_key of the op, dim and arrays); only contiguous
# inputs reduced over their last dimension.
_calls: dict[Any, _Call] = {}
_plan_key = gpurt.nvrtc.plan_key
# The same calls on the current stream as gpurt.nvrtc.dispatch runs them from C (key, lookup,
# output, launch), for gpurt Arrays and torch tensors alike: _dispatch(_direct, op, dim, first,
# second, out) returns (out,), or None for a call that goes through _call.
_direct: dict[Any, Any] = {}
_dispatch = gpurt.nvrtc.dispatch
_add_dispatch = gpurt.nvrtc.add_dispatch
_MAX_CALLS = 4096


def _signature(x: Any) -> tuple[Any, ...]:
    """What a plan depends on of one array: shape, strides, dtype (its number: gpurt's
    dtypes are canonical, and hashing a dtype object is slow), 16-byte alignment, device."""
    return (x.shape, x.strides, x.dtype.num, x.ptr & 15, x.device.index)


def clear_plans() -> None:
    """Forget every planned call (the next call of each signature plans it again)."""
    _calls.clear()
    _direct.clear()


def _call(op: int, inputs: tuple[Any, ...], dim: int, out: Any, out_name: str,
          stream: Any) -> Any:
    """Run ``op`` through its plan for this signature, or plan it first."""
    given = out
    if out is not None and type(out) is not gpurt.Array:
        out = _as_array(out, out_name)
    first = inputs[0]
    second = None if len(inputs) == 1 else inputs[1]
    key = _plan_key(op, dim, first, second, out)  # built in C: the hot path's main cost
    if key is None:  # an array of a subclass of gpurt.Array
        key = (op, dim, _signature(first), None if second is None else _signature(second),
               None if out is None else _signature(out))
    call = _calls.get(key)
    if call is None:
        result = _run(op, inputs, dim, out, out_name, stream, key)
        call = _calls.get(key)
        if call is not None and stream is None:
            _remember(key, call, first, second)
        return result if given is None else given
    if out is None:
        out = gpurt.empty(first.shape, dtype=first.dtype, device=call.index,
                          stream=None if stream is None else gpurt.as_stream(stream, call.index))
    # on call.index, whatever the current device
    single = call.single
    if single is not None and stream is None:  # one launch, current stream
        single(None, first.ptr, inputs[-1].ptr, out.ptr)
        _remember(key, call, first, second)
    else:
        call.launch(first, inputs[-1], out, stream)
    return out if given is None else given


def _remember(key: Any, call: _Call, first: Any, second: Any) -> None:
    """Let gpurt.nvrtc.dispatch take the calls of ``key`` on the current stream from now on
    (the items of _dispatch: op, dim, first, second, out; one launch only)."""
    if call.single is not None:
        _add_dispatch(_direct, key, call.single, (2, 2 if second is None else 3, 4), (4,),
                      ((first.shape, first.dtype, call.index),))


def _run(op: int, inputs: Sequence[Any], dim: int, out: Any, out_name: str,
         stream: Any, key: Any = None) -> Any:
    """Check the inputs, make or check the output, choose the variant and launch; return
    the output (``out`` itself when given). A plan that launches on the inputs themselves
    is remembered under ``key``."""
    first = inputs[0]
    dtype_code(first.dtype)  # TypeError for unsupported dtypes, before any work
    order = _last_axis_order(first.shape, dim)
    if order is not None:
        if out is not None:
            raise ValueError(f"{out_name}= needs dim to be the last dimension (got dim={dim})")
        moved = [a.transpose(order).contiguous() for a in inputs]
        result = _run(op, moved, -1, None, out_name, stream)
        return result.transpose(tuple(int(i) for i in np.argsort(order)))
    direct = all(a.is_contiguous() for a in inputs)
    inputs = [a if a.is_contiguous() else a.contiguous() for a in inputs]
    view = rows_view(first.shape, None, 1, dim)
    index = first.device.index
    alloc_stream = None if stream is None else gpurt.as_stream(stream, index)
    if out is None:
        target = returned = gpurt.empty(tuple(first.shape), dtype=first.dtype, device=index,
                                        stream=alloc_stream)
    else:
        target, returned = _as_array(out, out_name), out
        _check_like(first, target, out_name, "the input")
        if not target.is_contiguous():
            raise ValueError(f"{out_name} must be C-contiguous (strides {target.strides})")
    if view.rows == 0 or view.cols == 0:
        return returned
    if index == gpurt.current_device():
        call = _plan(op, inputs, target, view, index)
    else:
        with gpurt.device(index):
            call = _plan(op, inputs, target, view, index)
    if key is not None and direct and len(_calls) < _MAX_CALLS:
        _calls[key] = call
    call.launch(inputs[0], inputs[-1], target, stream)
    return returned


def _plan(op: int, inputs: Sequence[Any], out: Any, view: RowsView, index: int) -> _Call:
    major, _ = gpurt.get_device_capability(index)
    itemsize = np.dtype(out.dtype).itemsize
    vec, edges = row_access(view.cols, itemsize, [a.ptr for a in (*inputs, out)])
    variant = choose_variant(view.cols, out.dtype, op, vec=vec, edges=edges,
                             clusters=major >= 9, rows=view.rows)
    if variant.kind == "ticket" and not tickets_fit(variant, variant.most_chunks(view.cols),
                                                    index):
        variant = choose_variant(view.cols, out.dtype, op, vec=vec, edges=edges, tickets=False)
    return plan_variant(launch_form(variant, view.rows, view.cols, index), inputs, out, view,
                        index)


def launch_form(variant: Variant, rows: int, cols: int, index: int) -> Variant:
    """The form of ``variant`` a launch of ``rows`` x ``cols`` on device ``index`` takes
    (Variant.for_launch: one-wave launches drop the ends or the persistent grid)."""
    if variant.ends or variant.persist:
        return variant.for_launch(rows, cols, resident_ctas(variant, index))
    return variant


def tickets_fit(variant: Variant, chunks: int, index: int) -> bool:
    """Whether device ``index`` (the current device) holds ``chunks`` CTAs of the ticket
    ``variant`` at once: a row's chunks wait for each other, so fewer would never finish."""
    return resident_ctas(variant, index) >= chunks


def resident_ctas(variant: Variant, index: int) -> int:
    """How many CTAs of ``variant`` device ``index`` holds at once (occupancy calculator)."""
    kernel = _kernels_for(variant, gpurt.get_arch(index))[0]
    per_sm = kernel.max_active_blocks_per_multiprocessor(variant.threads, variant.shared_mem)
    return per_sm * usable_sms(index, gpurt.get_device_properties(index).multi_processor_count)


def plan_variant(variant: Variant, inputs: Sequence[Any], out: Any, view: RowsView,
                 index: int) -> _Call:
    """The planned launch(es) of ``variant`` for these arrays on device ``index`` (the
    chooser's pick, or a forced one in benchmarks/softmax_edges_dev.py; the caller checks
    that it suits them)."""
    grid = variant.grid(view.rows, view.cols)
    if grid > MAX_GRID_X:
        raise ValueError(f"{view.rows} rows of {view.cols} need more than one launch")
    kernels = tuple(_kernels_for(variant, gpurt.get_arch(index)))
    if variant.non_portable:  # forced variants only; idempotent
        kernels[0].set_attribute(_NON_PORTABLE, 1, device=index)
    a, b = inputs[0].ptr, inputs[-1].ptr
    if variant.kind == "ticket":
        chunks = variant.chunks(view.cols)
        if variant.persist:  # as many CTAs as fit at once, each walking chunks
            grid = max(1, min(grid, resident_ctas(variant, index)))
        args: tuple[int, ...] = (view.rows, view.cols, chunks)
        if variant.ends:  # the launch's first and last rows in small chunks
            head, tail = variant.ends_rows(view.rows, view.cols, resident_ctas(variant, index))
            grid = variant.ends_grid(view.rows, view.cols, head, tail)
            args += (variant.most_chunks(view.cols), head, tail)
            if grid > MAX_GRID_X:
                raise ValueError(f"{view.rows} rows of {view.cols} need more than one launch")
        config = gpurt.LaunchConfig(grid, variant.threads, variant.shared_mem)
        one = kernels[0].planned(config, a, b, out.ptr, 0, 0, *args,
                                 varying=(0, 1, 2, 3, 4), device=index)
        return _Call((one,), grid, chunks, index, room=variant.workspace(view.rows, view.cols))
    if variant.kind != "split":
        config = gpurt.LaunchConfig(grid, variant.threads, variant.shared_mem)
        one = kernels[0].planned(config, a, b, out.ptr, view.rows, view.cols,
                                 varying=(0, 1, 2), device=index)
        return _Call((one,), grid, 0, index)
    chunks = variant.chunks(view.cols)
    config = gpurt.LaunchConfig(grid, variant.threads)
    planned = (kernels[0].planned(config, a, b, 0, view.rows, view.cols, chunks,
                                  varying=(0, 1, 2), device=index),
               kernels[1].planned(config, a, b, out.ptr, 0, view.rows, view.cols, chunks,
                                  varying=(0, 1, 2, 3), device=index))
    return _Call(planned, grid, chunks, index)


# ---- public API --------------------------------------------------------------------------------


def softmax(x: Any, dim: int = -1, out: Any = None, stream: Any = None, *,
            dtype: Any = None) -> Any:
    """``exp(x) / sum(exp(x))`` over ``dim``, like torch.softmax.

    ``x``: a float32/float16/bfloat16 device array (gpurt, torch, CuPy). Returns ``out``
    when given (same shape and dtype, C-contiguous; may be ``x`` itself), else a new gpurt
    Array. Runs on ``stream`` (gpurt, torch or CuPy stream, or a handle; default: gpurt's
    current stream). ``dtype``: cast ``x`` to it first (torch's ``dtype=``); inside
    :class:`gpurt.amp.autocast` it defaults to float32 when ``out`` is None, as torch's."""
    if amp.ANY_ENABLED or dtype is not None:  # autocast or dtype=: kernels/_autocast.py
        x = _autocast.softmax_input(x, dtype, out, stream)
    elif stream is None:
        done = _dispatch(_direct, SOFTMAX, dim, x, None, out)  # a repeated call, from C
        if done is not None:
            return done[0]
    return _call(SOFTMAX, (x if type(x) is gpurt.Array else _as_array(x, "x"),), dim, out,
                 "out", stream)


def log_softmax(x: Any, dim: int = -1, out: Any = None, stream: Any = None, *,
                dtype: Any = None) -> Any:
    """``x - max - log(sum(exp(x - max)))`` over ``dim``, like torch.log_softmax
    (``dtype`` and autocast as :func:`softmax`)."""
    if amp.ANY_ENABLED or dtype is not None:  # autocast or dtype=: kernels/_autocast.py
        x = _autocast.softmax_input(x, dtype, out, stream)
    elif stream is None:
        done = _dispatch(_direct, LOG_SOFTMAX, dim, x, None, out)
        if done is not None:
            return done[0]
    return _call(LOG_SOFTMAX, (x if type(x) is gpurt.Array else _as_array(x, "x"),), dim,
                 out, "out", stream)


def _backward(op: int, grad_out: Any, out: Any, dim: int, grad_in: Any, stream: Any) -> Any:
    if stream is None:
        done = _dispatch(_direct, op, dim, out, grad_out, grad_in)
        if done is not None:
            return done[0]
    y = out if type(out) is gpurt.Array else _as_array(out, "out")
    dy = grad_out if type(grad_out) is gpurt.Array else _as_array(grad_out, "grad_out")
    if y.shape != dy.shape or y.dtype != dy.dtype or y.device != dy.device:
        _check_like(y, dy, "grad_out", "out")
    return _call(op, (y, dy), dim, grad_in, "grad_in", stream)


def softmax_backward(grad_out: Any, out: Any, dim: int = -1, *, grad_in: Any = None,
                     stream: Any = None) -> Any:
    """Gradient of softmax from its output ``out`` and ``grad_out``:
    ``out * (grad_out - sum(grad_out * out))`` in one kernel (torch's
    ``_softmax_backward_data``). Returns ``grad_in`` when given, else a new gpurt Array."""
    return _backward(SOFTMAX_BACKWARD, grad_out, out, dim, grad_in, stream)


def log_softmax_backward(grad_out: Any, out: Any, dim: int = -1, *, grad_in: Any = None,
                         stream: Any = None) -> Any:
    """Gradient of log_softmax from its output ``out`` and ``grad_out``:
    ``grad_out - exp(out) * sum(grad_out)`` in one kernel."""
    return _backward(LOG_SOFTMAX_BACKWARD, grad_out, out, dim, grad_in, stream)
