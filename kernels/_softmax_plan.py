"""Planning for the softmax kernels (softmax.cu): the variants, the choice among them, and
the shape checks. Pure Python (no driver, no gpurt import), so it is tested on any machine."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "Variant",
    "RowsView",
    "choose_variant",
    "widest_vec",
    "row_access",
    "dtype_code",
    "rows_view",
    "SOFTMAX",
    "LOG_SOFTMAX",
    "SOFTMAX_BACKWARD",
    "LOG_SOFTMAX_BACKWARD",
]

SOURCE_PATH = Path(__file__).with_name("softmax.cu")
ENDS_PATH = Path(__file__).with_name("softmax_ends.cu")  # appended: uses softmax.cu's helpers


def source_text() -> str:
    """The CUDA source of every variant: softmax.cu, then softmax_ends.cu (one program, so
    that the runtime, the prebuilt kernels and the benchmarks build the same text)."""
    return SOURCE_PATH.read_text() + "\n" + ENDS_PATH.read_text()


# Codes shared with softmax.cu: the DT and OP template parameters.
DTYPE_CODES = {
    np.dtype(np.float32): 0,
    np.dtype(np.float16): 1,
    np.dtype(ml_dtypes.bfloat16): 2,
}
SOFTMAX, LOG_SOFTMAX, SOFTMAX_BACKWARD, LOG_SOFTMAX_BACKWARD = range(4)

# Tuning, from the measurements in benchmarks/notes_softmax.md. A thread holds its vectors in
# registers: at most HELD values (all inputs together; the compiler keeps 16-bit values
# widened to float32, so they count as much as float32 ones) in CTAs of up to 1024 threads.
# Vectors per thread (ITEMS_BY_VECTORS) grow with the row: many small CTAs for short rows,
# up to 1024 threads x 8 vectors (128 KiB of float32) for one CTA, then (sm_90) the
# LONG_ROWS shapes (more registers a thread in CTAs of 512, shared memory, clusters), then
# chunks of them meeting through a ticket (sm_90), or the split.
HELD = 32
ITEMS_BY_VECTORS = ((256, 2), (2048, 4))  # (up to this many vectors a row, items); else 8
LARGE_ITEMS = 8
GROUP_ROWS_THREADS = 128  # CTA size when lane groups of <= 32 share it
MAX_THREADS = 1024


@dataclasses.dataclass(frozen=True)
class LongRows:
    """A CTA shape for rows longer than one CTA of MAX_THREADS holds in registers (sm_90,
    16-byte vectors): ``threads`` per CTA, ``blocks`` CTAs per multiprocessor (which sets the
    registers a thread may use); a thread holds up to ``held`` values (all inputs together)
    when all are in registers, else ``keep`` in registers and the rest in shared memory, at
    most ``smem`` bytes per CTA; ``alone``: also for rows that one such CTA holds (else only
    for a cluster of them); ``clusters``: also for rows that need a cluster (else only alone);
    ``min_items``: only where a thread holds at least this many vectors (shorter rows keep
    the shapes after it); ``fills``: (the first shape of an operation) also for rows that
    need one CTA of MAX_THREADS in registers, in registers only; ``tickets_past``: rows
    longer than one such CTA holds take ticket chunks of it (not a cluster, nor the shapes
    after it); ``one_pass``: its ticket chunks reduce in one pass (16-bit forward);
    ``persist``: its ticket chunks in a persistent grid (the Variant.persist mode),
    ``persist_items`` vectors a thread of which ``persist_smem`` in shared memory (two
    stages of them): for rows that would take a cluster of ``persist_ctas`` of its CTAs
    in launches of at least TICKET_FEW_CTAS and fewer than TICKET_MANY_CTAS chunks, or
    (empty) wherever it takes ticket chunks; ``ticket_ctas``: rows that would take a cluster
    of this many of its CTAs take its ticket chunks instead (few: the small ones);
    ``ends`` (with ``ends_head``, ``ends_tail``): its ticket chunks (not persistent) with the
    rows at the launch's two ends in smaller chunks (the Variant fields), ``tune`` their
    TUNE bits (TUNE_ORDER, TUNE_PRE: Variant.tune); ``edges_smem``:
    (kind, items, smem_items) for rows with edges, whose kernels need other shares of shared
    memory than rows without (ptxas spills the defaults' registers). Rows
    longer than PORTABLE_CLUSTER such CTAs hold take chunks of the first shape of their
    operation that meet through a ticket (``ticket`` variants)."""

    threads: int
    blocks: int
    held: int
    keep: int
    smem: int
    alone: bool = True
    clusters: bool = True
    min_items: int = 1
    fills: bool = False
    tickets_past: bool = False
    one_pass: bool = False
    persist: int = 0
    persist_items: int = 0
    persist_smem: int = 0
    persist_ctas: tuple[int, ...] = ()
    ticket_ctas: tuple[int, ...] = ()
    ends: int = 0
    ends_head: int = 100
    ends_tail: int = 100
    tune: int = 0
    edges_smem: tuple[tuple[str, int, int], ...] = ()

    def with_edges(self, variant: Variant) -> Variant:
        """``variant`` (of this shape) with the shared-memory share ``edges_smem`` gives
        rows with edges of its kind and items (not persistent: those keep two stages)."""
        if not variant.edges or variant.persist:
            return variant
        for kind, items, smem in self.edges_smem:
            if variant.kind == kind and variant.items == items:
                return dataclasses.replace(variant, smem_items=smem)
        return variant


# Measured in notes_softmax.md (runs 5 and 6, % of copy on the H200).
# fp32 131072: 90.6 (run 4: 86.1). Rows of 1M (s7-softlong, H100, 64x1000003) in ticket
# chunks of this shape: 84.2% of copy, where non-portable clusters of 16 of it read 68.5 and
# the split 64.2 (log_softmax 87.5 / 68.2 / 64.2; aligned 64x1000000 85.3 / 74.8)
_WIDE = LongRows(512, 1, 88, 88, 128 * 1024, alone=False)
# fp32 softmax rows that the wide shape holds in clusters of 4 (131073-262144 elements): its
# CTAs in a persistent grid, two stages of 16 vectors a thread with 12 in shared memory
# (s8-softpersist, H100, 300x200003: 85.1% of copy where the clusters of 4 read 79.4; at
# 64x1000003 the same chunks read 83.6 against 85.2 for the wide ticket chunks kept there), in
# launches of fewer than TICKET_MANY_CTAS wide ticket chunks; longer launches (and rows of
# clusters of 8, 262145-524288 elements) take its ticket chunks (s14-soft, H100, % of copy,
# ticket chunks against the persistent ones: 200003 at 500 / 300 / 264 / 200 rows 91.1 /
# 87.1, 88.5 / 85.5, 87.7 / 85.3, 85.5 / 83.7, 300x250007 90.1 / 87.2, 300x150003 86.2 /
# 86.5; shorter launches lose: 132 rows 81.2 / 81.9, 100 77.9 / 78.9, 64 73.4 / 73.4,
# 48 64.1 / 69.3, 16 44.6 / 49.6, 64x150003 64.7 / 68.4; clusters of 8 against the ticket
# chunks: 300x300001 67.3 / 91.8, 64 rows 58.1 / 75.1); few rows take the small chunks (8 rows
# of 200003 37.4 against 21.9 for the clusters of 4). Rows that fill the clusters exactly
# (262144, 524288 elements) are unmeasured with the ticket chunks.
# Rows with edges (session 13, H100, % of copy, two rounds, against the defaults' 10 of 32
# vectors in shared memory, which NVRTC 13.0's ptxas builds with 24-32 bytes of spills that
# write 7% more to L2 (ncu): ticket chunks with 6 (no spills) 64x1000003 89.0 / 89.1 against
# 84.1 / 84.2 (aligned 64x1000004: 87.4); clusters of 2 with 20, 1024x131071 91.2 / 91.2
# against 85.4 / 85.6 (18: 90.5); clusters of 8 take 20 unmeasured (no spills either);
# the persistent chunks' 12 of 16 stay (13, 14: within 0.5)
_WIDE_SOFTMAX = dataclasses.replace(_WIDE, persist=1, persist_items=16, persist_smem=12,
                                    persist_ctas=(4,), ticket_ctas=(4, 8),
                                    edges_smem=(("ticket", 32, 6), ("cluster", 32, 20)))
# fp32 log_softmax rows of clusters of 4: the wide ticket chunks (s14-soft, H100, 200003:
# 300 rows 89.5 / 80.6% of copy, 64 rows 72.4 / 62.3); clusters of 8 unmeasured, kept
_WIDE_LOG = dataclasses.replace(_WIDE, ticket_ctas=(4,))
# 131072: 98.7 (92.2); rows of 1M in ticket chunks (s7-softlong, H100, 64x1000003): 92.3%
# of copy where the split reads 60.5 (log_softmax backward 95.2 / 74.7)
# Rows that it holds in clusters of 8 (131073-262144 elements): its ticket chunks (s14-soft,
# H100, % of copy against the clusters of 8, softmax backward 200003: 64 rows 87.3 / 71.7,
# 100 91.8 / 74.9, 300 97.1 / 85.3, 500 98.0 / 87.2, 32 rows 80.6 / 63.8 (the persistent
# chunks of 512 x 8: 82.4), 300x150003 96.5 / 73.7, 64x250007 88.8 / 78.6; log_softmax
# backward 64x200003 88.4 / 75.7, 300 rows 97.9 / 87.9); few rows the small chunks (8 rows
# 54.3 / 42.4). Clusters of 4 (100003: 64 rows 77.5 / 67.8, 300 rows 93.8 / 87.2) keep
# theirs: rows that fill them (bench_softmax's 1024x131072, ~99%) are unmeasured as tickets.
_WIDE_BACKWARD = LongRows(512, 1, 96, 96, 64 * 1024, alone=False, ticket_ctas=(8,))
# run 4's shape, alone for 32768 backward: 101.6; bf16 rows of 1M in ticket chunks of it
# (s7-softlong, H100, 64x1000003): 67.2% of copy, the split 59.1
_RUN4 = LongRows(1024, 1, 32, 16, 192 * 1024)
# run 4's shape alone for fp32 forward rows of 32k-64k elements (s5-softrow, H100, 4096x50257):
# softmax 93.7 against 89.1 for the paired shape (2-CTA clusters of 512 threads, two per SM,
# 8 of 16 vectors in shared memory: 93.4 at 65536 on the H200 in run 6, run 4's 91.8), and
# log_softmax 96.8 against 91.1
_RUN4_ALONE = LongRows(1024, 1, 32, 16, 192 * 1024, clusters=False)
# float32 softmax rows with edges: 10 of 16 vectors in shared memory, not 12 (session 13,
# H100, 4096x50257: 96.4 / 96.4% of copy against 93.5 / 93.5, where 12 spills with NVRTC
# 13.0; 14: 96.0; aligned 4096x50260: 96.9)
_RUN4_ALONE_SOFTMAX = dataclasses.replace(_RUN4_ALONE, edges_smem=(("rows", 16, 10),))
# 16-bit backward rows of 32k-64k elements: one CTA of 512 threads (128 registers), 4 of its
# 16 vectors per input in registers: bf16 4096x50257 90.3% of copy on the H200, where run 4's
# shape (a 2-CTA cluster, 3 of 4 in shared memory) read 59.2 (benchmarks/bandwidth_dev.py,
# issue 17); shorter rows (8 vectors a thread) are unmeasured with it and keep run 4's shape;
# bf16 rows of 1M in ticket chunks of it (s7-softlong, H100): 84.7% of copy, the split 57.1.
# Longer rows than it holds take its ticket chunks (s8-softlong16, H100, bf16 300x200003: 84.3
# with chunks of equal length, 88.1 / 84.4 at 1M for the chunks kept here; run 4's shape in
# clusters of 8, the pick before, 59.3; clusters of 4 of this shape 80.8)
_WIDE16_BACKWARD = LongRows(512, 1, 64, 64, 192 * 1024, clusters=False, min_items=16,
                            tickets_past=True)
# 16-bit softmax backward: those ticket chunks in a persistent grid, two stages of 8 vectors
# of each input with 6 in shared memory, the next chunk's loads issued after the current
# one's reduction (s8-softpersist, H100, bf16, % of copy against the ticket chunks above:
# 64x1000003 89.6 / 87.5, 300x200003 89.6 / 86.8, 64x500009 83.9 / 81.7; the loads issued
# before the reduction read 39-60, chunks of 256 threads two per SM 39-58). log_softmax
# backward and fp16 unmeasured with it (fp16: the same code as bf16; log: kept)
_WIDE16_BACKWARD_PERSIST = dataclasses.replace(_WIDE16_BACKWARD, persist=1, persist_items=8,
                                               persist_smem=6)
# 16-bit forward: two CTAs of 512 threads per SM, so that one loads while the other reduces
# (the exps of a 16-bit row are compute-bound phases), each holding 4 of 16 vectors in
# registers and 12 in shared memory (96 KiB), or up to 8 in registers for rows of 16k-32k
# elements (s7-softbf16, H100, % of copy against one CTA of 1024 threads: bf16 4096x50257
# 95.8 / 87.8, fp16 96.5 / 88.4, bf16 log_softmax 97.8 / 95.0; bf16 4096x32001 in
# registers 95.8 / 87.4; bf16 rows of 1M in ticket chunks 77.7 / 67.8). Not in clusters:
# 2-CTA clusters of it read 83.3 at 131072 where run 4's shape reads 83.0. Longer rows take
# its ticket chunks, reducing in one pass (s8-softlong16, H100, % of copy, ticket chunks in
# one pass against run 4's shape in clusters, the pick before: bf16 1024x131072 90.9 / 86.1,
# 300x200003 78.8 / 43.2, 64x200003 60.3 / 33.0, 64x500009 67.6 / 37.2, fp16 68.3 / 37.2;
# one pass against two in the same chunks: +0.7 to +3.1 in all 7 pairs; measured with
# chunks of equal length, which read 2-8 points below the full ones kept at 1M). The rows at
# the launch's two ends in chunks of half size (softmax_ends), as many as fill half the CTAs
# that fit at once at each end (s10-softends, H100, % of copy against the ticket chunks
# alone: bf16 64x1000003 85.6 / 78.3, fp16 85.7 / 79.4, bf16 log_softmax 88.2 / 80.9,
# 300x200003 84.2 / 79.2, fp16 84.5 / 79.9, 1000x200003 90.1 / 87.0, 64x500009 78.5 / 71.2,
# 64x1000000 84.8 / 79.8, 1024x131072 92.6 / 91.7; the ends filling a whole residency, or
# either end alone, gain 0-2 points, chunks of a quarter or every row in half chunks lose).
# Launches of no more chunks than fit at once keep the ticket chunks (_plan: 64x200003 58.2
# against 56.1 for the ends, 8x1000003 53.0 / 53.8).
# Tuned (TUNE_ORDER | TUNE_PRE; session 15, H100, % of copy tuned / untuned: bf16 300x200003
# 86.1 / 84.7, fp16 86.1 / 84.9, log_softmax 87.8 / 86.3, 1000x200003 91.0 / 90.0, 132x200003
# 76.1 / 74.6, 100x200003 69.7 / 68.9, 32x1000003 82.1 / 80.0, 64x1000003 88.1 / 86.7,
# 64x500009 80.5 / 78.3).
_PAIRED16 = LongRows(512, 2, 64, 32, 96 * 1024, clusters=False, fills=True, tickets_past=True,
                     one_pass=True, ends=2, ends_head=50, ends_tail=50, tune=3)
# (op, storage bytes) -> the shapes to try, in order; then registers only.
LONG_ROWS = {
    (SOFTMAX, 4): (_WIDE_SOFTMAX, _RUN4_ALONE_SOFTMAX),
    # 131072: 88.1 (run 4: 82.2). Issue 17 (H100, rows of 50257): the paired shape 91.1,
    # run 4's alone 96.8, the registers-only 2-CTA clusters of 1024 threads 59.9
    (LOG_SOFTMAX, 4): (_WIDE_LOG, _RUN4_ALONE),
    (SOFTMAX_BACKWARD, 4): (_WIDE_BACKWARD, _RUN4),
    # issue 17 (H100, 50257): 100.0 with the wide backward shape, 86.0 with run 4's alone
    (LOG_SOFTMAX_BACKWARD, 4): (_WIDE_BACKWARD, _RUN4),
    (SOFTMAX, 2): (_PAIRED16, _RUN4),
    (LOG_SOFTMAX, 2): (_PAIRED16, _RUN4),
    (SOFTMAX_BACKWARD, 2): (_WIDE16_BACKWARD_PERSIST, _RUN4),
    (LOG_SOFTMAX_BACKWARD, 2): (_WIDE16_BACKWARD, _RUN4),
}
# Clusters of up to PORTABLE_CLUSTER CTAs run on any sm_90 device; MAX_CLUSTER is a
# non-portable size (allowed per kernel: Variant.non_portable; H100 and H200 have graphics
# processing clusters of 16 or more SMs) that only forced variants use: rows longer than
# clusters of PORTABLE_CLUSTER hold take ticket chunks (s7-softlong: 84.2 against 68.5% of
# copy for clusters of 16 at 64x1000003 on an H100).
PORTABLE_CLUSTER = 8
MAX_CLUSTER = 16
# Launches of fewer ticket chunks of the LONG_ROWS shape than this (few rows: most SMs idle)
# take chunks of the split's CTA shape instead, two per SM, registers only (s7-softlong, H100,
# fp32 softmax 2x1000003: 36.6% of copy against 25.0 for the wide chunks, 32 of them, and
# 31.1 for the split; 8x1000003, 128 wide chunks: 60.9 wide, 58.4 small, 51.4 split)
TICKET_FEW_CTAS = 64
# Launches of rows that one CTA or a cluster holds (sm_90, 16-byte vectors) whose rows in
# the split's CTA shape (two per SM, registers only) make at least FEW_ROWS_CHUNKS chunks
# each and no more than FEW_ROWS_CTAS in all (within one residency: 264 on an H100 or H200's
# 132 SMs) take those ticket chunks: one CTA a row would leave SMs idle (s14-soft, H100, % of
# copy against the pick: fp32 rows of 50257 (4 chunks), 64 rows 55.8 / 48.6, 32 rows 37.4 /
# 27.5, backward (7 chunks) 32 rows 55.0 / 41.6; fp32 backward 64x32001 62.3 / 55.4; bf16
# 64x50257 36.4 / 34.0, backward 32 rows 35.6 / 28.1; bf16 backward 64x32001 42.0 / 39.6).
# Fewer chunks a row gain little or lose (fp32 64x20000, 2 chunks, 32.9 / 36.3, 128 rows
# 50.2 / 59.0; bf16 backward 85x20000, 3 chunks, 37.2 / 43.8; fp32 64x32001 44.6 / 43.6),
# and so do more chunks in all (fp32 100x50257 56.8 / 62.7, bf16 backward 64x50257, 448
# chunks, 46.2 / 48.9; fp32 backward 64x50257, 448, gains, 68.2 / 63.1 against its 2-CTA
# clusters, but keeps them). Also fp32 8x200003 37.4 / 21.9 (clusters of 4).
FEW_ROWS_CHUNKS = 4
FEW_ROWS_CTAS = 256
# Launches of at least this many of a shape's ticket chunks take those rather than its
# persistent chunks where both are offered (persist_ctas; about six residencies of one CTA
# per SM on 132 SMs; s14-soft, _WIDE_SOFTMAX's numbers)
TICKET_MANY_CTAS = 768
SPLIT_THREADS = 512
MAX_GRID_X = 2**31 - 1
# Rows of at least this many 16-byte vectors whose length or alignment rules out 16-byte
# accesses of whole rows take them anyway, with scalar edges (row_access); shorter rows gain
# nothing from it and keep the widest access that divides them.
EDGE_MIN_VECTORS = 4
KINDS = ("rows", "cluster", "ticket", "split")
# softmax_ticket's TUNE bits (softmax.cu). The one-wave forms of a 16-bit forward launch take
# ORDER and PRE, and EVEN where the short last chunk of a row would hold under a quarter of a
# chunk (session 15, H100, % of copy, bf16 softmax, TUNE 0 / 3 / 7 on the full chunks:
# 64x200003 57.1 / 59.7 / 64.4, 32x200003 45.9 / 47.4 / 48.9, 16x200003 26.2 / 28.6 / 29.8,
# 8x1000003 52.5 / 54.5 / 52.9, 32x1000003 70.8 / 73.1 / 70.6; the half chunks 0 / 7:
# 32x200003 48.6 / 51.4, 16x200003 33.5 / 35.0, 8x1000003 56.2 / 54.8; fp16 alike: 64x200003
# 58.6 / 60.8 / 65.1; notes_softmax.md v23, v24). A last chunk of 5-10% leaves SMs idle in the
# wave; one of 26-52% does not, and equal chunks lose there.
TUNE_ORDER, TUNE_PRE, TUNE_EVEN = 1, 2, 4
_STORAGE_BYTES = (4, 2, 2)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compiled form of the kernels: how a row is spread over threads.

    ``kind`` is ``rows``, ``cluster``, ``ticket`` or ``split``; ``dtype`` and ``op`` are the
    codes above; each thread handles ``items`` vectors of ``vec`` elements of each input;
    ``group`` threads share a row in a CTA of ``threads`` (``group == threads``: one CTA per
    row); ``cluster`` CTAs share a row; ``ticket`` and ``split``: a row is chunks of one CTA
    each; ``min_blocks`` CTAs per multiprocessor bound the registers;
    the last ``smem_items`` of the ``items`` vectors live in shared memory (16-byte vectors);
    ``edges``: rows may start at any element and have any length (the elements before a
    row's first ``vec``-aligned one and after its last whole vector are single-element edge
    slots), else each row is whole aligned vectors; ``one_pass`` (16-bit forward, not the
    split): each thread's maximum and sum in one pass over its vectors as they land (the
    exps overlap the loads), else a max pass then a sum pass; ``persist`` (``ticket``): a
    grid of as many CTAs as fit at once, each walking chunks with two stages so that the next
    chunk's loads overlap the current one's wait and writes (softmax_persist; twice the
    shared memory): 1 issues them after the current chunk's reduction, 2 before it;
    ``ends`` (``ticket``, not ``persist``): softmax_ends, the rows at the launch's two ends
    in chunks of 1/``ends`` the columns (2, 4 or 8; it divides ``items``): the first rows
    whose small chunks fill ``ends_head`` % of the CTAs that fit at once, and the last ones
    that fill ``ends_tail`` % (:meth:`ends_rows`); ``tune`` (``ticket``, not ``persist``):
    softmax_ticket's TUNE bits (softmax.cu: TUNE_ORDER 1, the one-pass reduction's
    shared-memory vectors first; TUNE_PRE 2, forward, the outputs' 1 / sum once a thread;
    TUNE_EVEN 4, chunks of equal length, not with ``ends``), 0 as before.
    """

    kind: str
    dtype: int
    op: int
    vec: int
    items: int
    group: int
    threads: int
    cluster: int = 1
    min_blocks: int = 1
    smem_items: int = 0
    edges: bool = False
    one_pass: bool = False
    persist: int = 0
    ends: int = 0
    ends_head: int = 100
    ends_tail: int = 100
    tune: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown variant kind {self.kind!r} (one of {KINDS})")
        if self.dtype not in (0, 1, 2) or self.op not in range(4):
            raise ValueError(f"dtype must be 0..2 and op 0..3, got {self.dtype}, {self.op}")
        for name in ("vec", "items", "group", "threads", "cluster"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Variant.{name} must be a power of two, got {value}")
        if not 32 <= self.threads <= 1024:
            raise ValueError(f"Variant.threads must be 32..1024, got {self.threads}")
        if self.group > self.threads or (self.group > 32 and self.threads // self.group > 15):
            raise ValueError(f"Variant.group={self.group} does not fit {self.threads} threads")
        if self.kind != "rows" and self.group != self.threads:
            raise ValueError(f"a {self.kind} variant uses whole CTAs (group == threads)")
        if (self.kind == "cluster") != (self.cluster > 1) or self.cluster > MAX_CLUSTER:
            raise ValueError(f"cluster={self.cluster} does not fit kind {self.kind!r}")
        if self.vec * _STORAGE_BYTES[self.dtype] > 16:
            raise ValueError(f"vec={self.vec} is wider than 16 bytes")
        if self.min_blocks != 1 and (self.kind == "split"
                                     or not 1 <= self.min_blocks * self.threads <= 2048):
            raise ValueError(f"min_blocks={self.min_blocks} does not fit this variant")
        if self.smem_items and (self.kind == "split" or not 0 < self.smem_items <= self.items
                                or self.vec * _STORAGE_BYTES[self.dtype] != 16):
            raise ValueError(f"smem_items={self.smem_items} does not fit this variant")
        if self.edges and self.vec == 1:
            raise ValueError("edges need vectors (vec > 1)")
        if self.one_pass and (self.dtype == 0 or self.op >= SOFTMAX_BACKWARD
                              or self.kind == "split"):
            raise ValueError("one_pass is for the 16-bit forward kernels (not the split)")
        if self.persist not in (0, 1, 2) or (self.persist and (self.kind != "ticket"
                                                                or self.threads < 64)):
            raise ValueError(f"persist={self.persist}: 0, or 1 or 2 for ticket variants of "
                             "at least 64 threads")
        if self.ends not in (0, 2, 4, 8) or (self.ends and (
                self.kind != "ticket" or self.persist or self.items % self.ends)):
            raise ValueError(f"ends={self.ends}: 0, or 2, 4 or 8 dividing items for ticket "
                             "variants (not persist)")
        all_bits = TUNE_ORDER | TUNE_PRE | TUNE_EVEN
        if self.tune & ~all_bits or self.tune < 0 or (self.tune and (
                self.kind != "ticket" or self.persist or (self.ends and self.tune & TUNE_EVEN)
                or (self.tune & TUNE_PRE and self.op >= SOFTMAX_BACKWARD))):
            raise ValueError(f"tune={self.tune}: 0, or 1-7 for ticket variants (not persist; "
                             "1 and 2 with ends; 2 forward only)")
        if self.ends_head < 0 or self.ends_tail < 0:
            raise ValueError(f"ends_head={self.ends_head}, ends_tail={self.ends_tail}: "
                             "percentages >= 0")

    @property
    def inputs(self) -> int:
        """Arrays read: 1 forward (x), 2 backward (y and dy)."""
        return 2 if self.op >= SOFTMAX_BACKWARD else 1

    @property
    def columns(self) -> int:
        """Columns one CTA (or lane group) covers."""
        return self.group * self.items * self.vec

    @property
    def capacity(self) -> int:
        """The longest row this variant handles in one pass (``ticket``, ``split``: one
        chunk)."""
        return self.columns * self.cluster

    @property
    def non_portable(self) -> bool:
        """A cluster larger than the portable limit: the kernel must allow it before launch."""
        return self.cluster > PORTABLE_CLUSTER

    @property
    def shared_mem(self) -> int:
        """Dynamic shared memory per CTA in bytes (the shared-memory items)."""
        stages = 2 if self.persist else 1
        return stages * self.inputs * self.smem_items * self.threads * 16

    def names(self) -> tuple[str, ...]:
        """The kernels' template instantiations (NVRTC name expressions)."""
        common = f"{self.dtype}, {self.op}, {self.vec}, {self.items}"
        # EDGES and ONE_PASS default to 0
        edges = ", 1" if self.edges else ", 0" if self.one_pass else ""
        edges += ", 1" if self.one_pass else ""
        if self.kind == "rows":
            return (f"softmax_rows<{common}, {self.group}, {self.threads}, {self.min_blocks}, "
                    f"{self.smem_items}{edges}>",)
        if self.kind == "cluster":
            return (f"softmax_cluster<{common}, {self.threads}, {self.cluster}, "
                    f"{self.min_blocks}, {self.smem_items}{edges}>",)
        if self.persist:
            return (f"softmax_persist<{common}, {self.threads}, {self.min_blocks}, "
                    f"{self.smem_items}, {int(self.edges)}, {int(self.one_pass)}, "
                    f"{int(self.persist == 2)}>",)
        if self.ends:
            return (f"softmax_ends<{common}, {self.threads}, {self.min_blocks}, "
                    f"{self.smem_items}, {int(self.edges)}, {int(self.one_pass)}, {self.ends}"
                    + (f", {self.tune}>" if self.tune else ">"),)
        if self.kind == "ticket":
            if self.tune:  # EDGES and ONE_PASS spelled out before it
                edges = f", {int(self.edges)}, {int(self.one_pass)}, {self.tune}"
            return (f"softmax_ticket<{common}, {self.threads}, {self.min_blocks}, "
                    f"{self.smem_items}{edges}>",)
        return (f"softmax_partial<{common}, {self.threads}{edges}>",
                f"softmax_finish<{common}, {self.threads}{edges}>")

    def chunks(self, cols: int) -> int:
        """``ticket``, ``split``: chunks per row."""
        return -(-cols // self.columns)

    def most_chunks(self, cols: int) -> int:
        """``ticket``, ``split``: the most chunks of one row (``ends``: the small ones),
        all of which must fit on the device at once (ticket)."""
        if self.ends:
            return -(-cols // (self.columns // self.ends))
        return self.chunks(cols)

    def ends_rows(self, rows: int, cols: int, resident: int) -> tuple[int, int]:
        """``ends``: (head, tail), the rows in small chunks at the launch's start and end
        when ``resident`` CTAs fit at once: those whose small chunks fill ``ends_head`` and
        ``ends_tail`` % of them (at most ``rows`` together)."""
        small = self.most_chunks(cols)
        head = min(rows, -(-resident * self.ends_head // (100 * small)))
        tail = min(rows - head, -(-resident * self.ends_tail // (100 * small)))
        return head, tail

    def workspace(self, rows: int, cols: int) -> tuple[int, int]:
        """``ticket``: (float32 partials, counters) of its workspace: a float2
        partial per chunk; the ticket counter and one per row, zero before each launch and
        left zero by it (kernels/_gemm_workspace.py keeps one per stream)."""
        return 2 * rows * self.most_chunks(cols), 1 + rows

    def grid(self, rows: int, cols: int) -> int:
        """CTAs in the launch (each of the two launches for ``split``; ``persist``: at
        most this many, as many as fit at once; ``ends``: more, :meth:`ends_grid`)."""
        if self.kind == "rows":
            return -(-rows // (self.threads // self.group))
        if self.kind == "cluster":
            return rows * self.cluster
        return rows * self.chunks(cols)  # ticket, split

    def launch_forms(self) -> tuple[Variant, ...]:
        """The variants :meth:`for_launch` may take in place of this one, the first
        preferred: ``ends``, its chunks of 1/``ends`` the columns (the same CTA with as many
        vectors in registers), then its ticket chunks; ``persist`` backward, its ticket
        chunks of both stages' vectors (the same registers and shared memory in one stage;
        forward, the float32 ones would be a shape unmeasured and not checked for spills)."""
        if self.ends:
            plain = dataclasses.replace(self, ends=0, ends_head=100, ends_tail=100)
            items = self.items // self.ends
            small = dataclasses.replace(plain, items=items,
                                        smem_items=max(0, self.smem_items - self.items + items))
            if not (self.one_pass and self.op < SOFTMAX_BACKWARD):
                return small, plain
            # 16-bit forward: each also tuned (TUNE_ORDER | TUNE_PRE, with TUNE_EVEN: for_launch)
            tuned = TUNE_ORDER | TUNE_PRE
            return tuple(dataclasses.replace(form, tune=tune) for form in (small, plain)
                         for tune in (tuned, tuned | TUNE_EVEN))
        if self.persist and self.op >= SOFTMAX_BACKWARD:
            return (dataclasses.replace(self, persist=0, items=2 * self.items,
                                        smem_items=2 * self.smem_items),)
        return ()

    def for_launch(self, rows: int, cols: int, resident: int) -> Variant:
        """This variant for a launch of ``rows`` x ``cols`` when ``resident`` CTAs fit at
        once: the first of :meth:`launch_forms` whose chunks one residency holds, where this
        variant's chunks are one residency or less (``ends``) or more (``persist``). A single
        wave has no two ends to shorten (s10-softends measured the ends slower there) and
        smaller chunks spread it over more of the SMs (s14-soft, H100, bf16 softmax, % of
        copy, chunks of half size against the ticket chunks: 8x1000003 56.3 / 52.5,
        32x200003 48.7 / 45.9, 16x200003 33.0 / 25.9, 36x200003 52.3 / 38.9, 16x500009
        55.8 / 52.5, bf16 log_softmax 32x200003 49.4 / 46.4; 64x200003, 448 half chunks,
        57.8 / 57.5, keeps them). Persistent CTAs walking more than one chunk each lose to
        one wave of chunks twice as large (bf16 softmax backward, the one-stage chunks
        against the persistent ones: 8x1000003 71.6 / 66.5, 32x200003 64.4 / 61.1,
        16x500009 71.5 / 68.8, 24x200003 55.1 / 53.9; 4x1000003, 124 persistent chunks,
        one each, 50.4 / 55.5, and 32x1000003, 4 waves, 82.2 / 84.2, keep them). 16-bit
        forward forms come tuned (TUNE_ORDER | TUNE_PRE, and TUNE_EVEN: :meth:`evened`)."""
        if self.ends and self.grid(rows, cols) > resident:
            return self
        if self.persist and self.grid(rows, cols) <= resident:
            return self
        form = next((form for form in self.launch_forms()
                     if form.grid(rows, cols) <= resident), self)
        return form.evened(cols)

    def evened(self, cols: int) -> Variant:
        """This tuned variant with TUNE_EVEN where a row of ``cols`` would end in a chunk of
        under a quarter of the others (see TUNE_EVEN)."""
        short = cols % self.columns
        if not self.tune or self.ends or not 0 < 4 * short < self.columns:
            return self
        return dataclasses.replace(self, tune=self.tune | TUNE_EVEN)

    def ends_grid(self, rows: int, cols: int, head: int, tail: int) -> int:
        """``ends``: CTAs in the launch with ``head`` and ``tail`` rows in small chunks."""
        return self.grid(rows, cols) + (head + tail) * (self.most_chunks(cols)
                                                        - self.chunks(cols))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def widest_vec(cols: int, itemsize: int, addresses: Sequence[int] = ()) -> int:
    """The widest access (elements, up to 16 bytes) that divides the row length and to
    which every base address is aligned."""
    vec = 16 // itemsize
    while vec > 1 and (cols % vec or any(a % (vec * itemsize) for a in addresses)):
        vec //= 2
    return vec


def row_access(cols: int, itemsize: int, addresses: Sequence[int] = ()) -> tuple[int, bool]:
    """``(vec, edges)`` for rows of ``cols`` elements at these base addresses (none: all
    16-byte aligned): whole-row accesses as wide as :func:`widest_vec` allows, or, for rows of
    at least EDGE_MIN_VECTORS 16-byte vectors, the widest access (up to 16 bytes) at which all
    addresses agree modulo its width, with edges (``edges=True``) where that is wider."""
    whole = widest_vec(cols, itemsize, addresses)
    if cols < EDGE_MIN_VECTORS * (16 // itemsize) or any(a % itemsize for a in addresses):
        return whole, False
    vec = 16 // itemsize
    first = addresses[0] if addresses else 0
    while vec > whole and any((a - first) % (vec * itemsize) for a in addresses):
        vec //= 2
    return vec, vec > whole


def choose_variant(
    cols: int,
    dtype: Any,
    op: int = SOFTMAX,
    *,
    vec: int | None = None,
    edges: bool = False,
    clusters: bool = True,
    rows: int | None = None,
    tickets: bool = True,
) -> Variant:
    """Pick the variant for rows of ``cols`` elements of ``dtype`` (numpy dtype) and ``op``.

    ``vec`` and ``edges`` default to :func:`row_access` for 16-byte aligned arrays (pass
    what the pointers allow); ``clusters=False`` for devices without thread-block clusters
    (before sm_90); ``rows`` (None: many): with few, ticket chunks are smaller
    (TICKET_FEW_CTAS), and rows that one CTA or a cluster holds take small ticket chunks
    (FEW_ROWS_CTAS); ``tickets=False`` where the device cannot hold a row's chunks at once.
    Short rows share a CTA in lane groups; longer ones get a CTA of up to 1024 threads, then
    a cluster of up to PORTABLE_CLUSTER such CTAs (16-bit rows: ticket chunks as soon as one
    CTA is not enough, ``tickets_past``); longer still (sm_90), chunks of the first
    LONG_ROWS shape that meet through a global workspace (``ticket``); else the two-launch
    split.
    """
    variant = _choose(cols, dtype, op, vec, edges, clusters, rows, tickets)
    if (rows is None or not (clusters and tickets) or variant.kind not in ("rows", "cluster")
            or variant.group != variant.threads
            or variant.vec * _STORAGE_BYTES[variant.dtype] != 16):
        return variant
    small = _small_chunks(variant.dtype, op, variant.vec, variant.edges)
    chunks = small.chunks(cols)
    return small if FEW_ROWS_CHUNKS <= chunks and rows * chunks <= FEW_ROWS_CTAS else variant


def _small_chunks(code: int, op: int, vec: int, edges: bool) -> Variant:
    """Ticket chunks of the split's CTA shape for launches of few rows: registers only, two
    CTAs per multiprocessor (TICKET_FEW_CTAS, FEW_ROWS_CTAS)."""
    inputs = 2 if op >= SOFTMAX_BACKWARD else 1
    return Variant("ticket", code, op, vec, max(1, HELD // (inputs * vec)), SPLIT_THREADS,
                   SPLIT_THREADS, min_blocks=2, edges=edges)


def _choose(cols: int, dtype: Any, op: int, vec: int | None, edges: bool, clusters: bool,
            rows: int | None, tickets: bool) -> Variant:
    """choose_variant's pick before its few-rows rule (FEW_ROWS_CTAS)."""
    code = dtype_code(dtype)
    if op not in range(4):
        raise ValueError(f"op must be 0..3, got {op}")
    if cols < 1:
        raise ValueError(f"rows need at least one column, got {cols}")
    if vec is None:
        vec, edges = row_access(cols, _STORAGE_BYTES[code])
    inputs = 2 if op >= SOFTMAX_BACKWARD else 1
    # vectors of each input a thread holds; narrow (odd-length or misaligned) accesses need
    # an address per value, so they hold half as many
    held = HELD if vec * _STORAGE_BYTES[code] == 16 else HELD // 2
    most = max(1, held // (inputs * vec))
    nvec = -(-cols // vec)

    def fit(kind: str, group: int, threads: int, cluster: int = 1, blocks: int = 1) -> Variant:
        items = _pow2_at_least(-(-nvec // (group * cluster)))
        return Variant(kind, code, op, vec, items, group, threads, cluster, blocks,
                       edges=edges)

    def many(variant: Variant) -> bool:
        return rows is None or rows * variant.chunks(cols) >= TICKET_FEW_CTAS

    def ticket_chunks(shape: LongRows) -> Variant:
        """Chunks of ``shape``, or for few of them (TICKET_FEW_CTAS), of the split's CTA."""
        ticket = shape.with_edges(_ticket(shape, code, op, vec, edges,
                                          persist=not shape.persist_ctas))
        return ticket if many(ticket) else _small_chunks(code, op, vec, edges)

    items = next((n for limit, n in ITEMS_BY_VECTORS if nvec <= limit), LARGE_ITEMS)
    items = min(items, most)
    if nvec <= 32 * items:  # a warp or less per row: lane groups, several rows per CTA
        group = min(32, _pow2_at_least(-(-nvec // items)))
        return fit("rows", group, GROUP_ROWS_THREADS)
    threads = _pow2_at_least(-(-nvec // items))
    wide = clusters and vec * _STORAGE_BYTES[code] == 16
    shapes = LONG_ROWS[op, _STORAGE_BYTES[code]] if wide else ()
    if threads == MAX_THREADS and shapes and shapes[0].fills:
        return fit("rows", shapes[0].threads, shapes[0].threads, blocks=shapes[0].blocks)
    if threads <= MAX_THREADS:
        return fit("rows", threads, threads)
    # Longer rows (sm_90, 16-byte vectors): the first of LONG_ROWS's shapes whose CTAs hold
    # the row, alone or in a cluster, keeping what they can in registers and (where the
    # addresses of the asynchronous copies take some of them) more in shared memory.
    # Otherwise CTAs of MAX_THREADS holding `most` vectors in registers, alone or in a
    # cluster; longer still, ticket chunks (sm_90, 16-byte vectors), else the split.
    for shape in shapes:
        held = max(1, shape.held // (inputs * vec))
        keep = max(1, shape.keep // (inputs * vec))
        room = shape.smem // (inputs * shape.threads * 16)
        total = 1 << ((keep + room).bit_length() - 1)  # a power of two, at most keep + room
        ctas = _pow2_at_least(-(-nvec // (shape.threads * total)))
        if ctas in shape.persist_ctas and tickets:
            persist = _ticket(shape, code, op, vec, edges, persist=True)
            ticket = _ticket(shape, code, op, vec, edges, persist=False)
            if many(persist) and rows is not None and rows * ticket.chunks(cols) < TICKET_MANY_CTAS:
                return persist
        if tickets and ((ctas > 1 and shape.tickets_past) or ctas in shape.ticket_ctas):
            return ticket_chunks(shape)
        if ctas > PORTABLE_CLUSTER or (
                ctas == 1 and not shape.alone) or (
                ctas > 1 and not shape.clusters):
            continue
        variant = fit("rows" if ctas == 1 else "cluster", shape.threads, shape.threads, ctas,
                      shape.blocks)
        if variant.items < shape.min_items:
            continue
        if variant.items <= held:
            return variant
        return shape.with_edges(dataclasses.replace(variant, smem_items=variant.items - keep))
    ctas = _pow2_at_least(-(-nvec // (MAX_THREADS * most)))
    if ctas == 1:
        return fit("rows", MAX_THREADS, MAX_THREADS)
    if clusters and ctas <= PORTABLE_CLUSTER:
        return fit("cluster", MAX_THREADS, MAX_THREADS, ctas)
    if wide and tickets:
        return ticket_chunks(LONG_ROWS[op, _STORAGE_BYTES[code]][0])
    return Variant("split", code, op, vec, most, SPLIT_THREADS, SPLIT_THREADS, edges=edges)


def _ticket(shape: LongRows, code: int, op: int, vec: int, edges: bool,
            persist: bool = True) -> Variant:
    """Chunks of ``shape``'s CTAs, as many vectors a thread as its registers and shared
    memory hold (a power of two), for rows longer than its clusters (or, ``tickets_past``,
    one of its CTAs) hold; in one pass where the shape says so; ``persist``: in the shape's
    persistent grid where it has one."""
    inputs = 2 if op >= SOFTMAX_BACKWARD else 1
    held = max(1, shape.held // (inputs * vec))
    keep = max(1, shape.keep // (inputs * vec))
    room = shape.smem // (inputs * shape.threads * 16)
    items = 1 << ((keep + room).bit_length() - 1)
    if shape.persist and persist:
        return Variant("ticket", code, op, vec, shape.persist_items, shape.threads,
                       shape.threads, min_blocks=shape.blocks, smem_items=shape.persist_smem,
                       edges=edges, one_pass=shape.one_pass, persist=shape.persist)
    return Variant("ticket", code, op, vec, items, shape.threads, shape.threads,
                   min_blocks=shape.blocks, smem_items=0 if items <= held else items - keep,
                   edges=edges, one_pass=shape.one_pass, ends=shape.ends,
                   ends_head=shape.ends_head, ends_tail=shape.ends_tail,
                   tune=shape.tune if shape.ends else 0)


def dtype_code(dtype: Any) -> int:
    """The DT code of a numpy dtype; TypeError for dtypes the kernels do not handle."""
    try:
        return DTYPE_CODES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(
            f"softmax supports float32, float16 and bfloat16, got {dtype}"
        ) from None


# ---- shapes ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RowsView:
    """A C-contiguous array seen as ``rows`` x ``cols`` with the reduction over ``cols``."""

    rows: int
    cols: int


def rows_view(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int,
              dim: int) -> RowsView:
    """Check that softmax over ``dim`` of a (shape, strides) array is a row-wise reduction
    over contiguous rows, and return its rows x cols. Raises IndexError / ValueError."""
    ndim = len(shape)
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-max(ndim, 1)}, "
            f"{max(ndim, 1) - 1}], but got {dim})"
        )
    if ndim == 0:
        return RowsView(1, 1)
    dim %= ndim
    if any(size != 1 for size in shape[dim + 1:]):
        raise ValueError(
            f"softmax over dim={dim} of shape {tuple(shape)}: only the last dimension is "
            "supported (dimensions after it must have size 1); move the axis last and make "
            "the array contiguous first (e.g. torch's x.movedim(dim, -1).contiguous())"
        )
    if strides is not None and not _c_contiguous(shape, strides, itemsize):
        raise ValueError(
            f"softmax needs a C-contiguous array; got shape {tuple(shape)} with strides "
            f"{tuple(strides)} (make a contiguous copy first)"
        )
    cols = int(shape[dim])
    rows = math.prod(int(s) for s in shape[:dim])
    if cols >= 2**31:
        raise ValueError(f"rows of {cols} elements are longer than supported (< 2**31)")
    return RowsView(rows, cols)


def _c_contiguous(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> bool:
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size == 0:
            return True
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
