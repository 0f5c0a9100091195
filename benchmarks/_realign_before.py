"""The realigned column walk's generator as it was before session 10 (s10-colwalk; rows 0 and
K - 1 element by element in every block of the first and last split, a `#pragma unroll`
loop): bandwidth_dev.py's "before" variants swap it in for reduce_codegen's, so that the
run times the code before and after in one process. Dev only; goes with the run."""

from __future__ import annotations

from collections.abc import Sequence

from gpurt._elementwise import reduce_codegen
from gpurt._elementwise.codegen import Operand
from gpurt._elementwise.reduce_codegen import (
    BLOCK,
    ReduceLayout,
    _combine_rows,
    _map_step,
    outputs_per_block,
)


def _column_realign_walk(ops: Sequence[Operand], layout: ReduceLayout) -> str:
    """The column walk for rows a vector does not align with (one kept and one reduced
    dimension, every input with the same strides and alignment): thread (_tx, _ty) loads the
    aligned ``vec``-vector _tx of the envelope of the block's columns in each of its rows
    (K strided by ``rows``, a multiple of the vectors' period in the row stride, so the
    rows' misalignment ``_s`` is the thread's constant) and sums it slot by slot; shared
    memory then puts slot ``p`` of row thread ``_ty`` back in column ``p - _s``. The
    envelope of ``width`` vectors covers ``(width - 1) * vec`` columns whatever ``_s``.
    Rows 0 and K - 1, whose envelopes may leave the view's memory, are read element by
    element; every other vector holds an element of its row and lies inside the view (the
    planner asks for a row stride of at least ``vec``)."""
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
               "    if (_kb < _k1 && _c0 + _d < _M) {\n"
               f"        const {idx} _ka = _kb == 0 ? _kb + {rows} : _kb;\n"
               "        const " + idx + " _ke = _k1 == _K ? _K - 1 : _k1;\n"
               f"        #pragma unroll {reduce_codegen.COLUMN_UNROLL}\n"
               f"        for ({idx} _k = _ka; _k < _ke; _k += {rows}) {{\n")
    for op in ins:
        out.append(f"            const _gpurt_vec<{op.storage}, {v}> _v_{op.name} = "
                   f"*reinterpret_cast<const _gpurt_vec<{op.storage}, {v}>*>(_p_{op.name} + "
                   f"(_o_{op.name} + (_k - _kb) * _tr_{op.name}_0 + _d));\n")
    out.append(f"            #pragma unroll\n            for (int _e = 0; _e < {v}; ++_e) {{\n"
               "                _type_reduce& _acc = _accv[_e];\n")
    out.append(_map_step(ops, {op.name: f"_v_{op.name}.v[_e]" for op in ins}, " " * 16))
    out.append("            }\n        }\n"
               "        #pragma unroll\n        for (int _edge = 0; _edge < 2; ++_edge) {\n"
               f"            const {idx} _k = _edge ? _K - 1 : 0;\n"
               f"            if (_k < _kb || _k >= _k1 || (_k - _kb) % {rows} || "
               "(_edge && _k == 0)) continue;\n"
               f"            #pragma unroll\n            for (int _e = 0; _e < {v}; ++_e) {{\n"
               "                if (_c0 + _d + _e < 0 || _c0 + _d + _e >= _M) continue;\n"
               "                _type_reduce& _acc = _accv[_e];\n")
    fetch = {op.name: f"_p_{op.name}[_o_{op.name} + (_k - _kb) * _tr_{op.name}_0 + _d + _e]"
             for op in ins}
    out.append(_map_step(ops, fetch, " " * 16))
    out.append("            }\n        }\n    }\n"
               f"    #pragma unroll\n    for (int _e = 0; _e < {v}; ++_e)"
               f" _sh[_ty][_tx * {v} + _e] = _accv[_e];\n"
               "    if (_tx == 0) _shs[_ty] = _s;\n")
    out.append(_combine_rows(ops, layout, "_c0"))
    return "".join(out)
