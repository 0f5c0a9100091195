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

A call is validated and described by kernels/_gemm_plan.py. Its variant and tiles come from
kernels/_gemm_tune.py's candidates and heuristic, timed once per shape by
kernels/_gemm_tuner.py and remembered on disk when autotuning is on (``GPURT_GEMM_AUTOTUNE=0``
turns it off), chosen by the heuristic otherwise (kernels/_gemm_choose.py); it runs as one
kernel or as kernels/_gemm_route.py's routes of several launches. Kernels compile through
:func:`gpurt.compile` (cached on disk).
"""

from __future__ import annotations

from typing import Any

import gpurt
import gpurt.nvrtc
from gpurt import amp, sanitizer

from . import _autocast, tunable
from . import _gemm_pack as pack
from . import _gemm_plan as plans
from . import _gemm_route as routes
from . import _gemm_tune as tune
from . import _gemm_workspace as workspace
from ._gemm_launch import precompile
from ._gemm_tune import Config

__all__ = ["gemm", "gemm_config", "gemm_eligible_configs", "gemm_tuning_results",
           "clear_gemm_tuning", "clear_plans", "precompile"]


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
    c_apart = c is not None and c is not out
    keyed = None
    if config is None and not sanitizer.ENABLED:  # the hot path: key and addresses in C
        keyed = _plan_key_addresses(a, b, out, _c_item(c, c_apart), beta != 0.0, trans_a,
                                    trans_b, allow_tf32)
        if keyed is not None:
            found = _calls.get(keyed[0])
            if found is not None:
                done = _repeat(found, keyed[1], out, alpha, beta, c_apart, stream)
                if done is not None:
                    return done
    return _gemm_arrays(a, b, out, alpha, beta, c, trans_a, trans_b, stream, allow_tf32, config,
                        None if keyed is None else keyed[0])


def _gemm_arrays(a: Any, b: Any, out: Any, alpha: float, beta: float, c: Any, trans_a: bool,
                 trans_b: bool, stream: Any, allow_tf32: bool, config: Config | None,
                 key: Any) -> Any:
    """:func:`gemm` with its operands taken in as gpurt Arrays: the calls the hot path does
    not take (a new signature, a forced config, the sanitizer on, an operand the C key does
    not read, c partly overlapping out); ``key`` is the plan key when the hot path made it."""
    given, c_given = out, c
    a = a if type(a) is gpurt.Array else plans.as_array(a, "a")
    b = b if type(b) is gpurt.Array else plans.as_array(b, "b")
    if out is not None and type(out) is not gpurt.Array:
        out = plans.matching(out, "out", *_result_shape(a, b, trans_a, trans_b), a)
    if c is not None and type(c) is not gpurt.Array:
        c = out if c_given is given else plans.as_array(c, "c")
    if stream is not None:
        stream = gpurt.as_stream(stream, a.device.index)
    if sanitizer.ENABLED:  # a and b may hide in TMA descriptors, which the launch hook can't read
        sanitizer.record("gemm", (a, b, c if beta else None), (out,), stream)
    c_apart = c is not None and c is not out
    if key is None and config is None:
        keyed = _plan_key_addresses(a, b, out, _c_item(c, c_apart), beta != 0.0, trans_a,
                                    trans_b, allow_tf32)
        key = None if keyed is None else keyed[0]
    if key is None:
        key = (_signature(a), _signature(b), None if out is None else _signature(out),
               None if c is None else ("out" if c is out else _signature(c)), beta != 0.0,
               trans_a, trans_b, allow_tf32, config)
    found = _calls.get(key)
    if found is not None:
        addresses = (a.ptr, b.ptr, 0 if out is None else out.ptr, c.ptr if c_apart else 0)
        done = _repeat(found, addresses, out, alpha, beta, c_apart, stream)
        if done is not None:
            return done if given is None else given
        key = None  # c partly overlaps out: the plan copies it first
    result = _gemm_first(key, a, b, out, float(alpha), float(beta), c, trans_a, trans_b, stream,
                         allow_tf32, config)
    return result if given is None else given


def _c_item(c: Any, c_apart: bool) -> Any:
    """c as an item of the plan key: itself where it lies apart from out, -1 where it is out."""
    return c if c_apart else -1 if c is not None else None


def _repeat(found: tuple[Any, ...], addresses: tuple[int, ...], out: Any, alpha: float,
            beta: float, c_apart: bool, stream: Any) -> Any:
    """A call of a planned signature (``found``, from :data:`_calls`) on the operands at
    ``addresses`` (a, b, out, c; 0 where absent): ``out``, or the Array made for it; None,
    with nothing done, where c lies apart from out but overlaps it."""
    call, swapped, extents, planned, dtype = found
    a_ptr, b_ptr, out_ptr, c_ptr = addresses[:4]
    index = call.index
    if stream is not None:
        stream = gpurt.as_stream(stream, index)
    if out is None:  # C is (m x n) unless the kernel turned the product around (TF32 wgmma)
        m, n = (call.n, call.m) if call.swap else (call.m, call.n)
        out = gpurt.empty((n, m) if swapped else (m, n), dtype=dtype, device=index,
                          stream=stream)
        out_ptr = out.ptr
    elif _overlap_at(out_ptr, extents[2], a_ptr, extents[0]) or \
            _overlap_at(out_ptr, extents[2], b_ptr, extents[1]):
        raise ValueError("out overlaps a or b; gemm cannot write over its inputs")
    alpha, beta = float(alpha), float(beta)
    cin_ptr = 0
    if beta != 0.0:
        if c_apart and _overlap_at(c_ptr, extents[3], out_ptr, extents[2]):
            return None
        cin_ptr = c_ptr if c_apart else out_ptr
    if swapped:
        a_ptr, b_ptr = b_ptr, a_ptr
    if planned is not None:  # checks the device itself (another one: Kernel.launch's way)
        planned(None if stream is None else stream.cuda_stream, a_ptr, b_ptr, out_ptr, cin_ptr,
                alpha, beta)
    elif index != gpurt.current_device():
        with gpurt.device(index):
            call.launch(a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta, stream)
    else:
        call.launch(a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta, stream)
    return out


# Planned calls by signature (gpurt.nvrtc.plan_key of the operands and options, or a tuple
# with a forced config): (Call, swapped, extents of a, b, out and c relative to their
# pointers, the planned launch or None, the dtype of the result). Plans hold no arrays, only
# the choices made for a signature.
_calls: dict[Any, tuple[routes.AnyCall, bool, tuple[Any, ...], Any, Any]] = {}
_plan_key_addresses = gpurt.nvrtc.plan_key_addresses
_MAX_CALLS = 4096


def _signature(x: Any) -> tuple[Any, ...]:
    """What a plan depends on of one array (dtypes by number: gpurt's dtypes are canonical,
    and hashing a dtype object is slow)."""
    return (x.shape, x.strides, x.dtype.num, x.ptr & 15, x.device.index)


def _relative_extent(x: Any) -> tuple[int, int]:
    lo, hi = plans.extent(x)
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
    plan, returned, copy_back = plans.make_plan(a, b, out, float(beta), c, trans_a, trans_b,
                                                alloc_stream)
    if plan.m == 0 or plan.n == 0:
        return returned
    index = plan.index
    if index != gpurt.current_device():
        with gpurt.device(index):
            call = routes.plan_call(plan, allow_tf32, config, alloc_stream)
    else:
        call = routes.plan_call(plan, allow_tf32, config, alloc_stream)
    swapped = plan.a.array is b
    direct = (copy_back is None and {id(plan.a.array), id(plan.b.array)} == {id(a), id(b)}
              and (plan.cin is None or plan.cin is plan.out or plan.cin is c))
    if key is not None and direct and len(_calls) < _MAX_CALLS:
        extents = tuple(None if x is None else _relative_extent(x)
                        for x in (a, b, plan.out, plan.cin))
        _calls[key] = (call, swapped, extents, routes.planned(call, plan), a.dtype)
    cin_ptr = 0 if plan.cin is None else plan.cin.ptr
    if index != gpurt.current_device():
        with gpurt.device(index):
            call.launch(plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr, alpha, beta, stream)
    else:
        call.launch(plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr, alpha, beta, stream)
    if copy_back is not None:
        copy_back.copy_(plan.out)
    return returned


def gemm_config(a: Any, b: Any, trans_a: bool = False, trans_b: bool = False, *,
                allow_tf32: bool = False) -> Config:
    """The config :func:`gemm` would use for these operands without tuning (heuristics; on
    the packed route, the config that runs on the copies)."""
    a, _, op_a, op_b, m, n, k, dt = plans.operands(a, b, trans_a, trans_b)
    plan = plans.Plan(op_a, op_b, m, n, k, None, n, None, 0, dt, a.device.index)
    problem = plans.problem_of(plan, allow_tf32)
    today = tune.heuristic(problem)
    route = routes.pack_route(plan, problem, allow_tf32)
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
    a_arr = plans.as_array(a, "a")
    plan, _, _ = plans.make_plan(a_arr, b, out, 0.0, None, trans_a, trans_b,
                       gpurt.as_stream(None, a_arr.device.index))
    problem = plans.problem_of(plan, allow_tf32)
    found = tune.all_configs(problem)
    route = routes.pack_route(plan, problem, allow_tf32)
    if route is not None:
        copied = tune.heuristic(route[1])
        if copied.kernel == "wgmma" and copied not in found and tune.eligible(route[1], copied):
            found.append(copied)
    return found


def gemm_tuning_results() -> dict[str, dict[str, Any]]:
    """What the autotuner has measured and remembered (key -> config, time, candidates)."""
    return tunable.tuner().results()


def clear_gemm_tuning() -> None:
    """Forget the autotuner's results, in memory and on disk."""
    tunable.tuner().clear()
