"""Tests for gpurt.kernels.softmax: the variant plan and argument checks (CPU), NVRTC
compilation of every variant for sm_90 (CPU), and on the GPU every dtype x operation x row
length against float64 numpy on fresh random data, plus torch/CuPy inputs and the edge cases.

Errors are measured as in benchmarks/softmax_dev.py: against the float64 reference rounded
to the output dtype (so half-type rounding, subnormals included, is not counted as error),
relative to the reference's norm forward; backward relative to the size of the terms that
cancel (|y| (|dy| + |sum dy y|), or |dy| + exp(y) |sum dy|), since the gradient itself can be
far below the rounding of those terms. NaN and infinity positions must match exactly."""

from __future__ import annotations

import dataclasses
import importlib

import ml_dtypes
import numpy as np
import pytest

import gpurt
from gpurt.kernels import log_softmax, log_softmax_backward, softmax, softmax_backward

sm = importlib.import_module("gpurt.kernels.softmax")
plan = importlib.import_module("gpurt.kernels._softmax_plan")

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
DTYPES = (F32, F16, BF16)
LENGTHS = (1, 7, 33, 1000, 1024, 4097, 32768, 65536, 100_000, 131072, 1_000_000)
MORE_LENGTHS = (2, 64, 4096, 8192, 262144, 300_001, 524288)
# not multiples of the vector width: 16-byte accesses with edges (GPT-2's vocabulary, ...)
ODD_LENGTHS = (65, 4099, 11009, 32001, 50257, 131071, 1_000_003)
TOLERANCE = {F32: 1e-5, F16: 1e-3, BF16: 8e-3}
OPS = {
    "softmax": plan.SOFTMAX,
    "log_softmax": plan.LOG_SOFTMAX,
    "softmax_backward": plan.SOFTMAX_BACKWARD,
    "log_softmax_backward": plan.LOG_SOFTMAX_BACKWARD,
}


def every_variant(clusters: bool = True) -> list[plan.Variant]:
    """The variants the chooser picks for the tested lengths, also with narrower accesses."""
    found = []
    for dtype in DTYPES:
        for op in OPS.values():
            for cols in LENGTHS + MORE_LENGTHS + ODD_LENGTHS:
                found.append(plan.choose_variant(cols, dtype, op, clusters=clusters))
                found.append(plan.choose_variant(cols, dtype, op, vec=1, clusters=clusters))
                # few rows: smaller ticket chunks
                found.append(plan.choose_variant(cols, dtype, op, clusters=clusters, rows=2))
    return list(dict.fromkeys(found))


# ---- the plan (CPU) ----------------------------------------------------------------------------


@pytest.mark.parametrize("clusters", [True, False])
def test_chooser_holds_every_row_on_chip_or_splits(clusters):
    lengths = sorted({n + d for n in [2**k for k in range(21)] + [1000, 4097, 1_000_000]
                      for d in (-1, 0, 1) if n + d > 0})
    for dtype in DTYPES:
        for op in OPS.values():
            inputs = 2 if op >= plan.SOFTMAX_BACKWARD else 1
            for cols in lengths:
                v = plan.choose_variant(cols, dtype, op, clusters=clusters)
                assert v.vec * dtype.itemsize <= 16
                if v.edges:  # long rows take 16-byte accesses whatever their length
                    assert cols % v.vec and v.vec * dtype.itemsize == 16
                    assert cols >= plan.EDGE_MIN_VECTORS * v.vec
                else:
                    assert cols % v.vec == 0
                # registers: HELD values, or what a long-rows shape of these threads allows
                in_registers = (v.items - v.smem_items) * v.vec * inputs
                shapes = [s for s in plan.LONG_ROWS[op, dtype.itemsize] if clusters
                          and (s.threads, s.blocks) == (v.threads, v.min_blocks)]
                assert v.min_blocks == 1 or shapes
                measured = any((v.kind, v.items, v.smem_items) in s.edges_smem for s in shapes)
                if v.smem_items:  # rows with edges: the share measured for them (edges_smem)
                    assert in_registers <= max(s.keep for s in shapes) or (v.edges and measured)
                    # persistent chunks: two stages, each within the shape's budget
                    stages = 2 if v.persist else 1
                    assert v.shared_mem // stages <= max(s.smem for s in shapes) or (
                        v.edges and measured)
                    assert v.shared_mem <= 227 * 1024  # sm_90's most for one CTA
                else:
                    assert in_registers <= max([plan.HELD, inputs * v.vec]
                                               + [s.held for s in shapes])
                assert v.threads <= plan.MAX_THREADS and v.threads % v.group == 0
                if v.kind == "ticket":  # sm_90 and 16-byte vectors, else the split
                    assert clusters and v.vec * dtype.itemsize == 16
                if v.kind in ("ticket", "split"):  # rows longer than clusters hold
                    held = plan.HELD if v.vec * dtype.itemsize == 16 else plan.HELD // 2
                    most = max(1, held // (inputs * v.vec))
                    ctas = plan.PORTABLE_CLUSTER if clusters else 1
                    room = plan.MAX_THREADS * most * v.vec * ctas
                    first = plan.LONG_ROWS[op, dtype.itemsize][0]
                    if v.kind == "ticket" and first.tickets_past:  # past one CTA of it
                        assert (v.threads, v.min_blocks) == (first.threads, first.blocks)
                        assert v.one_pass == first.one_pass
                        assert v.chunks(cols) >= 2, (cols, v)
                        assert v.persist == first.persist
                    elif v.kind == "ticket" and first.ticket_ctas and cols <= room:
                        # in place of a cluster of ticket_ctas CTAs
                        assert (v.threads, v.min_blocks) == (first.threads, first.blocks)
                        assert v.chunks(cols) >= 2 and not v.persist, (cols, v)
                    else:
                        assert cols > room, (cols, v)
                    assert v.chunks(cols) * v.columns >= cols
                else:
                    assert v.capacity >= cols, (cols, v)
                    assert v.capacity < 4 * cols or v.capacity <= 64, (cols, v)  # little waste
                assert clusters or v.kind != "cluster"


def test_chooser_picks_the_measured_routes():
    pick = plan.choose_variant
    assert pick(1024, F32).names() == ("softmax_rows<0, 0, 4, 2, 128, 128, 1, 0>",)
    assert pick(8192, F32).names() == ("softmax_rows<0, 0, 4, 4, 512, 512, 1, 0>",)
    assert pick(32768, F32).names() == ("softmax_rows<0, 0, 4, 8, 1024, 1024, 1, 0>",)
    assert pick(4096, BF16).names() == ("softmax_rows<2, 0, 8, 4, 128, 128, 1, 0>",)
    long_rows = pick(131072, F32)  # 2 CTAs of 512 threads, 22 of 32 vectors in registers
    assert long_rows.names() == ("softmax_cluster<0, 0, 4, 32, 512, 2, 1, 10>",)
    assert long_rows.shared_mem == 80 * 1024
    # half as long: one CTA of 1024 threads, 4 of 16 vectors in registers
    assert pick(65536, F32).names() == ("softmax_rows<0, 0, 4, 16, 1024, 1024, 1, 12>",)
    assert pick(32768, F32, plan.SOFTMAX_BACKWARD).names() == (
        "softmax_rows<0, 2, 4, 8, 1024, 1024, 1, 6>",)
    assert pick(131072, F32, plan.SOFTMAX_BACKWARD).names() == (
        "softmax_cluster<0, 2, 4, 16, 512, 4, 1, 4>",)
    # fp32 backward rows the wide shape holds in clusters of 8: its ticket chunks (s14-soft);
    # clusters of 4 keep theirs
    assert pick(200_003, F32, plan.SOFTMAX_BACKWARD).names() == (
        "softmax_ticket<0, 2, 4, 16, 512, 1, 4, 1>",)
    assert pick(200_003, F32, plan.LOG_SOFTMAX_BACKWARD).names() == (
        "softmax_ticket<0, 3, 4, 16, 512, 1, 4, 1>",)
    assert pick(262144, F32, plan.SOFTMAX_BACKWARD).chunks(262144) == 8
    assert pick(131073, F32, plan.SOFTMAX_BACKWARD).kind == "ticket"
    assert pick(100_003, F32, plan.SOFTMAX_BACKWARD).names() == (
        "softmax_cluster<0, 2, 4, 16, 512, 4, 1, 4, 1>",)
    assert pick(200_003, F32, plan.SOFTMAX_BACKWARD, tickets=False).kind == "cluster"
    assert pick(131072, F32, plan.LOG_SOFTMAX_BACKWARD).names() == (
        "softmax_cluster<0, 3, 4, 16, 512, 4, 1, 4>",)
    assert pick(131072, F32, plan.LOG_SOFTMAX).names() == (
        "softmax_cluster<0, 1, 4, 32, 512, 2, 1, 10>",)
    assert pick(65536, F32, plan.LOG_SOFTMAX).names() == (
        "softmax_rows<0, 1, 4, 16, 1024, 1024, 1, 12>",)
    # 16-bit rows longer than one CTA of the first shape holds: its ticket chunks, forward
    # in one pass (s8-softlong16; without tickets, run 4's shape in clusters as before)
    # (s10-softends: the rows at the launch's ends in chunks of half size, softmax_ends)
    assert pick(131072, BF16).names() == ("softmax_ends<2, 0, 8, 16, 512, 2, 12, 0, 1, 2, 3>",)
    assert pick(131072, BF16, tickets=False).names() == (
        "softmax_cluster<2, 0, 8, 8, 1024, 2, 1, 6>",)
    # 16-bit softmax backward: the chunks of 8 vectors (6 in shared memory) in a persistent
    # grid (s8-softpersist); log_softmax backward the ticket chunks as before
    assert pick(200_003, F16, plan.SOFTMAX_BACKWARD).names() == (
        "softmax_persist<1, 2, 8, 8, 512, 1, 6, 1, 0, 0>",)
    assert pick(200_003, F16, plan.LOG_SOFTMAX_BACKWARD).names() == (
        "softmax_ticket<1, 3, 8, 16, 512, 1, 12, 1>",)
    assert pick(200_003, BF16, plan.SOFTMAX_BACKWARD, tickets=False).kind == "cluster"
    # fp32 softmax rows the wide shape holds in clusters of 4: its persistent chunks
    # (s8-softpersist) in launches of fewer than TICKET_MANY_CTAS of its ticket chunks, its
    # ticket chunks in longer ones and for many rows (s14-soft), for few rows
    # (TICKET_FEW_CTAS) the small ones; clusters of 8 its ticket chunks (s14-soft)
    persistent = "softmax_persist<0, 0, 4, 16, 512, 1, 12, 1, 0, 0>"
    wide = "softmax_ticket<0, 0, 4, 32, 512, 1, 6, 1>"
    assert pick(200_003, F32).names() == (wide,)
    assert pick(200_003, F32, rows=192).names() == (wide,)  # 768 chunks
    assert pick(200_003, F32, rows=191).names() == (persistent,)
    assert pick(200_003, F32, rows=10).names() == (persistent,)  # 70 persistent chunks
    assert pick(200_003, F32, rows=9).names() == ("softmax_ticket<0, 0, 4, 8, 512, 2, 0, 1>",)
    assert pick(262144, F32).chunks(262144) == 4  # chunks of 65536
    assert pick(300_001, F32).names() == (wide,)
    assert pick(300_001, F32, rows=64).names() == (wide,)
    # log_softmax: the ticket chunks for clusters of 4, clusters of 8 as before
    assert pick(200_003, F32, plan.LOG_SOFTMAX).names() == (
        "softmax_ticket<0, 1, 4, 32, 512, 1, 10, 1>",)
    assert pick(300_001, F32, plan.LOG_SOFTMAX).kind == "cluster"
    assert pick(200_003, F32, tickets=False).kind == "cluster"
    assert pick(262145, F32).kind == "ticket"  # clusters of 8: ticket chunks (s14-soft)
    assert pick(262145, F32, tickets=False).kind == "cluster"
    assert pick(65537, BF16, rows=1).names() == ("softmax_ticket<2, 0, 8, 4, 512, 2, 0, 1>",)
    # rows of 1M: chunks of the first LONG_ROWS shape meeting through a ticket, every dtype
    # and op (for launches of fewer than TICKET_FEW_CTAS of them, the split's CTAs, two per
    # SM); the split without clusters or (_plan) where a row's chunks do not fit the device
    assert pick(1_000_000, F32).names() == ("softmax_ticket<0, 0, 4, 32, 512, 1, 10>",)
    assert pick(1_000_000, F32, rows=4).names() == pick(1_000_000, F32).names()  # 64 chunks
    assert pick(1_000_000, F32, rows=3).names() == ("softmax_ticket<0, 0, 4, 8, 512, 2, 0>",)
    # float32 softmax rows with edges: their own shares of shared memory (session 13: the
    # defaults' kernels spill with NVRTC 13.0); aligned rows and log_softmax keep theirs
    assert pick(1_000_003, F32).names() == ("softmax_ticket<0, 0, 4, 32, 512, 1, 6, 1>",)
    assert pick(1_000_003, F32, rows=3).smem_items == 0  # the split's CTA shape
    assert pick(131071, F32).names() == ("softmax_cluster<0, 0, 4, 32, 512, 2, 1, 20, 1>",)
    assert pick(300_001, F32, tickets=False).names() == (
        "softmax_cluster<0, 0, 4, 32, 512, 8, 1, 20, 1>",)
    assert pick(50257, F32).names() == ("softmax_rows<0, 0, 4, 16, 1024, 1024, 1, 10, 1>",)
    assert pick(50257, F32, plan.LOG_SOFTMAX).smem_items == 12
    assert pick(1_000_003, F32, plan.LOG_SOFTMAX).smem_items == 10
    assert pick(131071, F32, vec=4, edges=False).smem_items == 10
    assert pick(1_000_000, F32, plan.SOFTMAX_BACKWARD, rows=3).items == 16  # 31 chunks a row
    # 16-bit forward: chunks of two 512-thread CTAs per SM (s7-softbf16), in one pass (s8)
    assert pick(1_000_000, BF16).names() == (  # TUNE_ORDER | TUNE_PRE (session 15)
        "softmax_ends<2, 0, 8, 16, 512, 2, 12, 0, 1, 2, 3>",)
    assert (pick(1_000_000, BF16).ends_head, pick(1_000_000, BF16).ends_tail) == (50, 50)
    # launches that one residency holds: the ticket chunks (_plan)
    # (s14-soft: in chunks of half size where one residency holds those; session 15: tuned,
    # TUNE_ORDER | TUNE_PRE, and TUNE_EVEN where a row's last chunk is under a quarter)
    assert pick(1_000_000, BF16).for_launch(9, 1_000_000, 264).names() == (
        "softmax_ticket<2, 0, 8, 16, 512, 2, 12, 0, 1, 3>",)  # last chunk 16960 of 65536
    assert pick(1_000_000, BF16).for_launch(9, 1_000_000, 264) == dataclasses.replace(
        pick(1_000_000, BF16), ends=0, ends_head=100, ends_tail=100, tune=3)
    assert pick(1_000_000, BF16).for_launch(8, 1_000_000, 264).names() == (
        "softmax_ticket<2, 0, 8, 8, 512, 2, 4, 0, 1, 3>",)  # 31 chunks a row, 248 in all
    assert pick(200_003, BF16).for_launch(64, 200_003, 264).tune == 7  # last: 3395 of 65536
    assert pick(200_003, F16, plan.LOG_SOFTMAX).for_launch(32, 200_003, 264).tune == 7
    assert pick(200_003, BF16).for_launch(300, 200_003, 264).tune == 3  # the ends, tuned
    assert all(form.tune in (3, 7) for form in pick(200_003, BF16).launch_forms())
    assert pick(200_003, BF16).for_launch(37, 200_003, 264).items == 8  # 7 chunks a row
    assert pick(200_003, BF16).for_launch(38, 200_003, 264).items == 16
    assert pick(200_003, BF16).for_launch(66, 200_003, 264).ends == 0  # 4 chunks a row
    assert pick(1_000_000, BF16).for_launch(17, 1_000_000, 264).ends == 2
    assert pick(1_000_000, F32).for_launch(8, 1_000_000, 264) == pick(1_000_000, F32)
    assert pick(1_000_000, F32, plan.SOFTMAX_BACKWARD).names() == (
        "softmax_ticket<0, 2, 4, 16, 512, 1, 4>",)
    assert pick(1_000_000, BF16, plan.SOFTMAX_BACKWARD).chunks(1_000_000) == 31
    # 16-bit softmax backward launches that one residency holds in chunks of both stages:
    # those, not the persistent grid (s14-soft)
    persistent = pick(1_000_003, BF16, plan.SOFTMAX_BACKWARD)
    assert persistent.for_launch(8, 1_000_003, 132).names() == (
        "softmax_ticket<2, 2, 8, 16, 512, 1, 12, 1>",)  # 16 chunks a row
    assert persistent.for_launch(9, 1_000_003, 132) == persistent
    assert persistent.for_launch(34, 200_003, 132) == persistent  # 4 chunks a row
    assert persistent.for_launch(33, 200_003, 132).items == 16
    assert persistent.for_launch(4, 1_000_003, 132) == persistent  # 124 chunks: one wave
    assert persistent.for_launch(5, 1_000_003, 132).items == 16
    assert pick(200_003, F32, rows=20).for_launch(20, 200_003, 132).persist  # forward
    assert pick(1_000_000, F16, plan.LOG_SOFTMAX_BACKWARD).names() == (
        "softmax_ticket<1, 3, 8, 16, 512, 1, 12>",)
    assert pick(1_048_577, F32).chunks(1_048_577) == 17
    assert pick(1_000_000, F32, tickets=False).kind == "split"
    assert pick(1_000_000, F32, clusters=False).kind == "split"
    short = pick(7, F16)
    assert short.kind == "rows" and short.group < 32 and short.vec == 1 and not short.edges
    # odd lengths: the route of the next aligned length, with edges (EDGES=1; float32
    # softmax with its own share of shared memory, above)
    assert pick(50257, F32, plan.LOG_SOFTMAX).names() == (
        "softmax_rows<0, 1, 4, 16, 1024, 1024, 1, 12, 1>",)
    assert pick(32001, F32).names() == ("softmax_rows<0, 0, 4, 8, 1024, 1024, 1, 0, 1>",)
    assert pick(1_000_003, F32, plan.SOFTMAX_BACKWARD, tickets=False).names() == (
        "softmax_partial<0, 2, 4, 4, 512, 1>", "softmax_finish<0, 2, 4, 4, 512, 1>")
    # 16-bit forward rows of 16k-64k elements: two CTAs of 512 threads per SM (s7-softbf16)
    assert pick(50257, BF16).names() == ("softmax_rows<2, 0, 8, 16, 512, 512, 2, 12, 1>",)
    assert pick(32001, BF16).names() == ("softmax_rows<2, 0, 8, 8, 512, 512, 2, 0, 1>",)
    assert pick(16384, F16).names() == ("softmax_rows<1, 0, 8, 4, 512, 512, 1, 0>",)
    assert pick(32001, BF16, plan.SOFTMAX_BACKWARD).threads == 1024
    assert pick(32001, BF16, clusters=False).names() == (
        "softmax_rows<2, 0, 8, 4, 1024, 1024, 1, 0, 1>",)
    assert pick(131072, F32, clusters=False).kind == "split"


def test_few_rows_of_one_cta_or_a_cluster_take_small_chunks():
    """Rows that one CTA or a cluster holds, in launches whose rows make at least
    FEW_ROWS_CHUNKS chunks each of the split's CTA shape and no more than FEW_ROWS_CTAS in
    all: those ticket chunks (s14-soft); more rows, shorter rows, narrow accesses, no
    clusters: the pick as before."""
    pick = plan.choose_variant
    cases = [(50257, F32, plan.SOFTMAX, "softmax_ticket<0, 0, 4, 8, 512, 2, 0, 1>", 4),
             (50257, F32, plan.SOFTMAX_BACKWARD, "softmax_ticket<0, 2, 4, 4, 512, 2, 0, 1>", 7),
             (32001, F32, plan.SOFTMAX_BACKWARD, "softmax_ticket<0, 2, 4, 4, 512, 2, 0, 1>", 4),
             (50257, BF16, plan.SOFTMAX, "softmax_ticket<2, 0, 8, 4, 512, 2, 0, 1>", 4),
             (50257, BF16, plan.SOFTMAX_BACKWARD, "softmax_ticket<2, 2, 8, 2, 512, 2, 0, 1>", 7),
             (32001, BF16, plan.SOFTMAX_BACKWARD, "softmax_ticket<2, 2, 8, 2, 512, 2, 0, 1>", 4)]
    for cols, dtype, op, name, chunks in cases:
        many = pick(cols, dtype, op)
        assert many.kind in ("rows", "cluster")
        most = plan.FEW_ROWS_CTAS // chunks
        for rows in (1, 8, most):
            assert pick(cols, dtype, op, rows=rows).names() == (name,), (cols, rows)
        assert pick(cols, dtype, op, rows=most + 1) == many
        assert pick(cols, dtype, op, clusters=False, rows=1).kind != "ticket"
        assert pick(cols, dtype, op, tickets=False, rows=1) == many
    assert pick(50257, F32, rows=64).kind == "ticket"  # 4 chunks a row, 256 in all
    assert pick(50257, F32, rows=65).names() == pick(50257, F32).names()
    # rows of fewer than 4 small chunks keep their CTA (fp32 forward 32001: 2 chunks of
    # 16384; 49152: 3), and so do lane groups and narrow accesses (a misaligned array)
    assert pick(32001, F32, rows=1) == pick(32001, F32)
    assert pick(49152, F32, rows=1) == pick(49152, F32)
    assert pick(49153, F32, rows=1).kind == "ticket"
    assert pick(1000, F32, rows=1) == pick(1000, F32)
    assert pick(50257, F32, vec=1, rows=1) == pick(50257, F32, vec=1)
    # clusters of the long-rows shapes too: fp32 log_softmax 8x300001 (19 chunks a row)
    assert pick(300_001, F32, plan.LOG_SOFTMAX, rows=8).names() == (
        "softmax_ticket<0, 1, 4, 8, 512, 2, 0, 1>",)
    assert pick(300_001, F32, plan.LOG_SOFTMAX, rows=14).kind == "cluster"


def test_widest_vec_follows_length_and_alignment():
    assert plan.widest_vec(1024, 4) == 4
    assert plan.widest_vec(1026, 4) == 2
    assert plan.widest_vec(1001, 4) == 1
    assert plan.widest_vec(4096, 2) == 8
    assert plan.widest_vec(4096, 2, [0x1000, 0x2008]) == 4
    assert plan.widest_vec(4096, 4, [0x1004]) == 1


def test_variant_checks_its_fields():
    good = dict(kind="rows", dtype=0, op=0, vec=4, items=2, group=128, threads=128)
    plan.Variant(**good)
    for change in (dict(kind="warp"), dict(vec=3), dict(items=0), dict(threads=2048),
                   dict(group=256), dict(vec=8), dict(dtype=5), dict(op=4),
                   dict(kind="cluster"), dict(kind="split", group=64),
                   dict(min_blocks=32), dict(smem_items=4), dict(vec=2, smem_items=1),
                   dict(kind="split", min_blocks=2), dict(one_pass=True),
                   dict(dtype=2, vec=8, op=2, one_pass=True),
                   dict(dtype=1, vec=8, kind="split", group=128, one_pass=True)):
        with pytest.raises(ValueError):
            plan.Variant(**{**good, **change})
    with pytest.raises(ValueError):
        plan.Variant("cluster", 0, 0, 4, 8, 1024, 1024, cluster=32)
    assert plan.Variant("cluster", 0, 0, 4, 8, 1024, 1024, cluster=16).non_portable
    assert not plan.Variant("cluster", 0, 0, 4, 8, 1024, 1024, cluster=8).non_portable


def test_variant_names_grid_and_chunks():
    rows = plan.Variant("rows", 2, 1, 8, 2, 16, 128)
    assert rows.names() == ("softmax_rows<2, 1, 8, 2, 16, 128, 1, 0>",)
    assert rows.grid(17, 200) == 3 and rows.shared_mem == 0  # 8 rows per CTA
    cluster = plan.Variant("cluster", 0, 2, 4, 8, 1024, 1024, cluster=4, smem_items=6)
    assert cluster.names() == ("softmax_cluster<0, 2, 4, 8, 1024, 4, 1, 6>",)
    pair = plan.Variant("cluster", 0, 0, 4, 16, 512, 512, cluster=4, min_blocks=2)
    assert pair.names() == ("softmax_cluster<0, 0, 4, 16, 512, 4, 2, 0>",)
    assert cluster.grid(5, 131072) == 20 and cluster.capacity == 131072
    assert cluster.shared_mem == 2 * 6 * 1024 * 16
    split = plan.Variant("split", 1, 3, 8, 2, 512, 512)
    assert split.names() == ("softmax_partial<1, 3, 8, 2, 512>", "softmax_finish<1, 3, 8, 2, 512>")
    assert split.chunks(1_000_000) == 123 and split.grid(2, 1_000_000) == 246
    ticket = plan.Variant("ticket", 0, 1, 4, 32, 512, 512, smem_items=10, edges=True)
    assert ticket.names() == ("softmax_ticket<0, 1, 4, 32, 512, 1, 10, 1>",)
    assert ticket.chunks(1_000_003) == 16 and ticket.grid(3, 1_000_003) == 48
    assert ticket.shared_mem == 10 * 512 * 16
    # the 16-bit forward reduction in one pass: ONE_PASS after EDGES, which is then spelled
    one = plan.Variant("ticket", 2, 0, 8, 16, 512, 512, min_blocks=2, smem_items=12,
                       one_pass=True)
    assert one.names() == ("softmax_ticket<2, 0, 8, 16, 512, 2, 12, 0, 1>",)
    assert dataclasses.replace(rows, one_pass=True).names() == (
        "softmax_rows<2, 1, 8, 2, 16, 128, 1, 0, 0, 1>",)
    # 48 float2 partials; counters for the ticket and 3 rows
    assert ticket.workspace(3, 1_000_003) == (96, 4)
    # ticket chunks in a persistent grid: every template parameter spelled, two stages
    persist = dataclasses.replace(one, persist=2, edges=True)
    assert persist.names() == ("softmax_persist<2, 0, 8, 16, 512, 2, 12, 1, 1, 1>",)
    assert dataclasses.replace(ticket, persist=1).names() == (
        "softmax_persist<0, 1, 4, 32, 512, 1, 10, 1, 0, 0>",)
    assert persist.shared_mem == 2 * 12 * 512 * 16 and persist.grid(3, 1_000_003) == 48
    for bad in (dict(cluster=2), dict(group=256), dict(vec=1, smem_items=2), dict(persist=3),
                dict(persist=1, group=32, threads=32)):
        with pytest.raises(ValueError):
            plan.Variant(**{**dict(kind="ticket", dtype=0, op=0, vec=4, items=4, group=512,
                                   threads=512), **bad})
    with pytest.raises(ValueError, match="persist"):
        plan.Variant("rows", 0, 0, 4, 4, 512, 512, persist=1)
    # softmax_ticket's TUNE bits: every template parameter spelled before them
    assert dataclasses.replace(one, tune=7).names() == (
        "softmax_ticket<2, 0, 8, 16, 512, 2, 12, 0, 1, 7>",)
    assert dataclasses.replace(ticket, tune=4).names() == (
        "softmax_ticket<0, 1, 4, 32, 512, 1, 10, 1, 0, 4>",)
    assert dataclasses.replace(one, tune=7).grid(3, 1_000_003) == one.grid(3, 1_000_003)
    # softmax_ends takes TUNE_ORDER and TUNE_PRE after its SPLIT (session 15)
    ends = plan.Variant("ticket", 2, 0, 8, 16, 512, 512, min_blocks=2, smem_items=12, edges=True,
                        one_pass=True, ends=2, tune=3)
    assert ends.names() == ("softmax_ends<2, 0, 8, 16, 512, 2, 12, 1, 1, 2, 3>",)
    for bad in (dict(tune=8), dict(tune=-1), dict(tune=1, persist=1), dict(tune=4, ends=2),
                dict(tune=2, op=2)):
        with pytest.raises(ValueError, match="tune"):
            plan.Variant(**{**dict(kind="ticket", dtype=2, op=0, vec=8, items=4, group=512,
                                   threads=512), **bad})
    with pytest.raises(ValueError, match="tune"):
        plan.Variant("rows", 0, 0, 4, 4, 512, 512, tune=1)


def test_row_access_takes_16_byte_vectors_with_edges_where_addresses_agree():
    ra = plan.row_access
    assert ra(1024, 4) == (4, False)  # whole aligned vectors: no edges
    assert ra(50257, 4) == (4, True)
    assert ra(50257, 2) == (8, True)
    assert ra(1024, 4, [0x1004, 0x2004]) == (4, True)  # same misalignment: edges
    assert ra(1024, 4, [0x1004, 0x200c]) == (2, True)  # agree modulo 8 bytes only
    assert ra(1024, 4, [0x1004, 0x200c, 0x3000]) == (1, False)  # modulo 4 only: scalars
    assert ra(1026, 4, [0x1000, 0x2008]) == (2, False)  # vec 2 divides the row already
    assert ra(50257, 2, [0x1001, 0x2001]) == (1, False)  # not element-aligned
    assert ra(15, 4) == (1, False)  # short rows: no edges
    assert ra(16, 4) == (4, False) and ra(17, 4) == (4, True)
    assert plan.Variant("rows", 0, 0, 4, 2, 16, 128, edges=True).names() == (
        "softmax_rows<0, 0, 4, 2, 16, 128, 1, 0, 1>",)
    with pytest.raises(ValueError, match="edges"):
        plan.Variant("rows", 0, 0, 1, 2, 16, 128, edges=True)


def test_rows_view_shapes_and_errors():
    rv = plan.rows_view
    assert rv((4, 5, 6), None, 4, -1) == plan.RowsView(20, 6)
    assert rv((4, 5, 6), (120, 24, 4), 4, 2) == plan.RowsView(20, 6)
    assert rv((4, 6, 1, 1), None, 4, 1) == plan.RowsView(4, 6)  # only size-1 dims follow
    assert rv((), None, 4, 0) == plan.RowsView(1, 1)
    assert rv((0, 7), None, 2, -1) == plan.RowsView(0, 7)
    with pytest.raises(IndexError):
        rv((4, 5), None, 4, 2)
    with pytest.raises(IndexError):
        rv((4, 5), None, 4, -3)
    with pytest.raises(ValueError, match="last dimension"):
        rv((4, 5, 6), None, 4, 1)
    with pytest.raises(ValueError, match="contiguous"):
        rv((4, 5), (4, 16), 4, -1)


def test_unsupported_dtypes_and_host_arrays_are_refused():
    for dtype in (np.float64, np.int32, np.bool_):
        with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
            plan.dtype_code(dtype)
    with pytest.raises(TypeError, match="device array"):
        softmax(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="device array"):
        softmax_backward([1.0, 2.0], [0.5, 0.5])


def test_every_variant_compiles_for_sm_90_without_local_memory():
    variants = every_variant()
    names = sorted({n for v in variants for n in v.names()})
    module = gpurt.compile(sm.source(), options=("--ptxas-options=-v",), name_expressions=names,
                           arch="sm_90", program_name="softmax.cu")
    assert set(names) <= set(module.lowered_names)
    by_symbol = {symbol: name for name, symbol in module.lowered_names.items()}
    smem_names = {n for v in variants if v.smem_items for n in v.names()}
    frames: dict[str, int] = {}
    current = None
    for line in module.log.splitlines():
        if "Function properties for" in line:
            current = by_symbol.get(line.rsplit(" ", 1)[-1])
        elif "bytes stack frame" in line and current:
            frames[current] = int(line.split(".", 1)[-1].split()[0])
    if frames:  # ptxas's report is in the log: registers only, but for a few bytes of
        assert set(frames) == set(names)  # addresses with 1024 threads x 16 vectors
        spilled = {n: b for n, b in frames.items() if b > (32 if n in smem_names else 0)}
        assert not spilled, spilled


def test_pre_hopper_variants_compile_for_sm_80():
    module = sm.precompile(every_variant(clusters=False), arch="sm_80")
    assert module.arch == "sm_80"


# ---- on the GPU --------------------------------------------------------------------------------


def reference(op: int, a: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(float64 result, the magnitude errors are measured against)."""
    with np.errstate(all="ignore"):
        if op in (plan.SOFTMAX, plan.LOG_SOFTMAX):
            m = a.max(-1, keepdims=True)
            e = np.exp(a - m)
            s = e.sum(-1, keepdims=True)
            out = (a - m) - np.log(s) if op == plan.LOG_SOFTMAX else e / s
            return out, np.abs(out)
        if op == plan.SOFTMAX_BACKWARD:
            dot = (b * a).sum(-1, keepdims=True)
            return a * (b - dot), np.abs(a) * (np.abs(b) + np.abs(dot))
        total = b.sum(-1, keepdims=True)
        return b - np.exp(a) * total, np.abs(b) + np.exp(a) * np.abs(total)


def error(out: np.ndarray, ref: np.ndarray, size: np.ndarray) -> float:
    """Relative L2 error of ``out`` against ``ref`` rounded to its dtype (inf if NaN or
    infinity positions differ)."""
    ref_t = ref.astype(out.dtype).astype(np.float64)
    got = out.astype(np.float64)
    if not np.array_equal(np.isnan(got), np.isnan(ref_t)):
        return float("inf")
    inf = np.isinf(ref_t)
    if not np.array_equal(got[inf], ref_t[inf]):
        return float("inf")
    fin = np.isfinite(ref_t)
    if not np.isfinite(got[fin]).all():
        return float("inf")
    den = np.linalg.norm(size[fin])
    num = np.linalg.norm(got[fin] - ref_t[fin])
    return float(num / den) if den else float(num)


def inputs(op: int, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator,
           scale: float) -> tuple[np.ndarray, np.ndarray | None]:
    """Host inputs in ``dtype``: x with -inf entries and a fully -inf row (forward), or a
    forward output y and a gradient dy (backward)."""
    x = rng.standard_normal(shape) * scale
    cols = shape[-1]
    if op < plan.SOFTMAX_BACKWARD:
        if cols > 3:
            x[rng.random(shape) < 0.02] = -np.inf
        x.reshape(-1, cols)[x.size // cols // 2] = -np.inf
        return x.astype(dtype), None
    fwd = plan.SOFTMAX if op == plan.SOFTMAX_BACKWARD else plan.LOG_SOFTMAX
    y = reference(fwd, x, None)[0].astype(dtype)
    return y, rng.standard_normal(shape).astype(dtype)


def run_op(op: int, a, b, **kwargs):
    if op == plan.SOFTMAX:
        return softmax(a, **kwargs)
    if op == plan.LOG_SOFTMAX:
        return log_softmax(a, **kwargs)
    grad = {"grad_in": kwargs.pop("out")} if "out" in kwargs else {}
    if op == plan.SOFTMAX_BACKWARD:
        return softmax_backward(b, a, **kwargs, **grad)
    return log_softmax_backward(b, a, **kwargs, **grad)


def shape_for(cols: int) -> tuple[int, ...]:
    if cols <= 1024:
        return (3, 5, cols)
    if cols <= 32768:
        return (2, 3, cols)
    return (3, cols) if cols <= 131072 else (2, cols)


@pytest.fixture(scope="module")
def compiled():
    """Every variant the GPU tests use, in one NVRTC program (cached on disk after)."""
    if gpurt.is_available():
        major = gpurt.get_device_capability()[0]
        sm.precompile(every_variant(clusters=major >= 9))


@pytest.mark.gpu
@pytest.mark.parametrize("cols", LENGTHS)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_against_float64(dtype, op_name, cols, compiled, gpu_state):
    op = OPS[op_name]
    rng = np.random.default_rng([cols, op, dtype.itemsize, dtype.kind == "V"])
    shape = shape_for(cols)
    for scale in (1.0, 1e3 if dtype == F16 else 1e4):
        a, b = inputs(op, shape, dtype, rng, scale)
        ref, size = reference(op, a.astype(np.float64), None if b is None else b.astype(np.float64))
        out = gpurt.asarray(np.full(shape, 12345, dtype))  # poison: every element is written
        returned = run_op(op, gpurt.asarray(a), None if b is None else gpurt.asarray(b), out=out)
        assert returned is out
        err = error(out.to_numpy(), ref, size)
        assert err < TOLERANCE[dtype], (scale, err)


@pytest.mark.gpu
def test_new_output_in_place_and_empty(compiled, gpu_state):
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal((6, 1000)).astype(np.float32)
    ref, size = reference(plan.SOFTMAX, x_host.astype(np.float64), None)
    x = gpurt.asarray(x_host)
    y = softmax(x)
    assert isinstance(y, gpurt.Array) and y.shape == x.shape and y.dtype == x.dtype
    assert error(y.to_numpy(), ref, size) < 1e-5
    assert softmax(x, out=x) is x  # in place
    assert error(x.to_numpy(), ref, size) < 1e-5
    for shape in ((0, 7), (3, 0), (2, 0, 5)):
        empty = gpurt.empty(shape, dtype=np.float32)
        assert softmax(empty).shape == shape
    scalar = softmax(gpurt.asarray(np.array(3.0, np.float32)), dim=0)
    assert scalar.to_numpy() == 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("op", [plan.SOFTMAX, plan.SOFTMAX_BACKWARD])
def test_other_dims_and_layouts(op, compiled, gpu_state):
    rng = np.random.default_rng(2)
    rows_last = inputs(op, (4, 6, 300), F32, rng, 1.0)  # the reduced axis last
    ref, size = reference(op, *(None if t is None else t.astype(np.float64) for t in rows_last))
    # the same data with the reduced axis in the middle: softmax over dim=1
    middle = [None if t is None else gpurt.asarray(np.ascontiguousarray(np.moveaxis(t, -1, 1)))
              for t in rows_last]
    got = run_op(op, *middle, dim=1)
    assert got.shape == (4, 300, 6)
    assert error(np.moveaxis(got.to_numpy(), 1, -1), ref, size) < 1e-5
    # a strided input (every other row, one column in) is copied to a contiguous one first
    base = gpurt.asarray(rng.standard_normal((8, 257)).astype(np.float32))
    ref, size = reference(plan.SOFTMAX, base.to_numpy()[::2, 1:].astype(np.float64), None)
    assert error(softmax(base[::2, 1:]).to_numpy(), ref, size) < 1e-5


@pytest.mark.gpu
def test_misaligned_pointers_and_streams(compiled, gpu_state):
    rng = np.random.default_rng(3)
    flat = gpurt.asarray(rng.standard_normal(4 * 1024 + 1).astype(np.float32))
    x = flat[1:].reshape(4, 1024)  # 4 bytes past a 16-byte boundary
    ref, size = reference(plan.LOG_SOFTMAX, x.to_numpy().astype(np.float64), None)
    stream = gpurt.Stream()
    y = log_softmax(x, stream=stream)
    stream.synchronize()
    assert error(y.to_numpy(), ref, size) < 1e-5


def offset_view(host: np.ndarray, offset: int) -> gpurt.Array:
    """``host`` on the device, starting ``offset`` elements past an allocation's start."""
    flat = np.full(host.size + offset, 777, host.dtype)
    flat[offset:] = host.ravel()
    return gpurt.asarray(flat)[offset:].reshape(host.shape)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [65, 4099, 11009, 32001, 50257, 131071])
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_odd_lengths_at_offsets(dtype, op_name, cols, compiled, gpu_state):
    """Rows of any length starting at any alignment (every row's own, since the length is
    odd): edges; arrays that agree modulo 16 bytes, modulo 8 or 4 bytes, or not at all."""
    op = OPS[op_name]
    rng = np.random.default_rng([cols, op, dtype.itemsize, 17])
    shape = (5, cols) if cols < 100_000 else (2, cols)
    for offsets in ((0, 0, 0), (1, 1, 1), (3, 3, 3), (1, 3, 5), (2, 0, 1)):
        a, b = inputs(op, shape, dtype, rng, 1.0)
        ref, size = reference(op, a.astype(np.float64), None if b is None else b.astype(np.float64))
        out = offset_view(np.full(shape, 12345, dtype), offsets[2])  # poison
        args = [offset_view(a, offsets[0]), None if b is None else offset_view(b, offsets[1])]
        assert run_op(op, *args, out=out) is out
        err = error(out.to_numpy(), ref, size)
        assert err < TOLERANCE[dtype], (offsets, err)


@pytest.mark.gpu
def test_argument_errors(compiled, gpu_state):
    x = gpurt.asarray(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match="shape"):
        softmax(x, out=gpurt.empty((4, 9), dtype=np.float32))
    with pytest.raises(ValueError, match="dtype"):
        softmax(x, out=gpurt.empty((4, 8), dtype=np.float16))
    with pytest.raises(ValueError, match="contiguous"):
        softmax(x, out=gpurt.empty((8, 4), dtype=np.float32).T)
    with pytest.raises(ValueError, match="last dimension"):
        softmax(x, dim=0, out=gpurt.empty((4, 8), dtype=np.float32))
    with pytest.raises(IndexError):
        softmax(x, dim=2)
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        softmax(gpurt.asarray(np.ones((4, 8))))
    with pytest.raises(ValueError, match="grad_out"):
        softmax_backward(gpurt.asarray(np.ones((4, 7), np.float32)), x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_torch_tensors(dtype_name, compiled, gpu_state):
    try:
        import torch
    except Exception as exc:  # ImportError, or a torch that fails while importing
        pytest.skip(f"torch does not import here: {exc!r}")
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    x = torch.randn(64, 4096, device="cuda", dtype=dtype) * 3
    stream = torch.cuda.current_stream()
    y = torch.from_dlpack(softmax(x, stream=stream))
    torch.cuda.synchronize()
    expected = torch.softmax(x.double(), -1)
    assert ((y.double() - expected).norm() / expected.norm()).item() < TOLERANCE[
        F32 if dtype_name == "float32" else BF16]
    out = torch.full_like(x, 7.0)
    assert log_softmax(x, out=out, stream=stream) is out
    torch.cuda.synchronize()
    assert torch.allclose(out.double(), torch.log_softmax(x.double(), -1), rtol=1e-2, atol=5e-2)
    dy = torch.randn_like(x)
    y_ref = torch.softmax(x, -1)
    grad = softmax_backward(dy, y_ref, stream=stream)
    torch.cuda.synchronize()
    y64, dy64 = y_ref.double(), dy.double()
    expected = torch._softmax_backward_data(dy64, y64, -1, torch.float64)
    dot = (dy64 * y64).sum(-1, keepdim=True)
    scale = (y64.abs() * (dy64.abs() + dot.abs())).norm()
    assert ((torch.from_dlpack(grad).double() - expected).norm() / scale).item() < 1e-2


@pytest.mark.gpu
def test_cupy_arrays(compiled, gpu_state):
    cp = pytest.importorskip("cupy")
    x = cp.random.standard_normal((32, 1000), dtype=cp.float32)
    out = cp.full_like(x, 12345.0)
    softmax(x, out=out)
    cp.cuda.runtime.deviceSynchronize()
    ref, size = reference(plan.SOFTMAX, cp.asnumpy(x).astype(np.float64), None)
    assert error(cp.asnumpy(out), ref, size) < 1e-5
