"""How a planned gemm call runs: one kernel, or routes of several launches - operands copied
into rows TMA or vector loads can read first (kernels/_gemm_pack.py), fp32 grids cut in two
along M (kernels/_gemm_rows.py) - each chosen where its model says it pays."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from . import _gemm_choose as choosing
from . import _gemm_pack as pack
from . import _gemm_plan as plans
from . import _gemm_rows as rows
from . import _gemm_tune as tune
from ._gemm_launch import Call, make_call, planned_call
from ._gemm_tune import DT_BF16, DT_F16, DT_F32, DT_TF32, Config, Problem

__all__ = ["AnyCall", "planned", "plan_call", "rows_call", "pack_route", "label"]

AnyCall = Call | pack.PackedCall | rows.RowsCall  # what a planned gemm call runs


def planned(call: AnyCall, plan: plans.Plan) -> Any:
    """``planned(stream_handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)``, the launch of
    ``call`` checked and packed once (kernels/_gemm_launch.py's planned_call; the packed
    route's copy launch too; both launches of a cut along M)."""
    cin_ptr = 0 if plan.cin is None else plan.cin.ptr
    if isinstance(call, rows.RowsCall):
        return rows.PlannedRows(call, plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr)
    if isinstance(call, pack.PackedCall):
        return pack.planned_packed(call, plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr)
    return planned_call(call, plan.a.ptr, plan.b.ptr, plan.out.ptr, cin_ptr)


def plan_call(plan: plans.Plan, allow_tf32: bool, config: Config | None,
               stream: Any) -> AnyCall:
    problem = plans.problem_of(plan, allow_tf32)
    simt_route = _simt_pack_route(plan, problem) if config is None else None
    if simt_route is not None:  # fp32 rows of 4-byte loads: copied into 16-byte rows first
        return _simt_packed_call(plan, *simt_route, stream)
    cut = rows.cut(problem) if config is None else None
    if cut is not None:  # fp32 grids whose last wave is nearly empty: two launches
        return rows_call(plan, problem, cut[0], cut[1], allow_tf32, stream)
    route = pack_route(plan, problem, allow_tf32)
    if route is not None:  # rows TMA cannot read: copy them first where that pays
        packed, packed_problem, copies = route
        timed = _timed_route(plan, problem, packed, packed_problem, copies, stream) \
            if config is None else None
        if timed is not None:
            copy, config = timed
            if copy:
                return _packed_call(plan, packed, packed_problem, config, copies)
        elif config is None and pack.pays(tune.heuristic(problem), problem,
                                          tune.heuristic(packed_problem), packed_problem,
                                          copies):
            config = choosing.choose(packed, packed_problem, stream,
                             lambda: pack.copied_plan(plan, packed, copies, stream))
            return _packed_call(plan, packed, packed_problem, config, copies)
        if config is not None and not tune.eligible(problem, config) and \
                tune.eligible(packed_problem, config):  # a forced TMA config
            return _packed_call(plan, packed, packed_problem, config, copies)
    if config is None:
        config = choosing.choose(plan, problem, stream)
    reason = tune.why_not(problem, config)
    if reason is not None:
        raise ValueError(f"config {config.label()} cannot run this {plan.m}x{plan.n}x{plan.k} "
                         f"problem: {reason}")
    return _packed_call(plan, plan, problem, config, ())


def _timed_route(plan: plans.Plan, problem: Problem, packed: plans.Plan,
                 packed_problem: Problem, copies: tuple[pack.PackCopy, ...],
                 stream: Any) -> tuple[bool, Config] | None:
    """(whether to copy, the config) by the tuner's times where it has them for both routes
    (timed now or remembered): the packed problem's kernel plus the copies' modelled time
    against the problem's own best; None where either has no time (the tuner off, a capture
    underway, a problem below its size), which leaves the choice to the cost model. The model
    took the copies at 29x11003x4099 bf16, 114 us on an H100, where the mma kernel on the rows
    as they are ran 86 (benchmarks/notes_gemm.md, session 19)."""
    packed_config = choosing.choose(packed, packed_problem, stream,
                                    lambda: pack.copied_plan(plan, packed, copies, stream))
    packed_ms = choosing.timed_ms(plan.index, packed_problem)
    if packed_ms is None:
        return None
    plain_config = choosing.choose(plan, problem, stream)
    plain_ms = choosing.timed_ms(plan.index, problem)
    if plain_ms is None:
        return None
    if packed_ms + pack.copy_us(copies, plan.itemsize) / 1e3 < plain_ms:
        return True, packed_config
    return False, plain_config


def _a_step(plan: plans.Plan, head_rows: int) -> int:
    """Bytes from A's first row to its row ``head_rows``."""
    return (head_rows * plan.a.ld if plan.a.kmajor else head_rows) * plan.itemsize


def _tail_plan(plan: plans.Plan, head_rows: int) -> plans.Plan:
    """``plan`` past C's first ``head_rows`` rows (A's pointer moved; C's is the call's)."""
    a = dataclasses.replace(plan.a, ptr=plan.a.ptr + _a_step(plan, head_rows))
    return dataclasses.replace(plan, a=a, m=plan.m - head_rows)


def rows_call(plan: plans.Plan, problem: Problem, head_rows: int, head: Config, allow_tf32: bool,
               stream: Any, timing_plan: Callable[[], plans.Plan] | None = None) -> rows.RowsCall:
    """``head`` over C's first ``head_rows`` rows, then the rest as its own GEMM (its config
    chosen, or tuned, for its own shape) on pointers moved past those rows. ``timing_plan``:
    as :func:`choosing.choose`'s (``plan`` on placeholders of copies)."""
    itemsize = plan.itemsize
    a_step = _a_step(plan, head_rows)
    out_step, cin_step = head_rows * plan.ldc * itemsize, head_rows * plan.ldcin * itemsize
    tail_plan = _tail_plan(plan, head_rows)
    tail_problem = plans.problem_of(tail_plan, allow_tf32)
    tail_timing = None if timing_plan is None else \
        (lambda: _tail_plan(timing_plan(), head_rows))
    tail = choosing.choose(tail_plan, tail_problem, stream, tail_timing)
    head_call = make_call(dataclasses.replace(plan, m=head_rows),
                          dataclasses.replace(problem, m=head_rows), head, plan.out.ptr)
    tail_call = make_call(tail_plan, tail_problem, tail, plan.out.ptr + out_step)
    return rows.RowsCall(head_call, tail_call, head_rows, a_step, out_step, cin_step,
                         plan.m, plan.n)


def _simt_pack_route(plan: plans.Plan, problem: Problem
                     ) -> tuple[plans.Plan, Problem, tuple[pack.PackCopy, ...]] | None:
    """fp32 on the CUDA cores whose rows along M or N are not 16-byte multiples (its main loop
    loads them 4 bytes at a time): (the plan on copies of those operands into 128-byte rows,
    its problem, the copies) where the wave model finds the copies pay
    (kernels/_gemm_pack.py's ``simt_pays``); None elsewhere (also where the heuristic streams
    the rows as they are: the rowload kernel) and with GPURT_GEMM_DISABLE=pack."""
    if problem.dt != DT_F32 or problem.vec or plan.k == 0 or \
            "pack" in tune.disabled_kernels() or tune.heuristic(problem).kernel != "simt":
        return None
    operands = [(op.ptr, op.ld, op.kmajor, n, plan.k)
                for op, n in ((plan.a, plan.m), (plan.b, plan.n))]
    copies = pack.copies_for(operands, 4, simt=True)
    if not copies:
        return None
    packed = pack.packed_plan(plan, copies)
    packed_problem = plans.problem_of(packed, False)
    if not packed_problem.vec or not pack.simt_pays(rows.modelled(problem),
                                                     rows.modelled(packed_problem), copies):
        return None
    return packed, packed_problem, copies


def _simt_packed_call(plan: plans.Plan, packed: plans.Plan, packed_problem: Problem,
                      copies: tuple[pack.PackCopy, ...], stream: Any) -> pack.PackedCall:
    """The simt plan (the cut along M where it pays, else one grid) on ``packed``, behind
    the ``copies`` of ``plan``'s operands."""
    def timing() -> plans.Plan:
        return pack.copied_plan(plan, packed, copies, stream)

    cut = rows.cut(packed_problem)
    inner: Call | rows.RowsCall
    if cut is not None:
        inner = rows_call(packed, packed_problem, cut[0], cut[1], False, stream, timing)
    else:
        config = choosing.choose(packed, packed_problem, stream, timing)
        inner = make_call(packed, packed_problem, config, plan.out.ptr)
    return pack.make_packed(inner, copies, None, plan.m, plan.n, packed_problem.sm_count)


def pack_route(plan: plans.Plan, problem: Problem,
                allow_tf32: bool) -> tuple[plans.Plan, Problem, tuple[pack.PackCopy, ...]] | None:
    """(the plan on copies of the operands TMA cannot read, with placeholder pointers; its
    problem; the copies), or None where no copy would let a TMA kernel run: the operands are
    TMA-ready already, K is 0, the type or the GPU has no TMA kernel, or
    GPURT_GEMM_DISABLE names ``pack``."""
    if (problem.tma or plan.k == 0 or problem.capability != (9, 0)
            or problem.dt not in (DT_F16, DT_BF16, DT_TF32) or "pack" in tune.disabled_kernels()):
        return None
    operands = [(op.ptr, op.ld, op.kmajor, rows, plan.k)
                for op, rows in ((plan.a, plan.m), (plan.b, plan.n))]
    copies = pack.copies_for(operands, plan.itemsize)
    if not copies:
        return None
    packed = pack.packed_plan(plan, copies)
    packed_problem = plans.problem_of(packed, allow_tf32)
    return (packed, packed_problem, copies) if packed_problem.tma else None


def _packed_call(plan: plans.Plan, packed: plans.Plan, packed_problem: Problem, config: Config,
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


def label(call: AnyCall) -> str:
    """The kernel a planned call runs, with the packed route's copies or the cut's parts."""
    return call.config.label() if isinstance(call, Call) else call.label()
