"""Variants of the split column walk's one-level fold (reduce_codegen._fold), each a knob that
is off by default until timed (s13-col, issue 20):

- "staged" (reduction.FOLD_STAGE_BYTES): the last block copies every split's partials of its
  outputs into shared memory at once (cp.async: no register holds them, so all are in
  flight together: one L2 round trip, where the batched fold takes one per FOLD_BATCH rows),
  then a thread per output folds them in split order;
- "early" (reduction.FOLD_EARLY): each block takes its ticket before its walk (thread 0's
  atomicAdd, its result needed only after the walk), so that the block that folds is known
  when the walks end: the others publish their partials (a release add on a second counter,
  nothing waited for) and the folder waits until all have (an acquire poll), instead of
  every block's fence and ticket round trips after its walk. The folder waits only for
  blocks that took a ticket before it: they are running and wait for nobody, so the wait
  ends whatever the grid's residency (and it waits while fewer have published, not until
  exactly all: counters left wrong could give wrong sums, never a hang).

Counters (reduce_codegen._fold): the ticket at _count[blockIdx.x], with "early" the
published partials at _count[gridDim.x + blockIdx.x]; the folder sets both back to 0.
"""

from __future__ import annotations

__all__ = ["EARLY_TICKET", "EARLY_WAIT", "HELPERS", "staged"]

HELPERS = r"""
// The staged fold's copy of one partial into shared memory: cp.async (no register holds it)
// where the reduce type is 4 or 8 bytes.
template <typename R> __device__ __forceinline__ void _gpurt_stage(R* dst, const R* src) {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(R) == 4 || sizeof(R) == 8) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;"
                     :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "n"(sizeof(R))
                     : "memory");
        return;
    }
#endif
    *dst = _gpurt_l2(src);
}
__device__ __forceinline__ void _gpurt_stage_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}
// The early fold's publication (release: the block's partials, ordered by a barrier before
// it) and the folder's poll (acquire: the others' partials), at device scope.
__device__ __forceinline__ void _gpurt_publish(unsigned* p) {
#ifdef __CUDA_ARCH__
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(p) : "memory");
#else
    atomicAdd(p, 1u);
#endif
}
__device__ __forceinline__ unsigned _gpurt_acquire(const unsigned* p) {
#ifdef __CUDA_ARCH__
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return *(const volatile unsigned*)p;
#endif
}
"""

EARLY_TICKET = ("    unsigned _gpurt_ticket = 0;  // the fold's, taken before the walk\n"
                "    if (threadIdx.x == 0) _gpurt_ticket = atomicAdd(_count + blockIdx.x, 1u);\n")

# after the block's partials are stored: publish them, or (the folder) wait for the others'
EARLY_WAIT = (
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        unsigned* const _pub = _count + gridDim.x + blockIdx.x;\n"
    "        _gpurt_last = _gpurt_ticket == gridDim.y - 1;\n"
    "        if (!_gpurt_last) {\n"
    "            _gpurt_publish(_pub);\n"
    "        } else {\n"
    "            while (_gpurt_acquire(_pub) < gridDim.y - 1) {}\n"
    "            _count[blockIdx.x] = 0u;\n"
    "            *_pub = 0u;\n"
    "        }\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (!_gpurt_last) return;\n")


def staged(idx: str, per: int, rows: int, store: str, block: int) -> str:
    """The staged fold of ``per`` outputs a block of ``block`` threads (index type ``idx``),
    at most ``rows`` splits (as planned); ``store``: the statements that store ``_acc`` as
    output ``_m``."""
    first = f"({idx})blockIdx.x * {per}"
    return "".join([
        f"    {{\n    __shared__ _type_reduce _stg[{rows}][{per}];\n",
        f"    for (int _t = threadIdx.x; _t < (int)gridDim.y * {per}; _t += {block}) {{\n",
        f"        const {idx} _m = {first} + _t % {per};\n",
        f"        if (_m < _M) _gpurt_stage(&_stg[_t / {per}][_t % {per}],"
        f" _partial + (long long)(_t / {per}) * _M + _m);\n    }}\n",
        "    _gpurt_stage_wait();\n    __syncthreads();\n",
        f"    for (int _o = threadIdx.x; _o < {per}; _o += {block}) {{\n",
        f"        const {idx} _m = {first} + _o;\n        if (_m >= _M) break;\n",
        "        _type_reduce _acc = _gpurt_identity();\n",
        "        for (int _i = 0; _i < (int)gridDim.y; ++_i)"
        " _acc = _gpurt_reduce(_acc, _stg[_i][_o]);\n",
        store,
        "    }\n    }\n"])
