"""Small cases of the float32 rows softmax runs in thread-block clusters (softmax_cluster: 2, 4
and 8 CTAs a row), each op, for compute-sanitizer (memcheck, racecheck, synccheck): few rows
(one cluster each) and more rows than clusters at once (a cluster takes several rows, so its
shared slot is rewritten), checked against torch in float64 on a poisoned output.

    compute-sanitizer --tool racecheck python benchmarks/softmax_cluster_san.py
"""

from __future__ import annotations

import sys

from bench_softmax import F32, OPS, gpurt_call, make_inputs, plan
from softmax_edges_dev import _torch_reference

import gpurt

CASES = [(64, 65537, "softmax"), (40, 131071, "log_softmax"), (16, 300001, "log_softmax"),
         (40, 50257, "softmax_backward"), (24, 131072, "softmax_backward"),
         (600, 65537, "softmax")]


def main() -> int:
    import torch

    failed = 0
    handle = int(torch.cuda.current_stream().cuda_stream)
    for rows, cols, name in CASES:
        op = OPS[name]
        pick = plan.choose_variant(cols, F32, op, rows=rows)
        made = make_inputs(op, rows, cols, F32, torch)
        arrays = [gpurt.asarray(m) for m in made]
        out = gpurt.empty((rows, cols), F32)
        torch.from_dlpack(out).fill_(float("nan"))
        gpurt_call(op, arrays, out, handle)()
        torch.cuda.synchronize()
        err = float((torch.from_dlpack(out).double() - _torch_reference(op, made, torch))
                    .abs().max())
        ok = pick.kind == "cluster" and err < 1e-5
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {rows}x{cols} {name} {pick.names()[0]} err {err:.2e}",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
