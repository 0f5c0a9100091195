"""Softmax bandwidth: gpurt's bundled kernels against torch and the device's copy bandwidth.

Bytes per call: forward, the input read once and the output written once; backward, y and dy
read once and dx written once. Device time: driver events around each call on one stream,
median of many after warm-up. Before every timed call a 512 MiB read keeps the device busy
while the host launches (so host launch time is not counted, for any library) and evicts the
inputs from L2, leaving it clean (benchmarks/_common.Timer; a memset did until session 7, and
each call paid for writing its dirty lines back). The copy ceiling is a 1 GiB device-to-device
copy timed the same way; each row also times a copy of its own bytes (``samecopy``), what one
launch of that size can reach. Issue 7's targets: forward >= 90% of copy on fp32 4096x8192,
65536x1024, 8192x32768, 1024x131072 and bf16 16384x4096; backward (one kernel) >= 85%. Issue
17's: >= 85% for row lengths that are not multiples of the vector width. notes_softmax.md has
the story.

    python benchmarks/bench_softmax.py [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from _common import Timer, bandwidth_timer, copy_gbps, print_rows, write_results

import gpurt
from gpurt.kernels import log_softmax, log_softmax_backward, softmax, softmax_backward

plan = importlib.import_module("gpurt.kernels._softmax_plan")
F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)

# (rows, cols, dtype, op, target % of copy or None)
CASES = [
    (4096, 8192, F32, "softmax", 90),
    (65536, 1024, F32, "softmax", 90),
    (8192, 32768, F32, "softmax", 90),
    (1024, 131072, F32, "softmax", 90),
    (16384, 4096, BF16, "softmax", 90),
    (16384, 4096, F16, "softmax", None),
    (4096, 8192, F32, "log_softmax", None),
    (64, 1_000_000, F32, "softmax", None),
    (4096, 8192, F32, "softmax_backward", 85),
    (65536, 1024, F32, "softmax_backward", 85),
    (8192, 32768, F32, "softmax_backward", 85),
    (1024, 131072, F32, "softmax_backward", 85),
    (16384, 4096, BF16, "softmax_backward", 85),
    (4096, 8192, F32, "log_softmax_backward", 85),
    # row lengths that are not multiples of the vector width (issue 17): 16-byte accesses
    # with scalar edges; the 1M-element rows take one CTA per chunk, the chunks of a row
    # meeting through a ticket (softmax_ticket)
    (4096, 50257, F32, "softmax", 85),
    (4096, 32001, F32, "softmax", 85),
    (64, 1_000_003, F32, "softmax", 85),
    (4096, 50257, BF16, "softmax", 85),
    (4096, 50257, F32, "log_softmax", 85),
    (4096, 50257, F32, "softmax_backward", 85),
    (4096, 32001, F32, "softmax_backward", 85),
    (4096, 50257, BF16, "softmax_backward", 85),
    (4096, 50257, F32, "log_softmax_backward", 85),
    (64, 1_000_003, F32, "softmax_backward", 85),
    # 16-bit rows past one CTA: ticket chunks, forward in one pass (s8-softlong16)
    (300, 200_003, BF16, "softmax", 85),
    (64, 1_000_003, BF16, "softmax", 85),
    (64, 1_000_003, BF16, "softmax_backward", 85),
    (64, 1_000_003, F16, "softmax", 85),
    (1000, 200_003, BF16, "softmax", 85),
    (64, 200_003, BF16, "softmax", 85),  # one wave of ticket chunks (s11-soft)
    # few rows (session 14, s14-soft's chooser): a launch of a few MB, where even a copy of
    # the same bytes ("samecopy") is far below the 1 GiB copy
    (8, 200_003, F32, "softmax", 85),
    (32, 50257, F32, "softmax", 85),
    (132, 32001, BF16, "softmax", 85),
    (300, 200_003, F32, "softmax_backward", 85),
]
OPS = {"softmax": plan.SOFTMAX, "log_softmax": plan.LOG_SOFTMAX,
       "softmax_backward": plan.SOFTMAX_BACKWARD,
       "log_softmax_backward": plan.LOG_SOFTMAX_BACKWARD}


def _ok(result: tuple) -> Any:
    if int(result[0]) != 0:
        raise RuntimeError(f"driver call failed: {result[0]!r}")
    return result[1] if len(result) == 2 else None




def make_inputs(op: int, rows: int, cols: int, dtype: np.dtype, torch: Any) -> list[Any]:
    """Random device inputs (torch tensors when torch is there, else gpurt Arrays)."""
    count = 1 if op < plan.SOFTMAX_BACKWARD else 2
    if torch is not None:
        tdt = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[dtype]
        made = [torch.randn(rows, cols, device="cuda", dtype=tdt) for _ in range(count)]
        if op >= plan.SOFTMAX_BACKWARD:  # y: a forward output
            forward = torch.softmax if op == plan.SOFTMAX_BACKWARD else torch.log_softmax
            made[0] = forward(made[0], -1)
        return made
    rng = np.random.default_rng(0)
    made = [rng.standard_normal((rows, cols), dtype=np.float32) for _ in range(count)]
    if op == plan.SOFTMAX_BACKWARD:
        e = np.exp(made[0] - made[0].max(-1, keepdims=True))
        made[0] = e / e.sum(-1, keepdims=True)
    return [gpurt.asarray(m.astype(dtype)) for m in made]


def gpurt_call(op: int, arrays: list[Any], out: Any, handle: int) -> Callable[[], Any]:
    if op == plan.SOFTMAX:
        return lambda: softmax(arrays[0], out=out, stream=handle)
    if op == plan.LOG_SOFTMAX:
        return lambda: log_softmax(arrays[0], out=out, stream=handle)
    backward = softmax_backward if op == plan.SOFTMAX_BACKWARD else log_softmax_backward
    return lambda: backward(arrays[1], arrays[0], grad_in=out, stream=handle)


def torch_call(op: int, tensors: list[Any], torch: Any) -> Callable[[], Any]:
    x = tensors[0]
    if op == plan.SOFTMAX:
        return lambda: torch.softmax(x, -1)
    if op == plan.LOG_SOFTMAX:
        return lambda: torch.log_softmax(x, -1)
    backward = (torch._softmax_backward_data if op == plan.SOFTMAX_BACKWARD
                else torch._log_softmax_backward_data)
    return lambda: backward(tensors[1], x, -1, x.dtype)


def measure(timer: Timer, copy: float, torch: Any) -> list[dict[str, Any]]:
    rows_out = []
    for rows, cols, dtype, name, target in CASES:
        op = OPS[name]
        made = make_inputs(op, rows, cols, dtype, torch)
        arrays = [gpurt.asarray(m) for m in made]  # zero-copy views of torch tensors
        out = gpurt.empty((rows, cols), dtype=dtype)
        nbytes = (len(made) + 1) * rows * cols * dtype.itemsize
        ms = timer.ms(gpurt_call(op, arrays, out, timer.handle))
        gbps = nbytes / ms / 1e6
        variant = plan.choose_variant(cols, dtype, op, rows=rows)
        row: dict[str, Any] = {
            "shape": f"{rows}x{cols}", "dtype": dtype.name, "op": name,
            "variant": variant.names()[0].split("<")[0].replace("softmax_", "")
            + f" {variant.threads}x{variant.items}x{variant.vec}"
            + (f" cluster {variant.cluster}" if variant.cluster > 1 else "")
            + (" edges" if variant.edges else ""),
            "gpurt_GBps": gbps, "copy_GBps": copy, "pct_copy": 100 * gbps / copy,
        }
        # a copy moving the same bytes (read + written) in one launch: the ceiling at this size
        same = copy_gbps(timer, nbytes // 2)
        row["samecopy_GBps"] = same
        row["pct_samecopy"] = 100 * gbps / same
        if torch is not None:
            torch_gbps = nbytes / timer.ms(torch_call(op, made, torch)) / 1e6
            row["torch_GBps"] = torch_gbps
            row["vs_torch"] = gbps / torch_gbps
        if target is not None:
            row["target_pct"] = target
            row["meets_target"] = row["pct_copy"] >= target
        rows_out.append(row)
        del made, arrays, out
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    setup = bandwidth_timer("softmax", args.json, 15 if args.quick else 50)
    if setup is None:
        return
    timer, torch = setup
    importlib.import_module("gpurt.kernels.softmax").precompile(
        plan.choose_variant(cols, dtype, OPS[name], rows=rows)
        for rows, cols, dtype, name, _ in CASES)
    copy = copy_gbps(timer)
    rows = measure(timer, copy, torch)
    print_rows(f"softmax on {gpurt.get_device_name()}: GB/s (bytes read once + written once), "
               f"copy {copy:.0f} GB/s", rows)
    write_results("softmax", rows, args.json)


if __name__ == "__main__":
    main()
