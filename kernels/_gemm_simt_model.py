"""The fp32 simt kernel's wave model: how long a tile and K split take on a problem, fitted to
H100 sweeps (benchmarks/notes_gemm.md, sessions 8-10), and the K split it finds fastest.
kernels/_gemm_tune.py's chooser and kernels/_gemm_rows.py's cut along M decide with it."""

from __future__ import annotations

from ._gemm_config import Config, Problem

__all__ = ["resident_ctas", "grid_cost", "split_for"]

# The multiply-add rate of an SM full of each simt tile's CTAs, relative to cuBLAS's SGEMM
# (H100/H200, notes_gemm.md: 2048^3-8192^3 for the first ones, session 8's decode shapes for
# the 64- and 32-row tiles), and its factor when B is K-major (4-byte transposing copies, which
# narrow tiles of few threads issue badly: H100, 128 / 32 x 11008 x 4096, session 8; the
# 96 x 128 x 8 tile's, 8 threads reading a row's whole 32-byte K tile, from session 21's
# 96-1500 x 1000-14336 x 1000-11008 sweep, where it beat every other tile at 96-257 rows;
# 32 x 128 x 8's and 64 x 64 x 8's from its 16-64 x (4096, 11008, 14336) sweep, once K-major
# copies took 8 threads along K: the rates at the middle of the range that picks the fastest
# measured config at all nine shapes).
# Unlisted tiles: 0.8, 0.6 and 0.92.
_RATE = {(128, 256, 16, 128): 0.96, (128, 128, 16, 128): 0.90, (128, 128, 16, 0): 0.87,
         (64, 128, 8, 0): 0.88, (64, 256, 16, 128): 0.88, (32, 256, 16, 128): 0.85,
         (64, 64, 8, 0): 0.78, (32, 128, 8, 0): 0.86, (96, 128, 8, 0): 0.87}
_RATE_B_KMAJOR = {(128, 256, 16, 128): 0.85, (128, 128, 16, 128): 0.92,
                  (128, 128, 16, 0): 0.94, (64, 256, 16, 128): 0.72, (64, 128, 8, 0): 0.6,
                  (32, 256, 16, 128): 0.37, (64, 64, 8, 0): 0.8, (32, 128, 8, 0): 0.5,
                  (96, 128, 8, 0): 0.8}
# ... and when an M- or N-major operand's rows are not 16-byte aligned (4-byte copies instead
# of 16-byte ones; K-major operands take 4-byte copies at any alignment): every tile alike
# (H100, session 21: 97 x 4093 x 4099 on 128 x 256 split 8 at 0.91 of its aligned twin
# 97 x 4096 x 4096, the tiles in their aligned order, once split-K's partial rows were 16-byte
# aligned).
_RATE_UNALIGNED = 0.92

# Fitted to session 8's H100 sweep (notes_gemm.md: 14 shapes, ~400 tile/split variants). Unit:
# one 16-deep K tile of a 128 x 256 CTA (~2.9 us on an H100). An SM holds 8 warps of 8 x 16-
# output threads (~233 registers) or 16 of 8 x 8 ones (128); with fewer than 8 warps running it
# loses 15% of its rate. A K split costs each CTA half a unit (x its tile's area: its partial
# sums' store), and the grid's end 3 units plus a quarter per slice (the tiles' last CTAs reading
# the slices, kernels/gemm_simt.cu's splitk_end). Grids of two waves or more are not split: their
# partial sums outgrow L2 and cost more than the last wave's idle SMs (4099^3). Session 9 (H100,
# notes_gemm.md): split grids the GPU holds at once end spread over each tile's CTAs (a
# cooperative launch, splitk_spread), _SPREAD_END units in all (128 x 4096 x 4096 split 8:
# 97.0 us against 106.4 for the last-CTA ending, 95.0 unsplit); an SM's last, partial wave of
# 8 x 8 tiles with 8 to 11 warps runs at _RATE_8_WARPS of the rate of 12 or more.
_SPLIT_CTA = 0.5
_SPLIT_END = 3.0
_SPLIT_SLICE = 0.25
_SPREAD_END = 0.5
_RATE_8_WARPS = 0.9
# Problems under _LATENCY_MACS multiply-adds are grids of a few CTAs, each waiting on memory
# as much as on the FMA units: a CTA's K loop takes _K_TILE_LATENCY units a K tile more,
# slices down to one K tile pay, each slice adds _SLICE_SMALL to the spread ending, and the
# splits are powers of two (H100, session 22, 64 x 64 x 8 and 32 x 128 x 8 at splits 1-16 on
# 64^3-200^3, 127x257x61, 100x300x100, 64x127x255, 33x65x4097: the unsplit picks ran 1.2-2.9x
# slower than the best split, splits 5 and 7 15-25% slower than 8). Larger problems keep the
# fitted model.
_LATENCY_MACS = 1 << 24
_K_TILE_LATENCY = 0.2
_SLICE_SMALL = 0.05
_SLICE_MIN = 8  # K tiles a slice takes at least
# Below this many multiply-adds a split's host path (its workspace) outweighs what it saves
_SPLIT_MIN_MACS = 1 << 18


def resident_ctas(problem: Problem, config: Config) -> int:
    """CTAs of simt ``config`` an SM runs at once (registers, then shared memory)."""
    warps = 8 if config.wn == 128 else 16
    by_regs = max(1, warps // (config.threads // 32))
    ring = config.shared_mem(True, False, 4) + 1024  # + the 1 KiB the driver keeps per CTA
    return max(1, min(by_regs, (problem.max_shared + 1024) // ring))


def grid_cost(problem: Problem, config: Config, split: int) -> float:
    """Modelled time of simt ``config`` with ``split`` K slices on ``problem`` (units above):
    the busiest SM's CTAs, one after another ``resident`` at a time, each its K tiles plus one
    (the pipeline's fill) at the SM's rate for the tile and layout, plus the split's costs."""
    resident = resident_ctas(problem, config)
    warps = config.threads // 32
    k_tiles = -(-problem.k // config.bk)
    per = -(-k_tiles // split)  # K tiles per slice
    on_sm = -(-config.tiles(problem.m, problem.n) * split // problem.sm_count)
    tile = (config.bm, config.bn, config.bk, config.wn)
    rate = _RATE.get(tile, 0.8)
    if problem.b_kmajor:
        rate *= _RATE_B_KMAJOR.get(tile, 0.6)
    if not problem.vec and not (problem.a_kmajor and problem.b_kmajor):
        rate *= _RATE_UNALIGNED
    area = config.bm * config.bn / (128 * 256)
    cta = area * ((per + 1) * config.bk / 16 + (_SPLIT_CTA if split > 1 else 0.0))
    end = 0.0
    if split > 1 and config.tiles(problem.m, problem.n) * split <= problem.sm_count * resident:
        end = _SPREAD_END + (_SLICE_SMALL * split if problem.macs < _LATENCY_MACS else 0.0)
    elif split > 1:
        end = _SPLIT_END + _SPLIT_SLICE * split * area
    # small problems: a wave's CTAs also wait on memory this long
    latency = (per + 1) * _K_TILE_LATENCY if problem.macs < _LATENCY_MACS else 0.0
    full, rest = divmod(on_sm, resident)  # waves of `resident` CTAs, then one of `rest`
    waves = full * (resident * cta / (rate * _occupancy(config, resident * warps, False))
                    + latency)
    if rest:
        waves += rest * cta / (rate * _occupancy(config, rest * warps, full > 0)) + latency
    return waves + end


def _occupancy(config: Config, running: int, tail: bool) -> float:
    """An SM's rate with ``running`` warps of simt ``config`` against a full one (``tail``:
    in a last wave, after full ones)."""
    if tail and config.wn != 128 and 8 <= running < 12:
        return _RATE_8_WARPS
    return 1.0 if running >= 8 else 0.85 if running >= 4 else 0.64


def split_for(problem: Problem, config: Config) -> int:
    """The K split (1 = none) that the wave model finds fastest for simt ``config``: for grids
    under two waves of CTAs, slices of at least 8 K tiles, every slice non-empty (split_range
    gives each ceil(tiles / split)), at most 32; the smaller split on a tie. Problems under
    _LATENCY_MACS take powers of two, down to one K tile a slice (an empty last slice is
    allowed there: its CTAs add zeros)."""
    k_tiles = -(-problem.k // config.bk)
    best, best_cost = 1, grid_cost(problem, config, 1)
    slots = problem.sm_count * resident_ctas(problem, config)
    if config.tiles(problem.m, problem.n) >= 2 * slots or problem.macs < _SPLIT_MIN_MACS:
        return 1
    small = problem.macs < _LATENCY_MACS
    for split in range(2, min(32, k_tiles // (1 if small else _SLICE_MIN)) + 1):
        if small and split & (split - 1):
            continue
        if not small and -(-k_tiles // -(-k_tiles // split)) != split:  # an empty slice
            continue
        cost = grid_cost(problem, config, split)
        if cost < best_cost * 0.99:
            best, best_cost = split, cost
    return best
