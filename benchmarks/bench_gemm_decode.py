"""GEMM at decode shapes: gpurt.kernels.gemm against cuBLAS (torch.matmul), same process.

Each row is C[M,N] = A[M,K] @ B[K,N] (row-major, random normal inputs; ``--weights nk`` takes
B as the transpose of an N x K weight, as x @ W.T) with M the batch of a decoding step, and
two numbers per library:

- ``graph_us``: kernel-only, 20 calls captured in a CUDA graph (gpurt.graph / torch.cuda.graph)
  and replayed, device events around each replay, median of ``--repeat`` replays / 20. The
  calls rotate over enough copies of A and B that the B's together exceed 3x the L2 cache, so
  B comes from device memory, as a layer's weight does in a real decoding step;
- ``host_us``: one eager call with its host path, device events around the call (the GPU
  idles while the host prepares the launch), median of ``--repeat``, same rotation.

``copy_graph_us`` is the floor: bytes(B) over the copy bandwidth measured in this run (a 1 GiB
device-to-device copy, bytes read + written over time). ``rel_err`` is gpurt's relative
Frobenius error against float64. ``tf32`` rows are float32 inputs with ``allow_tf32=True``
against cuBLAS's TF32 (``torch.backends.cuda.matmul.allow_tf32``), at the ``--tf32-m`` batches;
``fp32`` rows exact float32 on both sides (TF32 off), at the ``--fp32-m`` batches.

    python benchmarks/bench_gemm_decode.py [--dtypes bf16,fp16,tf32] [--m 1,2,4,8,16,32,64,128]
                                           [--nk 4096x4096,11008x4096] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

from _common import print_rows, write_results

M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128)
NK = ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096))
CALLS = 20  # calls per graph
L2_MULTIPLE = 3


def _events_ms(torch: Any, fn: Callable[[], Any], repeat: int) -> float:
    """Median device time (ms) of fn() between two events on torch's current stream."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeat):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop))
    return statistics.median(samples)


def copy_bandwidth(torch: Any) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write) of a 1 GiB buffer."""
    src = torch.randint(0, 255, (1 << 30,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = _events_ms(torch, lambda: dst.copy_(src), 20)
    return 2 * (1 << 30) / (ms * 1e-3)


class Problem:
    """Rotating input sets of one shape, as torch tensors and gpurt arrays."""

    def __init__(self, gpurt: Any, torch: Any, m: int, n: int, k: int, dtype: Any,
                 weights_nk: bool, l2_bytes: int, tf32: bool | None = None) -> None:
        self.m, self.n, self.k, self.dtype = m, n, k, dtype
        # float32 rows are TF32 on both sides unless told (exact fp32: TF32 off on both)
        self.tf32 = dtype == torch.float32 if tf32 is None else tf32
        self.itemsize = 4 if dtype == torch.float32 else 2
        sets = max(2, min(24, -(-L2_MULTIPLE * l2_bytes // (n * k * self.itemsize))))
        self.a = [torch.randn(m, k, device="cuda", dtype=dtype) for _ in range(sets)]
        if weights_nk:
            self.b = [torch.randn(n, k, device="cuda", dtype=dtype).t() for _ in range(sets)]
        else:
            self.b = [torch.randn(k, n, device="cuda", dtype=dtype) for _ in range(sets)]
        self.out = torch.empty(m, n, device="cuda", dtype=dtype)
        self.ga = [gpurt.asarray(x) for x in self.a]
        self.gb = [gpurt.asarray(x) for x in self.b]
        self.gout = gpurt.asarray(self.out)

    @property
    def sets(self) -> int:
        return len(self.a)

    def rel_error(self, torch: Any) -> float:
        ref = self.a[0].double() @ self.b[0].double()
        return float(torch.linalg.norm(self.out.double() - ref) / torch.linalg.norm(ref))


def gpurt_graph_us(gpurt: Any, gemm: Callable[..., Any], p: Problem, config: Any,
                   repeat: int, torch: Any) -> float:
    """Kernel-only time of gpurt's gemm: CALLS calls in one gpurt graph, replayed."""
    stream = gpurt.Stream()
    for i in range(p.sets):  # compiles and loads outside the capture
        gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream, config=config)
    stream.synchronize()
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        for i in range(CALLS):
            gemm(p.ga[i % p.sets], p.gb[i % p.sets], out=p.gout, stream=stream, config=config)
    with gpurt.stream(stream), torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        graph.replay()
        ms = _events_ms(torch, graph.replay, repeat)
    graph.reset()
    return ms * 1e3 / CALLS


def torch_graph_us(torch: Any, p: Problem, repeat: int) -> float:
    """Kernel-only time of torch.matmul (cuBLAS): CALLS calls in one torch graph, replayed."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for i in range(p.sets):
            torch.matmul(p.a[i], p.b[i], out=p.out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            torch.matmul(p.a[i % p.sets], p.b[i % p.sets], out=p.out)
    graph.replay()
    ms = _events_ms(torch, graph.replay, repeat)
    del graph
    return ms * 1e3 / CALLS


def host_us(torch: Any, call: Callable[[int], Any], sets: int, repeat: int) -> float:
    """One eager call with its host path: events around it, rotating over the input sets."""
    state = {"i": 0}

    def one() -> None:
        state["i"] += 1
        call(state["i"] % sets)

    for _ in range(sets):
        one()
    return _events_ms(torch, one, repeat) * 1e3


def measure(gpurt: Any, torch: Any, gemm_mod: Any, p: Problem, config: Any, copy_bps: float,
            repeat: int) -> dict[str, Any]:
    """One row: both numbers for gpurt (``config``, or gemm's choice for None) and cuBLAS."""
    gemm = functools.partial(gemm_mod.gemm, allow_tf32=p.tf32)
    stream = gpurt.Stream()
    torch_stream = torch.cuda.ExternalStream(stream.cuda_stream)
    with torch.cuda.stream(torch_stream):
        ours_graph = gpurt_graph_us(gpurt, gemm, p, config, repeat, torch)
        theirs_graph = torch_graph_us(torch, p, repeat)
        ours_host = host_us(torch, lambda i: gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream,
                                                  config=config), p.sets, repeat)
        theirs_host = host_us(torch, lambda i: torch.matmul(p.a[i], p.b[i], out=p.out), p.sets,
                              repeat)
        p.out.fill_(float("nan"))
        gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream, config=config)
        torch_stream.synchronize()
        err = p.rel_error(torch)
    if config is None:
        plans = importlib.import_module("gpurt.kernels._gemm_plan")
        choosing = importlib.import_module("gpurt.kernels._gemm_choose")
        plan, _, _ = plans.make_plan(p.ga[0], p.gb[0], p.gout, 0.0, None, False, False, stream)
        config = choosing.choose(plan, plans.problem_of(plan, p.tf32), stream)
    floor_us = p.n * p.k * p.itemsize / copy_bps * 1e6
    return {
        "shape": f"{p.m}x{p.n}x{p.k}",
        "dtype": "tf32" if p.tf32 else str(p.dtype).replace("torch.", ""),
        "config": config.label(),
        "gpurt_graph_us": round(ours_graph, 2), "cublas_graph_us": round(theirs_graph, 2),
        "copy_graph_us": round(floor_us, 2),
        "gpurt_host_us": round(ours_host, 2), "cublas_host_us": round(theirs_host, 2),
        "ratio_graph": round(theirs_graph / ours_graph, 3),
        "ratio_host": round(theirs_host / ours_host, 3), "rel_err": float(f"{err:.3g}"),
    }


def parse_nk(text: str | None) -> list[tuple[int, int]]:
    if not text:
        return list(NK)
    pairs = [item.lower().split("x") for item in text.split(",")]
    return [(int(n), int(k)) for n, k in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,fp16,tf32")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)))
    parser.add_argument("--nk", default=None, help="comma list of NxK")
    parser.add_argument("--fp16-m", default="1,16", help="M values for fp16 (fewer rows)")
    parser.add_argument("--tf32-m", default="1,16,64", help="M values for tf32")
    parser.add_argument("--fp32-m", default="1,4,16", help="M values for exact fp32")
    parser.add_argument("--weights", choices=("kn", "nk"), default="kn")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    import gpurt

    gemm_mod = importlib.import_module("gpurt.kernels.gemm")
    torch.manual_seed(0)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    copy_bps = copy_bandwidth(torch)
    print(f"copy bandwidth {copy_bps / 1e9:.0f} GB/s, L2 {l2_bytes >> 20} MiB", flush=True)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
              "fp32": torch.float32}
    rows: list[dict[str, Any]] = []
    for name in args.dtypes.split(","):
        ms = {"bf16": args.m, "fp16": args.fp16_m, "tf32": args.tf32_m, "fp32": args.fp32_m}[name]
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"  # cuBLAS as gpurt multiplies
        for n, k in parse_nk(args.nk):
            for m in (int(v) for v in ms.split(",")):
                p = Problem(gpurt, torch, m, n, k, dtypes[name], args.weights == "nk", l2_bytes,
                            tf32=name == "tf32")
                try:
                    row = measure(gpurt, torch, gemm_mod, p, None, copy_bps, args.repeat)
                except Exception as exc:  # keep the other rows
                    print(f"{m}x{n}x{k} {name}: {exc!r}", file=sys.stderr, flush=True)
                    continue
                row["weights"] = args.weights
                rows.append(row)
                print(row, flush=True)
                write_results("gemm_decode", rows, args.json)  # kept if a time limit cuts the run
                del p
    for row in rows:
        row["autotune"] = os.environ.get("GPURT_GEMM_AUTOTUNE", "1")
    write_results("gemm_decode", rows, args.json)
    print_rows("GEMM at decode shapes: gpurt vs cuBLAS, us (graph = kernel-only, host = one "
               "eager call); copy = bytes(B) / copy bandwidth", rows)


if __name__ == "__main__":
    main()
