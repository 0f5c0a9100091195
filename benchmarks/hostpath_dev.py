"""Where the host time of the bundled calls with torch tensors goes (issue 16, dev script):
each torch accessor gpurt reads, gpurt.nvrtc.dispatch's key and call, gpurt.empty, asarray and
record_stream, and the pieces of a split-K gemm call (its stream's workspace, the capture
query, its one planned launch; the reduction is fused into the kernel), timed one by one in
tight loops (ns per call, median of 7 loops of N calls).

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


def ns_idle(fn: Callable[[], Any], n: int = 2000) -> float:
    """:func:`ns` of a call that launches, each call alone with the device idle (synchronized
    before it, outside the timed region), so a kernel longer than the call is not timed."""
    samples = []
    for _ in range(7):
        total = 0.0
        for _ in range(n // 7):
            gpurt.synchronize()
            t0 = time.perf_counter()
            fn()
            total += time.perf_counter() - t0
        samples.append(total / (n // 7) * 1e9)
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
    rows += split_k_rows(torch)
    print_rows(rows)


def print_rows(rows: list[tuple[str, float]]) -> None:
    for name, value in rows:
        print(f"{name:40s} {value:9.1f} ns")


def split_k_rows(torch: Any) -> list[tuple[str, float]]:
    """The split-K gemm call of bench_dispatch (128x128x4096 bf16, gpurt Arrays, out=) next
    to the same problem without a split, its pieces, and torch's a @ b of the same tensors
    (``python benchmarks/hostpath_dev.py split`` prints these rows alone)."""
    import dataclasses

    from gpurt._streams.handles import stream_is_capturing

    gemm_mod = importlib.import_module("gpurt.kernels.gemm")
    tune = importlib.import_module("gpurt.kernels._gemm_tune")
    workspace = importlib.import_module("gpurt.kernels._gemm_workspace")
    ta = torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16)
    tb = torch.randn(4096, 128, device="cuda", dtype=torch.bfloat16)
    a, b = gpurt.asarray(ta), gpurt.asarray(tb)
    out = gpurt.empty((128, 128), dtype=a.dtype)
    split = dataclasses.replace(tune._WGMMA[1], split_k=4)
    plain = tune._WGMMA[1]
    gemm_mod.gemm(a, b, out=out, config=split)
    gemm_mod.gemm(a, b, out=out, config=plain)
    planned_split = [v for v in gemm_mod._calls.values() if v[0].config == split][0][3]
    planned_plain = [v for v in gemm_mod._calls.values() if v[0].config == plain][0][3]
    handle = gpurt.current_stream().cuda_stream
    count, counters = 4 * 128 * 128, planned_split.call.counters
    ptrs = (a.ptr, b.ptr, out.ptr, 0, 1.0, 0.0)
    return [
        ("stream_is_capturing(0, handle)", ns(lambda: stream_is_capturing(0, handle))),
        ("workspace.take(0, None, n, counters)", ns(
            lambda: workspace.take(0, None, count, counters))),
        ("PlannedGemm split4 (one launch, idle)", ns_idle(lambda: planned_split(None, *ptrs))),
        ("PlannedGemm no split (idle)", ns_idle(lambda: planned_plain(None, *ptrs))),
        ("gemm(a, b, out, config=split4) (idle)", ns_idle(
            lambda: gemm_mod.gemm(a, b, out=out, config=split))),
        ("gemm(a, b, out, config=plain) (idle)", ns_idle(
            lambda: gemm_mod.gemm(a, b, out=out, config=plain))),
        ("torch a @ b (idle)", ns_idle(lambda: ta @ tb)),
    ]

if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["split"]:
        import torch

        print_rows(split_k_rows(torch))
    else:
        main()
