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

from typing import Any, NamedTuple

import gpurt

from ._gemm_types import DT_BF16, DT_F16

Config = Any  # a kernels._gemm_tune.Config of kind "skinny" (that module imports this one)
Problem = Any  # a kernels._gemm_tune.Problem

__all__ = ["validate", "threads", "shared_mem", "name_expression", "kernel_name", "runs_on",
           "heuristic", "candidates", "arguments", "launch", "SMALL_MAX"]

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


class Tiles(NamedTuple):
    """A skinny tiling: ``bm`` columns of S per CTA, ``bk`` k per CTA (32 per warp),
    ``split`` CTAs of a cluster splitting K; _gemm_tune makes it a Config."""

    bm: int
    bk: int
    split: int


def _config(problem: Problem, bm: int, warps: int, waves: float = 1.0) -> Tiles:
    """A skinny config for ``problem``: the largest K split (1, 2 or 4 CTAs; clusters need
    sm_90) whose grid fits in ``waves`` waves of resident CTAs, each warp keeping 4 chunks of
    K at least. Measured on an H200 (notes_gemm.md): a grid past one wave, or clusters of 8,
    cost 15-50%."""
    small, big = min(problem.m, problem.n), max(problem.m, problem.n)
    blocks = -(-big // 64) * -(-small // bm)
    per_sm = min(65536 // (_REGISTERS[bm, _g_kmajor(problem)] * 32 * warps), 32 // warps)
    slots = problem.sm_count * max(per_sm, 1) * waves
    chunks = -(-problem.k // 32)
    split = 1
    while (problem.capability >= (9, 0) and split < 4 and blocks * split * 2 <= slots
           and chunks >= 8 * split * warps):
        split *= 2
    return Tiles(bm, 32 * warps, split)


def _bm(small: int) -> int:
    return 8 if small <= 8 else 16 if small <= 16 else 32


def heuristic(problem: Problem) -> Tiles | None:
    """The skinny config for a 16-bit problem whose small side is at most 16, or at most
    SMALL_MAX with at least a row block of G per SM (below that, with 17-32 rows, the mma
    split-K path was faster on an H200); None otherwise."""
    small, big = min(problem.m, problem.n), max(problem.m, problem.n)
    if problem.dt not in (DT_F16, DT_BF16) or small > SMALL_MAX or problem.capability < (8, 0):
        return None
    if small > 16 and -(-big // 64) < problem.sm_count:
        return None
    return _config(problem, _bm(small), 4)


def candidates(problem: Problem) -> list[Tiles]:
    """Skinny configs worth timing (none when the small side exceeds TUNE_SMALL_MAX)."""
    small = min(problem.m, problem.n)
    if problem.dt not in (DT_F16, DT_BF16) or small > TUNE_SMALL_MAX:
        return []
    found: list[Tiles] = []
    for bm in sorted({_bm(small), 32 if small > 16 else _bm(small)}):
        for warps, waves in ((4, 1.0), (4, 2.0), (4, 0.5), (8, 1.0), (2, 1.0)):
            config = _config(problem, bm, warps, waves)
            if config not in found:
                found.append(config)
    return found


def arguments(call: Any, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int, alpha: float,
              beta: float) -> tuple[gpurt.LaunchConfig, tuple[Any, ...], tuple[int, ...]]:
    """(launch config, kernel arguments, positions of a_ptr, b_ptr, out_ptr, cin_ptr, alpha and
    beta among them) of ``call`` (a kernels.gemm Call of a skinny config): C (rows call.ldc
    apart) = alpha A B + beta Cin (rows call.ldcin apart), S and G taken from A and B^T by
    which side of C is the small one."""
    config = call.config
    swap = _swapped(call.m, call.n)
    small, big = (b_ptr, a_ptr) if swap else (a_ptr, b_ptr)
    ld_small, ld_big = (call.ldb, call.lda) if swap else (call.lda, call.ldb)
    n_small, n_big = (call.n, call.m) if swap else (call.m, call.n)
    c_strides = (1, call.ldc) if swap else (call.ldc, 1)
    cin_strides = (1, call.ldcin) if swap else (call.ldcin, 1)
    blocks = -(-n_big // 64) * -(-n_small // config.bm) * config.split_k
    args = (big, small, out_ptr, cin_ptr, n_small, n_big, call.k, ld_big, ld_small,
            *c_strides, *cin_strides, alpha, beta)
    cluster = None if config.split_k == 1 else (config.split_k, 1, 1)
    launch = gpurt.LaunchConfig(blocks, config.threads, call.smem, cluster=cluster)
    return launch, args, ((0, 1) if swap else (1, 0)) + (2, 3, 13, 14)


def launch(call: Any, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int, alpha: float,
           beta: float, stream: Any) -> None:
    """Run ``call`` (see :func:`arguments`) on ``stream``."""
    config, args, _ = arguments(call, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)
    call.kernels[0].launch(config, *args, stream=stream)
