"""Development harness for issue 17's irregular and short-K wgmma shapes (3000x5000x2000,
1000^3, 1024^3, 8192x8192x512): times the kernel variants of gemm_wgmma_x (clusters along N
that multicast A, 2 x 2 clusters, ping-pong consumers) next to the plain tiles and cuBLAS in
the same process, kernel-only (20 calls in a CUDA graph, replayed, inputs rotating past the
L2) and single call (host path included), bf16, row-major ``a @ b``; every timed result checked
against float64 on a poisoned output. ``ncu`` runs one call per variant for Nsight Compute's
L2 counters; ``check`` and ``sanitize`` run edge cases of the new variants.

    python benchmarks/wgirr_dev.py precompile | check | time [--json PATH] | ncu | sanitize

``time`` resumes from its JSON (a hung variant ends the process through a watchdog; the next
``time`` leaves it out), so a device script can run it again until it exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import grid_dev  # noqa: E402
import torch  # noqa: E402
from decode_split_dev import check  # noqa: E402

import gpurt  # noqa: E402

gm, launch, tune = grid_dev.gm, grid_dev.launch, grid_dev.tune
Config = tune.Config
W = tune._WGMMA
WIDE, MID, NARROW = W[4], W[5], W[7]  # 128 x 256 g16, 128 x 128, 128 x 64; all TMA stores


def _v(config: Config, **fields: Any) -> Config:
    return dataclasses.replace(config, **fields)


VARIANTS = {
    "wide": WIDE, "mid": MID, "narrow": NARROW, "wide c2": W[6], "mid c2": _v(MID, cluster_m=2),
    "wide c1x2": _v(WIDE, cluster_n=2), "wide c2x2": _v(WIDE, cluster_m=2, cluster_n=2),
    "mid c1x2": _v(MID, cluster_n=2), "mid c2x2": _v(MID, cluster_m=2, cluster_n=2),
    "narrow c1x2": _v(NARROW, cluster_n=2), "mid pp": _v(MID, pingpong=True),
    "narrow pp": _v(NARROW, pingpong=True), "mid pp c2": _v(MID, pingpong=True, cluster_m=2),
    "wide ps": _v(WIDE, pipe_store=True), "mid ps": _v(MID, pipe_store=True),
    "wide c2 ps": _v(W[6], pipe_store=True), "mid pp c1x2": _v(MID, pingpong=True, cluster_n=2),
    "mid pp ps": _v(MID, stages=5, pingpong=True, pipe_store=True),
    "mid pp s5": _v(MID, stages=5, pingpong=True),
    "mid pp ps g16": _v(MID, stages=5, pingpong=True, pipe_store=True, group_m=16),
    "w192": tune._WGMMA_192, "w192 c2": tune._WGMMA_192_C2,
    "w192 c2x2": tune._WGMMA_192_C2X2, "w192 g8": _v(tune._WGMMA_192, group_m=8),
    "t64": tune._WGMMA_64, "t64 s5": _v(tune._WGMMA_64, stages=5),
    "t64 plain": _v(tune._WGMMA_64, tma_store=False, stages=6),
    "t64 ps": _v(tune._WGMMA_64, pipe_store=True),
    "t64 w256": Config("wgmma", 64, 256, 64, stages=5, group_m=16, tma_store=True),
    "t64 c2": tune._WGMMA_64_C2, "t64 c2 ps": _v(tune._WGMMA_64_C2, pipe_store=True, lean=0),
    "t192": tune._WGMMA_T192, "t192 c2": tune._WGMMA_T192_C2,
    "t192x128": tune._WGMMA_T192N128, "t192x128 c2": tune._WGMMA_T192N128_C2,
    "t192 c2 g16": _v(tune._WGMMA_T192_C2, group_m=16),
    "w192 s5": _v(tune._WGMMA_192, pipe_store=False),
    "w192 c2 s5": _v(tune._WGMMA_192_C2, pipe_store=False),
    "w192 s5 ps": tune._WGMMA_192, "w192 c2 s5 ps": tune._WGMMA_192_C2,
    "w192 s4": tune._WGMMA_192_S4, "w192 c2 s4": _v(tune._WGMMA_192_S4, cluster_m=2),
    "t192 s3": _v(tune._WGMMA_T192, stages=3), "t192 s3 c2": _v(tune._WGMMA_T192_C2, stages=3),
    "t192 s4 c2": tune._WGMMA_T192_C2, "t192x128 s4": _v(tune._WGMMA_T192N128, stages=4),
    "t192x128 s5": tune._WGMMA_T192N128,
    # session 13 (s13-narrow): 96- and 80-wide tiles
    "t192n96": tune._WGMMA_T192N96, "t192n96 c2": tune._WGMMA_T192N96_C2,
    "t64n96": tune._WGMMA_64N96, "t64n80": tune._WGMMA_64N80,
    "t64n80 c2": _v(tune._WGMMA_64N80, cluster_m=2, lean=7),
    "w96": Config("wgmma", 128, 96, 64, stages=7, group_m=8, tma_store=True),
    # session 13 (s13-ct): the same tiles on C^T = B^T A^T (Config.swap; bn along C's rows)
    "t192n96 T": tune._SWAPPED[0], "t192n96 T c2": tune._SWAPPED[1],
    "t64n96 T": tune._SWAPPED[2], "t64n80 T": tune._SWAPPED[3],
    "t64n80 T s8": _v(tune._SWAPPED[3], stages=8), "t64 T": _v(tune._WGMMA_64, swap=True),
    # session 14 (prepared): the swapped 64-row tiles in 2-CTA clusters (A^T multicast)
    "t64n80 T c2": _v(tune._SWAPPED[3], cluster_m=2, lean=7),
    "t64n96 T c2": _v(tune._SWAPPED[2], cluster_m=2, lean=7),
    # session 15: cuBLAS's 1000^3 tiling (its 64 x 128 along C's columns x rows, 2-CTA clusters)
    "t64 T c2": _v(tune._WGMMA_64, swap=True, cluster_m=2, lean=7),
    # sessions 15-16 timed a split end barrier (lean bit 8) here, gone since session 17: the
    # producer's tail beat it everywhere. The end barrier whole, to time the tail against:
    "t64 c2 l7": _v(tune._WGMMA_64_C2, lean=7), "t192 c2 l7": _v(tune._WGMMA_T192_C2, lean=7),
    "w192 c2 ps l0": _v(tune._WGMMA_192_C2, lean=0), "wide c2 l0": _v(W[6], lean=0),
    # session 16: no cluster barrier at the end (lean bit 16: the producer's tail instead)
    "t64 c2 tail": _v(tune._WGMMA_64_C2, lean=23),
    "t64 T c2 tail": _v(tune._WGMMA_64, swap=True, cluster_m=2, lean=23),
    "t64n80 T c2 tail": _v(tune._SWAPPED[3], cluster_m=2, lean=23),
    "t192 c2 tail": _v(tune._WGMMA_T192_C2, lean=23),
    "w192 c2 ps tail": _v(tune._WGMMA_192_C2, lean=16),
    "wide c2 tail": _v(W[6], lean=16),
    "t64 c2 ps tail": _v(tune._WGMMA_64_C2, pipe_store=True, lean=23),
    # session 17: gemm_wgmma_x's clusters with the producer's tail (128 x 256 c2 pipelined)
    "wide c2 ps l0": _v(W[6], pipe_store=True, lean=0),
}
# Session 12 (s12b-k1000): the lean bits (Config.lean) on the tiles of one-tile-per-CTA grids
_LEAN_BASES = {"t64": tune._WGMMA_64, "t64 c2": _v(tune._WGMMA_64_C2, lean=0),
               "mid ps": VARIANTS["mid ps"], "w192 c2 s5 ps": tune._WGMMA_192_C2,
               "t64 plain": _v(tune._WGMMA_64, tma_store=False)}
VARIANTS |= {f"{name} lean{bits}": _v(config, lean=bits)
             for name, config in _LEAN_BASES.items() for bits in (1, 2, 3, 4, 5, 7)}
# Per shape, the variants timed beside "auto" (session 9: every cluster config after the
# remote-arrive fix, the ordered ping-pong where CTAs hold several tiles, no regression on the
# big squares).
SHAPES = {
    (8192, 8192, 512): ("wide", "wide ps", "mid", "wide c2", "wide c2 ps", "mid c2",
                        "wide c1x2", "mid pp", "mid pp c2"),
    (3000, 5000, 2000): ("wide", "wide ps", "mid", "wide c2", "mid c2", "wide c1x2",
                         "wide c2x2", "mid c1x2", "mid pp"),
    (1000, 1000, 1000): ("mid", "mid ps", "narrow", "mid c2", "mid c1x2", "mid c2x2",
                         "narrow c1x2", "mid pp", "narrow pp"),
    (1024, 1024, 1024): ("mid", "narrow", "mid c2", "mid c1x2", "narrow c1x2", "narrow pp"),
    (4096, 4096, 1024): ("wide", "wide ps", "wide c2", "wide c1x2", "mid pp", "mid pp c2"),
    (4096, 4096, 4096): ("wide", "wide ps", "wide c2", "wide c1x2", "mid pp"),
    (8192, 8192, 8192): ("wide ps", "wide c2", "mid pp"),
}
# Session 9's second call (`time --set split`): the cluster configs on split rows (pitches not
# 128-byte multiples; "bT": B stored N x K), where the first call found 2 x 2 and 2 x 1
# clusters ahead at 3000x5000x2000, for the chooser's thresholds; the epilogue variants again
# at 8192x8192x512. Each variant twice (" r2"), cuBLAS before each round.
_SPLIT = ("wide", "mid", "wide c2", "wide c2x2", "mid c2", "mid c2x2")
SPLIT_ROWS = {
    (3000, 5000, 2000, False): _SPLIT, (3000, 5000, 2000, True): _SPLIT,
    (2000, 3000, 1000, False): _SPLIT, (2000, 2000, 2000, False): _SPLIT,
    (1000, 5000, 2000, False): _SPLIT, (3000, 3000, 3000, False): _SPLIT,
    (4000, 4000, 4000, False): _SPLIT, (2048, 11000, 4000, True): _SPLIT,
    (1000, 1000, 1000, False): ("mid", "mid c2x2", "mid ps"),
    (8192, 8192, 512, False): ("wide", "wide ps", "mid pp", "mid pp c2", "wide c2 ps"),
}
# Session 10 (s10-shortk, `--set shortk`): ping-pong consumers with the pipelined store (a
# whole tile of staging per consumer) against the cooperative tiles at short K, each variant
# twice, cuBLAS before each round; warm (same operands) next to cold.
SHORT_K = {
    (8192, 8192, 512, False): ("wide", "wide ps", "mid ps", "mid pp", "mid pp s5", "mid pp ps",
                               "mid pp ps g16"),
    (4096, 4096, 1024, False): ("wide ps", "mid ps", "mid pp", "mid pp ps"),
    (1024, 1024, 1024, False): ("narrow", "mid ps", "narrow pp", "mid pp ps"),
    (1000, 1000, 1000, False): ("mid ps", "mid pp", "mid pp ps"),
    (4096, 4096, 4096, False): ("wide", "mid pp ps"),
}
# Session 10 (s10-tile192, `--set tile192`): the 128 x 192 tiles against the choice before
# them at the wave-quantized shapes, the shapes they may change and the big squares; warm too.
_C2X2 = ("wide c2x2", "mid c2x2", "w192", "w192 c2", "w192 c2x2")
TILE192 = {
    (2000, 3000, 1000, False): _C2X2, (3000, 3000, 3000, False): _C2X2,
    (256, 11008, 4096, False): ("wide", "w192", "w192 g8"),
    (1536, 1536, 1536, False): ("wide", "w192"),
    (3000, 5000, 2000, False): ("wide c2x2", "w192", "w192 c2x2"),
    (1000, 1000, 1000, False): ("mid ps", "narrow"), (1024, 1024, 1024, False): ("mid",),
    (4096, 4096, 1024, False): ("wide", "w192"), (4096, 4096, 4096, False): ("wide", "w192"),
    (8192, 8192, 8192, False): (),
}
# Session 11 (s11-tile64, `--set tile64`): 64-row tiles (one consumer warpgroup) where 128-row
# ones leave SMs idle, against the choice before them; warm too.
TILE64 = {
    (1000, 1000, 1000, False): ("mid ps", "narrow", "t64", "t64 s5", "t64 plain", "t64 ps"),
    (1024, 1024, 1024, False): ("narrow", "mid", "t64", "t64 s5"),
    (768, 768, 768, False): ("narrow", "t64"), (1000, 1000, 4000, False): ("mid", "t64"),
    (256, 4096, 4096, False): ("t64", "t64 w256"),
}
# Session 11 (s11-tile192r, `--set tile192r`): 192-row tiles (3 consumer warpgroups) against
# the choice before them at cuBLAS's 192-row shapes, the shapes they may change and the big
# squares; warm too. (3000^3 and 2000x3000x1000: rows of 6000 and 2000 bytes, split L2 lines.)
TILE192R = {
    (3000, 3000, 3000, False): ("t192", "t192 c2", "t192 c2 g16", "t192x128 c2", "w192 c2"),
    (2000, 3000, 1000, False): ("t192x128", "t192x128 c2", "t192 c2", "mid c2x2"),
    (4096, 4096, 4096, False): ("t192", "t192x128"),
    (8192, 8192, 8192, False): ("t192",),
    (2048, 8192, 8192, False): ("t192", "t192x128"),
    (3000, 5000, 2000, False): ("t192 c2", "t192x128 c2"),
    (1536, 1536, 1536, False): ("t192", "t192x128"),
    (256, 11008, 4096, False): ("t192x128",),
}
# Session 11b (s11b-stages, `--set stages`): 5 stages, cuBLAS's depth, against the current
# choice ("auto") at 2000x3000x1000 (cuBLAS: our 128 x 192 c2 with 5 stages) and 3000^3 first:
# "s5" stages C through one box per consumer (three waits per tile), "s5 ps" through that box
# and the last stage's A half in turn (released after the tile's stores read it); 192 x 192
# with 4 stages and 192 x 128 with 5 (one box per slab) beside them; warm too.
STAGES5 = {
    (2000, 3000, 1000, False): ("w192 c2 s5", "w192 c2 s5 ps", "w192 s5"),
    (3000, 3000, 3000, False): ("w192 c2 s5", "w192 c2 s5 ps", "t192 s4 c2", "mid c2x2"),
    (256, 11008, 4096, False): ("w192 s5", "w192 s5 ps"),
    (1536, 1536, 1536, False): ("w192", "w192 s5", "w192 s5 ps", "t192x128 s5"),
    (3000, 5000, 2000, False): ("w192 c2", "w192 c2 s5", "w192 c2 s5 ps"),
}
# Session 12 (`--set s12`): the defaults session 12 changed (5 stages of 128 x 192 with the
# pipelined epilogue, 192 x 192 with 4 stages in 2 x 1 clusters on split rows, 192 x 128 with
# 5) against the picks they replaced, at the shapes where the choice changed, timed and not.
S12 = {
    (3000, 3000, 3000, False): ("w192 c2 s4",), (4099, 4099, 4099, False): ("w192 c2 s4",),
    (3001, 3001, 3001, False): ("w192 c2 s4",), (6000, 6000, 2000, False): ("wide c2",),
    (7000, 3000, 1000, False): ("wide c2x2",), (3000, 3000, 1000, False): ("w192 c2 s4",),
    (2000, 3000, 1000, False): ("w192 c2 s4",), (1500, 1500, 1500, False): ("w192 c2 s4",),
    (1000, 3000, 5000, False): ("w192 c2 s4",), (1024, 3072, 1024, False): ("w192 s4",),
    (2304, 2304, 2304, False): ("t192x128 s4",), (512, 11008, 4096, False): ("t192x128 s4",),
    (1536, 1536, 1536, False): ("t192x128 s4",), (256, 11008, 4096, False): ("w192 s4",),
}
# Session 12 (s12-tile64n, `--set s12t64`): 64 x 128 tiles in 2-CTA clusters along M (B
# multicast) against the picks before them (64 x 128 alone, the tuner's 128 x 128 pipelined)
# and cuBLAS's own tiling (ours 128 x 64 in 1 x 2 clusters: for a row-major C cuBLAS's
# "64x128 ... 2x1" is our N x M); "auto" is the heuristic with the clusters; warm too.
# (The H100 run, benchmarks/results/gemm-dev-s12-tile64n-nvidia-h100.json, also timed 64 x 96
# tiles at 768^3, commit c9e2050, since dropped.)
_T64C = ("t64 c2", "narrow c1x2")
S12T64 = {
    (1000, 1000, 1000, False): ("t64", "mid ps", *_T64C, "t64 c2 ps"),
    (768, 768, 768, False): (*_T64C, "t64 plain"), (1024, 1024, 1024, False): _T64C,
    (1000, 1000, 4000, False): ("t64", "t64 c2", "mid"), (256, 4096, 4096, False): ("t64 c2",),
    (2000, 3000, 1000, False): (), (1536, 1536, 1536, False): (),
}
# `--set s12lean`: the lean bits (1 descriptors by offset, 2 early first copies, 4 beta-free
# staging). Session 12 (s12b-k1000, 96f0d25) timed them bit by bit with bit 8 (direct stores,
# since dropped); s12c-lean: lean 4 and 5 on the unclustered 64 x 128 tile against lean 0
# ("t64") and cuBLAS, twice each, where the heuristic takes that tile (128-byte rows) and on
# split rows (1000^3, 1000x1000x4000: "auto" is the c2 lean7 tile there).
_T64_LEAN = ("t64", "t64 lean4", "t64 lean5")
S12LEAN = {
    (768, 768, 768, False): _T64_LEAN, (1024, 1024, 1024, False): _T64_LEAN,
    (256, 4096, 4096, False): _T64_LEAN, (1000, 1000, 4000, False): _T64_LEAN,
    (1000, 1000, 1000, False): _T64_LEAN,
}
# `--set s13narrow` (s13-narrow): 96- and 80-wide tiles against the picks before them ("auto"
# is the branch's heuristic, which takes 192 x 96 at 1536^3 and 64 x 96 at 768^3 and
# 384x2048x1024) where cuBLAS runs narrow tiles (192 x 96 in 1 x 2 clusters at 1536^3, 64 x 80
# at 768^3 and 640^3), and the shapes the heuristic keeps (no regressions); twice, warm too.
S13NARROW = {
    (1536, 1536, 1536, False): ("t192x128 s5", "t192n96", "t192n96 c2"),
    (768, 768, 768, False): ("t64", "t64n96", "t64n80", "t64n80 c2"),
    (640, 640, 640, False): ("t64n96", "t64n80"),
    (1280, 1280, 1280, False): ("t192n96",),
    (1024, 1024, 1024, False): (), (256, 4096, 4096, False): (),
    (1000, 1000, 1000, False): (), (2000, 3000, 1000, False): (),
    (384, 2048, 1024, False): ("t64",),
}
# `--set s13ct` (s13-ct): cuBLAS's narrow tiles on C^T = B^T A^T (their operands in 128-byte
# box rows) against the picks ("auto") where cuBLAS runs them (192x96 in 1 x 2 clusters at
# 1536^3, 64x80 at 768^3 and 640^3) and the shapes nothing should change; twice, warm too.
S13CT = {
    (1536, 1536, 1536, False): ("t192n96 T", "t192n96 T c2", "t192n96"),
    (768, 768, 768, False): ("t64n80 T", "t64n80 T s8", "t64n96 T"),
    (640, 640, 640, False): ("t64n80 T", "t64n96 T", "t64n96"),
    (1280, 1280, 1280, False): ("t192n96 T",),
    (1000, 1000, 1000, False): ("t64 T",), (2000, 3000, 1000, False): (),
    (256, 4096, 4096, False): (),
}
# `--set s13swap` (session 13, lead): shapes the heuristic's _swapped_for re-picked (192 x 96 on
# C^T, "auto") against 192 x 128, the pick before, twice each; 1536^3 was timed in s13ct
S13SWAP = {(m, n, k, False): ("t192x128 s5",) for m, n, k in (
    (1536, 1536, 4096), (1152, 2048, 2048), (2000, 1152, 1536), (768, 3000, 1536),
    (3000, 768, 4096))}
# Prepared for session 14 (lead, session 13; untimed): `--set s14split`, split-row shapes (rows
# that are not 128-byte multiples) where 192 x 128 unclustered may beat the heuristic's
# 128 x 192 in 2-CTA clusters (768x3000x1536: x0.916 against x0.834, session 13); `--set
# s14small`, small squares and near-squares where the swapped 64 x 80 / 64 x 96 tiles may beat
# 64 x 128 lean5 (640^3: x0.97-0.98 against x0.92; 768^3 a tie)
S14SPLIT = {(m, n, k, False): ("t192x128 s5", "t192x128 c2") for m, n, k in (
    (768, 3000, 1536), (768, 3000, 4096), (1000, 3000, 2000), (1536, 3000, 1536),
    (2000, 2000, 2000), (1000, 6000, 1000))}
S14SMALL = {(m, n, k, False): ("t64n80 T", "t64n96 T") for m, n, k in (
    (512, 512, 512), (576, 576, 576), (640, 640, 640), (704, 704, 704), (640, 768, 1024),
    (768, 640, 2048), (896, 896, 896))}
# `--set s14check` (session 14, lead): shapes the session's heuristic rules re-pick and that
# were not timed (auto) against the picks before: _tall_split_rows' 192 x 128 against 128 x 192
# in 2 x 1 clusters (also with a K-major B), _swapped64_for's 64 x 80 of C^T against 64 x 128
# lean5 (and 64 x 80 of C^T on a K-major B, which the rule leaves out)
_OLD_C2 = ("w192 c2 s5 ps",)
S14CHECK = {(700, 3000, 1500, False): _OLD_C2, (700, 3000, 1500, True): _OLD_C2,
            (576, 4000, 4096, False): _OLD_C2, (768, 3000, 1536, True): _OLD_C2,
            (1500, 1500, 1500, False): _OLD_C2,
            (384, 1024, 4096, False): ("t64",), (448, 448, 448, False): ("t64",),
            (256, 1024, 1024, False): ("t64",), (384, 384, 2048, False): ("t64",),
            (640, 640, 640, True): ("t64n80 T",), (704, 704, 704, True): ("t64n80 T",)}
# Prepared for session 15 (lead, session 14; untimed): the swapped 64 x 80 / 64 x 96 tiles in
# 2-CTA clusters along the kernel's M (C's columns; A^T multicast, as cuBLAS's 768^3 tile runs
# in clusters) on the fuller grids where unclustered they tied or lost (768^3, 896^3), at
# 1000^3 and 1024^3 (the one-wave 64 x 128 shapes) and at 640^3 (the rule's ground)
S15C2 = {(m, n, k, False): ("t64n80 T", "t64n80 T c2", "t64n96 T c2", "t64 T", "t64 T c2")
         for m, n, k in ((640, 640, 640), (768, 768, 768), (896, 896, 896), (1000, 1000, 1000),
                         (1024, 1024, 1024))}
S15C2[(1000, 1000, 1000, True)] = ("t64 T", "t64 T c2", "t64n80 T c2")
# Session 16 (lead): the producer's tail in place of the end's cluster barrier (~0.7 us a
# launch, cluster_cost_dev.py), against each cluster form's end barrier (session 16 timed the
# split one, lean bit 8, since gone) and the unclustered tile, where clusters lost (aligned
# squares) and where they won (split rows)
_T64T = ("t64", "t64 c2 l7", "t64 c2 tail", "t64 T c2 tail")
S16TAIL = {(m, n, k, False): _T64T for m, n, k in (
    (1000, 1000, 1000), (768, 768, 768), (1024, 1024, 1024), (896, 896, 896),
    (1000, 1000, 4000), (640, 640, 640))}
S16TAIL[(1000, 1000, 1000, True)] = _T64T
S16TAIL[(768, 768, 768, False)] += ("t64n80 T c2 tail", "t64n80 T")
S16TAIL |= {(3000, 3000, 3000, False): ("t192 c2 l7", "t192 c2 tail"),
            (3000, 3000, 1000, False): ("t192 c2 l7", "t192 c2 tail"),
            (2000, 3000, 1000, False): ("w192 c2 ps l0", "w192 c2 ps tail"),
            (2000, 2000, 2000, False): ("wide c2 l0", "wide c2 tail")}
# Session 17: gemm_wgmma_x's clusters (2 x 2, 1 x 2, 2 x 1 pipelined) ending with the
# producer's tail, timed on this tree and on one without it (benchmarks/s17_call1.sh)
_S17X = ("wide c2x2", "mid c2x2", "wide c1x2", "mid c1x2", "wide c2 ps l0")
S17X = {(3000, 5000, 2000, False): _S17X, (3000, 5000, 2000, True): _S17X,
        (4000, 4000, 4000, False): _S17X, (8192, 8192, 512, False): _S17X}
SETS = {"split": SPLIT_ROWS, "shortk": SHORT_K, "tile192": TILE192, "tile192r": TILE192R,
        "tile64": TILE64, "stages": STAGES5, "s12": S12, "s12t64": S12T64, "s12lean": S12LEAN,
        "s13narrow": S13NARROW, "s13ct": S13CT, "s13swap": S13SWAP,
        "s14split": S14SPLIT, "s14small": S14SMALL, "s14check": S14CHECK,
        "s15c2": S15C2, "s16tail": S16TAIL, "s17x": S17X}
# the sets timed once (the others twice), warm too
_OWN = ("first", "tile192", "tile192r", "tile64", "stages", "s12", "s12t64")
_WARM = ("shortk", "tile192", "tile192r", "tile64", "stages", "s12", "s12t64", "s12lean",
         "s13narrow", "s13ct", "s13swap", "s14split", "s14small", "s14check", "s15c2",
         "s16tail", "s17x")


# ---- timing --------------------------------------------------------------------------------------


def single_us(p: Any, config: Config | None, stream: Any) -> float:
    """One eager gemm call with its host path, events around it (bench_gemm_decode.host_us)."""
    def call(i: int) -> None:
        gm.gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream, config=config)

    with gpurt.stream(stream), torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        return round(bench.host_us(torch, call, p.sets, 30), 2)


def warm_us(p: Any, config: Config | None, stream: Any) -> float:
    """Kernel-only on the same operands every call (bench_gemm's warm batch; L2-resident
    where they fit)."""
    def call(i: int) -> None:
        gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream, config=config)

    def capture(body: Any) -> Any:
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph, stream=stream):
            body()
        return graph

    with gpurt.stream(stream), torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        return grid_dev._graph_us(capture, call, 1, lambda g: g.replay())


def cublas_warm_us(p: Any) -> float:
    def capture(body: Any) -> Any:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        return graph

    return grid_dev._graph_us(capture, lambda i: torch.matmul(p.a[0], p.b[0], out=p.out), 1,
                              lambda g: g.replay())


def cublas_single_us(p: Any) -> float:
    return round(bench.host_us(torch, lambda i: torch.matmul(p.a[i], p.b[i], out=p.out),
                               p.sets, 30), 2)


WATCHDOG_S = 15.0  # one variant's calls, timings included, take well under this


def _measure(p: Any, config: Config | None, stream: Any, ref: Any, cublas: tuple[float, float],
             fallback: str) -> dict[str, Any]:
    err = grid_dev.error(p, config, False, stream, ref)
    us = grid_dev.ours_us(p, config, False, stream)
    single = single_us(p, config, stream)
    warm = warm_us(p, config, stream) if len(cublas) > 2 else None
    grids = {c[0].config.label(): c[0].grid for c in gm._calls.values()}
    row = {"us": us, "x": round(cublas[0] / us, 3), "single_us": single,
           "single_x": round(cublas[1] / single, 3), "err": float(f"{err:.2g}"),
           "ok": err < 1e-2, "grid": grids.get(config.label() if config else fallback)}
    if warm is not None:
        row.update(warm_us=warm, warm_x=round(cublas[2] / warm, 3))
    return row


def time_shape(m: int, n: int, k: int, b_nk: bool, names: tuple[str, ...], rounds: int,
               stream: Any, l2: int, state: dict[str, Any], save: Any, warm: bool = False) -> None:
    """Every variant of one shape into state["rows"][shape], saving after each; a variant
    that runs past WATCHDOG_S (a hung kernel) ends the process (exit 5), and the next run of
    this mode finds it in state["pending"] and leaves it out (state["hung"]); one that raises
    is recorded and ends the process too (a sticky CUDA error spoils the context). Round r > 1
    names its results "<variant> r<r>" and times cuBLAS again first ("cublas_us r<r>")."""
    shape = f"{m}x{n}x{k}" + (" bT" if b_nk else "")
    todo = [name + (f" r{r}" if r > 1 else "") for r in range(1, rounds + 1)
            for name in ("auto", *names)]
    row = state["rows"].setdefault(shape, {"shape": shape})
    left = [name for name in todo if name not in row and f"{shape} {name}" not in state["hung"]]
    if not left:
        return
    p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, b_nk, l2)
    problem = grid_dev.problem_of(p.a[0], p.b[0], False)
    auto = tune.heuristic(problem).label()
    if "cublas_us" not in row:
        row.update(auto_config=auto, pitch128=problem.pitch128, cublas_us=grid_dev.cublas_us(p),
                   cublas_single_us=cublas_single_us(p))
        if warm:
            row["cublas_warm_us"] = cublas_warm_us(p)
    ref = p.a[0].double() @ p.b[0].double()
    for name in left:
        base, _, again = name.partition(" r")
        if again and f"cublas_us r{again}" not in row:
            row[f"cublas_us r{again}"] = grid_dev.cublas_us(p)
        state["pending"] = f"{shape} {name}"
        save()
        timer = threading.Timer(WATCHDOG_S, lambda: os._exit(5))
        timer.start()
        try:
            cublas = (row[f"cublas_us r{again}" if again else "cublas_us"],
                      row["cublas_single_us"])
            if warm:
                cublas += (row["cublas_warm_us"],)
            row[name] = _measure(p, VARIANTS.get(base), stream, ref, cublas, auto)
        except Exception as exc:  # noqa: BLE001 - a fresh process goes on (sticky errors)
            row[name] = {"error": repr(exc)}
            state["pending"] = None
            save()
            print(f"{shape} {name}: {exc!r}", flush=True)
            os._exit(5)
        timer.cancel()
        print(f"{shape} {name}: {json.dumps(row[name])}", flush=True)
    state["pending"] = None
    save()
    del p, ref


def run_timing(json_path: str, set_: str) -> None:
    """Resumable: the state lives in ``json_path`` (rows, the variant running, hung ones)."""
    path = Path(json_path)
    state = json.loads(path.read_text()) if path.exists() else {"rows": {}, "hung": [],
                                                                  "pending": None}
    if state["pending"]:
        print(f"HUNG (a previous run died in it): {state['pending']}", flush=True)
        state["hung"].append(state["pending"])
        state["pending"] = None

    def save() -> None:
        path.write_text(json.dumps(state, indent=1))

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    shapes = SETS.get(set_) or {(*key, False): v for key, v in SHAPES.items()}
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for (m, n, k, b_nk), names in shapes.items():
            time_shape(m, n, k, b_nk, names, 1 if set_ in _OWN else 2, stream, l2, state, save,
                       warm=set_ in _WARM)
    summary(json_path)


def summary(json_path: str) -> None:
    state = json.loads(Path(json_path).read_text())
    print(f"\n{torch.cuda.get_device_name()}: kernel-only us (graph replay) / single call us;"
          f" x = cuBLAS / gpurt; hung: {state['hung']}")
    for row in state["rows"].values():
        ours = {key: v for key, v in row.items() if isinstance(v, dict) and "us" in v}
        cells = " | ".join(f"{key} {v['us']:.1f} x{v['x']:.3f} / {v['single_us']:.1f}"
                           + (f" warm {v['warm_us']:.1f} x{v['warm_x']:.3f}" if "warm_us" in v
                              else "")
                           + f"{'' if v['ok'] else ' BAD'}" for key, v in ours.items())
        print(f"{row['shape']} cuBLAS {row.get('cublas_us', 0):.1f} / "
              f"{row.get('cublas_single_us', 0):.1f} warm {row.get('cublas_warm_us', 0):.1f}"
              f" auto={row.get('auto_config')} | {cells}", flush=True)


# ---- Nsight Compute: one call per variant --------------------------------------------------------

NCU_SHAPES = ((3000, 5000, 2000), (8192, 8192, 512))
NCU_VARIANTS = ("wide", "wide ps", "wide c2", "wide c1x2", "mid pp")
NCU_SHORT_K = ("wide ps", "mid pp", "mid pp ps")  # (8192, 8192, 512) only


def ncu_calls(set_: str) -> None:
    """Each (shape, variant) once, after a warm-up call outside the profiled range (ncu's
    --profile-from-start off with cudaProfilerStart/Stop around the measured call)."""
    shapes = ((8192, 8192, 512),) if set_ == "shortk" else NCU_SHAPES
    names = NCU_SHORT_K if set_ == "shortk" else NCU_VARIANTS
    if set_ == "tile192r":
        shapes, names = ((3000, 3000, 3000),), ("mid c2x2", "t192 c2", "w192 c2")
    if set_ == "stages":
        shapes, names = ((3000, 3000, 3000),), ("w192 c2", "w192 c2 s5", "w192 c2 s5 ps")
    if set_ == "s12":  # the 64-row tile and 128 x 128 pipelined against cuBLAS (torch) itself
        shapes, names = ((1000, 1000, 1000), (768, 768, 768)), ("t64", "mid ps")
    if set_ == "s12lean":  # the instructions and L2 requests with and without the lean bits
        shapes = ((768, 768, 768), (1024, 1024, 1024))
        names = ("t64", "t64 lean4", "t64 lean5")
    if set_ == "s13narrow":  # the narrow tiles against the picks before them
        shapes = ((1536, 1536, 1536), (768, 768, 768))
        names = ("t192x128 s5", "t192n96", "t64", "t64n96", "t64n80")
    if set_ == "s13ct":  # the swapped tiles' L2 requests against the picks
        shapes = ((1536, 1536, 1536), (768, 768, 768))
        names = ("t192x128 s5", "t192n96 T", "t192n96 T c2", "t64", "t64n80 T")
    if set_ == "s12t64":  # the L2 requests of 64 x 128 alone and in clusters, cuBLAS's tiling
        shapes, names = ((1000, 1000, 1000),), ("t64", "t64 c2", "narrow c1x2")
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ga, gb, gout = gpurt.asarray(a), gpurt.asarray(b), gpurt.asarray(out)
        for name in names:
            config = VARIANTS[name]
            gm.gemm(ga, gb, out=gout, config=config)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            gm.gemm(ga, gb, out=gout, config=config)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"ncu {m}x{n}x{k} {name} = {config.label()}", flush=True)
        if set_ == "s12":
            torch.matmul(a, b, out=out)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            torch.matmul(a, b, out=out)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"ncu {m}x{n}x{k} cuBLAS", flush=True)


# ---- correctness ---------------------------------------------------------------------------------

NEW = [c for c in VARIANTS.values() if c.cluster > 1 or c.pingpong or c.pipe_store]


def check_cases() -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    for config in NEW:
        for a_t, b_t in ((False, False), (False, True), (True, True), (True, False)):
            cases.append((3 * 128 - 8, 3 * config.bn + 8, 3 * 64 + 8, config, a_t, b_t))
        cases.append((200, 264, 72, config, False, False, 0.5))
        cases.append((136, 520, 4104, config, True, False, -1.0, torch.float16))
        cases.append((4224, 1000, 520, config, False, False))  # several tiles per CTA
    return cases


def run_checks(cases: list[tuple[Any, ...]]) -> int:
    failures = 0
    for case in cases:
        ok, what = check(*case)
        failures += not ok
        print(("PASS " if ok else "FAIL ") + what, flush=True)
    print(f"checks: {len(cases) - failures} passed, {failures} failed", flush=True)
    return failures


def sanitize(set_: str) -> None:
    """Small cases of every new variant (``split_rows``: the second call's, the chooser's
    2 x 2 clusters with several tile blocks per cluster and the case the first left undone)."""
    if set_ == "shortk":  # several tiles per consumer; beta with Cin; N-major A and B
        pp_ps = VARIANTS["mid pp ps"]
        cases = [(1536, 1536, 136, pp_ps, False, False), (200, 520, 136, pp_ps, False, False, 0.5),
                 (1000, 1100, 200, pp_ps, True, True)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "tile192":  # alone and in clusters; several tiles per CTA
        w192 = [VARIANTS[name] for name in ("w192", "w192 c2", "w192 c2x2")]
        cases = [(200, 520, 136, c, False, False, 0.5) for c in w192]
        cases += [(136, 456, 200, w192[1], True, True), (264, 600, 200, w192[2], False, True),
                  (1536, 1000, 136, w192[0], True, False)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "tile64":  # every layout; beta with Cin; several tiles per CTA; plain stores
        t64 = [VARIANTS[name] for name in ("t64", "t64 plain", "t64 ps", "t64 w256")]
        cases = [(200, 520, 136, c, False, False, 0.5) for c in t64]
        cases += [(136, 264, 200, t64[1], True, True), (72, 600, 200, t64[3], True, False),
                  (64 * 140, 300, 136, t64[0], False, True), (1000, 1000, 136, t64[2], True, True)]
    if set_ == "tile192r":  # alone and in clusters; beta; several tiles per CTA
        tall = [VARIANTS[name] for name in ("t192", "t192 c2", "t192x128", "t192x128 c2")]
        cases = [(232, 520, 136, c, False, False, 0.5) for c in tall]
        cases += [(400, 456, 200, tall[1], True, True), (600, 300, 136, tall[3], False, True),
                  (1536, 1000, 136, tall[0], True, False)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "s12t64":  # clusters whose second CTA has no tile; beta; N-major; many tiles
        t64c = [VARIANTS[name] for name in ("t64 c2", "t64 c2 ps")]
        cases = [(200, 520, 136, c, False, False, 0.5) for c in t64c]
        cases += [(136, 264, 200, t64c[0], True, True), (1000, 1000, 136, t64c[1], True, False),
                  (64 * 141, 300, 136, t64c[0], False, True)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "s16tail":  # the producer's tail: beta; odd tile rows; N-major; many tiles;
        # the held stage; C^T; K shorter than the ring
        cs = [VARIANTS[name] for name in ("t64 c2 tail", "t64 T c2 tail", "t192 c2 tail",
                                          "w192 c2 ps tail", "wide c2 tail", "t64n80 T c2 tail")]
        cases = [(232, 520, 136, c, False, False, 0.5) for c in cs]
        cases += [(136, 264, 200, cs[0], True, True), (64 * 141, 300, 136, cs[0], False, True),
                  (1000, 1000, 136, cs[1], True, True), (1536, 1000, 136, cs[2], True, False),
                  (4096, 1000, 136, cs[3], True, False), (4096, 1000, 136, cs[4], False, True),
                  (1000, 760, 136, cs[5], False, False), (200, 520, 64, cs[0], False, False)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "s17x":  # the x clusters' tail: beta; odd tile rows and columns; N-major;
        # many tiles a CTA; K shorter than the ring
        x = [VARIANTS[name] for name in _S17X]
        cases = [(520, 1000, 200, c, False, False, 0.5) for c in x]
        cases += [(2048, 2048, 136, x[0], False, False), (1000, 1100, 136, x[1], False, True),
                  (1000, 1100, 136, x[2], True, False), (136, 264, 200, x[3], True, True),
                  (4096, 1000, 136, x[4], True, False), (200, 520, 64, x[0], False, False),
                  (200, 520, 64, x[3], False, False), (200, 520, 64, x[4], False, False)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "s12lean":  # beta's fallback; early copies; clusters; held stage; many tiles
        lean = [VARIANTS[name] for name in ("t64 lean7", "t64 c2 lean7", "t64 lean2",
                                            "w192 c2 s5 ps lean7", "mid ps lean7", "t64 lean5")]
        cases = [(200, 520, 136, c, False, False, 0.5) for c in lean]
        cases += [(1024, 1024, 136, lean[5], False, False), (1000, 1000, 136, lean[1], True, True),
                  (136, 264, 200, lean[2], True, True), (4096, 1000, 136, lean[3], True, False),
                  (1000, 1000, 520, lean[4], False, True),
                  (64 * 140, 300, 136, lean[0], False, True)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "s13narrow":  # every narrow form; beta; N-major; clusters; many tiles a CTA
        narrow = [*_s13_tests(), VARIANTS["t64n80 c2"]]
        cases = [(200, 520, 136, c, False, False, 0.5) for c in narrow]
        cases += [(136, 264, 200, narrow[1], True, True), (1000, 1000, 136, narrow[6], True, True),
                  (1536, 1000, 136, narrow[0], False, True),
                  (1000, 760, 136, narrow[2], True, False, 0.0, torch.float16)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "s13ct":  # every swapped form; beta; N-major; clusters; many tiles a CTA
        swapped = _tests_of("test_gemm_swap")
        cases = [(200, 520, 136, c, False, False, 0.5) for c in swapped]
        cases += [(136, 264, 200, swapped[1], True, True),
                  (1000, 1000, 136, swapped[3], True, True),
                  (1000, 1536, 136, swapped[0], False, True),
                  (760, 1000, 136, swapped[2], True, False, 0.0, torch.float16)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ in ("stages", "s12"):  # one box, and the last stage's A half; beta; many tiles a CTA
        deep = [VARIANTS[name] for name in _STAGES_NEW]
        cases = [(200, 520, 136, c, False, False, 0.5) for c in deep]
        cases += [(136, 456, 200, deep[3], True, True), (264, 600, 200, deep[2], False, True),
                  (4096, 1000, 136, deep[3], True, False), (4096, 1000, 136, deep[1], False, False)]
        sys.exit(1 if run_checks(cases) else 0)
    if set_ == "split":
        c2x2 = VARIANTS["wide c2x2"]
        cases = [(2048, 2048, 136, c2x2, False, False), (520, 1000, 200, c2x2, True, True, 0.5),
                 (1000, 1100, 136, VARIANTS["mid c2x2"], False, True),
                 (1536, 768, 136, VARIANTS["narrow pp"], True, False)]
        sys.exit(1 if run_checks(cases) else 0)
    cases = [(200, 520, 136, c, False, False, 0.5) for c in NEW]
    cases += [(136, 264, 200, NEW[1], True, True), (72, 136, 200, NEW[3], False, True)]
    # ping-pong with several tiles per CTA (more tiles than SMs), where the unordered ring hung
    cases += [(1536, 1536, 136, VARIANTS[name], False, False) for name in ("mid pp", "mid pp c2")]
    cases.append((1536, 768, 136, VARIANTS["narrow pp"], True, False))
    sys.exit(1 if run_checks(cases) else 0)


def _s13_tests() -> list[Config]:
    """tests/test_gemm_tile96.py's variants (192 x 96, its clusters, 64 x 96, 64 x 80, ...)."""
    return _tests_of("test_gemm_tile96")


def _tests_of(module: str) -> list[Config]:
    """The VARIANTS of tests/<module>.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    return list(importlib.import_module(module).VARIANTS)


_STAGES_NEW = ("w192 s5", "w192 c2 s5", "w192 s5 ps", "w192 c2 s5 ps", "t192 s4 c2",
               "t192x128 s5")


def precompile(set_: str) -> None:
    """Every program the checks, timings and ncu calls use, compiled in parallel (``shortk``:
    only that set's)."""
    jobs = set()
    new = [VARIANTS["mid pp ps"]] if set_ == "shortk" else NEW
    if set_ == "tile192":  # and the tests' plain stores
        new = [VARIANTS[v] for v in ("w192", "w192 c2", "w192 c2x2")]
        new.append(_v(tune._WGMMA_192, tma_store=False, group_m=8))
    if set_ == "tile64":  # tests/test_gemm_tile64.py's variants, in every layout
        new = [VARIANTS[v] for v in ("t64", "t64 plain", "t64 ps", "t64 w256")]
    if set_ == "s12t64":  # the same, with session 12's clusters
        new = [VARIANTS[v] for v in ("t64", "t64 plain", "t64 ps", "t64 w256", "t64 c2",
                                     "t64 c2 ps")]
    if set_ == "s12lean":  # and the tests' (tests/test_gemm_lean.py)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        new = list(importlib.import_module("test_gemm_lean").VARIANTS)
    if set_ == "tile192r":  # and the tests' plain stores
        new = [*tune._TALL, _v(tune._WGMMA_T192, tma_store=False)]
    if set_ == "s13narrow":  # and the tests' (tile96; then tile64's and tile192's)
        new = [*_s13_tests(), VARIANTS["t64n80 c2"]]
        for name in ("test_gemm_tile64", "test_gemm_tile192"):
            new += importlib.import_module(name).VARIANTS
    if set_ == "s13ct":  # and the tests' (tests/test_gemm_swap.py)
        new = [*_tests_of("test_gemm_swap"), VARIANTS["t64n80 T s8"]]
    if set_ in ("stages", "s12"):  # and the tests' (tests/test_gemm_stages.py)
        new = [VARIANTS[v] for v in _STAGES_NEW]
        new += [_v(tune._WGMMA_T192, stages=4)]
    for dt in (tune.DT_BF16, tune.DT_F16):
        for a_k in (True, False):
            for b_k in (True, False):
                problem = tune.Problem(1000, 1000, 1000, dt, a_k, b_k, True, True, (9, 0), 132)
                for config in new:
                    jobs.add(launch.program(config, problem))
    shapes = SETS[set_] if set_ in _WARM else (
        {(*key, False): v for key, v in SHAPES.items()} | SPLIT_ROWS)
    for (m, n, k, b_nk), names in shapes.items():
        problem = tune.Problem(m, n, k, tune.DT_BF16, True, b_nk, True, True, (9, 0), 132,
                               pitch128=m % 64 == 0 and n % 64 == 0 and k % 64 == 0)
        for config in [tune.heuristic(problem), *(VARIANTS[v] for v in names)]:
            jobs.add(launch.program(config, problem))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "check", "time", "ncu", "sanitize"))
    parser.add_argument("--json", default="wgirr_time.json")
    parser.add_argument("--set",
                        choices=("first", *SETS), default="first",
                        help="the shapes of session 9's first or second call, session 10's "
                             "short K or 128 x 192 tiles, session 11's 192- or 64-row tiles, "
                             "5 stages of 128 x 192 (stages), session 12's defaults (s12) or "
                             "64-row tiles in clusters (s12t64) or the lean bits (s12lean)")
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile(args.set)
    elif args.mode == "check":
        sys.exit(1 if run_checks(check_cases()) else 0)
    elif args.mode == "time":
        run_timing(args.json, args.set)
    elif args.mode == "ncu":
        ncu_calls(args.set)
    else:
        sanitize(args.set)
