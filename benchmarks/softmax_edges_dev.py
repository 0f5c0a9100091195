"""Issue 17 dev harness: rows whose length is not a multiple of the vector width, three ways
in one run (GB/s and % of copy, timed like bench_softmax.py):

  edges    aligned arrays: 16-byte accesses with scalar edges (the new route)
  scalar   the output one element past an allocation's start, so the arrays agree only
           modulo 4 bytes (float32) and every access is one element (the old route of odd
           lengths)
  aligned  the next shorter multiple of 8 columns (whole vectors; the reference)

    python benchmarks/softmax_edges_dev.py [--json PATH] [--ways edges,scalar,aligned]
    [--cases N] (the first N cases)
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from bench_softmax import BF16, F32, OPS, Timer, copy_gbps, gpurt_call, make_inputs, peer, plan

import gpurt

CASES = [
    (4096, 50257, F32, "softmax"),
    (4096, 32001, F32, "softmax"),
    (4096, 50257, BF16, "softmax"),
    (4096, 50257, F32, "softmax_backward"),
    (64, 1_000_003, F32, "softmax"),
    (4096, 4099, F32, "softmax"),
    (4096, 11009, F32, "softmax"),
    (4096, 50257, F32, "log_softmax"),
    (4096, 50257, BF16, "softmax_backward"),
    (4096, 50257, F32, "log_softmax_backward"),
    (4096, 11009, F32, "softmax_backward"),
]


def shifted_empty(shape: tuple[int, int], dtype: np.dtype) -> gpurt.Array:
    rows, cols = shape
    return gpurt.empty(rows * cols + 1, dtype=dtype)[1:].reshape(rows, cols)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--ways", default="edges,scalar,aligned")
    parser.add_argument("--cases", type=int, default=len(CASES))
    args = parser.parse_args()
    ways = args.ways.split(",")
    torch = peer("torch")
    handle = int(torch.cuda.current_stream().cuda_stream)
    timer = Timer(handle, repeat=30)
    copy = copy_gbps(timer)
    results = []
    for rows, cols, dtype, name in CASES[:args.cases]:
        op = OPS[name]
        row = {"shape": f"{rows}x{cols}", "dtype": dtype.name, "op": name}
        for way in ways:
            length = cols // 8 * 8 if way == "aligned" else cols
            made = make_inputs(op, rows, length, dtype, torch)
            arrays = [gpurt.asarray(m) for m in made]
            out = (shifted_empty if way == "scalar" else gpurt.empty)((rows, length), dtype)
            nbytes = (len(made) + 1) * rows * length * dtype.itemsize
            gbps = nbytes / timer.ms(gpurt_call(op, arrays, out, handle)) / 1e6
            row[way] = round(100 * gbps / copy, 1)
            del made, arrays, out
        row["variant"] = plan.choose_variant(cols, dtype, op).names()[0]
        results.append(row)
        print(json.dumps(row), flush=True)
    print(f"copy {copy:.0f} GB/s on {gpurt.get_device_name()}; % of copy:")
    print(f"{'shape':>14} {'dtype':>8} {'op':>21} " + " ".join(f"{w:>8}" for w in ways))
    for r in results:
        print(f"{r['shape']:>14} {r['dtype']:>8} {r['op']:>21} "
              + " ".join(f"{r[w]:>8}" for w in ways))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": gpurt.get_device_name(), "copy_GBps": copy, "rows": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
