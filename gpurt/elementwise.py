"""Elementwise and reduction kernels from a line of CUDA code, with CuPy's meaning:
:class:`ElementwiseKernel` and :class:`ReductionKernel`.

``ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "axpy")`` compiles (through
:func:`gpurt.compile` and its memory and disk caches) one kernel per call signature class
and runs it over gpurt Arrays or any device array gpurt views without a copy (torch, CuPy,
JAX), with numpy broadcasting, Python/numpy scalars, strided and offset views and optional
output arrays. See docs/elementwise.md for the rules (types, float16/bfloat16 computed in
float, what ``i`` and ``_ind.size()`` are).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from ._elementwise import api as gpurt
from ._elementwise.binding import bind, returned, split_args
from ._elementwise.codegen import Operand
from ._elementwise.plan import (
    MAX_PLANS,
    ElementwisePlan,
    KernelText,
    Slot,
    check_name,
    plan_elementwise,
    remember,
    signature,
)
from ._elementwise.reduce_codegen import ReduceText
from ._elementwise.reduction import ReductionPlan, plan_reduction
from ._elementwise.types import COMPUTE, STORAGE, parse_params
from ._elementwise.types import TYPE_NAMES as _TYPE_NAMES

__all__ = ["ElementwiseKernel", "ReductionKernel"]


def reads_output(body: str, name: str) -> bool:
    """Whether ``body`` reads output ``name`` (anything but plain ``name = ...``
    assignments), so the kernel must load it before the body runs."""
    uses = [m.start() for m in re.finditer(rf"\b{re.escape(name)}\b", body)]
    for start in uses:
        after = body[start + len(name):]
        if not re.match(r"\s*=(?!=)", after) or re.match(r"\s*\[", after):
            return True
    return False


def typedefs(bound: dict[str, np.dtype]) -> str:
    """``typedef <compute type> T;`` for each placeholder, so the body may name T."""
    return "".join(f"typedef {COMPUTE[dt]} {name}; " for name, dt in sorted(bound.items()))


def _tails(n_in: int, n_out: int) -> dict[int, tuple[None, ...]]:
    """What gpurt.nvrtc.dispatch's items add to a call's arguments, by their count: None for
    each output not given (a call gives all or none of them)."""
    return {n_in: (None,) * n_out, n_in + n_out: ()}


class ElementwiseKernel:
    """A kernel that runs ``operation`` once per element (CuPy's ElementwiseKernel).

    ``in_params``/``out_params``: ``"T x, float32 y, raw T w"`` (a type name, or a
    placeholder bound from the arguments); ``operation``: C++ statements on those names
    (inputs are values, outputs are assigned; ``i`` is the element's linear index and
    ``_ind.size()`` the element count; a ``raw`` array is a pointer indexed by the user).
    Call with the inputs, optionally followed by every output; returns the output (a
    tuple for several), the given output objects when passed."""

    def __init__(self, in_params: str, out_params: str, operation: str,
                 name: str = "kernel", reduce_dims: bool = True, preamble: str = "",
                 no_return: bool = False, return_tuple: bool = False,
                 options: Sequence[str] = (), loop_prep: str = "", after_loop: str = "") -> None:
        self.in_params = parse_params(in_params, "in_params")
        self.out_params = parse_params(out_params, "out_params")
        if not self.out_params:
            raise ValueError("out_params: an elementwise kernel needs at least one output")
        clash = {p.name for p in self.in_params} & {p.name for p in self.out_params}
        if clash:
            raise ValueError(f"parameter names used as input and output: {sorted(clash)}")
        if any(p.raw for p in self.out_params):
            raise ValueError("raw outputs are not supported; pass a raw input and write it")
        if loop_prep or after_loop:
            raise ValueError("loop_prep and after_loop are not supported")
        self.operation = operation
        self.name = check_name(name)
        self.preamble = preamble
        self.no_return = no_return
        self.return_tuple = return_tuple
        self.options = tuple(options)
        self.reduce_dims = reduce_dims
        self._loads = tuple(reads_output(operation, p.name) for p in self.out_params)
        self._plans: dict[Hashable, ElementwisePlan] = {}
        self._direct: dict[Any, Any] = {}  # the same plans for gpurt.nvrtc.dispatch
        self._tails = _tails(len(self.in_params), len(self.out_params))

    def __repr__(self) -> str:
        return f"gpurt.ElementwiseKernel({self.name!r})"

    def __call__(self, *args: Any) -> Any:
        tail = self._tails.get(len(args))
        if tail is not None:
            done = gpurt.dispatch(self._direct, *args, *tail)  # a repeated call, from C
            if done is not None:
                return self._returned(done)
        values, outs, given = split_args(args, len(self.in_params), len(self.out_params),
                                         self.name)
        key = signature(values, outs)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(values, outs)
            if len(self._plans) < MAX_PLANS:
                self._plans[key] = plan
        result = returned(plan.run(values, outs), given)
        remember(self._direct, key, plan.launch, values, len(outs), plan.shape, plan.out_dtypes,
                 plan.device)
        return self._returned(result)

    def _returned(self, result: Sequence[Any]) -> Any:
        if self.no_return:
            return None
        return result[0] if len(result) == 1 and not self.return_tuple else tuple(result)

    def _plan(self, values: Sequence[Any], outs: Sequence[Any]) -> ElementwisePlan:
        bound, out_dtypes = bind(self.in_params, self.out_params, values, outs, self.name)
        ops: list[Operand] = []
        slots: list[Slot] = []
        for number, (param, value) in enumerate(zip(self.in_params, values)):
            dtype = param.dtype if param.dtype is not None else bound[param.ctype]
            kind = "raw" if param.raw else "in" if type(value) is gpurt.Array else "scalar"
            storage = STORAGE[dtype] if kind == "raw" else ""
            ops.append(Operand(param.name, kind, storage, COMPUTE[dtype]))
            slots.append(Slot("value", number))
        for number, (param, dtype) in enumerate(zip(self.out_params, out_dtypes)):
            ops.append(Operand(param.name, "out", "", COMPUTE[dtype],
                               load=self._loads[number]))
            slots.append(Slot("out", number))
        text = KernelText(self.name, self.preamble, typedefs(bound) + "\n" + self.operation,
                          self.options)
        return plan_elementwise(text, ops, slots, values, outs, out_dtypes)


class ReductionKernel:
    """A reduction from expressions (CuPy's ReductionKernel): ``map_expr`` over the
    (broadcast) inputs, folded over ``axis`` with ``reduce_expr`` of ``a`` and ``b``
    starting from ``identity``, then ``post_map_expr`` assigns the outputs from ``a``
    (``_in_ind.size()`` / ``_out_ind.size()`` are the input and output element counts).
    ``reduce_type``: the type of ``a``/``b`` (default: the first output's; float16 and
    bfloat16 reduce in float). Call ``kernel(*inputs, [*outputs], axis=None,
    keepdims=False)``."""

    def __init__(self, in_params: str, out_params: str, map_expr: str, reduce_expr: str,
                 post_map_expr: str, identity: Any, name: str = "reduce_kernel",
                 reduce_type: str | None = None, reduce_dims: bool = True,
                 preamble: str = "", options: Sequence[str] = ()) -> None:
        self.in_params = parse_params(in_params, "in_params")
        self.out_params = parse_params(out_params, "out_params")
        if not self.in_params or not self.out_params:
            raise ValueError("a reduction needs at least one input and one output")
        if any(p.raw for p in (*self.in_params, *self.out_params)):
            raise ValueError("raw parameters are not supported in reductions")
        if identity is None:
            raise ValueError("identity=None is not supported: give the reduction's identity")
        self.map_expr, self.reduce_expr, self.post_map_expr = map_expr, reduce_expr, post_map_expr
        self.identity = str(identity)
        self.name = check_name(name)
        self.reduce_type = reduce_type or self.out_params[0].ctype
        self.preamble = preamble
        if options:
            raise ValueError("options are not supported for reductions")
        self._plans: dict[Hashable, ReductionPlan] = {}
        # the same plans for gpurt.nvrtc.dispatch, per (axis, keepdims)
        self._direct: dict[Any, dict[Any, Any]] = {}
        self._tails = _tails(len(self.in_params), len(self.out_params))

    def __repr__(self) -> str:
        return f"gpurt.ReductionKernel({self.name!r})"

    def __call__(self, *args: Any, axis: Any = None, keepdims: bool = False) -> Any:
        tail = self._tails.get(len(args))
        if tail is not None and (axis is None or type(axis) is int) and type(keepdims) is bool:
            table = self._direct.get((axis, keepdims))
            done = None if table is None else gpurt.dispatch(table, *args, *tail)  # from C
            if done is not None:
                return done[0] if len(done) == 1 else done
        values, outs, given = split_args(args, len(self.in_params), len(self.out_params),
                                         self.name)
        axis_key = tuple(axis) if isinstance(axis, (list, tuple)) else axis
        key = (signature(values, outs), axis_key, bool(keepdims))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(values, outs, axis_key, bool(keepdims))
            if len(self._plans) < MAX_PLANS:
                self._plans[key] = plan
        result = returned(plan.run(values, outs), given)
        if plan.partial is None and plan.launches:  # one launch: dispatch may take it
            remember(self._direct.setdefault((axis_key, bool(keepdims)), {}), key[0],
                     plan.launches[0], values, len(outs), plan.out_shape, plan.out_dtypes,
                     plan.device)
        return result[0] if len(result) == 1 else tuple(result)

    def _plan(self, values: Sequence[Any], outs: Sequence[Any], axis: Any,
              keepdims: bool) -> ReductionPlan:
        if not any(type(v) is gpurt.Array for v in values):
            raise TypeError(f"kernel {self.name!r}: a reduction needs at least one array")
        bound, out_dtypes = bind(self.in_params, self.out_params, values, outs, self.name)
        reduce_dtype = bound.get(self.reduce_type) or _TYPE_NAMES.get(self.reduce_type)
        if reduce_dtype is None:
            raise TypeError(f"kernel {self.name!r}: reduce_type {self.reduce_type!r} is "
                            "neither a dtype name nor a placeholder bound by the arguments")
        ops: list[Operand] = []
        for param, value in zip(self.in_params, values):
            dtype = param.dtype if param.dtype is not None else bound[param.ctype]
            kind = "in" if type(value) is gpurt.Array else "scalar"
            ops.append(Operand(param.name, kind, "", COMPUTE[dtype]))
        ops += [Operand(p.name, "out", "", COMPUTE[dt])
                for p, dt in zip(self.out_params, out_dtypes)]
        defs = typedefs(bound) + f"typedef {COMPUTE[reduce_dtype]} _type_reduce;"
        text = ReduceText(self.name, self.preamble, defs, self.map_expr, self.reduce_expr,
                          self.post_map_expr, self.identity)
        return plan_reduction(text, ops, values, outs, out_dtypes, reduce_dtype, axis,
                              keepdims)
