"""cuBLAS's kernels (name, grid, block, registers, shared memory, median us) under torch.profiler
at the shapes issue 17 trails, for choosing our tiles. GPU machine, torch only:

    python3 benchmarks/cublas_kernels.py OUT.json

Session 13's run: results/cublas-kernels-s13-nvidia-h100.json (notes_gemm.md, "Session 13").
nvjet names are cuBLAS's column-major view: its M is our N.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = (
    [("bfloat16", n, n, n) for n in (640, 768, 1000, 1280, 1536, 1792, 2304)]
    + [("bfloat16", 2000, 3000, 1000), ("bfloat16", 1000, 1000, 4000),
       ("bfloat16", 3000, 5000, 2000), ("float16", 1536, 1536, 1536)]
    + [("float32", n, n, n) for n in (768, 1000, 1536)] + [("float32", 2053, 3001, 1999)]
)
FIELDS = ("grid", "block", "registers per thread", "shared memory", "blocks per SM")


def kernels(dtype: str, m: int, n: int, k: int, calls: int = 10) -> list[dict[str, Any]]:
    """The kernels ``a @ b`` launches, with their median device time over ``calls`` calls."""
    a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(k, n, device="cuda", dtype=a.dtype)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            a @ b
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(event.name, []).append(event.device_time)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    meta = {e["name"]: {f: e.get("args", {}).get(f) for f in FIELDS}
            for e in events if e.get("cat") == "kernel"}
    return [dict(dtype=dtype, shape=f"{m}x{n}x{k}", kernel=name,
                 us=sorted(ts)[len(ts) // 2], calls=len(ts), **meta.get(name, {}))
            for name, ts in times.items()]


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for shape in SHAPES:
        for row in kernels(*shape):
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
