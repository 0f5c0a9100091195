"""The skinny GEMM family (kernels/gemm_skinny.cu): fp16/bf16 problems where one side of C is
a few dozen at most (decode shapes: M = batch, N and K = a layer's sizes).

The small operand S is whichever of op(a) (M x K) and op(b)^T (N x K) has fewer rows; the
big one, G, is streamed from device memory once. A :class:`Config` of kind ``"skinny"`` means:
``bm`` columns of S per CTA (8, 16 or 32), ``bn`` = 64 rows of G per CTA, ``bk`` = 32 k per
warp times the CTA's warps (64, 128 or 256: 2, 4 or 8 warps splitting K), ``split_k`` CTAs of
one thread-block cluster splitting K further (1, 2, 4, 8; above 1 needs sm_90), their partial
sums added through distributed shared memory in a fixed order (no workspace, deterministic).

Plain Python, no GPU calls (kernels/gemm.py launches through :func:`launch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:
    from ._gemm_tune import Config, Problem

__all__ = ["validate", "threads", "shared_mem", "name_expression", "kernel_name", "runs_on",
           "heuristic", "candidates", "launch", "SMALL_MAX"]

# The heuristic picks the skinny kernel when the small side of C is at most this.
SMALL_MAX = 32
# The tuner also times it up to this.
TUNE_SMALL_MAX = 64
_ROW_FLOATS = 64 + 4  # a partial-sum row in shared memory (gemm_skinny.cu: RS)


def validate(config: Config) -> None:
    """Raise ValueError unless ``config`` is a skinny tiling the kernel has."""
    if (config.bm not in (8, 16, 32) or config.bn != 64 or config.bk not in (64, 128, 256)
            or config.split_k not in (1, 2, 4, 8) or config.wm or config.wn
            or config.cluster_m != 1 or config.tma_store):
        raise ValueError(f"skinny tiles are (8|16|32) x 64 x (64|128|256) with split 1, 2, 4 "
                         f"or 8 (CTAs of one cluster), not {config}")


def threads(config: Config) -> int:
    return config.bk  # a warp per 32 k


def shared_mem(config: Config) -> int:
    """Each warp's fp32 partial tile, bm rows of 64 (+4) floats."""
    return (config.bk // 32) * config.bm * _ROW_FLOATS * 4


def name_expression(config: Config, dt: int, s_kmajor: bool, g_kmajor: bool, vec: bool) -> str:
    """The instantiation with S (the small operand) and G (the big one) laid out so."""
    flags = ", ".join(str(x).lower() for x in (g_kmajor, s_kmajor, vec))
    return f"gemm_skinny<{dt}, {config.bm}, {config.bk // 32}, {config.split_k}, {flags}>"


def _swapped(m: int, n: int) -> bool:
    """Whether op(b)^T is the small operand (C's rows are the long side)."""
    return n < m


def kernel_name(config: Config, problem: Problem) -> str:
    """``config``'s instantiation for ``problem`` (S = op(a), unless C has more rows than
    columns: then S = op(b)^T)."""
    a_k, b_k = problem.a_kmajor, problem.b_kmajor
    if _swapped(problem.m, problem.n):
        a_k, b_k = b_k, a_k
    return name_expression(config, problem.dt, a_k, b_k, problem.vec)


def runs_on(config: Config, capability: tuple[int, int]) -> bool:
    """mma.sync needs sm_80; clusters (split_k > 1) sm_90."""
    return capability >= (8, 0) and (config.split_k == 1 or capability >= (9, 0))


# Registers per thread of the 4-warp kernels (ptxas, sm_90; by bm and whether G is K-major):
# they decide how many CTAs an SM holds, so how many fit in one wave.
_REGISTERS = {(8, False): 120, (8, True): 162, (16, False): 152, (16, True): 168,
              (32, False): 209, (32, True): 236}


def _g_kmajor(problem: Problem) -> bool:
    return problem.a_kmajor if _swapped(problem.m, problem.n) else problem.b_kmajor


def _config(problem: Problem, bm: int, warps: int, waves: float = 1.0) -> Config:
    """A skinny config for ``problem``: the largest K split (1, 2 or 4 CTAs; clusters need
    sm_90) whose grid fits in ``waves`` waves of resident CTAs, each warp keeping 4 chunks of
    K at least. Measured on an H200 (notes_gemm.md): a grid past one wave, or clusters of 8,
    cost 15-50%."""
    from ._gemm_tune import Config

    small, big = min(problem.m, problem.n), max(problem.m, problem.n)
    blocks = -(-big // 64) * -(-small // bm)
    per_sm = min(65536 // (_REGISTERS[bm, _g_kmajor(problem)] * 32 * warps), 32 // warps)
    slots = problem.sm_count * max(per_sm, 1) * waves
    chunks = -(-problem.k // 32)
    split = 1
    while (problem.capability >= (9, 0) and split < 4 and blocks * split * 2 <= slots
           and chunks >= 8 * split * warps):
        split *= 2
    return Config("skinny", bm, 64, 32 * warps, split_k=split)


def _bm(small: int) -> int:
    return 8 if small <= 8 else 16 if small <= 16 else 32


def heuristic(problem: Problem) -> Optional[Config]:
    """The skinny config for a 16-bit problem whose small side is at most 16, or at most
    SMALL_MAX with at least a row block of G per SM (below that, with 17-32 rows, the mma
    split-K path was faster on an H200); None otherwise."""
    from ._gemm_tune import DT_BF16, DT_F16

    small, big = min(problem.m, problem.n), max(problem.m, problem.n)
    if problem.dt not in (DT_F16, DT_BF16) or small > SMALL_MAX or problem.capability < (8, 0):
        return None
    if small > 16 and -(-big // 64) < problem.sm_count:
        return None
    return _config(problem, _bm(small), 4)


def candidates(problem: Problem) -> list[Config]:
    """Skinny configs worth timing (none when the small side exceeds TUNE_SMALL_MAX)."""
    from ._gemm_tune import DT_BF16, DT_F16

    small = min(problem.m, problem.n)
    if problem.dt not in (DT_F16, DT_BF16) or small > TUNE_SMALL_MAX:
        return []
    found: list[Config] = []
    for bm in sorted({_bm(small), 32 if small > 16 else _bm(small)}):
        for warps, waves in ((4, 1.0), (4, 2.0), (4, 0.5), (8, 1.0), (2, 1.0)):
            config = _config(problem, bm, warps, waves)
            if config not in found:
                found.append(config)
    return found


def launch(kernel: Any, plan: Any, config: Config, alpha: np.float32, beta: np.float32,
           out: Any, cin: Any, stream: Any) -> None:
    """Run ``kernel`` (``config``'s instantiation for ``plan``) writing ``out`` (rows plan.ldc
    apart) from ``cin`` (rows plan.ldcin apart, or None when beta is 0)."""
    import gpurt

    swap = _swapped(plan.m, plan.n)
    small, big = (plan.b, plan.a) if swap else (plan.a, plan.b)
    n_small, n_big = (plan.n, plan.m) if swap else (plan.m, plan.n)
    c_strides = (1, plan.ldc) if swap else (plan.ldc, 1)
    cin_strides = (1, plan.ldcin) if swap else (plan.ldcin, 1)
    blocks = -(-n_big // 64) * -(-n_small // config.bm) * config.split_k
    i32, i64 = np.int32, np.int64
    args = (big.ptr, small.ptr, out.ptr, 0 if cin is None else cin.ptr, i32(n_small),
            i32(n_big), i32(plan.k), i64(big.ld), i64(small.ld), *map(i64, c_strides),
            *map(i64, cin_strides), alpha, beta)
    smem = shared_mem(config)
    if config.split_k == 1:
        kernel(blocks, config.threads, args, shared_mem=smem, stream=stream)
    else:
        cluster = gpurt.LaunchConfig(blocks, config.threads, smem, cluster=(config.split_k, 1, 1))
        kernel.launch(cluster, *args, stream=stream)
