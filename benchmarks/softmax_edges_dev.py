"""Issue 17 dev harness: rows whose length is not a multiple of the vector width, three ways
in one run (GB/s and % of copy, timed like bench_softmax.py):

  edges    aligned arrays: 16-byte accesses with scalar edges (the new route)
  scalar   the output one element past an allocation's start, so the arrays agree only
           modulo 4 bytes (float32) and every access is one element (the old route of odd
           lengths)
  aligned  the next shorter multiple of 8 columns (whole vectors; the reference)

    python benchmarks/softmax_edges_dev.py [--json PATH] [--ways edges,scalar,aligned]
    [--cases N] (the first N cases) [--routes] (instead: ROUTES, forced variants at 4096
    rows, each checked against torch in float64 and timed)
"""

from __future__ import annotations

import argparse
import importlib
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


V = plan.Variant
# (cols, dtype, op name) -> forced variants to compare (the chooser's first)
ROUTES = {
    (50257, F32, "log_softmax"): [V("cluster", 0, 1, 4, 8, 1024, 1024, 2, 1, 0, True),
                                  V("cluster", 0, 1, 4, 16, 512, 512, 2, 2, 8, True),
                                  V("rows", 0, 1, 4, 16, 1024, 1024, 1, 1, 12, True)],
    (50257, F32, "log_softmax_backward"): [V("cluster", 0, 3, 4, 8, 1024, 1024, 2, 1, 6, True),
                                           V("cluster", 0, 3, 4, 16, 512, 512, 2, 1, 4, True)],
    (50257, BF16, "softmax"): [V("rows", 2, 0, 8, 8, 1024, 1024, 1, 1, 6, True),
                               V("cluster", 2, 0, 8, 4, 1024, 1024, 2, 1, 0, True),
                               V("cluster", 2, 0, 8, 8, 512, 512, 2, 2, 4, True),
                               V("cluster", 2, 0, 8, 4, 512, 512, 4, 2, 0, True),
                               V("cluster", 2, 0, 8, 8, 512, 512, 2, 1, 0, True)],
    (50257, BF16, "softmax_backward"): [V("cluster", 2, 2, 8, 4, 1024, 1024, 2, 1, 3, True),
                                        V("cluster", 2, 2, 8, 2, 1024, 1024, 4, 1, 0, True),
                                        V("cluster", 2, 2, 8, 4, 512, 512, 4, 1, 0, True)],
}


def routes(timer: Timer, copy: float, torch: object) -> list[dict]:
    """Each forced variant of ROUTES: error against torch in float64, % of copy."""
    sm = importlib.import_module("gpurt.kernels.softmax")
    sm.precompile(v for vs in ROUTES.values() for v in vs)
    arch = gpurt.get_arch()
    found = []
    for (cols, dtype, name), variants in ROUTES.items():
        op, rows = OPS[name], 4096
        made = make_inputs(op, rows, cols, dtype, torch)
        arrays = [gpurt.asarray(m) for m in made]
        out = gpurt.empty((rows, cols), dtype)
        want = _torch_reference(op, made, torch)
        for v in variants:
            call = sm._Call(tuple(sm._kernels_for(v, arch)), v.grid(rows, cols), v.threads,
                            v.shared_mem, rows, cols, 0, 0)
            torch.from_dlpack(out).fill_(12345)
            call.launch(arrays[0], arrays[-1], out, timer.handle)
            torch.cuda.synchronize()
            got = torch.from_dlpack(out).double()
            err = ((got - want).norm() / want.norm()).item()
            ms = timer.ms(lambda call=call, a=arrays, o=out: call.launch(a[0], a[-1], o,
                                                                          timer.handle))
            pct = 100 * (len(made) + 1) * rows * cols * dtype.itemsize / ms / 1e6 / copy
            found.append({"case": f"{rows}x{cols} {dtype.name} {name}", "variant": v.names()[0],
                          "err": err, "pct_copy": round(pct, 1)})
            print(json.dumps(found[-1]), flush=True)
        del made, arrays, out
    return found


def _torch_reference(op: int, made: list, torch: object) -> object:
    x = made[0].double()
    if op == plan.SOFTMAX:
        return torch.softmax(x, -1)
    if op == plan.LOG_SOFTMAX:
        return torch.log_softmax(x, -1)
    dy = made[1].double()
    if op == plan.SOFTMAX_BACKWARD:
        return x * (dy - (dy * x).sum(-1, keepdim=True))
    return dy - torch.exp(x) * dy.sum(-1, keepdim=True)


def shifted_empty(shape: tuple[int, int], dtype: np.dtype) -> gpurt.Array:
    rows, cols = shape
    return gpurt.empty(rows * cols + 1, dtype=dtype)[1:].reshape(rows, cols)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--ways", default="edges,scalar,aligned")
    parser.add_argument("--cases", type=int, default=len(CASES))
    parser.add_argument("--routes", action="store_true")
    args = parser.parse_args()
    ways = args.ways.split(",")
    torch = peer("torch")
    handle = int(torch.cuda.current_stream().cuda_stream)
    timer = Timer(handle, repeat=30)
    copy = copy_gbps(timer)
    if args.routes:
        found = routes(timer, copy, torch)
        print(f"copy {copy:.0f} GB/s on {gpurt.get_device_name()}")
        for r in found:
            print(f"{r['case']:>36} {r['variant']:>48} err {r['err']:.1e} {r['pct_copy']:>6}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": gpurt.get_device_name(), "copy_GBps": copy, "routes": found},
                          f, indent=1)
        return
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
