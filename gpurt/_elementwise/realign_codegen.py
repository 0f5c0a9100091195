"""The column walk of reduction kernels for rows a vector does not align with ("realign",
see reduce_codegen): aligned vector loads of the envelope of a block's columns, each element
set back in its column through shared memory."""

from __future__ import annotations

from collections.abc import Sequence

from . import reduce_codegen
from .codegen import Operand
from .reduce_codegen import BLOCK, ReduceLayout, combine_rows, map_step, outputs_per_block

__all__ = ["REALIGN_BATCH_FROM", "column_realign_walk"]

# The realigned column walk's loop as whole batches of COLUMN_UNROLL loads (the last batch's
# rows past the thread's end load its first row again and fold nothing) where a vector holds
# at least this many elements (16-bit: 8), else `#pragma unroll`, whose remainder loop NVRTC
# puts first (one load in flight a trip); 0: nowhere. H100: 4099x8191 float16 75.7 -> 78.1%
# of copy, 2047x10007 bfloat16 66.4 -> 68.1; float32 loses batched (4099x8191 88.8 -> 86.8,
# 65536x1023 89.1 -> 86.8; notes_bandwidth.md, s10-colwalk).
REALIGN_BATCH_FROM = 8


def column_realign_walk(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """The column walk for rows a vector does not align with (one kept and one reduced
    dimension, every input with the same strides and alignment): thread (_tx, _ty) loads the
    aligned ``vec``-vector _tx of the envelope of the block's columns in each of its rows
    (K strided by ``rows``, a multiple of the vectors' period in the row stride, so the
    rows' misalignment ``_s`` is the thread's constant) and sums it slot by slot; shared
    memory then puts slot ``p`` of row thread ``_ty`` back in column ``p - _s``. The
    envelope of ``width`` vectors covers ``(width - 1) * vec`` columns whatever ``_s``.
    Every vector holds an element of its row. The vector before the view's first element lies
    in that element's aligned 16 bytes (inside its allocation); every other one lies inside
    the view (the planner asks for a row stride of at least ``vec``) but the one that passes
    the view's end, whose elements are read one by one (before session 10 rows 0 and K - 1
    were, in every block of the first and last split: no faster on an H100)."""
    idx, w, v = layout.index, layout.width, layout.vec
    rows, per = BLOCK // w, outputs_per_block(layout)
    ins = [op for op in ops if op.kind == "in"]
    first = ins[0].name
    out = [f"    __shared__ _type_reduce _sh[{rows}][{w * v}];\n",
           f"    __shared__ int _shs[{rows}];\n",
           f"    const int _tx = threadIdx.x % {w}, _ty = threadIdx.x / {w};\n",
           f"    const {idx} _c0 = ({idx})blockIdx.x * {per};\n",
           f"    const {idx} _k0 = ({idx})blockIdx.y * _chunk;\n",
           f"    const {idx} _k1 = _k0 + _chunk < _K ? _k0 + _chunk : _K;\n",
           f"    const {idx} _kb = _k0 + _ty;  // this thread's rows: _kb + j * {rows}\n",
           f"    _type_reduce _accv[{v}];\n",
           f"    #pragma unroll\n    for (int _e = 0; _e < {v}; ++_e)"
           " _accv[_e] = _gpurt_identity();\n"]
    for op in ins:
        out.append(f"    const {idx} _o_{op.name} = _c0 * _ts_{op.name}_0 + "
                   f"_kb * _tr_{op.name}_0;\n")
    out.append(f"    const int _s = (int)(reinterpret_cast<unsigned long long>(_p_{first} + "
               f"_o_{first}) / sizeof(*_p_{first}) % {v});\n"
               f"    const {idx} _d = ({idx})_tx * {v} - _s;  // (row, _c0) to the vector\n"
               "    if (_kb < _k1 && _c0 + _d < _M) {\n")
    out += [_realign_cut(first, idx, v, rows), _realign_loop(ops, layout),
            _realign_cut_elements(ops, layout)]
    out.append("    }\n"
               f"    #pragma unroll\n    for (int _e = 0; _e < {v}; ++_e)"
               f" _sh[_ty][_tx * {v} + _e] = _accv[_e];\n"
               "    if (_tx == 0) _shs[_ty] = _s;\n")
    out.append(combine_rows(ops, layout, "_c0"))
    return "".join(out)


def _realign_loop(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """The realigned walk's loop over the thread's rows ``[_ka, _ke)``: where the vector holds
    REALIGN_BATCH_FROM elements or more, batches of COLUMN_UNROLL vector loads, all issued
    before any is folded (the last batch's rows past ``_ke`` load row ``_k`` again and fold
    nothing: no remainder loop of one load in flight); else `#pragma unroll`."""
    idx, v, rows = layout.index, layout.vec, BLOCK // layout.width
    u = reduce_codegen.COLUMN_UNROLL
    ins = [op for op in ops if op.kind == "in"]
    if not (REALIGN_BATCH_FROM and v >= REALIGN_BATCH_FROM):
        out = [f"        #pragma unroll {u}\n",
               f"        for ({idx} _k = _ka; _k < _ke; _k += {rows}) {{\n"]
        out += [f"            const _gpurt_vec<{op.storage}, {v}> _v_{op.name} = "
                f"*reinterpret_cast<const _gpurt_vec<{op.storage}, {v}>*>(_p_{op.name} + "
                f"(_o_{op.name} + (_k - _kb) * _tr_{op.name}_0 + _d));\n" for op in ins]
        out.append(f"            #pragma unroll\n            for (int _e = 0; _e < {v}; ++_e) {{\n"
                   "                _type_reduce& _acc = _accv[_e];\n")
        out.append(map_step(ops, {op.name: f"_v_{op.name}.v[_e]" for op in ins}, " " * 16))
        out.append("            }\n        }\n")
        return "".join(out)
    out = ["        #pragma unroll 1\n",
           f"        for ({idx} _k = _ka; _k < _ke; _k += {u * rows}) {{\n"]
    for op in ins:
        out.append(f"            _gpurt_vec<{op.storage}, {v}> _v_{op.name}[{u}];\n")
    out.append(f"            #pragma unroll\n            for (int _u = 0; _u < {u}; ++_u) {{\n"
               f"                const {idx} _kj = _k + _u * {rows} < _ke ? _k + _u * {rows} "
               ": _k;\n")
    for op in ins:
        out.append(f"                _v_{op.name}[_u] = *reinterpret_cast<const _gpurt_vec<"
                   f"{op.storage}, {v}>*>(_p_{op.name} + (_o_{op.name} + (_kj - _kb) * "
                   f"_tr_{op.name}_0 + _d));\n")
    out.append("            }\n"
               f"            #pragma unroll\n            for (int _u = 0; _u < {u}; ++_u)\n"
               f"            #pragma unroll\n            for (int _e = 0; _e < {v}; ++_e) {{\n"
               "                _type_reduce& _acc = _accv[_e];\n")
    out.append(map_step(ops, {op.name: f"_v_{op.name}[_u].v[_e]" for op in ins}, " " * 16,
                         f"_k + _u * {rows} < _ke"))
    out.append("            }\n        }\n")
    return "".join(out)


def _realign_cut_elements(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """Row ``_kh`` of a thread whose vector passes the view's end (``_cut``), element by
    element: every element's load at once (a column outside the view's is clamped into it)
    and the view's columns folded."""
    idx, v = layout.index, layout.vec
    ins = [op for op in ops if op.kind == "in"]
    out = ["        if (_cut) {\n            const " + idx + " _k = _kh;\n"
           f"            #pragma unroll\n            for (int _e = 0; _e < {v}; ++_e) {{\n"
           f"                const {idx} _c = _c0 + _d + _e;\n"
           f"                const {idx} _cc = _c < 0 ? 0 : _c < _M ? _c : _M - 1;\n"
           "                _type_reduce& _acc = _accv[_e];\n"]
    fetch = {op.name: f"_p_{op.name}[_o_{op.name} + (_k - _kb) * _tr_{op.name}_0 + "
                      "(_cc - _c0)]" for op in ins}
    out.append(map_step(ops, fetch, " " * 16, "_c == _cc"))
    out.append("            }\n        }\n")
    return "".join(out)


def _realign_cut(first: str, idx: str, v: int, rows: int) -> str:
    """The realigned walk's rows ``[_ka, _ke)`` (step ``rows``): all of the thread's but, where
    its vector passes the view's end (``_cut``: row ``_kh``, the highest in memory, and a
    vector past column M - 1), that row, whose elements are read after the loop."""
    return (f"        const {idx} _kh = _tr_{first}_0 < 0 ? 0 : _K - 1;  // highest in memory\n"
            f"        const bool _cut = _c0 + _d + {v} > _M && _kh >= _kb && _kh < _k1 && "
            f"(_kh - _kb) % {rows} == 0;\n"
            f"        const {idx} _ka = _cut && _kh == _kb ? _kb + {rows} : _kb;\n"
            f"        const {idx} _ke = _cut && _kh != _kb ? _kh : _k1;\n")
