"""Session 22 (issue 17): where one eager gemm call's time goes, host and device apart.

Per shape (gemm's pick, tuner off), each against torch.matmul in the same process:
  graph    kernel-only cold (bench_gemm_decode's graph harness)
  call     one eager call between two events, inputs rotated (bench_gemm_decode.host_us)
  device   one eager call between two events queued behind a 2 ms sleep kernel, so the host
           path is hidden: what the eager call's launches cost on the device
  submit   host time per call (perf_counter over 64 calls queued behind a sleep kernel)
Then a cProfile of gemm's host path and the kernels (with their durations and the gaps
between them) torch.profiler's CUPTI sees for 3 eager calls.

    python benchmarks/s22_host.py --json PATH [--shapes ...] [--dtype fp32] [--profile SHAPE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench_gemm_decode import Problem, gpurt_graph_us, host_us, torch_graph_us

SHAPES = "1x4093x4099,13x8191x2053,97x4093x4099,128x4097x4097t,4096x4096x4096"
SLEEP = 2_000_000  # cycles of torch.cuda._sleep: ~1 ms, longer than 64 host calls


def device_us(torch: Any, call: Callable[[int], Any], sets: int, repeat: int) -> float:
    """Median device time of one eager call with its host path hidden behind a sleep kernel."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(repeat):
        torch.cuda._sleep(SLEEP)
        start.record()
        call(i % sets)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(samples)


def submit_us(torch: Any, call: Callable[[int], Any], sets: int, repeat: int) -> float:
    """Median host time per call over bursts of 16 calls queued behind a sleep kernel."""
    samples = []
    for _ in range(repeat):
        torch.cuda._sleep(SLEEP * 4)
        t0 = time.perf_counter()
        for i in range(16):
            call(i % sets)
        samples.append((time.perf_counter() - t0) / 16 * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def kernels_seen(torch: Any, call: Callable[[int], Any], sets: int) -> list[str]:
    """The kernels and memsets of 3 eager calls (CUPTI), with durations and gaps in us."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for i in range(3):
            call(i % sets)
        torch.cuda.synchronize()
    lines, last_end = [], None
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                    key=lambda e: e.time_range.start)
    for e in events:
        gap = "" if last_end is None else f" gap {e.time_range.start - last_end:.1f}"
        lines.append(f"  {e.name[:70]} {e.time_range.elapsed_us():.1f} us{gap}")
        last_end = e.time_range.end
    api = sorted(((e.key, e.cpu_time_total) for e in prof.key_averages()
                  if e.device_type.name == "CPU"), key=lambda t: -t[1])[:8]
    lines += [f"  cpu {name[:60]} {us:.1f} us" for name, us in api]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--dtype", default="fp32", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--profile", default="97x4093x4099")
    args = parser.parse_args()
    import torch

    import gpurt
    from gpurt.kernels import gemm
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.dtype, torch.float32)
    rows = []
    for text in args.shapes.split(","):
        nk = text.endswith("t")
        m, n, k = (int(v) for v in text.rstrip("t").split("x"))
        p = Problem(gpurt, torch, m, n, k, dtype, nk, l2)
        calls = {
            "gpurt(torch)": lambda i, p=p: gemm(p.a[i], p.b[i], out=p.out),
            "gpurt(Array)": lambda i, p=p: gemm(p.ga[i], p.gb[i], out=p.gout),
            "torch": lambda i, p=p: torch.matmul(p.a[i], p.b[i], out=p.out),
        }
        row: dict[str, Any] = {"shape": text, "dtype": args.dtype,
                               "graph": round(gpurt_graph_us(gpurt, gemm, p, None, 10, torch), 2),
                               "torch_graph": round(torch_graph_us(torch, p, 10), 2)}
        for name, call in calls.items():
            row[name] = {
                "call": round(host_us(torch, call, p.sets, args.repeat), 2),
                "device": round(device_us(torch, call, p.sets, args.repeat), 2),
                "submit": round(submit_us(torch, call, p.sets, 15), 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if text in args.profile.split(","):
            for name in ("gpurt(torch)", "torch"):
                print(f"-- {text} {name}: kernels of 3 eager calls")
                print("\n".join(kernels_seen(torch, calls[name], p.sets)), flush=True)
            prof = cProfile.Profile()
            call = calls["gpurt(torch)"]
            torch.cuda._sleep(SLEEP * 20)
            prof.enable()
            for i in range(200):
                call(i % p.sets)
            prof.disable()
            torch.cuda.synchronize()
            text_out = io.StringIO()
            pstats.Stats(prof, stream=text_out).sort_stats("tottime").print_stats(22)
            print(f"-- {text} cProfile of 200 gpurt(torch) calls\n{text_out.getvalue()}")
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, fh, indent=1)
    for r in rows:
        cells = " | ".join(f"{k} {v['call']}/{v['device']}/{v['submit']}"
                           for k, v in r.items() if isinstance(v, dict))
        print(f"{r['shape']} graph {r['graph']} torch {r['torch_graph']} | {cells}")


if __name__ == "__main__":
    main()
