"""The row-streaming GEMM family (kernels/gemm_rowload.cu): fp16/bf16 problems with a few rows
of A (M <= 16, up to 32 for the tuner) and an N-major B (stored K x N) whose rows need not be
16-byte aligned (issue 17: 1 x 4099 x 4099, where every other path streams B's 8198-byte rows
with narrow loads at ~0.9 TB/s or copies them first).

A :class:`Config` of kind ``"rowload"`` means: ``bm`` rows of A per CTA (1, 2, 4, 8 or 16:
each lane keeps bm x 8 x slots fp32 sums), ``bn`` = 248 x slots columns of B per CTA (a warp's
32 16-byte loads give 31 lanes' 8 columns each; slots 1 or 2), ``bk`` = 8 x the rows of B each
of the CTA's 8 warps keeps in flight (2, 4 or 8: bk 16, 32, 64), ``split_k`` CTAs splitting K
(the last CTA of each tile adds the fp32 slices in order, like the mma kernels: one launch,
deterministic, partials in the stream's workspace). The kernel takes gemm_mma's arguments, so
kernels/_gemm_launch.py launches it like an mma config.

Plain Python, no GPU calls.
"""

from __future__ import annotations

from typing import Any

from ._gemm_types import DT_BF16, DT_F16

Config = Any  # a kernels._gemm_config.Config of kind "rowload" (that module imports this one)
Problem = Any  # a kernels._gemm_config.Problem

__all__ = ["validate", "name_expression", "why_not", "heuristic", "candidates", "SMALL_MAX"]

SMALL_MAX = 16  # the heuristic's largest M
TUNE_SMALL_MAX = 32  # the tuner's
COLS = 248  # columns of B per warp load (gemm_rowload.cu: COLS)
_ROWS = (1, 2, 4, 8, 16)


def validate(config: Config) -> None:
    """Raise ValueError unless ``config`` is a rowload tiling the kernel has."""
    if (config.bm not in _ROWS or config.bn not in (COLS, 2 * COLS)
            or config.bk not in (16, 32, 64) or config.wm or config.wn
            or config.cluster_m != 1 or config.tma_store):
        raise ValueError(f"rowload tiles are (1|2|4|8|16) x (248|496) x (16|32|64), not {config}")


def name_expression(config: Config, dt: int, a_kmajor: bool) -> str:
    """The instantiation (the split-K kernel where ``config`` splits K)."""
    split = "_splitk" if config.split_k > 1 else ""
    return (f"gemm_rowload{split}<{dt}, {config.bm}, {config.bn // COLS}, {config.bk // 8}, "
            f"{str(a_kmajor).lower()}>")


def why_not(problem: Problem) -> str | None:
    """Why the rowload kernel cannot run ``problem`` (None when it can)."""
    if problem.dt not in (DT_F16, DT_BF16):
        return "the rowload kernel takes float16/bfloat16"
    if problem.b_kmajor:
        return "the rowload kernel streams an N-major B (stored K x N), not a K-major one"
    if problem.capability < (7, 0):
        return "the rowload kernel needs sm_70 or newer"
    return None


def _rows(m: int) -> int:
    return next(r for r in _ROWS if r >= min(m, 16))


def _split(problem: Problem, bm: int, bn: int, bk: int) -> int:
    """K slices so the grid fills one wave of resident CTAs (2 per SM, 1 at bm 16: registers),
    each slice keeping every warp busy for two rounds of loads at least, and the fp32 slices
    under a quarter of B's bytes."""
    tiles = -(-problem.m // bm) * -(-problem.n // bn)
    slots = problem.sm_count * (1 if bm >= 16 else 2)
    most = max(1, min(problem.k // (2 * bk), problem.k // (8 * max(problem.m, 1)), 64))
    return max(1, min(slots // max(tiles, 1), most))


def _config(problem: Problem, bm: int, slots: int, bk: int) -> tuple[int, int, int, int]:
    bn = COLS * slots
    return bm, bn, bk, _split(problem, bm, bn, bk)


def heuristic(problem: Problem) -> tuple[int, int, int, int] | None:
    """(bm, bn, bk, split_k) for a 16-bit problem of at most 16 rows of A and at least 256
    columns whose operand rows are not all 16-byte multiples (the TMA kernels cannot read them;
    everything else reads them with narrow loads), with B N-major; None otherwise."""
    if (why_not(problem) is not None or problem.vec or problem.m > SMALL_MAX
            or problem.m < 1 or problem.n < 256 or problem.k < 64):
        return None
    bm = _rows(problem.m)
    return _config(problem, bm, 2 if bm <= 2 else 1, 64 if bm <= 4 else 32)


def candidates(problem: Problem) -> list[tuple[int, int, int, int]]:
    """Rowload tilings worth timing (none past TUNE_SMALL_MAX rows of A or on a K-major B)."""
    if why_not(problem) is not None or problem.m > TUNE_SMALL_MAX or problem.m < 1:
        return []
    bm = _rows(problem.m)
    found: list[tuple[int, int, int, int]] = []
    for slots, bk in ((2 if bm <= 2 else 1, 64 if bm <= 4 else 32), (1, 64), (2, 32), (1, 32)):
        if bm >= 8 and (bk == 64 or slots == 2):
            continue  # past 128 registers (bm 16: past 255)
        tiles = _config(problem, bm, slots, bk)
        if tiles not in found:
            found.append(tiles)
    return found
