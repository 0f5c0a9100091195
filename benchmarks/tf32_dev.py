"""Development harness for the TF32 wgmma GEMM (kernels/gemm_wgmma_tf32.cu) on a GPU machine:
checks every TF32 wgmma config in each operand layout against float64 (odd sizes, K tails,
beta, column-major and unaligned outputs, many tiles per CTA, the layouts it must refuse),
then times them next to cuBLAS TF32 (torch.matmul with allow_tf32, same layout, same process)
and the previous TF32 path (mma.sync), device time of batches queued behind a spin kernel
(bench_gemm.py's Timer). ``sanitize`` runs a small sweep for compute-sanitizer.

    python benchmarks/tf32_dev.py precompile | check | time [--json PATH] | sanitize
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
import torch  # noqa: E402
from bench_gemm import Timer  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config
WGMMA = tune._WGMMA_TF32
OLD = tune._TF32[0]  # the mma.sync TF32 path gemm used before
LAYOUTS = {"nn": (False, False), "nt": (False, True), "tt": (True, True), "tn": (True, False)}


def stored(rows: int, cols: int, offset: int, col_major: bool, pad: int = 0) -> tuple[Any, Any]:
    """(a rows x cols random float32 view ``offset`` elements into its buffer, the ``pad``
    elements after each of its rows or columns)."""
    inner, outer = (rows, cols) if col_major else (cols, rows)
    whole = torch.randn(offset + outer * (inner + pad), device="cuda")[offset:]
    mat = whole.view(outer, inner + pad)
    return (mat[:, :inner].t() if col_major else mat[:, :inner]), mat[:, inner:]


def view(rows: int, cols: int, offset: int, col_major: bool) -> Any:
    return stored(rows, cols, offset, col_major)[0]


def check(m: int, n: int, k: int, config: Config | None, layout: str = "nn", offset: int = 0,
          beta: float = 0.0, out_t: bool = False, out_pad: int = 0) -> tuple[bool, str]:
    """One TF32 gemm against float64; returns (passed, description)."""
    a_t, b_t = LAYOUTS[layout]
    a, b = view(m, k, offset, a_t), view(k, n, offset, b_t)
    out, padding = stored(m, n, offset, out_t, out_pad)
    c = torch.randn(m, n, device="cuda") if beta else None
    out.fill_(float("nan"))
    padding.fill_(float("nan"))
    alpha = 1.5
    ref = alpha * (a.double() @ b.double())
    if c is not None:
        ref += beta * c.double()
    what = (f"{m}x{n}x{k} {config.label() if config else 'auto'} {layout} off={offset} "
            f"beta={beta} out_t={out_t} pad={out_pad}")
    gm.gemm(a, b, out=out, alpha=alpha, beta=beta, c=c, config=config, allow_tf32=True)
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(out.double() - ref)) / (float(torch.linalg.norm(ref)) or 1.0)
    ok = bool(torch.isfinite(out).all()) and err < 5e-3 and bool(torch.isnan(padding).all())
    return ok, f"{what}: err={err:.2e}"


def refused(m: int, n: int, k: int, config: Config, layout: str, offset: int,
            words: str) -> tuple[bool, str]:
    """A forced config that cannot run raises ValueError naming why."""
    try:
        check(m, n, k, config, layout, offset)
    except ValueError as exc:
        return words in str(exc), f"refused {layout} off={offset}: {exc}"
    return False, f"{config.label()} {layout} off={offset} ran instead of refusing"


def cases() -> list[tuple[Any, ...]]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    found: list[tuple[Any, ...]] = []
    for i, config in enumerate(WGMMA):
        for layout in ("nn", "nt", "tt"):
            # TMA needs 16-byte row pitches: every size of a forced config is a multiple of 4
            found.append((300, 520, 136, config, layout))
            found.append((132, 260, 36, config, layout, 4, 0.5))
            found.append((128 * (sms // 4 + 3), 1024, 520, config, layout))  # tiles per CTA
            found.append((76, 1000, 4 + 32 * i, config, layout, 0, -1.0, True))  # K tails
            found.append((200, 264, 200, config, layout, 0, 0.0, False, 1))  # plain stores
    for layout in ("nn", "nt", "tt", "tn"):  # gemm's own choice, including the refused layout
        found.append((1000, 1000, 1000, None, layout))
        found.append((4099, 257, 4099, None, layout, 0, 0.25))
        found.append((64, 4096, 4096, None, layout))
    return found


def run_checks() -> int:
    failures = 0
    results = []
    for case in cases():
        try:
            results.append(check(*case))
        except Exception as exc:  # noqa: BLE001 - report and go on
            results.append((False, f"{case[:3]} {case[3]} {case[4:]}: {exc!r}"))
    results.append(refused(96, 200, 64, WGMMA[0], "tn", 0, "K-major"))
    results.append(refused(96, 200, 64, WGMMA[0], "nn", 1, "TMA"))
    for ok, what in results:
        failures += not ok
        print(("PASS " if ok else "FAIL ") + what, flush=True)
    print(f"checks: {len(results) - failures} passed, {failures} failed", flush=True)
    return failures


SHAPES = [(4096, 4096, 4096, "nn"), (4096, 4096, 4096, "nt"), (4096, 4096, 4096, "tt"),
          (8192, 8192, 8192, "nn"), (2048, 2048, 2048, "nn"), (2048, 2048, 2048, "nt"),
          (1024, 1024, 1024, "nn"), (1000, 1000, 1000, "nn"), (1000, 1000, 1000, "nt"),
          (3000, 5000, 2000, "nn"), (3000, 5000, 2000, "nt"), (4099, 4099, 4099, "nn"),
          (8192, 8192, 512, "nn"), (8192, 8192, 512, "nt"), (128, 4096, 4096, "nn"),
          (128, 4096, 4096, "nt"), (16, 4096, 4096, "nn"), (4096, 4096, 1024, "nn")]


def run_timing(json_path: str | None) -> None:
    stream = gpurt.Stream()
    timer = Timer(gpurt, stream)
    rows = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for m, n, k, layout in SHAPES:
            a_t, b_t = LAYOUTS[layout]
            a, b, out = view(m, k, 0, a_t), view(k, n, 0, b_t), torch.empty(m, n, device="cuda")
            flops = 2.0 * m * n * k
            batch = max(1, min(30, int(1e11 / flops)))
            torch.backends.cuda.matmul.allow_tf32 = True
            cublas = timer.ms(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), batch, 9)
            row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "layout": layout,
                                   "cublas_tflops": round(flops / cublas / 1e9, 1)}
            auto = gm.gemm_config(a, b, allow_tf32=True)
            for name, config in [("auto", None), ("old", OLD), *[(c.label(), c) for c in WGMMA]]:
                def ours(config: Config | None = config, a: Any = a, b: Any = b,
                         out: Any = out) -> None:
                    gm.gemm(a, b, out=out, stream=stream, allow_tf32=True, config=config)
                try:
                    ms = timer.ms(ours, batch, 9)
                except ValueError as exc:
                    print(f"{m}x{n}x{k} {layout} {name}: {exc}", flush=True)
                    continue
                row[name] = round(cublas / ms, 3)
            row["auto_config"] = auto.label()
            rows.append(row)
            print(json.dumps(row), flush=True)
            if json_path:
                Path(json_path).write_text(json.dumps(rows, indent=1))
    name = torch.cuda.get_device_name()
    print(f"\n{name}: gpurt / cuBLAS TF32 time ratio (above 1: gpurt faster)")
    for row in rows:
        best = max([(v, key) for key, v in row.items() if key.startswith("wgmma")] or [(0, "-")])
        print(f"{row['shape']:>15} {row['layout']} cuBLAS {row['cublas_tflops']:6.1f} TFLOP/s "
              f"auto {row.get('auto', 0):.3f} ({row['auto_config']}) old {row.get('old', 0):.3f}"
              f" best {best[0]:.3f} ({best[1]})")


def sanitize(quick: bool) -> None:
    """A small sweep for compute-sanitizer (every config, or the first two when ``quick``, in
    each layout: edges, beta, plain and TMA stores); exits 1 on a wrong result."""
    failures = 0
    for config in WGMMA[:2] if quick else WGMMA:
        for layout in ("nn", "nt", "tt"):
            for case in [(132, 260, 68, config, layout, 0, 0.5),
                         (36, 132, 68, config, layout, 4, 0.0, True),
                         (40, 72, 40, config, layout, 0, 0.0, False, 1)]:
                ok, what = check(*case)
                failures += not ok
                print(("PASS " if ok else "FAIL ") + what, flush=True)
    sys.exit(1 if failures else 0)


def precompile() -> None:
    """Every TF32 program (wgmma and mma) for sm_90, compiled in parallel into the cache."""
    jobs = set()
    for a_k, b_k in ((True, False), (True, True), (False, True), (False, False)):
        for m, n in ((4096, 4096), (64, 4096), (4096, 64), (300, 520)):
            problem = tune.Problem(m, n, 4096, tune.DT_TF32, a_k, b_k, True, True, (9, 0), 132)
            for config in tune.all_configs(problem):
                jobs.add(launch.program(config, problem))
                if config.split_k > 1:
                    jobs.add(launch.program(dataclasses.replace(config, split_k=1), problem))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "check", "time", "sanitize"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="sanitize: fewer configs")
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile()
    elif args.mode == "check":
        sys.exit(1 if run_checks() else 0)
    elif args.mode == "time":
        run_timing(args.json)
    else:
        sanitize(args.quick)
