"""What a thread-block cluster costs a launch, apart from any GEMM (issue 17, session 16).

Session 15 measured +1 us for the 64 x 128 wgmma tile in 2-CTA clusters on one-tile grids even
without multicast. This probe separates the launch from the kernel: one CTA per SM (dynamic
shared memory), 384 threads, a grid of G CTAs in clusters of C, each CTA spinning S ns on
%globaltimer; optionally a cluster barrier at the start and the end (as the GEMM has).
Kernel-only: 20 launches captured in a CUDA graph, replayed, device events, median of 30; and
one eager launch's per-CTA start times (spread of the CTAs' first instruction, by cluster rank).

    python benchmarks/cluster_cost_dev.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

import gpurt

SOURCE = r"""
__device__ __forceinline__ unsigned long long now() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void __launch_bounds__(384, 1)
probe(unsigned long long* out, unsigned spin, int mode) {
    extern __shared__ unsigned char smem[];
    const unsigned long long t0 = now();
    if (mode & 1) asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait.acquire;\n"
                               ::: "memory");
    if (threadIdx.x == 0) {
        unsigned long long t = t0;
        while (t - t0 < spin) t = now();
        smem[0] = (unsigned char)t;
    }
    __syncthreads();
    if (mode & 2) asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n"
                               ::: "memory");
    if (threadIdx.x == 0) {
        unsigned smid; asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        out[3 * blockIdx.x] = t0;
        out[3 * blockIdx.x + 1] = now();
        out[3 * blockIdx.x + 2] = smid;
    }
}
"""

CALLS, REPEATS = 20, 30


def graph_us(kernel, config, args, stream) -> float:
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        for _ in range(CALLS):
            kernel.launch(config, *args, stream=stream)
    times = []
    with gpurt.stream(stream):
        for _ in range(3):
            graph.replay()
        for _ in range(REPEATS):
            start, end = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
            start.record(stream)
            graph.replay()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / CALLS)
    return round(statistics.median(times), 3)


def starts(kernel, config, grid, spin, mode, stream) -> dict:
    out = gpurt.empty(3 * grid, dtype="uint64")
    kernel.launch(config, out, spin, mode, stream=stream)
    stream.synchronize()
    rows = out.numpy().reshape(grid, 3)
    t0 = rows[:, 0].astype(np.int64)
    t1 = rows[:, 1].astype(np.int64)
    first = t0.min()
    return {"start_spread_ns": int(t0.max() - first), "start_p50_ns": int(np.median(t0 - first)),
            "end_max_ns": int(t1.max() - first), "sms": int(len(set(rows[:, 2].tolist())))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    gpurt.set_device(0)
    kernel = gpurt.compile(SOURCE)["probe"]
    smem = 200 * 1024
    scratch = gpurt.empty(3 * 132, dtype="uint64")
    stream = gpurt.Stream()
    rows = []
    print(gpurt.get_device_name(), flush=True)
    for grid in (64, 128, 132):
        for spin in (0, 5000):
            for cluster in (1, 2, 4):
                if grid % cluster:
                    continue
                for mode in ((0,) if cluster == 1 else (0, 3)):
                    for shared in (0, smem):
                        config = gpurt.LaunchConfig(grid, 384, shared,
                                                    cluster=None if cluster == 1 else cluster)
                        us = graph_us(kernel, config, (scratch, spin, mode), stream)
                        row = {"grid": grid, "cluster": cluster, "spin_ns": spin, "mode": mode,
                               "smem_kb": shared // 1024, "graph_us": us}
                        row |= starts(kernel, config, grid, spin, mode, stream)
                        rows.append(row)
                        print(row, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": gpurt.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
