"""Development harness for the skinny GEMM (kernels/gemm_skinny.cu) on a GPU machine: checks
skinny configs against float64 on odd shapes, layouts, offsets and beta, then times variants
kernel-only (bench_gemm_decode's graph replay over rotating weights) next to cuBLAS and gemm's
previous path (skinny disabled), and prints a short table last. ``sanitize`` runs a small
sweep for compute-sanitizer (memcheck, racecheck, synccheck) and checks its results too.

    python benchmarks/skinny_dev.py main [--out DIR]
    python benchmarks/skinny_dev.py sanitize
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
Config = tune.Config


def view(rows: int, cols: int, dtype: Any, offset: int, col_major: bool) -> Any:
    """A rows x cols random view starting ``offset`` elements into its buffer."""
    buf = torch.randn(rows * cols + offset, device="cuda").to(dtype)
    if col_major:
        return buf[offset:].view(cols, rows).t()
    return buf[offset:].view(rows, cols)


def check(m: int, n: int, k: int, dtype: Any, config: Config | None, *, a_t: bool = False,
          b_t: bool = False, offset: int = 0, beta: float = 0.0, out_t: bool = False,
          trans: bool = False) -> tuple[bool, str]:
    """One gemm against float64; returns (passed, description)."""
    a = view(m, k, dtype, offset, a_t)
    b = view(k, n, dtype, offset, b_t)
    out = view(m, n, dtype, offset, out_t)
    c = out.clone().normal_() if beta else None
    if c is not None:
        out.copy_(c)
    else:
        out.fill_(float("nan"))
    alpha = 1.5
    ref = alpha * (a.double() @ b.double())
    if beta:
        ref += beta * c.double()
    if trans:  # the same product through trans_a / trans_b of the stored transposes
        gm.gemm(a.t().contiguous(), b.t().contiguous(), out=out, alpha=alpha, beta=beta, c=c,
                trans_a=True, trans_b=True, config=config)
    else:
        gm.gemm(a, b, out=out, alpha=alpha, beta=beta, c=c, config=config)
    torch.cuda.synchronize()
    denom = float(torch.linalg.norm(ref)) or 1.0
    err = float(torch.linalg.norm(out.double() - ref)) / denom
    ok = bool(torch.isfinite(out).all()) and err < 1e-2
    what = (f"{m}x{n}x{k} {str(dtype)[6:]} {config.label() if config else 'auto'} a_t={a_t} "
            f"b_t={b_t} off={offset} beta={beta} out_t={out_t} trans={trans}: err={err:.2e}")
    return ok, what


def skinny(bm: int, warps: int, split: int) -> Config:
    return Config("skinny", bm, 64, 32 * warps, split_k=split)


CHECKS = [  # (m, n, k, kwargs)
    (1, 4096, 4096, {}), (16, 4096, 4096, {"b_t": True}), (32, 11008, 4096, {}),
    (7, 1000, 999, {"offset": 1}), (13, 257, 4099, {"b_t": True, "beta": 0.5}),
    (17, 130, 77, {"a_t": True, "out_t": True}), (3, 4097, 61, {"trans": True}),
    (40, 300, 129, {"beta": -1.0}), (5, 2, 3000, {"out_t": True, "b_t": True}),
    (1, 1, 1, {}), (9, 64, 0, {"beta": 2.0}), (2, 999, 1023, {"offset": 3, "b_t": True}),
]
CONFIGS = [skinny(8, 4, 1), skinny(16, 4, 8), skinny(32, 4, 4), skinny(8, 8, 2),
           skinny(16, 2, 2), skinny(32, 2, 2), skinny(8, 8, 1)]


def run_checks(out: list[str]) -> int:
    failures = 0
    for i, (m, n, k, kwargs) in enumerate(CHECKS):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        for config in (CONFIGS[i % len(CONFIGS)], CONFIGS[(i + 2) % len(CONFIGS)], None):
            ok, what = check(m, n, k, dtype, config, **kwargs)
            failures += not ok
            out.append(("PASS " if ok else "FAIL ") + what)
            if not ok:
                print(out[-1], flush=True)
    return failures


SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (1, 11008, 4096),
          (16, 4096, 11008), (32, 14336, 4096)]
NK_SHAPES = [(1, 4096, 4096), (32, 11008, 4096)]


def _problem(m: int, n: int, k: int, weights_nk: bool) -> Any:
    return tune.Problem(m, n, k, tune.DT_BF16, True, weights_nk, True, True, (9, 0), 132)


def variants(m: int, n: int, k: int, weights_nk: bool) -> list[tuple[str, Config | None]]:
    """(name, config) pairs to time: gemm's pick, the old path and skinny alternatives."""
    plan_problem = _problem(m, n, k, weights_nk)
    os.environ["GPURT_GEMM_DISABLE"] = "skinny"
    old = tune.heuristic(plan_problem)
    del os.environ["GPURT_GEMM_DISABLE"]
    found = [("auto", None), ("old", old)]
    for config in tune._skinny.candidates(plan_problem):
        found.append((config.label(), config))
    return found


def run_timing(out_dir: Path, copy_bps: float, l2: int, weights_nk: bool) -> list[dict]:
    rows = []
    for m, n, k in NK_SHAPES if weights_nk else SHAPES:
        p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, weights_nk, l2)
        stream = gpurt.Stream()
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            cublas = bench.torch_graph_us(torch, p, 20)
        row = {"shape": f"{m}x{n}x{k}", "w": "nk" if weights_nk else "kn", "cublas": cublas,
               "floor": n * k * 2 / copy_bps * 1e6}
        for name, config in variants(m, n, k, weights_nk):
            try:
                with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
                    row[name] = bench.gpurt_graph_us(gpurt, gm.gemm, p, config, 20, torch)
            except Exception as exc:
                print(f"{m}x{n}x{k} {name}: {exc!r}", flush=True)
        rows.append(row)
        print(json.dumps({k2: (round(v, 2) if isinstance(v, float) else v)
                          for k2, v in row.items()}), flush=True)
        (out_dir / "timing.json").write_text(json.dumps(rows, indent=1))
        del p
    return rows


def _compile_one(job: tuple[str, tuple[str, ...], str]) -> None:
    gm._compile(*job)


def _skinny_jobs(configs: set, jobs: set, s_ks: tuple = (True, False),
                 vecs: tuple = (True, False)) -> None:
    """The layouts, alignments and dtypes of each skinny config."""
    for config in configs:
        for dt in (tune.DT_F16, tune.DT_BF16):
            for s_k in s_ks:
                for g_k in (True, False):
                    for vec in vecs:
                        name = tune._skinny.name_expression(config, dt, s_k, g_k, vec)
                        jobs.add((config.source, (name,), "sm_90"))


def precompile() -> None:
    """Compile, in parallel processes into the shared disk cache, every variant this run
    uses: the timed ones, every skinny config of the checks and tests in every layout, and
    the tuner's candidates for the decode benchmark's shapes."""
    import multiprocessing

    jobs: set = set()
    every_layout = {skinny(8, 4, 1), skinny(16, 2, 4), skinny(32, 4, 2), skinny(16, 4, 4),
                    skinny(8, 2, 1)}  # the sanitizer's and the layout tests' configs
    _skinny_jobs(every_layout, jobs)
    _skinny_jobs(set(CONFIGS) | {skinny(32, 8, 1)}, jobs, (True,))
    skinny_configs = set()
    problems = [(_problem(m, n, k, nk), True) for shapes, nk in ((SHAPES, False),
                                                                (NK_SHAPES, True))
                for m, n, k in shapes]
    problems += [(_problem(m, n, k, False), False) for n, k in bench.NK
                 for m in bench.M_VALUES]
    for m, n, k in [(1, 1, 1), (8, 1000, 3000), (300, 8, 700), (16, 1000, 4099),
                    (4099, 3, 200), (32, 2048, 1024), (1, 4096, 4096)]:
        skinny_configs.add(tune.heuristic(_problem(m, n, k, False)))
    for problem, timed in problems:
        configs = tune.candidates(problem)
        if timed:
            configs += [c for _, c in variants(problem.m, problem.n, problem.k,
                                               problem.b_kmajor) if c is not None]
        for config in configs:
            if config.kernel == "skinny":
                skinny_configs.add(config)
                continue
            for dt in (tune.DT_F16, tune.DT_BF16):
                p = dataclasses.replace(problem, dt=dt)
                jobs.add((config.source, gm._kernel_names(config, p),
                          gm._arch_for(config, (9, 0))))
    _skinny_jobs({c for c in skinny_configs if c.kernel == "skinny"}, jobs, (True,), (True,))
    with multiprocessing.get_context("spawn").Pool(15) as pool:
        pool.map(_compile_one, sorted(jobs), chunksize=1)
    print(f"precompiled {len(jobs)} programs", flush=True)


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    log: list[str] = []
    failures = run_checks(log)
    (out_dir / "checks.log").write_text("\n".join(log))
    print(f"checks: {len(log) - failures} passed, {failures} failed", flush=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy_bps = bench.copy_bandwidth(torch)
    print(f"{torch.cuda.get_device_name()} copy {copy_bps / 1e9:.0f} GB/s", flush=True)
    rows = run_timing(out_dir, copy_bps, l2, False) + run_timing(out_dir, copy_bps, l2, True)
    print(f"\n{torch.cuda.get_device_name()}, copy {copy_bps / 1e9:.0f} GB/s; us kernel-only; "
          f"best skinny variant vs cuBLAS")
    for row in rows:
        sk = {k: v for k, v in row.items() if k.startswith("skinny")}
        best = min(sk, key=sk.get) if sk else "-"
        print(f"{row['shape']:>14} {row['w']} floor {row['floor']:6.2f} cublas {row['cublas']:6.2f}"
              f" old {row.get('old', float('nan')):6.2f} auto {row.get('auto', float('nan')):6.2f}"
              f" best {sk.get(best, float('nan')):6.2f} ({best}) "
              f"ratio {row['cublas'] / sk.get(best, float('inf')):.2f}")


def sanitize() -> None:
    """A small sweep of odd shapes for compute-sanitizer; exits 1 on a wrong result."""
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    failures = 0
    cases = [(1, 67, 33, {}), (3, 130, 257, {"b_t": True}), (17, 65, 300, {"offset": 1}),
             (8, 200, 64, {"beta": 0.5, "a_t": True}), (5, 129, 0, {"beta": 1.0}),
             (13, 1, 77, {"out_t": True}), (2, 96, 95, {"offset": 5, "b_t": True})]
    for m, n, k, kwargs in cases:
        for config in (skinny(8, 4, 1), skinny(16, 2, 4), skinny(32, 4, 2)):
            ok, what = check(m, n, k, torch.bfloat16, config, **kwargs)
            failures += not ok
            print(("PASS " if ok else "FAIL ") + what, flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("main", "sanitize", "precompile"))
    parser.add_argument("--out", default="/tmp/skinny-out")
    args = parser.parse_args()
    if args.mode == "main":
        main(Path(args.out))
    elif args.mode == "precompile":
        precompile()
    else:
        sanitize()
