"""GEMM: gpurt.kernels.gemm against cuBLAS (torch.matmul) in the same process.

Each row is one problem C[M,N] = A[M,K] @ B[K,N] (row-major, random normal inputs) in one
dtype: gpurt's TFLOP/s with the config it chose (autotuned unless GPURT_GEMM_AUTOTUNE=0),
cuBLAS's through torch.matmul (fp32 rows with TF32 off, tf32 rows with it on), their ratio,
and gpurt's relative Frobenius error against a float64 product. Two times per library:

- kernel-only (``*_ms``, TFLOP/s): median of ``--repeat`` samples, each the driver-event time
  of a batch of back-to-back calls enqueued behind a short spin kernel, so host overhead
  never shows as device time;
- single call (``*_call_us``, gemm's choice only): events around one eager call on an idle
  GPU, so the host path (argument checks, plan lookup, launch) is included; median of
  ``--repeat``;
- kernel-only cold (``*_graph_us``, gemm's choice only): 20 calls captured in one CUDA graph
  (gpurt's for gpurt, torch's for cuBLAS) over input sets that rotate through at least 3x the
  L2's bytes, replayed (bench_gemm_decode.py's harness): the issue-17 measure, which the
  back-to-back batches above, on one input set, cannot be for problems the L2 holds (they
  time the L2; METHOD.md: rotate input sets).

    python benchmarks/bench_gemm.py [--dtypes bf16,fp16,fp32,tf32] [--shapes 4096,8192x8192x512]
                                    [--configs] [--json PATH]

``--configs`` adds one row per candidate config of every problem (the tuner's view).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import device_ms, print_rows, write_results
from bench_gemm_decode import Problem as RotatingProblem
from bench_gemm_decode import gpurt_graph_us, torch_graph_us
from cuda.bindings import driver as cu

SQUARE = [1024, 2048, 4096, 8192]
OTHER = [(8192, 8192, 512), (16, 4096, 4096), (128, 4096, 4096), (4096, 4096, 1024),
         (2048, 8192, 8192), (8192, 2048, 4096), (127, 257, 61), (1000, 1000, 1000),
         (3000, 5000, 2000), (4099, 4099, 4099),
         (2000, 3000, 1000), (3000, 3000, 3000),  # split rows: the cluster configs (session 9)
         (256, 11008, 4096), (1536, 1536, 1536),  # 128 x 192 tiles (session 10, s10-tile192)
         (256, 4096, 4096), (768, 768, 768),  # 64 x 128 tiles (session 11, s11-tile64)
         (3000, 3000, 1000), (6000, 6000, 2000),  # 192 x 192 in 2 x 1 clusters (session 12)
         (640, 640, 640), (768, 3000, 1536),  # 64 x 80 of C^T; split-row 192 x 128 (session 14)
         # rows TMA cannot read (8198-byte 16-bit rows): the packed route, the rowload kernel
         # (M <= 4) or the mma path where the copies would not pay (kernels/_gemm_pack.py)
         (4099, 4096, 4096), (4096, 4099, 4096), (4096, 4096, 4099), (2053, 3001, 1999),
         (1, 4099, 4099), (4, 4099, 4099), (16, 4099, 4099), (128, 4099, 4099)]
FP32_LIMIT = 4096  # fp32 rows above this size take seconds each on the SIMT cores
# fp32 rows beyond the limit: issue 17's decode projections and irregular sizes
FP32_EXTRA = [(64, 4096, 4096), (32, 11008, 4096), (128, 14336, 4096), (3000, 5000, 2000),
              (4099, 4099, 4099)]
SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _ok(result: tuple) -> Any:
    if int(result[0]) != 0:
        raise RuntimeError(f"driver call failed: {result[0]!r}")
    return result[1] if len(result) == 2 else None


class Timer:
    """Device time of a batch of calls queued behind a spin kernel on one stream."""

    def __init__(self, gpurt: Any, stream: Any) -> None:
        self.stream = stream
        self.handle = stream.cuda_stream
        self.spin = gpurt.compile(SPIN)["spin"]
        self.start = _ok(cu.cuEventCreate(0))
        self.stop = _ok(cu.cuEventCreate(0))

    def ms(self, fn: Callable[[], Any], batch: int, repeat: int) -> float:
        fn()
        _ok(cu.cuStreamSynchronize(self.handle))
        samples = []
        for _ in range(repeat):
            cycles = int(2e9 * (1e-3 + batch * 2e-4))  # ~1 ms + 0.2 ms per queued call
            self.spin(1, 1, (np.int64(cycles),), stream=self.stream)
            _ok(cu.cuEventRecord(self.start, self.handle))
            for _ in range(batch):
                fn()
            _ok(cu.cuEventRecord(self.stop, self.handle))
            _ok(cu.cuEventSynchronize(self.stop))
            samples.append(float(_ok(cu.cuEventElapsedTime(self.start, self.stop))) / batch)
        return statistics.median(samples)

    def call_us(self, fn: Callable[[], Any], repeat: int) -> float:
        """One call with its host path: the GPU idles while the host prepares the launch."""
        return device_ms(fn, self.handle, repeat=repeat, warmup=1) * 1e3


def parse_shapes(text: str | None) -> list[tuple[int, int, int]]:
    if not text:
        return [(s, s, s) for s in SQUARE] + OTHER
    shapes = []
    for item in text.split(","):
        dims = [int(v) for v in item.lower().split("x")]
        shapes.append(tuple(dims * 3 if len(dims) == 1 else dims))  # type: ignore[arg-type]
    return shapes


def rel_error(out: Any, a: Any, b: Any, torch: Any) -> float:
    ref = a.double() @ b.double()
    return float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,fp16,fp32,tf32")
    parser.add_argument("--shapes", default=None, help="comma list of S or MxNxK")
    parser.add_argument("--configs", action="store_true", help="time every candidate config")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    import gpurt

    gemm_mod = importlib.import_module("gpurt.kernels.gemm")
    tune = importlib.import_module("gpurt.kernels._gemm_tune")
    torch.manual_seed(0)
    stream = gpurt.Stream()
    torch_stream = torch.cuda.ExternalStream(stream.cuda_stream)
    timer = Timer(gpurt, stream)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
              "tf32": torch.float32}
    rows: list[dict[str, Any]] = []
    with torch.cuda.stream(torch_stream):
        for name in args.dtypes.split(","):
            tdtype = dtypes[name]
            tf32 = name == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32
            shapes = parse_shapes(args.shapes)
            if tdtype == torch.float32 and not args.shapes:  # fp32 and tf32
                shapes = [s for s in shapes if max(s) <= FP32_LIMIT]
                if name == "fp32":
                    shapes += [s for s in FP32_EXTRA if s not in shapes]
            for m, n, k in shapes:
                a = torch.randn(m, k, device="cuda", dtype=tdtype)
                b = torch.randn(k, n, device="cuda", dtype=tdtype)
                out = torch.empty(m, n, device="cuda", dtype=tdtype)
                ref_out = torch.empty(m, n, device="cuda", dtype=tdtype)
                flops = 2.0 * m * n * k
                batch = max(1, min(50, int(2e11 / flops)))
                ga, gb, gout = gpurt.asarray(a), gpurt.asarray(b), gpurt.asarray(out)

                def ours(config: Any = None, ga: Any = ga, gb: Any = gb, gout: Any = gout,
                         tf32: bool = tf32) -> None:
                    gemm_mod.gemm(ga, gb, out=gout, stream=stream, allow_tf32=tf32,
                                  config=config)

                ours()  # tunes (once per shape bucket) and compiles outside the timing
                plan, _, _ = _plan_problem(gemm_mod, ga, gb, gout, stream, tf32)
                routes = importlib.import_module("gpurt.kernels._gemm_route")
                chosen = routes.label(routes.plan_call(plan, tf32, None, stream))
                cublas_ms = timer.ms(lambda a=a, b=b, ref_out=ref_out:
                                     torch.matmul(a, b, out=ref_out), batch, args.repeat)
                configs = [None]
                if args.configs:
                    plan, problem, _ = _plan_problem(gemm_mod, ga, gb, gout, stream, tf32)
                    configs += tune.candidates(problem)
                for config in configs:
                    try:
                        ms = timer.ms(lambda config=config, ours=ours: ours(config), batch,
                                      args.repeat)
                        err = rel_error(out, a, b, torch)
                    except Exception as exc:  # a variant that cannot run this problem
                        print(f"{m}x{n}x{k} {name} {config}: {exc}", file=sys.stderr)
                        continue
                    rows.append({
                        "shape": f"{m}x{n}x{k}", "dtype": name,
                        "config": config.label() if config else chosen + " *",
                        "gpurt_tflops": round(flops / ms / 1e9, 1),
                        "cublas_tflops": round(flops / cublas_ms / 1e9, 1),
                        "ratio": round(cublas_ms / ms, 3), "gpurt_ms": round(ms, 4),
                        "cublas_ms": round(cublas_ms, 4), "rel_err": float(f"{err:.3g}"),
                    })
                    if config is None:
                        rows[-1]["gpurt_call_us"] = round(timer.call_us(ours, args.repeat), 2)
                        rows[-1]["cublas_call_us"] = round(timer.call_us(
                            lambda a=a, b=b, ref_out=ref_out: torch.matmul(a, b, out=ref_out),
                            args.repeat), 2)
                        rows[-1].update(_graph_times(gpurt, torch, gemm_mod, m, n, k, tdtype,
                                                     tf32, args.repeat))
                    print(rows[-1], flush=True)
                    if args.json:  # keep what was measured if a time limit cuts the run
                        write_results("gemm", rows, args.json)
                del a, b, out, ref_out, ga, gb, gout, ours  # ours holds ga, gb, gout too
    for row in rows:
        row["autotune"] = os.environ.get("GPURT_GEMM_AUTOTUNE", "1")
    write_results("gemm", rows, args.json)
    print_rows("GEMM: gpurt vs cuBLAS (torch.matmul), TFLOP/s; * = the config gemm chose", rows)


def _graph_times(gpurt: Any, torch: Any, gemm_mod: Any, m: int, n: int, k: int, tdtype: Any,
                 tf32: bool, repeat: int) -> dict[str, float]:
    """Kernel-only cold times (us) of gemm's choice and of cuBLAS: graph replays over
    rotating input sets (bench_gemm_decode's Problem: at least 3x the L2 of B, 2 sets at
    least), both in the same process."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = RotatingProblem(gpurt, torch, m, n, k, tdtype, False, l2)

    def gemm(*args: Any, **kwargs: Any) -> Any:
        return gemm_mod.gemm(*args, allow_tf32=tf32, **kwargs)

    ours = gpurt_graph_us(gpurt, gemm, sets, None, repeat, torch)
    cublas = torch_graph_us(torch, sets, repeat)
    return {"gpurt_graph_us": round(ours, 2), "cublas_graph_us": round(cublas, 2),
            "graph_ratio": round(cublas / ours, 3)}


def _plan_problem(gemm_mod: Any, a: Any, b: Any, out: Any, stream: Any, tf32: bool) -> tuple:
    plans = importlib.import_module("gpurt.kernels._gemm_plan")
    plan, _, _ = plans.make_plan(a, b, out, 0.0, None, False, False, stream)
    return plan, plans.problem_of(plan, tf32), stream


if __name__ == "__main__":
    main()
