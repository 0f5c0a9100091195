"""What a thread-block cluster costs a launch, apart from any GEMM (issue 17, session 16).

Session 15 measured +1 us for the 64 x 128 wgmma tile in 2-CTA clusters on one-tile grids even
without multicast. This probe separates the launch from the kernel: one CTA per SM (dynamic
shared memory), 384 threads, a grid of G CTAs in clusters of C, each CTA spinning S ns on
%globaltimer; optionally a cluster barrier at the start and the end (as the GEMM has)
(``probe``); then the end barrier's forms, release against relaxed and the fences restricted to
shared memory, after every thread wrote shared (and global) memory (``ends``). Kernel-only: 20
launches captured in a CUDA graph, replayed, device events, median of 30; and one eager
launch's per-CTA %globaltimer stamps (the CTAs' first instruction, each barrier's time).

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
// Thread 0's stamps: its start, the start barrier's end, the end barrier's start, now, its SM.
__device__ __forceinline__ void stamp(unsigned long long* out, unsigned long long t0,
                                      unsigned long long tb, unsigned long long tc) {
    if (threadIdx.x != 0) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    out[5 * blockIdx.x] = t0;
    out[5 * blockIdx.x + 1] = tb;
    out[5 * blockIdx.x + 2] = tc;
    out[5 * blockIdx.x + 3] = now();
    out[5 * blockIdx.x + 4] = smid;
}
// mode: 1 a cluster barrier at the start (relaxed arrive), 2 one at the end, 4 the .aligned
// forms, 8 the start barrier's arrive only (its wait just before the end)
// form: how a 2-CTA cluster's end barrier orders what came before it (each thread has written
// shared memory; with store, global memory too): 0 release arrive + acquire wait, 1 relaxed
// arrive + acquire wait, 2 fence.acq_rel.cluster + relaxed arrive, 3 the restricted fences
// (release of shared::cta, acquire of shared::cluster) around a relaxed arrive + wait
extern "C" __global__ void __launch_bounds__(384, 1)
ends(unsigned long long* out, int* sink, int form, int store) {
    volatile __shared__ int cell[384];  // written, never read: what a release must order
    const unsigned long long t0 = now();
    cell[threadIdx.x] = (int)t0;
    if (store) sink[blockIdx.x * 384 + threadIdx.x] = (int)t0;
    const unsigned long long tc = now();
    if (form == 0) {
        asm volatile("barrier.cluster.arrive.release.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    } else if (form == 1) {
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    } else if (form == 2) {
        asm volatile("fence.acq_rel.cluster;\nbarrier.cluster.arrive.relaxed.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    } else {
        asm volatile("fence.release.sync_restrict::shared::cta.cluster;\n"
                     "barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n"
                     "fence.acquire.sync_restrict::shared::cluster.cluster;\n" ::: "memory");
    }
    stamp(out, t0, tc, tc);  // (its "start barrier" is the stores' time)
}
extern "C" __global__ void __launch_bounds__(384, 1)
probe(unsigned long long* out, unsigned spin, int mode) {
    const unsigned long long t0 = now();
    if ((mode & 1) && (mode & 4))
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n"
                     ::: "memory");
    else if (mode & 1)
        asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait;\n" ::: "memory");
    if (mode & 8) asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
    const unsigned long long tb = now();
    if (threadIdx.x == 0) {
        unsigned long long t = tb;
        while (t - tb < spin) t = now();
    }
    __syncthreads();
    if (mode & 8) asm volatile("barrier.cluster.wait;\n" ::: "memory");
    const unsigned long long tc = now();
    if ((mode & 2) && (mode & 4))
        asm volatile("barrier.cluster.arrive.release.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    else if (mode & 2)
        asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n"
                     ::: "memory");
    stamp(out, t0, tb, tc);
}
"""

CALLS, REPEATS = 20, 30
GRID = 128  # 1024^3's 64 x 128 tiles


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


def starts(kernel, config, grid, rest, stream) -> dict:
    out = gpurt.empty(5 * grid, dtype="uint64")
    kernel.launch(config, out, *rest, stream=stream)
    stream.synchronize()
    rows = out.numpy().reshape(grid, 5).astype(np.int64)
    t0, tb, tc, t1 = (rows[:, i] for i in range(4))
    first = t0.min()
    return {"start_spread_ns": int(t0.max() - first), "start_p50_ns": int(np.median(t0 - first)),
            "start_barrier_p50_ns": int(np.median(tb - t0)),
            "end_barrier_p50_ns": int(np.median(t1 - tc)),
            "end_max_ns": int(t1.max() - first), "sms": int(len(set(rows[:, 4].tolist())))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    gpurt.set_device(0)
    module = gpurt.compile(SOURCE)
    smem = 200 * 1024  # one CTA per SM
    scratch = gpurt.empty(5 * GRID, dtype="uint64")
    stream = gpurt.Stream()
    rows = []
    print(gpurt.get_device_name(), flush=True)
    def measure(name: str, config: gpurt.LaunchConfig, rest: tuple, **fields) -> None:
        us = graph_us(module[name], config, (scratch, *rest), stream)
        row = {"kernel": name, "grid": GRID, "smem_kb": smem // 1024, **fields, "graph_us": us}
        row |= starts(module[name], config, GRID, rest, stream)
        rows.append(row)
        print(row, flush=True)

    for spin in (0, 5000):
        for cluster in (1, 2):
            config = gpurt.LaunchConfig(GRID, 384, smem, cluster=None if cluster == 1 else cluster)
            for mode in (0,) if cluster == 1 else (0, 1, 2, 3, 5, 6, 7, 8, 10):
                measure("probe", config, (spin, mode), cluster=cluster, spin_ns=spin, mode=mode)
    sink = gpurt.empty(384 * GRID, dtype="int32")
    config = gpurt.LaunchConfig(GRID, 384, smem, cluster=2)
    for store in (0, 1):
        for form in (0, 1, 2, 3):
            measure("ends", config, (sink, form, store), cluster=2, form=form, store=store)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": gpurt.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
