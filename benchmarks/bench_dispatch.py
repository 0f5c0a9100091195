"""Host time of the calls users make in a loop: the bundled kernels (softmax, gemm) with
torch tensors and with gpurt Arrays, the eager MLP step softmax(gelu(x @ W1) @ W2), and
gpurt's array entry points, each next to torch's own equivalent in the same process.

How host time is measured: the problems are tiny (the kernels take a few microseconds), calls
run back to back in batches of BATCH after warm-up, and the device is synchronized between
batches (outside the timed region) so the launch queue never fills; a sample is one batch's
wall time per call, the row is the median of REPEAT samples, gpurt and torch alternating sample
by sample. The rows of gemm's families, whose kernels can outlast their host path (back to back
they would time the device), time each call alone instead, the device synchronized before it
outside the timed region. The MLP step is measured twice: wall time per step including the
device (each batch of steps timed until the closing synchronize returns), where the kernels
dominate, and host time per step as above.

    python benchmarks/bench_dispatch.py [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import peer, print_rows, write_results

import gpurt

BATCH = 100
REPEAT = 21
gemm_mod = importlib.import_module("gpurt.kernels.gemm")
softmax_mod = importlib.import_module("gpurt.kernels.softmax")

_GELU = r"""
#include <cuda_bf16.h>
extern "C" __global__ void gelu(const __nv_bfloat16* x, __nv_bfloat16* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __bfloat162float(x[i]);
        y[i] = __float2bfloat16(0.5f * v * (1.f + erff(v * 0.70710678f)));
    }
}
"""


def _per_call(fn: Callable[[], Any], sync: Callable[[], Any], batch: int = BATCH,
              wall: bool = False, idle: bool = False) -> float:
    """us per call of a batch of ``batch`` calls: host time (the device synchronized before
    and after, outside the timed region), or with ``wall`` the time until the device is
    done with the batch (the closing synchronize inside the timed region), or with ``idle``
    the host time of each call alone, the device synchronized before it (outside the timed
    region): for calls whose kernels outlast their host path, which back to back would time
    the device."""
    if idle:
        total = 0.0
        for _ in range(batch):
            sync()
            t0 = time.perf_counter()
            fn()
            total += time.perf_counter() - t0
        sync()
        return total / batch * 1e6
    sync()
    t0 = time.perf_counter()
    for _ in range(batch):
        fn()
    if wall:
        sync()
    elapsed = time.perf_counter() - t0
    sync()
    return elapsed / batch * 1e6


def side_by_side(ours: Callable[[], Any], theirs: Callable[[], Any] | None,
                 sync: Callable[[], Any], batch: int = BATCH,
                 wall: bool = False, idle: bool = False) -> tuple[float, float | None]:
    """Median us per call of ``ours`` and ``theirs``, measured in alternating batches."""
    for _ in range(3):
        _per_call(ours, sync, batch, wall, idle)
        if theirs is not None:
            _per_call(theirs, sync, batch, wall, idle)
    a, b = [], []
    for _ in range(REPEAT):
        a.append(_per_call(ours, sync, batch, wall, idle))
        if theirs is not None:
            b.append(_per_call(theirs, sync, batch, wall, idle))
    return statistics.median(a), (statistics.median(b) if b else None)


def row(what: str, ours: float, theirs: float | None, peer_name: str, unit: str = "us (host)",
        target: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"what": what, "unit": unit, "gpurt": round(ours, 3)}
    if theirs is not None:
        out[peer_name] = round(theirs, 3)
        out[f"gpurt/{peer_name}"] = round(ours / theirs, 3)
    if target is not None:
        out["target (gpurt/peer <=)"] = target
    return out


# gemm's other families (issue 16 measures the skinny one above): tiny problems, so the host
# path is all that counts; each row names the config its plan chose. GPURT_GEMM_DISABLE steers
# the choice to the family wanted (read when a plan is made, hence clear_plans around it).
_FAMILIES = (("wgmma", (128, 128, 128), "bfloat16", ""),
             ("wgmma split-K", (128, 128, 4096), "bfloat16", "decode"),  # else decode split 8
             ("mma", (128, 128, 128), "bfloat16", "wgmma"),
             ("simt", (128, 128, 128), "float32", ""))


def gemm_family_rows(torch: Any, sync: Callable[[], Any]) -> list[dict[str, Any]]:
    """Host time of ``gemm(a, b, out=c)`` with gpurt Arrays per GEMM family, next to torch's
    ``a @ b`` of the same tensors."""
    rows = []
    for family, (m, n, k), dtype, disable in _FAMILIES:
        ta = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
        tb = torch.randn(k, n, device="cuda", dtype=getattr(torch, dtype))
        ga, gb = gpurt.asarray(ta).clone(), gpurt.asarray(tb).clone()
        out = gpurt.empty((m, n), dtype=ga.dtype)
        saved = os.environ.get("GPURT_GEMM_DISABLE")
        os.environ["GPURT_GEMM_DISABLE"] = disable
        gemm_mod.clear_plans()
        try:
            gemm_mod.gemm(ga, gb, out=out)  # plans it
        finally:
            if saved is None:
                os.environ.pop("GPURT_GEMM_DISABLE")
            else:
                os.environ["GPURT_GEMM_DISABLE"] = saved
        chosen = next(reversed(gemm_mod._calls.values()))[0].config.label()
        ours, theirs = side_by_side(lambda ga=ga, gb=gb, out=out: gemm_mod.gemm(ga, gb, out=out),
                                    lambda ta=ta, tb=tb: ta @ tb, sync, idle=True)
        rows.append(row(f"gemm(a, b, out=c) {m}x{n}x{k} {dtype} {family} ({chosen}), gpurt "
                        "Arrays", ours, theirs, "torch", target=0.6))
    gemm_mod.clear_plans()
    return rows


def _planned_launch_alone(g: Any, g_out: Any, sync: Callable[[], Any]) -> float | None:
    """us per call of the planned launch that ``softmax(g, out=g_out)`` dispatches to, called
    directly with its addresses (None without gpurt's compiled dispatcher)."""
    from gpurt._launch import planned

    dispatcher = getattr(planned, "_dispatcher", None)
    found = None if dispatcher is None else dispatcher.key(softmax_mod.SOFTMAX, -1, g, None,
                                                           g_out)
    entry = None if found is None else softmax_mod._direct.get(found[0])
    if entry is None:
        return None
    launch, order = entry[0], entry[1]
    addresses = [found[1][i] for i in order]
    ours, _ = side_by_side(lambda: launch(None, *addresses), None, sync)
    return ours


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch = peer("torch")
    if torch is None or not torch.cuda.is_available():
        raise SystemExit("bench_dispatch needs torch with CUDA (the peer)")
    import numpy as np

    sync = gpurt.synchronize
    rows: list[dict[str, Any]] = []
    t = torch.randn(64, 256, device="cuda")
    t_out = torch.empty_like(t)
    g, g_out = gpurt.asarray(t.cpu().numpy()), gpurt.empty((64, 256))
    ours, theirs = side_by_side(lambda: softmax_mod.softmax(t), lambda: torch.softmax(t, -1),
                                sync)
    rows.append(row("softmax(x) 64x256 fp32, torch tensor in", ours, theirs, "torch", target=1.0))
    ours, _ = side_by_side(lambda: softmax_mod.softmax(g, out=g_out), None, sync)
    rows.append(row("softmax(x, out=o) 64x256 fp32, gpurt Arrays", ours, theirs, "torch",
                    target=0.6))
    floor = _planned_launch_alone(g, g_out, sync)
    if floor is not None:
        rows.append(row("softmax's planned launch alone (C packing and cuLaunchKernel, no "
                        "dispatch: the floor of the row above)", floor, theirs, "torch"))
    ours, _ = side_by_side(lambda: softmax_mod.softmax(g), None, sync)  # output made in C
    rows.append(row("softmax(x) 64x256 fp32, gpurt Array in", ours, theirs, "torch"))
    ours, theirs = side_by_side(lambda: softmax_mod.softmax(t, out=t_out),
                                lambda: torch.softmax(t, -1), sync)
    rows.append(row("softmax(x, out=o) 64x256 fp32, torch tensors", ours, theirs, "torch"))

    bf = torch.bfloat16
    ta, tb = torch.randn(16, 64, device="cuda", dtype=bf), torch.randn(64, 64, device="cuda",
                                                                        dtype=bf)
    ga, gb = gpurt.asarray(ta), gpurt.asarray(tb)
    ga, gb = ga.clone(), gb.clone()
    g_c = gpurt.empty((16, 64), dtype=gpurt.bfloat16)
    ours, theirs = side_by_side(lambda: gemm_mod.gemm(ta, tb), lambda: ta @ tb, sync)
    rows.append(row("gemm(a, b) 16x64x64 bf16, torch tensors in", ours, theirs, "torch",
                    target=1.0))
    ours, _ = side_by_side(lambda: gemm_mod.gemm(ga, gb, out=g_c), None, sync)
    rows.append(row("gemm(a, b, out=c) 16x64x64 bf16, gpurt Arrays", ours, theirs, "torch",
                    target=0.6))
    rows += gemm_family_rows(torch, sync)

    # the eager MLP step of issue 16: softmax(gelu(x @ W1) @ W2), bf16, d=4096, h=11008, b=16
    d, h, batch = 4096, 11008, 16
    x = torch.randn(batch, d, device="cuda", dtype=bf)
    w1 = torch.randn(d, h, device="cuda", dtype=bf) / d ** 0.5
    w2 = torch.randn(h, d, device="cuda", dtype=bf) / h ** 0.5
    gx, gw1, gw2 = gpurt.asarray(x).clone(), gpurt.asarray(w1).clone(), gpurt.asarray(w2).clone()
    gelu = gpurt.compile(_GELU)["gelu"]
    hidden = gpurt.empty((batch, h), dtype=gpurt.bfloat16)
    act = gpurt.empty((batch, h), dtype=gpurt.bfloat16)
    logits = gpurt.empty((batch, d), dtype=gpurt.bfloat16)
    probs = gpurt.empty((batch, d), dtype=gpurt.bfloat16)
    n = batch * h

    def ours_step() -> None:
        gemm_mod.gemm(gx, gw1, out=hidden)
        gelu(-(-n // 256), 256, (hidden, act, n))
        gemm_mod.gemm(act, gw2, out=logits)
        softmax_mod.softmax(logits, out=probs)

    def torch_step() -> None:
        torch.softmax(torch.nn.functional.gelu(x @ w1) @ w2, -1)

    def both_sync() -> None:
        torch.cuda.synchronize()
        gpurt.synchronize()

    mlp = "eager MLP step softmax(gelu(x@W1)@W2) bf16 b16 d4096 h11008"
    ours, theirs = side_by_side(ours_step, torch_step, both_sync, batch=20, wall=True)
    rows.append(row(mlp, ours, theirs, "torch", unit="us (wall, device included)", target=1.0))
    ours, theirs = side_by_side(ours_step, torch_step, both_sync, batch=20)
    rows.append(row(f"{mlp}, host only", ours, theirs, "torch"))
    want = torch.softmax(torch.nn.functional.gelu(x.float() @ w1.float()) @ w2.float(), -1)
    ours_step()
    gpurt.synchronize()
    got = torch.as_tensor(np.asarray(probs.to_numpy(), dtype=np.float32), device="cuda")
    err = float((got - want).abs().max())
    assert err < 2e-2, f"MLP step differs from torch's by {err}"

    # entry points called in loops
    small = torch.randn(256, device="cuda")
    ours, theirs = side_by_side(lambda: gpurt.asarray(small), lambda: torch.as_tensor(small),
                                sync)
    rows.append(row("gpurt.asarray(torch tensor) vs torch.as_tensor", ours, theirs, "torch"))
    ours, theirs = side_by_side(lambda: gpurt.from_dlpack(small),
                                lambda: torch.from_dlpack(small), sync)
    rows.append(row("gpurt.from_dlpack(torch tensor) vs torch.from_dlpack", ours, theirs,
                    "torch"))
    src, dst = gpurt.empty((1024,)), gpurt.empty((1024,))
    tsrc, tdst = torch.empty(1024, device="cuda"), torch.empty(1024, device="cuda")
    ours, theirs = side_by_side(lambda: dst.copy_(src), lambda: tdst.copy_(tsrc), sync)
    rows.append(row("Array.copy_ 4 KiB D2D vs Tensor.copy_", ours, theirs, "torch"))
    stream, tstream = gpurt.Stream(), torch.cuda.Stream()
    ours, theirs = side_by_side(lambda: src.record_stream(stream),
                                lambda: tsrc.record_stream(tstream), sync)
    rows.append(row("Array.record_stream vs Tensor.record_stream", ours, theirs, "torch"))

    how = " ".join(__doc__.split("\n\n")[1].split())
    doc = write_results("dispatch", rows, args.json)
    print(how)  # how host time was measured, with the numbers
    print_rows(f"dispatch host time on {doc['env'].get('device')}", rows)


if __name__ == "__main__":
    main()
