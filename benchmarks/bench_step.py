"""A CUDA-graphed inference step, gpurt against torch: softmax(gelu(x @ W1) @ W2).

Issue 17 measured this step (two GEMMs, an elementwise kernel, a softmax; bf16, d=4096,
h=11008) replaying 0.81-0.84x as fast as torch's graph. Each library captures the whole
step once into its own CUDA graph on a side stream; a row is the median device time of one
replay (driver events around it) at batch 16 (decode) and 256 (prefill), and the median
host time of one eager step with the device drained before it. gpurt's step uses only
gpurt: its GEMM, a gelu built by ``gpurt.ElementwiseKernel`` and its softmax, on gpurt
Arrays. Both graphs' outputs are checked against a float32 torch reference.

    python benchmarks/bench_step.py [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import device_ms, peer, print_rows, write_results

import gpurt

D, H = 4096, 11008
BATCHES = (16, 256)
gemm_mod = importlib.import_module("gpurt.kernels.gemm")
softmax_mod = importlib.import_module("gpurt.kernels.softmax")
GELU = gpurt.ElementwiseKernel("T x", "T y", "y = 0.5f * x * (1.f + erff(x * 0.70710678f))",
                               "step_gelu")


def _eager_host_us(step: Callable[[], Any], drain: Callable[[], Any], repeat: int = 31) -> float:
    """Median host time of one eager step, the device drained before each (outside the
    timed region) so a full queue never stalls the host."""
    samples = []
    for _ in range(repeat):
        drain()
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e6)
    drain()
    return statistics.median(samples)


def _gpurt_step(x: Any, w1: Any, w2: Any) -> tuple[Callable[[], None], Any]:
    batch = x.shape[0]
    hidden = gpurt.empty((batch, H), dtype=gpurt.bfloat16)
    act = gpurt.empty((batch, H), dtype=gpurt.bfloat16)
    logits = gpurt.empty((batch, D), dtype=gpurt.bfloat16)
    probs = gpurt.empty((batch, D), dtype=gpurt.bfloat16)

    def step() -> None:
        gemm_mod.gemm(x, w1, out=hidden)
        GELU(hidden, act)
        gemm_mod.gemm(act, w2, out=logits)
        softmax_mod.softmax(logits, out=probs)

    return step, probs


def rows_for(torch: Any, batch: int) -> list[dict[str, Any]]:
    """gpurt's and torch's graphed and eager step at one batch size."""
    bf = torch.bfloat16
    x = torch.randn(batch, D, device="cuda", dtype=bf)
    w1 = torch.randn(D, H, device="cuda", dtype=bf) / D ** 0.5
    w2 = torch.randn(H, D, device="cuda", dtype=bf) / H ** 0.5
    want = torch.softmax(torch.nn.functional.gelu(x.float() @ w1.float()) @ w2.float(), -1)
    what = f"graphed step softmax(gelu(x@W1)@W2) bf16 b{batch} d{D} h{H}"
    rows = []

    stream = gpurt.Stream()
    with stream:
        gx, gw1, gw2 = (gpurt.asarray(t).clone() for t in (x, w1, w2))
        step, probs = _gpurt_step(gx, gw1, gw2)
        step()  # loads the kernels before capture
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph, stream=stream):
            step()
        replay_ms = device_ms(graph.replay, stream.cuda_stream, repeat=100, warmup=10)
        eager_us = _eager_host_us(step, stream.synchronize)
        probs.fill_(float("nan"))  # poisoned: the replay must write every element
        graph.replay()
        stream.synchronize()
        got = torch.from_dlpack(probs).float()
    err = float((got - want).abs().max())
    assert err < 2e-2, f"gpurt's graphed step differs from torch's float32 by {err}"
    rows.append({"what": what, "impl": "gpurt", "device_ms": replay_ms,
                 "eager_host_us": eager_us})

    tstream = torch.cuda.Stream()
    with torch.cuda.stream(tstream):
        def tstep() -> Any:
            return torch.softmax(torch.nn.functional.gelu(x @ w1) @ w2, -1)

        tstep()
        tstream.synchronize()
        tgraph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tgraph, stream=tstream):
            tout = tstep()
        replay_ms = device_ms(tgraph.replay, tstream.cuda_stream, repeat=100, warmup=10)
        eager_us = _eager_host_us(tstep, tstream.synchronize)
        tout.fill_(float("nan"))
        tgraph.replay()
        tstream.synchronize()
    err = float((tout.float() - want).abs().max())
    assert err < 2e-2, f"torch's graphed step differs from float32 by {err}"
    rows.append({"what": what, "impl": f"torch {torch.__version__}", "device_ms": replay_ms,
                 "eager_host_us": eager_us})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None, help="write results here")
    opts = parser.parse_args()
    torch = peer("torch")
    if torch is None or not torch.cuda.is_available() or not gpurt.is_available():
        raise SystemExit("bench_step needs a GPU and torch (the peer)")
    rows = [r for batch in BATCHES for r in rows_for(torch, batch)]
    print_rows("graphed inference step: one replay, gpurt vs torch", rows)
    write_results("step", rows, opts.json)


if __name__ == "__main__":
    main()
