"""Several GPUs: all_reduce bus bandwidth, gpurt.distributed against torch.distributed
(both NCCL), and gpurt.comm against torch.cuda.comm, side by side in the same run.

  all_reduce  one process per GPU (this script starts them): for each size, batches of
              ``--iters`` float32 all_reduces, timed by driver events on the stream the
              collective runs on (torch's current stream waits for its NCCL stream), gpurt
              and torch alternating, median over ``--reps`` batches. Bus bandwidth as
              nccl-tests reports it: bytes / time x 2(n-1)/n. Target: gpurt within 5% of
              torch.distributed.
  comm        one process driving every GPU: broadcast and reduce_add of 1 and 64 MiB, host
              wall time until every device has finished (median; gpurt and torch run each
              case back to back, in turns), gpurt.comm vs torch.cuda.comm.

NCCL_NVLS_ENABLE=0 for every process (no NVLink multicast on shared machines).

    python benchmarks/bench_comm.py [--iters 20] [--reps 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ["NCCL_NVLS_ENABLE"] = "0"

import numpy as np  # noqa: E402
from _common import peer, print_rows, write_results  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402

SIZES = [1 << 20, 16 << 20, 128 << 20, 1 << 30]  # bytes


def _ok(res: tuple) -> Any:
    if int(res[0]) != 0:
        raise RuntimeError(f"driver call failed: {res[0]!r}")
    return res[1] if len(res) == 2 else None


def _batch_ms(fn: Callable[[], Any], stream: int, iters: int, start: Any, stop: Any) -> float:
    _ok(cu.cuEventRecord(start, stream))
    for _ in range(iters):
        fn()
    _ok(cu.cuEventRecord(stop, stream))
    _ok(cu.cuEventSynchronize(stop))
    return float(_ok(cu.cuEventElapsedTime(start, stop))) / iters


def rank_main(opts: argparse.Namespace) -> None:
    """One rank: gpurt and torch all_reduce, alternating; rank 0 prints the rows as JSON."""
    import gpurt
    from gpurt import distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{opts.port}", rank=rank,
                            world_size=world, device_id=rank)
    torch = peer("torch")
    if torch is not None:
        import torch.distributed as tdist

        torch.cuda.set_device(rank)
        tdist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{opts.port + 1}",
                                 rank=rank, world_size=world,
                                 device_id=torch.device(f"cuda:{rank}"))
    start, stop = _ok(cu.cuEventCreate(0)), _ok(cu.cuEventCreate(0))
    rows = []
    for nbytes in SIZES:
        n = nbytes // 4
        ours = gpurt.full(n, 1.0, np.float32)
        stream = gpurt.current_stream().cuda_stream
        fns: dict[str, tuple[Callable[[], Any], int]] = {
            "gpurt": (lambda ours=ours: dist.all_reduce(ours), stream)}
        if torch is not None:
            theirs = torch.ones(n, dtype=torch.float32, device=f"cuda:{rank}")
            fns[f"torch {torch.__version__}"] = (
                lambda theirs=theirs: tdist.all_reduce(theirs),
                torch.cuda.current_stream().cuda_stream)
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for fn, s in fns.values():  # warm-up: connections, kernels, clocks
            _batch_ms(fn, s, 5, start, stop)
        for _ in range(opts.reps):
            for name, (fn, s) in fns.items():
                samples[name].append(_batch_ms(fn, s, opts.iters, start, stop))
        for name, times in samples.items():
            ms = statistics.median(times)
            rows.append({"what": f"distributed.all_reduce float32 {nbytes >> 20} MiB",
                         "impl": name, "ranks": world, "time_us": ms * 1e3,
                         "busbw_GBps": nbytes / (ms * 1e-3) * 2 * (world - 1) / world / 1e9})
        del ours, fns, fn  # the lambdas hold the buffer too
    if rank == 0:
        print("ROWS " + json.dumps(rows), flush=True)
    if torch is not None:
        tdist.destroy_process_group()
    dist.destroy_process_group()


def all_reduce_rows(opts: argparse.Namespace, world: int) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(rank), "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--rank-worker", "--port", str(port),
             "--iters", str(opts.iters), "--reps", str(opts.reps)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed (exit {p.returncode}):\n{out[-3000:]}")
    line = next(x for x in outs[0].splitlines() if x.startswith("ROWS "))
    return json.loads(line[5:])


def comm_rows(world: int, reps: int = 60) -> list[dict[str, Any]]:
    """broadcast and reduce_add over every GPU from one process, 1 and 64 MiB: host wall
    time until every device has finished, gpurt and torch alternating, median."""
    import gpurt
    from gpurt import comm

    devices = list(range(world))
    cases: dict[tuple[str, str], Callable[[], Any]] = {}
    syncs: dict[str, Callable[[], Any]] = {
        "gpurt": lambda: [gpurt.synchronize(d) for d in devices]}
    torch = peer("torch")
    label = f"torch {torch.__version__}" if torch is not None else ""
    if torch is not None:
        import torch.cuda.comm as tcomm

        syncs[label] = lambda: [torch.cuda.synchronize(d) for d in devices]
    for mib in (1, 64):
        n = (mib << 20) // 4
        src = gpurt.full(n, 1.0, np.float32, devices[0])
        parts = [gpurt.full(n, 1.0, np.float32, d) for d in devices]
        cases[(f"comm.broadcast {mib} MiB", "gpurt")] = \
            lambda src=src: comm.broadcast(src, devices)
        cases[(f"comm.reduce_add {mib} MiB", "gpurt")] = \
            lambda parts=parts: comm.reduce_add(parts, devices[0])
        if torch is not None:
            tsrc = torch.ones(n, device="cuda:0")
            tparts = [torch.ones(n, device=f"cuda:{d}") for d in devices]
            cases[(f"comm.broadcast {mib} MiB", label)] = \
                lambda tsrc=tsrc: tcomm.broadcast(tsrc, devices)
            cases[(f"comm.reduce_add {mib} MiB", label)] = \
                lambda tparts=tparts: tcomm.reduce_add(tparts, 0)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    whats = list(dict.fromkeys(what for what, _ in cases))
    for rep in range(reps + 5):  # the first 5 warm up
        for what in whats:  # each case right after its peer, in turns (ABBA)
            impls = [impl for w, impl in cases if w == what]
            for impl in impls if rep % 2 else impls[::-1]:
                t0 = time.perf_counter()
                cases[(what, impl)]()
                syncs[impl]()
                if rep >= 5:
                    samples[(what, impl)].append((time.perf_counter() - t0) * 1e6)
    return [{"what": what, "impl": impl, "ranks": world,
             "time_us": statistics.median(samples[(what, impl)])} for what, impl in cases]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """gpurt's all_reduce bus bandwidth over torch's at each size, and the worst of the
    large sizes (>= 128 MiB, where bandwidth, not latency, is measured)."""
    bw = {(r["impl"].split()[0], r["what"]): r["busbw_GBps"] for r in rows if "busbw_GBps" in r}
    out: dict[str, Any] = {}
    large = []
    for (impl, what), value in bw.items():
        if impl == "torch":
            mib = int(what.split()[-2])
            ratio = bw[("gpurt", what)] / value
            out[f"busbw_ratio_{mib}MiB"] = ratio
            if mib >= 128:
                large.append(ratio)
    if large:
        out["large_busbw_ratio_min"] = min(large)
        out["target_met(>=0.95)"] = min(large) >= 0.95
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", default=None)
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.rank_worker:
        rank_main(opts)
        return
    import gpurt
    from gpurt import distributed as dist

    world = gpurt.device_count() if gpurt.is_available() else 0
    if world < 2 or not dist.is_available():
        why = f"{world} GPU(s)" if world < 2 else "no NCCL (pip install 'gpurt[nccl]')"
        print(f"bench_comm: skipped, needs 2+ GPUs and NCCL ({why})")
        write_results("comm", [{"skipped": why}], opts.json)
        return
    rows = all_reduce_rows(opts, world) + comm_rows(world)
    print_rows(f"NCCL collectives on {world} GPUs", rows)
    result = summary(rows)
    for key, value in result.items():
        print(f"{key}: {value:.3g}" if isinstance(value, float) else f"{key}: {value}")
    write_results("comm", rows + [{"summary": result}], opts.json)


if __name__ == "__main__":
    main()
