"""fp32 SIMT at issue 17's misses (session 10): the cut along M (kernels/_gemm_rows.py) against
one grid, kernel-only (bench_gemm_decode's graph replay of 20 calls over rotating inputs)
and warm (bench_gemm's Timer: back-to-back calls on one input set), cuBLAS (fp32, TF32 off)
both ways in the same process; what cuBLAS launches (torch.profiler: kernel, grid, block);
one call of each for ncu; a few cut calls for compute-sanitizer. Every variant is first
checked against float64 into a NaN-poisoned output.

    python benchmarks/simt_s10_dev.py time [--shapes 3000x3000x3000,...] [--json PATH]
    python benchmarks/simt_s10_dev.py profile [--json PATH]
    python benchmarks/simt_s10_dev.py one M N K gpurt|nocut|cublas
    python benchmarks/simt_s10_dev.py sanitize [STEP]
    python benchmarks/simt_s10_dev.py tail [--json PATH]
    python benchmarks/simt_s10_dev.py time --variants auto,nopack,nocut [--shapes ...]
    python benchmarks/simt_s10_dev.py configs [--shapes 1000x1000x1000] [--json PATH]
    python benchmarks/simt_s10_dev.py sanitize_pack [STEP]
    python benchmarks/simt_s10_dev.py precompile

Session 10's second helper (s10-simt2): ``nopack`` plans without the fp32 packed route
(GPURT_GEMM_DISABLE=pack: rows along M or N that are not 16-byte multiples read 4 bytes at a
time), ``nocut`` without the cut (the packed route then runs one grid); ``configs`` times
forced simt tiles and splits (CONFIGS) both ways; ``sanitize_pack`` runs the packed route on
a few forced cases; ``precompile`` compiles what these need in parallel.

``tail`` times every simt tile (simt_shapes_dev.py's s9 variants) on 645 x 3001 x 1999, the
rows of 2053 x 3001 x 1999 that the cut leaves to its second launch.

Programs: `python benchmarks/simt_shapes_dev.py precompile` compiles every simt program.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import simt_shapes_dev as s9  # noqa: E402
import torch  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
rows_mod = importlib.import_module("gpurt.kernels._gemm_rows")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
simt_model = importlib.import_module("gpurt.kernels._gemm_simt_model")

SHAPES = [(3000, 3000, 3000), (2053, 3001, 1999), (1000, 1000, 1000), (3000, 5000, 2000),
          (4099, 4099, 4099), (2000, 3000, 1000), (2500, 2500, 2500), (4096, 4096, 4096)]
REPEAT = 7
_REAL_CUT = rows_mod.cut


def _cuts(p: Any) -> list[Any]:
    """Every (rows, head) the cut could take: whole waves of each head tile, by model cost."""
    found = []
    for head in rows_mod._HEADS:
        slots = p.sm_count * simt_model.resident_ctas(p, head)
        columns = -(-p.n // head.bn)
        for waves in range(1, 8):
            rows = waves * slots // columns * head.bm
            if 0 < rows < p.m:
                found.append((rows_mod._cut_cost(p, head, rows), rows, head))
    return [(rows, head) for _, rows, head in sorted(found, key=lambda x: x[0])[:4]]


def _mode(kind: str, forced: Any = None) -> None:
    """Plans from now on: the model's cut (``auto``), none (``nocut``), no packed route
    (``nopack``) or ``forced``."""
    os.environ.pop("GPURT_GEMM_DISABLE", None)
    rows_mod.cut = _REAL_CUT
    if kind == "nocut":
        os.environ["GPURT_GEMM_DISABLE"] = "rows"
    elif kind == "nopack":
        os.environ["GPURT_GEMM_DISABLE"] = "pack"
    elif kind == "forced":
        rows_mod.cut = lambda problem: forced
    gm.clear_plans()


def _label(data: Any) -> str:
    stream = gpurt.Stream()
    plan, _, _ = gm.plans.make_plan(data.ga[0], data.gb[0], data.gout, 0.0, None, False,
                                    False, stream)
    return str(gm.routes.label(gm.routes.plan_call(plan, False, None, stream)))


def time_shapes(shapes: list[tuple[int, int, int]], json_path: str | None,
                kinds: list[str] | None = None) -> None:
    from bench_gemm import Timer
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    timer = Timer(gpurt, stream)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows: list[dict[str, Any]] = []
    for m, n, k in shapes:
        data = bench.Problem(gpurt, torch, m, n, k, torch.float32, False, l2)
        p = s9.problem(m, n, k)
        ref = s9.reference(data)
        batch = max(1, min(20, int(4e11 / (2.0 * m * n * k))))

        def warm(d: Any = data, batch: int = batch) -> float:
            return timer.ms(lambda: gm.gemm(d.ga[0], d.gb[0], out=d.gout, stream=stream),
                            batch, REPEAT) * 1e3
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            cublas = bench.torch_graph_us(torch, data, REPEAT)
            cublas_warm = timer.ms(lambda d=data: torch.matmul(d.a[0], d.b[0], out=d.out),
                                   batch, REPEAT) * 1e3
            cublas_call = bench.host_us(torch, lambda i, d=data: torch.matmul(
                d.a[i], d.b[i], out=d.out), data.sets, REPEAT)
            variants: list[tuple[str, Any]] = [("auto", None), ("nocut", None)]
            variants += [("forced", cut) for cut in _cuts(p)[:3] if cut != _REAL_CUT(p)]
            if kinds is not None:
                variants = [(kind, None) for kind in kinds]
            for kind, forced in variants:
                _mode(kind, forced)
                try:
                    label = _label(data)
                    err = s9.rel_err(data, ref, None)
                    us = bench.gpurt_graph_us(gpurt, gm.gemm, data, None, REPEAT, torch)
                    us_warm = warm()
                    call = bench.host_us(torch, lambda i, d=data: gm.gemm(
                        d.ga[i], d.gb[i], out=d.gout, stream=stream), data.sets, REPEAT)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{m}x{n}x{k} {kind} {forced}: {exc!r}", flush=True)
                    continue
                s9._keep({"shape": f"{m}x{n}x{k}", "mode": kind, "config": label,
                          "us": round(us, 2), "cublas_us": round(cublas, 2),
                          "ratio": round(cublas / us, 3), "warm_us": round(us_warm, 2),
                          "cublas_warm_us": round(cublas_warm, 2),
                          "warm_ratio": round(cublas_warm / us_warm, 3),
                          "call_us": round(call, 2), "cublas_call_us": round(cublas_call, 2),
                          "err": float(f"{err:.3g}")}, rows, json_path)
        _mode("auto")
        del data, ref


def profile(json_path: str | None) -> None:
    """cuBLAS's and gpurt's kernels at the misses: name, grid, block, device time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    torch.backends.cuda.matmul.allow_tf32 = False
    found: list[dict[str, Any]] = []
    for m, n, k in SHAPES[:3]:
        a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        out = torch.empty(m, n, device="cuda")
        for _ in range(2):
            torch.matmul(a, b, out=out)
            gm.gemm(a, b, out=out)
        torch.cuda.synchronize()
        trace = Path(f"/tmp/simt_s10_{m}.json")
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.matmul(a, b, out=out)
            gm.gemm(a, b, out=out)
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace))
        for event in json.loads(trace.read_text())["traceEvents"]:
            if event.get("cat") == "kernel":
                args = event.get("args", {})
                row = {"shape": f"{m}x{n}x{k}", "kernel": event["name"][:160],
                       "grid": args.get("grid"), "block": args.get("block"),
                       "regs": args.get("registers per thread"),
                       "smem": args.get("shared memory"), "us": event.get("dur")}
                found.append(row)
                print(json.dumps(row), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(found, indent=1))


def one(m: int, n: int, k: int, which: str) -> None:
    """A warm-up call, then the one ncu profiles (``--launch-skip``: the warm-up's)."""
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    out = torch.empty(m, n, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    _mode("nocut" if which == "nocut" else "auto")
    call: Callable[[], Any] = (lambda: torch.matmul(a, b, out=out)) if which == "cublas" \
        else (lambda: gm.gemm(a, b, out=out))
    for _ in range(2):
        call()
    torch.cuda.synchronize()


def _checked_gemm(a: Any, b: Any, ta: bool, tb: bool) -> float:
    """One gemm call (alpha 0.5, beta -1.5 with C in) into a NaN-poisoned output; its relative
    error against float64."""
    m, n = a.shape[1] if ta else a.shape[0], b.shape[0] if tb else b.shape[1]
    c = torch.randn(m, n, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda")
    gm.gemm(a, b, out=out, trans_a=ta, trans_b=tb, alpha=0.5, beta=-1.5, c=c)
    ref = 0.5 * ((a.double().T if ta else a.double()) @ (b.double().T if tb else b.double()))
    ref -= 1.5 * c.double()
    return float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))


def sanitize(step: int = 1) -> None:
    """Cut calls of both head tiles, every layout, beta/Cin, tails split and not (every
    ``step``-th of them: racecheck takes ~9 s a call)."""
    cases = [(293, 517, 1001, 256, tune._SIMT[0]), (300, 290, 203, 128, tune._SIMT[1]),
             (401, 130, 2050, 384, tune._SIMT[1])]
    combos = [(c, ta, tb) for c in cases for ta in (False, True) for tb in (False, True)]
    for (m, n, k, head_rows, head), ta, tb in combos[::step]:
        _mode("forced", (head_rows, head))
        a = torch.randn((k, m) if ta else (m, k), device="cuda")
        b = torch.randn((n, k) if tb else (k, n), device="cuda")
        err = _checked_gemm(a, b, ta, tb)
        cuts = [e[0] for e in gm._calls.values() if isinstance(e[0], rows_mod.RowsCall)]
        ok = err < 1e-5 and len(cuts) == 1
        print("PASS" if ok else "FAIL", m, n, k, ta, tb, cuts[0].label() if cuts else "no cut",
              f"{err:.2e}", flush=True)
    _mode("auto")


# 1000^3 warm (issue 17): every tile near the model's pick, with the splits around it; the
# wide tile with 8-deep K tiles (a shorter pipeline fill) too.
_WIDE_BK8 = dataclasses.replace(tune._SIMT[0], bk=8, stages=4)
CONFIGS = [dataclasses.replace(base, split_k=split) for base, splits in [
    (tune._SIMT[0], (2, 3, 4, 5, 6, 8)), (_WIDE_BK8, (2, 4, 8)), (tune._SIMT[1], (2, 4)),
    (tune._SIMT[2], (2, 4)), (tune._SIMT[3], (1, 2, 3, 4)), (tune._SIMT[4], (2, 4)),
    (tune._SIMT[8], (1, 2, 3)), (tune._SIMT[6], (1, 2))] for split in splits]


def time_configs(shapes: list[tuple[int, int, int]], json_path: str | None) -> None:
    """Each of CONFIGS forced, kernel-only (graph, rotating) and warm, cuBLAS both ways."""
    from bench_gemm import Timer
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    timer = Timer(gpurt, stream)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows: list[dict[str, Any]] = []
    _mode("auto")
    for m, n, k in shapes:
        data = bench.Problem(gpurt, torch, m, n, k, torch.float32, False, l2)
        p = s9.problem(m, n, k)
        ref = s9.reference(data)
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            cublas = bench.torch_graph_us(torch, data, REPEAT)
            cublas_warm = timer.ms(lambda d=data: torch.matmul(d.a[0], d.b[0], out=d.out),
                                   20, REPEAT) * 1e3
            for config in [None, *CONFIGS]:
                try:
                    err = s9.rel_err(data, ref, config)
                    us = bench.gpurt_graph_us(gpurt, gm.gemm, data, config, REPEAT, torch)
                    us_warm = timer.ms(lambda d=data, c=config: gm.gemm(
                        d.ga[0], d.gb[0], out=d.gout, stream=stream, config=c), 20, REPEAT) * 1e3
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{m}x{n}x{k} {config}: {exc!r}", flush=True)
                    continue
                label = "auto " + _label(data) if config is None else config.label()
                model = None if config is None else round(
                    simt_model.grid_cost(p, config, config.split_k), 2)
                s9._keep({"shape": f"{m}x{n}x{k}", "config": label, "us": round(us, 2),
                          "cublas_us": round(cublas, 2), "ratio": round(cublas / us, 3),
                          "warm_us": round(us_warm, 2), "cublas_warm_us": round(cublas_warm, 2),
                          "warm_ratio": round(cublas_warm / us_warm, 3), "model": model,
                          "err": float(f"{err:.3g}")}, rows, json_path)
        del data, ref


def sanitize_pack(step: int = 1) -> None:
    """The fp32 packed route forced (copies wherever rows allow, the cut and one grid), three
    layouts on offset views, beta/Cin (every ``step``-th case)."""
    pack = importlib.import_module("gpurt.kernels._gemm_pack")
    pack.simt_pays = lambda before, after, copies: bool(copies)
    cases = [(293, 517, 1001, (256, tune._SIMT[0])), (131, 259, 1003, None)]
    combos = [(c, t) for c in cases for t in ((False, False), (True, False), (True, True))]
    for (m, n, k, cut), (ta, tb) in combos[::step]:
        _mode("forced", cut)
        a = torch.randn((k, m + 3) if ta else (m, k + 3), device="cuda")[:, 3:]
        b = torch.randn((n, k) if tb else (k, n), device="cuda")
        err = _checked_gemm(a, b, ta, tb)
        packs = [e[0] for e in gm._calls.values() if isinstance(e[0], pack.PackedCall)]
        ok = err < 1e-5 and len(packs) == 1
        print("PASS" if ok else "FAIL", m, n, k, ta, tb, packs[0].label() if packs else "no pack",
              f"{err:.2e}", flush=True)
    _mode("auto")


def precompile(layouts: list[tuple[bool, bool]] | None = None) -> None:
    """The programs the timing, the tests and the sanitizer need: every simt tile in every
    layout (or ``layouts``: (A K-major, B K-major) pairs) with and without vector loads, split
    and not; the 8-deep wide tile; the copies."""
    gl = importlib.import_module("gpurt.kernels._gemm_launch")
    todo: dict[Any, None] = {}
    if layouts is None:
        layouts = [(a_k, b_k) for a_k in (True, False) for b_k in (True, False)]
    for base in (*tune._SIMT, _WIDE_BK8):
        for split, (a_k, b_k), vec in [(s, lay, v) for s in (1, 2) for lay in layouts
                                       for v in (True, False)]:
            if base is _WIDE_BK8 and (not vec or not a_k or b_k):
                continue
            config = dataclasses.replace(base, split_k=split)
            p = tune.Problem(256, 256, 256, tune.DT_F32, a_k, b_k, vec, vec, (9, 0), 132)
            todo[gl.program(config, p)] = None
    todo[("gemm_pack.cu", ("gemm_pack<unsigned int>",), "sm_90")] = None
    print(f"compiling {len(todo)} programs", flush=True)
    gl.compile_programs(list(todo))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["time", "profile", "one", "sanitize", "tail",
                                         "configs", "sanitize_pack", "precompile"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--shapes", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--variants", default=None, help="comma list: auto,nopack,nocut")
    args = parser.parse_args()
    shapes = SHAPES if args.shapes is None else [
        tuple(int(x) for x in text.split("x")) for text in args.shapes.split(",")]
    if args.mode == "time":
        kinds = None if args.variants is None else args.variants.split(",")
        time_shapes(shapes, args.json, kinds)  # type: ignore[arg-type]
    elif args.mode == "configs":
        time_configs(shapes, args.json)  # type: ignore[arg-type]
    elif args.mode == "sanitize_pack":
        sanitize_pack(int(args.args[0]) if args.args else 1)
    elif args.mode == "precompile":
        precompile()
    elif args.mode == "profile":
        profile(args.json)
    elif args.mode == "one":
        m, n, k = (int(x) for x in args.args[:3])
        one(m, n, k, args.args[3])
    elif args.mode == "tail":
        s9.GROUPS["tail"] = [(645, 3001, 1999)]  # 2053 x 3001 x 1999's rows past the cut
        s9.time_s9("tail", args.json, [])
    else:
        sanitize(int(args.args[0]) if args.args else 1)


if __name__ == "__main__":
    main()
