"""Issue 17 dev harness (session 15, lead): mid-length rows (32001, 50257: the vocabularies of
inference logits) at batch-like row counts (132-500), where the chooser runs one CTA a row and
reaches 55-84% of the 1 GiB copy (notes_softmax.md v20). Session 14 timed the few-rows chunks,
half-row ticket chunks and 2-CTA clusters there, never the persistent ticket chunks
(softmax_persist: two stages a CTA, the next chunk's loads in flight during a chunk's wait and
writes), which overlap a row's loads with another's writes inside each CTA. This set forces
them (quarter-, eighth- and half-row chunks, both orders of the next chunk's loads) next to
the chooser's pick, each checked against torch in float64 on a poisoned output
(softmax_edges_dev.routes), and also times a copy of each case's own bytes.

    python benchmarks/softmax_mid_dev.py [--json PATH] [--warm] [--old PATH] [--tune]
                                         [--cluster-old PATH]

``--old PATH``: instead, the chooser's pick at EXP_CASES compiled from the shipped source and
from PATH (a copy of softmax.cu with some exps replaced by a multiplication: wrong results, a
bound on what the MUFU work costs; the errors are recorded, not checked). ``--tune``: the
one-wave 16-bit forward launches at TUNE_CASES as softmax() launches them (tuned: the
chooser's TUNE bits) against the same forms untuned. ``--cluster-old PATH``: the chooser's
cluster picks at CLUSTER_CASES from PATH (softmax.cu before session 16's cluster barriers) and
from the shipped source.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib

import softmax_edges_dev as dev
from _common import Timer, copy_gbps, peer
from bench_softmax import BF16, F16, F32

import gpurt

ROWS = (132, 200, 264, 300, 500)


def _forms(dt: int) -> list:
    """Persistent ticket chunks for forward rows of 16-bit (dt 1, 2) or float32 (dt 0)
    elements: (vectors a thread, threads, CTAs per SM, vectors in shared memory, order)."""
    if dt:
        shapes = [(4, 512, 2, 0, 2), (4, 512, 2, 0, 1), (2, 512, 2, 0, 2), (4, 256, 4, 0, 2),
                  (8, 512, 2, 4, 2)]
    else:
        shapes = [(8, 512, 2, 0, 2), (4, 512, 2, 0, 2), (8, 256, 4, 0, 2), (16, 512, 1, 8, 2)]
    return [dev._persist(dt, 0, items, threads, blocks, smem, order)
            for items, threads, blocks, smem, order in shapes]


S15MID = {(rows, cols, BF16, "softmax"): _forms(2) for cols in (50_257, 32_001) for rows in ROWS}
S15MID.update({(rows, 50_257, F32, "softmax"): _forms(0) for rows in (132, 300)})
dev.SETS["s15mid"] = S15MID
EXP_CASES = [(64, 200_003), (300, 200_003), (132, 50_257), (300, 50_257), (300, 32_001)]


TUNE_CASES = [(r, 200_003, dt, op) for r in (8, 16, 24, 32, 48, 64) for dt in (BF16, F16)
              for op in ("softmax",)] + [
    (r, c, BF16, "softmax") for r, c in ((4, 1_000_003), (8, 1_000_003), (8, 1_000_000),
                                         (9, 1_000_000), (8, 500_009))] + [
    (32, 200_003, BF16, "log_softmax"), (64, 200_003, BF16, "log_softmax"),
    (64, 200_003, F16, "log_softmax")] + [  # multi-wave: softmax_ends, tuned too
    (r, 200_003, BF16, "softmax") for r in (100, 132, 300, 1000)] + [
    (300, 200_003, F16, "softmax"), (300, 200_003, BF16, "log_softmax"),
    (32, 1_000_003, BF16, "softmax"), (64, 1_000_003, BF16, "softmax"),
    (64, 1_000_000, BF16, "softmax"), (64, 500_009, BF16, "softmax")]


def _tune_set() -> dict:
    """TUNE_CASES: softmax()'s launch (routes' pick) against its form with tune 0."""
    sm = importlib.import_module("gpurt.kernels.softmax")
    chosen = {}
    for rows, cols, dtype, name in TUNE_CASES:
        pick = sm.launch_form(dev.plan.choose_variant(cols, dtype, dev.OPS[name], rows=rows),
                              rows, cols, gpurt.current_device())
        chosen[rows, cols, dtype, name] = [dataclasses.replace(pick, tune=0)]
    return chosen


def _exp_set() -> dict:
    """EXP_CASES (bf16 softmax): the pick as softmax() launches it, from the --old source."""
    sm = importlib.import_module("gpurt.kernels.softmax")
    chosen = {}
    for rows, cols in EXP_CASES:
        pick = sm.launch_form(dev.plan.choose_variant(cols, BF16, 0, rows=rows), rows, cols,
                              gpurt.current_device())
        chosen[rows, cols, BF16, "softmax"] = [(dev.OLD, pick)]
    return chosen


# Session 16: float32 rows the chooser holds in clusters (softmax_cluster), whose cluster
# barriers became relaxed / shared-memory-restricted (~0.3 us where a release-arrive costs
# ~0.9): the pick compiled from --cluster-old (the source before) and from the shipped one
CLUSTER_CASES = [(64, 131071, F32, "softmax"), (1024, 131072, F32, "softmax"),
                 (4096, 65537, F32, "softmax"), (300, 100003, F32, "log_softmax"),
                 (4096, 50257, F32, "softmax_backward"), (1024, 131072, F32, "softmax_backward"),
                 (64, 131072, F32, "softmax_backward")]


def _cluster_set() -> dict:
    chosen = {}
    for rows, cols, dtype, name in CLUSTER_CASES:
        pick = dev.plan.choose_variant(cols, dtype, dev.OPS[name], rows=rows)
        assert pick.kind == "cluster", (rows, cols, name, pick)
        chosen[rows, cols, dtype, name] = [(dev.OLD, pick)]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--old")
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--cluster-old")
    args = parser.parse_args()
    name, sources = "s15mid", {}
    if args.cluster_old:
        dev.SETS["s16cluster"] = _cluster_set()
        name, sources = "s16cluster", {dev.OLD: args.cluster_old}
    elif args.tune:
        dev.SETS["s15tune"] = _tune_set()
        name = "s15tune"
    elif args.old:
        dev.SETS["s15exp"] = _exp_set()
        name, sources = "s15exp", {dev.OLD: args.old}
    elif args.warm:
        print(f"compiled {dev.warm('s15mid', {})} variants", flush=True)
    torch = peer("torch")
    handle = int(torch.cuda.current_stream().cuda_stream)
    timer = Timer(handle, repeat=30)
    copy = copy_gbps(timer)
    found = dev.routes(timer, copy, torch, sources, name)
    same = {}
    for rows, cols, dtype, _ in dev.SETS[name]:  # a copy launch of each case's bytes
        for op in ("softmax", "log_softmax", "softmax_backward"):
            same[f"{rows}x{cols} {dtype.name} {op}"] = copy_gbps(timer,
                                                                rows * cols * dtype.itemsize)
    for row in found:
        if "pct_copy" in row:
            row["pct_samecopy"] = round(row["pct_copy"] * copy / same[row["case"]], 1)
    dev.report(found, copy, args.json, samecopy_GBps=same)


if __name__ == "__main__":
    main()
