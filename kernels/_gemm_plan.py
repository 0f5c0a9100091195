"""What one gemm call is: its operands validated and described by pointer, leading dimension
and layout (:class:`Operand`), the launch's sizes and output (:class:`Plan`, with A and B
swapped where C is written transposed), and the :class:`Problem` the chooser sees."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

import gpurt

from ._gemm_tune import DT_BF16, DT_F16, DT_F32, DT_TF32, Problem
from ._sms import usable_sms

__all__ = ["Operand", "Plan", "as_array", "extent", "matching", "operands", "make_plan",
           "problem_of"]

_DTYPES = {np.dtype(np.float32): DT_F32, np.dtype(np.float16): DT_F16,
           np.dtype(ml_dtypes.bfloat16): DT_BF16}  # gpurt.bfloat16

@dataclasses.dataclass(frozen=True)
class Operand:
    """A logical (rows x k) matrix: element (i, j) at ptr + (i*ld + j if kmajor else j*ld + i)
    elements. ``array`` keeps the memory alive."""

    array: Any
    ptr: int
    ld: int
    kmajor: bool


def as_array(obj: Any, what: str) -> Any:
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


def _operand(x: Any, trans: bool) -> tuple[Operand, int, int]:
    """The operand for op(x) (x.T when ``trans``), its rows and its K."""
    s0, s1 = _element_strides(x)
    rows, k = (x.shape[1], x.shape[0]) if trans else x.shape
    s_rows, s_k = (s1, s0) if trans else (s0, s1)
    layouts = _layouts(rows, k, s_rows, s_k, 16 // x.dtype.itemsize)
    if not layouts:  # no unit stride (or a negative/broadcast one): a contiguous copy
        return _operand(x.clone(), trans)
    ld, kmajor = layouts[0]
    return Operand(x, int(x.ptr), ld, kmajor), rows, k


def extent(x: Any) -> tuple[int, int]:
    """[first byte, last byte + 1) that the view ``x`` touches."""
    lo = hi = int(x.ptr)
    for dim, stride in zip(x.shape, x.strides):
        if dim == 0:
            return (lo, lo)
        span = (dim - 1) * stride
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return (lo, hi + x.dtype.itemsize)


def matching(x: Any, name: str, m: int, n: int, a: gpurt.Array) -> gpurt.Array:
    """``x`` as a gpurt Array, checked to be an m x n matrix of a's dtype on a's device."""
    x = as_array(x, name)
    if tuple(x.shape) != (m, n) or np.dtype(x.dtype) != np.dtype(a.dtype):
        raise ValueError(f"{name} must be {m}x{n} {a.dtype}, got {tuple(x.shape)} {x.dtype}")
    if x.device != a.device:
        raise ValueError(f"{name} is on {x.device} but the inputs are on {a.device}")
    return x

def _overlaps(x: Any, y: Any) -> bool:
    (a0, a1), (b0, b1) = extent(x), extent(y)
    return a0 < b1 and b0 < a1


@dataclasses.dataclass
class Plan:
    """Everything one launch needs: the (possibly swapped) operands, sizes and output."""

    a: Operand
    b: Operand
    m: int
    n: int
    k: int
    out: Any  # row-major (m x n) target, ldc
    ldc: int
    cin: Any  # None when beta == 0
    ldcin: int
    dt: int
    index: int

    @property
    def itemsize(self) -> int:
        """Bytes per element of A, B and C: 4 (float32) or 2."""
        return 4 if self.dt == DT_F32 else 2


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


def operands(a: Any, b: Any, trans_a: bool,
              trans_b: bool) -> tuple[Any, Any, Operand, Operand, int, int, int, int]:
    """(a and b as Arrays, A, B, M, N, K, dtype code) of op(a) @ op(b), validated. B (K x N)
    is described by its transpose (N x K), so K-major means the same for both operands."""
    a, b = as_array(a, "a"), as_array(b, "b")
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


def make_plan(a: Any, b: Any, out: Any, beta: float, c: Any, trans_a: bool, trans_b: bool,
          stream: Any) -> tuple[Plan, Any, Any]:
    """Validate everything; return (plan, object to return, array to copy the result into).
    ``stream`` is a gpurt Stream."""
    a, b, op_a, op_b, m, n, k, dt = operands(a, b, trans_a, trans_b)
    given = out
    if out is None:
        out = returned = gpurt.empty((m, n), dtype=a.dtype, device=a.device, stream=stream)
    else:
        returned = out
        out = matching(out, "out", m, n, a)
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
        c = matching(c, "c", m, n, a)
        cin, ldcin, c_swapped = _row_major_view(c, m, n, copy=True)
        if c_swapped != swapped:  # c's orientation must follow the output's
            cin = c.T.clone() if swapped else c.clone()
            ldcin = m if swapped else n
        elif _overlaps(cin, target) and (cin.ptr != target.ptr or ldcin != ldc):
            cin, ldcin = cin.clone(), (m if swapped else n)
    if swapped:  # C^T = op(b)^T op(a)^T, written row-major into out's memory
        op_a, op_b, m, n = op_b, op_a, n, m
    plan = Plan(op_a, op_b, m, n, k, target, ldc, cin, ldcin, dt, a.device.index)
    return plan, returned, copy_back


def problem_of(plan: Plan, allow_tf32: bool) -> Problem:
    props = gpurt.get_device_properties(plan.index)
    dt = DT_TF32 if plan.dt == DT_F32 and allow_tf32 else plan.dt
    itemsize = plan.itemsize
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
