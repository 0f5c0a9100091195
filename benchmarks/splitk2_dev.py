"""Session 8's second split-K check (issue 17, helper s8-splitk2): where wgmma split-K's ~18 us
that do not depend on the slice count go, and which tiles and slice counts reach cuBLAS.

    python benchmarks/splitk2_dev.py precompile | sanitize | ncucall
    python benchmarks/splitk2_dev.py probe --json PATH     (128x128x4096 bf16, split 4)
    python benchmarks/splitk2_dev.py sweep --json PATH     (issue 17's split shapes)

``probe`` times, kernel-only (CUDA-graph replay of bench_gemm_decode.CALLS calls over rotating
inputs, as splitk_dev.py), the split-K call with the workspace of this tree (one per capture)
and with a fresh zeroed one per captured call (main's: ``old``), lists each graph's node types,
and times the same CTAs' work without the split's ending (gemm_wgmma writing its slices and
stopping) and unsplit (one 128 x 128 tile of 16 K tiles; four of them). ``sweep`` times
wgmma 128 x 128 and 128 x 64 tiles at several slice counts, gemm's own choice and cuBLAS, in
both workspace modes. ``ncucall``: three launches for ncu (split 4, its ending disabled, the
unsplit 4 tiles of 16 K tiles).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import splitk_dev  # noqa: E402 - after the path

REPEAT = 20
SHAPES = ((128, 128, 4096), (256, 256, 8192), (128, 1024, 8192), (512, 512, 8192))
SPLITS_128 = (2, 4, 8, 16, 32)
SPLITS_64 = (2, 4, 8, 16, 32)


def _configs(tune: Any) -> list[Any]:
    """None (gemm's choice), then wgmma 128 x 128 and 128 x 64 at each slice count."""
    split = dataclasses.replace
    return ([None] + [split(tune._WGMMA[1], split_k=s) for s in SPLITS_128]
            + [split(tune._WGMMA[7], split_k=s) for s in SPLITS_64])


def _old_workspace(workspace: Any) -> None:
    """main's workspace while capturing: a fresh zeroed one per call."""
    workspace._take_capturing = lambda index, handle, p, c, s: workspace._fresh(
        index, handle, p, c, s)


def _node_census(graph: Any) -> dict[str, int]:
    from cuda.bindings import driver as cu

    from gpurt._graphs.nodes import ordered_nodes

    found: collections.Counter[str] = collections.Counter()
    for node in ordered_nodes(graph._live().graph):
        found[cu.cuGraphNodeGetType(node)[1].name.removeprefix("CU_GRAPH_NODE_TYPE_")] += 1
    return dict(found)


def _graph(gpurt: Any, torch: Any, p: Any, call: Any, stream: Any) -> tuple[float, dict[str, int]]:
    """(kernel-only us per call, node types of the graph) of bench's CALLS calls."""
    import bench_gemm_decode as bench

    for i in range(p.sets):
        call(i)
    stream.synchronize()
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        for i in range(bench.CALLS):
            call(i % p.sets)
    census = _node_census(graph)
    with gpurt.stream(stream):
        graph.replay()
        ms = bench._events_ms(torch, graph.replay, REPEAT)
    graph.reset()
    return ms * 1e3 / bench.CALLS, census


def _eager(torch: Any, call: Any, sets: int) -> float:
    """us per call of bench's CALLS eager calls in a row (the stream's kept workspace), device
    events around them, median of REPEAT: kernel-bound where the host path is shorter."""
    import bench_gemm_decode as bench

    def calls() -> None:
        for i in range(bench.CALLS):
            call(i % sets)
    calls()
    return bench._events_ms(torch, calls, REPEAT) * 1e3 / bench.CALLS


def _setup(m: int, n: int, k: int) -> tuple[Any, ...]:
    import bench_gemm_decode as bench
    import torch

    gpurt, gm, tune, launch = splitk_dev._modules()
    torch.manual_seed(m + n + k)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, False, l2)
    stream = gpurt.Stream()
    return gpurt, gm, tune, launch, torch, p, stream


def _gemm_call(gm: Any, p: Any, stream: Any, config: Any) -> Any:
    def call(i: int) -> Any:
        return gm.gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream, config=config)
    return call


def _no_ending_call(gpurt: Any, gm: Any, p: Any, stream: Any, config: Any) -> Any:
    """Launches of the unsplit kernel gemm_wgmma with the split call's grid and slices: each
    CTA writes its raw fp32 slice and takes no ticket (the split's ending disabled)."""
    import numpy as np

    launch = sys.modules["gpurt.kernels._gemm_launch"]
    unsplit = dataclasses.replace(config, split_k=1)
    calls = []
    for i in range(p.sets):
        plan = gm._plan(p.ga[i], p.gb[i], p.gout, 0.0, None, False, False, stream)[0]
        split_call = gm._plan_call(plan, False, config, stream)
        kernel = gm._plan_call(plan, False, unsplit, stream).kernels
        calls.append((dataclasses.replace(split_call, kernels=kernel), plan))
    partial = gpurt.empty(config.split_k * p.m * p.n, dtype=np.float32, stream=stream)

    def call(i: int) -> None:
        one, plan = calls[i]
        args, _ = launch._main_arguments(one, plan.a.ptr, plan.b.ptr, plan.out.ptr, 0,
                                         partial.ptr, 0, 1.0, 0.0)
        one.kernels[0](one.grid, config.threads, args[:-1], shared_mem=one.smem, stream=stream)
    call.partial = partial  # type: ignore[attr-defined]
    return call


def probe(json_path: str) -> None:
    """The split-4 call at 128x128x4096 bf16 taken apart (module docstring)."""
    import bench_gemm_decode as bench

    gpurt, gm, tune, launch, torch, p, stream = _setup(128, 128, 4096)
    workspace = sys.modules["gpurt.kernels._gemm_workspace"]
    new_take = workspace._take_capturing
    rows: list[dict[str, Any]] = []

    def add(what: str, us: float, census: dict[str, int] | None = None) -> None:
        rows.append({"what": what, "us": round(us, 2), "nodes": census})
        print(json.dumps(rows[-1]), flush=True)
        Path(json_path).write_text(json.dumps(rows, indent=1))

    torch_stream = torch.cuda.ExternalStream(stream.cuda_stream)
    with torch.cuda.stream(torch_stream):
        add("cuBLAS 128x128x4096", bench.torch_graph_us(torch, p, REPEAT))
        for s in (2, 4, 8):
            config = dataclasses.replace(tune._WGMMA[1], split_k=s)
            for mode in ("new", "old"):
                workspace._take_capturing = new_take
                if mode == "old":
                    _old_workspace(workspace)
                us, census = _graph(gpurt, torch, p, _gemm_call(gm, p, stream, config), stream)
                add(f"wgmma 128x128 split{s} workspace {mode}", us, census)
            workspace._take_capturing = new_take
            add(f"wgmma 128x128 split{s} eager, {bench.CALLS} calls back to back",
                _eager(torch, _gemm_call(gm, p, stream, config), p.sets))
            us, census = _graph(gpurt, torch, p, _no_ending_call(gpurt, gm, p, stream, config),
                                stream)
            add(f"wgmma 128x128 split{s} ending disabled (gemm_wgmma, slices only)", us, census)
    for m, k, what in ((128, 1024, "1 tile"), (512, 1024, "4 tiles")):
        gpurt, gm, tune, launch, torch, q, stream = _setup(m, 128, k)
        call = _gemm_call(gm, q, stream, tune._WGMMA[1])
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
            us, census = _graph(gpurt, torch, q, call, stream)
        add(f"wgmma 128x128 unsplit {m}x128x{k} ({what} of 16 K tiles)", us, census)


def sweep(json_path: str) -> None:
    """Every shape x config, both workspace modes (new first), cuBLAS, the error."""
    import bench_gemm_decode as bench

    rows: list[dict[str, Any]] = []
    for m, n, k in SHAPES:
        gpurt, gm, tune, launch, torch, p, stream = _setup(m, n, k)
        workspace = sys.modules["gpurt.kernels._gemm_workspace"]
        new_take = workspace._take_capturing
        torch_stream = torch.cuda.ExternalStream(stream.cuda_stream)
        with torch.cuda.stream(torch_stream):
            cublas = bench.torch_graph_us(torch, p, REPEAT)
            for config in _configs(tune):
                row: dict[str, Any] = {"shape": f"{m}x{n}x{k} bf16", "cublas_us": round(cublas, 2)}
                row["config"] = (gm.gemm_config(p.ga[0], p.gb[0]).label() + " (auto)"
                                 if config is None else config.label())
                try:
                    for mode in ("new", "old"):
                        workspace._take_capturing = new_take
                        if mode == "old":
                            _old_workspace(workspace)
                        us, _ = _graph(gpurt, torch, p, _gemm_call(gm, p, stream, config),
                                       stream)
                        row[f"{mode}_us"] = round(us, 2)
                    workspace._take_capturing = new_take
                    row["ratio_new"] = round(cublas / row["new_us"], 3)
                    p.out.fill_(float("nan"))
                    gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream, config=config)
                    torch_stream.synchronize()
                    row["rel_err"] = float(f"{p.rel_error(torch):.3g}")
                except Exception as exc:  # noqa: BLE001 - report and go on
                    workspace._take_capturing = new_take
                    row["error"] = repr(exc)[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
                Path(json_path).write_text(json.dumps(rows, indent=1))


def ncucall() -> None:
    """Two rounds of: split 4 at 128x128x4096, its ending disabled, the unsplit 4 tiles (ncu
    skips the first round: compiles and cold caches)."""
    gpurt, gm, tune, launch, torch, p, stream = _setup(128, 128, 4096)
    config = dataclasses.replace(tune._WGMMA[1], split_k=4)
    split, no_end = _gemm_call(gm, p, stream, config), _no_ending_call(gpurt, gm, p, stream, config)
    _, _, _, _, _, q, _ = _setup(512, 128, 1024)
    unsplit = _gemm_call(gm, q, stream, tune._WGMMA[1])
    for i in range(2):
        split(i)
        no_end(i)
        unsplit(i)
        stream.synchronize()
    print("ncucall done", flush=True)


def precompile() -> None:
    """The programs of probe, sweep, ncucall and sanitize, in parallel, into the cache."""
    _, _, tune, launch = splitk_dev._modules()
    jobs = set()
    for m, n, k in (*SHAPES, (512, 128, 1024), (128, 128, 1024)):
        problem = tune.Problem(m, n, k, tune.DT_BF16, True, False, True, True, (9, 0), 132)
        for config in _configs(tune) + [tune._WGMMA[1]]:
            jobs.add(launch.program(config or tune.heuristic(problem), problem))
    for config, dtype, m, n, k, trans_b in _sanitize_cases(tune):
        dt = tune.DT_F16 if dtype == "float16" else tune.DT_BF16
        vec = n % 8 == 0 and k % 8 == 0
        problem = tune.Problem(m, n, k, dt, True, trans_b, vec, vec, (9, 0), 132)
        jobs.add(launch.program(config, problem))
    print(f"precompiled {launch.compile_programs(sorted(jobs))} programs", flush=True)


def _sanitize_cases(tune: Any) -> list[tuple[Any, str, int, int, int, bool]]:
    """(config, dtype, M, N, K, B K-major) of the sanitizer's wgmma split-K calls."""
    split = dataclasses.replace
    return [(split(tune._WGMMA[1], split_k=3), "bfloat16", 200, 264, 1000, False),
            (split(tune._WGMMA[1], split_k=32), "bfloat16", 72, 136, 4104, False),
            (split(tune._WGMMA[7], split_k=4), "float16", 136, 200, 1032, True),
            (split(tune._WGMMA[7], split_k=17), "bfloat16", 130, 72, 2056, False),
            (split(tune._WGMMA[0], split_k=5), "float16", 136, 264, 1032, False),
            (split(tune._WGMMA[7], split_k=16), "bfloat16", 128, 128, 4096, False)]


def sanitize(cases: list[tuple[Any, str, int, int, int, bool, float]] | None = None) -> None:
    """Each split-K case (default: _sanitize_cases with beta -1.5; a case's last item is beta)
    against float64 with alpha and Cin (memcheck, racecheck), then the cases captured in one
    graph on one stream (one workspace for the capture) and replayed twice."""
    import numpy as np

    gpurt, gm, tune, _ = splitk_dev._modules()
    rng = np.random.default_rng(8)
    failed, checks = 0, 0
    graph_calls = []
    if cases is None:
        cases = [(*case, -1.5) for case in _sanitize_cases(tune)]
    for config, dtype, m, n, k, trans_b, beta in cases:
        dt = gpurt.bfloat16 if dtype == "bfloat16" else np.float16
        a = rng.standard_normal((m, k)).astype(dt)
        b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dt)
        c = rng.standard_normal((m, n)).astype(dt)
        b64 = b.astype(np.float64).T if trans_b else b.astype(np.float64)
        want = 0.5 * (a.astype(np.float64) @ b64) + beta * c.astype(np.float64)
        da, db, dc = gpurt.asarray(a), gpurt.asarray(b), gpurt.asarray(c)
        out = gpurt.asarray(np.full((m, n), np.nan, dt))
        try:
            gm.gemm(da, db, out=out, alpha=0.5, beta=beta, c=dc, config=config,
                    trans_b=trans_b)
            err = _err(out.to_numpy(), want)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"ERROR {config.label()}: {exc!r}", flush=True)
            err = float("inf")
        graph_calls.append((config, da, db, dc, out, want, trans_b, beta))
        ok = err < 5e-3
        failed, checks = failed + (not ok), checks + 1
        print(f"{'PASS' if ok else 'FAIL'} {config.label()} {m}x{n}x{k} err={err:.3g}", flush=True)
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        for config, da, db, dc, out, _, trans_b, beta in graph_calls:
            gm.gemm(da, db, out=out, alpha=0.5, beta=beta, c=dc, config=config, trans_b=trans_b)
    print(f"graph nodes: {_node_census(graph)}", flush=True)
    for _ in range(2):
        for *_, out, _, _, _ in graph_calls:
            out.fill_(float("nan"))
        graph.replay()
        gpurt.synchronize()
        for config, *_, out, want, _, _ in graph_calls:
            err = _err(out.to_numpy(), want)
            ok = err < 5e-3
            failed, checks = failed + (not ok), checks + 1
            print(f"{'PASS' if ok else 'FAIL'} graph {config.label()} err={err:.3g}", flush=True)
    print(f"{checks - failed}/{checks} passed")
    sys.exit(1 if failed else 0)


def _err(got: Any, want: Any) -> float:
    import numpy as np

    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("precompile", "sanitize", "ncucall", "probe", "sweep"))
    parser.add_argument("--json", default="splitk2.json")
    args = parser.parse_args()
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    if args.mode == "precompile":
        precompile()
    elif args.mode == "sanitize":
        sanitize()
    elif args.mode == "ncucall":
        ncucall()
    elif args.mode == "probe":
        probe(args.json)
    else:
        sweep(args.json)
