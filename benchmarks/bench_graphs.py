"""100 tiny kernels: eager launches vs one CUDA graph replay, gpurt vs torch.cuda.CUDAGraph.

Each row is one way of running the same sequence (``--kernels`` increments of a 256-float
array, one kernel each) on a side stream, in this process:
  host_us    host time to enqueue the whole sequence once (median; the stream is drained
             between samples so a full launch queue never stalls the host),
  device_ms  device time of one sequence (driver events around it, median).
Targets (DESIGN.md): gpurt's replay no slower than torch's; capture cuts host time >= 4x
against gpurt's own eager launches. A raw cuGraphLaunch row shows the floor.

    python benchmarks/bench_graphs.py [--kernels 100] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import device_ms, peer, print_rows, write_results
from cuda.bindings import driver as cu

SOURCE = r"""
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""
N = 256
BATCH = 5  # sequences per host-time sample: at most a few hundred kernels in flight


def host_us(fn: Callable[[], Any], drain: Callable[[], Any], repeat: int = 40) -> float:
    """Median host time of one ``fn()``, timing ``BATCH`` calls between drains."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeat):
        drain()
        t0 = time.perf_counter()
        for _ in range(BATCH):
            fn()
        samples.append((time.perf_counter() - t0) / BATCH * 1e6)
    drain()
    return statistics.median(samples)


def gpurt_rows(kernels: int) -> list[dict[str, Any]]:
    import gpurt

    add_one = gpurt.compile(SOURCE)["add_one"]
    stream = gpurt.Stream()
    with stream:
        x = gpurt.zeros(N)  # on `stream`, like every kernel below
        args = (x, np.int32(N))

        def eager() -> None:
            for _ in range(kernels):
                add_one(1, N, args)

        eager()  # loads the module before capture
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph, stream=stream):
            eager()
        exec_, handle = graph.raw_cuda_graph_exec(), stream.cuda_stream

        def raw_launch() -> None:  # the floor: the bare driver call, result unchecked
            cu.cuGraphLaunch(exec_, handle)

        rows = []
        for mode, fn in (("eager", eager), ("graph replay", graph.replay),
                         ("raw cuGraphLaunch", raw_launch)):
            rows.append({
                "impl": "gpurt", "mode": mode,
                "host_us": host_us(fn, stream.synchronize),
                "device_ms": device_ms(fn, handle),
            })
        # the replays did what eager launches do
        stream.synchronize()
        x.copy_(np.zeros(N, np.float32))
        eager()
        graph.replay()
        stream.synchronize()
        assert np.all(x.numpy() == 2 * kernels), "graph replay gave a different result"
    return rows


def torch_rows(kernels: int) -> list[dict[str, Any]]:
    torch = peer("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    x = torch.zeros(N, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):

        def eager() -> None:
            for _ in range(kernels):
                x.add_(1)

        eager()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            eager()
        rows = []
        for mode, fn in (("eager", eager), ("graph replay", graph.replay)):
            rows.append({
                "impl": f"torch {torch.__version__}", "mode": mode,
                "host_us": host_us(fn, stream.synchronize),
                "device_ms": device_ms(fn, stream.cuda_stream),
            })
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The two target ratios, from the rows."""
    by = {(r["impl"].split()[0], r["mode"]): r["host_us"] for r in rows}
    out: dict[str, Any] = {
        "gpurt_capture_host_speedup": by[("gpurt", "eager")] / by[("gpurt", "graph replay")],
    }
    out["capture_target_met(>=4x)"] = out["gpurt_capture_host_speedup"] >= 4.0
    if ("torch", "graph replay") in by:
        ratio = by[("gpurt", "graph replay")] / by[("torch", "graph replay")]
        out["gpurt_replay_over_torch_replay"] = ratio
        out["replay_target_met(<=1.0)"] = ratio <= 1.0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--json", default=None, help="write results here")
    opts = parser.parse_args()
    rows = gpurt_rows(opts.kernels) + torch_rows(opts.kernels)
    for row in rows:
        row["kernels"] = opts.kernels
    print_rows(f"{opts.kernels} tiny kernels: eager vs CUDA graph replay", rows)
    result = summary(rows)
    for key, value in result.items():
        print(f"{key}: {value:.3g}" if isinstance(value, float) else f"{key}: {value}")
    write_results("graphs", rows + [{"summary": result}], opts.json)


if __name__ == "__main__":
    main()
