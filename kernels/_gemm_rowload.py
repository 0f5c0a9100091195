"""The row-streaming GEMM family (kernels/gemm_rowload.cu): fp16/bf16 and fp32 problems (fp32
products, also under allow_tf32) with a few rows of A (M <= 4 by the heuristic, 8 for the
tuner; 16-bit with a K-major B: 2; exact fp32 with a K-major B: 8) whose B rows need not be
16-byte aligned (issue 17: 1 x 4099 x 4099, where every other path streams B's 8198-byte rows
with narrow loads at ~0.9 TB/s or copies them first; fp32 1 x 5003 x 4099, whose 20012-byte
rows the simt kernel reads 4 bytes at a time).

A :class:`Config` of kind ``"rowload"`` means, for an N-major B (stored K x N, rows of B
streamed): ``bm`` rows of A per CTA (1, 2, 4, 8 or 16: each lane keeps bm x e x slots fp32
sums, e = 8 16-bit or 4 fp32 elements a 16-byte load), ``bn`` = 31 e x slots columns of B per
CTA (a warp's 32 16-byte loads give 31 lanes' e columns each; slots 1 or 2: 248 or 496 16-bit
columns, 124 or 248 fp32 ones), ``bk`` = 8 x the rows of B each of the CTA's 8 warps keeps in
flight (2, 4 or 8: bk 16, 32, 64). For a K-major B (B^T = W stored N x K, the weight of
``x @ W.T``: dot products along W's rows): ``bn`` = 16, 32 or 64 rows of W per CTA (2, 4 or
8 per warp, all in flight); ``bk`` = the k a warp takes of each row per step, 1, 2 or 4 warp
loads of 248 (fp32 124; on 16-byte aligned rows the kernel reads 256 / 128 a load, lane 31's
load its own), at most 16 loads a lane in flight; 16-bit: ``bm`` 1 or 2 (bm x bk <= 496);
fp32: ``bm`` 1 to 4 (bm x bk <= 496) or 8 (124 k a step), exact fp32 at any alignment,
faster than the simt tiles at M <= 8 (issue 17: 1 x 4096 x 4096 with B given N x K).
``split_k``: CTAs
splitting K (the last CTA of each tile adds the fp32 slices in order, like the mma kernels:
one launch, deterministic, partials in the stream's workspace). The kernels take gemm_mma's
arguments, so kernels/_gemm_launch.py launches them like an mma config.

Plain Python, no GPU calls.
"""

from __future__ import annotations

from typing import Any

from ._gemm_types import DT_BF16, DT_F16, DT_F32, DT_TF32

Config = Any  # a kernels._gemm_config.Config of kind "rowload" (that module imports this one)
Problem = Any  # a kernels._gemm_config.Problem

__all__ = ["validate", "name_expression", "why_not", "heuristic", "candidates", "SMALL_MAX"]

# The heuristic's largest M for an N-major B, and the tuner's: on an H100 (notes_gemm.md,
# session 9 s9-rowload) M = 1, 2, 4 x 4099^2 ran in 18.0, 19.1, 27.1 us against split-K mma's
# 36.0-36.6 (cuBLAS 16.6, 32.0, 32.2), but M = 8 and 16 in 54 and 157 (mma 37.9, 41.5).
SMALL_MAX = 4
TUNE_SMALL_MAX = 8
NK_MAX = 2  # the largest M for a 16-bit K-major B (register-bound: 2 x 64 x 248 holds 96)
# fp32's (a 16-byte load holds 4 k: 4 x 64 x 124; past 4 rows of A the 8-row tile, 124 k a
# step: on an H100, session 23, 5-8 x 4096 x 4096 and 8 x 11008 x 4096 ran 1.15-1.25x faster
# than the simt tiles; a 16-row tile ran 0.5-0.8x of them at M = 12-16)
F32_NK_MAX = 8
COLS = 248  # 16-bit columns of B per warp load (gemm_rowload.cu: COLS)
F32_COLS = 124  # fp32 ones (Lanes<DT_F32>::COLS)
NK_ROWS = (16, 32, 64)  # rows of a K-major B's W per CTA (gemm_rowload.cu: 8 RW)
_ROWS = (1, 2, 4, 8, 16)


def _nk(config: Config) -> bool:
    """Whether ``config`` is a tiling for a K-major B (16-64 rows of W per CTA)."""
    return config.bn in NK_ROWS


def _nk_shape_ok(bm: int, bn: int, bk: int) -> bool:
    """Whether (bm, bn, bk) is a K-major B's tiling the kernels have, for some element type:
    at most 16 of a lane's 16-byte loads in flight, at most 496 k of A's rows a step."""
    if bm > 4:  # fp32 only: one warp load a row
        return bm == 8 and bn in NK_ROWS and bk == F32_COLS
    slots = bk // COLS if bk % COLS == 0 else bk // F32_COLS
    return (bm in (1, 2, 3, 4) and bn in NK_ROWS and bk in (F32_COLS, COLS, 2 * COLS)
            and bm * bk <= 2 * COLS and bn // 8 * slots <= 16)


def _cols(dt: int) -> int:
    """Columns of B a warp load gives for element type ``dt``."""
    return F32_COLS if dt in (DT_F32, DT_TF32) else COLS


def validate(config: Config) -> None:
    """Raise ValueError unless ``config`` is a rowload tiling the kernels have (for some element
    type: :func:`why_not` checks its columns against the problem's)."""
    kn = config.bm in _ROWS and config.bn in (F32_COLS, COLS, 2 * COLS) and \
        config.bk in (16, 32, 64)
    nk = _nk_shape_ok(config.bm, config.bn, config.bk)
    if not (kn or nk) or config.wm or config.wn or config.cluster_m != 1 or config.tma_store:
        raise ValueError(f"rowload tiles are (1|2|4|8|16) x (248|496) x (16|32|64) (fp32: "
                         f"124|248 columns) for an N-major B, (1..4) x (16|32|64) x "
                         f"(124|248|496) with bm x bk <= 496 and bn / 8 x bk / 124 (16-bit: "
                         f"bk / 248) <= 16 for a K-major B (fp32 also 8 x (16|32|64) x 124); "
                         f"not {config}")


def name_expression(config: Config, dt: int, a_kmajor: bool) -> str:
    """The instantiation (the split-K kernel where ``config`` splits K); TF32 problems take
    the exact fp32 kernel (its fp32 products are what TF32 permits, not what it requires)."""
    split = "_splitk" if config.split_k > 1 else ""
    dt = DT_F32 if dt == DT_TF32 else dt
    a_k = str(a_kmajor).lower()
    if _nk(config):
        return (f"gemm_rowload_nk{split}<{dt}, {config.bm}, {config.bk // _cols(dt)}, "
                f"{config.bn // 8}, {a_k}>")
    slots = config.bn // _cols(dt)
    return f"gemm_rowload{split}<{dt}, {config.bm}, {slots}, {config.bk // 8}, {a_k}>"


def why_not(problem: Problem, config: Config | None = None) -> str | None:
    """Why the rowload kernels (``config``'s, where given) cannot run ``problem``."""
    if problem.dt not in (DT_F16, DT_BF16, DT_F32, DT_TF32):
        return "the rowload kernel takes float16/bfloat16 or float32"
    if problem.capability < (7, 0):
        return "the rowload kernel needs sm_70 or newer"
    if problem.dt == DT_TF32 and problem.b_kmajor:
        return "the rowload kernel takes TF32 problems with an N-major B only"
    cols = _cols(problem.dt)
    if config is not None and not _nk(config) and config.bn not in (cols, 2 * cols):
        return (f"rowload tiles of this element type have {cols} or {2 * cols} columns (one or "
                f"two warp loads), not {config.bn}")
    most = _nk_max(problem.dt)
    if config is not None and _nk(config) and (config.bk not in (cols, 2 * cols, 4 * cols)
                                               or config.bm > most
                                               or config.bn // 8 * config.bk // cols > 16):
        past4 = " (8 x (16|32|64) x 124 past 4 rows)" if most > 4 else ""
        return (f"rowload tiles for a K-major B of this element type are (1..{min(most, 4)}) x "
                f"(16|32|64) x ({cols}|{2 * cols}|{4 * cols}) with bn / 8 x bk / {cols} <= 16"
                f"{past4}, not {config.bm}x{config.bn}x{config.bk}")
    if config is not None and _nk(config) != problem.b_kmajor:
        meant, got = ("K-major", "N-major") if _nk(config) else ("N-major", "K-major")
        return f"rowload tiles {config.bm}x{config.bn}x{config.bk} are for a {meant} B, not {got}"
    return None


def _nk_max(dt: int) -> int:
    """The most rows of A a K-major B's kernel takes for element type ``dt``."""
    return F32_NK_MAX if dt == DT_F32 else NK_MAX


def _nk_rows(m: int) -> int:
    """The row tile of A for ``m`` rows with a K-major B: M itself up to 4, then 8 (fp32)."""
    return m if m <= 4 else 8


def _rows(m: int) -> int:
    """The row tile for ``m`` rows of A (the smallest that holds them, at most 16)."""
    return next(r for r in _ROWS if r >= min(m, 16))


def _split(problem: Problem, tiles: int, per_sm: int, unit: int, least: int) -> int:
    """K slices (of whole ``unit``s of k) so the grid fills one wave of resident CTAs
    (``per_sm`` each), each slice ``least`` k deep at least, the fp32 slices under a quarter of
    B's bytes, and none left empty."""
    units = -(-problem.k // unit)
    want = min(problem.sm_count * per_sm // max(tiles, 1), problem.k // least,
               problem.k // (8 * max(problem.m, 1)), 64)
    if want <= 1:
        return 1
    per = -(-units // want)
    return -(-units // per)


def _config(problem: Problem, bm: int, slots: int, bk: int) -> tuple[int, int, int, int]:
    bn = _cols(problem.dt) * slots
    tiles = -(-problem.m // bm) * -(-problem.n // bn)
    return bm, bn, bk, _split(problem, tiles, 1 if bm >= 16 else 2, 8, 2 * bk)


def _config_nk(problem: Problem, bm: int, bk: int, bn: int = 64) -> tuple[int, int, int, int]:
    tiles = -(-problem.m // bm) * -(-problem.n // bn)
    return bm, bn, bk, _split(problem, tiles, 2, bk, bk)


def heuristic(problem: Problem) -> tuple[int, int, int, int] | None:
    """(bm, bn, bk, split_k) for a 16-bit or exact fp32 problem whose operand rows are not all
    16-byte multiples (the TMA kernels cannot read them; everything else reads them with
    narrow loads; fp32: B's rows are, the simt kernel then loads it 4 bytes at a time):
    at most SMALL_MAX rows of A and 256 columns or more with B N-major, at most NK_MAX rows of
    A with B K-major; also exact fp32 with B K-major and at most F32_NK_MAX rows of A at any
    alignment (GEMV-like: one pass over W at its bandwidth, where the simt tiles ran at 0.62 of
    cuBLAS for 1 x 4096 x 4096; M = 5-8 on the 8-row tile); None otherwise. The narrowest
    tiles (248 columns, 4 rows in flight a warp; 248 k a step for a K-major B, fp32 124) were
    the fastest at every shape timed on an H100: the kernel's 8 shift instantiations share the
    instruction cache, so smaller loops win."""
    if why_not(problem) is not None or problem.m < 1 or problem.k < 64:
        return None
    if problem.b_kmajor:
        cols = _cols(problem.dt)
        if problem.m > _nk_max(problem.dt) or problem.n < 64 or problem.k < cols or (
                problem.vec and problem.dt != DT_F32):
            return None
        return _config_nk(problem, _nk_rows(problem.m), cols)
    if problem.vec or problem.m > SMALL_MAX or problem.n < 256:
        return None
    # fp32: two warp loads a lane (248 columns, the bytes of 16-bit's one): as fast or faster
    # at every shape timed (an H100, session 19: 3 x 11003 x 4093 68.2 us against 82.8)
    return _config(problem, _rows(problem.m), 2 if problem.dt in (DT_F32, DT_TF32) else 1, 32)


def candidates(problem: Problem) -> list[tuple[int, int, int, int]]:
    """Rowload tilings worth timing (none past TUNE_SMALL_MAX rows of A, NK_MAX with B K-major,
    F32_NK_MAX for fp32)."""
    if why_not(problem) is not None or problem.m < 1:
        return []
    if problem.b_kmajor:
        if problem.m > _nk_max(problem.dt):
            return []
        cols, bm = _cols(problem.dt), _nk_rows(problem.m)
        # 8 rows a warp x 1 or 2 loads in flight, 4 x 1 (M >= 2: 4x11008x4096, 2x4096x4096 on
        # an H100, session 23), 2 x 4 (M = 1: 1x4096x4096); 4 x 2 never won, 4 x 4 spills
        return [_config_nk(problem, bm, slots * cols, bn)
                for bn, slots in ((64, 1), (64, 2), (32, 1), (16, 4))
                if _nk_shape_ok(bm, bn, slots * cols)]
    if problem.m > TUNE_SMALL_MAX:
        return []
    bm = _rows(problem.m)
    found: list[tuple[int, int, int, int]] = []
    for slots, bk in ((1, 32), (2, 32), (1, 64), (2, 64)):
        if (bm >= 8 and (bk == 64 or slots == 2)) or (bm == 4 and bk == 64 and slots == 2):
            continue  # past 128 registers (spills)
        tiles = _config(problem, bm, slots, bk)
        if tiles not in found:
            found.append(tiles)
    return found
