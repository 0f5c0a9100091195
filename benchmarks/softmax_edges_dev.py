"""Issue 17 dev harness: rows whose length is not a multiple of the vector width, three ways
in one run (GB/s and % of copy, timed like bench_softmax.py):

  edges    aligned arrays: 16-byte accesses with scalar edges (the new route)
  scalar   the output one element past an allocation's start, so the arrays agree only
           modulo 4 bytes (float32) and every access is one element (the old route of odd
           lengths)
  aligned  the next shorter multiple of 8 columns (whole vectors; the reference)

    python benchmarks/softmax_edges_dev.py [--json PATH] [--ways edges,scalar,aligned]
    [--cases N] (the first N cases) [--routes] (instead: ROUTES, forced variants at 4096
    rows, each checked against torch in float64 and timed, with torch's own time for the
    case) [--set NAME] (another set of routes: SETS) [--warm] (first compile the set's
    variants and the GPU tests' ticket variants into the disk kernel cache, one process
    per CPU) [--old PATH] (softmax.cu before a change, for before/after)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import importlib
import json
import multiprocessing
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _common import Timer, copy_gbps, peer
from bench_softmax import BF16, F16, F32, OPS, gpurt_call, make_inputs, plan, torch_call

import gpurt

CASES = [
    (4096, 50257, F32, "softmax"),
    (4096, 32001, F32, "softmax"),
    (4096, 50257, BF16, "softmax"),
    (4096, 50257, F32, "softmax_backward"),
    (64, 1_000_003, F32, "softmax"),
    (4096, 4099, F32, "softmax"),
    (4096, 11009, F32, "softmax"),
    (4096, 50257, F32, "log_softmax"),
    (4096, 50257, BF16, "softmax_backward"),
    (4096, 50257, F32, "log_softmax_backward"),
    (4096, 11009, F32, "softmax_backward"),
]


V = plan.Variant
OLD = "old"  # a variant compiled from --old (the source before a change), for before/after
# (rows, cols, dtype, op name) -> forced variants to compare, (OLD, variant) from --old's
# source; the chooser's pick is added first. Issue 17 on the H200 (s5-softrow): the fp32 rows
# of 50257 (routes tuned on the H100), 16-bit forward before/after the two-pass exps, rows of
# 1M in clusters of 16 against the split.
ROUTES: dict[tuple[int, int, np.dtype, str], list] = {
    (4096, 50257, F32, "softmax"): [V("rows", 0, 0, 4, 16, 1024, 1024, 1, 1, 12, True),
                                    V("cluster", 0, 0, 4, 8, 1024, 1024, 2, 1, 0, True),
                                    V("cluster", 0, 0, 4, 16, 512, 512, 2, 1, 0, True),
                                    V("cluster", 0, 0, 4, 16, 256, 256, 4, 4, 8, True),
                                    V("cluster", 0, 0, 4, 8, 512, 512, 4, 2, 0, True)],
    (4096, 50257, F32, "log_softmax"): [V("rows", 0, 1, 4, 16, 1024, 1024, 1, 1, 12, True),
                                        V("cluster", 0, 1, 4, 16, 512, 512, 2, 1, 0, True)],
    (4096, 50257, F32, "softmax_backward"): [V("cluster", 0, 2, 4, 8, 1024, 1024, 2, 1, 6, True),
                                             V("cluster", 0, 2, 4, 8, 512, 512, 4, 1, 0, True)],
    (4096, 50257, F32, "log_softmax_backward"): [
        V("cluster", 0, 3, 4, 8, 1024, 1024, 2, 1, 6, True)],
    (4096, 50257, BF16, "softmax"): [(OLD, V("rows", 2, 0, 8, 8, 1024, 1024, 1, 1, 6, True)),
                                     V("cluster", 2, 0, 8, 8, 512, 512, 2, 2, 4, True),
                                     V("rows", 2, 0, 8, 16, 512, 512, 1, 1, 8, True)],
    (16384, 4096, BF16, "softmax"): [(OLD, plan.choose_variant(4096, BF16, plan.SOFTMAX))],
    (1024, 131072, BF16, "softmax"): [(OLD, plan.choose_variant(131072, BF16, plan.SOFTMAX))],
    (64, 1_000_003, F32, "softmax"): [(OLD, V("split", 0, 0, 4, 8, 512, 512, edges=True)),
                                      V("cluster", 0, 0, 4, 16, 1024, 1024, 16, 1, 12, True)],
    (64, 1_000_003, F32, "log_softmax"): [(OLD, V("split", 0, 1, 4, 8, 512, 512, edges=True))],
    (64, 1_000_003, BF16, "softmax"): [(OLD, V("split", 2, 0, 8, 4, 512, 512, edges=True))],
    (8, 1_000_000, F32, "softmax"): [V("split", 0, 0, 4, 8, 512, 512)],
    (2, 1_000_000, F32, "softmax"): [V("split", 0, 0, 4, 8, 512, 512)],
    (256, 300_001, F32, "softmax_backward"): [V("split", 0, 2, 4, 4, 512, 512, edges=True)],
}


# the follow-up (s5-softrow run 2): the pick at 65536 against the paired shape it replaced;
# rows of 1M by row count around 32 (then the fewest rows for clusters of 16)
FOLLOW_UP: dict[tuple[int, int, np.dtype, str], list] = {
    (2048, 65536, F32, "softmax"): [V("cluster", 0, 0, 4, 16, 512, 512, 2, 2, 8)],
    (2048, 65536, F32, "log_softmax"): [V("cluster", 0, 1, 4, 16, 512, 512, 2, 2, 8)],
    (4096, 50257, F32, "softmax"): [V("cluster", 0, 0, 4, 16, 512, 512, 2, 2, 8, True)],
    (16, 1_000_003, F32, "softmax"): [V("cluster", 0, 0, 4, 32, 512, 512, 16, 1, 10, True)],
    (32, 1_000_003, F32, "softmax"): [V("split", 0, 0, 4, 8, 512, 512, edges=True)],
    (64, 1_000_003, F32, "softmax"): [V("split", 0, 0, 4, 8, 512, 512, edges=True)],
    (128, 1_000_003, F32, "softmax"): [V("split", 0, 0, 4, 8, 512, 512, edges=True)],
}


# not run yet (notes_softmax.md, v10): rows with edges in the wide shape, 22 vectors in
# registers (the pick: ptxas spills 24 bytes) against 21 and 20; the rows without edges
EDGE_KEEP: dict[tuple[int, int, np.dtype, str], list] = {
    (64, 1_000_003, F32, "softmax"): [V("cluster", 0, 0, 4, 32, 512, 512, 16, 1, s, True)
                                      for s in (11, 12)],
    (64, 1_000_000, F32, "softmax"): [],
    (64, 1_000_003, F32, "log_softmax"): [V("cluster", 0, 1, 4, 32, 512, 512, 16, 1, 11, True)],
    (1024, 131071, F32, "softmax"): [V("cluster", 0, 0, 4, 32, 512, 512, 2, 1, s, True)
                                     for s in (11, 12)],
    (1024, 131072, F32, "softmax"): [],
    (2048, 70001, F32, "softmax"): [V("cluster", 0, 0, 4, 32, 512, 512, 2, 1, 11, True)],
    (4096, 50257, F32, "softmax"): [V("rows", 0, 0, 4, 16, 1024, 1024, 1, 1, 13, True)],
}


def _ticket(dt: int, op: int, items: int, threads: int, blocks: int = 1, smem: int = 0,
            edges: bool = True) -> Any:
    return V("ticket", dt, op, 16 // plan._STORAGE_BYTES[dt], items, threads, threads,
             min_blocks=blocks, smem_items=smem, edges=edges)


def _cluster16(op: int, edges: bool = True) -> Any:  # s5-softrow's pick for 32+ rows of 1M
    return V("cluster", 0, op, 4, 32, 512, 512, 16, 1, 10, edges)


def _split(dt: int, op: int, cols: int) -> Any:
    return plan.choose_variant(cols, [F32, None, BF16][dt], op, tickets=False)


B, LB = plan.SOFTMAX_BACKWARD, plan.LOG_SOFTMAX_BACKWARD
# s7-softlong: chunks of a row in CTAs that meet through a ticket (the chooser's pick for
# rows longer than clusters of 8 hold, first) against the clusters of 16 and the split; rows
# of 1M by row count with smaller chunks (512 x 8 vectors, registers only, two per SM);
# tickets in place of 2-CTA clusters at 50257 (same CTA shape) and 16-bit rows of 50257 in
# chunks of 256-512 threads, several per SM
TICKET: dict[tuple[int, int, np.dtype, str], list] = {
    (64, 1_000_003, F32, "softmax"): [_cluster16(0), _split(0, 0, 1_000_003),
                                      _ticket(0, 0, 8, 512, 2)],
    (64, 1_000_000, F32, "softmax"): [_cluster16(0, False)],
    (64, 1_000_003, F32, "log_softmax"): [_cluster16(1), _split(0, 1, 1_000_003)],
    (64, 1_000_003, F32, "softmax_backward"): [_split(0, B, 1_000_003),
                                               _ticket(0, B, 4, 512, 2)],
    (64, 1_000_003, F32, "log_softmax_backward"): [_split(0, LB, 1_000_003)],
    (64, 1_000_003, BF16, "softmax"): [_split(2, 0, 1_000_003)],
    (64, 1_000_003, BF16, "softmax_backward"): [_split(2, B, 1_000_003)],
    (16, 1_000_003, F32, "softmax"): [_split(0, 0, 1_000_003), _ticket(0, 0, 8, 512, 2)],
    (8, 1_000_003, F32, "softmax"): [_split(0, 0, 1_000_003), _ticket(0, 0, 8, 512, 2)],
    (2, 1_000_003, F32, "softmax"): [_split(0, 0, 1_000_003), _ticket(0, 0, 8, 512, 2)],
    (256, 524288, F32, "softmax"): [_ticket(0, 0, 32, 512, 1, 10, False)],
    (4096, 50257, F32, "softmax"): [_ticket(0, 0, 16, 512, 2, 8),
                                    _ticket(0, 0, 16, 512, 1, 0)],
    (4096, 50257, F32, "log_softmax"): [_ticket(0, 1, 16, 512, 1, 0)],
    (4096, 50257, F32, "softmax_backward"): [_ticket(0, B, 16, 512, 1, 4),
                                             _ticket(0, B, 16, 256, 2, 4)],
    (4096, 50257, F32, "log_softmax_backward"): [_ticket(0, LB, 16, 512, 1, 4)],
    (4096, 50257, BF16, "softmax"): [_ticket(2, 0, 8, 512, 2), _ticket(2, 0, 8, 256, 4)],
}

def _rows16(dt: int, op: int, items: int, threads: int, blocks: int, smem: int) -> Any:
    return V("rows", dt, op, 8, items, threads, threads, 1, blocks, smem, True)


def _before_after(v: Any) -> list:
    """``v`` from --old's source, then from the current one."""
    return [(OLD, v), v]


# s7-softbf16: 16-bit forward rows (the chooser's pick first, then the same variant from the
# source before the change, then forced ones): one CTA per SM of 1024 threads against two of
# 512 (one computes while the other loads), 12 or 10 of 16 vectors in shared memory; rows
# of 32001 in CTAs of 512 or 256, two or four per SM. (The run also timed the sum pass's exps
# as ex2.bf16x2 of pairs, -DSM_EXP_BF16X2 in commit 6b6daea: slower, dropped.)
_PICK50257 = _rows16(2, 0, 8, 1024, 1, 6)
_PAIRED = _rows16(2, 0, 16, 512, 2, 12)
SOFTBF16: dict[tuple[int, int, np.dtype, str], list] = {
    (4096, 50257, BF16, "softmax"): [*_before_after(_PICK50257), _PAIRED,
                                     _rows16(2, 0, 16, 512, 2, 10)],
    (4096, 50257, F16, "softmax"): [*_before_after(_rows16(1, 0, 8, 1024, 1, 6)),
                                    _rows16(1, 0, 16, 512, 2, 12)],
    (4096, 50257, BF16, "log_softmax"): [*_before_after(_rows16(2, 1, 8, 1024, 1, 6)),
                                         _rows16(2, 1, 16, 512, 2, 12)],
    (4096, 32001, BF16, "softmax"): [*_before_after(_rows16(2, 0, 4, 1024, 1, 0)),
                                     _rows16(2, 0, 8, 512, 2, 0), _rows16(2, 0, 8, 512, 2, 4),
                                     _rows16(2, 0, 16, 256, 4, 12), _PAIRED],
    (64, 1_000_003, BF16, "softmax"): [*_before_after(_ticket(2, 0, 8, 1024, 1, 6)),
                                       _ticket(2, 0, 16, 512, 2, 12)],
    (1024, 131072, BF16, "softmax"): [
        *_before_after(V("cluster", 2, 0, 8, 8, 1024, 1024, 2, 1, 6)),
        V("cluster", 2, 0, 8, 16, 512, 512, 2, 2, 12)],
    (16384, 4096, BF16, "softmax"): _before_after(plan.choose_variant(4096, BF16, plan.SOFTMAX)),
    (4096, 50257, BF16, "softmax_backward"): [],
}


def _one(v: Any) -> Any:
    """``v`` with the 16-bit forward reduction in one pass."""
    return dataclasses.replace(v, one_pass=True)


def _pick(rows: int, cols: int, dtype: np.dtype, op: int) -> Any:
    return plan.choose_variant(cols, dtype, op, rows=rows)


# s8-softlong16: 16-bit rows of 200k-1M elements. Timed (notes v13) with the source of commit
# fef7074, whose ticket chunks shared a row's body equally (OLD: main's full chunks and a
# short last one, kept since: the equal ones read 2-8 points slower), and the 16-bit forward
# reduction in one pass (_one) so that its exps overlap the loads, where the chunks of a
# wave start together and leave the SM's memory idle while they reduce. Chunks of 256 or
# 1024 threads, ticket chunks in place of the clusters for rows of 131072-500009; float32
# rows of 1M for the equal chunks alone.
_P16 = _ticket(2, 0, 16, 512, 2, 12)
_W16B = _ticket(2, B, 16, 512, 1, 12)
SOFTLONG16: dict[tuple[int, int, np.dtype, str], list] = {
    (64, 1_000_003, BF16, "softmax"): [
        (OLD, _P16), _one(_P16), _one(_ticket(2, 0, 16, 512, 2, 10)),
        _one(_ticket(2, 0, 16, 256, 4, 12)), _ticket(2, 0, 16, 256, 4, 12),
        _one(_ticket(2, 0, 8, 1024, 1, 6))],
    (64, 1_000_003, F16, "softmax"): [(OLD, _ticket(1, 0, 16, 512, 2, 12)),
                                      _one(_ticket(1, 0, 16, 512, 2, 12))],
    (64, 1_000_003, BF16, "log_softmax"): [(OLD, _ticket(2, 1, 16, 512, 2, 12)),
                                           _one(_ticket(2, 1, 16, 512, 2, 12))],
    (64, 1_000_000, BF16, "softmax"): [(OLD, _ticket(2, 0, 16, 512, 2, 12, False)),
                                       _one(_ticket(2, 0, 16, 512, 2, 12, False))],
    (7, 1_000_003, BF16, "softmax"): [(OLD, _P16), _one(_P16)],
    (1, 1_000_003, BF16, "softmax"): [(OLD, _pick(1, 1_000_003, BF16, 0)),
                                      _one(_pick(1, 1_000_003, BF16, 0)), _one(_P16)],
    (300, 200_003, BF16, "softmax"): [_one(_pick(300, 200_003, BF16, 0)), _P16, _one(_P16)],
    (64, 200_003, BF16, "softmax"): [_one(_pick(64, 200_003, BF16, 0)), _one(_P16)],
    (64, 500_009, BF16, "softmax"): [_one(_pick(64, 500_009, BF16, 0)), _P16, _one(_P16)],
    (7, 500_009, BF16, "softmax"): [_one(_pick(7, 500_009, BF16, 0)), _one(_P16)],
    (64, 500_009, F16, "softmax"): [_one(_pick(64, 500_009, F16, 0)),
                                    _one(_ticket(1, 0, 16, 512, 2, 12))],
    (1024, 131072, BF16, "softmax"): [_one(_pick(1024, 131072, BF16, 0)),
                                      _one(_ticket(2, 0, 16, 512, 2, 12, False))],
    (4096, 50257, BF16, "softmax"): [_one(_pick(4096, 50257, BF16, 0))],
    (4096, 50257, F16, "softmax"): [_one(_pick(4096, 50257, F16, 0))],
    (4096, 50257, BF16, "log_softmax"): [_one(_pick(4096, 50257, BF16, 1))],
    (4096, 32001, BF16, "softmax"): [_one(_pick(4096, 32001, BF16, 0))],
    (16384, 4096, BF16, "softmax"): [_one(_pick(16384, 4096, BF16, 0))],
    (64, 1_000_003, BF16, "softmax_backward"): [(OLD, _W16B), _ticket(2, B, 16, 256, 2, 12)],
    (64, 1_000_003, F16, "softmax_backward"): [(OLD, _ticket(1, B, 16, 512, 1, 12))],
    (64, 1_000_003, BF16, "log_softmax_backward"): [(OLD, _ticket(2, LB, 16, 512, 1, 12))],
    (300, 200_003, BF16, "softmax_backward"): [
        _W16B, V("cluster", 2, B, 8, 16, 512, 512, 4, 1, 12, True)],
    (64, 500_009, BF16, "softmax_backward"): [(OLD, _W16B)],
    (64, 1_000_003, F32, "softmax"): [(OLD, _pick(64, 1_000_003, F32, 0))],
    (64, 1_000_000, F32, "softmax"): [(OLD, _pick(64, 1_000_000, F32, 0))],
    (64, 1_000_003, F32, "softmax_backward"): [(OLD, _pick(64, 1_000_003, F32, B))],
}


def _persist(dt: int, op: int, items: int, threads: int, blocks: int, smem: int,
             persist: int = 2, edges: bool = True) -> Any:
    """Ticket chunks in a persistent grid (softmax_persist; 16-bit forward in one pass)."""
    return V("ticket", dt, op, 16 // plan._STORAGE_BYTES[dt], items, threads, threads,
             min_blocks=blocks, smem_items=smem, edges=edges,
             one_pass=dt != 0 and op < B, persist=persist)


def _small(dt: int, op: int, items: int, threads: int, blocks: int) -> Any:
    """Small ticket chunks (registers only) for few rows."""
    return V("ticket", dt, op, 16 // plan._STORAGE_BYTES[dt], items, threads, threads,
             min_blocks=blocks, edges=True, one_pass=dt != 0 and op < B)


# s8-softpersist: ticket chunks in a persistent grid, two stages a CTA (the next chunk's loads
# issued after (1) or before (2) the current chunk's reduction, in flight during its wait and
# writes), against the chooser's pick (first); smaller chunks for few rows. The same shapes
# are tested in tests/test_softmax_persist.py (PERSIST_LONG).
_PA, _PB = _persist(2, 0, 16, 256, 2, 12), _persist(2, 0, 16, 512, 1, 12)
_PC = _persist(2, 0, 8, 512, 2, 6)
_FEW16 = [_small(2, 0, 4, 256, 4), _small(2, 0, 4, 128, 8)]
_PBW = [_persist(2, B, 8, 512, 1, 6, 1), _persist(2, B, 8, 512, 1, 6), _persist(2, B, 8, 256, 2, 6)]
_PF = [_persist(0, 0, 16, 512, 1, 12, 1), _persist(0, 0, 16, 512, 1, 12),
       _persist(0, 0, 16, 256, 2, 12)]
_PFB = [_persist(0, B, 8, 512, 1, 6), _persist(0, B, 8, 256, 2, 6)]
SOFTPERSIST: dict[tuple[int, int, np.dtype, str], list] = {
    (64, 1_000_003, BF16, "softmax"): [_persist(2, 0, 16, 256, 2, 12, 1), _PA,
                                       _persist(2, 0, 16, 512, 1, 12, 1), _PB, _PC],
    (300, 200_003, BF16, "softmax"): [_PA, _PB, _PC],
    (64, 500_009, BF16, "softmax"): [_PA, _PB, _PC],
    (64, 200_003, BF16, "softmax"): [_PA, _PB, _PC],
    (7, 500_009, BF16, "softmax"): [_PA, _PC, *_FEW16],
    (7, 1_000_003, BF16, "softmax"): [_PA, _PC, *_FEW16],
    (1, 1_000_003, BF16, "softmax"): [_PA, *_FEW16],
    (64, 1_000_000, BF16, "softmax"): [_persist(2, 0, 16, 256, 2, 12, edges=False)],
    (64, 1_000_003, F16, "softmax"): [_persist(1, 0, 16, 256, 2, 12),
                                      _persist(1, 0, 16, 512, 1, 12)],
    (64, 1_000_003, BF16, "log_softmax"): [_persist(2, 1, 16, 256, 2, 12),
                                           _persist(2, 1, 16, 512, 1, 12)],
    (64, 1_000_003, BF16, "softmax_backward"): _PBW,
    (300, 200_003, BF16, "softmax_backward"): _PBW,
    (64, 500_009, BF16, "softmax_backward"): _PBW,
    (7, 500_009, BF16, "softmax_backward"): [_PBW[2], _small(2, B, 2, 256, 4)],
    (64, 1_000_003, F32, "softmax"): _PF,
    (300, 200_003, F32, "softmax"): _PF,
    (7, 1_000_003, F32, "softmax"): [_PF[2], _small(0, 0, 4, 256, 4)],
    (64, 1_000_003, F32, "softmax_backward"): _PFB,
    (300, 200_003, F32, "softmax_backward"): _PFB,
    (4096, 50257, BF16, "softmax"): [],
    (4096, 50257, F32, "softmax"): [],
}

# s10-soft16: the chooser's picks for the 16-bit rows of 200k-1M (and fp32 rows of 1M), with
# ncu of the ticket kernel in softmax_routes_dev.sh (set softprofile). Session 10's
# softmax_meet (ticket chunks meeting through slots, L2 prefetches) lost or tied everywhere
# and was removed; commit 3235936 on branch s10-soft16 has it (set softmeet). Session 11's
# softmax_pipe (a cluster per row walking rows, two stages) lost everywhere and was removed;
# commit 0a73c35 on branch s11-soft has it and the ends sweep around 50/50 (set softpipe).
SOFTPROFILE: dict[tuple[int, int, np.dtype, str], list] = {
    (rows, cols, dtype, "softmax"): [] for rows, cols, dtype in (
        (64, 1_000_003, BF16), (64, 1_000_003, F16), (8, 1_000_003, BF16),
        (300, 200_003, BF16), (1000, 200_003, BF16), (64, 500_009, BF16),
        (1000, 500_009, BF16), (64, 1_000_003, F32), (64, 1_000_000, F32))}



def _ends(rows: int, cols: int, dtype: np.dtype, op: int = 0) -> list:
    """s10-softends: the chooser's ticket chunks with the rows at the launch's two ends in
    smaller chunks (softmax_ends): split 2 with the ends at 50-200% of a residency, head
    or tail alone; splits 4 and 8; every row in chunks of half size (head 10000%)."""
    pick = dataclasses.replace(_pick(rows, cols, dtype, op), persist=0)
    shapes = [(2, 100, 100), (2, 200, 200), (2, 50, 50), (2, 100, 0), (2, 0, 100),
              (2, 200, 100), (4, 100, 100), (4, 200, 200), (8, 100, 100), (2, 10000, 0)]
    return [dataclasses.replace(pick, ends=e, ends_head=h, ends_tail=t) for e, h, t in shapes
            if pick.kind == "ticket" and pick.items % e == 0]


SOFTENDS: dict[tuple[int, int, np.dtype, str], list] = {
    (rows, cols, dtype, name): _ends(rows, cols, dtype, OPS[name]) for rows, cols, dtype, name in (
        (64, 1_000_003, BF16, "softmax"), (64, 1_000_003, F16, "softmax"),
        (64, 1_000_003, BF16, "log_softmax"), (8, 1_000_003, BF16, "softmax"),
        (300, 200_003, BF16, "softmax"), (300, 200_003, F16, "softmax"),
        (1000, 200_003, BF16, "softmax"), (64, 200_003, BF16, "softmax"),
        (64, 500_009, BF16, "softmax"), (64, 1_000_000, BF16, "softmax"),
        (1024, 131072, BF16, "softmax"), (64, 1_000_003, F32, "softmax"),
        (8, 1_000_003, F32, "softmax"))}


def _smem(rows: int, cols: int, op: int, *smem: int) -> list:
    """The chooser's pick for float32 rows of ``cols`` with other shared-memory shares."""
    pick = plan.choose_variant(cols, F32, op, rows=rows)
    return [dataclasses.replace(pick, smem_items=s) for s in smem]


# session 13 (lead): fp32 rows with edges, against the shared-memory shares whose kernels
# ptxas (NVRTC 13.0, the GPU machine's; 13.5 too) builds without spills: the ticket pick
# (smem 10) spills 32 bytes and writes 7% more to L2 (ncu, H100) at 64x1000003; the aligned
# twins (no edges) for reference
S13EDGES: dict[tuple[int, int, np.dtype, str], list] = {
    (64, 1_000_003, F32, "softmax"): _smem(64, 1_000_003, 0, 5, 6),
    (64, 1_000_004, F32, "softmax"): [],
    (1024, 131_071, F32, "softmax"): _smem(1024, 131_071, 0, 18, 20),
    (1024, 131_072, F32, "softmax"): [],
    (300, 200_003, F32, "softmax"): _smem(300, 200_003, 0, 13, 14),
    (300, 200_004, F32, "softmax"): [],
    (4096, 50_257, F32, "softmax"): _smem(4096, 50_257, 0, 10, 14, 15),
    (4096, 50_260, F32, "softmax"): [],
}

# session 14 (s14-soft): issue 17's odd row lengths at every row count, the chooser's pick
# against the other forms the plan offers: ticket chunks of the long-rows shape with and
# without the launch's ends in half chunks, half-size ticket chunks, CTAs of 256 threads four
# per SM, the few-rows chunks (512 threads, registers only, two per SM), the persistent
# chunks, clusters of the pick's shape; mid-length rows (32001, 50257) also in the few-rows
# chunks and as two half chunks (ticket) or a 2-CTA cluster of half the pick
S14_ROWS = (1, 8, 32, 64, 100, 132, 200, 264, 300, 500)
S14_ROWS_1M = (1, 8, 32, 64, 132, 264)


def _s14(rows: int, cols: int, dtype: np.dtype, op: int) -> list:
    """The forms to time against the chooser's pick for ``rows`` x ``cols`` (odd lengths)."""
    dt = plan.dtype_code(dtype)
    most = plan.HELD // ((2 if op >= B else 1) * (16 // dtype.itemsize))
    # the many-rows pick, the few-rows chunks (not one pass: the chooser's)
    found = [plan.choose_variant(cols, dtype, op),
             dataclasses.replace(_small(dt, op, most, 512, 2), one_pass=False)]
    if cols < 65536:  # mid rows: the pick in two half chunks or a 2-CTA cluster of halves
        pick = plan.choose_variant(cols, dtype, op)
        items, smem = pick.items // 2, pick.smem_items // 2
        if pick.kind == "rows" and pick.group == pick.threads and items >= 2:
            found += [V("ticket", dt, op, pick.vec, items, pick.threads, pick.threads,
                        min_blocks=pick.min_blocks, smem_items=smem, edges=True,
                        one_pass=pick.one_pass),
                      V("cluster", dt, op, pick.vec, items, pick.threads, pick.threads, 2,
                        pick.min_blocks, smem, True, pick.one_pass)]
        return found
    if dt and op < B:  # 16-bit forward: the _PAIRED16 chunks, with ends, halves, 256 x 4/SM
        ticket = _one(_ticket(dt, op, 16, 512, 2, 12))
        found += [ticket, dataclasses.replace(ticket, ends=2, ends_head=50, ends_tail=50),
                  _one(_ticket(dt, op, 8, 512, 2, 4)), _one(_ticket(dt, op, 16, 256, 4, 12))]
    elif dt:  # 16-bit backward: persistent (the pick), its ticket form, the wide ticket
        found += [_persist(dt, op, 8, 512, 1, 6, 1), _ticket(dt, op, 8, 512, 1, 6),
                  _ticket(dt, op, 16, 512, 1, 12), _persist(dt, op, 8, 256, 2, 6, 1)]
    elif op < B:  # fp32 forward: persistent, wide ticket, clusters of 4 (rows of 200003)
        found += [_persist(0, op, 16, 512, 1, 12, 1), _ticket(0, op, 32, 512, 1, 6),
                  _ticket(0, op, 16, 512, 1, 8)]
        if cols <= 262144:
            found.append(V("cluster", 0, op, 4, 32, 512, 512, 4, 1, 20, True))
    else:  # fp32 backward: wide ticket, persistent, clusters of 8 (rows of 200003)
        found += [_ticket(0, op, 16, 512, 1, 4), _persist(0, op, 8, 512, 1, 6, 1)]
        if cols <= 262144:
            found.append(V("cluster", 0, op, 4, 16, 512, 512, 8, 1, 4, True))
    return found


S14SOFT: dict[tuple[int, int, np.dtype, str], list] = {
    (rows, cols, dtype, name): _s14(rows, cols, dtype, OPS[name])
    for cols in (200_003, 50_257, 32_001, 1_000_003) for dtype in (BF16, F32)
    for name in ("softmax", "softmax_backward")
    for rows in (S14_ROWS_1M if cols > 500_000 else S14_ROWS)}
S14SOFT.update({(64, 200_003, BF16, "log_softmax"): _s14(64, 200_003, BF16, plan.LOG_SOFTMAX),
                (300, 200_003, BF16, "log_softmax"): _s14(300, 200_003, BF16, plan.LOG_SOFTMAX),
                (64, 50_257, F32, "log_softmax"): _s14(64, 50_257, F32, plan.LOG_SOFTMAX)})



def _check(rows: int, cols: int, dtype: np.dtype, op: int, *more: Any) -> list:
    """s14-soft's second run: the chooser's pick (first, as routes() adds it) against the
    pick before the session (``more``, forced), and the many-rows pick."""
    return [*more, plan.choose_variant(cols, dtype, op)]


LS, LOG1M = plan.LOG_SOFTMAX, plan.choose_variant(1_000_003, F32, plan.LOG_SOFTMAX)
_OLD_F = [_persist(0, 0, 16, 512, 1, 12, 1), V("cluster", 0, 0, 4, 32, 512, 512, 4, 1, 20, True)]
_OLD_B = [V("cluster", 0, B, 4, 16, 512, 512, 8, 1, 4, True)]
_T16 = _one(_ticket(2, 0, 16, 512, 2, 12))
_P16B = _persist(2, B, 8, 512, 1, 6, 1)
# s14-soft's second run: the new rules at row counts and lengths the sweep did not time
# (fp32 rows of 131073-262144 and their neighbours, mid rows of 12001-40000 in few rows,
# one-wave 16-bit launches), against the picks before; log_softmax and log_softmax backward
# in the wide ticket chunks where they keep their clusters (a lead, not a rule)
S14CHECK: dict[tuple[int, int, np.dtype, str], list] = {
    **{(r, c, F32, "softmax"): _OLD_F for r, c in (
        (16, 200_003), (48, 200_003), (64, 150_003), (300, 150_003), (300, 250_007))},
    (64, 300_001, F32, "softmax"): [_ticket(0, 0, 32, 512, 1, 6)],
    (300, 300_001, F32, "softmax"): [_ticket(0, 0, 32, 512, 1, 6)],
    **{(r, c, F32, "softmax_backward"): _OLD_B for r, c in (
        (16, 200_003), (300, 150_003), (64, 250_007))},
    (64, 100_003, F32, "softmax_backward"): [_ticket(0, B, 16, 512, 1, 4)],
    (300, 100_003, F32, "softmax_backward"): [_ticket(0, B, 16, 512, 1, 4)],
    (300, 50_257, F32, "softmax_backward"): [_ticket(0, B, 16, 512, 1, 4)],
    (64, 200_003, F32, "log_softmax"): [LOG1M],
    (300, 200_003, F32, "log_softmax"): [LOG1M],
    (64, 200_003, F32, "log_softmax_backward"): [_ticket(0, LB, 16, 512, 1, 4)],
    (300, 200_003, F32, "log_softmax_backward"): [_ticket(0, LB, 16, 512, 1, 4)],
    **{(r, c, dt, name): _check(r, c, dt, OPS[name]) for r, c, dt, name in (
        (8, 20_000, F32, "softmax"), (64, 20_000, F32, "softmax"), (128, 20_000, F32, "softmax"),
        (8, 12_001, F32, "softmax_backward"), (64, 12_001, F32, "softmax_backward"),
        (128, 12_001, F32, "softmax_backward"), (32, 40_000, BF16, "softmax"),
        (85, 40_000, BF16, "softmax"), (16, 20_000, BF16, "softmax_backward"),
        (85, 20_000, BF16, "softmax_backward"), (100, 32_001, F32, "softmax"),
        (48, 50_257, F32, "log_softmax_backward"), (48, 50_257, BF16, "log_softmax"))},
    **{(r, c, dt, name): [_T16 if dt == BF16 and name == "softmax" else
                          _one(_ticket(plan.dtype_code(dt), OPS[name], 16, 512, 2, 12))]
       for r, c, dt, name in (
        (8, 1_000_003, BF16, "softmax"), (16, 200_003, BF16, "softmax"),
        (36, 200_003, BF16, "softmax"), (8, 500_009, BF16, "softmax"),
        (16, 500_009, BF16, "softmax"), (16, 200_003, F16, "softmax"),
        (32, 200_003, BF16, "log_softmax"), (8, 1_000_003, F16, "softmax"))},
    **{(r, c, dt, "softmax_backward"): [_P16B if dt == BF16 else _persist(1, B, 8, 512, 1, 6, 1)]
       for r, c, dt in ((8, 1_000_003, BF16), (4, 1_000_003, BF16), (32, 200_003, BF16),
                        (24, 200_003, BF16), (16, 500_009, BF16), (8, 1_000_003, F16))},
}


def _s15w(rows: int, cols: int, dtype: np.dtype) -> list:
    """s15-soft1w (issue 17, the one-wave 16-bit softmax): softmax_ticket's TUNE knobs
    (Variant.tune: 1 the one-pass reduction's shared-memory vectors first, 3 also 1 / sum
    once a thread, 7 also chunks of equal length) on the _PAIRED16 ticket chunks (512 x 16,
    12 in shared memory; plain first) and on its half chunks (512 x 8, 4; plain and 7), and
    for rows of one CTA the few-rows chunks (the pick, two passes) with 1 / sum once and
    equal chunks (6)."""
    dt = plan.dtype_code(dtype)
    ticket = _one(_ticket(dt, 0, 16, 512, 2, 12))
    half = _one(_ticket(dt, 0, 8, 512, 2, 4))
    found = [ticket, *(dataclasses.replace(ticket, tune=t) for t in (1, 3, 7)), half,
             dataclasses.replace(half, tune=7)]
    if cols < 65536:
        found.append(dataclasses.replace(_small(dt, 0, 4, 512, 2), one_pass=False, tune=6))
    return found


S15W: dict[tuple[int, int, np.dtype, str], list] = {
    **{(rows, cols, dtype, "softmax"): _s15w(rows, cols, dtype) for dtype in (BF16, F16)
       for rows, cols in ((16, 200_003), (32, 200_003), (64, 200_003), (100, 200_003),
                          (132, 200_003), (8, 1_000_003), (32, 1_000_003), (64, 50_257))},
    # the control: the pick (and the tuned chunks 3, 7) at 300 rows
    **{(300, 200_003, dtype, "softmax"): _s15w(300, 200_003, dtype)[2:4]
       for dtype in (BF16, F16)},
}

SETS = {"issue17": ROUTES, "follow-up": FOLLOW_UP, "edge-keep": EDGE_KEEP, "ticket": TICKET,
        "softbf16": SOFTBF16, "softlong16": SOFTLONG16, "softpersist": SOFTPERSIST,
        "softprofile": SOFTPROFILE, "softends": SOFTENDS, "s13edges": S13EDGES,
        "s14soft": S14SOFT, "s14check": S14CHECK, "s15w": S15W}



@contextlib.contextmanager
def source_of(sm: Any, path: str | None) -> Iterator[None]:
    """Compile and look up kernels from ``path`` (None: softmax.cu) inside the block."""
    if path is None:
        yield
        return
    saved = sm._source, sm._kernels
    sm._source, sm._kernels = Path(path).read_text(), {}
    try:
        yield
    finally:
        sm._source, sm._kernels = saved


def routes(timer: Timer, copy: float, torch: Any, sources: dict[str, str],
           routes_set: str = "issue17") -> list[dict]:
    """Each forced variant of ROUTES (the chooser's first): error against torch in float64
    (poisoned output), % of copy. ``sources``: the source of (name, variant) entries."""
    sm = importlib.import_module("gpurt.kernels.softmax")
    found = []
    chosen = SETS[routes_set]
    for (rows, cols, dtype, name), variants in chosen.items():
        op = OPS[name]
        made = make_inputs(op, rows, cols, dtype, torch)
        arrays = [gpurt.asarray(m) for m in made]
        out = gpurt.empty((rows, cols), dtype)
        want = _torch_reference(op, made, torch)
        view = plan.RowsView(rows, cols)
        nbytes = (len(made) + 1) * rows * cols * dtype.itemsize
        torch_pct = 100 * nbytes / timer.ms(torch_call(op, made, torch)) / 1e6 / copy
        pick = plan.choose_variant(cols, dtype, op, rows=rows)
        if pick.ends or pick.persist:  # as softmax._plan launches it
            pick = pick.for_launch(rows, cols, sm.resident_ctas(pick, gpurt.current_device()))
        for entry in [pick, *(v for v in dict.fromkeys(variants) if v != pick)]:
            if isinstance(entry, tuple) and entry[0] not in sources:
                continue
            path, v = (sources[entry[0]], entry[1]) if isinstance(entry, tuple) else (None, entry)
            label = (f"{entry[0]} " if path else "") + v.names()[0]
            try:
                with source_of(sm, path):
                    call = sm.plan_variant(v, arrays, out, view, gpurt.current_device())
                torch.from_dlpack(out).fill_(12345)
                call.launch(arrays[0], arrays[-1], out, timer.handle)
                torch.cuda.synchronize()
                got = torch.from_dlpack(out).double()
                err = ((got - want).norm() / want.norm()).item()
                ms = timer.ms(lambda c=call, a=arrays, o=out: c.launch(a[0], a[-1], o,
                                                                        timer.handle))
            except Exception as exc:  # the other variants still run
                found.append({"case": f"{rows}x{cols} {dtype.name} {name}", "variant": label,
                              "failed": f"{type(exc).__name__}: {exc}"})
                print(json.dumps(found[-1]), flush=True)
                continue
            pct = 100 * nbytes / ms / 1e6 / copy
            found.append({"case": f"{rows}x{cols} {dtype.name} {name}", "variant": label,
                          "err": err, "ms": ms, "pct_copy": round(pct, 1),
                          "torch_pct_copy": round(torch_pct, 1)})
            print(json.dumps(found[-1]), flush=True)
        del made, arrays, out, want
    return found


def report(found: list[dict], copy: float, path: str | None, **extra: Any) -> None:
    """Print routes()' rows (% of copy; of the same-size copy where a row has it) and write
    them, with ``extra``, as JSON to ``path``."""
    print(f"copy {copy:.0f} GB/s on {gpurt.get_device_name()}")
    for r in found:
        same = f" {r['pct_samecopy']:>6}" if "pct_samecopy" in r else ""
        print(f"{r['case']:>36} {r['variant']:>56} "
              + (f"err {r['err']:.1e} {r['pct_copy']:>6}{same}" if "err" in r else r["failed"]))
    if path:
        with open(path, "w") as f:
            json.dump({"device": gpurt.get_device_name(), "copy_GBps": copy, **extra,
                       "routes": found}, f, indent=1)


def _compile(variant: Any, arch: str, path: str | None = None) -> None:
    sm = importlib.import_module("gpurt.kernels.softmax")
    with source_of(sm, path):
        sm.compile_variant(variant, arch)


def _bench_program(arch: str) -> None:
    """bench_softmax.py's one NVRTC program of the chooser's picks, into the disk cache."""
    bench = importlib.import_module("bench_softmax")
    importlib.import_module("gpurt.kernels.softmax").precompile(
        (plan.choose_variant(cols, dtype, OPS[name], rows=rows)
         for rows, cols, dtype, name, _ in bench.CASES), arch)


def warm(routes_set: str, sources: dict[str, str]) -> int:
    """Compile every variant of the set (and the chooser's picks; (name, variant) entries
    from ``sources``) and tests/test_softmax_long.py's ticket variants into the disk kernel cache,
    one process per CPU; returns how many."""
    variants: list = []
    for (rows, cols, dtype, name), chosen in SETS[routes_set].items():
        variants.append(plan.choose_variant(cols, dtype, OPS[name], rows=rows))
        variants += [v if not isinstance(v, tuple) else (v[1], sources[v[0]])
                     for v in chosen if not isinstance(v, tuple) or v[0] in sources]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    tests = importlib.import_module("test_softmax_long")
    persist = importlib.import_module("test_softmax_persist")
    if routes_set in ("softbf16", "softlong16", "softpersist"):
        variants += tests.forward16_variants()
    if routes_set == "s15w":
        variants += tests.tuned_variants()
    if routes_set == "softends":
        ends = importlib.import_module("test_softmax_ends")
        variants += ends.ends_variants() + ends.ends_variants(long=True)
    elif routes_set in ("softpersist", "softprofile"):  # the picks its tests run (the .sh)
        if routes_set == "softpersist":
            variants += persist.persist_variants() + persist.persist_variants(long=True)
        variants += [plan.choose_variant(1_000_003, dtype, op, rows=rows)
                     for dtype in (F32, BF16) for op in range(4) for rows in (2, 4)]
        variants += [plan.choose_variant(cols, BF16, plan.SOFTMAX)
                     for cols in (7, 1000, 4099, 32001, 50257, 131071)]
    elif routes_set not in ("softbf16", "s14soft", "s14check", "s15w"):
        variants += tests.ticket_variants()
    variants += [plan.choose_variant(1_000_003, F32, op, tickets=False) for op in range(4)]
    # one job per kernel and source (softmax_ends variants differ in runtime arguments only)
    jobs = list({(v.names(), path): (v, path) for v, path in
                 (e if isinstance(e, tuple) else (e, None) for e in variants)}.values())
    context = multiprocessing.get_context("spawn")  # no CUDA context in the workers
    arch = gpurt.get_arch()
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=context) as pool:
        bench = (pool.submit(_bench_program, arch) if routes_set in ("softprofile", "softends")
                 else None)
        list(pool.map(_compile, [j[0] for j in jobs], [arch] * len(jobs), [j[1] for j in jobs]))
        if bench is not None:
            bench.result()
    return len(jobs)


def _torch_reference(op: int, made: list, torch: object) -> object:
    x = made[0].double()
    if op == plan.SOFTMAX:
        return torch.softmax(x, -1)
    if op == plan.LOG_SOFTMAX:
        return torch.log_softmax(x, -1)
    dy = made[1].double()
    if op == plan.SOFTMAX_BACKWARD:
        return x * (dy - (dy * x).sum(-1, keepdim=True))
    return dy - torch.exp(x) * dy.sum(-1, keepdim=True)


def shifted_empty(shape: tuple[int, int], dtype: np.dtype) -> gpurt.Array:
    rows, cols = shape
    return gpurt.empty(rows * cols + 1, dtype=dtype)[1:].reshape(rows, cols)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--ways", default="edges,scalar,aligned")
    parser.add_argument("--cases", type=int, default=len(CASES))
    parser.add_argument("--routes", action="store_true")
    parser.add_argument("--old", help="softmax.cu before a change, for the OLD routes")
    parser.add_argument("--set", default="issue17", choices=tuple(SETS))
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()
    sources = {OLD: args.old} if args.old else {}
    if args.warm:
        print(f"compiled {warm(args.set, sources)} variants", flush=True)
    ways = args.ways.split(",")
    torch = peer("torch")
    handle = int(torch.cuda.current_stream().cuda_stream)
    timer = Timer(handle, repeat=30)
    copy = copy_gbps(timer)
    if args.routes:
        report(routes(timer, copy, torch, sources, args.set), copy, args.json)
        return
    results = []
    for rows, cols, dtype, name in CASES[:args.cases]:
        op = OPS[name]
        row = {"shape": f"{rows}x{cols}", "dtype": dtype.name, "op": name}
        for way in ways:
            length = cols // 8 * 8 if way == "aligned" else cols
            made = make_inputs(op, rows, length, dtype, torch)
            arrays = [gpurt.asarray(m) for m in made]
            out = (shifted_empty if way == "scalar" else gpurt.empty)((rows, length), dtype)
            nbytes = (len(made) + 1) * rows * length * dtype.itemsize
            gbps = nbytes / timer.ms(gpurt_call(op, arrays, out, handle)) / 1e6
            row[way] = round(100 * gbps / copy, 1)
            del made, arrays, out
        row["variant"] = plan.choose_variant(cols, dtype, op).names()[0]
        results.append(row)
        print(json.dumps(row), flush=True)
    print(f"copy {copy:.0f} GB/s on {gpurt.get_device_name()}; % of copy:")
    print(f"{'shape':>14} {'dtype':>8} {'op':>21} " + " ".join(f"{w:>8}" for w in ways))
    for r in results:
        print(f"{r['shape']:>14} {r['dtype']:>8} {r['op']:>21} "
              + " ".join(f"{r[w]:>8}" for w in ways))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gpurt.get_device_name(), "copy_GBps": copy, "rows": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
