"""Where a column sum's time goes, block by block (issue 20, s13-col): the generated reduction
kernel with %globaltimer / %smid probes written by thread 0 of every block into a trace
buffer (its address a literal in the source: a dev-only kernel), timed like the benchmarks
(benchmarks/_common.Timer: L2-evicting read, then the call). Per block: t0 (first
instruction), t1 (the walk done: after the first barrier of the walk's combine), t2 (the
fold's ticket taken), t3 (the last block's fold stored), the SM, whether it folded. Per call,
relative to the first block's t0, in us: the blocks' start spread, the walk ends (min,
median, p90, max), the last ticket, the fold's chain (t3 - t2 of the last column to finish),
the span, against bytes / copy rate and the event-timed call.

    python benchmarks/colsum_trace.py [--json PATH] [--npz PATH] [--variant SPEC ...]

SPEC: knobs to set, "module.NAME=value" joined by ";" (module: reduction, reduce_codegen,
realign_codegen; value a Python literal), "" (the default, the only variant when none is
given) for the shipped code. The probes cost registers: a kernel at the 32-register cap may
spill under them (s13-col's early-ticket variant ran 4 us slower traced than untraced), so
compare a variant's event time with its untraced timing (bandwidth_dev.py) first. Results of
s13-col's H100 call: results/colsum-trace-s13-col-nvidia-h100.json (notes_bandwidth.md).
"""

from __future__ import annotations

import argparse
import ast
import json
from typing import Any

import numpy as np
from _common import Timer, _ok, copy_gbps, peer
from cuda.bindings import driver as cu

import gpurt
from gpurt._elementwise import realign_codegen, reduce_codegen, reduction

# (rows, cols, axis, dtype): the odd shapes, an aligned twin, a big aligned sum, an
# unsplit one and a row sum (many short blocks: the reference for ramp and tail)
CASES = [(4099, 8191, 0, "bfloat16"), (4099, 8191, 0, "float32"), (2047, 10007, 0, "bfloat16"),
         (4096, 8192, 0, "bfloat16"), (8192, 8192, 0, "float32"), (1024, 65536, 0, "bfloat16"),
         (4096, 8192, 1, "bfloat16")]
SLOTS = 8  # u64 a block: t0, t1, t2, t3, smid, folded, 0, 0
MODULES = {"reduction": reduction, "reduce_codegen": reduce_codegen,
           "realign_codegen": realign_codegen}
CALLS = 7

_PROBES = r"""
__device__ __forceinline__ unsigned long long _tr_now() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned _tr_sm() {
    unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }
"""


def traced(source: str, address: int) -> str:
    """``source`` with the probes (see the module docstring)."""
    head, sep, body = source.partition('extern "C" __global__')
    sig, brace, rest = body.partition(") {\n")
    slot = f"((unsigned long long*){address}ull + (blockIdx.y * gridDim.x + blockIdx.x) * {SLOTS})"
    start = "    const unsigned long long _tr0 = _tr_now();\n    unsigned long long _tr1 = 0;\n"
    walk_end = "    __syncthreads();\n    for (int _o = threadIdx.x;"
    rest = rest.replace(walk_end, "    __syncthreads();\n    _tr1 = _tr_now();\n"
                        "    for (int _o = threadIdx.x;", 1)
    put = (f"    if (threadIdx.x == 0) {{ unsigned long long* _q = {slot}; _q[0] = _tr0; "
           "_q[1] = _tr1; _q[4] = _tr_sm();")
    ticket = "    __syncthreads();\n    if (!_gpurt_last) return;\n"
    if ticket in rest:  # every block: its times at the ticket; the last: its fold's end
        rest = rest.replace(ticket, f"    __syncthreads();\n{put} _q[2] = _tr_now(); "
                            "_q[5] = _gpurt_last; }\n    if (!_gpurt_last) return;\n", 1)
        end = f"    __syncthreads();\n    if (threadIdx.x == 0) {slot}[3] = _tr_now();\n"
    else:
        end = f"    __syncthreads();\n{put} _q[3] = _tr_now(); }}\n"
    assert rest.endswith("}\n")
    return head + _PROBES + sep + sig + brace + start + rest[:-2] + end + "}\n"


def summary(trace: np.ndarray, blocks: int, nbytes: int, copy: float, ms: float) -> dict:
    """The call's block times (us from the first block's start)."""
    t = trace[:blocks].astype(np.float64)
    t0 = t[:, 0].min()
    us = lambda col: (t[:, col] - t0) / 1e3  # noqa: E731
    start = us(0)
    walk = us(1) if t[:, 1].any() else us(3)
    out: dict[str, Any] = {
        "blocks": blocks, "event_us": round(ms * 1e3, 2),
        "copy_rate_us": round(nbytes / copy / 1e3, 2),
        "start_p50_p99_max": [round(float(np.percentile(start, q)), 2) for q in (50, 99, 100)],
        "walk_end_min_p50_p90_max": [round(float(np.percentile(walk, q)), 2)
                                     for q in (0, 50, 90, 100)],
        "walk_len_min_p50_max": [round(float(np.percentile(walk - start, q)), 2)
                                 for q in (0, 50, 100)],
        "timer_step_ns": float(np.diff(np.unique(t[:, 0])).min()) if blocks > 1 else 0.0,
    }
    sms = t[:, 4].astype(int)
    per_sm = np.bincount(sms, minlength=sms.max() + 1)
    load = per_sm[sms]
    out["blocks_per_sm_min_max"] = [int(per_sm[per_sm > 0].min()), int(per_sm.max())]
    out["walk_end_by_sm_load"] = {int(n): round(float(np.median(walk[load == n])), 2)
                                  for n in np.unique(load)}
    if t[:, 2].any():
        folded = t[:, 5] > 0
        out["ticket_max"] = round(float(us(2).max()), 2)
        ends = us(3)[folded]
        last = np.argmax(np.where(folded, t[:, 3], 0))
        out["end_max"] = round(float(ends.max()), 2)
        out["last_fold_chain"] = {"walk_end": round(float(walk[last]), 2),
                                  "ticket": round(float(us(2)[last]), 2),
                                  "end": round(float(us(3)[last]), 2)}
        out["fold_len_p50_max"] = [round(float(np.percentile(us(3)[folded] - us(2)[folded], q)),
                                          2) for q in (50, 100)]
    else:
        out["end_max"] = round(float(us(3).max()), 2)
    return out


def run_case(timer: Timer, copy: float, torch: Any, case: tuple, buf: Any,
             name: str) -> tuple[dict, np.ndarray]:
    rows, cols, axis, dtype = case
    x = torch.randn(rows, cols, device="cuda", dtype=getattr(torch, dtype))
    out = torch.empty(cols if axis == 0 else rows, device="cuda", dtype=x.dtype)
    gx, gout = gpurt.asarray(x), gpurt.asarray(out)
    saved = reduction.reduce_source
    reduction.reduce_source = lambda *a, **k: traced(saved(*a, **k), buf.ptr)
    try:
        kernel = gpurt.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", name)
        out.fill_(float("nan"))
        kernel(gx, gout, axis=axis)
        torch.cuda.synchronize()
    finally:
        reduction.reduce_source = saved
    want = x.double().sum(axis)
    err = float(((out.double() - want).abs() / (x.double().abs().sum(axis) + 1e-30)).max())
    plan = list(kernel._plans.values())[-1]
    blocks = plan.grid[0] * plan.grid[1]
    nbytes = x.numel() * x.element_size()
    calls = []
    for _ in range(CALLS):
        _ok(cu.cuMemsetD8Async(buf.ptr, 0, blocks * SLOTS * 8, timer.handle))
        ms = timer.ms_once(lambda: kernel(gx, gout, axis=axis))
        host = np.empty(blocks * SLOTS, np.uint64)
        _ok(cu.cuMemcpyDtoH(host.ctypes.data, buf.ptr, host.nbytes))
        calls.append((ms, host.reshape(blocks, SLOTS)))
    ms, trace = sorted(calls, key=lambda c: c[0])[CALLS // 2]  # the median call
    found = {"what": f"sum({axis}) {rows}x{cols} {dtype}", "grid": list(plan.grid[:2]),
             "rel_err": err,
             "event_us_all": sorted(round(c[0] * 1e3, 2) for c in calls),
             **summary(trace, blocks, nbytes, copy, ms)}
    return found, trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--npz")
    parser.add_argument("--variant", action="append", help="knobs: module.NAME=value;...")
    args = parser.parse_args()
    torch = peer("torch")
    handle = int(torch.cuda.current_stream().cuda_stream)
    timer = Timer(handle, repeat=1)
    timer.ms_once = lambda fn: _once(timer, fn)  # type: ignore[attr-defined]
    copy = copy_gbps(Timer(handle, repeat=10))
    buf = gpurt.empty(65536 * SLOTS, "uint64")
    found: dict[str, Any] = {"device": gpurt.get_device_name(), "copy_GBps": copy, "rows": []}
    raw = {}
    with gpurt.stream(gpurt.ExternalStream(handle)):
        for number, spec in enumerate(args.variant or [""]):
            saved = _set(spec)
            try:
                for index, case in enumerate(CASES):
                    row, trace = run_case(timer, copy, torch, case, buf, f"tr{number}_{index}")
                    row["variant"] = spec
                    found["rows"].append(row)
                    raw[f"{row['what']} v{number}".replace(" ", "_")] = trace
                    print(json.dumps(row), flush=True)
            finally:
                for (module, name), value in saved.items():
                    setattr(module, name, value)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(found, fh, indent=1)
    if args.npz:
        np.savez_compressed(args.npz, **raw)


def _set(spec: str) -> dict[tuple[Any, str], Any]:
    """Set the knobs of ``spec`` (see the module docstring); returns their old values."""
    saved = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        target, _, value = item.partition("=")
        module_name, _, name = target.partition(".")
        module = MODULES[module_name]
        if not hasattr(module, name):
            raise SystemExit(f"colsum_trace: {module_name} has no knob {name!r}")
        saved[module, name] = getattr(module, name)
        setattr(module, name, ast.literal_eval(value))
    return saved


def _once(timer: Timer, fn: Any) -> float:
    """One call's event time in ms, after the timer's flush."""
    start, stop = _ok(cu.cuEventCreate(0)), _ok(cu.cuEventCreate(0))
    try:
        timer.flush()
        _ok(cu.cuEventRecord(start, timer.handle))
        fn()
        _ok(cu.cuEventRecord(stop, timer.handle))
        _ok(cu.cuEventSynchronize(stop))
        return float(_ok(cu.cuEventElapsedTime(start, stop)))
    finally:
        cu.cuEventDestroy(start)
        cu.cuEventDestroy(stop)


if __name__ == "__main__":
    main()
