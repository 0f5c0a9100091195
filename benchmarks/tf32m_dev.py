"""TF32 decode tiles (kernels/gemm_decode.cu, DT_TF32; session 9 s9-tf32m) on a GPU machine:
``time`` runs M in {1, 8, 16, 32, 64, 128} x (N, K) in {4096^2, 4096 x 11008, 11008 x 4096},
the weight N-major (nn) and K-major (nt): kernel-only (20 calls in a CUDA graph, replayed,
rotating inputs; small_dev's Operands, grid_dev's timers) for cuBLAS TF32, gemm's choice,
the choice before (GPURT_GEMM_DISABLE=decode) and the decode family's candidates, plus one
eager call with the host path for cuBLAS and gemm; ``sanitize`` a few decode calls for
compute-sanitizer.

    python benchmarks/tf32m_dev.py precompile | time [--json PATH] | sanitize
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grid_dev  # noqa: E402
import small_dev  # noqa: E402
import torch  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
decode = importlib.import_module("gpurt.kernels._gemm_decode")
MS = (1, 8, 16, 32, 64, 128)
NK = ((4096, 4096), (4096, 11008), (11008, 4096))
LAYOUTS = ("nn", "nt")
# rows TMA cannot read (4099 fp32): gemm copies them for decode tiles where _gemm_pack's model
# says so (auto) or runs the thin split-K mma on them as they are ("before" = tune.heuristic)
PACKED = tuple((m, 4099, 4099, "nn") for m in (1, 16, 64))


def shapes() -> list[tuple[int, int, int, str]]:
    found = [(m, n, k, lay) for (n, k) in NK for m in MS for lay in LAYOUTS]
    return found[:12] + list(PACKED) + found[12:]  # 4096^2, 4099^2, then the others


def problem(m: int, n: int, k: int, layout: str) -> Any:
    return tune.Problem(m, n, k, tune.DT_TF32, True, layout == "nt", True, True, (9, 0), 132)


def before(p: Any) -> Any:
    """gemm's choice without the decode family (for TF32: the choice before this session)."""
    saved = os.environ.get("GPURT_GEMM_DISABLE")
    os.environ["GPURT_GEMM_DISABLE"] = "decode"
    try:
        return tune.heuristic(p)
    finally:
        if saved is None:
            del os.environ["GPURT_GEMM_DISABLE"]
        else:
            os.environ["GPURT_GEMM_DISABLE"] = saved


def rivals(p: Any) -> list[Any]:
    found = [before(p), *[tune._decode_config(t) for t in decode.candidates(p)]]
    chosen = tune.heuristic(p)
    return [c for c in dict.fromkeys(found) if c != chosen and tune.eligible(p, c)]


def eager_us(fn: Any) -> float:
    """One call with its host path: events around 20 eager calls, median of 5."""
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 20)
    return round(sorted(times)[2], 2)


def time_row(m: int, n: int, k: int, layout: str, stream: Any, l2: int) -> dict[str, Any]:
    p = small_dev.Operands(m, n, k, "tf32", layout, l2)
    prob = grid_dev.problem_of(p.a[0], p.b[0], True)
    ref = p.a[0].double() @ p.b[0].double()
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "layout": layout,
                           "auto_config": tune.heuristic(prob).label()}
    cub = [grid_dev.cublas_us(p) for _ in range(2)]
    auto = [grid_dev.ours_us(p, None, True, stream) for _ in range(2)]
    row["cublas_us"], row["auto_us"] = min(cub), min(auto)
    row["auto_x"] = round(min(cub) / min(auto), 3)
    row["auto_err"] = float(f"{grid_dev.error(p, None, True, stream, ref):.2g}")
    with gpurt.stream(stream):
        row["eager_cublas_us"] = eager_us(lambda: torch.matmul(p.a[0], p.b[0], out=p.out))
        row["eager_auto_us"] = eager_us(lambda: gm.gemm(p.ga[0], p.gb[0], out=p.gout,
                                                        stream=stream, allow_tf32=True))
    for config in rivals(prob):
        try:
            us = grid_dev.ours_us(p, config, True, stream)
            err = grid_dev.error(p, config, True, stream, ref)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{row['shape']} {layout} {config.label()}: {exc!r}", flush=True)
            continue
        key = "before " + config.label() if config == before(prob) else config.label()
        row[key] = {"us": us, "x": round(row["cublas_us"] / us, 3), "err": float(f"{err:.2g}")}
    return row


def run_timing(json_path: str | None) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for m, n, k, layout in shapes():
            rows.append(time_row(m, n, k, layout, stream, l2))
            print(json.dumps(rows[-1]), flush=True)
            if json_path:
                Path(json_path).write_text(json.dumps(rows, indent=1))
    print(f"\n{torch.cuda.get_device_name()}: kernel-only us; x = cuBLAS TF32 / gpurt")
    for row in rows:
        old = next((v for key, v in row.items() if key.startswith("before")), None)
        best = max(((v["x"], key) for key, v in row.items() if isinstance(v, dict)),
                   default=(0, "-"))
        print(f"{row['shape']:>15} {row['layout']} cuBLAS {row['cublas_us']:7.2f} auto "
              f"{row['auto_us']:7.2f} x{row['auto_x']:.3f} ({row['auto_config']}, err "
              f"{row['auto_err']}) before x{old['x'] if old else 0} best {best} eager "
              f"{row['eager_cublas_us']}/{row['eager_auto_us']}")


def sanitize() -> None:
    """A few TF32 decode calls (both weight layouts, split 1/2/8, beta, edges)."""
    rng = torch.Generator(device="cuda")
    failures = 0
    for layout in LAYOUTS:
        for m, n, k, bm, bn, split in ((3, 260, 516, 64, 16, 2), (17, 264, 200, 128, 32, 1),
                                       (16, 1024, 4096, 64, 16, 8)):
            a = torch.randn(m, k, device="cuda", generator=rng)
            b = torch.randn(n, k, device="cuda", generator=rng).t() if layout == "nt" else \
                torch.randn(k, n, device="cuda", generator=rng)
            c = torch.randn(m, n, device="cuda", generator=rng)
            out = c.clone()
            config = tune.Config("decode", bm, bn, 32, stages=6, split_k=split)
            gm.gemm(a, b, out=out, alpha=1.5, beta=0.5, config=config, allow_tf32=True)
            torch.cuda.synchronize()
            ref = 1.5 * (a.double() @ b.double()) + 0.5 * c.double()
            err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
            ok = err < 5e-3
            failures += not ok
            print(("PASS " if ok else "FAIL ") + f"{m}x{n}x{k} {layout} {config.label()} "
                  f"err={err:.2e}", flush=True)
    sys.exit(1 if failures else 0)


def precompile() -> None:
    jobs = set()
    for m, n, k, layout in shapes():
        p = problem(m, n, k, layout)
        for config in [tune.heuristic(p), *rivals(p)]:
            jobs.add(launch.program(config, p))
        if n == 4099:  # the rows as they are: no TMA
            p = tune.Problem(m, n, k, tune.DT_TF32, True, False, False, False, (9, 0), 132)
            jobs.add(launch.program(tune.heuristic(p), p))
    # the sanitize sweep's and tests/test_gemm_decode_tf32.py's tilings, wide and tall C
    tiles = ((2, 64, 16), (1, 128, 32), (8, 64, 16), (1, 64, 16), (4, 128, 32), (8, 64, 64),
             (2, 128, 128), (1, 64, 32), (2, 128, 32))
    for split, bm, bn in tiles:
        config = tune.Config("decode", bm, bn, 32, stages=6, split_k=split)
        for p in (problem(16, 1024, 4096, "nn"), problem(16, 1024, 4096, "nt"),
                  tune.Problem(1000, 24, 520, tune.DT_TF32, True, True, True, True, (9, 0), 132),
                  tune.Problem(1000, 24, 520, tune.DT_TF32, False, True, True, True, (9, 0),
                               132)):
            jobs.add(launch.program(config, p))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "time", "sanitize"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    {"precompile": precompile, "sanitize": sanitize,
     "time": lambda: run_timing(args.json)}[args.mode]()
