"""Session 8's split-K check (issue 17): the fused split-K ending (the last CTA of a tile sums
the K slices) timed at the shapes that split, kernel-only (bench_gemm_decode's graph replay over
rotating inputs) and as one call with the host path, cuBLAS (torch.matmul) in the same process;
each config's output bits on one seeded input are saved, so a run of main's kernels and a run of
this tree's can be compared bit for bit (the sums keep slice order).

    python benchmarks/splitk_dev.py precompile | sanitize | time [--json PATH] [--bits PATH]
    python benchmarks/splitk_dev.py compare OLD.json NEW.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPEAT = 20


def _modules() -> tuple[Any, Any, Any, Any]:
    import gpurt

    gm = importlib.import_module("gpurt.kernels.gemm")
    tune = importlib.import_module("gpurt.kernels._gemm_tune")
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    return gpurt, gm, tune, launch


def _cases(tune: Any) -> list[tuple[int, int, int, str, bool, list[Any]]]:
    """(M, N, K, dtype name, allow_tf32, configs): None is gemm's own choice (the heuristic)."""
    Config = tune.Config

    def split(config: Any, k: int) -> Any:
        return dataclasses.replace(config, split_k=k)

    wg128, wg256, mma64 = tune._WGMMA[1], tune._WGMMA[0], tune._MMA[2]

    def dc(bm: int, bn: int, stages: int, k: int) -> Any:
        return Config("decode", bm, bn, 64, stages=stages, split_k=k)

    simt = tune._SIMT[4]  # 64 x 64 x 8: the heuristic's at these shapes
    return [
        (128, 128, 4096, "bfloat16", False, [None] + [split(wg128, k) for k in (2, 4, 8)]),
        (128, 4096, 4096, "bfloat16", False,
         [None] + [split(wg128, k) for k in (2, 4, 8)]
         + [dc(128, 128, 3, 4), dc(128, 64, 4, 4), dc(64, 128, 6, 2)]),
        (64, 4096, 4096, "bfloat16", False, [None, dc(128, 64, 4, 4), dc(64, 64, 6, 2)]),
        (256, 256, 8192, "bfloat16", False,
         [None] + [split(wg128, k) for k in (2, 4, 8)] + [split(wg256, k) for k in (2, 4)]),
        (16, 4096, 4096, "bfloat16", False, [None, split(mma64, 17), split(mma64, 8)]),
        (16, 4096, 4096, "float32", True, [None, split(tune._TF32[1], 17)]),
        (128, 4096, 4096, "float32", False,
         [None] + [split(simt, k) for k in (4, 8, 17)]),
        (16, 4096, 4096, "float32", False, [None, split(simt, 17), split(simt, 4)]),
    ]


def _problem(tune: Any, m: int, n: int, k: int, dtype: str, tf32: bool) -> Any:
    dt = {"bfloat16": tune.DT_BF16, "float16": tune.DT_F16,
          "float32": tune.DT_TF32 if tf32 else tune.DT_F32}[dtype]
    return tune.Problem(m, n, k, dt, True, False, True, True, (9, 0), 132)  # B row-major


def precompile() -> None:
    """Every program the timing and the sanitizer run compiles, in parallel, into the cache."""
    import numpy as np

    _, _, tune, launch = _modules()
    jobs = set()
    for m, n, k, dtype, tf32, configs in _cases(tune):
        p = _problem(tune, m, n, k, dtype, tf32)
        for config in configs:
            jobs.add(launch.program(config or tune.heuristic(p), p))
    gpurt = _modules()[0]
    for config, dtype, m, n, k, tf32 in _sanitize_cases(gpurt, tune):
        dt = {"float16": tune.DT_F16, "bfloat16": tune.DT_BF16}.get(
            str(np.dtype(dtype)), tune.DT_TF32 if tf32 else tune.DT_F32)
        vec = (n * np.dtype(dtype).itemsize) % 16 == 0 and (k * np.dtype(dtype).itemsize) % 16 == 0
        p = tune.Problem(m, n, k, dt, True, False, vec, vec, (9, 0), 132)
        jobs.add(launch.program(config, p))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


def _label(config: Any) -> str:
    return "auto" if config is None else config.label()


def time_all(json_path: str | None, bits_path: str | None) -> None:
    import bench_gemm_decode as bench
    import torch

    gpurt, _, tune, _ = _modules()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows: list[dict[str, Any]] = []
    bits: dict[str, str] = {}
    for m, n, k, dtype, tf32, configs in _cases(tune):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.manual_seed(m + n + k)  # the same inputs in main's run and this tree's
        p = bench.Problem(gpurt, torch, m, n, k, getattr(torch, dtype), False, l2)
        shape = f"{m}x{n}x{k} {dtype}{' tf32' if tf32 else ''}"
        for row, digest in _time_shape(p, shape, configs, tf32):
            rows.append(row)
            if digest:
                bits[f"{shape} {row['config']}"] = digest
            print(json.dumps(row), flush=True)
            if json_path:
                Path(json_path).write_text(json.dumps(rows, indent=1))
            if bits_path:
                Path(bits_path).write_text(json.dumps(bits, indent=1))


def _time_shape(p: Any, shape: str, configs: list[Any],
                tf32: bool) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, digest of the output's bits) of each config on ``p``: gpurt's and cuBLAS's
    kernel-only and single-call times, gpurt's error against float64."""
    import bench_gemm_decode as bench
    import torch

    gpurt, gm, _, _ = _modules()
    stream = gpurt.Stream()
    torch_stream = torch.cuda.ExternalStream(stream.cuda_stream)
    with torch.cuda.stream(torch_stream):
        cublas_graph = bench.torch_graph_us(torch, p, REPEAT)
        cublas_host = bench.host_us(
            torch, lambda i: torch.matmul(p.a[i], p.b[i], out=p.out), p.sets, REPEAT)
    for config in configs:
        row: dict[str, Any] = {"shape": shape, "config": _label(config),
                               "cublas_graph_us": round(cublas_graph, 2),
                               "cublas_host_us": round(cublas_host, 2)}
        if config is None:
            row["chosen"] = gm.gemm_config(p.ga[0], p.gb[0], allow_tf32=tf32).label()

        def call(i: int, config: Any = config) -> Any:
            return gm.gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream, config=config,
                           allow_tf32=tf32)

        digest = ""
        try:
            with torch.cuda.stream(torch_stream):
                graph = _graph_us(gpurt, torch, p, call, stream)
                host = bench.host_us(torch, call, p.sets, REPEAT)
                p.out.fill_(float("nan"))
                call(0)
                torch_stream.synchronize()
            row.update(gpurt_graph_us=round(graph, 2), gpurt_host_us=round(host, 2),
                       ratio_graph=round(cublas_graph / graph, 3),
                       ratio_host=round(cublas_host / host, 3),
                       rel_err=float(f"{p.rel_error(torch):.3g}"))
            raw = p.out if p.out.dtype == torch.float32 else p.out.view(torch.int16)
            digest = hashlib.sha256(raw.cpu().numpy().tobytes()).hexdigest()[:16]
        except Exception as exc:  # noqa: BLE001 - report and go on
            row["error"] = repr(exc)[:300]
        yield row, digest


def _graph_us(gpurt: Any, torch: Any, p: Any, call: Any, stream: Any) -> float:
    """Kernel-only us per call: bench_gemm_decode's CUDA graph of its CALLS calls on
    ``stream`` (torch's current stream too), replayed."""
    import bench_gemm_decode as bench

    for i in range(p.sets):  # compiles and loads outside the capture
        call(i)
    stream.synchronize()
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        for i in range(bench.CALLS):
            call(i % p.sets)
    with gpurt.stream(stream):
        graph.replay()
        ms = bench._events_ms(torch, graph.replay, REPEAT)
    graph.reset()
    return ms * 1e3 / bench.CALLS


def _sanitize_cases(gpurt: Any, tune: Any) -> list[tuple[Any, Any, int, int, int, bool]]:
    """(config, dtype, M, N, K, allow_tf32) of the sanitizer's split-K calls."""
    import numpy as np

    bf16 = gpurt.bfloat16

    def split(config: Any, k: int) -> Any:
        return dataclasses.replace(config, split_k=k)

    def dc(bm: int, bn: int, stages: int, k: int) -> Any:
        return tune.Config("decode", bm, bn, 64, stages=stages, split_k=k)

    return [(split(tune._WGMMA[1], 3), bf16, 200, 264, 1000, False),
            (split(tune._WGMMA[0], 5), np.float16, 136, 264, 1032, False),
            (split(tune._WGMMA[1], 17), bf16, 72, 136, 2056, False),
            (split(tune._MMA[3], 7), bf16, 131, 264, 1000, False),
            (split(tune._MMA[2], 17), np.float16, 16, 520, 4096, False),
            (split(tune._TF32[1], 5), np.float32, 168, 264, 1000, True),
            (split(tune._SIMT[3], 4), np.float32, 131, 77, 1003, False),
            (split(tune._SIMT[3], 17), np.float32, 16, 260, 4096, False),
            (dc(128, 128, 3, 4), bf16, 100, 264, 1032, False),
            (dc(128, 64, 4, 4), bf16, 64, 136, 2056, False)]


def sanitize() -> None:
    """A few split-K calls of every kernel that splits, each against float64 (for memcheck and
    racecheck): wgmma (128 and 256 wide, odd edges), mma, TF32, simt (odd M x N) and the decode
    kernel's cluster split (s8-decode-next's configs)."""
    import numpy as np

    gpurt, gm, tune, _ = _modules()
    rng = np.random.default_rng(5)
    cases = _sanitize_cases(gpurt, tune)
    failed = 0
    for config, dtype, m, n, k, tf32 in cases:
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        c = rng.standard_normal((m, n)).astype(dtype)
        want = 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) - 1.5 * c.astype(np.float64)
        out = gpurt.asarray(np.full((m, n), np.nan, dtype))
        try:
            gm.gemm(gpurt.asarray(a), gpurt.asarray(b), out=out, alpha=0.5, beta=-1.5,
                    c=gpurt.asarray(c), config=config, allow_tf32=tf32)
            got = out.to_numpy().astype(np.float64)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"ERROR {config.label()}: {exc!r}", flush=True)
            err = float("inf")
        ok = err < (5e-3 if tf32 or dtype != np.float32 else 1e-4)
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {config.label()} {m}x{n}x{k} err={err:.3g}", flush=True)
    print(f"{len(cases) - failed}/{len(cases)} passed")
    sys.exit(1 if failed else 0)


def compare(old_path: str, new_path: str) -> None:
    """Bits and kernel-only times of main's run next to this tree's."""
    old = {(r["shape"], r["config"]): r for r in json.loads(Path(old_path).read_text())}
    new = json.loads(Path(new_path).read_text())
    print(f"{'shape':>28} {'config':<36} {'cuBLAS':>7} {'before':>7} {'after':>7} "
          f"{'x cuBLAS before/after':>22} host after/cuBLAS")
    for row in new:
        before = old.get((row["shape"], row["config"]), {})
        print(f"{row['shape']:>28} {row.get('chosen', row['config'])[:36]:<36} "
              f"{row['cublas_graph_us']:>7} {before.get('gpurt_graph_us', '-'):>7} "
              f"{row.get('gpurt_graph_us', row.get('error', '-')):>7} "
              f"{before.get('ratio_graph', '-'):>10} {row.get('ratio_graph', '-'):>10}   "
              f"{row.get('gpurt_host_us', '-')}/{row['cublas_host_us']}")
    old_bits = Path(old_path).with_suffix(".bits.json")
    new_bits = Path(new_path).with_suffix(".bits.json")
    if old_bits.exists() and new_bits.exists():
        a, b = json.loads(old_bits.read_text()), json.loads(new_bits.read_text())
        same = [key for key in b if a.get(key) == b[key]]
        differ = [key for key in b if key in a and a[key] != b[key]]
        print(f"bits: {len(same)} identical, {len(differ)} differ: {differ}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "sanitize", "time", "compare"))
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--json", default=None)
    parser.add_argument("--bits", default=None)
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile()
    elif args.mode == "sanitize":
        sanitize()
    elif args.mode == "time":
        time_all(args.json, args.bits)
    else:
        compare(*args.paths)
