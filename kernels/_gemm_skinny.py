"""The skinny GEMM family (kernels/gemm_skinny.cu): fp16/bf16 problems where one side of C is
a few dozen at most (decode shapes: M = batch, N and K = a layer's sizes).

The small operand S is whichever of op(a) (M x K) and op(b)^T (N x K) has fewer rows; the
big one, G, is streamed from device memory once. A :class:`Config` of kind ``"skinny"`` means:
``bm`` columns of S per CTA (8, 16 or 32); ``bn`` = 64 x WN rows of G per CTA (64, 128, 256:
WN warps side by side, sharing S's loads through L1); ``bk`` = 32 x WK (32..256: WK warps
taking the CTA's 32-k chunks in turn; at most 8 warps in all); ``split_k`` CTAs of one
thread-block cluster splitting K further (1, 2, 4, 8; above 1 needs sm_90), their partial sums
added through distributed shared memory in a fixed order (no workspace, deterministic).

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


def validate(config: Config) -> None:
    """Raise ValueError unless ``config`` is a skinny tiling the kernel has."""
    if (config.bm not in (8, 16, 32) or config.bn not in (64, 128, 256)
            or config.bk not in (32, 64, 128, 256) or config.bn // 64 * config.bk // 32 > 8
            or config.split_k not in (1, 2, 4, 8) or config.wm or config.wn
            or config.cluster_m != 1 or config.tma_store):
        raise ValueError(f"skinny tiles are (8|16|32) x (64|128|256) x (32..256) with at most "
                         f"8 warps and split 1, 2, 4 or 8 (CTAs of one cluster), not {config}")


def _warps(config: Config) -> tuple[int, int]:
    """(WN, WK): warps across G's rows and along K."""
    return config.bn // 64, config.bk // 32


def threads(config: Config) -> int:
    wn, wk = _warps(config)
    return 32 * wn * wk


def shared_mem(config: Config) -> int:
    """WK fp32 partial tiles of bm rows of bn (+4) floats."""
    return _warps(config)[1] * config.bm * (config.bn + 4) * 4


def name_expression(config: Config, dt: int, s_kmajor: bool, g_kmajor: bool, vec: bool) -> str:
    """The instantiation with S (the small operand) and G (the big one) laid out so."""
    wn, wk = _warps(config)
    flags = ", ".join(str(x).lower() for x in (g_kmajor, s_kmajor, vec))
    return f"gemm_skinny<{dt}, {config.bm}, {wn}, {wk}, {config.split_k}, {flags}>"


def _swapped(m: int, n: int) -> bool:
    """Whether op(b)^T is the small operand (C's rows are the long side)."""
    return n < m


def kernel_name(config: Config, problem: Problem) -> str:
    """``config``'s instantiation for ``problem`` (S = op(a) unless C has more rows than columns)."""
    a_k, b_k = problem.a_kmajor, problem.b_kmajor
    if _swapped(problem.m, problem.n):
        a_k, b_k = b_k, a_k
    return name_expression(config, problem.dt, a_k, b_k, problem.vec)


def runs_on(config: Config, capability: tuple[int, int]) -> bool:
    """mma.sync needs sm_80; clusters (split_k > 1) sm_90."""
    return capability >= (8, 0) and (config.split_k == 1 or capability >= (9, 0))


# Warps per SM the kernel's registers allow, by bm (launch bounds in gemm_skinny.cu; a
# K-major G takes more registers at bm = 8: 12 warps).
_WARPS_PER_SM = {8: 16, 16: 12, 32: 8}


def _warps_per_sm(problem: Problem, bm: int) -> int:
    g_kmajor = problem.a_kmajor if _swapped(problem.m, problem.n) else problem.b_kmajor
    return 12 if bm == 8 and g_kmajor else _WARPS_PER_SM[bm]


def _config(problem: Problem, bm: int, wn: int, wk: int, scale: float = 1.0) -> Config:
    """A skinny config for ``problem``: the K split (up to 4 CTAs, sm_90) that keeps the grid
    within ``scale`` waves of resident CTAs, each warp at least two chunks of K."""
    from ._gemm_tune import Config

    small, big = min(problem.m, problem.n), max(problem.m, problem.n)
    blocks = -(-big // (64 * wn)) * -(-small // bm)
    slots = problem.sm_count * max(1, _warps_per_sm(problem, bm) // (wn * wk)) * scale
    chunks = -(-problem.k // 32)
    split = 1
    while (problem.capability >= (9, 0) and split < 4 and blocks * split * 2 <= slots
           and chunks >= 4 * split * wk):
        split *= 2
    return Config("skinny", bm, 64 * wn, 32 * wk, split_k=split)


def _bm(small: int) -> int:
    return 8 if small <= 8 else 16 if small <= 16 else 32


def heuristic(problem: Problem) -> Optional[Config]:
    """The skinny config for a 16-bit problem whose small side is at most SMALL_MAX, else None."""
    from ._gemm_tune import DT_BF16, DT_F16

    small = min(problem.m, problem.n)
    if problem.dt not in (DT_F16, DT_BF16) or small > SMALL_MAX or problem.capability < (8, 0):
        return None
    return _config(problem, _bm(small), 1, 4)


def candidates(problem: Problem) -> list[Config]:
    """Skinny configs worth timing (none when the small side exceeds TUNE_SMALL_MAX)."""
    from ._gemm_tune import DT_BF16, DT_F16

    small = min(problem.m, problem.n)
    if problem.dt not in (DT_F16, DT_BF16) or small > TUNE_SMALL_MAX:
        return []
    found: list[Config] = []
    for bm in sorted({_bm(small), min(_bm(small), 16)}, reverse=True):
        for wn, wk, scale in ((1, 4, 1), (2, 2, 1), (1, 8, 1), (4, 1, 1), (1, 4, 2), (1, 4, .5)):
            config = _config(problem, bm, wn, wk, scale)
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
    blocks = -(-n_big // config.bn) * -(-n_small // config.bm) * config.split_k
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
