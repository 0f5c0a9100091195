"""Choosing a GEMM variant (a kernels/_gemm_config.py Config): which ones a problem may use,
the candidates the autotuner (kernels/_gemm_tuner.py) times, and the heuristic choice.

Plain Python with no GPU calls, so all of it is tested on a CPU; kernels/gemm.py does the
compiling, launching and timing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from . import _gemm_decode as _decode
from . import _gemm_rowload as _rowload
from . import _gemm_simt_model as simt_model
from . import _gemm_skinny as _skinny
from ._gemm_config import Config, Problem
from ._gemm_types import DT_BF16, DT_F16, DT_F32, DT_NAMES, DT_TF32

__all__ = [
    "DT_F32", "DT_F16", "DT_BF16", "DT_TF32", "Config", "Problem", "eligible", "why_not",
    "candidates", "all_configs",
    "heuristic", "disabled_kernels",
]

_DT_NAMES = DT_NAMES


# ---- which configs a problem may use ------------------------------------------------------------


def _split_for(problem: Problem, config: Config) -> int:
    """How many K slices give the device about four CTAs per SM when the tile grid alone
    leaves it half idle (1 = no split). Slices are at least 128 deep."""
    tiles = config.tiles(problem.m, problem.n)
    if tiles * 2 >= problem.sm_count or problem.k < 512:
        return 1
    split = min(-(-4 * problem.sm_count // tiles), problem.k // 128, 32)
    return max(split, 1)


# Base candidates per kernel, before split-K is applied.
# simt: [0] large problems (0.96-0.97 of cuBLAS at 2048-8192 on an H200), [1] mid-sized grids
# (2 CTAs per SM), [6] small ones; warp tiles of 32 x 128 = 8 x 16 outputs per thread; [4]
# and [5]: 64- and 32-row tiles for M <= 64 (decode shapes: no rows computed in vain); [7]
# 32 x 128 (2 warps, 8 CTAs per SM: M <= 32 only, with many slices); [8] 96 x 128 (6 warps, 2 CTAs
# per SM: grids that 64- and 128-row tiles fill 1.5 times, 2053 x 3001, fill it twice).
_SIMT = (Config("simt", 128, 256, 16, 32, 128, stages=3),
         Config("simt", 128, 128, 16, 32, 128, stages=3), Config("simt", 128, 128, 16, stages=3),
         Config("simt", 64, 128, 8, stages=4), Config("simt", 64, 256, 16, 32, 128, stages=3),
         Config("simt", 32, 256, 16, 32, 128, stages=3), Config("simt", 64, 64, 8, stages=4),
         Config("simt", 32, 128, 8, stages=4), Config("simt", 96, 128, 8, stages=4))
_MMA = (
    Config("mma", 128, 128, 32, 64, 64, stages=4),
    Config("mma", 128, 256, 32, 64, 64, stages=3),
    Config("mma", 64, 128, 32, 32, 64, stages=4),
    Config("mma", 64, 64, 32, 32, 32, stages=4),
)
_TF32 = (
    Config("mma", 128, 128, 16, 64, 64, stages=4),
    Config("mma", 64, 64, 16, 32, 32, stages=4),
)
# Small problems (_small): latency, not throughput. 32 x 32 tiles of 4 warps (16 x 16 each) put
# the most CTAs on the SMs, each with the fewest loads before its first multiply; 16-bit types
# take K 64 deep in one stage of 2. On an H100 (notes_gemm.md, s9-small) 127x257x61 fp16 ran in
# 2.5-2.7 us against 4.2-4.5 for 64 x 64 x 32 (0.62-0.67 of cuBLAS -> 1.05-1.10), TF32 in 3.0
# against 5.2 (0.64-0.69 -> 1.10-1.18), and they were the fastest of 9 (16-bit) / 7 (TF32)
# tiles at every unaligned size measured with M, N, K <= 512, and at 64-128 x 128-256 x 64 with
# aligned rows, where they beat the wgmma kernel's 128 x 64 tiles by 1.4-1.6x.
_MMA_SMALL = Config("mma", 32, 32, 64, 16, 16, stages=2)
_TF32_SMALL = Config("mma", 32, 32, 16, 16, 16, stages=4)
# TF32 with M <= 16 on a long K (the wgmma kernel's 128-row tiles waste most of their rows):
# 16-row tiles of 2 warps, split K to about 2 CTAs per SM (_thin_split). 16 x 4096^2 on an
# H100: 0.85 / 0.66 of cuBLAS (B N- / K-major) against 0.62 / 0.50 for 64 x 64 split 9; 32 x 64
# tiles 0.77-0.81, 16 x 128 ones 0.47-0.66, 8 or 16 slices 0.65-0.81 (notes_gemm.md, s9-small).
_TF32_THIN = Config("mma", 16, 64, 16, 16, 32, stages=4)
_WGMMA = (
    Config("wgmma", 128, 256, 64, stages=4, group_m=8),
    Config("wgmma", 128, 128, 64, stages=6, group_m=8),
    Config("wgmma", 128, 256, 64, stages=4, group_m=8, cluster_m=2),
    Config("wgmma", 128, 256, 64, stages=4, group_m=16),
    Config("wgmma", 128, 256, 64, stages=4, group_m=16, tma_store=True),
    Config("wgmma", 128, 128, 64, stages=6, group_m=8, tma_store=True),
    # (lean 16: no cluster barrier at the end, the comment below)
    Config("wgmma", 128, 256, 64, stages=4, group_m=8, cluster_m=2, tma_store=True, lean=16),
    Config("wgmma", 128, 64, 64, stages=8, group_m=8, tma_store=True),
)
# The 2-CTA cluster forms end without a cluster barrier (Config.lean bit 16: each CTA's producer
# waits until both CTAs' consumers have released every stage; a cluster-scope release-arrive
# costs ~0.7 us on an H100, benchmarks/cluster_cost_dev.py). H100, kernel-only cold, two rounds
# (notes_gemm.md, session 16), against the end barrier before: 1000^3 64 x 128 c2 9.2 / 9.2 us
# against 9.6 / 9.6 (split barrier), 2000x2000x2000 128 x 256 c2 26.4 / 26.4 against 28.0 /
# 28.1, 2000x3000x1000 128 x 192 c2 ps 26.0 / 26.4 against 27.1 / 27.2, 3000x3000x1000
# 192 x 192 c2 33.7 / 33.8 against 36.2 / 36.3, 3000^3 82.7 / 82.9 against 85.1 / 85.1.
# Clusters for rows that are not 128-byte multiples, where each TMA box row spans two L2 lines
# and the L2's requests are the limit: 2 x 2 CTAs (kernels/gemm_wgmma_x.cu) multicast A along
# the tile row and B along the tile column, gemm_wgmma's 2 x 1 (_WGMMA[6]) B, so each CTA loads
# half of what it shares. Their multiply-add rates there, in _TILE_RATE's units, fitted to an
# H100's time per wave at 8 such shapes (1.03-1.4: the longer K, the less the rows cost), and
# how many clusters run at once per 132 SMs (cuOccupancyMaxActiveClusters on an H100).
# (notes_gemm.md, session 9: 3000x5000x2000 bf16 97 us against 126-134, cuBLAS 95-101.)
_WGMMA_C2X2 = Config("wgmma", 128, 256, 64, stages=4, group_m=16, cluster_m=2, cluster_n=2,
                     tma_store=True)
_WGMMA_MID_C2X2 = Config("wgmma", 128, 128, 64, stages=6, group_m=8, cluster_m=2, cluster_n=2,
                         tma_store=True)
# 128 x 192 tiles (issue 17, s10-tile192): whole waves where 128 x 256 ones leave the last
# mostly idle, cuBLAS's tile width at such shapes. H100, kernel-only vs cuBLAS (notes_gemm.md,
# s10-tile192): 256x11008x4096 116 CTAs 0.94 against 86 of 128 x 256 0.84; 1536^3 0.77 against
# 0.61; on split rows in 2 x 1 clusters (B multicast) 2000x3000x1000 (256 tiles, 1.94 waves)
# 0.86 against 0.81 for the 2 x 2 wide ones, 3000^3 0.83 (= 128 x 128 in 2 x 2). 2 x 2
# clusters of them lost everywhere (30 at once make 3 rounds of 256 tiles): the tuner's only.
# Their 2 x 1 clusters' rate 1.13 (was 1.1): at 3000^3 (3 rounds against 5 of 128 x 128 in
# 2 x 2) they were as fast or faster on an H100 (95.8 / 109.9 / 94.6 us cold / single / warm
# against 96.5 / 121.4 / 96.0) and an H200 (87.1 / 98.4 / 86.4 against 89.6 / 114.1 / 89.3,
# s11-tile192r): fitted 1.13 and 1.16.
# 5 stages (cuBLAS's depth at 2000x3000x1000, its "192x128_64x5_1x2" being ours 128 x 192
# c2) with the pipelined epilogue: one staging box per consumer and the A half of the tile's
# last stage, held until the stores have read it (Config.shared_mem). H100 (notes_gemm.md,
# s11b-stages), kernel-only vs cuBLAS against 4 stages: 2000x3000x1000 c2 0.887 / warm 0.897
# against 0.836 / 0.838; 256x11008x4096 1.08 against 1.02; 1536^3 0.79 against 0.77;
# 3000x5000x2000 c2 0.906 against 0.878; 3000^3 c2 tied (0.825). 5 stages staged through one
# box without the held stage came between the two.
_WGMMA_192_S4 = Config("wgmma", 128, 192, 64, stages=4, group_m=16, tma_store=True)
_WGMMA_192 = dataclasses.replace(_WGMMA_192_S4, stages=5, pipe_store=True)
_WGMMA_192_C2 = dataclasses.replace(_WGMMA_192, cluster_m=2, lean=16)
_WGMMA_192_C2X2 = dataclasses.replace(_WGMMA_192_S4, cluster_m=2, cluster_n=2)
# 64-row tiles of one consumer warpgroup (Config.bm = 64, kernels/gemm_wgmma.cu's
# gemm_wgmma_bm; issue 17, s11-tile64): twice as many tiles as 128-row ones of the same width,
# for grids those leave half idle: 1000^3 and 1024^3 make 128 tiles of 64 x 128 (the mirror
# of cuBLAS's at 1000^3, our 128 x 64 in 1 x 2 clusters) against 64 of 128 x 128.
# Multiply-add rate in _TILE_RATE's units, by whether rows lie at 128-byte pitches (True) or
# not: an H200's one-wave grids (notes_gemm.md, s11-tile64;
# 1024^3 6.8 us against 7.2 for 128 x 64, 1000^3 10.4-10.8 against 11.0 for 128 x 128).
# Lean 5 (descriptors by offset, the beta-free epilogue; Config.lean): H100, kernel-only
# cold, two rounds (notes_gemm.md, s12c-lean): 768^3 5.2-5.3 us against 5.8 at lean 0,
# 1024^3 6.4-6.5 against 7.4-7.6, 256x4096x4096 16.8-16.9 against 17.4-17.5.
_WGMMA_64 = Config("wgmma", 64, 128, 64, stages=8, group_m=8, tma_store=True, lean=5)
_ROWS64_RATE = {True: 0.62, False: 0.45}
# The same in 2-CTA clusters along M (session 12, s12-tile64n): each CTA loads its 64 rows of
# A and half of the pair's common 128-column B tile, multicast into both, so a CTA loads
# 16 KiB a K tile where it loaded 24. On rows that are not 128-byte multiples the L2's requests
# limit these one-wave grids: at 1000^3 the clusters cut them by a third (Nsight Compute: 0.60
# M against 0.91 M, cuBLAS 0.57 M). H100, kernel-only cold / warm (notes_gemm.md,
# s12-tile64n): 1000^3 10.8-10.9 / 10.5-10.7 us against 11.8 / 11.4 alone and 11.1 / 11.3 for
# 128 x 128 pipelined (cuBLAS 8.7); 1000x1000x4000 25.0 against 33.6 alone and 27.9 for
# 128 x 128 (cuBLAS 21.9). On 128-byte rows they lost: 1024^3 9.3 against 7.4, 768^3 8.0
# against 6.3, 256x4096x4096 20.2 against 17.5. _rows64_cluster says where the heuristic
# takes them; the tuner's candidates on split rows only. In its lean form (Config.lean = 7:
# descriptors by offset, tensor maps prefetched, no per-element beta test in the staged
# epilogue; s12b-k1000, H100 cold / warm): 1000^3 10.0 / 9.7 us against 10.6 / 10.4,
# 1000x1000x4000 24.3 / 23.8 against 24.9 / 24.3. With the cluster barrier split (lean 15,
# session 15; bit 8 removed in session 17; H100 cold, two rounds): 1000^3 9.8 / 9.8 us against
# 10.2 / 10.2 (B N x K 10.1 / 9.8 against 10.5 / 10.3), 1000x1000x4000 24.9 / 24.8 against
# 24.9 / 25.2. Without the end's barrier (lean 23, session 16): 1000^3 9.2 / 9.2 against
# 9.6 / 9.6 (B N x K 9.4 / 9.4 against 9.8 / 9.8), 1000x1000x4000 23.6 / 23.5 against
# 23.9 / 23.9.
_WGMMA_64_C2 = dataclasses.replace(_WGMMA_64, cluster_m=2, lean=23)
# Unclustered with the beta-free epilogue alone (lean 4): within 0.1-0.3 us of lean 5 at the
# three shapes above, ahead at 768^3 in one round of two; a tuner candidate beside _WGMMA_64,
# so a table tuned with it holds the faster of the two at each shape.
_WGMMA_64_LEAN4 = dataclasses.replace(_WGMMA_64, lean=4)
# 192-row tiles (issue 17, s11-tile192r; kernels/gemm_wgmma.cu gemm_wgmma_bm: 3 consumer
# warpgroups): cuBLAS's 192 x 192 at 3000^3 (256 tiles, 1.94 waves; 2-CTA clusters along M,
# B multicast) and 192 x 128. (cuBLAS's "192x128" at 2000x3000x1000 is ours 128 x 192: for
# row-major C it computes C^T, its M being our N.) 4 stages of 192 x 192 and 5 of 192 x 128
# fit shared memory with one TMA-store staging box a slab (s11b-stages; 3 and 4 stages with
# two boxes before). H100 (notes_gemm.md, session 12): 3000^3 192 x 192 s4 in 2 x 1 clusters
# 0.937 / warm 1.03 of cuBLAS against 0.825 / 0.91 for 128 x 192 c2 (rate 1.28 below);
# 1536^3 192 x 128 s5 0.797 against 0.767 with 4 stages.
_WGMMA_T192 = Config("wgmma", 192, 192, 64, stages=4, group_m=8, tma_store=True)
_WGMMA_T192_C2 = dataclasses.replace(_WGMMA_T192, cluster_m=2, lean=23)  # (_WGMMA[6]'s comment)
_WGMMA_T192N128 = Config("wgmma", 192, 128, 64, stages=5, group_m=8, tma_store=True)
_WGMMA_T192N128_C2 = dataclasses.replace(_WGMMA_T192N128, cluster_m=2, lean=16)
_TALL = (_WGMMA_T192, _WGMMA_T192_C2, _WGMMA_T192N128, _WGMMA_T192N128_C2)
# 96- and 80-wide tiles (issue 17, s13-narrow; Config.narrow: N-major B and C's staging in
# 32- / 16-wide boxes with the 64- / 32-byte swizzle): for mid squares whose 128- and 192-wide
# tiles fill a wave badly (1536^3: 128 tiles of 192 x 96 against 96 of 192 x 128; 768^3: 96
# of 64 x 96 or 120 of 64 x 80 against 72 of 64 x 128). 5 stages of 192 x 96, 10 of 64 x 96
# and 11 of 64 x 80 fit 227 KiB beside C's staging. H100, kernel-only cold, row-major
# operands (N-major B), two rounds (notes_gemm.md, s13-narrow): 1536^3 192 x 96 15.5-15.7 us
# against 15.2 for 192 x 128 (cuBLAS 12.1), in 1 x 2 clusters 16.0; 768^3 64 x 96 6.1-6.2
# against 5.7, 64 x 80 8.3-8.5; 640^3 64 x 96 5.0 against 5.2 (the one win); 1280^3 192 x 96
# 12.7 against 11.0 (128 x 128); 384x2048x1024 64 x 96 8.1 against 6.2. Their N-major B boxes
# of 64- or 32-byte rows take 1.7-1.8x (4x) the L2 requests of 128-byte ones (Nsight
# Compute), which the fuller wave does not pay back: the heuristic does not take them; the
# tuner times them on one-wave-ish grids (64 x 80 with a K-major B only, whose boxes keep
# 128-byte rows: untimed).
_WGMMA_T192N96 = Config("wgmma", 192, 96, 64, stages=5, group_m=8, tma_store=True)
_WGMMA_T192N96_C2 = dataclasses.replace(_WGMMA_T192N96, cluster_m=2, lean=16)
_WGMMA_64N96 = Config("wgmma", 64, 96, 64, stages=10, group_m=8, tma_store=True, lean=5)
_WGMMA_64N80 = Config("wgmma", 64, 80, 64, stages=11, group_m=8, tma_store=True, lean=5)
_NARROW = (_WGMMA_T192N96, _WGMMA_T192N96_C2, _WGMMA_64N96, _WGMMA_64N80)
# The same tiles on C^T = B^T A^T (issue 17, s13-ct; Config.swap, kernels/gemm_wgmma.cu's
# gemm_wgmma_t): cuBLAS's own ("192x96" at 1536^3, "64x80" at 640^3 and 768^3 are bn = 96 / 80
# of C's rows by bm of its columns), whose operands stay in 128-byte box rows with a row-major
# A (A^T is the kernel's K-major B: boxes of any row count) and any B.
# H100, kernel-only cold, row-major operands, two rounds (notes_gemm.md, session 13 lead):
# 1536^3 192 x 96 swapped 13.1 / 13.0 us against 15.6 / 15.6 for 192 x 128 (x0.94 of cuBLAS
# against x0.79; warm and single call the same way); 640^3 64 x 80 / 64 x 96 swapped x0.97-0.98
# against x0.92 for 64 x 128 lean5; 768^3 64 x 96 swapped x0.89 / x0.885 against x0.88 (a
# tie); lost at 1280^3 (x0.80 against x0.83 for 128 x 128), 1000^3 (64 x 128 swapped x0.78
# against x0.85) and, clustered, at 1536^3 (x0.80-0.81). The heuristic takes 192 x 96 swapped
# where _swapped_for says; the tuner times all four on one-wave-ish grids.
_SWAPPED = tuple(dataclasses.replace(c, swap=True) for c in _NARROW)
_WGMMA_T192N96_T = dataclasses.replace(_WGMMA_T192N96, swap=True)
_WGMMA_64N80_T = dataclasses.replace(_WGMMA_64N80, swap=True)
_WGMMA_64N96_T = dataclasses.replace(_WGMMA_64N96, swap=True)
# Whether the tuner times them (as the narrow tiles, on one-wave-ish grids): on since their
# GPU tests and memcheck / racecheck / synccheck passed (H100, session 13).
SWAPPED_CANDIDATES = True
_CLUSTER_RATE_PITCH16 = {_WGMMA[6]: 1.2, _WGMMA_C2X2: 1.33, _WGMMA_MID_C2X2: 1.25,
                         _WGMMA_192_C2: 1.13, _WGMMA_T192_C2: 1.28}
_CLUSTERS_PER_132_SMS = {2: 66, 4: 30}
# The plain 16-bit tiles with the pipelined TMA-store epilogue (Config.pipe_store). Where K is
# short (at most 16 K tiles per tile) the epilogue weighs most: on an H100 (session 9)
# 8192x8192x512 ran in 123.5-124.6 us against 125.5-135.6, 1000^3 in 11.2-11.3 against 11.6-11.7;
# elsewhere within the spread.
_PIPE_STORE = {c: dataclasses.replace(c, pipe_store=True) for c in (_WGMMA[4], _WGMMA[5])}
# Ping-pong consumers with that epilogue (Config.pingpong + pipe_store, kernels/gemm_wgmma_x.cu):
# each consumer warpgroup takes whole 128 x 128 tiles in turn and stages a whole tile (so 5
# stages fit), so one's epilogue runs under the other's MMAs. It needs short K and several
# tiles per consumer: on an H100 (notes_gemm.md, session 10 s10-shortk) 8192x8192x512 bf16 ran
# in 117.9-118.9 us kernel-only (warm 117.4-117.7) against 124.7-135.6 (124.5-132.6) for the
# 128 x 256 pipelined tiles, cuBLAS 113-123 (119); 4096x4096x1024 (8 tiles per CTA) tied,
# 4096^3 lost (207-221 against 180-191), 1000^3 and 1024^3 (one tile per CTA) lost.
_PINGPONG = Config("wgmma", 128, 128, 64, stages=5, group_m=8, tma_store=True, pingpong=True,
                   pipe_store=True)
# TF32 on wgmma (kernels/gemm_wgmma_tf32.cu): 128-byte rows of 32 fp32; 4 stages of 128 x 256
# and 6 of 128 x 128 fill shared memory together with the TMA-store staging (16 KiB x 2).
# On an H200 (notes_gemm.md, TF32): [0] 0.98-1.0 of cuBLAS at 4096^3 with a K-major B; [3]
# (plain stores) up to 7% faster than [0] when the output is stored transposed (N-major B);
# [1] where the wide tiles leave most SMs idle (1000^3: 1.00 against 0.57).
_WGMMA_TF32 = (
    Config("wgmma", 128, 256, 32, stages=4, group_m=8, tma_store=True),
    Config("wgmma", 128, 128, 32, stages=6, group_m=8, tma_store=True),
    Config("wgmma", 128, 256, 32, stages=4, group_m=16, tma_store=True),
    Config("wgmma", 128, 256, 32, stages=4, group_m=8),
    Config("wgmma", 128, 64, 32, stages=8, group_m=8, tma_store=True),
)


def disabled_kernels() -> frozenset[str]:
    """Kernel families and features turned off with ``GPURT_GEMM_DISABLE`` (comma list of
    simt, mma, wgmma, cluster, tma_store, pack: kernels/_gemm_pack.py's copies, and rows:
    kernels/_gemm_rows.py's cut along M), for
    debugging and for comparing paths; gemm then uses the others."""
    text = os.environ.get("GPURT_GEMM_DISABLE", "")
    return frozenset(part.strip() for part in text.split(",") if part.strip())


_INT32_MAX = 2**31 - 1
_MAX_SPLIT = 65535  # gridDim.z


def why_not(problem: Problem, config: Config) -> str | None:
    """Why ``config`` cannot run ``problem`` on its device (the requirement it misses), or
    None when it can."""
    disabled = disabled_kernels()
    if disabled and (config.kernel in disabled or (config.cluster > 1 and "cluster" in disabled)
                     or (config.tma_store and "tma_store" in disabled)):
        return f"it is turned off by GPURT_GEMM_DISABLE={','.join(sorted(disabled))}"
    major, minor = problem.capability
    dt = _DT_NAMES[problem.dt]
    if config.kernel == "simt" and problem.dt != DT_F32:
        return f"the simt kernel computes exact float32, not {dt}"
    if config.kernel == "mma":
        if problem.dt == DT_F32:
            return ("the mma kernel needs float16/bfloat16 or TF32 (allow_tf32=True), "
                    "not exact float32")
        if major < 8:
            return f"the mma kernel needs sm_80 or newer, not sm_{major}{minor}"
        if (config.bk == 16) != (problem.dt == DT_TF32):
            meant = "TF32" if config.bk == 16 else "16-bit types"
            return f"mma tiles with bk={config.bk} are for {meant}, not {dt}"
    if config.kernel == "wgmma":
        if problem.dt not in (DT_F16, DT_BF16, DT_TF32):
            return f"the wgmma kernel takes float16/bfloat16 or TF32 (allow_tf32=True), not {dt}"
        if (config.bk == 32) != (problem.dt == DT_TF32):
            meant = "TF32" if config.bk == 32 else "16-bit types"
            return f"wgmma tiles with bk={config.bk} are for {meant}, not {dt}"
        if problem.dt == DT_TF32 and not (problem.a_kmajor or problem.b_kmajor):
            return ("the TF32 wgmma kernel needs one operand K-major (wgmma reads TF32 from "
                    "shared memory only K-major); here A is M-major and B N-major")
        if (major, minor) != (9, 0):
            return f"the wgmma kernel needs sm_90 (Hopper), not sm_{major}{minor}"
        if not problem.tma:
            return ("the wgmma kernel loads with TMA, which needs every operand's base address "
                    "16-byte aligned and its row pitch a multiple of 16 bytes")
        if problem.k < 1:
            return "the wgmma kernel needs K >= 1"
    if config.kernel == "decode":
        reason = _decode.why_not(problem, config)
        if reason is not None:
            return reason
    if config.kernel == "rowload":
        reason = _rowload.why_not(problem, config)
        if reason is not None:
            return reason
    if config.kernel == "skinny":
        if problem.dt not in (DT_F16, DT_BF16):
            return f"the skinny kernel takes float16/bfloat16, not {dt}"
        if not _skinny.runs_on(config, problem.capability):
            return (f"the skinny kernel needs sm_80 or newer, and sm_90 for split_k > 1 "
                    f"(clusters), not sm_{major}{minor}")
    itemsize = 4 if problem.dt in (DT_F32, DT_TF32) else 2
    smem = config.shared_mem(problem.a_kmajor, problem.b_kmajor, itemsize)
    if smem > problem.max_shared:
        return (f"it needs {smem} bytes of shared memory per block; the device has "
                f"{problem.max_shared}")
    if max(problem.m, problem.n, problem.k) > _INT32_MAX:
        return f"M, N and K must each be below 2**31, got {problem.m}x{problem.n}x{problem.k}"
    if config.tiles(problem.m, problem.n) > _INT32_MAX:
        return f"{config.tiles(problem.m, problem.n)} tiles exceed the grid's limit of 2**31 - 1"
    if config.split_k > _MAX_SPLIT:
        return f"split_k={config.split_k} exceeds the grid's limit of {_MAX_SPLIT}"
    return None


def eligible(problem: Problem, config: Config) -> bool:
    """Whether ``config`` can run ``problem`` on its device."""
    return why_not(problem, config) is None


def _wave_split(problem: Problem, config: Config) -> int:
    """For a 16-bit wgmma grid of few tiles that fill under 90% of their waves of one CTA per
    SM: the smallest K split whose (tile, slice) items fill at least 90%, else the largest
    allowed (1 = no split). Allowed: slices at least 4 K tiles deep, and fp32 partial sums of
    at most a quarter of B's bytes (their second pass costs more than the split gains beyond
    that: an H200 measured 14336 x 4096 weights at M = 128 slower with 7 slices than with 3)."""
    if problem.m == 0 or problem.n == 0 or problem.k == 0:
        return 1
    sms = problem.sm_count
    tiles = config.tiles(problem.m, problem.n)
    k_tiles = -(-problem.k // config.bk)
    most = min(16, k_tiles // 4, problem.k // (8 * problem.m))  # s M N 4 bytes <= N K 2 / 4

    def filled(items: int) -> bool:
        return items >= 0.9 * -(-items // sms) * sms

    if tiles > 2 * sms or filled(tiles) or most < 2:
        return 1
    for split in range(2, most + 1):
        if filled(tiles * split):
            return split
    return most


def _with_split(problem: Problem, base: tuple[Config, ...]) -> list[Config]:
    out = []
    for config in base:
        if config.kernel == "simt":
            split = simt_model.split_for(problem, config)
        else:
            split = _split_for(problem, config) if config.kernel != "wgmma" else 1
        out.append(dataclasses.replace(config, split_k=split))
    return out


def _simt_heuristic(problem: Problem) -> Config:
    """The simt config (with its split) of the lowest modelled time; ties keep the earlier.
    The 32 x 128 tile only for M <= 32, where session 9 measured it."""
    best, best_cost = _SIMT[6], float("inf")
    for base in _SIMT:
        if not eligible(problem, base):  # a ring too large for the GPU (sm_75: 64 KiB)
            continue
        if base == _SIMT[7] and problem.m > 32:
            continue
        split = simt_model.split_for(problem, base)
        cost = simt_model.grid_cost(problem, base, split)
        if cost < best_cost * 0.99:
            best, best_cost = dataclasses.replace(base, split_k=split), cost
    return best


def candidates(problem: Problem) -> list[Config]:
    """Every config worth timing for ``problem``, best guess first. The cluster variants only
    where rows split L2 lines (not ``pitch128``): elsewhere they lost on every shape measured
    (benchmarks/notes_gemm.md); pass one as ``config=`` to use it."""
    if problem.dt == DT_F32:
        pool = _with_split(problem, _SIMT)
        pool += [_rowload_config(t) for t in _rowload.candidates(problem)]
    elif problem.dt == DT_TF32:
        pool = list(_WGMMA_TF32) + _with_split(problem, (*_TF32, _TF32_SMALL))
        pool += [_decode_config(t) for t in _decode.candidates(problem)]
        if problem.m <= 16:
            pool.append(dataclasses.replace(_TF32_THIN, split_k=_thin_split(problem)))
        pool += [_rowload_config(t) for t in _rowload.candidates(problem)]
    else:
        pool = [c for c in _WGMMA if c.cluster_m == 1] + [*_PIPE_STORE.values(), _PINGPONG]
        pool += [_WGMMA_192, _WGMMA_192_S4, _WGMMA_T192, _WGMMA_T192N128]
        if _WGMMA[5].tiles(problem.m, problem.n) < problem.sm_count:  # SMs without a 128-row tile
            pool += [_WGMMA_64, _WGMMA_64_LEAN4] + ([] if problem.pitch128 else [_WGMMA_64_C2])
        if _WGMMA[5].tiles(problem.m, problem.n) < 2 * problem.sm_count:  # one-wave-ish grids
            pool += [c for c in _NARROW if (c.cluster_m == 1 or not problem.pitch128)
                     and (problem.b_kmajor or c.box_width >= 32)]
            pool += [c for c in _SWAPPED if SWAPPED_CANDIDATES
                     and (c.cluster_m == 1 or not problem.pitch128)
                     and (problem.a_kmajor or c.box_width >= 32)]
        pool += _with_split(problem, (*_MMA, _MMA_SMALL))
        if not problem.pitch128:
            pool += [*_CLUSTER_RATE_PITCH16, _WGMMA_192_C2X2, _WGMMA_T192N128_C2]
        pool += _wgmma_splits(problem)
        pool += [_skinny_config(t) for t in _skinny.candidates(problem)]
        pool += [_decode_config(t) for t in _decode.candidates(problem)]
        pool += [_rowload_config(t) for t in _rowload.candidates(problem)]
    found = [c for c in pool if eligible(problem, c)]
    first = heuristic(problem)
    return [first] + [c for c in found if c != first]


def _narrow_split(problem: Problem) -> int:
    """4 (slices of K for 128 x 64 wgmma tiles) where every (tile, slice) item gets an SM of
    its own, each slice is at least 16 K tiles deep and rows lie at 128-byte pitches; else 1.
    A split-K tile's ending (its last CTA sums the slices) grows with the tile and the slice
    count: on an H100, 128 x 64 split 4 ran 128x128x4096 in 12.3 us, 256x256x8192 in 16.3 and
    512x512x8192 in 18.4, against 18.5 / 23.5 / 31.2 for 128 x 128 split 4 / 4 / 2, and 2 or
    8+ slices of 128 x 64 were slower at each (notes_gemm.md, s8-splitk2). Fewer slices on
    more tiles were not timed."""
    if not problem.pitch128:  # 128 x 64 tiles lose most there (_TILE_RATE_PITCH16)
        return 1
    tiles = _WGMMA[7].tiles(problem.m, problem.n)
    k_tiles = -(-problem.k // _WGMMA[7].bk)
    fits = tiles * 4 <= problem.sm_count and k_tiles >= 4 * 16
    return 4 if fits and eligible(problem, _WGMMA[7]) else 1


def _wgmma_splits(problem: Problem) -> list[Config]:
    """Split-K variants of the 16-bit wgmma tiles for grids of few tiles (decode shapes)."""
    found = []
    narrow = _narrow_split(problem)
    if narrow > 1:
        found.append(dataclasses.replace(_WGMMA[7], split_k=narrow))
    for base in (_WGMMA[1], _WGMMA[0]):
        split = _wave_split(problem, base)
        if split > 1:
            found.append(dataclasses.replace(base, split_k=split))
    return found


def all_configs(problem: Problem) -> list[Config]:
    """Every config gemm could be forced to run ``problem`` with (all families, the 2-CTA
    cluster variants included, without and with split-K), each once: what the property tests
    and the sanitizer sweep run."""
    found: list[Config] = []
    skinny = [_skinny_config(t) for t in _skinny.candidates(problem)]
    decode = [_decode_config(t) for t in _decode.candidates(problem)]
    rowload_tiles = _rowload.candidates(problem)[:1]
    chosen = _rowload.heuristic(problem)  # fp32's two warp loads are not the first candidate
    if chosen is not None and chosen not in rowload_tiles:
        rowload_tiles.append(chosen)
    rowload = [_rowload_config(t) for t in rowload_tiles]
    for config in (*_SIMT, *_MMA, _MMA_SMALL, *_TF32, _TF32_SMALL, _TF32_THIN, *_WGMMA,
                   _WGMMA_192, _WGMMA_192_S4, _WGMMA_192_C2X2, _WGMMA_64, _WGMMA_64_C2,
                   _WGMMA_64_LEAN4, *_TALL, *_NARROW, *_SWAPPED,
                   *_CLUSTER_RATE_PITCH16,
                   *_PIPE_STORE.values(), _PINGPONG, *_WGMMA_TF32, *skinny, *decode, *rowload):
        if config.kernel == "wgmma" and config in (*_WGMMA[:2], _WGMMA[7]):  # split-K: plain
            splits = {1, max(2, _wave_split(problem, config))}  # stores (128 x 64: tmaC unsplit)
        elif config.kernel == "decode":
            splits = {config.split_k}  # its candidates carry their split
        elif config.kernel == "rowload":
            splits = {1, config.split_k}  # its candidate carries its split
        elif config.kernel in ("wgmma", "skinny"):
            splits = {1}
        else:
            rule = simt_model.split_for if config.kernel == "simt" else _split_for
            splits = {1, max(2, rule(problem, config))}
        for split in sorted(splits):
            variant = dataclasses.replace(config, split_k=split)
            if variant not in found and eligible(problem, variant):
                found.append(variant)
    return found


def _skinny_config(tiles: _skinny.Tiles) -> Config:
    return Config("skinny", tiles.bm, 64, tiles.bk, split_k=tiles.split)


def _rowload_config(tiles: tuple[int, int, int, int]) -> Config:
    bm, bn, bk, split = tiles
    return Config("rowload", bm, bn, bk, split_k=split)


# TF32 problems whose small side is at most this take the decode family's tiling; up to
# _decode.SMALL_MAX where it takes 64-row tiles (few weight rows). An H100, kernel-only
# against cuBLAS TF32 (notes_gemm.md, session 9 s9-tf32m): M = 1..64 x 4096 / 11008 weights
# 0.96-1.25 (before: 0.45-1.16); M = 128 x 4096 rows 64 x 128 split 2 0.93-1.10 against
# wgmma's 0.89-0.98, but x 11008 rows 128 x 128 tiles 1.00 against wgmma's 1.02-1.03.
TF32_DECODE_MAX = 64


def _tf32_decode(problem: Problem) -> Config | None:
    """The decode tiling for a TF32 problem (see TF32_DECODE_MAX) where the family takes it
    (a K-major small operand, TMA rows); else None."""
    tiles = _decode.heuristic(problem)
    if tiles is None or (min(problem.m, problem.n) > TF32_DECODE_MAX and tiles.bm != 64):
        return None
    config = _decode_config(tiles)
    return config if eligible(problem, config) else None


def _decode_config(tiles: _decode.Tiles) -> Config:
    return Config("decode", tiles.bm, tiles.bn, tiles.bk, stages=tiles.stages,
                  split_k=tiles.split)


def _thin_split(problem: Problem) -> int:
    """K slices for _TF32_THIN: about 2 CTAs per SM, slices at least 512 deep."""
    tiles = max(1, _TF32_THIN.tiles(problem.m, problem.n))
    return max(1, min(2 * problem.sm_count // tiles, problem.k // 512, 32))


def _small(problem: Problem) -> bool:
    """Whether a 16-bit or TF32 problem is small enough for the latency-bound 32 x 32 mma
    tiles (_MMA_SMALL, _TF32_SMALL): every side at most 512 and at most 2^25 multiply-adds
    (TF32: K at most 384), aligned rows or not. Beyond that the wgmma kernel (on copies of rows
    it cannot read: kernels/_gemm_pack.py) won on an H100: 509^3 fp16 1.25 of cuBLAS against
    1.06, 512^3 0.72 against 0.58; TF32 at K = 450-512 0.72-1.01 against 0.62-0.70
    (benchmarks/notes_gemm.md, s9-small)."""
    if max(problem.m, problem.n, problem.k) > 512 or problem.macs > 1 << 25:
        return False
    return problem.dt != DT_TF32 or problem.k <= 384


def heuristic(problem: Problem) -> Config:
    """The config to use without timing anything."""
    m, n = problem.m, problem.n
    rowload = _rowload.heuristic(problem)
    if problem.dt == DT_F32:  # the rowload kernel for a few rows of A times split rows of B
        if rowload is not None and eligible(problem, _rowload_config(rowload)):
            return _rowload_config(rowload)
        return _simt_heuristic(problem)
    if problem.dt == DT_TF32:
        if _small(problem) and eligible(problem, _TF32_SMALL):
            return _TF32_SMALL
        # exact fp32 rows streamed for a few rows of A times split rows of B: faster than the
        # TF32 tiles' 4-byte copies of them (an H100, session 19)
        if rowload is not None and eligible(problem, _rowload_config(rowload)):
            return _rowload_config(rowload)
        tf32_decode = _tf32_decode(problem)
        if tf32_decode is not None:
            return tf32_decode
        wide = _WGMMA_TF32[0] if problem.b_kmajor else _WGMMA_TF32[3]
        wide = _fill_best(problem, [wide, _WGMMA_TF32[1], _WGMMA_TF32[4]],
                          lambda config: _tf32_tiles(problem, config))
        # the TF32 mma path runs at a third of cuBLAS: wgmma even on few tiles, unless one
        # side of C is too thin for its 128-row tiles (16 x 4096^2: split-K mma 0.69 vs 0.54)
        if eligible(problem, wide) and (min(m, n) >= 64 or
                                        not _small_grid(problem, _tf32_tiles(problem, wide))):
            return wide
        if m <= 16 and eligible(problem, _TF32_THIN):
            return dataclasses.replace(_TF32_THIN, split_k=_thin_split(problem))
        base = _TF32[0] if m * n >= 128 * 128 * problem.sm_count // 2 else _TF32[1]
        return dataclasses.replace(base, split_k=_split_for(problem, base))
    decode = _decode.heuristic(problem)
    if decode is not None and eligible(problem, _decode_config(decode)):
        return _decode_config(decode)
    # a few rows of A times an N-major B on rows TMA cannot read: streamed with aligned loads
    # (kernels/gemm_rowload.cu; notes_gemm.md, session 9 s9-rowload)
    if rowload is not None and eligible(problem, _rowload_config(rowload)):
        return _rowload_config(rowload)
    tiles = _skinny.heuristic(problem)
    # on rows that are not 16-byte multiples both stream the big operand with narrow loads,
    # and split-K mma does it faster: 37-43 us against 42-51 for M = 1..16 x 4099 x 4099 bf16
    # (an H100, notes_gemm.md, session 8 padc)
    if tiles is not None and problem.vec and eligible(problem, _skinny_config(tiles)):
        return _skinny_config(tiles)
    if _small(problem) and eligible(problem, _MMA_SMALL):
        return _MMA_SMALL
    wide = _WGMMA[4] if n > 128 else _WGMMA[5]  # the TMA-store epilogue: fastest measured
    if eligible(problem, wide):
        filled = _swapped_for(problem, _tall_for(problem, _fill_best(
            problem, [wide, _WGMMA_192, _WGMMA[5], _WGMMA[7], _WGMMA_64],
            lambda config: config.tiles(m, n),
            _TILE_RATE if problem.pitch128 else _TILE_RATE_PITCH16)))
        if wide.tiles(m, n) * 2 >= problem.sm_count:
            clustered = _short_k_store(problem, _split_row_cluster(problem, filled))
            return _tall_split_rows(problem, clustered)
        # few tiles (decode shapes, M = 32..128): split K (H200: 0.6-0.93 of cuBLAS where
        # the mma split-K path gave 0.28-0.68) on a long K, else the tiles that fill the grid
        # best (1024^3: 128 x 64 0.82 of cuBLAS, 128 x 128 0.61, split-K 0.34-0.40); a split
        # on 128 x 64 tiles where they allow one (H100: 1.5-1.7x faster than 128 x 128)
        split = _wave_split(problem, _WGMMA[1])
        if split == 1:
            stored = _short_k_store(problem, filled)
            return _rows64_cluster(problem, _swapped64_for(problem, stored))
        if filled is _WGMMA_64 and _WGMMA_64.tiles(m, n) * 10 >= problem.sm_count * 9:
            # one full wave unsplit (H200, 256x4096x4096: 15.5 us, split 20.9)
            return _rows64_cluster(problem, filled)
        thin = _decode.few_tiles(problem)  # thin decode tiles, K split over clusters of 8
        if thin is not None and eligible(problem, _decode_config(thin)):
            return _decode_config(thin)
        narrow = _narrow_split(problem)
        if narrow > 1:
            return dataclasses.replace(_WGMMA[7], split_k=narrow)
        return dataclasses.replace(_WGMMA[1], split_k=split)
    few_rows = _few_rows_on_split_rows(problem)
    if few_rows is not None:
        return few_rows
    big = _MMA[0] if m * n >= 128 * 128 * problem.sm_count // 2 else _MMA[3]
    return dataclasses.replace(big, split_k=_split_for(problem, big))


def _few_rows_on_split_rows(problem: Problem) -> Config | None:
    """For M <= 16 rows of a row-major A times a row-major B on rows no vector load reads
    whole (the layout timed; M <= 4 takes the rowload kernel first), where the tiles leave
    room for a split: the 32 x 32 x 64 mma tile, K split to about 4 CTAs per SM in slices of
    1024 at least; else None (unsplit grids were not timed). H100, 16 x 4099^2 (notes_gemm.md,
    s10-dec): 30.4-30.5 us at split 4 against 38.5-39.0 for 64 x 64 split 9 (1.07 of cuBLAS
    in fp16, 1.28 in bf16), split 8 31.2, the 16 x 64 tile split 9 35.1-35.4."""
    if (problem.vec or problem.m > 16 or problem.b_kmajor or not problem.a_kmajor
            or not eligible(problem, _MMA_SMALL)):  # x @ w on row-major operands only
        return None
    tiles = _MMA_SMALL.tiles(problem.m, problem.n)
    split = min(4 * problem.sm_count // tiles, problem.k // 1024, 8)
    return dataclasses.replace(_MMA_SMALL, split_k=split) if split > 1 else None


def _split_row_cluster(problem: Problem, filled: Config) -> Config:
    """``filled``, or on rows that are not 128-byte multiples the cluster config whose grid
    should finish first by _fill_best's wave model, with the clusters' rates and blocks of
    tiles (fewer clusters of 4 run at once: 2000^3's 32 blocks take two waves, where 64 pairs
    take one; 4000^3's 128 blocks five, where 256 pairs take four)."""
    if problem.pitch128:
        return filled
    m, n = problem.m, problem.n
    best = filled
    best_cost = _wave_cost(problem, filled, filled.tiles(m, n), _TILE_RATE_PITCH16)
    for config, rate in _CLUSTER_RATE_PITCH16.items():
        if not eligible(problem, config):
            continue
        rounds = -(-config.blocks(m, n) // _clusters_at_once(problem, config))
        cost = rounds * config.bm * config.bn / 128 / rate
        if cost < best_cost:
            best, best_cost = config, cost
    return best


def _rows64_cluster(problem: Problem, config: Config) -> Config:
    """``config``, or where it is the 64-row tile (_WGMMA_64) on rows that are not 128-byte
    multiples the same tile in 2-CTA clusters along M (_WGMMA_64_C2: B multicast, a third
    fewer bytes loaded per CTA) where its tiles fill at least 90% of the SMs (the L2's requests
    are the limit there) and the pairs run at once as one wave. H100: 1000^3 10.9 us against
    11.8, 1000x1000x4000 25.0 against 33.6 (128 CTAs each); on 128-byte rows, where the L2 is
    not the limit, they lost at every shape timed (1024^3 9.3 against 7.4), so smaller grids
    (untimed) keep the plain tile."""
    if config != _WGMMA_64 or problem.pitch128 or not eligible(problem, _WGMMA_64_C2):
        return config
    m, n = problem.m, problem.n
    full = _WGMMA_64.tiles(m, n) * 10 >= problem.sm_count * 9
    one_wave = _WGMMA_64_C2.blocks(m, n) <= _clusters_at_once(problem, _WGMMA_64_C2)
    return _WGMMA_64_C2 if full and one_wave else config


def _clusters_at_once(problem: Problem, config: Config) -> int:
    """How many of ``config``'s clusters run at once (_CLUSTERS_PER_132_SMS, scaled)."""
    return max(1, problem.sm_count * _CLUSTERS_PER_132_SMS[config.cluster] // 132)


def _short_k_store(problem: Problem, config: Config) -> Config:
    """``config`` with the pipelined epilogue where it is one of _PIPE_STORE's tiles and
    K <= 1024; the ping-pong tiles (_PINGPONG) instead where K <= 512 (8 K tiles) on rows of
    128-byte multiples with at least 8 of their tiles per SM (4 per consumer warpgroup), the
    ground measured to win."""
    piped = _PIPE_STORE.get(config)
    if problem.k > 1024 or piped is None or not eligible(problem, piped):
        return config
    if (problem.k <= 512 and problem.pitch128 and eligible(problem, _PINGPONG)
            and _PINGPONG.tiles(problem.m, problem.n) >= 8 * problem.sm_count):
        return _PINGPONG
    return piped


# Multiply-add rate of a wgmma CTA per tile width, relative to 128 x 256 (narrower tiles read
# more shared memory per multiply-add and spend more of their time filling and draining):
# an H200's time per wave at K = 1024 and 2000, bf16 and TF32 (benchmarks/notes_gemm.md);
# 128 x 192 (16-bit only) 0.85-0.94 from an H100's one-wave grids of both widths
# (256x11008x4096 and 1536^3, s10-tile192).
_TILE_RATE = {256: 1.0, 192: 0.9, 128: 0.84, 64: 0.6}
# The same for 16-bit operands whose rows are not 128-byte multiples (each 128-byte box row
# spans two L2 lines): 128 x 64 tiles load the most per multiply-add and lose the most. At
# 1000^3 they took 1.17x (H100) and 1.07x (H200) the time of 128 x 128 ones, one wave each,
# against 0.78x at 1024^3 (notes_gemm.md, session 7).
_TILE_RATE_PITCH16 = {256: 1.0, 192: 0.9, 128: 0.84, 64: 0.38}


def _wave_cost(problem: Problem, config: Config, tiles: int, rates: dict[int, float]) -> float:
    """The wave model's time of a persistent wgmma grid of ``tiles``: each SM runs ceil(tiles /
    SMs) tiles one after another, each taking its multiply-adds over its rate (``rates`` per
    width of 128-row tiles, _ROWS64_RATE for 64-row ones), in units of a 128 x 1 tile."""
    rate = _ROWS64_RATE[problem.pitch128] if config.bm == 64 else rates[config.bn]
    return -(-tiles // problem.sm_count) * config.bm * config.bn / 128 / rate


def _fill_best(problem: Problem, configs: list[Config], tiles: Callable[[Config], int],
               rates: dict[int, float] = _TILE_RATE) -> Config:
    """Of wgmma configs (widest first), the one whose persistent grid should finish first by
    the wave model (_wave_cost). A grid of 1.1 waves costs as much as one of 2, so narrower
    tiles win where they fill the last wave (1024^2: 64 tiles of 128 x 128 leave half of 132
    SMs idle, 128 of 128 x 64 fill them). Ties keep the earlier config; the first is returned
    when none is eligible. ``rates``: the multiply-add rate per width of 128-row tiles."""
    best, best_cost = configs[0], float("inf")
    for config in configs:
        if not eligible(problem, config):
            continue
        cost = _wave_cost(problem, config, tiles(config), rates)
        if cost < best_cost:
            best, best_cost = config, cost
    return best


def _tall_for(problem: Problem, config: Config) -> Config:
    """192 x 128 tiles (_WGMMA_T192N128) instead of ``config`` where it is 128 x 192 on rows of
    128-byte multiples with K > 1024 and they make no more waves: the same work and loads per
    tile, spread over three consumer warpgroups with one 128-wide epilogue pass each (128 x 192:
    two, each with a 128- and a 64-wide pass). An H200 (notes_gemm.md, s11-tile192r), 1536^3,
    96 tiles either way: 16.3 / 25.9 / 15.8 us cold / single / warm against 17.4 / 26.8 / 15.9.
    Against 128 x 256 they lost (4096^3: 6 waves against 4, 228 against 187 us; 2048x8192x8192
    455 against 402), and at K <= 1024 the 128-row tiles have the short-K epilogues
    (_short_k_store); on split rows they were not timed unclustered, and lost in 2 x 1
    clusters. 192 x 192 takes split rows in 2 x 1 clusters (_split_row_cluster), not here."""
    tall = _WGMMA_T192N128
    if (config != _WGMMA_192 or not problem.pitch128 or problem.k <= 1024
            or not eligible(problem, tall)):
        return config
    waves = [-(-c.tiles(problem.m, problem.n) // problem.sm_count) for c in (tall, config)]
    return tall if waves[0] <= waves[1] else config


def _swapped_for(problem: Problem, config: Config) -> Config:
    """192 x 96 tiles of C^T (_WGMMA_T192N96_T, 96 rows of C by 192 columns) instead of
    ``config`` where it is 192 x 128 (_tall_for's) on rows of 128-byte multiples with a
    row-major A and B (as timed), both grids make one wave, 192 x 128's filling at least half
    the SMs, and the swapped one has at least 5/4 as many tiles: cuBLAS's tiling at 1536^3
    (128 tiles against 96; H100 x0.94 of cuBLAS against x0.79). Other layouts, split rows and
    the 64-row tiles (768^3: a tie) were not taken."""
    if problem.b_kmajor:
        return config
    sms = problem.sm_count
    return _swap_where(problem, config, _WGMMA_T192N128, _WGMMA_T192N96_T,
                       lambda before, after: 2 * before >= sms and after <= sms
                       and 5 * before <= 4 * after)


def _tall_split_rows(problem: Problem, config: Config) -> Config:
    """192 x 128 tiles (_WGMMA_T192N128, unclustered) instead of ``config`` where it is
    128 x 192, alone or in 2 x 1 clusters, on rows that are not 128-byte multiples with
    K > 1024, and 192 x 128's grid makes one wave of no more tiles. H100, kernel-only, two
    rounds (notes_gemm.md, session 14 s14split and s14check): 768x3000x1536 x0.92 of cuBLAS
    against x0.83 for 128 x 192 c2 (K-major B x0.78-0.79 against x0.71-0.73), 768x3000x4096
    x0.96-0.98 against x0.90-0.91, 576x4000x4096 x0.88 against x0.70-0.71; where 192 x 128
    made two waves (1000x3000x2000, 1536x3000x1536, 2000^3, 1000x6000x1000) it ran at
    x0.49-0.71."""
    tall = _WGMMA_T192N128
    if (config not in (_WGMMA_192, _WGMMA_192_C2) or problem.pitch128 or problem.k <= 1024
            or not eligible(problem, tall)):
        return config
    tiles = tall.tiles(problem.m, problem.n)
    fits = tiles <= problem.sm_count and tiles <= _WGMMA_192.tiles(problem.m, problem.n)
    return tall if fits else config


def _swapped64_for(problem: Problem, config: Config) -> Config:
    """64 x 80 tiles of C^T (_WGMMA_64N80_T: 80 rows of C by 64 columns) instead of ``config`` where
    it is the 64-row tile (_WGMMA_64) on rows of 128-byte multiples of a row-major A (A^T is the
    kernel's K-major B) and the swapped grid has at least 5/4 its tiles but fills at most 4/5 of the
    SMs; where 64 x 80's grid is fuller than that, 64 x 96 tiles of C^T (_WGMMA_64N96_T) on the same
    terms and M a multiple of 96. H100, kernel-only, two rounds each, against 64 x 128 lean5
    (notes_gemm.md, session 14 s14small and s14check): 576^3 x0.96-0.97 against x0.86-0.88, 640^3
    x1.01-1.03 against x0.93-0.94 (K-major B x0.99 against x0.91), 704^3 x1.01-1.02 against x0.95
    (K-major B x1.00-1.02 against x0.91-0.93), 640x768x1024 x0.91-0.95 against x0.85-0.86,
    384x384x2048 x0.89 against x0.77, 384x1024x4096 x0.77-0.89 against x0.75-0.79, 256x1024x1024
    x0.85 against x0.82. Fuller swapped grids lost or tied (768^3, 120 tiles: x0.85-0.87 against
    x0.88; 896^3, 168: x0.72 against x0.95-0.96). 64 x 96 only where M is a multiple of 96, the
    ground where it won (H100, session 20, kernel-only cold against 64 x 128 lean5: 768^3 5.43-5.52
    us against 5.64 (x0.91-0.93 of cuBLAS against x0.89), B N x K 5.53 against 5.72, 768x768x2048
    8.05 against 8.68, 576x1024x2048 8.1 against 8.65, 1152x512x1024 5.94 against 6.34); with a
    partial last tile row it lost (512x1024x1024 6.73 against 6.32, 704x832x4096 17.2 against 14.0,
    896x640x2048 10.5 against 8.5, 448x1280x4096 15.1 against 13.3) or won little (832x704x1024 6.2
    against 6.4)."""
    sms = problem.sm_count

    def fills(before: int, after: int) -> bool:
        return 5 * after <= 4 * sms and 4 * after >= 5 * before

    swapped = _swap_where(problem, config, _WGMMA_64, _WGMMA_64N80_T, fills)
    if swapped != config or problem.m % 96:
        return swapped
    return _swap_where(problem, config, _WGMMA_64, _WGMMA_64N96_T, fills)


def _swap_where(problem: Problem, config: Config, base: Config, swapped: Config,
                wins: Callable[[int, int], bool]) -> Config:
    """``swapped`` (tiles of C^T) in place of ``config`` where it is ``base`` on rows of
    128-byte multiples of a row-major A (the ground timed) and ``wins(tiles of base, tiles of
    swapped)``; else ``config``."""
    if (config != base or not problem.pitch128 or not problem.a_kmajor
            or not eligible(problem, swapped)):
        return config
    m, n = problem.m, problem.n
    return swapped if wins(base.tiles(m, n), swapped.tiles(m, n)) else config


def _tf32_tiles(problem: Problem, config: Config) -> int:
    """Tiles of the TF32 wgmma kernel, which turns the problem around for an N-major B."""
    if problem.b_kmajor:
        return config.tiles(problem.m, problem.n)
    return config.tiles(problem.n, problem.m)


def _small_grid(problem: Problem, tiles: int) -> bool:
    """Whether an (unsplit) wgmma grid of ``tiles`` leaves over half the SMs idle on a long
    K, where a split-K mma grid does better."""
    return tiles * 2 < problem.sm_count and problem.k >= 1024
