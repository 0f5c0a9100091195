"""The decode GEMM family (kernels/gemm_decode.cu): fp16/bf16 problems on Hopper where one side
of C is small (a batch of 1..128 tokens) and the weight is streamed once, on wgmma with the
small side on the MMA's N dimension (C^T = B^T A^T for a wide C).

A :class:`Config` of kind ``"decode"`` means: ``bm`` rows of the big operand X per CTA (64,
128, 192 or 256: one consumer warpgroup of 64 rows, two of 64, three of 64 (16-bit only) or
two of 128), ``bn`` columns of
the small operand Y per CTA (16, 32, 64, 128: wgmma's N), ``bk`` = 64, ``stages`` the TMA
ring's depth, ``split_k`` CTAs of one thread-block cluster splitting K (1, 2, 4, 8), their
fp32 partial tiles summed through distributed shared memory in a fixed order (one launch, no
workspace, deterministic).

TF32 (fp32 data, ``allow_tf32``) runs the same kernel with K tiles of 32 fp32 (``bk`` = 32,
the same 128-byte rows): Y (the small operand) must be K-major, as wgmma reads TF32 from
shared memory only K-major, and ``bm`` at most 128; an N-major weight is read into registers.

Plain Python, no GPU calls (kernels/_gemm_launch.py encodes the tensor maps and launches).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gpurt

from ._gemm_types import DT_BF16, DT_F16, DT_TF32

Config = Any  # a kernels._gemm_config.Config of kind "decode" (that module imports this one)
Problem = Any  # a kernels._gemm_config.Problem

__all__ = ["validate", "threads", "shared_mem", "name_expression", "kernel_name", "why_not",
           "Side", "sides", "heuristic", "few_tiles", "halves", "candidates", "arguments",
           "SMALL_MAX"]

SMALL_MAX = 128  # the small side of C this family takes (wgmma's N is at most 256)
HEURISTIC_MIN = 0  # the heuristic picks it above this (the skinny kernel up to it)
_TILES_N = (16, 32, 64, 128)
_RING_BYTES = {bm: 200 * 1024 for bm in (64, 128, 192, 256)}  # one CTA per SM


def validate(config: Config) -> None:
    """Raise ValueError unless ``config`` is a decode tiling the kernel has."""
    if (config.bm not in (64, 128, 192, 256) or config.bn not in _TILES_N
            or config.bk not in (32, 64) or (config.bk == 32 and config.bm > 128)
            or config.split_k not in (1, 2, 4, 8) or not 2 <= config.stages <= 16
            or config.wm or config.wn or config.cluster_m != 1 or config.tma_store):
        raise ValueError(f"decode tiles are (64|128|192|256) x (16|32|64|128) x 64 (16-bit) or "
                         f"(64|128) x (16|32|64|128) x 32 (TF32) with 2..16 stages and split "
                         f"1, 2, 4 or 8 (CTAs of one cluster), not {config}")


def threads(config: Config) -> int:
    # 1, 2 or 3 consumer warpgroups of 64 or 128 rows and a producer warp
    return {64: 160, 192: 416}.get(config.bm, 288)


def shared_mem(config: Config) -> int:
    """The ring, or the fp32 partial tile written over it when larger, its barriers and the
    slack that aligns it to 1 KiB."""
    ring = config.stages * (config.bm + config.bn) * 128
    partial = config.bn * (config.bm + 4) * 4
    return max(ring, partial) + 16 * config.stages + 1024


def name_expression(config: Config, dt: int, x_kmajor: bool, y_kmajor: bool) -> str:
    flags = ", ".join(str(x).lower() for x in (x_kmajor, y_kmajor))
    return (f"gemm_decode<{dt}, {config.bm}, {config.bn}, {config.stages}, {flags}, "
            f"{config.split_k}>")


class Side(NamedTuple):
    """Which operand is X (the big one, P rows) and which Y (Q rows) and how C is strided:
    ``tall`` False: X = op(b)^T, Y = op(a), C = D^T; True: X = op(a), Y = op(b)^T, C = D."""

    tall: bool
    p: int
    q: int
    x_kmajor: bool
    y_kmajor: bool


def sides(m: int, n: int, a_kmajor: bool, b_kmajor: bool) -> Side:
    if n < m:
        return Side(True, m, n, a_kmajor, b_kmajor)
    return Side(False, n, m, b_kmajor, a_kmajor)


def kernel_name(config: Config, problem: Problem) -> str:
    side = sides(problem.m, problem.n, problem.a_kmajor, problem.b_kmajor)
    return name_expression(config, problem.dt, side.x_kmajor, side.y_kmajor)


def why_not(problem: Problem, config: Config) -> str | None:
    """Why ``config`` cannot run ``problem`` (None when it can); the caller checks shared
    memory and sizes."""
    if problem.dt not in (DT_F16, DT_BF16, DT_TF32):
        return "the decode kernel takes float16/bfloat16 or TF32 (allow_tf32=True)"
    if (config.bk == 32) != (problem.dt == DT_TF32):
        meant = "TF32" if config.bk == 32 else "float16/bfloat16"
        return f"decode tiles with bk={config.bk} are for {meant}"
    if problem.capability != (9, 0):
        major, minor = problem.capability
        return f"the decode kernel needs sm_90 (Hopper), not sm_{major}{minor}"
    if not problem.tma:
        return ("the decode kernel loads with TMA, which needs every operand's base address "
                "16-byte aligned and its row pitch a multiple of 16 bytes")
    if problem.k < 1:
        return "the decode kernel needs K >= 1"
    side = sides(problem.m, problem.n, problem.a_kmajor, problem.b_kmajor)
    if problem.dt == DT_TF32 and not side.y_kmajor:
        return ("the TF32 decode kernel needs the small operand K-major (wgmma reads TF32 "
                "from shared memory only K-major)")
    if not side.y_kmajor and config.bn % 64:
        return (f"the small operand is not K-major: the decode kernel loads it in 64-wide "
                f"boxes, so bn must be 64 or 128, not {config.bn}")
    return None


class Tiles(NamedTuple):
    """A decode tiling; _gemm_tune makes it a Config."""

    bm: int
    bn: int
    stages: int
    split: int
    bk: int = 64  # 32 for TF32


def _families(problem: Problem) -> bool:
    """Whether the problem's element type is one this family runs (TF32 with a K-major Y)."""
    if problem.dt == DT_TF32:
        return sides(problem.m, problem.n, problem.a_kmajor, problem.b_kmajor).y_kmajor
    return problem.dt in (DT_F16, DT_BF16)


def _k_tiles(problem: Problem) -> int:
    """K tiles of 128-byte rows: 64 16-bit or 32 fp32 elements."""
    return -(-problem.k // (32 if problem.dt == DT_TF32 else 64))


def _bn(problem: Problem) -> int:
    side = sides(problem.m, problem.n, problem.a_kmajor, problem.b_kmajor)
    least = 16 if side.y_kmajor else 64
    return next(t for t in _TILES_N if t >= max(least, min(side.q, SMALL_MAX)))


def _blocks(problem: Problem, bm: int, bn: int) -> int:
    side = sides(problem.m, problem.n, problem.a_kmajor, problem.b_kmajor)
    return -(-side.p // bm) * -(-side.q // bn)


def _cluster_wave(problem: Problem) -> int:
    """CTAs in clusters of 4 or 8 that run at once: an H100 runs 30 clusters of 4 or 15 of 8
    (120 of its 132 SMs) against 66 of 2."""
    return problem.sm_count * 15 // 16


def _split(problem: Problem, bm: int, blocks: int) -> int:
    """K split in 2 where the grid leaves half the SMs idle and fits one wave split (each CTA
    keeping 8 K tiles at least); then in 4 and 8 while that grid still fits one wave of
    clusters with 8+ K tiles per CTA (H100, 128x1024x8192: 64 x 128 split 4 13.6 us against
    20.0 for split 2; a grid of 32 x 4 that takes two waves ran 20-40% slower than split 2 at
    every 4096-row decode shape: notes_gemm.md)."""
    slots = problem.sm_count * (1 if bm == 128 else 2)
    k_tiles = _k_tiles(problem)
    split = 2 if blocks * 2 <= slots and k_tiles >= 16 else 1
    while split in (2, 4) and blocks * split * 2 <= _cluster_wave(problem) and \
            k_tiles >= 16 * split:
        split *= 2
    return split


def _stages(problem: Problem, bm: int, bn: int, ctas: int) -> int:
    """The deepest ring that fits the per-CTA budget: at most 8 stages, 6 for 64-row tiles
    (H100: 6 and 8 within 1%, 10-12 1-3% slower, 6 against 8 4% faster at bn 128; 4 stages
    10-14% slower), whose budget is halved when the grid needs two CTAs per SM."""
    budget, most = _RING_BYTES[bm], 8
    if bm == 64:
        most = 6
        if ctas > problem.sm_count:
            budget //= 2
    return max(2, min(most, budget // ((bm + bn) * 128)))


def _tiles(problem: Problem, bm: int, split: int | None = None) -> Tiles:
    """bm-row tiles, K split as _split says unless given, with _stages' ring."""
    bn = _bn(problem)
    blocks = _blocks(problem, bm, bn)
    if split is None:
        split = _split(problem, bm, blocks)
    bk = 32 if problem.dt == DT_TF32 else 64
    return Tiles(bm, bn, _stages(problem, bm, bn, blocks * split), split, bk)


def few_tiles(problem: Problem) -> Tiles | None:
    """For a 16-bit problem of few output tiles with both sides above the decode heuristic's
    reach (128x128x4096, 256x256x8192: where gemm split K on 128 x 64 wgmma tiles): tiles of
    at most 128 x 64 with K split over clusters of 8, the tiling of the most CTAs (64 at
    least) that fits one wave of clusters with 8+ K tiles per CTA, 128-row tiles on ties;
    None where none does. H100 (notes_gemm.md, s9-splitk), against wgmma 128 x 64 split 4
    and cuBLAS: 128x128x4096 64 x 32 tiles 5.9 us / 9.4 / 6.6; 256x256x8192 128 x 64 9.9 /
    12.9 / 8.8; 192x320x4096 64 x 64 7.4 / 10.6 / 9.0; but 128 x 128 tiles at 384x384x8192
    14.8 / 13.6 / 14.7, and at 512x512x8192 (128 CTAs of any tiling) the best decode one
    17.6 against 15.0."""
    side = sides(problem.m, problem.n, problem.a_kmajor, problem.b_kmajor)
    if problem.dt not in (DT_F16, DT_BF16) or -(-problem.k // 64) < 64 or not problem.pitch128:
        return None
    best: tuple[int, int, int] | None = None  # (blocks, bm, bn)
    for bm, bn in ((128, 64), (128, 32), (64, 128), (64, 64), (64, 32)):
        blocks = _blocks(problem, bm, bn)
        if bn > side.q or (bn < 64 and not side.y_kmajor) or blocks < 8:
            continue
        if blocks * 8 <= _cluster_wave(problem) and (best is None or blocks > best[0]):
            best = (blocks, bm, bn)
    if best is None:
        return None
    blocks, bm, bn = best
    return Tiles(bm, bn, _stages(problem, bm, bn, blocks * 8), 8)


def halves(problem: Problem) -> Tiles | None:
    """cuBLAS's tiling at 64 and 128 x 4096^2 (its nvjet kernel's grid, torch.profiler): 64-row
    tiles over the two halves of the small side (64 or 128), K unsplit, the deepest ring that
    fits, for 16-bit problems whose grid that makes is one CTA per SM for over half the SMs
    and K 33..64 tiles (2049..4096: the shapes timed had 4096); else None. H100
    (notes_gemm.md, s10-dec), cold operands: 128 x 4096^2 64 x 64 tiles with 12-13 stages
    16.2-16.7 us (0.92-0.95 of cuBLAS) against 18.0-18.8 for 64 x 128 split 2; 64 x 4096^2
    64 x 32 with 12-16 stages 14.8-15.4 (0.98-1.00) against 16.3-17.0; 6 stages of either
    were no faster than split 2."""
    side = sides(problem.m, problem.n, problem.a_kmajor, problem.b_kmajor)
    if problem.dt not in (DT_F16, DT_BF16) or side.q not in (64, 128) or \
            not 32 < _k_tiles(problem) <= 64:
        return None
    bn = side.q // 2
    ctas = _blocks(problem, 64, bn)
    if (not side.y_kmajor and bn % 64) or not problem.sm_count < 2 * ctas <= 2 * problem.sm_count:
        return None
    return Tiles(64, bn, min(16, _RING_BYTES[64] // ((64 + bn) * 128)), 1)


def heuristic(problem: Problem) -> Tiles | None:
    """The decode tiling for a 16-bit or TF32 (K-major Y) problem whose small side is above
    HEURISTIC_MIN, up to SMALL_MAX and at most an eighth of the other (None otherwise): 64-row
    tiles where 128-row ones would leave half the SMs idle (4096 rows: 0.5-3% faster on an
    H100), else 128-row ones; TF32 up to 64 columns 64-row ones at every size (an H100, 11008
    weight rows: 1.5-6% faster than 128-row tiles, notes_gemm.md s9-tf32m)."""
    small, big = min(problem.m, problem.n), max(problem.m, problem.n)
    if not _families(problem) or not HEURISTIC_MIN < small <= SMALL_MAX or big < 8 * small:
        return None
    few = _blocks(problem, 128, _bn(problem)) * 2 <= problem.sm_count
    if problem.dt == DT_TF32 and small <= 64:
        few = True
    split_q = halves(problem) if few else None
    return split_q if split_q is not None else _tiles(problem, 64 if few else 128)


def candidates(problem: Problem) -> list[Tiles]:
    """Decode tilings worth timing: 128- and 64-row tiles, unsplit and with K split over
    clusters of 2, 4 and 8 where the grid fits one wave (none when the small side exceeds
    SMALL_MAX). 256-row tiles, which read Y from L2 half as often, were 4-20% slower than the
    best of these at M = 64 and 128 on an H100 (notes_gemm.md): selectable with config= only."""
    if not _families(problem) or min(problem.m, problem.n) > SMALL_MAX:
        return []
    found: list[Tiles] = []
    k_tiles = _k_tiles(problem)
    for bm in (128, 64):
        blocks = _blocks(problem, bm, _bn(problem))
        slots = problem.sm_count * (1 if bm == 128 else 2)
        for split in (1, 2, 4, 8):
            if split == 1 or (blocks * split <= slots and k_tiles >= 4 * split):
                found.append(_tiles(problem, bm, split))
    split_q = halves(problem)
    return found + ([split_q] if split_q is not None else [])


def arguments(call: Any, maps: tuple[bytes, bytes], out_ptr: int, cin_ptr: int, alpha: float,
              beta: float) -> tuple[gpurt.LaunchConfig, tuple[Any, ...], tuple[int, ...]]:
    """(launch config, kernel arguments, positions of the two tensor maps, out_ptr, cin_ptr,
    alpha and beta among them) of ``call`` (a kernels._gemm_launch Call of a decode config)
    with ``maps`` = the tensor maps of X and Y."""
    config = call.config
    side = sides(call.m, call.n, call.a_kmajor, call.b_kmajor)
    c_strides = (call.ldc, 1) if side.tall else (1, call.ldc)
    cin_strides = (call.ldcin, 1) if side.tall else (1, call.ldcin)
    blocks = -(-side.p // config.bm) * -(-side.q // config.bn) * config.split_k
    args = (*maps, out_ptr, cin_ptr, side.p, side.q, call.k, *c_strides, *cin_strides, alpha,
            beta)
    cluster = None if config.split_k == 1 else (config.split_k, 1, 1)
    launch = gpurt.LaunchConfig(blocks, config.threads, call.smem, cluster=cluster)
    return launch, args, (0, 1, 2, 3, 11, 12)
