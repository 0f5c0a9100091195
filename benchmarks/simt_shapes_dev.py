"""fp32 SIMT GEMM at issue 17's shapes (decode projections, irregular sizes): every simt tile
with a range of K splits, kernel-only (bench_gemm_decode's graph replay of 20 calls over
rotating inputs, so B comes from device memory) next to cuBLAS (torch.matmul, TF32 off) and
gemm's heuristic choice (with its single-call time, host path included). Each variant is
first checked against a float64 product into a NaN-poisoned output. Rows carry the wave
model's cost (kernels/_gemm_simt_model.py, grid_cost) so the model can be checked against them.

    python benchmarks/simt_shapes_dev.py precompile
    python benchmarks/simt_shapes_dev.py time --group skinny|big|nk|control [--json PATH]
    python benchmarks/simt_shapes_dev.py old --old-kernels DIR [--json PATH]
    python benchmarks/simt_shapes_dev.py sanitize
    python benchmarks/simt_shapes_dev.py s9 --group s9|s9ctl [--json PATH]

``s9`` (session 9) times issue 17's fp32 misses and controls with the tiles of S9_TILES added
(3-warp-row tiles for 2053 x 3001's two exact waves, 64 x 128 x 16 s5 for 3 CTAs per SM), split
variants with the spread ending (a cooperative launch) and, as `old`, the tile's-last-CTA
ending; each also with bench_gemm's Timer (back-to-back calls on one input set: warm L2, as
results/gemm-*.json are taken).
``old`` times the split variants of 128 x 4096 x 4096 with the kernel sources in DIR (an
earlier gemm_simt.cu / gemm_common.cu), for a same-run comparison of the split-K ending.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import torch  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
gl = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
simt_model = importlib.import_module("gpurt.kernels._gemm_simt_model")

GROUPS = {
    "skinny": [(128, 4096, 4096), (64, 4096, 4096), (32, 11008, 4096), (128, 14336, 4096),
               (16, 4096, 4096)],
    "nk": [(128, 4096, 4096), (32, 11008, 4096)],  # B given N x K (x @ W.T)
    "big": [(1000, 1000, 1000), (1024, 1024, 1024), (3000, 5000, 2000), (4099, 4099, 4099),
            (2048, 2048, 2048)],
    # the grid of 128 x 4096 x 4096 split 8 (1 and 2 CTAs per SM) without a split
    "control": [(1024, 4096, 512), (2048, 4096, 512)],
    "s9": [(128, 4096, 4096), (64, 4096, 4096), (2053, 3001, 1999), (1000, 1000, 1000)],
    "s9ctl": [(1024, 1024, 1024), (16, 4096, 4096), (32, 11008, 4096), (3000, 5000, 2000),
              (128, 14336, 4096), (2048, 2048, 2048)],
    # the shapes whose choice the session-9 model changed, beside their old one (S9_OLD)
    "s9chk": [(1000, 1000, 1000), (2053, 3001, 1999), (127, 257, 61), (512, 512, 512),
              (300, 700, 5000), (1, 4096, 4096), (8, 4096, 4096), (8, 64, 65536),
              (4099, 4099, 4099)],
}
# the choices before session 9's model, and neighbours of its picks at 1000^3 and 2053 x 3001
S9_OLD = {(127, 257, 61): "64x64x8 s4", (512, 512, 512): "64x128x8 s4 split4",
          (300, 700, 5000): "64x128x8 s4 split13", (1, 4096, 4096): "32x256 split16",
          (8, 4096, 4096): "32x256 split16", (8, 64, 65536): "64x64x8 s4 split32",
          (4099, 4099, 4099): "128x128x16 s3"}
Config = tune.Config
S9_TILES = (Config("simt", 64, 128, 16, stages=5), Config("simt", 64, 128, 16, stages=4),
            Config("simt", 96, 128, 16, stages=3), Config("simt", 96, 128, 8, stages=4),
            Config("simt", 96, 128, 16, 32, 128, stages=3),
            Config("simt", 96, 256, 16, 32, 128, stages=3),
            Config("simt", 192, 128, 16, 32, 128, stages=3), Config("simt", 32, 128, 8, stages=4),
            Config("simt", 64, 64, 16, stages=4), Config("simt", 128, 128, 8, stages=4))
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
REPEAT = 7


def problem(m: int, n: int, k: int, b_kmajor: bool = False) -> Any:
    vec = n % 4 == 0 and k % 4 == 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return tune.Problem(m, n, k, tune.DT_F32, True, b_kmajor, vec, vec, (9, 0), sms)


def splits_for(p: Any, config: Any, group: str) -> list[int]:
    """The K splits worth timing: no empty slice, slices of 4 K tiles at least, at most two
    waves of CTAs; big shapes 1..4 only; always none and the model's choice."""
    k_tiles = -(-p.k // config.bk)
    slots = p.sm_count * simt_model.resident_ctas(p, config)
    found = {1, simt_model.split_for(p, config)}
    for split in SPLITS:
        if group in ("big", "control") and split > 4:
            continue
        if group == "nk" and split not in (1, 8, 12, 16):
            continue
        even = -(-k_tiles // -(-k_tiles // split)) == split
        if even and k_tiles // split >= 4 and config.tiles(p.m, p.n) * split <= 2 * slots:
            found.add(split)
    return sorted(found)


def variants(group: str, p: Any) -> list[Any]:
    if group == "control":
        bases = [tune._SIMT[0], tune._SIMT[1]]
    elif group == "big":
        bases = [c for c in tune._SIMT if c.bm >= 64]
    else:
        bases = list(tune._SIMT)
    found = [dataclasses.replace(c, split_k=s) for c in bases for s in splits_for(p, c, group)]
    if group == "skinny" and (p.m, p.n, p.k) == (128, 4096, 4096):
        found.append(dataclasses.replace(tune._SIMT[2], split_k=17))  # main's tuned choice
    return found


def precompile() -> None:
    """Every program the timing, the tests and the sanitizer run need, in parallel."""
    todo: dict[Any, None] = {}
    layouts = list(itertools.product((True, False), repeat=2))
    for base, split, (a_k, b_k), vec in itertools.product(tune._SIMT, (1, 2), layouts,
                                                          (True, False)):
        config = dataclasses.replace(base, split_k=split)
        p = tune.Problem(256, 256, 256, tune.DT_F32, a_k, b_k, vec, vec, (9, 0), 132)
        todo[gl.program(config, p)] = None
    for base, split, a_k, b_k, vec in itertools.product(S9_TILES, (1, 2), (True, False),
                                                        (True, False), (True, False)):
        if base.bm % 96 == 0 or (a_k and not b_k):  # 3 warp rows: tests/test_gemm_simt.py
            config = dataclasses.replace(base, split_k=split)
            p = tune.Problem(256, 256, 256, tune.DT_F32, a_k, b_k, vec, vec, (9, 0), 132)
            todo[gl.program(config, p)] = None
    for m, n, k in GROUPS["s9chk"]:  # the check run's variants, row-major
        p = problem(m, n, k)
        for config in s9_checks(p) + [tune.heuristic(p)]:
            todo[gl.program(config, p)] = None
    # test_mma_simt_split_k_fused's mma and TF32 programs
    mma, tf32 = tune._MMA[3], tune._TF32[1]
    for config, dt, (a_k, b_k) in [*[(mma, tune.DT_BF16, layout) for layout in layouts],
                                   (mma, tune.DT_F16, (True, False)),
                                   (tf32, tune.DT_TF32, (True, True))]:
        p = tune.Problem(256, 256, 256, dt, a_k, b_k, True, True, (9, 0), 132)
        todo[gl.program(dataclasses.replace(config, split_k=3), p)] = None
    print(f"compiling {len(todo)} programs", flush=True)
    gl.compile_programs(list(todo))


def reference(p: Any) -> Any:
    return p.a[0].double() @ p.b[0].double()


def rel_err(p: Any, ref: Any, config: Any) -> float:
    p.out.fill_(float("nan"))
    gm.gemm(p.ga[0], p.gb[0], out=p.gout, config=config)
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(p.out.double() - ref) / torch.linalg.norm(ref))
    return err if err == err else float("inf")


def time_group(group: str, json_path: str | None, rows: list[dict[str, Any]]) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    torch.backends.cuda.matmul.allow_tf32 = False
    for m, n, k in GROUPS[group]:
        nk = group == "nk"
        data = bench.Problem(gpurt, torch, m, n, k, torch.float32, nk, l2)
        p = problem(m, n, k, nk)
        ref = reference(data)
        shape = f"{m}x{n}x{k}" + (" nk" if nk else "")
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            cublas = bench.torch_graph_us(torch, data, REPEAT)
            cublas_call = bench.host_us(torch, lambda i, d=data: torch.matmul(
                d.a[i], d.b[i], out=d.out), data.sets, REPEAT)
        chosen = tune.heuristic(p)
        auto_us = bench.gpurt_graph_us(gpurt, gm.gemm, data, None, REPEAT, torch)
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            auto_call = bench.host_us(torch, lambda i, d=data: gm.gemm(
                d.ga[i], d.gb[i], out=d.gout, stream=stream), data.sets, REPEAT)
        row = {"shape": shape, "config": "auto " + chosen.label(), "us": round(auto_us, 2),
               "cublas_us": round(cublas, 2), "ratio": round(cublas / auto_us, 3),
               "call_us": round(auto_call, 2), "cublas_call_us": round(cublas_call, 2),
               "err": rel_err(data, ref, None)}
        _keep(row, rows, json_path)
        for config in variants(group, p):
            try:
                err = rel_err(data, ref, config)
                us = bench.gpurt_graph_us(gpurt, gm.gemm, data, config, REPEAT, torch)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{shape} {config.label()}: {exc!r}", flush=True)
                continue
            _keep({"shape": shape, "config": config.label(), "split": config.split_k,
                   "us": round(us, 2), "cublas_us": round(cublas, 2),
                   "ratio": round(cublas / us, 3), "err": float(f"{err:.3g}"),
                   "model": round(simt_model.grid_cost(p, config, config.split_k), 2)},
                  rows, json_path)
        del data, ref


def _keep(row: dict[str, Any], rows: list[dict[str, Any]], json_path: str | None) -> None:
    row["device"] = torch.cuda.get_device_name()
    rows.append(row)
    print(json.dumps(row), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def time_old(old: str, json_path: str | None) -> None:
    """128 x 4096 x 4096's split variants with the kernel sources of ``old``."""
    gl.text = lambda name: (Path(old) / name).read_text()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows: list[dict[str, Any]] = []
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    data = bench.Problem(gpurt, torch, 128, 4096, 4096, torch.float32, False, l2)
    ref = reference(data)
    cublas = bench.torch_graph_us(torch, data, REPEAT)
    for base, split in ((tune._SIMT[0], 8), (tune._SIMT[1], 8), (tune._SIMT[2], 17),
                        (tune._SIMT[0], 16)):
        config = dataclasses.replace(base, split_k=split)
        err = rel_err(data, ref, config)
        us = bench.gpurt_graph_us(gpurt, gm.gemm, data, config, REPEAT, torch)
        _keep({"shape": "128x4096x4096 OLD", "config": config.label(), "split": split,
               "us": round(us, 2), "cublas_us": round(cublas, 2),
               "ratio": round(cublas / us, 3), "err": float(f"{err:.3g}")}, rows, json_path)


def s9_variants(p: Any) -> list[Any]:
    """Every simt tile (S9_TILES too) unsplit and at the model's split; the skinny shapes
    also at splits 2, 4, 8, 16 that leave no slice empty and fit one wave of CTAs."""
    found: dict[Any, None] = {}
    slots = p.sm_count
    for base in (*tune._SIMT, *S9_TILES):
        if base.bm > 2 * p.m and base.bm > 32:
            continue
        splits = {1, simt_model.split_for(p, base)}
        if p.m <= 128:
            k_tiles = -(-p.k // base.bk)
            for split in (2, 4, 8, 16):
                even = -(-k_tiles // -(-k_tiles // split)) == split
                fits = base.tiles(p.m, p.n) * split <= slots * simt_model.resident_ctas(p, base)
                if even and fits:
                    splits.add(split)
        for split in sorted(splits):
            found[dataclasses.replace(base, split_k=split)] = None
    return list(found)


def s9_checks(p: Any) -> list[Any]:
    """For s9chk: the old choice (S9_OLD) and, at 1000^3 and 2053 x 3001, the new pick's
    neighbours (stages, K depth, group order)."""
    old = {"64x64x8 s4": tune._SIMT[6], "64x128x8 s4": tune._SIMT[3],
           "32x256": tune._SIMT[5], "128x128x16 s3": tune._SIMT[2]}
    found = []
    text = S9_OLD.get((p.m, p.n, p.k))
    if text:
        base = next(c for key, c in old.items() if text.startswith(key))
        split = int(text.split("split")[1]) if "split" in text else 1
        found.append(dataclasses.replace(base, split_k=split))
    wide = tune._SIMT[0]
    if (p.m, p.n, p.k) == (1000, 1000, 1000):
        found += [dataclasses.replace(wide, split_k=4, stages=4),
                  dataclasses.replace(wide, split_k=4, bk=8, stages=4),
                  dataclasses.replace(wide, split_k=4, group_m=4),
                  dataclasses.replace(tune._SIMT[1], split_k=4, stages=4),
                  dataclasses.replace(tune._SIMT[4], split_k=4, stages=4)]
    if (p.m, p.n, p.k) == (2053, 3001, 1999):
        narrow = tune._SIMT[8]
        found += [dataclasses.replace(narrow, stages=5), dataclasses.replace(narrow, stages=6),
                  dataclasses.replace(narrow, bk=16, stages=4),
                  dataclasses.replace(narrow, group_m=16)]
    return found


def time_s9(group: str, json_path: str | None, rows: list[dict[str, Any]]) -> None:
    """Issue 17's fp32 misses: each variant kernel-only (graph replay, rotating inputs) and
    with bench_gemm's Timer (back-to-back, warm L2); split variants spread and not."""
    from bench_gemm import Timer
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    timer = Timer(gpurt, stream)
    torch.backends.cuda.matmul.allow_tf32 = False
    for m, n, k in GROUPS[group]:
        data = bench.Problem(gpurt, torch, m, n, k, torch.float32, False, l2)
        p = problem(m, n, k)
        ref = reference(data)
        shape = f"{m}x{n}x{k}"
        batch = max(1, min(20, int(4e11 / (2.0 * m * n * k))))

        def warm(config: Any, d: Any = data, batch: int = batch) -> float:
            return timer.ms(lambda: gm.gemm(d.ga[0], d.gb[0], out=d.gout, stream=stream,
                                            config=config), batch, REPEAT) * 1e3
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            cublas = bench.torch_graph_us(torch, data, REPEAT)
            cublas_warm = timer.ms(lambda d=data: torch.matmul(d.a[0], d.b[0], out=d.out),
                                   batch, REPEAT) * 1e3
            configs = [None] + (s9_checks(p) if group == "s9chk" else s9_variants(p))
            for config in configs:
                both = config is not None and config.split_k in (8, simt_model.split_for(p, config))
                for spread in ((True, False) if both and config.split_k > 1 else (True,)):
                    gl.SPREAD_SPLIT_K = spread
                    gm.clear_plans()
                    try:
                        err = rel_err(data, ref, config)
                        us = bench.gpurt_graph_us(gpurt, gm.gemm, data, config, REPEAT, torch)
                        us_warm = warm(config)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        print(f"{shape} {config}: {exc!r}", flush=True)
                        continue
                    label = ("auto " + tune.heuristic(p).label() if config is None
                             else config.label() + ("" if spread else " last"))
                    _keep({"shape": shape, "config": label, "us": round(us, 2),
                           "cublas_us": round(cublas, 2), "ratio": round(cublas / us, 3),
                           "warm_us": round(us_warm, 2), "cublas_warm_us": round(cublas_warm, 2),
                           "warm_ratio": round(cublas_warm / us_warm, 3),
                           "err": float(f"{err:.3g}"),
                           "model": round(simt_model.grid_cost(p, config or tune.heuristic(p),
                                                          (config or tune.heuristic(p)).split_k),
                                          2)}, rows, json_path)
            gl.SPREAD_SPLIT_K = True
            gm.clear_plans()
            again = timer.ms(lambda d=data: torch.matmul(d.a[0], d.b[0], out=d.out), batch,
                             REPEAT) * 1e3
            print(f"{shape} cuBLAS warm {cublas_warm:.2f} then {again:.2f} us", flush=True)
        del data, ref


def sanitize() -> None:
    """A few split-K calls of the simt tiles (the new ending) for compute-sanitizer."""
    cases = [(tune._SIMT[0], 3, 131, 300, 400, False, False),
             (tune._SIMT[5], 5, 69, 259, 517, True, True),
             (tune._SIMT[2], 4, 136, 264, 600, False, True),
             (tune._SIMT[3], 4, 70, 200, 400, True, False),
             (S9_TILES[2], 3, 200, 130, 520, True, True),
             (S9_TILES[4], 1, 101, 131, 77, False, True),
             (S9_TILES[6], 2, 197, 261, 300, True, False),
             (S9_TILES[0], 1, 70, 200, 203, False, False)]
    for (base, split, m, n, k, ta, tb), spread in itertools.product(cases, (True, False)):
        gl.SPREAD_SPLIT_K = spread
        gm.clear_plans()
        a = torch.randn((k, m) if ta else (m, k), device="cuda")
        b = torch.randn((n, k) if tb else (k, n), device="cuda")
        c = torch.randn(m, n, device="cuda")
        out = torch.full((m, n), float("nan"), device="cuda")
        config = dataclasses.replace(base, split_k=split)
        gm.gemm(a, b, out=out, trans_a=ta, trans_b=tb, alpha=0.5, beta=-1.5, c=c, config=config)
        ref = 0.5 * ((a.double().T if ta else a.double()) @ (b.double().T if tb else b.double()))
        ref -= 1.5 * c.double()
        err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
        print(("PASS" if err < 1e-5 else "FAIL"), config.label(), m, n, k, ta, tb, spread,
              f"{err:.2e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["precompile", "time", "old", "sanitize", "s9"])
    parser.add_argument("--group", default="skinny")
    parser.add_argument("--old-kernels", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.mode == "precompile":
        precompile()
    elif args.mode == "sanitize":
        sanitize()
    elif args.mode == "old":
        time_old(args.old_kernels, args.json)
    elif args.mode == "s9":
        rows9: list[dict[str, Any]] = []
        for group in args.group.split(","):
            time_s9(group, args.json, rows9)
    else:
        rows: list[dict[str, Any]] = []
        for group in args.group.split(","):
            time_group(group, args.json, rows)
        print(f"\n{torch.cuda.get_device_name()}: us kernel-only (graph replay)")
        for row in rows:
            print(f"{row['shape']:22s} {row['config']:44s} {row['us']:9.2f} "
                  f"{row['cublas_us']:9.2f} {row['ratio']:6.3f}")


if __name__ == "__main__":
    main()
