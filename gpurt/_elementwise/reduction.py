"""Planned reductions: from the arrays of one call signature and the reduced axes to the
walk (row or column, see reduce_codegen), the split of K over blocks, the compiled kernels
and their constant arguments. A later call of the signature allocates its outputs (and the
partials and zeroed counters of a split reduction), fills the pointers and scalars and
launches."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import api as gpurt
from . import counters, reduce_codegen
from .api import LaunchConfig
from .codegen import Operand
from .layout import MAX_DIMS, broadcast_shape, collapse, element_strides, normalize_axes
from .plan import OPTIONS, _c_strides, _device_of, check_outputs, planned
from .realign_codegen import column_realign_walk
from .reduce_codegen import (
    BLOCK,
    ReduceLayout,
    ReduceText,
    finish_source,
    outputs_per_block,
    reduce_source,
)
from .types import STORAGE, check_dtype

__all__ = ["ReductionPlan", "partial_dtype", "plan_reduction"]

_INT_LIMIT = 2**31 - 1
_ROW_WARP_MAX = 2048  # rows up to this length get a warp each, longer ones a block
SPLIT_WAVES = 1  # a split row reduction aims at this many waves of 8 blocks per SM
# and a split column reduction at this many (H100: 8192^2 bfloat16 87.2 -> 91.3% of copy as
# 128x8 blocks, not 128x16; no other shape moved past the run's noise; notes_bandwidth.md,
# s8-colfold)
COLUMN_SPLIT_WAVES = 1
COLUMN_SPLIT_LEAST = 32  # reduced elements per thread of a column split, at least
# ... or COLUMN_SPLIT_LEAST_FEW where that still makes at most COLUMN_SPLIT_FEW splits: a grid
# that K, not the wave, keeps under-filled takes up to twice the splits, more loads in flight,
# while its fold stays short (H200: 2047x10007 float32 77.0 -> 79.5% of copy as 81x13 blocks
# instead of 81x8; H100, s9-colsum: bfloat16 66.2 -> 68.5, float32 83.1 -> 83.5 as 41x16 /
# 81x13; the 31 splits of least 16 for 4099x8191 16-bit lost 4 points on both cards:
# notes_bandwidth.md, s11-colsum).
COLUMN_SPLIT_LEAST_FEW = 16
COLUMN_SPLIT_FEW = 16
# Bytes per load of the column walk where the arrays allow (consecutive outputs per thread):
# 4 keeps one float32 output per thread.
COLUMN_VECTOR_BYTES = 4
# Where no vector fits (rows not aligned to one), each thread of the column walk takes outputs
# 32 apart until its loads cover this many bytes a row: more bytes in flight per thread.
COLUMN_SPREAD_BYTES = 4
# Bytes per aligned load of the column walk where rows are not aligned to a vector (one kept
# and one reduced dimension): the loads take the aligned envelope of the block's columns and
# shared memory sets the elements back in their columns (realign_codegen.column_realign_walk).
# 0: off (the walk above). COLUMN_REALIGN_ALL: also where the vectors above would align.
COLUMN_REALIGN_BYTES = 16
COLUMN_REALIGN_ALL = False
# Round a split column reduction's grid to the nearest whole number of waves of the compiled
# kernel's resident blocks (occupancy; never more splits): a last wave that is nearly empty
# leaves the device idle while its few blocks finish (H100: 4099x8191 float32 80.6 -> 85.4%
# of copy, 67x17 blocks = 1.08 waves -> 67x15; notes_bandwidth.md, session 8).
COLUMN_SPLIT_FIT = True
# A split reduction's last block per output block folds the partials (one launch, its
# counters kept zeroed per stream: counters.py), rather than a second "finish" kernel.
FOLD = True
# The column fold in two levels of groups of at most COLUMN_FOLD_TREE splits where a thread
# of the one-level fold would read more than COLUMN_FOLD_TREE_FROM partial rows: the last
# block of each group folds the group, then the last of the groups folds their rows
# (reduce_codegen._fold); 0: one level (one block reads every split). H100: 65536x1023
# float32 83.9 -> 87.4% of copy (117 rows a thread), bfloat16 73.7 -> 78.2 (211 rows); the
# tree's second ticket costs more than it saves at 9-17 rows (4099x8191 bfloat16 76.7 ->
# 69.6, 65536x1024 float32 94.0 -> 91.3; notes_bandwidth.md, s8-colfold).
COLUMN_FOLD_TREE = 16
COLUMN_FOLD_TREE_FROM = 32
# The realigned column walk's width (threads across outputs; reduce_codegen.COLUMN_WIDTH
# otherwise) where at that width its split would fold in a tree (tall sums): twice the column
# blocks of half the outputs, about half the splits, each output's partial rows shared by
# twice the fold's threads (H100: 65536x1023 float32 87.6 -> 89.4% of copy as 18x58 blocks
# instead of 9x117, bfloat16 80.1 -> 81.4 as 9x117 instead of 5x211; narrower everywhere
# loses: 1023x65537 float32 96.0 -> 84.3, 8192^2 float32 96.2 -> 90.7; notes_bandwidth.md,
# s9-colsum). 0: COLUMN_WIDTH everywhere.
COLUMN_TREE_WIDTH = 16


def partial_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype partial results of a split reduction are kept in (the reduce type)."""
    return np.dtype(np.float32) if dtype.itemsize == 2 and dtype.kind in "fV" else dtype


@dataclasses.dataclass
class ReductionPlan:
    """One planned reduction (see the module docstring)."""

    kernel: Any
    finish: Any
    grid: tuple[int, int, int]
    finish_grid: int
    middle: tuple[Any, ...]       # M, K, chunk, dims, input strides
    out_strides: tuple[Any, ...]  # per output, its kept strides
    finish_head: tuple[Any, ...]  # M, K, splits
    finish_dims: tuple[Any, ...]  # kept dims
    out_shape: tuple[int, ...]
    out_dtypes: tuple[np.dtype, ...]
    partial: np.dtype | None
    fold: bool
    splits: int
    size: int
    device: int
    arrays: tuple[bool, ...]  # per value: an Array (else a scalar)
    counts: int = 0  # the fold's counters (reduce_codegen._fold)
    launches: tuple[Any, ...] = ()  # planned launches (Kernel.planned), made at the first run

    def run(self, values: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
        """Allocate the missing outputs, launch (on the plan's device, its current stream),
        return the outputs (gpurt Arrays)."""
        index = self.device
        outputs = [o if o is not None else gpurt.empty(self.out_shape, dt, index)
                   for o, dt in zip(outs, self.out_dtypes)]
        if not self.size:
            return outputs
        head = [v.ptr if type(v) is gpurt.Array else v for v in values]
        pointers = [o.ptr for o in outputs]
        if self.partial is None:
            launches = self.launches or self._plan_launches(head, pointers, 0)
            launches[0](None, *head, *pointers)
            return outputs
        partials = gpurt.empty(self.splits * self.size, self.partial, index)  # held (not
        partial = partials.ptr  # only its address) until the kernels are queued
        if self.fold:
            counts = counters.take(index, self.counts)
            launches = self.launches or self._plan_launches(head, pointers, partial,
                                                            counts.ptr)
            launches[0](None, *head, partial, counts.ptr, *pointers)
            del partials, counts
            return outputs
        launches = self.launches or self._plan_launches(head, pointers, partial)
        scalars = [v for v, array in zip(head, self.arrays) if not array]
        launches[0](None, *head, partial)
        launches[1](None, partial, *scalars, *pointers)
        del partials
        return outputs

    def _plan_launches(self, head: list[Any], pointers: list[int], partial: int,
                       counts: int = 0) -> tuple[Any, ...]:
        """The planned launches of this reduction (the call's pointers and scalars vary):
        one kernel (a folding split's takes its partials and counters too), or a split's
        kernel and finish kernel sharing the partials."""
        config = LaunchConfig(self.grid, BLOCK)
        if self.fold:
            args = (*head, partial, counts, *pointers, *self.middle, *self.out_strides)
            self.launches = (planned(self.kernel, config, args,
                                     range(len(head) + 2 + len(pointers)), self.device),)
            return self.launches
        if self.partial is None:
            args = (*head, *pointers, *self.middle, *self.out_strides)
            self.launches = (planned(self.kernel, config, args,
                                     range(len(head) + len(pointers)), self.device),)
            return self.launches
        scalars = [v for v, array in zip(head, self.arrays) if not array]
        first = planned(self.kernel, config, (*head, partial, *self.middle),
                        range(len(head) + 1), self.device)
        after = 1 + len(self.finish_head)  # partials, M, K, splits, then what varies
        finish_args = (partial, *self.finish_head, *scalars, *pointers, *self.finish_dims,
                       *self.out_strides)
        varying = (0, *range(after, after + len(scalars) + len(pointers)))
        finish = planned(self.finish, LaunchConfig(self.finish_grid, BLOCK), finish_args,
                         varying, self.device)
        self.launches = (first, finish)
        return self.launches


def _out_kept_strides(out: Any, out_shape: tuple[int, ...], dtype: np.dtype,
                      kept: Sequence[int], keepdims: bool, name: str) -> tuple[int, ...]:
    if out is None:
        strides = element_strides(out_shape, _c_strides(out_shape, dtype.itemsize),
                                  dtype.itemsize, out_shape, name)
    else:
        strides = element_strides(out.shape, out.strides, out.itemsize, out_shape, name)
    return tuple(strides[a] for a in kept) if keepdims else strides


def _walk(in_kept: Sequence[tuple[int, ...]], in_red: Sequence[tuple[int, ...]],
          kept_dims: tuple[int, ...], k: int) -> str:
    """"column" when the outputs are contiguous in memory and the reduced elements are not."""
    if not kept_dims or not in_red or not in_red[0] or k <= 1:
        return "row"
    inner_kept = all(s[-1] in (0, 1) for s in in_kept) and any(s[-1] == 1 for s in in_kept)
    reduced_far = min(abs(s) for s in in_red[0]) > 1
    return "column" if inner_kept and reduced_far else "row"


def _column_vec(arrays: Sequence[Any], in_kept: Sequence[tuple[int, ...]],
                in_red: Sequence[tuple[int, ...]], kept_dims: tuple[int, ...]) -> int:
    """Consecutive outputs per thread (one vector load each step) of the column walk: every
    input steps through the outputs contiguously, its rows and address aligned to the
    vector, and the innermost kept dimension holds whole vectors."""
    if not arrays or COLUMN_VECTOR_BYTES <= max(a.itemsize for a in arrays):
        return 1
    vec = COLUMN_VECTOR_BYTES // max(a.itemsize for a in arrays)
    if kept_dims[-1] % vec:
        return 1
    for a, kept, red in zip(arrays, in_kept, in_red):
        if kept[-1] != 1 or a.ptr % (vec * a.itemsize) or \
                any(s % vec for s in (*kept[:-1], *red)):
            return 1
    return vec


def _column_loads(arrays: Sequence[Any], in_kept: Sequence[tuple[int, ...]],
                  in_red: Sequence[tuple[int, ...]], kept_dims: tuple[int, ...],
                  width: int) -> tuple[int, int, bool]:
    """(vec, spread, realign) of the column walk: realigned envelopes where rows are not
    vector-aligned and the layout allows them, else vectors across the outputs where they
    align, else ``spread`` outputs per thread."""
    if COLUMN_REALIGN_ALL or not _rows_aligned(arrays, in_red):
        wide = _realign_vec(arrays, in_kept, in_red, width)
        if wide > 1:
            return wide, 1, True
    vec = _column_vec(arrays, in_kept, in_red, kept_dims)
    if vec == 1 and arrays:
        return 1, max(1, COLUMN_SPREAD_BYTES // max(a.itemsize for a in arrays)), False
    return vec, 1, False


def _rows_aligned(arrays: Sequence[Any], in_red: Sequence[tuple[int, ...]]) -> bool:
    """Every input's address and reduced strides are whole COLUMN_REALIGN_BYTES vectors."""
    size = COLUMN_REALIGN_BYTES or 16
    return all(a.ptr % size == 0 and all(s * a.itemsize % size == 0 for s in red)
               for a, red in zip(arrays, in_red))


def _realign_vec(arrays: Sequence[Any], in_kept: Sequence[tuple[int, ...]],
                 in_red: Sequence[tuple[int, ...]], width: int) -> int:
    """Elements per aligned load of the column walk's envelope (1: not possible): one kept
    dimension of stride 1 and one reduced dimension, the same for every input (same
    itemsize, strides and misalignment); the vector's period divides the row stride times
    the rows of threads (so each thread's rows share their misalignment) and is at most the
    row stride (so only the first and last rows' envelopes may leave the view)."""
    if not arrays or not COLUMN_REALIGN_BYTES or len({a.itemsize for a in arrays}) != 1:
        return 1
    if len(in_kept[0]) != 1 or len(in_red[0]) != 1 or tuple(in_kept[0]) != (1,) or \
            any(tuple(s) != (1,) for s in in_kept) or \
            any(tuple(r) != tuple(in_red[0]) for r in in_red):
        return 1
    item, stride = arrays[0].itemsize, in_red[0][0]
    vec = max(1, COLUMN_REALIGN_BYTES // item)
    while vec > 1 and ((BLOCK // width) * stride % vec or abs(stride) < vec or
                       len({a.ptr % (vec * item) for a in arrays}) != 1):
        vec //= 2
    return vec


def _vec(arrays: Sequence[Any], in_kept: Sequence[tuple[int, ...]],
         in_red: Sequence[tuple[int, ...]]) -> int:
    """Elements per vector load of the row walk: contiguous, 16-byte aligned rows."""
    if not arrays or any(s != (1,) for s in in_red):
        return 1
    vec = 16 // max(a.itemsize for a in arrays)
    for a, kept in zip(arrays, in_kept):
        if a.ptr % 16 or any(s * a.itemsize % 16 for s in kept):
            return 1
    return vec


def plan_reduction(text: ReduceText, params: Sequence[Operand], values: Sequence[Any],
                   outs: Sequence[Any], out_dtypes: Sequence[np.dtype],
                   reduce_dtype: np.dtype, axis: Any, keepdims: bool) -> ReductionPlan:
    """Plan one reduction of ``params`` (inputs and scalars in call order, then outputs;
    the storage of array operands is filled in here)."""
    n_in = len(values)
    arrays = [v for v in values if type(v) is gpurt.Array]
    given = [o for o in outs if o is not None]
    device = _device_of([*arrays, *given])
    shape = broadcast_shape([a.shape for a in arrays])
    axes = normalize_axes(axis, len(shape))
    kept = [a for a in range(len(shape)) if a not in axes]
    out_shape = tuple(1 if a in axes else s for a, s in enumerate(shape)) if keepdims \
        else tuple(shape[a] for a in kept)
    check_outputs(outs, out_shape, out_dtypes, "the reduction gives")
    ops = []
    in_kept, in_red = [], []
    for param, value in zip(params[:n_in], values):
        if param.kind == "scalar":
            ops.append(param)
            continue
        storage = STORAGE[check_dtype(value.dtype, f"argument {param.name!r}")]
        ops.append(dataclasses.replace(param, storage=storage))
        st = element_strides(value.shape, value.strides, value.itemsize, shape, param.name)
        in_kept.append(tuple(st[a] for a in kept))
        in_red.append(tuple(st[a] for a in axes))
    out_kept = []
    for param, out, dtype in zip(params[n_in:], outs, out_dtypes):
        ops.append(dataclasses.replace(param, storage=STORAGE[dtype]))
        out_kept.append(_out_kept_strides(out, out_shape, dtype, kept, keepdims, param.name))
    kept_dims, kept_strides = collapse(tuple(shape[a] for a in kept), [*in_kept, *out_kept])
    red_dims, red_strides = collapse(tuple(shape[a] for a in axes), in_red)
    if len(kept_dims) > MAX_DIMS or len(red_dims) > MAX_DIMS:
        raise ValueError(f"the reduction needs more than {MAX_DIMS} dimensions of index "
                         "arithmetic on one side after merging")
    m = int(np.prod(kept_dims, dtype=np.int64))
    k = int(np.prod(red_dims, dtype=np.int64))
    in_kept_c, out_kept_c = kept_strides[:len(in_kept)], kept_strides[len(in_kept):]
    walk = _walk(in_kept_c, red_strides, kept_dims, k)
    cover = (walk, arrays, in_kept_c, red_strides, kept_dims, m, k, device)
    grid = _grid(*cover, reduce_codegen.COLUMN_WIDTH)
    if grid.realign and grid.tree and COLUMN_TREE_WIDTH:
        narrow = _grid(*cover, COLUMN_TREE_WIDTH)
        grid = narrow if narrow.realign else grid
    vec, spread, realign, group, width, per_block, blocks, splits, chunk, tree = \
        dataclasses.astuple(grid)
    spans = [sum((d - 1) * abs(s) for d, s in zip(kept_dims, ks)) +
             sum((d - 1) * abs(s) for d, s in zip(red_dims, rs))
             for ks, rs in zip(in_kept_c, red_strides)]
    index = "int" if max([m * k, m * splits, *spans]) < _INT_LIMIT - BLOCK * 16 else "long long"
    layout = ReduceLayout(walk, group, len(kept_dims), len(red_dims), vec, splits > 1, index,
                          FOLD and splits > 1, width, spread, realign, tree)
    assert outputs_per_block(layout) == per_block
    arch = gpurt.get_arch(device)

    def build(layout: ReduceLayout) -> Any:
        source = reduce_source(text, ops, layout, column_realign_walk)
        return gpurt.compile(source, OPTIONS, arch=arch,
                             program_name=f"{text.name}.cu")[text.name]

    kernel = build(layout)
    if walk == "column" and splits > 1 and COLUMN_SPLIT_FIT:
        resident = gpurt.get_device_properties(device).multi_processor_count * \
            _blocks_per_sm(kernel, device)
        fitted = _fit_waves(blocks, splits, resident)
        if fitted != splits:
            chunk = -(-k // fitted)
            splits = -(-k // chunk)
            if splits == 1:
                layout = dataclasses.replace(layout, split=False, fold=False)
                kernel = build(layout)
    finish = None
    if splits > 1 and not layout.fold:
        finish = gpurt.compile(finish_source(text, ops, layout), OPTIONS, arch=arch,
                               program_name=f"{text.name}_finish.cu")[f"{text.name}_finish"]
    middle = (m, k, chunk, *kept_dims, *red_dims,
              *(s for ks, rs in zip(in_kept_c, red_strides) for s in (*ks, *rs)))
    return ReductionPlan(
        kernel, finish, (blocks, splits, 1), _finish_blocks(m), middle,
        tuple(s for st in out_kept_c for s in st),
        (m, k, splits), tuple(kept_dims), out_shape, tuple(out_dtypes),
        partial_dtype(reduce_dtype) if splits > 1 else None, layout.fold, splits, m, device,
        tuple(type(v) is gpurt.Array for v in values),
        blocks * (1 + (-(-splits // tree) if tree and splits > tree else 0)))


@dataclasses.dataclass(frozen=True)
class _Grid:
    """How a walk covers M x K: its loads (``vec``, ``spread``, ``realign``), threads
    (``group`` an output in the row walk, ``width`` across outputs in the column walk),
    outputs a block, column blocks, splits of K and elements a split, the fold's ``tree``."""

    vec: int
    spread: int
    realign: bool
    group: int
    width: int
    per_block: int
    blocks: int
    splits: int
    chunk: int
    tree: int


def _grid(walk: str, arrays: Sequence[Any], in_kept: Sequence[tuple[int, ...]],
          in_red: Sequence[tuple[int, ...]], kept_dims: tuple[int, ...], m: int, k: int,
          device: int, width: int) -> _Grid:
    """The walk's loads, blocks and split with ``width`` threads across a column block."""
    spread, realign = 1, False
    if walk == "row":
        vec = _vec(arrays, in_kept, in_red)
    else:
        vec, spread, realign = _column_loads(arrays, in_kept, in_red, kept_dims, width)
    group = 32 if walk == "row" and k <= _ROW_WARP_MAX else BLOCK
    per_block = BLOCK // group if walk == "row" else \
        (width - 1) * vec if realign else width * vec * spread
    blocks = max(1, -(-m // per_block))
    splits, chunk = _split(blocks, k, vec, walk, group, width, device)
    rows = -(-splits // reduce_codegen.fold_groups(per_block))  # a fold thread's, one level
    tree = COLUMN_FOLD_TREE if FOLD and walk == "column" and splits > COLUMN_FOLD_TREE and \
        rows > COLUMN_FOLD_TREE_FROM else 0
    return _Grid(vec, spread, realign, group, width, per_block, blocks, splits, chunk, tree)


def _finish_blocks(m: int) -> int:
    """Blocks of the finish kernel: a warp per output (reduce_codegen.finish_source)."""
    return max(1, min(-(-m // (BLOCK // 32)), 1 << 20))


def _blocks_per_sm(kernel: Any, device: int) -> int:
    """Blocks of ``kernel`` resident on one SM of ``device`` at once (the occupancy API)."""
    with gpurt.device(device):
        return kernel.max_active_blocks_per_multiprocessor(BLOCK)


def _fit_waves(blocks: int, splits: int, resident: int) -> int:
    """Splits of a grid of ``blocks`` x ``splits`` rounded to the nearest whole number of
    waves of ``resident`` blocks (never more splits): 1.08 waves become one. A grid within
    one wave runs at once and stays."""
    if blocks * splits <= resident:
        return splits
    waves = round(blocks * splits / resident)
    return max(1, min(splits, waves * resident // blocks))


def _split(blocks: int, k: int, vec: int, walk: str, group: int, width: int,
           device: int) -> tuple[int, int]:
    """(splits of K over gridDim.y, reduced elements per split): enough blocks to fill the
    device (8 per SM), each split still long enough to be worth a block (the row walk's
    vectors run along K, the column walk's across the outputs; see COLUMN_SPLIT_LEAST_FEW
    for the column walk's shorter splits). Grids of more than half a wave are not split: the
    split's partials, memset and fold cost more than the unfilled wave (H100: 1023x65537
    float32, 529 blocks, 96.0% of copy unsplit, 91.7% as 529x3; 1024x65536 bfloat16 93.6%
    unsplit, 85.2% as 1024x2)."""
    waves = COLUMN_SPLIT_WAVES if walk == "column" else SPLIT_WAVES
    wave = gpurt.get_device_properties(device).multi_processor_count * 8
    target = wave * waves
    least = group * vec * 8 if walk == "row" else (BLOCK // width) * COLUMN_SPLIT_LEAST
    splits = 1
    if 2 * blocks <= wave and k > least:  # whole waves: a partial last wave idles SMs
        splits = min(target // blocks, -(-k // least), 65535)
        if walk == "column" and COLUMN_SPLIT_LEAST_FEW:  # shorter splits, still few
            few = min(target // blocks, -(-k // (BLOCK // width * COLUMN_SPLIT_LEAST_FEW)))
            splits = few if splits < few <= COLUMN_SPLIT_FEW else splits
    step = vec if walk == "row" else 1
    chunk = -(-k // splits) if k else 1
    chunk = -(-chunk // step) * step
    splits = max(1, -(-k // chunk)) if k else 1
    return splits, chunk
