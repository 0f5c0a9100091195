"""Where the host time of the bundled calls with torch tensors goes (issue 16, dev script):
each torch accessor gpurt reads, gpurt.nvrtc.dispatch's key and call, gpurt.empty, asarray and
record_stream, timed one by one in tight loops (ns per call, median of 7 loops of N calls).

    python benchmarks/hostpath_dev.py
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import gpurt
from gpurt._array import interop
from gpurt._launch import planned

N = 20000


def ns(fn: Callable[[], Any], n: int = N) -> float:
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e9)
    gpurt.synchronize()
    return statistics.median(samples)


def main() -> None:
    import torch

    softmax_mod = importlib.import_module("gpurt.kernels.softmax")
    t = torch.randn(64, 256, device="cuda")
    raw = torch._C._cuda_getCurrentRawStream
    rows: list[tuple[str, float]] = []
    for name, fn in [
        ("t.dtype", lambda: t.dtype), ("t.is_cuda", lambda: t.is_cuda),
        ("t.requires_grad", lambda: t.requires_grad), ("t.layout", lambda: t.layout),
        ("t.is_neg()", lambda: t.is_neg()), ("t.is_conj()", lambda: t.is_conj()),
        ("t.get_device()", lambda: t.get_device()), ("t.shape", lambda: t.shape),
        ("t.stride()", lambda: t.stride()), ("t.data_ptr()", lambda: t.data_ptr()),
        ("t.is_contiguous()", lambda: t.is_contiguous()), ("t.device", lambda: t.device),
        ("t.size()", lambda: t.size()), ("t.storage_offset()", lambda: t.storage_offset()),
        ("raw_stream(0)", lambda: raw(0)), ("lambda: None", lambda: None),
        ("torch.as_tensor(t)", lambda: torch.as_tensor(t)),
        ("torch.empty(64,256)", lambda: torch.empty(64, 256, device="cuda")),
        ("torch.empty_like(t)", lambda: torch.empty_like(t)),
        ("gpurt.empty((64,256))", lambda: gpurt.empty((64, 256))),
    ]:
        rows.append((name, ns(fn)))
    g = gpurt.asarray(t.cpu().numpy())
    g_out = gpurt.empty((64, 256))
    softmax_mod.softmax(t)
    softmax_mod.softmax(g, out=g_out)
    d = planned._dispatcher
    table = softmax_mod._direct
    s = gpurt.Stream()
    rows += [
        ("dispatcher.key(t)", ns(lambda: d.key(t))),
        ("dispatcher.key(g)", ns(lambda: d.key(g))),
        ("dispatcher.key(0,-1,t,None,None)", ns(lambda: d.key(0, -1, t, None, None))),
        ("dispatch(table, 0,-1,t,None,None)", ns(lambda: d(table, 0, -1, t, None, None), 2000)),
        ("dispatch(table, 0,-1,g,None,g_out)", ns(lambda: d(table, 0, -1, g, None, g_out), 2000)),
        ("softmax(t)", ns(lambda: softmax_mod.softmax(t), 2000)),
        ("softmax(g, out=g_out)", ns(lambda: softmax_mod.softmax(g, out=g_out), 2000)),
        ("torch.softmax(t, -1)", ns(lambda: torch.softmax(t, -1), 2000)),
        ("interop.torch_fields(t, None)", ns(lambda: interop.torch_fields(t, None))),
        ("gpurt.asarray(t)", ns(lambda: gpurt.asarray(t))),
        ("gpurt.current_stream(0)", ns(lambda: gpurt.current_stream(0))),
        ("g.record_stream(s)", ns(lambda: g_out.record_stream(s))),
    ]
    ts = torch.cuda.Stream()
    rows.append(("t.record_stream(ts)", ns(lambda: t.record_stream(ts))))
    for name, value in rows:
        print(f"{name:40s} {value:9.1f} ns")


if __name__ == "__main__":
    main()
