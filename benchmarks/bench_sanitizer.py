"""What gpurt's stream sanitizer costs: host time per launch, copy and event hand-over with it
off and on, and, as the peer, torch's CSAN on ``x.add_(1)`` (same process, same GPU).

With the sanitizer on every launch takes the Python launch path (a launch hook is
registered), reads its pointer arguments back from the packed parameter buffer, finds their
allocations (a bisect over the live ones), captures the Python stack and checks the
accesses against the other streams' clocks. Rows with "live allocations" show how that
scales with many arrays alive. Without a GPU only the tracker itself is timed (made-up
streams and allocations); the rows say so.

    python benchmarks/bench_sanitizer.py [--json PATH]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import host_us, peer, print_rows, write_results

N = 1024
SOURCE = r"""
extern "C" __global__ void add_one(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}
"""
NUMBER = 2000
X, Y = 0x7F00_0000_0000, 0x7F00_0000_1000  # two made-up allocations (no GPU rows)


def _row(what: str, lib: str, sanitizer: str, fn: Callable[[], Any],
         sync: Callable[[], Any] | None = None) -> dict[str, Any]:
    if sync is not None:
        sync()
    us = host_us(fn, number=NUMBER, repeat=9, warmup=200)
    if sync is not None:
        sync()
    return {"what": what, "lib": lib, "sanitizer": sanitizer, "host_us": us}


def tracker_rows() -> list[dict[str, Any]]:
    """The tracker alone, no GPU: one 3-argument launch record on one stream."""
    from gpurt._sanitizer.tracker import Tracker

    rows = []
    for live in (2, 10_000):
        tracker = Tracker()
        for i in range(live):
            tracker.allocated(0x7F00_0000_0000 + i * 4096, 4096)
        tracker.allocation_of(0)  # apply the allocations now, not in the first timed call

        rows.append(_row(f"tracker.access, 1 read + 1 write, {live} live allocations, no GPU",
                         "gpurt", "on",
                         lambda t=tracker: t.access(0x7100, 0, ((X, 0),), ((Y, 1),),
                                                    "kernel add_one", True)))
    return rows


def gpu_rows() -> list[dict[str, Any]]:
    import gpurt
    from gpurt import sanitizer

    kernel = gpurt.compile(SOURCE)["add_one"]
    x = gpurt.asarray(np.random.default_rng(0).standard_normal(N).astype(np.float32))
    y = gpurt.zeros(N)
    z = gpurt.empty(N)
    args = (x, y, N)
    kernel(4, 256, args)
    np.testing.assert_allclose(y.to_numpy(), x.to_numpy() + 1.0, rtol=1e-6)  # it really ran
    side = gpurt.Stream()
    event = gpurt.Event()

    def handover() -> None:  # an event hand-over between two streams
        event.record(side)
        event.wait()

    sync = gpurt.synchronize
    cases = [
        ("kernel(grid, block, args), 3 args", lambda: kernel(4, 256, args)),
        ("Array.copy_ 4 KiB device to device", lambda: z.copy_(y)),
        ("event.record(side) + event.wait()", handover),
    ]
    rows = []
    for state in ("off", "on"):
        if state == "on":
            sanitizer.enable_cuda_sanitizer()
        rows += [_row(what, "gpurt", state, fn, sync) for what, fn in cases]
    many = [gpurt.empty(256) for _ in range(10_000)]
    rows.append(_row("kernel(grid, block, args), 3 args, 10000 more live allocations",
                     "gpurt", "on", lambda: kernel(4, 256, args), sync))
    del many
    sanitizer.disable_cuda_sanitizer()
    rows.append(_row("kernel(grid, block, args), 3 args (again, after disabling)", "gpurt",
                     "off", lambda: kernel(4, 256, args), sync))
    return rows


def torch_rows() -> list[dict[str, Any]]:
    """torch's CSAN on x.add_(1): before and after enabling it (it cannot be turned off, so
    this runs last)."""
    torch = peer("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    from torch.cuda import _sanitizer as csan

    t = torch.zeros(N, device="cuda")
    t.add_(1)
    rows = [_row("x.add_(1), 1024 floats", "torch", "off", lambda: t.add_(1),
                 torch.cuda.synchronize)]
    csan.enable_cuda_sanitizer()
    rows.append(_row("x.add_(1), 1024 floats", "torch", "on (CSAN)", lambda: t.add_(1),
                     torch.cuda.synchronize))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import gpurt

    rows = tracker_rows()
    if gpurt.is_available():
        rows += gpu_rows() + torch_rows()
    print_rows("stream sanitizer overhead (host us per call)", rows)
    write_results("sanitizer", rows, args.json)


if __name__ == "__main__":
    main()
