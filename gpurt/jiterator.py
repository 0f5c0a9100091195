"""Elementwise kernels from a C++ template function, with torch.cuda.jiterator's names and
meaning: ``_create_jit_fn(code_string, **kwargs)`` and
``_create_multi_output_jit_fn(code_string, num_outputs, **kwargs)``.

``code_string`` defines ``template <typename T> T name(T x, T y, T alpha)`` (or, with
several outputs, ``void name(T x, ..., T alpha, T& out0, T& out1)``). The returned function
takes up to 8 inputs (device arrays: gpurt, torch, CuPy, JAX; or scalars) and the extra
scalar parameters named by ``kwargs`` (their defaults), and returns new gpurt Arrays (or
writes ``out=``). Inputs broadcast like numpy; ``T`` is the inputs' common dtype under
torch's promotion rules, which is also the output dtype; float16 and bfloat16 compute with
``T = float`` and store rounded (torch's opmath). Extra parameters arrive as ``double``,
``long long`` or ``bool`` (their Python type) and convert to the function's parameter type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ._elementwise import api as gpurt
from ._elementwise.binding import PASSED_AS_IS, as_value, returned
from ._elementwise.codegen import Operand
from ._elementwise.plan import (
    MAX_PLANS,
    ElementwisePlan,
    KernelText,
    Slot,
    as_array,
    plan_elementwise,
    remember,
    signature,
)
from ._elementwise.types import COMPUTE, check_dtype, result_type, scalar_dtype

__all__ = ["_create_jit_fn", "_create_multi_output_jit_fn"]

MAX_INPUTS = 8
_FUNCTION = re.compile(r"template\s*<[^>]*>\s*(?:__device__\s+)?(?:inline\s+)?"
                       r"[\w:<>]+\s*[&*]?\s+([A-Za-z_]\w*)\s*\(")
_EXTRA_TYPES = {bool: "bool", int: "long long", float: "double"}


def function_name(code_string: str) -> str:
    """The name of the first template function in ``code_string`` (ValueError if none)."""
    match = _FUNCTION.search(code_string)
    if match is None:
        raise ValueError("code_string must define a template function, e.g. "
                         "'template <typename T> T my_op(T x, T y) { return x + y; }'")
    return match.group(1)


def _extra_type(name: str, value: Any) -> str:
    kind = type(value)
    if kind not in _EXTRA_TYPES:
        raise TypeError(f"extra argument {name!r} must be a bool, int or float, got "
                        f"{kind.__name__}")
    return _EXTRA_TYPES[kind]


class _JittedFunction:
    """The callable ``_create_jit_fn`` returns: plans and kernels per call signature."""

    def __init__(self, code_string: str, return_by_ref: bool, num_outputs: int,
                 **kwargs: Any) -> None:
        if not isinstance(num_outputs, int) or num_outputs < 1:
            raise ValueError(f"num_outputs must be a positive int, got {num_outputs!r}")
        if not return_by_ref and num_outputs != 1:
            raise ValueError("a function returning its value has one output")
        self.code_string = code_string
        self.kernel_name = function_name(code_string)
        self.return_by_ref = return_by_ref
        self.num_outputs = num_outputs
        for name, value in kwargs.items():
            _extra_type(name, value)
        self.kwargs = dict(kwargs)
        self._plans: dict[Hashable, ElementwisePlan] = {}
        self._direct: dict[Any, Any] = {}  # the same plans for gpurt.nvrtc.dispatch
        self._no_outs = (None,) * num_outputs

    def __repr__(self) -> str:
        return f"gpurt.jiterator function {self.kernel_name!r}"

    def __call__(self, *tensors: Any, out: Any = None, **kwargs: Any) -> Any:
        if not kwargs and not self.kwargs:  # no extra scalars: a repeated call from C
            given_outs = self._no_outs if out is None else \
                tuple(out) if isinstance(out, (tuple, list)) else (out,)
            done = None if len(given_outs) != self.num_outputs else \
                gpurt.dispatch(self._direct, *tensors, *given_outs)
            if done is not None:
                return done[0] if not self.return_by_ref else done
        if not 1 <= len(tensors) <= MAX_INPUTS:
            raise ValueError(f"{self.kernel_name}: takes 1 to {MAX_INPUTS} inputs, got "
                             f"{len(tensors)}")
        extras = self.kwargs
        if kwargs:
            unknown = sorted(set(kwargs) - set(extras))
            if unknown:
                raise TypeError(f"{self.kernel_name}: unexpected keyword arguments {unknown}; "
                                f"the function's extra arguments are {sorted(extras)}")
            extras = {**extras, **kwargs}
        values = [t if type(t) in PASSED_AS_IS else as_value(t, f"input {k}")
                  for k, t in enumerate(tensors)]
        values += extras.values()
        given: list[Any] | None = None
        outs: list[Any]
        if out is None:
            outs = [None] * self.num_outputs
        else:
            given = self._given(out)
            outs = [o if o is None or type(o) is gpurt.Array else as_array(o, "out")
                    for o in given]
        key = signature(values, outs)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(values, outs, len(tensors), list(extras))
            if len(self._plans) < MAX_PLANS:
                self._plans[key] = plan
        result = returned(plan.run(values, outs), given)
        if not extras:
            remember(self._direct, key, plan.launch, values, len(outs), plan.shape,
                     plan.out_dtypes, plan.device)
        return result[0] if not self.return_by_ref else tuple(result)

    def _given(self, out: Any) -> list[Any]:
        given = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(given) != self.num_outputs:
            raise ValueError(f"{self.kernel_name}: out= needs {self.num_outputs} arrays, got "
                             f"{len(given)}")
        return given

    def _plan(self, values: Sequence[Any], outs: Sequence[Any], n_in: int,
              extra_names: Sequence[str]) -> ElementwisePlan:
        inputs = values[:n_in]
        arrays = [check_dtype(v.dtype, f"input {k}") for k, v in enumerate(inputs)
                  if type(v) is gpurt.Array]
        scalars = [scalar_dtype(v) for v in inputs if type(v) is not gpurt.Array]
        if not arrays:
            raise TypeError(f"{self.kernel_name}: at least one input must be an array")
        common = result_type(arrays, [s for s in scalars if s is not None])
        compute = COMPUTE[common]
        ops: list[Operand] = []
        for k, value in enumerate(inputs):
            kind = "in" if type(value) is gpurt.Array else "scalar"
            ops.append(Operand(f"in{k}", kind, "", compute))
        for k, name in enumerate(extra_names):
            ops.append(Operand(f"extra{k}", "scalar", "",
                               _extra_type(name, values[n_in + k])))
        ops += [Operand(f"out{k}", "out", "", compute) for k in range(self.num_outputs)]
        slots = [Slot("value", k) for k in range(len(values))]
        slots += [Slot("out", k) for k in range(self.num_outputs)]
        args = [f"in{k}" for k in range(n_in)] + [f"extra{k}" for k in range(len(extra_names))]
        call = f"{self.kernel_name}<{compute}>"
        if self.return_by_ref:
            args += [f"out{k}" for k in range(self.num_outputs)]
            body = f"{call}({', '.join(args)});"
        else:
            body = f"out0 = {call}({', '.join(args)});"
        text = KernelText(f"jiterator_{self.kernel_name}", self.code_string, body)
        return plan_elementwise(text, ops, slots, values, outs, [common] * self.num_outputs)


def _create_jit_fn(code_string: str, **kwargs: Any) -> Callable[..., Any]:
    """A function running ``code_string``'s template function elementwise, one output
    (torch.cuda.jiterator._create_jit_fn). ``kwargs``: extra scalar parameters and their
    defaults, passed after the inputs."""
    return _JittedFunction(code_string, return_by_ref=False, num_outputs=1, **kwargs)


def _create_multi_output_jit_fn(code_string: str, num_outputs: int,
                                **kwargs: Any) -> Callable[..., Any]:
    """Like :func:`_create_jit_fn` for a function that writes ``num_outputs`` outputs
    through its last reference parameters; returns a tuple of arrays."""
    return _JittedFunction(code_string, return_by_ref=True, num_outputs=num_outputs, **kwargs)
