"""Session 10's decode check (issue 17, helper ``s10-dec``): where the time goes at
128 x 4096^2 (bf16 / fp16, both weight layouts; 64 x 4096^2) and at 16 x 4099^2 (fp16 against
bf16, rows TMA cannot read).

``time``: per shape, every tuner candidate and a few more tilings (decode ring depths, mma
splits, rowload at bm 8 / 16), each through bench_gemm_decode.measure (kernel-only graph of
20 calls rotating operands past the L2, one eager call with the host path, cuBLAS in the same
process, the result against float64 on a NaN-poisoned output); the packed route forced.
``kernels``: the CUDA kernels cuBLAS (torch.matmul) and gemm launch per shape, with grid and
block (torch.profiler).
``one``: one warm call inside cudaProfilerStart/Stop, for ncu --profile-from-start off.
``sanitize``: a few calls on 192-row tiles (for compute-sanitizer).
``precompile``: the programs ``time`` needs, over 16 processes.

    python benchmarks/dec10_dev.py precompile|time|kernels|sanitize [--json PATH]
    python benchmarks/dec10_dev.py one gpurt|torch DTYPE M N K [nk]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import padrows_dev as base  # noqa: E402
import torch  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
Config = tune.Config
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# (dtype, M, N, K, weights N x K as x @ W.T)
SHAPES = [("bf16", 128, 4096, 4096, False), ("fp16", 16, 4099, 4099, False),
          ("fp16", 128, 4096, 4096, False), ("bf16", 128, 4096, 4096, True),
          ("bf16", 16, 4099, 4099, False), ("bf16", 64, 4096, 4096, False),
          ("bf16", 64, 4096, 4096, True)]


def _gemm_problem(p: Any) -> Any:
    plan = gm._plan(p.ga[0], p.gb[0], p.gout, 0.0, None, False, False,
                    gpurt.as_stream(None, 0))[0]
    return gm._problem(plan, False)


def _extra(problem: Any) -> list[Any]:
    """Tilings beyond the tuner's candidates worth timing on ``problem``."""
    if problem.m <= 16:  # rows TMA cannot read: mma splits, the thin mma tile, rowload
        found = [Config("mma", 64, 64, 32, 32, 32, stages=4, split_k=s) for s in (6, 12, 16, 24)]
        found += [Config("mma", 32, 32, 64, 16, 16, stages=2, split_k=s) for s in (4, 8, 16)]
        found += [Config("mma", 16, 64, 32, 16, 32, stages=4, split_k=s) for s in (9, 16)]
        found += [Config("rowload", bm, 248, 32, split_k=s) for bm in (8, 16) for s in (8, 15)]
        return found
    bn = 128 if problem.m > 64 else 64
    # 192-row tiles (3 consumers): 22 tiles of 4096 rows, split 4 in 22 clusters of 4
    found = [Config("decode", 192, bn, 64, stages=s, split_k=sp)
             for s, sp in ((5, 4), (4, 4), (5, 2), (6 if bn == 64 else 5, 8))]
    found += [Config("decode", 64, bn, 64, stages=s, split_k=2) for s in (4, 5, 7, 8)]
    found += [Config("decode", 64, 64, 64, stages=s, split_k=sp)
              for s, sp in ((6, 2), (8, 2), (6, 4), (6, 1))]
    found += [Config("decode", 128, bn, 64, stages=s, split_k=sp)
              for s, sp in ((6, 2), (4, 4), (3, 4))]
    return found


def variants(problem: Any) -> list[Any]:
    """gemm's choice first, then the tuner's candidates and _extra, each once, eligible."""
    found: list[Any] = []
    first, *rest = tune.candidates(problem)
    for config in [first, *rest, *_extra(problem)]:
        wide = problem.m > 16 and config.kernel in ("wgmma", "mma") and config.split_k == 1
        if config in found or (wide and config != first):  # few tiles: lost in session 8
            continue
        if tune.eligible(problem, config):
            found.append(config)
        else:
            print(f"  not eligible {config.label()}: {tune.why_not(problem, config)}")
    return found


# The second call (--recheck): cuBLAS's tiling at 64..128 x 4096^2 (64-row tiles over 2 tiles
# of the batch, K unsplit, a 13-16-stage ring) on the decode kernel, and the new choice at
# 16 x 4099^2 against the old one.
RECHECK = [("bf16", 128, 4096, 4096, False), ("fp16", 128, 4096, 4096, False),
           ("bf16", 128, 4096, 4096, True), ("bf16", 64, 4096, 4096, False),
           ("bf16", 64, 4096, 4096, True), ("fp16", 16, 4099, 4099, False),
           ("bf16", 16, 4099, 4099, False), ("bf16", 8, 4099, 4099, False)]


def recheck_variants(problem: Any) -> list[Any]:
    """What --recheck times besides gemm's choice on ``problem``."""
    if problem.m <= 16:  # the choice before this session
        return [Config("mma", 64, 64, 32, 32, 32, stages=4, split_k=9)]
    if problem.m > 64:
        found = [Config("decode", 64, 128, 64, stages=6, split_k=2)]
        found += [Config("decode", 64, 64, 64, stages=s) for s in (6, 8, 10, 12, 13)]
    else:
        found = [Config("decode", 64, 64, 64, stages=6, split_k=2)]
        found += [Config("decode", 64, 32, 64, stages=s) for s in (6, 8, 12, 16)]
        found += [Config("decode", 64, 64, 64, stages=s) for s in (8, 12)]
    return [c for c in found if tune.eligible(problem, c)]


VARIANTS = [variants]  # what ``time`` and ``precompile`` take per problem (--recheck: its own)


def _problems(l2: int) -> list[tuple[str, Any]]:
    return [(name, bench.Problem(gpurt, torch, m, n, k, DTYPES[name], nk, l2))
            for name, m, n, k, nk in SHAPES]


def run_precompile() -> None:
    todo: dict[Any, None] = {}
    for _, p in _problems(1 << 20):
        problem = _gemm_problem(p)
        for config in [tune.heuristic(problem), *VARIANTS[0](problem)]:
            todo[launch.program(config, problem)] = None
        plan = gm._plan(p.ga[0], p.gb[0], p.gout, 0.0, None, False, False,
                        gpurt.as_stream(None, 0))[0]
        route = gm._pack_route(plan, problem, False)
        if route is not None:
            todo[launch.program(tune.heuristic(route[1]), route[1])] = None
    todo[("gemm_pack.cu", ("gemm_pack<unsigned short>",), "sm_90")] = None
    print(f"precompiled {launch.compile_programs(list(todo), 16)} programs", flush=True)


def run_timing(json_path: str | None, budget: float) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy_bps = bench.copy_bandwidth(torch)
    rows: list[dict[str, Any]] = [{"device": torch.cuda.get_device_name(0),
                                   "copy_GBps": round(copy_bps / 1e9, 1)}]
    print(json.dumps(rows[0]), flush=True)
    start = time.monotonic()
    for (name, m, n, k, nk), (_, p) in zip(SHAPES, _problems(l2)):
        shape = f"{m}x{n}x{k}{' nk' if nk else ''} {name}"
        configs: list[Any] = [None, *VARIANTS[0](_gemm_problem(p))]
        for config in configs:
            if time.monotonic() - start > budget:
                print(f"budget spent at {shape}", flush=True)
                return
            label = "auto" if config is None else config.label()
            try:
                row = bench.measure(gpurt, torch, gm, p, config, copy_bps, 10)
            except Exception as exc:  # noqa: BLE001 - report and go on
                row = {"error": repr(exc)[:300]}
            row.update(case=shape, variant=label)
            rows.append(row)
            print(json.dumps(row), flush=True)
        if n % 8 == 0:
            continue
        try:  # the packed route forced (copies + a TMA kernel) where rows are split
            base._route("on")
            gm.clear_plans()
            row = bench.measure(gpurt, torch, gm, p, None, copy_bps, 10)
            row.update(case=shape, variant="packed")
            rows.append(row)
            print(json.dumps(row), flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{shape} packed: {exc!r}", flush=True)
        finally:
            base._route("auto")
            gm.clear_plans()
        if json_path:
            Path(json_path).write_text(json.dumps(rows, indent=1))
        del p


def _profile(fn: Any) -> list[dict[str, Any]]:
    """The kernels ``fn`` launches (name, grid, block, us), from torch.profiler's trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return [{"name": e["name"][:160], "grid": e.get("args", {}).get("grid"),
             "block": e.get("args", {}).get("block"), "us": e.get("dur")}
            for e in events if e.get("cat") == "kernel"]


def _kernels_of(p: Any) -> dict[str, Any]:
    """The kernels one warm call of torch.matmul and of gemm launch on ``p``."""
    stream = gpurt.Stream()

    def ours() -> None:
        gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream)
        stream.synchronize()

    def theirs() -> None:
        torch.matmul(p.a[0], p.b[0], out=p.out)

    for _ in range(2):  # warm: compiled, loaded, cuBLAS's heuristics cached
        ours()
        theirs()
    torch.cuda.synchronize()
    return {"cublas": _profile(theirs), "gpurt": _profile(ours)}


def run_kernels(json_path: str | None) -> None:
    rows = []
    for (name, m, n, k, nk), (_, p) in zip(SHAPES, _problems(1 << 20)):
        rows.append({"case": f"{m}x{n}x{k}{' nk' if nk else ''} {name}", **_kernels_of(p)})
        print(json.dumps(rows[-1]), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def run_sanitize() -> None:
    """A few 192-row-tile calls for compute-sanitizer: split 1 / 2 / 4, both weight layouts,
    beta with C in, a tall C, a last tile past P; each against float64 (PASS / FAIL)."""
    for m, n, k, nk, split, beta in [(128, 1000, 520, False, 4, 0.0), (40, 776, 1032, True, 2, 0.5),
                                     (128, 400, 264, False, 1, -1.0), (600, 24, 520, True, 4, 0.0)]:
        p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, nk, 1 << 20)
        config = tune._decode_config(tune._decode._tiles(_gemm_problem(p), 192, split))
        c = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        p.out.copy_(c)
        torch.cuda.synchronize()  # torch's stream is not gemm's
        gm.gemm(p.ga[0], p.gb[0], out=p.gout, beta=beta, config=config)
        gpurt.synchronize()
        want = p.a[0].double() @ p.b[0].double() + beta * c.double()
        err = float(torch.linalg.norm(p.out.double() - want) / torch.linalg.norm(want))
        print(f"{'PASS' if err < 1e-2 else 'FAIL'} {m}x{n}x{k} nk={nk} {config.label()} "
              f"beta={beta} err={err:.3g}", flush=True)


def run_one(who: str, name: str, m: int, n: int, k: int, nk: bool) -> None:
    p = bench.Problem(gpurt, torch, m, n, k, DTYPES[name], nk, 1 << 20)
    stream = gpurt.Stream()

    def call() -> None:
        if who == "torch":
            torch.matmul(p.a[1], p.b[1], out=p.out)
        else:
            gm.gemm(p.ga[1], p.gb[1], out=p.gout, stream=stream)
            stream.synchronize()
        torch.cuda.synchronize()

    call()
    call()
    torch.cuda.profiler.start()
    call()
    torch.cuda.profiler.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("precompile", "time", "kernels", "one", "sanitize"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--json", default=None)
    parser.add_argument("--budget", type=float, default=100.0)
    parser.add_argument("--recheck", action="store_true", help="the second call's shapes")
    args = parser.parse_args()
    if args.recheck:
        SHAPES[:] = RECHECK
        VARIANTS[0] = recheck_variants
    if args.mode == "precompile":
        run_precompile()
    elif args.mode == "time":
        run_timing(args.json, args.budget)
    elif args.mode == "kernels":
        run_kernels(args.json)
    elif args.mode == "sanitize":
        run_sanitize()
    else:
        who, name, m, n, k, *rest = args.args
        run_one(who, name, int(m), int(n), int(k), rest == ["nk"])


if __name__ == "__main__":
    main()
