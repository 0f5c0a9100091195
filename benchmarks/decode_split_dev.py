"""Development harness for split-K on the 16-bit wgmma kernel (decode shapes, M = 32..128):
checks forced split configs against float64 (layouts, K tails, empty K slices, beta), then
times them kernel-only (bench_gemm_decode's graph replay over rotating weights) next to
cuBLAS and gemm's current choice. ``sanitize`` runs a small sweep for compute-sanitizer.

    python benchmarks/decode_split_dev.py check | time [--json PATH] | sanitize
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import torch  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
NARROW, WIDE = tune._WGMMA[1], tune._WGMMA[0]  # 128x128 s6, 128x256 s4


def split(config: Any, k: int) -> Any:
    return dataclasses.replace(config, split_k=k)


def check(m: int, n: int, k: int, config: Any, a_t: bool = False, b_t: bool = False,
          beta: float = 0.0, dtype: Any = torch.bfloat16) -> tuple[bool, str]:
    a = torch.randn(k, m, device="cuda").t() if a_t else torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda").t() if b_t else torch.randn(k, n, device="cuda")
    a, b = a.to(dtype), b.to(dtype)
    c = torch.randn(m, n, device="cuda").to(dtype) if beta else None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    ref = 1.5 * (a.double() @ b.double())
    if c is not None:
        ref += beta * c.double()
    what = f"{m}x{n}x{k} {config.label()} a_t={a_t} b_t={b_t} beta={beta} {str(dtype)[6:]}"
    try:
        gm.gemm(a, b, out=out, alpha=1.5, beta=beta, c=c, config=config)
    except Exception as exc:  # noqa: BLE001 - report and go on
        return False, f"{what}: {exc!r}"
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(out.double() - ref)) / float(torch.linalg.norm(ref))
    return bool(torch.isfinite(out).all()) and err < 1e-2, f"{what}: err={err:.2e}"


def run_checks(cases: list[tuple[Any, ...]]) -> int:
    failures = 0
    for case in cases:
        ok, what = check(*case)
        failures += not ok
        print(("PASS " if ok else "FAIL ") + what, flush=True)
    print(f"checks: {len(cases) - failures} passed, {failures} failed", flush=True)
    return failures


def check_cases() -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    for base in (NARROW, WIDE):
        for a_t, b_t in ((False, False), (False, True), (True, True), (True, False)):
            cases.append((128, 4096, 4096, split(base, 4), a_t, b_t))
            cases.append((40, 1000, 1000, split(base, 3), a_t, b_t, 0.5))
        cases.append((64, 11008, 4096, split(base, 3), False, True, 0.0, torch.float16))
        cases.append((200, 264, 72, split(base, 4)))  # 2 K tiles over 4 slices: empty ones
        cases.append((33, 520, 4104, split(base, 7), False, False, -1.0))  # K tail
    return cases


def precompile() -> None:
    """The programs of the checks and timings (16-bit wgmma with the reduce kernel in every
    layout, and gemm's own picks), compiled in parallel into the disk cache."""
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    jobs = set()
    problems = [tune.Problem(m, n, k, dt, a_k, b_k, True, True, (9, 0), 132)
                for dt in (tune.DT_BF16, tune.DT_F16)
                for a_k in (True, False) for b_k in (True, False)
                for m, n, k in ((128, 4096, 4096), (4096, 4096, 4096), (8192, 8192, 8192))]
    problems += [tune.Problem(m, n, k, tune.DT_BF16, True, nk, True, True, (9, 0), 132)
                 for n, k in NK for m in M_VALUES for nk in (False, True)]
    problems += [tune.Problem(m, n, k, tune.DT_BF16, True, False, True, True, (9, 0), 132)
                 for m, n, k in ((1000, 1000, 1000), (3000, 5000, 2000), (8192, 8192, 512))]
    for problem in problems:
        configs = [split(NARROW, 2), split(WIDE, 2), tune.heuristic(problem)]
        for config in configs:
            jobs.add(launch.program(config, problem))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


def sanitize() -> None:
    cases = [(40, 264, 200, split(NARROW, 3), False, False, 0.5),
             (72, 136, 72, split(WIDE, 4), True, True),
             (8, 264, 520, split(NARROW, 5), False, True, 0.0, torch.float16)]
    sys.exit(1 if run_checks(cases) else 0)


M_VALUES = (32, 64, 128)
NK = ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096))


def graph_us(p: Any, config: Any, stream: Any) -> float:
    """gemm with ``config`` on ``p``, kernel-only (graph replay) on ``stream``, in us."""
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        return round(bench.gpurt_graph_us(gpurt, gm.gemm, p, config, 20, torch), 2)


def time_variants(p: Any, row: dict[str, Any], variants: list[tuple[str, Any]], stream: Any,
                  rows: list[dict[str, Any]], json_path: str | None) -> None:
    """Time each (name, config) of ``variants`` kernel-only on ``p`` into ``row`` (a failure is
    printed, not raised), then keep the row in ``rows``, print it and save ``rows``."""
    for name, config in variants:
        try:
            row[name] = graph_us(p, config, stream)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{row['shape']} {name}: {exc!r}", flush=True)
    rows.append(row)
    print(json.dumps(row), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def run_timing(json_path: str | None) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    stream = gpurt.Stream()
    for n, k in NK:
        for m in M_VALUES:
            for nk in (False, True):
                if nk and (n, k) != (4096, 4096) and m != 64:
                    continue
                p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, nk, l2)
                row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "w": "nk" if nk else "kn"}
                with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
                    row["cublas"] = round(bench.torch_graph_us(torch, p, 20), 2)
                problem = tune.Problem(m, n, k, tune.DT_BF16, True, nk, True, True, (9, 0), 132)
                row["auto_config"] = tune.heuristic(problem).label()
                variants: list[tuple[str, Any]] = [("auto", None)]
                for base in (NARROW, WIDE):
                    s = tune._wave_split(problem, base)
                    for k_split in sorted({s, 2 * s, max(2, s // 2)}):
                        variants.append((split(base, k_split).label(), split(base, k_split)))
                time_variants(p, row, variants, stream, rows, json_path)
                del p
    print(f"\n{torch.cuda.get_device_name()}: us kernel-only (graph replay); cuBLAS / gpurt")
    for row in rows:
        ours = {key: v for key, v in row.items() if key.startswith("wgmma")}
        best = min(ours, key=ours.get) if ours else "-"
        print(f"{row['shape']:>15} {row['w']} cuBLAS {row['cublas']:6.2f} auto "
              f"{row.get('auto', 0):6.2f} x{row['cublas'] / row.get('auto', 1e9):.2f} "
              f"({row['auto_config']}) best {ours.get(best, 0):6.2f} "
              f"x{row['cublas'] / ours.get(best, 1e9):.2f} ({best})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "check", "time", "sanitize"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile()
    elif args.mode == "check":
        sys.exit(1 if run_checks(check_cases()) else 0)
    elif args.mode == "time":
        run_timing(args.json)
    else:
        sanitize()
