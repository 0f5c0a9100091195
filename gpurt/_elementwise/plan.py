"""Planned elementwise launches: from the arrays of one call signature (shapes, strides,
dtypes, 16-byte alignment, device) to a compiled kernel, its grid and the constant tail of
its arguments. A later call of the same signature only allocates its outputs, fills the
pointers and scalars into the argument tuple and launches.

Shared by gpurt.ElementwiseKernel and gpurt.jiterator; only gpurt's public API is used.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from . import api as gpurt
from . import codegen
from .codegen import Layout, Operand
from .layout import MAX_DIMS, broadcast_shape, collapse, element_strides
from .types import STORAGE, check_dtype

__all__ = [
    "MAX_PLANS",
    "OPTIONS",
    "ElementwisePlan",
    "Slot",
    "as_array",
    "check_name",
    "plan_elementwise",
    "planned",
    "remember",
    "signature",
]

# Functions in a preamble or a jiterator code string need no __device__ (torch's and CuPy's
# code strings have none).
OPTIONS = ("-default-device",)
MAX_PLANS = 4096  # plans kept per kernel object; past that, calls plan afresh
_INT_LIMIT = 2**31 - 1
_IDENT = re.compile(r"^[A-Za-z_]\w*$")


def check_name(name: str) -> str:
    """``name`` if it is a C identifier, else ValueError."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ValueError(f"kernel name {name!r} is not a C identifier")
    return name


def check_outputs(outs: Sequence[Any], shape: tuple[int, ...], dtypes: Sequence[np.dtype],
                  expected: str) -> None:
    """ValueError/TypeError for a given output (None: made by the call) whose shape is not
    ``shape`` (``expected`` says where that shape comes from) or whose dtype is not the one
    the kernel writes there."""
    for number, out in enumerate(outs):
        if out is not None and tuple(out.shape) != shape:
            raise ValueError(f"output {number} has shape {tuple(out.shape)}; {expected} "
                             f"{shape}")
        if out is not None and np.dtype(out.dtype) != dtypes[number]:
            raise TypeError(f"output {number} has dtype {out.dtype}; the kernel writes "
                            f"{dtypes[number].name} there")


def as_array(obj: Any, what: str) -> Any:
    """A gpurt Array over ``obj`` (no copy), or TypeError naming ``what``."""
    if type(obj) is gpurt.Array:
        return obj
    try:
        return gpurt.asarray(obj, copy=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a device array (gpurt, torch, CuPy, JAX) or a "
                        f"scalar, got {type(obj).__name__}: {exc}") from exc


def signature(values: Sequence[Any], outs: Sequence[Any]) -> Hashable:
    """What a plan depends on: per Array its dtype, shape, strides, address modulo 16 and
    device; per scalar its type; None for a missing output. On the hot path of every call:
    built in C (gpurt.nvrtc.plan_key) when every value is an Array, else a flat tuple."""
    for v in values:
        if type(v) is not gpurt.Array:  # plan_key keys an int by its value, not its type
            return _tuple_signature(values, outs)
    return gpurt.plan_key(*values, *outs) or _tuple_signature(values, outs)


def _tuple_signature(values: Sequence[Any], outs: Sequence[Any]) -> tuple[Any, ...]:
    """:func:`signature` as one flat tuple (dtype numbers: hashing a dtype object is slow)."""
    key: list[Any] = []
    for v in values:
        if type(v) is gpurt.Array:
            key += (v.dtype.num, v.shape, v.strides, v.ptr & 15, v.device.index)
        else:
            key.append(v.dtype.num if isinstance(v, np.generic) else type(v))
    for o in outs:
        if o is None:
            key.append(None)
        else:
            key += (o.dtype.num, o.shape, o.strides, o.ptr & 15, o.device.index)
    return tuple(key)


@dataclasses.dataclass(frozen=True)
class Slot:
    """What one kernel operand is at launch: ``source`` "value" (the call's value number
    ``index``: an Array's pointer or a scalar) or "out" (output number ``index``)."""

    source: str
    index: int


@dataclasses.dataclass
class ElementwisePlan:
    """One planned launch (see the module docstring). ``launch``: the kernel's planned launch
    (Kernel.planned) taking the values and output pointers, made at the first run."""

    kernel: Any
    grid: int
    tail: tuple[Any, ...]
    shape: tuple[int, ...]
    out_dtypes: tuple[np.dtype, ...]
    device: int
    size: int
    launch: Callable[..., None] | None = None

    def run(self, values: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
        """Allocate the missing outputs, launch (on the plan's device, its current stream),
        return the outputs (gpurt Arrays). The kernel's operands are the values in call
        order, then the outputs."""
        outputs = [o if o is not None else gpurt.empty(self.shape, dt, self.device)
                   for o, dt in zip(outs, self.out_dtypes)]
        if not self.size:
            return outputs
        heads = [v.ptr if type(v) is gpurt.Array else v for v in (*values, *outputs)]
        launch = self.launch
        if launch is None:
            launch = self.launch = planned(self.kernel, gpurt.LaunchConfig(self.grid,
                                           codegen.THREADS), (*heads, *self.tail),
                                           range(len(heads)), self.device)
        launch(None, *heads)
        return outputs


def remember(table: dict[Any, Any], key: Hashable, launch: Callable[..., None] | None,
             values: Sequence[Any], n_out: int, shape: tuple[int, ...],
             out_dtypes: Sequence[np.dtype], device: int) -> None:
    """Let gpurt.nvrtc.dispatch run the calls of ``key`` (items: the values, then the outputs)
    from C: only where every value is an Array (their pointers and the outputs' are all the
    launch takes) and the plan has launched (``launch``: its planned launch)."""
    if launch is None or type(key) is not bytes:
        return
    for v in values:
        if type(v) is not gpurt.Array:
            return
    n = len(values) + n_out
    gpurt.add_dispatch(table, key, launch, range(n), range(len(values), n),
                       [(shape, dt, device) for dt in out_dtypes])


def planned(kernel: Any, config: Any, args: tuple[Any, ...], varying: Sequence[int],
            index: int) -> Callable[..., None]:
    """``kernel``'s planned launch with ``args`` on device ``index``, taking new values
    (a call's pointers and scalars) at the ``varying`` positions."""
    if index == gpurt.current_device():
        return kernel.planned(config, *args, varying=varying, device=index)
    with gpurt.device(index):
        return kernel.planned(config, *args, varying=varying, device=index)


@dataclasses.dataclass(frozen=True)
class KernelText:
    """The parts of an elementwise kernel that do not depend on the call: its name, the
    code before it, the per-element body."""

    name: str
    preamble: str
    body: str
    options: tuple[str, ...] = ()


def _device_of(arrays: Sequence[Any]) -> int:
    devices = {a.device.index for a in arrays}
    if len(devices) > 1:
        raise ValueError(f"the arrays are on different devices: {sorted(devices)}")
    return devices.pop() if devices else gpurt.current_device()


def _layout(shape: tuple[int, ...], strides: list[tuple[int, ...]], uniform: list[bool],
            pointers: list[tuple[int, int]]) -> tuple[Layout, tuple[int, ...], tuple]:
    """The layout class and the collapsed shape and strides (strides per array)."""
    dims, collapsed = collapse(shape, strides)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    contiguous = len(dims) <= 1 and all(
        u or not dims or s == (1,) for s, u in zip(collapsed, uniform))
    if contiguous:
        widest = max((size for (_, size), u in zip(pointers, uniform) if not u), default=1)
        vec = 16 // widest
        while vec > 1 and any(ptr % (vec * size) for (ptr, size), u in zip(pointers, uniform)
                              if not u):
            vec //= 2
        tile = codegen.THREADS * codegen.UNROLL * vec
        index = "int" if n + tile <= _INT_LIMIT else "long long"
        return Layout(0, vec, index), dims, collapsed
    if len(dims) > MAX_DIMS:
        raise ValueError(f"the arrays need {len(dims)} dimensions of index arithmetic after "
                         f"merging; at most {MAX_DIMS} are supported")
    span = max(sum((d - 1) * abs(s) for d, s in zip(dims, st)) for st in collapsed)
    index = "int" if max(n, span) <= _INT_LIMIT else "long long"
    return Layout(len(dims), 1, index), dims, collapsed


def plan_elementwise(text: KernelText, params: Sequence[Operand], slots: Sequence[Slot],
                     values: Sequence[Any], outs: Sequence[Any],
                     out_dtypes: Sequence[np.dtype]) -> ElementwisePlan:
    """Plan the launch of ``params`` (operands whose ``storage`` is filled in here from the
    arrays) over ``values`` and ``outs`` (None: allocate): broadcast the inputs, check the
    given outputs, choose the layout and compile. ``slots`` say which value or output each
    operand is; they must be the values in order, then the outputs (ElementwisePlan.run
    passes them so)."""
    expected = [Slot("value", k) for k in range(len(values))] + \
        [Slot("out", k) for k in range(len(outs))]
    if list(slots) != expected:
        raise ValueError("operands must be the call's values in order, then its outputs")
    arrays = [values[s.index] for s, p in zip(slots, params)
              if p.kind == "in" and s.source == "value"]
    given = [o for o in outs if o is not None]
    raws = [values[s.index] for s, p in zip(slots, params) if p.kind == "raw"]
    device = _device_of([*arrays, *given, *raws])
    shape = broadcast_shape([a.shape for a in arrays] or [o.shape for o in given])
    check_outputs(outs, shape, out_dtypes, "the inputs broadcast to")
    for raw in raws:
        if not raw.is_contiguous():
            raise ValueError(f"raw arrays must be C-contiguous (strides {raw.strides})")
    ops: list[Operand] = []
    strides: list[tuple[int, ...]] = []
    uniform: list[bool] = []
    pointers: list[tuple[int, int]] = []
    for param, slot in zip(params, slots):
        if param.kind == "scalar":
            ops.append(param)
            continue
        array = values[slot.index] if slot.source == "value" else outs[slot.index]
        dtype = out_dtypes[slot.index] if slot.source == "out" else array.dtype
        storage = STORAGE[check_dtype(dtype, f"parameter {param.name!r}")]
        if param.kind == "raw":
            ops.append(dataclasses.replace(param, storage=storage))
            continue
        if array is None:  # an output to allocate: C-contiguous
            st = element_strides(shape, _c_strides(shape, dtype.itemsize), dtype.itemsize,
                                 shape, param.name)
            ptr = 0
        else:
            st = element_strides(array.shape, array.strides, array.itemsize, shape, param.name)
            ptr = array.ptr
        flat = param.kind == "in" and not any(st) and len(shape) > 0
        ops.append(dataclasses.replace(param, storage=storage, uniform=flat))
        strides.append(st)
        uniform.append(flat)
        pointers.append((ptr, dtype.itemsize))
    layout, dims, collapsed = _layout(shape, strides, uniform, pointers)
    ops = [dataclasses.replace(op, uniform=op.uniform and layout.ndim == 0) for op in ops]
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    kernel = _compile(text, ops, layout, device)
    tail: tuple[Any, ...] = (n,)
    if layout.ndim:
        tail += tuple(dims) + tuple(s for st in collapsed for s in st)
        grid = max(1, min(-(-n // codegen.THREADS), 1 << 16))
    else:
        grid = contiguous_grid(kernel, n, layout.vec, device)
    return ElementwisePlan(kernel, grid, tail, shape, tuple(out_dtypes),
                           device, n)


def contiguous_grid(kernel: Any, n: int, vec: int, device: int) -> int:
    """Blocks of a contiguous launch: one per tile, or at most codegen.WAVES waves of the
    blocks resident at once (the kernel loops over tiles gridDim.x apart)."""
    grid = max(1, -(-n // (codegen.THREADS * codegen.UNROLL * vec)))
    if codegen.WAVES:
        with gpurt.device(device):
            per_sm = kernel.max_active_blocks_per_multiprocessor(codegen.THREADS)
        sms = int(gpurt.get_device_properties(device).multi_processor_count)
        grid = min(grid, max(1, per_sm) * sms * codegen.WAVES)
    return min(grid, _INT_LIMIT)  # the CUDA limit; the kernel loops over further tiles


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _compile(text: KernelText, ops: Sequence[Operand], layout: Layout, device: int) -> Any:
    source = codegen.elementwise_source(text.name, text.preamble, ops, text.body, layout)
    module = gpurt.compile(source, options=(*OPTIONS, *text.options), arch=gpurt.get_arch(device),
                           program_name=f"{text.name}.cu")
    return module[text.name]
