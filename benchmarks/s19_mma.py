"""Session 19 (issue 17): GEMM candidates on rows that are not 16-byte multiples, kernel-only
cold (bench_gemm_decode's graph harness: 20 calls in a CUDA graph over input sets rotated past
the L2): each candidate of the named kernel families and gemm's own choice, against cuBLAS's
graph in the same process (fp32: TF32 off on both sides; tf32: on on both). Every timed
config's result is checked against float64 on a poisoned output.

    python benchmarks/s19_mma.py --tag new --json PATH [--shapes 29x11003x4099,...]
        [--dtype bf16|fp32|tf32] [--kernels mma,rowload,simt] [--splits 1,2,4,8]

``--splits``: each candidate of the named families also at these K splits (where eligible).
``--match``: only candidates whose label contains one of these ';'-separated texts.
``--host``: gemm's pick also timed as one eager call (host path included) taking torch tensors,
against torch.matmul (bench_gemm_decode's ``host_us``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import math

from bench_gemm_decode import Problem, gpurt_graph_us, host_us, torch_graph_us

SHAPES = "29x11003x4099,97x4093x4099,7x4099x11003,16x4099x4099,1x4099x4099,64x4099x4099," \
         "128x4099x4099,29x11003x4099t,97x4093x4099t"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", default="new")
    parser.add_argument("--json", required=True)
    parser.add_argument("--shapes", default=SHAPES, help="MxNxK, t: B = W.T (W stored N x K)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--only-chosen", action="store_true")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32", "tf32"))
    parser.add_argument("--kernels", default="mma")
    parser.add_argument("--splits", default="", help="comma list of K splits to add")
    parser.add_argument("--match", default="", help="';'-separated label texts to keep")
    parser.add_argument("--host", action="store_true",
                        help="gemm's pick also as one eager call with torch tensors in (host "
                             "path included) against torch.matmul")
    args = parser.parse_args()
    import torch

    import gpurt
    gemm_mod = importlib.import_module("gpurt.kernels.gemm")
    tune = importlib.import_module("gpurt.kernels._gemm_tune")
    plans = importlib.import_module("gpurt.kernels._gemm_plan")
    routes = importlib.import_module("gpurt.kernels._gemm_route")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    tf32 = args.dtype == "tf32"  # TF32 allowed on both sides
    torch.backends.cuda.matmul.allow_tf32 = tf32
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.dtype, torch.float32)
    limit = {"fp32": 1e-5, "tf32": 2e-3}.get(args.dtype, 1e-2)
    gemm = functools.partial(gemm_mod.gemm, allow_tf32=tf32)
    kernels = set(args.kernels.split(","))
    rows = []
    for text in args.shapes.split(","):
        nk = text.endswith("t")
        m, n, k = (int(v) for v in text.rstrip("t").split("x"))
        p = Problem(gpurt, torch, m, n, k, dtype, nk, l2)
        stream = gpurt.Stream()
        plan, _, _ = plans.make_plan(p.ga[0], p.gb[0], p.gout, 0.0, None, False, False, stream)
        configs: list = [None]
        if not args.only_chosen:
            problem = plans.problem_of(plan, tf32)
            configs += [c for c in tune.candidates(problem) if c.kernel in kernels and (
                not args.match or any(t in c.label() for t in args.match.split(";")))]
            for base in list(configs[1:]):
                for split in (int(v) for v in args.splits.split(",") if v):
                    variant = dataclasses.replace(base, split_k=split)
                    if variant not in configs and tune.eligible(problem, variant):
                        configs.append(variant)
        cublas = torch_graph_us(torch, p, args.repeat)
        for config in configs:
            p.out.fill_(math.nan)
            try:
                us = gpurt_graph_us(gpurt, gemm, p, config, args.repeat, torch)
                p.out.fill_(math.nan)
                gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream, config=config)
                stream.synchronize()
                err = p.rel_error(torch)
            except Exception as exc:  # a config that cannot run this problem
                print(text, config, "failed:", exc)
                continue
            label = config.label() if config is not None else \
                routes.label(routes.plan_call(plan, tf32, None, stream)) + " *"
            row = {"tag": args.tag, "dtype": args.dtype, "shape": text, "config": label,
                   "us": round(us, 2),
                   "cublas_us": round(cublas, 2), "ratio": round(cublas / us, 3),
                   "rel_err": float(f"{err:.3g}"), "ok": err < limit}
            if args.host and config is None:
                row["host_us"] = round(host_us(
                    torch, lambda i, x=p.a, y=p.b, z=p.out: gemm(x[i], y[i], out=z), p.sets,
                    args.repeat), 2)
                row["torch_host_us"] = round(host_us(
                    torch, lambda i, x=p.a, y=p.b, z=p.out: torch.matmul(x[i], y[i], out=z),
                    p.sets, args.repeat), 2)
            rows.append(row)
            print(row, flush=True)
            with open(args.json, "w") as fh:
                json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, fh,
                          indent=1)
    summary(rows)


def summary(rows: list[dict]) -> None:
    """Per shape: cuBLAS, gemm's pick and the fastest config whose result was right."""
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape]
        pick = next((r for r in mine if r["config"].endswith("*")), mine[0])
        right = [r for r in mine if r["ok"]]
        best = min(right, key=lambda r: r["us"]) if right else pick
        call = f" | call {pick['host_us']} torch {pick.get('torch_host_us')}" \
            if "host_us" in pick else ""
        print(f"{shape} cublas {pick['cublas_us']} | pick {pick['config'][:34]} {pick['us']} "
              f"{pick['ratio']} | best {best['config'][:34]} {best['us']} {best['ratio']} | "
              f"wrong {len(mine) - len(right)}{call}")


if __name__ == "__main__":
    main()
