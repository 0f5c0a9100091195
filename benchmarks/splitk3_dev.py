"""Session 9's split-K check (issue 17, helper s9-splitk): the wgmma split-K ending's coalesced
sum (s8-splitk2-ending's, and with several slices in flight per thread) against main's pair
loop, and the alternatives to wgmma split-K at its shapes (the decode kernel's cluster split
with thin tiles, mma 64 x 64 split 8/16), plus wgmma 128 x 64 split-K at the decode shapes.

    python benchmarks/splitk3_dev.py precompile | sanitize
    python benchmarks/splitk3_dev.py time [--changed | --auto] --json PATH --bits PATH
    python benchmarks/splitk3_dev.py compare OLD.json NEW.json   (splitk_dev's)

``time`` reuses splitk_dev's timing (kernel-only: bench_gemm_decode's CUDA graph of 20 calls
over rotating inputs, and a single call with the host path; cuBLAS in the same process; the
output's bits on one seeded input); ``--changed`` times only the configs whose kernel the
ending changes (wgmma split-K) and gemm's own choice, for the runs with main's kernels and
with GEMM_WG_SUM_SLICES=1; ``--auto`` times gemm's choice after the sweep (thin decode tiles
split 8, decode splits 4 and 8) against the configs it replaced, at the swept shapes and
around the new rules' edges. ``sanitize``: splitk2_dev's sanitizer cases with beta = 0 added
(the coalesced sum) and the decode tilings of the sweep and of the chooser.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import splitk2_dev  # noqa: E402 - after the path
import splitk_dev  # noqa: E402

SPLIT_SHAPES = ((128, 128, 4096), (256, 256, 8192), (512, 512, 8192), (128, 1024, 8192))
# (M, N, K, weights N x K as x @ W.T): issue 17's decode rows that split or stay below 0.90
DECODE_SHAPES = ((128, 4096, 4096, False), (128, 4096, 4096, True), (64, 4096, 4096, False),
                 (128, 4096, 11008, True), (64, 4096, 11008, True), (128, 4096, 14336, True),
                 (64, 4096, 14336, True))
SMS = 132


def _dc(tune: Any, bm: int, bn: int, stages: int, split: int) -> Any:
    return tune.Config("decode", bm, bn, 64, stages=stages, split_k=split)


def _decode_thin(tune: Any, m: int, n: int, k: int) -> list[Any]:
    """Decode tilings with K split over clusters of 2..8 whose grid fits one wave (clusters of
    4 and 8: 30 and 15 at once on an H100), each CTA 4+ K tiles deep."""
    found = []
    p, q = max(m, n), min(m, n)
    for bm, bn in ((64, 16), (64, 32), (64, 64), (64, 128), (128, 32), (128, 64), (128, 128)):
        if bn > q and bn != 16:
            continue
        blocks = -(-p // bm) * -(-q // bn)
        for split in (2, 4, 8):
            fits = blocks * split <= (SMS if split == 2 else 120)
            if not fits or -(-k // 64) < 4 * split:
                continue
            most = 6 if bm == 64 else 8
            stages = max(2, min(most, 200 * 1024 // ((bm + bn) * 128), -(-k // 64) // split))
            found.append(_dc(tune, bm, bn, stages, split))
    return found


def _cases(tune: Any, changed: bool) -> list[tuple[int, int, int, bool, list[Any]]]:
    """(M, N, K, weights N x K, configs); None is gemm's choice."""
    split = dataclasses.replace
    wg64, wg128 = tune._WGMMA[7], tune._WGMMA[1]
    cases = []
    for m, n, k in SPLIT_SHAPES:
        configs = [None] + [split(wg64, split_k=s) for s in (2, 4, 8)] + [split(wg128, split_k=4)]
        if not changed:
            configs += _decode_thin(tune, m, n, k)
            if (m, n) == (128, 128):
                configs += [split(tune._MMA[3], split_k=s) for s in (8, 16)]
        cases.append((m, n, k, False, configs))
    for m, n, k, nk in DECODE_SHAPES:
        configs = [None, split(wg64, split_k=2), split(wg128, split_k=4)]
        if not changed and k == 4096 and m == 128:
            configs += [_dc(tune, 128, 128, 6, 2), _dc(tune, 64, 128, 8, 2)]
        cases.append((m, n, k, nk, configs))
    return cases


def _auto_cases(tune: Any) -> list[tuple[int, int, int, bool, list[Any]]]:
    """gemm's choice (None) next to wgmma 128 x 64 split 4 or the decode split-2 tiling it
    replaced."""
    narrow = dataclasses.replace(tune._WGMMA[7], split_k=4)
    cases = [(m, n, k, nk, [None, narrow]) for m, n, k, nk in
             ((128, 128, 4096, False), (128, 128, 4096, True), (256, 256, 8192, False),
              (384, 384, 8192, False), (192, 320, 4096, False), (128, 256, 4096, False),
              (128, 512, 4096, False), (512, 512, 8192, False))]
    for m, n, k, bn in ((1, 1024, 8192, 16), (128, 1024, 8192, 128), (32, 1024, 4096, 32)):
        cases.append((m, n, k, False, [None, _dc(tune, 64, bn, 6, 2)]))
    return cases


def _problem(tune: Any, m: int, n: int, k: int, nk: bool) -> Any:
    return tune.Problem(m, n, k, tune.DT_BF16, True, nk, True, True, (9, 0), SMS)


def precompile(changed: bool) -> None:
    """Every program of ``time`` and ``sanitize``, in parallel, into the disk cache."""
    _, _, tune, launch = splitk_dev._modules()
    jobs = set()
    for m, n, k, nk, configs in _cases(tune, changed):
        p = _problem(tune, m, n, k, nk)
        for config in configs:
            config = config or tune.heuristic(p)
            if tune.eligible(p, config):
                jobs.add(launch.program(config, p))
    for m, n, k, nk, configs in _auto_cases(tune) if not changed else []:
        p = _problem(tune, m, n, k, nk)
        jobs.update(launch.program(c or tune.heuristic(p), p) for c in configs)
    if not changed:
        for config, dtype, m, n, k, trans_b, _ in _sanitize_cases(tune):
            dt = tune.DT_F16 if dtype == "float16" else tune.DT_BF16
            problem = tune.Problem(m, n, k, dt, True, trans_b, True, True, (9, 0), SMS)
            jobs.add(launch.program(config, problem))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


def time_all(changed: bool, auto: bool, json_path: str, bits_path: str) -> None:
    import bench_gemm_decode as bench
    import torch

    gpurt, _, tune, _ = splitk_dev._modules()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows: list[dict[str, Any]] = []
    bits: dict[str, str] = {}
    for m, n, k, nk, configs in _auto_cases(tune) if auto else _cases(tune, changed):
        torch.manual_seed(m + n + k + nk)  # the same inputs in every run
        p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, nk, l2)
        shape = f"{m}x{n}x{k} bf16 {'nk' if nk else 'kn'}"
        eligible = [c for c in configs
                    if c is None or tune.eligible(_problem(tune, m, n, k, nk), c)]
        for row, digest in splitk_dev._time_shape(p, shape, eligible, False):
            rows.append(row)
            if digest:
                bits[f"{shape} {row['config']}"] = digest
            print(json.dumps(row), flush=True)
            Path(json_path).write_text(json.dumps(rows, indent=1))
            Path(bits_path).write_text(json.dumps(bits, indent=1))
        del p


def _sanitize_cases(tune: Any) -> list[tuple[Any, str, int, int, int, bool, float]]:
    """splitk2_dev's cases (beta -1.5: the pair loop), then beta = 0 ones (the coalesced sum
    of interior half tiles, edge ones by the pair loop; slice counts not a multiple of the
    slices in flight) and decode cluster splits with thin tiles."""
    split = dataclasses.replace
    cases = [(*case, -1.5) for case in splitk2_dev._sanitize_cases(tune)]
    cases += [(split(tune._WGMMA[7], split_k=4), "bfloat16", 128, 128, 4096, False, 0.0),
              (split(tune._WGMMA[7], split_k=7), "float16", 256, 192, 2048, True, 0.0),
              (split(tune._WGMMA[7], split_k=3), "bfloat16", 200, 200, 1024, False, 0.0),
              (split(tune._WGMMA[1], split_k=5), "bfloat16", 200, 264, 1032, False, 0.0),
              (split(tune._WGMMA[1], split_k=2), "float16", 128, 256, 2048, True, 0.0),
              (_dc(tune, 64, 32, 4, 8), "bfloat16", 128, 128, 4096, False, 0.0),
              (_dc(tune, 64, 64, 4, 8), "bfloat16", 136, 120, 2056, False, -1.5),
              (_dc(tune, 64, 16, 4, 8), "float16", 128, 128, 4096, True, 0.0),
              (_dc(tune, 64, 32, 6, 8), "bfloat16", 128, 128, 4096, False, 0.0),  # chosen
              (_dc(tune, 128, 64, 8, 8), "float16", 256, 256, 4096, True, -1.5),
              (_dc(tune, 64, 128, 6, 4), "bfloat16", 128, 1024, 2048, False, 0.0)]
    return cases


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "sanitize", "time", "compare"))
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--changed", action="store_true")
    parser.add_argument("--auto", action="store_true")
    parser.add_argument("--json", default="splitk3.json")
    parser.add_argument("--bits", default="splitk3.bits.json")
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile(args.changed)
    elif args.mode == "sanitize":
        splitk2_dev.sanitize(_sanitize_cases(splitk_dev._modules()[2]))
    elif args.mode == "time":
        time_all(args.changed, args.auto, args.json, args.bits)
    else:
        splitk_dev.compare(*args.paths)
