"""CUDA source of reduction kernels (CuPy's ReductionKernel): ``map_expr`` per element,
``reduce_expr`` folding two values ``a`` and ``b`` of the reduce type, ``post_map_expr``
writing the outputs from ``a``.

The problem is seen as M outputs times K reduced elements, each side with its own (up to
8) dimensions of index arithmetic. Two walks:

- "row": a group of G threads (a warp, or the whole block) per output, threads striding
  over K (16-byte vector loads when the reduced elements are contiguous and aligned), then
  warp shuffles (and shared memory across warps);
- "column": for outputs that are contiguous in memory: 32 consecutive outputs per block
  (coalesced loads), 8 threads per output splitting K, combined in shared memory; where
  the rows are not aligned to a vector, "realign": aligned vector loads of the envelope of
  the block's columns, each element set back in its column through shared memory
  (realign_codegen.py).

Either may split K over ``gridDim.y``: each block then writes one partial value per
(split, output), and either the last block of its column of the grid (``fold``: a counter per
``blockIdx.x``, zeroed before the launch) or a second, "finish", kernel folds the splits and
runs post_map_expr. The column walk's fold may be a tree (``tree`` splits a group: the last
block of each group folds the group's partials into its first row, then the last of those
folds the groups), so that tall sums' many partials are read by many blocks at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from .codegen import PRELUDE, Operand

__all__ = [
    "BLOCK",
    "COLUMN_WIDTH",
    "ReduceLayout",
    "ReduceText",
    "combine_rows",
    "finish_source",
    "fold_groups",
    "map_step",
    "outputs_per_block",
    "reduce_source",
]

BLOCK = 256
COLUMN_WIDTH = 32  # outputs per block of the column walk (BLOCK // COLUMN_WIDTH share K)
# Loads a thread keeps in flight: the unrolled loops issue their loads before folding them
# (bytes in flight per SM are what a bandwidth-bound reduction needs).
ROW_UNROLL = 4
COLUMN_UNROLL = 4
# The column fold's partials a thread loads before folding them (all in flight at once: the
# fold runs after the walk, on the kernel's critical path, one L2 round trip per batch).
FOLD_BATCH = 8
# Blocks per SM a folding or realigned column walk's kernel is built for (__launch_bounds__'
# second argument: 8 x 256 threads caps it at 32 registers, as the walk alone needs; without
# it the fold's batch takes 34-48, the realigned walk's batched loop 35-38, and the walk loses
# resident blocks; 0: no cap).
COLUMN_MIN_BLOCKS = 8
# How a split block takes the fold's ticket: "all" = every thread fences (fence.sc.gpu)
# before thread 0's atomicAdd; "one" = after __syncthreads, thread 0 alone fences and takes
# it (cooperative groups' grid sync); "acqrel" = after __syncthreads, thread 0's
# atom.add.acq_rel.gpu, no fence. H100, "all" -> "acqrel": 0.4-1.5 us less a split call
# (4099x8191 bfloat16 76.1 -> 77.8% of copy, 65536x1023 bfloat16 77.9 -> 80.1, 1 x 64 Mi
# 95.6 -> 96.1); "one" within noise of "all" (notes_bandwidth.md, s9-colsum).
TICKET = "acqrel"

_HELPERS = r"""
template <typename R> __device__ __forceinline__ R _gpurt_shfl(R v, int d) {
    return __shfl_xor_sync(0xffffffffu, v, d); }
#define _GPURT_SHFL_VIA_INT(TYPE) __device__ __forceinline__ TYPE _gpurt_shfl(TYPE v, int d) { \
    return static_cast<TYPE>(__shfl_xor_sync(0xffffffffu, static_cast<int>(v), d)); }
_GPURT_SHFL_VIA_INT(bool)
_GPURT_SHFL_VIA_INT(signed char)
_GPURT_SHFL_VIA_INT(unsigned char)
_GPURT_SHFL_VIA_INT(short)
_GPURT_SHFL_VIA_INT(unsigned short)
// Partials written by other blocks of this grid, read through L2 (L1 is not coherent).
template <typename R> __device__ __forceinline__ R _gpurt_l2(const R* p) { return *p; }
#define _GPURT_L2(TYPE) __device__ __forceinline__ TYPE _gpurt_l2(const TYPE* p) { \
    return __ldcg(p); }
_GPURT_L2(float)
_GPURT_L2(double)
_GPURT_L2(int)
_GPURT_L2(unsigned int)
_GPURT_L2(long long)
_GPURT_L2(unsigned long long)
// The fold's ticket with release (the block's partials, ordered by a barrier before it) and
// acquire (the other blocks' partials) semantics at device scope.
__device__ __forceinline__ unsigned _gpurt_ticket_acq_rel(unsigned* p) {
#ifdef __CUDA_ARCH__
    unsigned t;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(t) : "l"(p) : "memory");
    return t;
#else
    return atomicAdd(p, 1u);
#endif
}
"""


@dataclasses.dataclass(frozen=True)
class ReduceText:
    """The user's parts: kernel name, preamble, typedefs (placeholders and ``_type_reduce``),
    the three expressions and the identity."""

    name: str
    preamble: str
    typedefs: str
    map_expr: str
    reduce_expr: str
    post_map: str
    identity: str


@dataclasses.dataclass(frozen=True)
class ReduceLayout:
    """``walk``: "row" or "column"; ``group``: threads per output in the row walk (32 or
    BLOCK); ``kept``/``reduced``: dimensions of index arithmetic; ``vec``: elements per
    vector load (1: none), along K in the row walk, across outputs in the column walk;
    ``split``: K is split over gridDim.y; ``fold``: the split's last block folds the
    partials (else a finish kernel does); ``width``: threads across outputs in a block of
    the column walk (``vec`` adjacent outputs each, or ``spread`` outputs ``width`` apart);
    ``realign``: the column walk loads aligned ``vec``-vectors around misaligned rows and
    sets the elements back in their columns at the end (see realign_codegen.py); ``tree``:
    splits per group of a column fold in two levels (0: one level; see _fold)."""

    walk: str
    group: int
    kept: int
    reduced: int
    vec: int
    split: bool
    index: str
    fold: bool = False
    width: int = COLUMN_WIDTH
    spread: int = 1
    realign: bool = False
    tree: int = 0


def _params(ops: Sequence[Operand], layout: ReduceLayout) -> list[str]:
    idx = layout.index
    params = []
    for op in ops:
        if op.kind == "in":
            params.append(f"const {op.storage}* __restrict__ _p_{op.name}")
        elif op.kind == "scalar":
            params.append(f"{op.compute} {op.name}")
    if layout.split:
        params.append("_type_reduce* _partial")
    if layout.fold:
        params.append("unsigned int* _count")
    if layout.fold or not layout.split:
        params += [f"{op.storage}* _p_{op.name}" for op in ops if op.kind == "out"]
    params += [f"{idx} _M", f"{idx} _K", f"{idx} _chunk"]
    params += [f"{idx} _s{d}" for d in range(layout.kept)]
    params += [f"{idx} _r{d}" for d in range(layout.reduced)]
    for op in ops:
        if op.kind == "in":
            params += [f"{idx} _ts_{op.name}_{d}" for d in range(layout.kept)]
            params += [f"{idx} _tr_{op.name}_{d}" for d in range(layout.reduced)]
        elif op.kind == "out" and (layout.fold or not layout.split):
            params += [f"{idx} _ts_{op.name}_{d}" for d in range(layout.kept)]
    return params


def _decompose(var: str, sizes: str, strides: str, ndim: int, names: Sequence[str],
               idx: str, indent: str) -> str:
    """Offsets ``_o{var}_<name>`` of linear index ``var`` over dims ``sizes``."""
    out = [f"{indent}{idx} _q{var} = {var};\n"]
    out += [f"{indent}{idx} _o{var}_{n} = 0;\n" for n in names]
    for d in reversed(range(ndim)):
        coord = f"(_q{var} % _{sizes}{d})" if d else f"_q{var}"
        line = f"{indent}{{ const {idx} _c = {coord};"
        if d:
            line += f" _q{var} /= _{sizes}{d};"
        line += "".join(f" _o{var}_{n} += _c * _{strides}_{n}_{d};" for n in names)
        out.append(line + " }\n")
    if not ndim:
        out.append(f"{indent}(void)_q{var};\n")
    return "".join(out)


def map_step(ops: Sequence[Operand], fetch: dict[str, str], indent: str,
              when: str = "") -> str:
    """Load the inputs (``fetch``: each input's element) and fold their map into ``_acc``
    (only where ``when`` holds, if given: the loads stay unconditional)."""
    ins = [op for op in ops if op.kind == "in"]
    lines = [f"const {op.compute} {op.name} = "
             f"static_cast<{op.compute}>(_gpurt_ld({fetch[op.name]}));"
             for op in ins]
    args = ", ".join(op.name for op in ops if op.kind in ("in", "scalar"))
    lines.append((f"if ({when}) " if when else "") +
                 f"_acc = _gpurt_reduce(_acc, static_cast<_type_reduce>(_gpurt_map({args})));")
    return "".join(f"{indent}{line}\n" for line in lines)


def _store(ops: Sequence[Operand], layout: ReduceLayout, indent: str) -> str:
    """Write the result ``_acc`` of output ``_m``: a partial, or post_map's outputs."""
    if layout.split:
        return f"{indent}_partial[(long long)blockIdx.y * _M + _m] = _acc;\n"
    outs = [op for op in ops if op.kind == "out"]
    text = _decompose("_m", "s", "ts", layout.kept, [op.name for op in outs], layout.index,
                      indent)
    args = ["_acc", *(op.name for op in ops if op.kind == "scalar"),
            *(f"_p_{op.name}[_o_m_{op.name}]" for op in outs), "_M", "_K"]
    text += f"{indent}_gpurt_post({', '.join(args)});\n"
    return text


def _row_walk(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    idx, g = layout.index, layout.group
    ins = [op for op in ops if op.kind == "in"]
    per_block = BLOCK // g
    out = [f"    const int _lane = threadIdx.x % {g};\n",
           f"    const {idx} _m = ({idx})blockIdx.x * {per_block} + threadIdx.x / {g};\n",
           "    __shared__ _type_reduce _sh[32];\n",
           "    _type_reduce _acc = _gpurt_identity();\n",
           f"    const {idx} _k0 = ({idx})blockIdx.y * _chunk;\n",
           f"    const {idx} _k1 = _k0 + _chunk < _K ? _k0 + _chunk : _K;\n",
           "    if (_m < _M) {\n"]
    out.append(_decompose("_m", "s", "ts", layout.kept, [op.name for op in ins], idx, "        "))
    if layout.vec > 1:
        v = layout.vec
        out.append(f"        const {idx} _kv = _k0 + (_k1 - _k0) / {v} * {v};\n"
                   f"        #pragma unroll {ROW_UNROLL}\n"
                   f"        for ({idx} _k = _k0 + _lane * {v}; _k < _kv; _k += {g * v}) {{\n")
        for op in ins:
            out.append(f"            const _gpurt_vec<{op.storage}, {v}> _v_{op.name} = "
                       f"*reinterpret_cast<const _gpurt_vec<{op.storage}, {v}>*>("
                       f"_p_{op.name} + _o_m_{op.name} + _k);\n")
        out.append(f"            #pragma unroll\n            for (int _e = 0; _e < {v}; ++_e) {{\n")
        out.append(map_step(ops, {op.name: f"_v_{op.name}.v[_e]" for op in ins}, " " * 16))
        out.append("            }\n        }\n"
                   f"        for ({idx} _k = _kv + _lane; _k < _k1; _k += {g}) {{\n")
        fetch = {op.name: f"_p_{op.name}[_o_m_{op.name} + _k]" for op in ins}
    else:
        out.append(f"        #pragma unroll 4\n"
                   f"        for ({idx} _k = _k0 + _lane; _k < _k1; _k += {g}) {{\n")
        out.append(_decompose("_k", "r", "tr", layout.reduced, [op.name for op in ins], idx,
                              " " * 12))
        fetch = {op.name: f"_p_{op.name}[_o_m_{op.name} + _o_k_{op.name}]" for op in ins}
    out.append(map_step(ops, fetch, " " * 12))
    out.append("        }\n    }\n")
    out.append("    #pragma unroll\n    for (int _d = 16; _d > 0; _d >>= 1)"
               " _acc = _gpurt_reduce(_acc, _gpurt_shfl(_acc, _d));\n")
    if g > 32:
        out.append("    if (threadIdx.x % 32 == 0) _sh[threadIdx.x / 32] = _acc;\n"
                   "    __syncthreads();\n"
                   "    if (threadIdx.x < 32) {\n"
                   f"        _acc = threadIdx.x < {g // 32} ? _sh[threadIdx.x] "
                   ": _gpurt_identity();\n"
                   "        #pragma unroll\n        for (int _d = 16; _d > 0; _d >>= 1)"
                   " _acc = _gpurt_reduce(_acc, _gpurt_shfl(_acc, _d));\n    }\n")
    out.append("    if (_lane == 0 && _m < _M) {\n")
    out.append(_store(ops, layout, "        "))
    out.append("    }\n")
    return "".join(out)


def _column_walk(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """``width`` threads across ``width * vec * spread`` consecutive outputs: ``vec`` adjacent
    ones per thread (one vector load), or ``spread`` of them ``width`` apart (a load each,
    every one coalesced across the warp; for rows a vector cannot align with). ``BLOCK //
    width`` rows of threads share K, combined in shared memory, a thread per output."""
    idx, w, v, p = layout.index, layout.width, layout.vec, layout.spread
    rows, per, n = BLOCK // w, outputs_per_block(layout), layout.vec * layout.spread
    ins = [op for op in ops if op.kind == "in"]
    names = [op.name for op in ins]
    out = [f"    __shared__ _type_reduce _sh[{rows}][{per + 1}];\n",
           f"    const int _tx = threadIdx.x % {w}, _ty = threadIdx.x / {w};\n",
           f"    const {idx} _mv = ({idx})blockIdx.x * {per} + _tx * {v};\n",
           f"    _type_reduce _accv[{n}];\n",
           f"    #pragma unroll\n    for (int _e = 0; _e < {n}; ++_e)"
           " _accv[_e] = _gpurt_identity();\n",
           f"    const {idx} _k0 = ({idx})blockIdx.y * _chunk;\n",
           f"    const {idx} _k1 = _k0 + _chunk < _K ? _k0 + _chunk : _K;\n",
           "    if (_mv < _M) {\n"]
    out.append(_decompose("_mv", "s", "ts", layout.kept, names, idx, "        "))
    for j in range(1, p):  # past the end: read output _mv's column again, stored nowhere
        out.append(f"        const {idx} _mv{j} = _mv + {j * w} < _M ? _mv + {j * w} : _mv;\n")
        out.append(_decompose(f"_mv{j}", "s", "ts", layout.kept, names, idx, "        "))
    out.append(f"        #pragma unroll {COLUMN_UNROLL}\n"
               f"        for ({idx} _k = _k0 + _ty; _k < _k1; _k += {rows}) {{\n")
    out.append(_decompose("_k", "r", "tr", layout.reduced, names, idx, " " * 12))
    for j in range(p):
        mv = f"_mv{j}" if j else "_mv"
        for op in ins:
            out.append(f"            const _gpurt_vec<{op.storage}, {v}> _v{j}_{op.name} = "
                       f"*reinterpret_cast<const _gpurt_vec<{op.storage}, {v}>*>("
                       f"_p_{op.name} + (_o{mv}_{op.name} + _o_k_{op.name}));\n")
    for j in range(p):
        out.append(f"            #pragma unroll\n            for (int _e = 0; _e < {v}; ++_e) {{\n"
                   f"                _type_reduce& _acc = _accv[{j * v} + _e];\n")
        out.append(map_step(ops, {op.name: f"_v{j}_{op.name}.v[_e]" for op in ins}, " " * 16))
        out.append("            }\n")
    out.append("        }\n    }\n"
               f"    #pragma unroll\n    for (int _j = 0; _j < {p}; ++_j)\n"
               f"        #pragma unroll\n        for (int _e = 0; _e < {v}; ++_e)"
               f" _sh[_ty][_j * {w * v} + _tx * {v} + _e] = _accv[_j * {v} + _e];\n")
    out.append(combine_rows(ops, layout, f"({idx})blockIdx.x * {per}"))
    return "".join(out)


def combine_rows(ops: Sequence[Operand], layout: ReduceLayout, first: str) -> str:
    """The column walks' end: a thread per output of the block (the first at ``first``) sums
    the ``BLOCK // width`` rows of partials in ``_sh`` (in the realigned walk, row ``y``'s
    are ``_shs[y]`` further along) and stores the sum."""
    idx, per, rows = layout.index, outputs_per_block(layout), BLOCK // layout.width
    shift = (lambda y: f" + _shs[{y}]") if layout.realign else (lambda y: "")
    out = ["    __syncthreads();\n",
           f"    for (int _o = threadIdx.x; _o < {per}; _o += {BLOCK}) {{\n",
           f"        const {idx} _m = {first} + _o;\n",
           "        if (_m >= _M) break;\n",
           f"        _type_reduce _acc = _sh[0][_o{shift(0)}];\n",
           f"        #pragma unroll\n        for (int _y = 1; _y < {rows}; ++_y)"
           f" _acc = _gpurt_reduce(_acc, _sh[_y][_o{shift('_y')}]);\n",
           _store(ops, layout, "        "),
           "    }\n"]
    return "".join(out)


def outputs_per_block(layout: ReduceLayout) -> int:
    """Outputs one block of the walk computes."""
    if layout.walk == "row":
        return BLOCK // layout.group
    if layout.realign:
        return (layout.width - 1) * layout.vec
    return layout.width * layout.vec * layout.spread


def fold_groups(per: int) -> int:
    """Threads sharing each output's partial rows in the column fold of ``per`` outputs."""
    return max(1, BLOCK // per)


def _ticket(counter: str, arrivals: str, flag: str) -> str:
    """Every block: fence its partials, take a ticket from ``counter``; only the last of
    ``arrivals`` blocks goes on (it sets the counter back to 0 and, with acquire semantics
    before the barrier or a fence after it, reads the others' partials). See TICKET."""
    last = f"(unsigned)({arrivals} - 1)"
    if TICKET == "all":
        return ("    __threadfence();\n    __syncthreads();\n"
                f"    if (threadIdx.x == 0)\n        {flag} = atomicAdd({counter}, 1u) == {last};\n"
                f"    __syncthreads();\n    if (!{flag}) return;\n"
                f"    if (threadIdx.x == 0) *({counter}) = 0u;\n    __threadfence();\n")
    take = {"one": f"__threadfence();\n        {flag} = atomicAdd({counter}, 1u) == {last};\n"
                   f"        if ({flag}) __threadfence();\n",
            "acqrel": f"{flag} = _gpurt_ticket_acq_rel({counter}) == {last};\n"}[TICKET]
    return ("    __syncthreads();\n    if (threadIdx.x == 0) {\n"
            f"        {take}        if ({flag}) *({counter}) = 0u;\n    }}\n"
            f"    __syncthreads();\n    if (!{flag}) return;\n")


def _fold(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """After a split block's partials: the last block of blockIdx.x's column of the grid
    (its ticket from _count[blockIdx.x]) folds every split's partials of its outputs and runs
    post_map. With a ``tree`` of G and more than G splits, the splits' groups (as few as hold
    at most G splits each, of equal sizes Z but the last) fold first: the last block of
    group g (its ticket from _count[gridDim.x + blockIdx.x * groups + g]) folds the group's
    partials into the group's first row, then the last of the groups folds those rows (Z
    apart)."""
    out = ["    __shared__ int _gpurt_last;\n"]
    per = outputs_per_block(layout)
    if layout.walk == "column" and layout.tree:
        g = layout.tree
        out += [f"    const int _gm = ((int)gridDim.y + {g - 1}) / {g};  // groups at most\n",
                "    const int _gz = ((int)gridDim.y + _gm - 1) / _gm;  // splits a group\n",
                "    const int _ng = ((int)gridDim.y + _gz - 1) / _gz;  // groups\n",
                "    if (_ng > 1) {\n",
                "    const int _g0 = (int)blockIdx.y / _gz * _gz;\n",
                "    __shared__ int _gpurt_group_last;\n",
                _ticket("_count + gridDim.x + blockIdx.x * _ng + blockIdx.y / _gz",
                        "min(_gz, (int)gridDim.y - _g0)", "_gpurt_group_last"),
                _fold_columns(ops, layout, per,
                              ("_g0", "1", "min(_gz, (int)gridDim.y - _g0)"), final=False),
                "    }\n",
                _ticket("_count + blockIdx.x", "(_ng > 1 ? _ng : (int)gridDim.y)",
                        "_gpurt_last"),
                _fold_columns(ops, layout, per, ("0", "(_ng > 1 ? _gz : 1)",
                                                 "(_ng > 1 ? _ng : (int)gridDim.y)"),
                              final=True)]
        return "".join(out)
    out.append(_ticket("_count + blockIdx.x", "(int)gridDim.y", "_gpurt_last"))
    if layout.walk == "column":
        out.append(_fold_columns(ops, layout, per, ("0", "1", "(int)gridDim.y"), final=True))
    elif per == 1:
        out.append(_fold_one(ops, layout))
    else:
        out.append(_fold_warps(ops, layout, per))
    return "".join(out)


_SHUFFLE = ("#pragma unroll\n        for (int _d = 16; _d > 0; _d >>= 1)"
            " _acc = _gpurt_reduce(_acc, _gpurt_shfl(_acc, _d));\n")


def _fold_one(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """One output (a block per row): the whole block strides over the splits."""
    idx = layout.index
    out = [f"    {{\n    const {idx} _mo = blockIdx.x;\n",
           "    _type_reduce _acc = _gpurt_identity();\n",
           f"    for (int _y = threadIdx.x; _y < (int)gridDim.y; _y += {BLOCK})"
           " _acc = _gpurt_reduce(_acc, _gpurt_l2(_partial + (long long)_y * _M + _mo));\n",
           "    " + _SHUFFLE,
           "    if (threadIdx.x % 32 == 0) _sh[threadIdx.x / 32] = _acc;\n",
           "    __syncthreads();\n    if (threadIdx.x < 32) {\n",
           f"        _acc = threadIdx.x < {BLOCK // 32} ? _sh[threadIdx.x] "
           ": _gpurt_identity();\n",
           "        " + _SHUFFLE, "        if (threadIdx.x == 0 && _mo < _M) {\n",
           "            const " + idx + " _m = _mo;\n"]
    out.append(_store(ops, dataclasses.replace(layout, split=False), " " * 12))
    out.append("        }\n    }\n    }\n")
    return "".join(out)


def _fold_warps(ops: Sequence[Operand], layout: ReduceLayout, per: int) -> str:
    """A few outputs (a warp per row): a warp per output, its lanes over the splits."""
    idx = layout.index
    out = [f"    for (int _o = threadIdx.x / 32; _o < {per}; _o += {BLOCK // 32}) {{\n",
           f"        const {idx} _m = ({idx})blockIdx.x * {per} + _o;\n",
           "        if (_m >= _M) break;\n",
           "        _type_reduce _acc = _gpurt_identity();\n",
           "        for (int _y = threadIdx.x % 32; _y < (int)gridDim.y; _y += 32)"
           " _acc = _gpurt_reduce(_acc, _gpurt_l2(_partial + (long long)_y * _M + _m));\n",
           "        " + _SHUFFLE, "        if (threadIdx.x % 32 == 0) {\n"]
    out.append(_store(ops, dataclasses.replace(layout, split=False), " " * 12))
    out.append("        }\n    }\n")
    return "".join(out)


def _fold_columns(ops: Sequence[Operand], layout: ReduceLayout, per: int,
                  rows: tuple[str, str, str], final: bool) -> str:
    """Fold partial rows ``first + i * stride`` (i < count; ``rows`` = the three C
    expressions) of the block's consecutive outputs: consecutive threads read consecutive
    partials, ``FOLD_BATCH`` rows per thread in flight at once; with fewer outputs than
    threads, ``groups`` of threads share the rows and meet in shared memory. ``final``: store
    through post_map, else into row ``first`` (a tree's first level; the next ticket fences
    it)."""
    idx, batch = layout.index, FOLD_BATCH
    first, stride, count = rows
    groups = fold_groups(per)
    span = BLOCK // groups
    row = f"(long long)({first} + _i * {stride}) * _M + _m"
    fold = ["        _type_reduce _acc = _gpurt_identity();\n",
            f"        for (int _i0 = _fg; _i0 < _n; _i0 += {groups * batch}) {{\n",
            f"            _type_reduce _b[{batch}];\n",
            f"            #pragma unroll\n            for (int _j = 0; _j < {batch}; ++_j) {{\n",
            f"                const int _i = _i0 + _j * {groups};\n",
            f"                _b[_j] = _i < _n ? _gpurt_l2(_partial + {row})"
            " : _gpurt_identity();\n",
            "            }\n",
            f"            #pragma unroll\n            for (int _j = 0; _j < {batch}; ++_j)\n",
            f"                if (_i0 + _j * {groups} < _n) _acc = _gpurt_reduce(_acc, _b[_j]);\n",
            "        }\n"]
    if final:
        store = _store(ops, dataclasses.replace(layout, split=False), " " * 8)
    else:
        store = f"        _partial[(long long)({first}) * _M + _m] = _acc;\n"
    out = ["    {\n", f"    const int _n = {count};\n"]
    if groups == 1:
        out += [f"    for (int _o = threadIdx.x; _o < {per}; _o += {BLOCK}) {{\n",
                f"        const {idx} _m = ({idx})blockIdx.x * {per} + _o;\n",
                "        if (_m >= _M) break;\n",
                "        const int _fg = 0;\n", *fold, store, "    }\n"]
    else:
        out += [f"    __shared__ _type_reduce _shf[{groups}][{span}];\n",
                f"    const int _fg = threadIdx.x / {span}, _o = threadIdx.x % {span};\n",
                f"    const {idx} _m = ({idx})blockIdx.x * {per} + _o;\n",
                f"    const bool _mine = _o < {per} && _m < _M && _fg < {groups};\n",
                "    if (_mine) {\n", *fold,
                "        _shf[_fg][_o] = _acc;\n    }\n",
                "    __syncthreads();\n",
                "    if (_mine && _fg == 0) {\n",
                "        _type_reduce _acc = _shf[0][_o];\n",
                f"        #pragma unroll\n        for (int _g = 1; _g < {groups}; ++_g)"
                " _acc = _gpurt_reduce(_acc, _shf[_g][_o]);\n", store, "    }\n"]
    out.append("    }\n")
    return "".join(out)


def _functions(text: ReduceText, ops: Sequence[Operand]) -> str:
    """The user's expressions as device functions: identity, map, reduce, post-map."""
    ins = [op for op in ops if op.kind == "in"]
    scalars = [op for op in ops if op.kind == "scalar"]
    outs = [op for op in ops if op.kind == "out"]
    scalar_args = [f"const {op.compute} {op.name}" for op in scalars]
    map_args = ", ".join([*(f"const {op.compute} {op.name}" for op in ins), *scalar_args])
    post_args = ", ".join(["const _type_reduce a", *scalar_args,
                           *(f"{op.storage}& _r_{op.name}" for op in outs),
                           "long long _m_size", "long long _k_size"])
    locals_ = "".join(f"{op.compute} {op.name}; " for op in outs)
    stores = "".join(f"_r_{op.name} = _gpurt_cvt<{op.storage}>::to({op.name}); " for op in outs)
    return (f"{text.typedefs}\n"
            "__device__ __forceinline__ _type_reduce _gpurt_identity() "
            f"{{ return static_cast<_type_reduce>({text.identity}); }}\n"
            "__device__ __forceinline__ _type_reduce _gpurt_reduce(const _type_reduce a, "
            f"const _type_reduce b) {{ return ({text.reduce_expr}); }}\n"
            f"__device__ __forceinline__ _type_reduce _gpurt_map({map_args}) "
            f"{{ return ({text.map_expr}); }}\n"
            f"__device__ __forceinline__ void _gpurt_post({post_args}) "
            "{ const _gpurt_index _in_ind{_m_size * _k_size}, _out_ind{_m_size}; "
            "(void)_in_ind; (void)_out_ind; "
            f"{locals_}{{ {text.post_map}; }} {stores}}}\n")


Walk = Callable[[Sequence[Operand], ReduceLayout], str]


def reduce_source(text: ReduceText, ops: Sequence[Operand], layout: ReduceLayout,
                  realign: Walk | None = None) -> str:
    """The whole CUDA program of one reduction kernel (pass 1 when split). ``realign``: the
    realigned column walk (realign_codegen.column_realign_walk, built on this module's parts),
    needed where ``layout.realign``."""
    if layout.realign and realign is None:
        raise ValueError("a realigned column walk needs realign_codegen.column_realign_walk")
    walk = _row_walk if layout.walk == "row" else \
        realign if layout.realign and realign is not None else _column_walk
    params = ",\n        ".join(_params(ops, layout))
    fold = _fold(ops, layout) if layout.fold else ""
    capped = layout.walk == "column" and (layout.fold or layout.realign) and COLUMN_MIN_BLOCKS
    bounds = f"{BLOCK}, {COLUMN_MIN_BLOCKS}" if capped else f"{BLOCK}"
    return (f"{PRELUDE}{_HELPERS}\n{text.preamble}\n{_functions(text, ops)}\n"
            f'extern "C" __global__ void __launch_bounds__({bounds}) {text.name}(\n'
            f"        {params}) {{\n{walk(ops, layout)}{fold}}}\n")


def finish_source(text: ReduceText, ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """The second kernel of a split reduction: fold ``_splits`` partials per output."""
    idx = layout.index
    outs = [op for op in ops if op.kind == "out"]
    params = ["const _type_reduce* __restrict__ _partial", f"{idx} _M", f"{idx} _K",
              "int _splits"]
    params += [f"{op.compute} {op.name}" for op in ops if op.kind == "scalar"]
    params += [f"{op.storage}* _p_{op.name}" for op in outs]
    params += [f"{idx} _s{d}" for d in range(layout.kept)]
    params += [f"{idx} _ts_{op.name}_{d}" for op in outs for d in range(layout.kept)]
    # a warp per output: lanes stride over the splits, then shuffle
    body = (f"    const int _lane = threadIdx.x % 32;\n"
            f"    for ({idx} _m = ({idx})blockIdx.x * {BLOCK // 32} + threadIdx.x / 32; _m < _M;"
            f" _m += ({idx})gridDim.x * {BLOCK // 32}) {{\n"
            "        _type_reduce _acc = _gpurt_identity();\n"
            "        for (int _y = _lane; _y < _splits; _y += 32)"
            " _acc = _gpurt_reduce(_acc, _partial[(long long)_y * _M + _m]);\n"
            "        #pragma unroll\n        for (int _d = 16; _d > 0; _d >>= 1)"
            " _acc = _gpurt_reduce(_acc, _gpurt_shfl(_acc, _d));\n"
            "        if (_lane == 0) {\n")
    body += _store(ops, dataclasses.replace(layout, split=False), "            ")
    body += "        }\n    }\n"
    joined = ",\n        ".join(params)
    return (f"{PRELUDE}{_HELPERS}\n{text.preamble}\n{_functions(text, ops)}\n"
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {text.name}_finish(\n'
            f"        {joined}) {{\n{body}}}\n")
