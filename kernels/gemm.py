"""Matrix multiplication on gpurt: ``gemm(a, b)`` computes ``alpha * op(a) @ op(b) + beta * c``.

Inputs are 2-D gpurt Arrays or any device array gpurt views without a copy (torch tensors,
CuPy arrays) of float32, float16 or bfloat16; ``op(x)`` is ``x.T`` when ``trans_x`` is set.
Each operand may be row- or column-major (any row pitch): a transposed view costs nothing.
Accumulation is always fp32. Five kernel families (CUDA sources kernels/gemm_*.cu):

``simt``   exact fp32 on the CUDA cores (2-D block and warp tiling, a cp.async ring);
``mma``    fp16/bf16 (and TF32 with ``allow_tf32=True``) on the tensor cores with mma.sync,
           any sm_80+ GPU and any alignment, optionally splitting K over CTAs;
``wgmma``  fp16/bf16 and TF32 on Hopper (sm_90a): TMA loads, wgmma, warp specialisation
           with setmaxnreg, an mbarrier ring, a persistent grid in grouped order, an epilogue
           through shared memory and TMA stores (optionally 2-CTA clusters sharing B by
           multicast); needs 16-byte aligned rows (TMA's rule): big problems whose rows are
           not copy those operands into 128-byte rows first (kernels/_gemm_pack.py), the
           others run on ``mma``.
           TF32 needs one operand K-major (kernels/gemm_wgmma_tf32.cu says why).
``skinny`` fp16/bf16 decode shapes (one side of C a few dozen at most): the big operand
           streamed once into mma.sync fragments, K split over a thread-block cluster
           (kernels/_gemm_skinny.py); any sm_80+ GPU and any alignment.
``decode`` fp16/bf16 and TF32 decode shapes on Hopper (one side of C at most 128):
           C^T = B^T A^T on wgmma with the small side on wgmma's N, TMA rings, K split over a
           cluster summed through distributed shared memory (kernels/_gemm_decode.py);
           16-byte aligned rows; TF32 needs the small operand K-major.

The variant and its tiles come from kernels/_gemm_tune.py's candidates and heuristic, timed
once per shape bucket by kernels/_gemm_tuner.py and remembered on disk when autotuning is on
(``GPURT_GEMM_AUTOTUNE=0`` turns it off), chosen by the heuristic otherwise. Kernels compile
through :func:`gpurt.compile` (cached on disk).
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from cuda.bindings import driver as cu

import gpurt
import gpurt.nvrtc
from gpurt import amp, sanitizer

from . import _autocast, tunable
from . import _gemm_pack as pack
from . import _gemm_rows as rows
from . import _gemm_tune as tune
from . import _gemm_tuner as tuning
from . import _gemm_workspace as workspace
from ._gemm_launch import (
    Call,
    make_call,
    planned_call,
    precompile,
    source_digest,
)
from ._gemm_tune import DT_BF16, DT_F16, DT_F32, DT_TF32, Config, Problem
from ._sms import usable_sms

__all__ = ["gemm", "gemm_config", "gemm_eligible_configs", "gemm_tuning_results",
           "clear_gemm_tuning", "clear_plans", "precompile"]

_HERE = pathlib.Path(__file__).resolve().parent
_DTYPES = {np.dtype(np.float32): DT_F32, np.dtype(np.float16): DT_F16,
           np.dtype(ml_dtypes.bfloat16): DT_BF16}  # gpurt.bfloat16
_TMA_TYPES = {DT_F16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              DT_BF16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}

# ---- operands ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Operand:
    """A logical (rows x k) matrix: element (i, j) at ptr + (i*ld + j if kmajor else j*ld + i)
    elements. ``array`` keeps the memory alive."""

    array: Any
    ptr: int
    ld: int
    kmajor: bool


def _as_array(obj: Any, what: str) -> Any:
    if isinstance(obj, gpurt.Array):
        return obj
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{what} is a numpy array in host memory; pass a device array "
                        "(gpurt.asarray(x) copies it to the device)")
    try:
        return gpurt.asarray(obj)
    except Exception as exc:
        raise TypeError(f"{what} must be a gpurt Array or a device array (torch, CuPy...), "
                        f"got {type(obj).__name__}: {exc}") from exc


def _element_strides(x: Any) -> tuple[int, int]:
    size = x.dtype.itemsize
    if any(s % size for s in x.strides):
        return (0, 0)  # strides that are not whole elements: copy
    return (x.strides[0] // size, x.strides[1] // size)


def _round_up(value: int, to: int) -> int:
    return -(-max(value, 1) // to) * to


def _layouts(rows: int, cols: int, s_rows: int, s_cols: int, align: int) -> list[tuple[int, bool]]:
    """(ld, cols-contiguous) layouts a (rows x cols) view with these element strides has,
    16-byte aligned pitches first. Size-1 dimensions take any stride (an aligned one is made up)."""
    found = []
    if s_cols == 1 or cols == 1:
        ld = s_rows if rows > 1 else _round_up(cols, align)
        if ld >= cols:
            found.append((ld, True))
    if s_rows == 1 or rows == 1:
        ld = s_cols if cols > 1 else _round_up(rows, align)
        if ld >= rows:
            found.append((ld, False))
    return sorted(found, key=lambda item: item[0] % align != 0)


def _operand(x: Any, trans: bool) -> tuple[_Operand, int, int]:
    """The operand for op(x) (x.T when ``trans``), its rows and its K."""
    s0, s1 = _element_strides(x)
    rows, k = (x.shape[1], x.shape[0]) if trans else x.shape
    s_rows, s_k = (s1, s0) if trans else (s0, s1)
    layouts = _layouts(rows, k, s_rows, s_k, 16 // x.dtype.itemsize)
    if not layouts:  # no unit stride (or a negative/broadcast one): a contiguous copy
        return _operand(x.clone(), trans)
    ld, kmajor = layouts[0]
    return _Operand(x, int(x.ptr), ld, kmajor), rows, k


def _extent(x: Any) -> tuple[int, int]:
    """[first byte, last byte + 1) that the view ``x`` touches."""
    lo = hi = int(x.ptr)
    for dim, stride in zip(x.shape, x.strides):
        if dim == 0:
            return (lo, lo)
        span = (dim - 1) * stride
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return (lo, hi + x.dtype.itemsize)



def _matching(x: Any, name: str, m: int, n: int, a: gpurt.Array) -> gpurt.Array:
    """``x`` as a gpurt Array, checked to be an m x n matrix of a's dtype on a's device."""
    x = _as_array(x, name)
    if tuple(x.shape) != (m, n) or np.dtype(x.dtype) != np.dtype(a.dtype):
        raise ValueError(f"{name} must be {m}x{n} {a.dtype}, got {tuple(x.shape)} {x.dtype}")
    if x.device != a.device:
        raise ValueError(f"{name} is on {x.device} but the inputs are on {a.device}")
    return x

def _overlaps(x: Any, y: Any) -> bool:
    (a0, a1), (b0, b1) = _extent(x), _extent(y)
    return a0 < b1 and b0 < a1


# ---- the problem and its plan -------------------------------------------------------------------


@dataclasses.dataclass
class _Plan:
    """Everything one launch needs: the (possibly swapped) operands, sizes and output."""

    a: _Operand
    b: _Operand
    m: int
    n: int
    k: int
    out: Any  # row-major (m x n) target, ldc
    ldc: int
    cin: Any  # None when beta == 0
    ldcin: int
    dt: int
    index: int


def _check_dtype(a: Any, b: Any) -> int:
    dt = _DTYPES.get(np.dtype(a.dtype))
    if dt is None:
        raise TypeError(f"gemm takes float32, float16 or bfloat16, not {a.dtype}")
    if np.dtype(b.dtype) != np.dtype(a.dtype):
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}; gemm does not mix dtypes")
    return dt


def _row_major_view(x: Any, rows: int, cols: int, copy: bool) -> tuple[Any, int, bool]:
    """(array, ld, swapped) with x (rows x cols) seen row-major (swapped: as x.T row-major).
    Without a unit stride: a contiguous copy when ``copy``, else (None, 0, False)."""
    s0, s1 = _element_strides(x)
    align = 16 // x.dtype.itemsize
    for ld, row_major in _layouts(rows, cols, s0, s1, align):
        return x, ld, not row_major
    if not copy:
        return None, 0, False
    return x.clone(), max(cols, 1), False


def _operands(a: Any, b: Any, trans_a: bool,
              trans_b: bool) -> tuple[Any, Any, _Operand, _Operand, int, int, int, int]:
    """(a and b as Arrays, A, B, M, N, K, dtype code) of op(a) @ op(b), validated. B (K x N)
    is described by its transpose (N x K), so K-major means the same for both operands."""
    a, b = _as_array(a, "a"), _as_array(b, "b")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm takes 2-D matrices, got shapes {a.shape} and {b.shape}")
    dt = _check_dtype(a, b)
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    op_a, m, k = _operand(a, trans_a)
    op_b, n, k_b = _operand(b, not trans_b)
    if k != k_b:
        raise ValueError(f"op(a) is {m}x{k} but op(b) is {k_b}x{n}: inner dimensions differ")
    return a, b, op_a, op_b, m, n, k, dt


def _plan(a: Any, b: Any, out: Any, beta: float, c: Any, trans_a: bool, trans_b: bool,
          stream: Any) -> tuple[_Plan, Any, Any]:
    """Validate everything; return (plan, object to return, array to copy the result into).
    ``stream`` is a gpurt Stream."""
    a, b, op_a, op_b, m, n, k, dt = _operands(a, b, trans_a, trans_b)
    given = out
    if out is None:
        out = returned = gpurt.empty((m, n), dtype=a.dtype, device=a.device, stream=stream)
    else:
        returned = out
        out = _matching(out, "out", m, n, a)
        if out.size and (_overlaps(out, a) or _overlaps(out, b)):
            raise ValueError("out overlaps a or b; gemm cannot write over its inputs")
    target, ldc, swapped = _row_major_view(out, m, n, copy=False)
    copy_back = None
    if target is None:  # no unit stride: compute into a contiguous array, then copy
        copy_back = out
        target = gpurt.empty((m, n), dtype=a.dtype, device=a.device, stream=stream)
        ldc, swapped = n, False
    cin, ldcin = None, 0
    if beta != 0.0:
        if c is None:
            if given is None:
                raise ValueError("beta != 0 needs c (or out, which then also serves as c)")
            c = out
        c = _matching(c, "c", m, n, a)
        cin, ldcin, c_swapped = _row_major_view(c, m, n, copy=True)
        if c_swapped != swapped:  # c's orientation must follow the output's
            cin = c.T.clone() if swapped else c.clone()
            ldcin = m if swapped else n
        elif _overlaps(cin, target) and (cin.ptr != target.ptr or ldcin != ldc):
            cin, ldcin = cin.clone(), (m if swapped else n)
    if swapped:  # C^T = op(b)^T op(a)^T, written row-major into out's memory
        op_a, op_b, m, n = op_b, op_a, n, m
    plan = _Plan(op_a, op_b, m, n, k, target, ldc, cin, ldcin, dt, a.device.index)
    return plan, returned, copy_back


def _problem(plan: _Plan, allow_tf32: bool) -> Problem:
    props = gpurt.get_device_properties(plan.index)
    dt = DT_TF32 if plan.dt == DT_F32 and allow_tf32 else plan.dt
    itemsize = 4 if plan.dt == DT_F32 else 2
    align = 16 // itemsize
    aligned = all(op.ptr % 16 == 0 and op.ld % align == 0 for op in (plan.a, plan.b))
    # exact fp32 (simt) loads only rows along M or N 16 bytes at a time (K-major ones 4 bytes
    # at a time, transposing, at any alignment): only those need 16-byte rows for its vec
    vec = aligned if dt != DT_F32 else all(
        op.kmajor or (op.ptr % 16 == 0 and op.ld % align == 0) for op in (plan.a, plan.b))
    # K == 0 leaves nothing to load: out = beta * c through any kernel's epilogue but wgmma's
    tma = (aligned and dt in (DT_F16, DT_BF16, DT_TF32)
           and max(plan.a.ld, plan.b.ld) * itemsize < (1 << 40) and plan.k > 0)
    pitch128 = all(op.ptr % 128 == 0 and op.ld * itemsize % 128 == 0 for op in (plan.a, plan.b))
    return Problem(plan.m, plan.n, plan.k, dt, plan.a.kmajor, plan.b.kmajor, vec, tma,
                   (props.major, props.minor), usable_sms(plan.index, props.multi_processor_count),
                   int(props.shared_memory_per_block_optin), pitch128)


# ---- choosing a config ---------------------------------------------------------------------------

def _tuner() -> tuning.Tuner:
    return tunable.tuner()


def _capturing(stream: Any, index: int) -> bool:
    """Whether ``stream`` is capturing a graph (then nothing may be timed or synchronized)."""
    handle = stream.cuda_stream
    status = gpurt.check(cu.cuStreamIsCapturing(cu.CUstream(handle)), "cuStreamIsCapturing")
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


_SPIN = r"""
extern "C" __global__ void gemm_tune_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


_MAX_ROTATING_COPIES = 32


def _span_bytes(op: _Operand, rows: int, k: int, itemsize: int) -> int:
    """Bytes from ``op.ptr`` to one past the last element of its (rows x k) matrix."""
    inner, outer = (k, rows) if op.kmajor else (rows, k)
    return ((outer - 1) * op.ld + inner) * itemsize


def _rotating_operands(plan: _Plan, stream: Any) -> tuple[list[tuple[int, int]], list[Any]]:
    """The (A, B) pointers the tuner's timed runs take in turn: the plan's own, then, where
    those are smaller than :func:`tunable.rotating_bytes` (torch.cuda.tunable's rotating
    buffer), copies at the same alignment (modulo 256 bytes) that hold that much more; and
    the arrays that hold the copies. Memory too short for a copy only means fewer copies."""
    itemsize = 4 if plan.dt == DT_F32 else 2
    spans = (_span_bytes(plan.a, plan.m, plan.k, itemsize),
             _span_bytes(plan.b, plan.n, plan.k, itemsize))
    want = tunable.rotating_bytes(gpurt.get_device_properties(plan.index).L2_cache_size)
    copies = min(_MAX_ROTATING_COPIES, -(-want // sum(spans))) if sum(spans) < want else 0
    pairs, held = [(plan.a.ptr, plan.b.ptr)], []
    try:
        for _ in range(copies):
            pair = []
            for op, span in zip((plan.a, plan.b), spans):
                room = gpurt.empty((span + 256,), dtype=np.uint8, device=plan.index,
                                   stream=stream)
                at = room.ptr + (op.ptr - room.ptr) % 256
                gpurt.check(cu.cuMemcpyDtoDAsync(at, op.ptr, span, stream.cuda_stream),
                            "cuMemcpyDtoDAsync")
                held.append(room)
                pair.append(at)
            pairs.append((pair[0], pair[1]))
    except gpurt.OutOfMemoryError:
        pass
    return pairs, held


def _time_config(plan: _Plan, problem: Problem, config: Config, tuning_stream: Any,
                 operands: list[tuple[int, int]]) -> float:
    """Device time (ms) of one run of ``config`` into a scratch output, the runs taking the
    ``operands`` pairs in turn: the median of three batches, each queued behind a spin kernel
    so that host time never counts as device time."""
    scratch = gpurt.empty((plan.m, plan.n), dtype=plan.out.dtype, device=plan.index,
                          stream=tuning_stream)
    spin = gpurt.compile(_SPIN, arch=gpurt.get_arch(plan.index))["gemm_tune_spin"]
    into_scratch = dataclasses.replace(plan, out=scratch, ldc=plan.n, cin=None, ldcin=0)

    turn = itertools.cycle(operands)

    def batch(count: int) -> float:
        cycles = int(2e9 * (200e-6 + count * 150e-6))  # covers the host enqueueing `count`
        spin(1, 1, (cycles,), stream=tuning_stream)
        start, stop = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
        start.record(tuning_stream)
        for _ in range(count):
            a_ptr, b_ptr = next(turn)
            call.launch(a_ptr, b_ptr, scratch.ptr, 0, 1.0, 0.0, tuning_stream)
        stop.record(tuning_stream)
        stop.synchronize()
        return start.elapsed_time(stop) / count

    try:
        call = make_call(into_scratch, problem, config, scratch.ptr)
        first = batch(1)  # loads and warms up
        # three batches of about 2 ms each, within the tunable limits per candidate
        budget_ms = min(6.0, tunable.get_max_tuning_duration())
        runs = min(int(budget_ms / max(first, 1e-3)), tunable.get_max_tuning_iterations())
        count = max(1, min(20, runs // 3))
        return sorted(batch(count) for _ in range(3))[1]
    finally:
        tuning_stream.synchronize()


def _choose(plan: _Plan, problem: Problem, stream: Any,
            timing_plan: Callable[[], _Plan] | None = None) -> Config:
    """The config for ``problem``: remembered, timed, or the heuristic's. ``timing_plan``
    makes the plan to time with where ``plan``'s operands are placeholders (the packed route's
    copies)."""
    if not tunable.is_enabled() or problem.macs < tuning.TUNE_MIN_MACS:
        return tune.heuristic(problem)
    tuner = _tuner()
    name = gpurt.get_device_name(plan.index)
    key = tuning.problem_key(problem, name, source_digest())
    known = tuner.lookup(key)
    if known is not None and tune.eligible(problem, known):
        return known
    if not tunable.tuning_is_enabled() or _capturing(stream, plan.index):
        return tune.heuristic(problem)
    if timing_plan is not None:
        plan = timing_plan()
    gpurt.synchronize(plan.index)  # the inputs may come from any stream
    with gpurt.device(plan.index):
        tuning_stream = gpurt.Stream()
    operands, _held = _rotating_operands(plan, tuning_stream)  # the copies live until here
    return tuner.choose(key, tune.candidates(problem), lambda config: _time_config(
        plan, problem, config, tuning_stream, operands))


# ---- public API ----------------------------------------------------------------------------------


def gemm(a: Any, b: Any, out: Any = None, alpha: float = 1.0, beta: float = 0.0, c: Any = None,
         trans_a: bool = False, trans_b: bool = False, stream: Any = None, *,
         allow_tf32: bool = False, config: Config | None = None) -> Any:
    """``alpha * op(a) @ op(b) + beta * c`` with ``op(x) = x.T`` when ``trans_x``.

    ``a``/``b``: 2-D float32/float16/bfloat16 device arrays of one dtype (gpurt, torch,
    CuPy), any unit-stride layout. ``out``: the (M x N) result to write (a new gpurt Array
    when None; it may be column-major or ``c`` itself); ``c`` defaults to ``out`` when
    ``beta != 0`` (and is not read when ``beta == 0``). float32 runs exactly on the CUDA cores
    unless ``allow_tf32`` lets it use TF32 tensor cores. ``config`` forces a kernel variant
    (see kernels/_gemm_tune.py). Runs on ``stream`` (default: gpurt's current stream) and
    returns ``out``.

    The first call of each signature (shapes, strides, dtype, device and 16-byte alignment
    of every operand, and the options) validates it, chooses the kernel and plans the launch;
    later calls of the signature reuse that plan. GPURT_GEMM_* settings are read when a plan
    is made: :func:`clear_plans` makes gemm read them again.

    Inside :class:`gpurt.amp.autocast`, a call without ``out`` casts a, b (and c) to the
    autocast dtype first, as torch's matmul/addmm (kernels/_autocast.py)."""
    if amp.ANY_ENABLED and out is None:  # the one autocast check: a module flag outside it
        a, b, c = _autocast.gemm_inputs(a, b, c, beta, stream)
    a = a if type(a) is gpurt.Array else _as_array(a, "a")
    b = b if type(b) is gpurt.Array else _as_array(b, "b")
    given = out
    if out is not None and type(out) is not gpurt.Array:
        out = _matching(out, "out", *_result_shape(a, b, trans_a, trans_b), a)
    if c is not None and type(c) is not gpurt.Array:
        c = _as_array(c, "c")
    if stream is not None:
        stream = gpurt.as_stream(stream, a.device.index)
    if sanitizer.ENABLED:  # a and b may hide in TMA descriptors, which the launch hook can't read
        sanitizer.record("gemm", (a, b, c if beta else None), (out,), stream)
    key = None
    if config is None:  # built in C: the hot path's main cost
        key = _plan_key(a, b, out, -1 if c is not None and c is out else c, beta != 0.0,
                        trans_a, trans_b, allow_tf32)
    if key is None:
        key = (_signature(a), _signature(b), None if out is None else _signature(out),
               None if c is None else ("out" if c is out else _signature(c)), beta != 0.0,
               trans_a, trans_b, allow_tf32, config)
    alpha, beta = float(alpha), float(beta)
    found = _calls.get(key)
    if found is None:
        result = _gemm_first(key, a, b, out, alpha, beta, c, trans_a, trans_b, stream,
                             allow_tf32, config)
        return result if given is None else given
    call, swapped, extents, planned = found
    index = call.index
    if out is None:  # C is (m x n) unless the kernel turned the product around (TF32 wgmma)
        m, n = (call.n, call.m) if call.swap else (call.m, call.n)
        out = gpurt.empty((n, m) if swapped else (m, n), dtype=a.dtype, device=index,
                          stream=stream)
    elif _overlap_at(out.ptr, extents[2], a.ptr, extents[0]) or \
            _overlap_at(out.ptr, extents[2], b.ptr, extents[1]):
        raise ValueError("out overlaps a or b; gemm cannot write over its inputs")
    cin_ptr = 0
    if beta != 0.0:
        cin = out if c is None or c is out else c
        if cin is not out and _overlap_at(cin.ptr, extents[3], out.ptr, extents[2]):
            _gemm_first(None, a, b, out, alpha, beta, c, trans_a, trans_b, stream, allow_tf32,
                        config)  # c partly overlaps out: the plan copies it first
            return given
        cin_ptr = cin.ptr
    a_ptr, b_ptr = (b.ptr, a.ptr) if swapped else (a.ptr, b.ptr)
    if planned is not None:  # checks the device itself (another one: Kernel.launch's way)
        planned(None if stream is None else stream.cuda_stream, a_ptr, b_ptr, out.ptr, cin_ptr,
                alpha, beta)
    elif index != gpurt.current_device():
        with gpurt.device(index):
            call.launch(a_ptr, b_ptr, out.ptr, cin_ptr, alpha, beta, stream)
    else:
        call.launch(a_ptr, b_ptr, out.ptr, cin_ptr, alpha, beta, stream)
    return out if given is None else given


# Planned calls by signature (gpurt.nvrtc.plan_key of the operands and options, or a tuple
# with a forced config): (Call, swapped, extents of a, b, out and c relative to their
# pointers, the planned launch or None). Plans hold no arrays, only the choices made for a
# signature.
_calls: dict[Any, tuple[Call | pack.PackedCall | rows.RowsCall, bool, tuple[Any, ...], Any]] = {}
_plan_key = gpurt.nvrtc.plan_key
_MAX_CALLS = 4096


def _signature(x: Any) -> tuple[Any, ...]:
    """What a plan depends on of one array (dtypes by number: gpurt's dtypes are canonical,
    and hashing a dtype object is slow)."""
    return (x.shape, x.strides, x.dtype.num, x.ptr & 15, x.device.index)


def _relative_extent(x: Any) -> tuple[int, int]:
    lo, hi = _extent(x)
    return (lo - int(x.ptr), hi - int(x.ptr))


def _overlap_at(p: int, extent: tuple[int, int], q: int, other: tuple[int, int]) -> bool:
    return p + extent[0] < q + other[1] and q + other[0] < p + extent[1]


def _result_shape(a: Any, b: Any, trans_a: bool, trans_b: bool) -> tuple[int, int]:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm takes 2-D matrices, got shapes {a.shape} and {b.shape}")
    return (a.shape[1] if trans_a else a.shape[0], b.shape[0] if trans_b else b.shape[1])


def clear_plans() -> None:
    """Forget every planned gemm call, so that the next call of each signature reads the
    GPURT_GEMM_* settings again and chooses its kernel anew; also drops the split-K
    workspaces kept per stream (kernels/_gemm_workspace.py)."""
    _calls.clear()
    workspace.clear()


tunable.on_change(clear_plans)


def _gemm_first(key: Any, a: Any, b: Any, out: Any, alpha: float,
                beta: float, c: Any, trans_a: bool, trans_b: bool, stream: Any,
                allow_tf32: bool, config: Config | None) -> Any:
    """A call without a plan: validate everything, choose, launch, and remember the plan
    under ``key`` when it works on the operands themselves (no copies)."""
    alloc_stream = gpurt.as_stream(stream, a.device.index)
    plan, returned, copy_back = _plan(a, b, out, float(beta), c, trans_a, trans_b, alloc_stream)
    if plan.m == 0 or plan.n == 0:
        return returned
    index = plan.index
    if index != gpurt.current_device():
        with gpurt.device(index):
            call = _plan_call(plan, allow_tf32, config, alloc_stream)
    else:
        call = _plan_call(plan, allow_tf32, config, alloc_stream)
    swapped = plan.a.array is b
    direct = (copy_back is None and {id(plan.a.array), id(plan.b.array)} == {id(a), id(b)}
              and (plan.cin is None or plan.cin is plan.out or plan.cin is c))
    if key is not None and direct and len(_calls) < _MAX_CALLS:
        extents = tuple(None if x is None else _relative_extent(x)
                        for x in (a, b, plan.out, plan.cin))
        _calls[key] = (call, swapped, extents, _planned(call, plan))
    cin_ptr = 0 if plan.cin is None else plan.cin.ptr
    if index != gpurt.current_device():
        with gpurt.device(index):
            call.launch(plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr, alpha, beta, stream)
    else:
        call.launch(plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr, alpha, beta, stream)
    if copy_back is not None:
        copy_back.copy_(plan.out)
    return returned


def _planned(call: Call | pack.PackedCall | rows.RowsCall, plan: _Plan) -> Any:
    """``planned(stream_handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)``, the launch of
    ``call`` checked and packed once (kernels/_gemm_launch.py's planned_call; the packed
    route's copy launch too; both launches of a cut along M)."""
    cin_ptr = 0 if plan.cin is None else plan.cin.ptr
    if isinstance(call, rows.RowsCall):
        return rows.PlannedRows(call, plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr)
    if isinstance(call, pack.PackedCall):
        return pack.planned_packed(call, plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr)
    return planned_call(call, plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr)


def _plan_call(plan: _Plan, allow_tf32: bool, config: Config | None,
               stream: Any) -> Call | pack.PackedCall | rows.RowsCall:
    problem = _problem(plan, allow_tf32)
    simt_route = _simt_pack_route(plan, problem) if config is None else None
    if simt_route is not None:  # fp32 rows of 4-byte loads: copied into 16-byte rows first
        return _simt_packed_call(plan, *simt_route, stream)
    cut = rows.cut(problem) if config is None else None
    if cut is not None:  # fp32 grids whose last wave is nearly empty: two launches
        return _rows_call(plan, problem, cut[0], cut[1], allow_tf32, stream)
    route = _pack_route(plan, problem, allow_tf32)
    if route is not None:  # rows TMA cannot read: copy them first where that pays
        packed, packed_problem, copies = route
        if config is None and pack.pays(tune.heuristic(problem), problem,
                                        tune.heuristic(packed_problem), packed_problem, copies):
            config = _choose(packed, packed_problem, stream,
                             lambda: pack.copied_plan(plan, packed, copies, stream))
            return _packed_call(plan, packed, packed_problem, config, copies)
        if config is not None and not tune.eligible(problem, config) and \
                tune.eligible(packed_problem, config):  # a forced TMA config
            return _packed_call(plan, packed, packed_problem, config, copies)
    if config is None:
        config = _choose(plan, problem, stream)
    reason = tune.why_not(problem, config)
    if reason is not None:
        raise ValueError(f"config {config.label()} cannot run this {plan.m}x{plan.n}x{plan.k} "
                         f"problem: {reason}")
    return _packed_call(plan, plan, problem, config, ())


def _a_step(plan: _Plan, head_rows: int) -> int:
    """Bytes from A's first row to its row ``head_rows``."""
    itemsize = 4 if plan.dt == DT_F32 else 2
    return (head_rows * plan.a.ld if plan.a.kmajor else head_rows) * itemsize


def _tail_plan(plan: _Plan, head_rows: int) -> _Plan:
    """``plan`` past C's first ``head_rows`` rows (A's pointer moved; C's is the call's)."""
    a = dataclasses.replace(plan.a, ptr=plan.a.ptr + _a_step(plan, head_rows))
    return dataclasses.replace(plan, a=a, m=plan.m - head_rows)


def _rows_call(plan: _Plan, problem: Problem, head_rows: int, head: Config, allow_tf32: bool,
               stream: Any, timing_plan: Callable[[], _Plan] | None = None) -> rows.RowsCall:
    """``head`` over C's first ``head_rows`` rows, then the rest as its own GEMM (its config
    chosen, or tuned, for its own shape) on pointers moved past those rows. ``timing_plan``:
    as :func:`_choose`'s (``plan`` on placeholders of copies)."""
    itemsize = 4 if plan.dt == DT_F32 else 2
    a_step = _a_step(plan, head_rows)
    out_step, cin_step = head_rows * plan.ldc * itemsize, head_rows * plan.ldcin * itemsize
    tail_plan = _tail_plan(plan, head_rows)
    tail_problem = _problem(tail_plan, allow_tf32)
    tail_timing = None if timing_plan is None else \
        (lambda: _tail_plan(timing_plan(), head_rows))
    tail = _choose(tail_plan, tail_problem, stream, tail_timing)
    head_call = make_call(dataclasses.replace(plan, m=head_rows),
                          dataclasses.replace(problem, m=head_rows), head, plan.out.ptr)
    tail_call = make_call(tail_plan, tail_problem, tail, plan.out.ptr + out_step)
    return rows.RowsCall(head_call, tail_call, head_rows, a_step, out_step, cin_step,
                         plan.m, plan.n)


def _simt_pack_route(plan: _Plan, problem: Problem
                     ) -> tuple[_Plan, Problem, tuple[pack.PackCopy, ...]] | None:
    """fp32 on the CUDA cores whose rows along M or N are not 16-byte multiples (its main loop
    loads them 4 bytes at a time): (the plan on copies of those operands into 128-byte rows,
    its problem, the copies) where the wave model finds the copies pay
    (kernels/_gemm_pack.py's ``simt_pays``); None elsewhere and with
    GPURT_GEMM_DISABLE=pack."""
    if problem.dt != DT_F32 or problem.vec or plan.k == 0 or \
            "pack" in tune.disabled_kernels():
        return None
    operands = [(op.ptr, op.ld, op.kmajor, n, plan.k)
                for op, n in ((plan.a, plan.m), (plan.b, plan.n))]
    copies = pack.copies_for(operands, 4, simt=True)
    if not copies:
        return None
    packed = pack.packed_plan(plan, copies)
    packed_problem = _problem(packed, False)
    if not packed_problem.vec or not pack.simt_pays(rows.modelled(problem),
                                                     rows.modelled(packed_problem), copies):
        return None
    return packed, packed_problem, copies


def _simt_packed_call(plan: _Plan, packed: _Plan, packed_problem: Problem,
                      copies: tuple[pack.PackCopy, ...], stream: Any) -> pack.PackedCall:
    """The simt plan (the cut along M where it pays, else one grid) on ``packed``, behind
    the ``copies`` of ``plan``'s operands."""
    def timing() -> _Plan:
        return pack.copied_plan(plan, packed, copies, stream)

    cut = rows.cut(packed_problem)
    inner: Call | rows.RowsCall
    if cut is not None:
        inner = _rows_call(packed, packed_problem, cut[0], cut[1], False, stream, timing)
    else:
        config = _choose(packed, packed_problem, stream, timing)
        inner = make_call(packed, packed_problem, config, plan.out.ptr)
    return pack.make_packed(inner, copies, None, plan.m, plan.n, packed_problem.sm_count)


def _pack_route(plan: _Plan, problem: Problem,
                allow_tf32: bool) -> tuple[_Plan, Problem, tuple[pack.PackCopy, ...]] | None:
    """(the plan on copies of the operands TMA cannot read, with placeholder pointers; its
    problem; the copies), or None where no copy would let a TMA kernel run: the operands are
    TMA-ready already, K is 0, the type or the GPU has no TMA kernel, or
    GPURT_GEMM_DISABLE names ``pack``."""
    if (problem.tma or plan.k == 0 or problem.capability != (9, 0)
            or problem.dt not in (DT_F16, DT_BF16, DT_TF32) or "pack" in tune.disabled_kernels()):
        return None
    itemsize = 4 if plan.dt == DT_F32 else 2
    operands = [(op.ptr, op.ld, op.kmajor, rows, plan.k)
                for op, rows in ((plan.a, plan.m), (plan.b, plan.n))]
    copies = pack.copies_for(operands, itemsize)
    if not copies:
        return None
    packed = pack.packed_plan(plan, copies)
    packed_problem = _problem(packed, allow_tf32)
    return (packed, packed_problem, copies) if packed_problem.tma else None


def _packed_call(plan: _Plan, packed: _Plan, packed_problem: Problem, config: Config,
                 copies: tuple[pack.PackCopy, ...]) -> Call | pack.PackedCall:
    """``config`` on ``packed`` (``plan`` with ``copies`` of its operands) and, where it pays,
    on a copy of C; the plain call of ``plan`` where nothing is copied."""
    c_copy = pack.c_copy_if_pays(plan, packed_problem, config, copies)
    out_ptr = plan.out.ptr
    if c_copy is not None:
        packed = dataclasses.replace(packed, ldc=c_copy.pitch)
        out_ptr = pack.PLACEHOLDER + c_copy.offset
    inner = make_call(packed, packed_problem, config, out_ptr)
    if not copies and c_copy is None:
        return inner
    return pack.make_packed(inner, copies, c_copy, plan.m, plan.n, packed_problem.sm_count)


def _label(call: Call | pack.PackedCall | rows.RowsCall) -> str:
    """The kernel a planned call runs, with the packed route's copies or the cut's parts."""
    return call.config.label() if isinstance(call, Call) else call.label()


def gemm_config(a: Any, b: Any, trans_a: bool = False, trans_b: bool = False, *,
                allow_tf32: bool = False) -> Config:
    """The config :func:`gemm` would use for these operands without tuning (heuristics; on
    the packed route, the config that runs on the copies)."""
    a, _, op_a, op_b, m, n, k, dt = _operands(a, b, trans_a, trans_b)
    plan = _Plan(op_a, op_b, m, n, k, None, n, None, 0, dt, a.device.index)
    problem = _problem(plan, allow_tf32)
    today = tune.heuristic(problem)
    route = _pack_route(plan, problem, allow_tf32)
    if route is not None:
        packed_config = tune.heuristic(route[1])
        if pack.pays(today, problem, packed_config, route[1], route[2]):
            return packed_config
    return today


def gemm_eligible_configs(a: Any, b: Any, out: Any = None, trans_a: bool = False,
                          trans_b: bool = False, *, allow_tf32: bool = False) -> list[Config]:
    """Every config that ``gemm(a, b, out=out, ...)`` can be forced to run with (``config=``),
    in every kernel family, split-K included; any of them gives the same result. Where rows
    TMA cannot read would be copied (kernels/_gemm_pack.py), one TMA config on the copies too
    (the property tests and the sanitizer sweep run the copies through it)."""
    a_arr = _as_array(a, "a")
    plan, _, _ = _plan(a_arr, b, out, 0.0, None, trans_a, trans_b,
                       gpurt.as_stream(None, a_arr.device.index))
    problem = _problem(plan, allow_tf32)
    found = tune.all_configs(problem)
    route = _pack_route(plan, problem, allow_tf32)
    if route is not None:
        copied = tune.heuristic(route[1])
        if copied.kernel == "wgmma" and copied not in found and tune.eligible(route[1], copied):
            found.append(copied)
    return found


def gemm_tuning_results() -> dict[str, dict[str, Any]]:
    """What the autotuner has measured and remembered (key -> config, time, candidates)."""
    return _tuner().results()


def clear_gemm_tuning() -> None:
    """Forget the autotuner's results, in memory and on disk."""
    _tuner().clear()
