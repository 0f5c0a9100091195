"""CUDA source of elementwise kernels: one ``extern "C"`` kernel per operand types, layout
class (contiguous with a vector width, or strided with a number of dimensions) and index
width. The user's operation runs once per element on locals named like its parameters.

Contiguous kernels: a block of 256 threads takes tiles of ``256 * UNROLL * vec`` elements,
``gridDim.x`` tiles apart (a grid of one tile per block runs the loop once); full tiles load
every vector of every input first (16-byte loads where the arrays allow), then compute and
store; the last partial tile goes element by element. Small tiles (UNROLL 1) did best: with
many short blocks the last wave's idle tail is short. Strided kernels: a grid-stride loop that
turns the linear index into one element offset per array (strides in elements, last
dimension first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["PRELUDE", "THREADS", "UNROLL", "Layout", "Operand", "elementwise_source"]

THREADS = 256
UNROLL = 1  # vectors per thread and tile (4 and 8 trailed torch: run 1 of session 5)
# Contiguous grids: 0 gives every tile its own block; W > 0 caps the grid at W waves of
# resident blocks, each looping over tiles (plan.contiguous_grid).
WAVES = 0

PRELUDE = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
__device__ __forceinline__ float _gpurt_ld(__half v) { return __half2float(v); }
__device__ __forceinline__ float _gpurt_ld(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T _gpurt_ld(T v) { return v; }
template <typename S> struct _gpurt_cvt {
    template <typename C> static __device__ __forceinline__ S to(C v) { return static_cast<S>(v); }
};
template <> struct _gpurt_cvt<__half> {
    template <typename C> static __device__ __forceinline__ __half to(C v) {
        return __float2half_rn(static_cast<float>(v)); }
};
template <> struct _gpurt_cvt<__nv_bfloat16> {
    template <typename C> static __device__ __forceinline__ __nv_bfloat16 to(C v) {
        return __float2bfloat16_rn(static_cast<float>(v)); }
};
template <typename S, int V> struct __align__(sizeof(S) * V) _gpurt_vec { S v[V]; };
struct _gpurt_index {
    long long n;
    __device__ __forceinline__ long long size() const { return n; }
};
"""


@dataclasses.dataclass(frozen=True)
class Operand:
    """One kernel parameter. ``kind``: "in" / "out" (elements seen as locals of type
    ``compute``), "scalar" (a value of type ``compute``), "raw" (a pointer to ``storage``).
    ``uniform``: an input whose every element is the same one (all strides 0); ``load``: an
    output the body also reads (loaded before the body runs)."""

    name: str
    kind: str
    storage: str
    compute: str
    uniform: bool = False
    load: bool = False

    @property
    def is_array(self) -> bool:
        return self.kind in ("in", "out")


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a kernel walks its arrays: ``ndim`` 0 means contiguous (with ``vec`` elements per
    vector load), else the number of strided dimensions; ``index``: "int" or "long long"."""

    ndim: int
    vec: int
    index: str


def _pointer(op: Operand) -> str:
    const = "const " if op.kind == "in" else ""
    return f"{const}{op.storage}* _p_{op.name}"


def parameters(operands: Sequence[Operand], layout: Layout) -> list[str]:
    """The kernel's parameter list: every operand in order, the element count, then for a
    strided layout the sizes and each array's strides."""
    params = []
    for op in operands:
        if op.kind == "scalar":
            params.append(f"{op.compute} {op.name}")
        elif op.kind == "raw":
            params.append(f"{op.storage}* {op.name}")
        else:
            params.append(_pointer(op))
    params.append(f"{layout.index} _n")
    if layout.ndim:
        params += [f"{layout.index} _s{d}" for d in range(layout.ndim)]
        for op in operands:
            if op.is_array:
                params += [f"{layout.index} _t_{op.name}_{d}" for d in range(layout.ndim)]
    return params


def _element(operands: Sequence[Operand], body: str, fetch: dict[str, str],
             put: dict[str, str], indent: str) -> str:
    """One element: locals from ``fetch`` (name -> expression), the body, the stores."""
    lines = []
    for op in operands:
        if op.kind == "in":
            lines.append(f"const {op.compute} {op.name} = static_cast<{op.compute}>("
                         f"_gpurt_ld({fetch[op.name]}));")
        elif op.kind == "out" and op.load:
            lines.append(f"{op.compute} {op.name} = static_cast<{op.compute}>("
                         f"_gpurt_ld({fetch[op.name]}));")
        elif op.kind == "out":
            lines.append(f"{op.compute} {op.name};")
    lines.append("{\n" + body.strip() + ";\n" + indent + "}")
    for op in operands:
        if op.kind == "out":
            lines.append(f"{put[op.name]} = _gpurt_cvt<{op.storage}>::to({op.name});")
    return "".join(f"{indent}{line}\n" for line in lines)


def _contiguous_body(operands: Sequence[Operand], body: str, layout: Layout) -> str:
    idx, vec = layout.index, layout.vec
    tile = THREADS * UNROLL * vec
    streamed = [op for op in operands if op.is_array and not op.uniform]
    loaded = [op for op in streamed if op.kind == "in" or op.load]
    # tiles gridDim.x apart; _base advances only while it stays below _n (no overflow)
    out = ["    const _gpurt_index _ind{(long long)_n};\n",
           f"    const {idx} _stride = ({idx})gridDim.x * {tile};\n"]
    for op in operands:
        if op.uniform:
            out.append(f"    const {op.storage} _u_{op.name} = _p_{op.name}[0];\n")
    uniform = {op.name: f"_u_{op.name}" for op in operands if op.uniform}
    out.append(f"    for ({idx} _base = ({idx})blockIdx.x * {tile}; _base < _n;\n"
               f"         _base = _n - _base > _stride ? _base + _stride : _n) {{\n"
               f"    if (_n - _base >= {tile}) {{\n")
    for op in streamed:
        out.append(f"        _gpurt_vec<{op.storage}, {vec}> _v_{op.name}[{UNROLL}];\n")
    if loaded:
        out.append(f"        #pragma unroll\n        for (int _u = 0; _u < {UNROLL}; ++_u) {{\n"
                   f"            const {idx} _j = _base + ({idx})(_u * {THREADS} + "
                   f"threadIdx.x) * {vec};\n")
        for op in loaded:
            out.append(f"            _v_{op.name}[_u] = *reinterpret_cast<const _gpurt_vec<"
                       f"{op.storage}, {vec}>*>(_p_{op.name} + _j);\n")
        out.append("        }\n")
    fetch = {**uniform, **{op.name: f"_v_{op.name}[_u].v[_k]" for op in streamed}}
    out.append(f"        #pragma unroll\n        for (int _u = 0; _u < {UNROLL}; ++_u) {{\n"
               f"            const {idx} _j = _base + ({idx})(_u * {THREADS} + "
               f"threadIdx.x) * {vec};\n"
               f"            #pragma unroll\n            for (int _k = 0; _k < {vec}; ++_k) {{\n"
               f"                const {idx} i = _j + _k;\n"
               f"                (void)i; (void)_ind;\n")
    out.append(_element(operands, body, fetch, fetch, " " * 16))
    out.append("            }\n")
    for op in streamed:
        if op.kind == "out":
            out.append(f"            *reinterpret_cast<_gpurt_vec<{op.storage}, {vec}>*>("
                       f"_p_{op.name} + _j) = _v_{op.name}[_u];\n")
    out.append("        }\n    } else {\n"
               f"        for ({idx} i = _base + threadIdx.x; i < _n; i += {THREADS}) {{\n")
    fetch = {**uniform, **{op.name: f"_p_{op.name}[i]" for op in streamed}}
    out.append(_element(operands, body, fetch, fetch, " " * 12))
    out.append("        }\n    }\n    }\n")
    return "".join(out)


def _strided_body(operands: Sequence[Operand], body: str, layout: Layout) -> str:
    idx, nd = layout.index, layout.ndim
    arrays = [op for op in operands if op.is_array]
    out = ["    const _gpurt_index _ind{(long long)_n};\n    (void)_ind;\n",
           (f"    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < _n;\n"
            f"         i += ({idx})gridDim.x * blockDim.x) {{\n"),
           f"        {idx} _r = i;\n"]
    out += [f"        {idx} _o_{op.name} = 0;\n" for op in arrays]
    for d in reversed(range(nd)):
        coord = f"(_r % _s{d})" if d else "_r"
        out.append(f"        {{ const {idx} _c = {coord};")
        if d:
            out.append(f" _r /= _s{d};")
        out += [f" _o_{op.name} += _c * _t_{op.name}_{d};" for op in arrays]
        out.append(" }\n")
    fetch = {op.name: f"_p_{op.name}[_o_{op.name}]" for op in arrays}
    out.append(_element(operands, body, fetch, fetch, " " * 8))
    out.append("    }\n")
    return "".join(out)


def elementwise_source(name: str, preamble: str, operands: Sequence[Operand], body: str,
                       layout: Layout) -> str:
    """The whole CUDA program of one elementwise kernel named ``name``."""
    walk = _strided_body if layout.ndim else _contiguous_body
    params = ",\n        ".join(parameters(operands, layout))
    return (f"{PRELUDE}\n{preamble}\n\n"
            f'extern "C" __global__ void __launch_bounds__({THREADS}) {name}(\n'
            f"        {params}) {{\n{walk(operands, body, layout)}}}\n")
