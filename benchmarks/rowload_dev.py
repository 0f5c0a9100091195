"""Development harness for issue 17's row-streaming kernel (kernels/gemm_rowload.cu, helper
``s9-rowload``, session 9): a few rows of A times an N-major B whose rows are not 16-byte
multiples, streamed with aligned loads.

``check``: forced rowload configs (every candidate) and gemm's own choice against float64 on
NaN-poisoned outputs: odd/prime sizes, offset views, both A layouts (and a K-major B through
the other paths), beta with C in, fp16 and bf16 (padrows_dev's cases).
``time``: per shape, kernel-only (20 calls in a CUDA graph, replayed; rotating input sets past
L2) for cuBLAS (torch.matmul), gemm's choice, every rowload candidate, the path before
(GPURT_GEMM_DISABLE=rowload) and the packed route forced (copies + a TMA kernel); one call
with the host path for gemm and torch.
``sanitize``: a few rowload calls (split and not, offsets, beta, both A layouts).
``precompile``: the programs ``time`` and ``check`` need, over 16 processes.

    python benchmarks/rowload_dev.py check|time|sanitize|precompile [--json PATH] [--budget S]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import numpy as np  # noqa: E402
import padrows_dev as base  # noqa: E402
import torch  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
launch = importlib.import_module("gpurt.kernels._gemm_launch")
rowload = importlib.import_module("gpurt.kernels._gemm_rowload")

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# (dtype, m, n, k, nk): B = K x N, or nk: B = W^T with W N x K (x @ W.T); 4099 rows are 8198
# bytes (2-byte aligned), 4096 aligned
SHAPES = ([("bf16", m, 4099, 4099, False) for m in (1, 2, 4, 8, 16, 32)]
          + [("fp16", m, 4099, 4099, False) for m in (1, 16)]
          + [("bf16", m, 4099, 4099, True) for m in (1, 2)]
          + [("bf16", 1, 11003, 4093, True), ("bf16", 1, 4093, 11003, True),
             ("bf16", 1, 4099, 4096, False), ("bf16", 16, 4099, 4096, False),
             ("bf16", 1, 4096, 4099, False), ("bf16", 2, 4096, 4099, False),
             ("bf16", 16, 4096, 4099, False),
             ("bf16", 1, 11003, 4093, False), ("bf16", 8, 11003, 4093, False),
             ("bf16", 4, 4093, 11003, False), ("bf16", 16, 14341, 4099, False),
             ("bf16", 1, 2053, 1999, False), ("bf16", 16, 2053, 1999, False),
             ("bf16", 64, 4099, 4099, False), ("bf16", 1, 4096, 4096, False),
             ("bf16", 16, 4096, 4096, False), ("bf16", 1, 4096, 4096, True)])


def _problem(plan_args: tuple[Any, Any], dt: Any) -> Any:
    plan = gm._plan(plan_args[0], plan_args[1], None, 0.0, None, False, False,
                    gpurt.as_stream(None, 0))[0]
    return gm._problem(plan, False)


def _split_b(n: int, k: int, dtype: Any, nk: bool) -> Any:
    """A K x N operand on split rows: N-major, or K-major (W = B^T stored N x K)."""
    if nk:
        return gpurt.empty((n, k + 1), dtype=dtype)[:, :k].T
    return gpurt.empty((k, n + 1), dtype=dtype)[:, :n]


def _rowload_configs(m: int, n: int, k: int, dtype: Any, nk: bool = False) -> list[Any]:
    a = gpurt.empty((m, k), dtype=dtype)
    problem = _problem((a, _split_b(n, k, dtype, nk)), dtype)
    return [tune._rowload_config(t) for t in rowload.candidates(problem)]


# ---- correctness --------------------------------------------------------------------------------

CHECKS = [(1, 4099, 4099), (2, 1031, 2053), (3, 257, 61), (5, 999, 1001), (8, 4099, 300),
          (13, 3001, 777), (16, 4099, 1000), (17, 515, 300), (1, 9, 17), (7, 600, 1),
          (4, 1000, 9), (31, 250, 129)]
NK_CHECKS = [(1, 4099, 4099), (2, 1031, 2053), (1, 257, 61), (2, 999, 1001), (1, 9, 17),
             (2, 600, 1), (1, 64, 497)]


def run_check() -> None:
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    rng = np.random.default_rng(17)
    for i, (m, n, k) in enumerate(CHECKS):
        dtype = gpurt.bfloat16 if i % 2 == 0 else np.float16
        offset, beta = i % 4, (0.5 if i % 3 == 1 else 0.0)
        for config in _rowload_configs(m, n, k, dtype):
            for split in sorted({1, config.split_k, 3}):
                forced = tune.Config("rowload", config.bm, config.bn, config.bk, split_k=split)
                base._case(rng, m, n, k, dtype, i % 2 == 1, False, forced, offset, beta)
    for i, (m, n, k) in enumerate(NK_CHECKS):  # B K-major
        dtype = gpurt.bfloat16 if i % 2 == 0 else np.float16
        offset, beta = i % 4, (0.5 if i % 3 == 1 else 0.0)
        for config in _rowload_configs(m, n, k, dtype, True):
            for split in sorted({1, config.split_k, 3}):
                forced = dataclasses.replace(config, split_k=split)
                base._case(rng, m, n, k, dtype, i % 2 == 1, True, forced, offset, beta)
    print("forced configs done", flush=True)
    for i, (m, n, k) in enumerate(CHECKS):  # gemm's own choice (rowload where B is N-major)
        dtype = gpurt.bfloat16 if i % 2 == 0 else np.float16
        offset, beta = i % 4, (0.5 if i % 3 == 1 else 0.0)
        for trans_a in (False, True):
            for trans_b in (False, True):
                base._case(rng, m, n, k, dtype, trans_a, trans_b, None, offset, beta)
    gpurt.synchronize()
    print("check done", flush=True)


def run_sanitize() -> None:
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    rng = np.random.default_rng(5)
    for m, n, k, trans_a, offset, beta in ((1, 1031, 777, False, 1, 0.0),
                                           (3, 600, 515, True, 3, 0.5),
                                           (16, 520, 300, False, 0, -1.0),
                                           (9, 257, 1030, True, 5, 0.0)):
        for config in _rowload_configs(m, n, k, gpurt.bfloat16)[:2]:
            for split in sorted({1, config.split_k}):
                forced = tune.Config("rowload", config.bm, config.bn, config.bk, split_k=split)
                base._case(rng, m, n, k, gpurt.bfloat16, trans_a, False, forced, offset, beta)
    for m, n, k, trans_a, offset, beta in ((1, 130, 1001, False, 1, 0.0),
                                           (2, 70, 777, True, 3, 0.5)):  # B K-major
        for config in _rowload_configs(m, n, k, gpurt.bfloat16, True):
            for split in sorted({1, config.split_k}):
                forced = dataclasses.replace(config, split_k=split)
                base._case(rng, m, n, k, gpurt.bfloat16, trans_a, True, forced, offset, beta)
    gpurt.synchronize()
    print("sanitize cases done", flush=True)


# ---- timing -------------------------------------------------------------------------------------


def _with_disabled(value: str, fn: Any) -> Any:
    old = os.environ.get("GPURT_GEMM_DISABLE")
    os.environ["GPURT_GEMM_DISABLE"] = value
    gm.clear_plans()
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["GPURT_GEMM_DISABLE"]
        else:
            os.environ["GPURT_GEMM_DISABLE"] = old
        gm.clear_plans()


def _row(name: str, m: int, n: int, k: int, nk: bool, stream: Any,
         l2: int) -> dict[str, Any]:
    p = bench.Problem(gpurt, torch, m, n, k, DTYPES[name], nk, l2)
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}" + (" nk" if nk else ""), "dtype": name}
    kernel_us = functools.partial(_kernel_us, p, False)
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        row["cublas_us"] = round(bench.torch_graph_us(torch, p, 10), 2)
        try:
            row["auto_config"] = _label(p, stream)
            row["auto_us"] = kernel_us()
            row["auto_err"] = _error(p, stream)
            row["auto_call_us"] = round(bench.host_us(
                torch, lambda i: gm.gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream), p.sets,
                15), 2)
            row["cublas_call_us"] = round(bench.host_us(
                torch, lambda i: torch.matmul(p.a[i], p.b[i], out=p.out), p.sets, 15), 2)
        except Exception as exc:  # noqa: BLE001 - report and go on
            row["auto_error"] = repr(exc)[:300]
        for label in ("before", "packed"):
            try:
                if label == "packed":
                    base._route("on")  # the copies and a TMA kernel, wherever they exist
                row[f"{label}_config"] = _with_disabled("rowload", lambda: _label(p, stream))
                row[f"{label}_us"] = _with_disabled("rowload", kernel_us)
            except Exception as exc:  # noqa: BLE001
                row[f"{label}_error"] = repr(exc)[:200]
            finally:
                base._route("auto")
        timed = {}
        configs = _rowload_configs(m, n, k, gpurt.bfloat16, nk)
        if configs:  # the first one's split halved and doubled (the same program)
            first = configs[0]
            configs += [dataclasses.replace(first, split_k=s) for s in
                        sorted({max(2, first.split_k // 2), 2 * first.split_k})
                        if s != first.split_k]
        for config in configs:
            try:
                timed[config.label()] = kernel_us(config)
            except Exception as exc:  # noqa: BLE001
                timed[config.label() + " ERROR " + repr(exc)[:120]] = float("inf")
        row["rowload"] = timed
    gm.clear_plans()
    for key in ("auto", "before", "packed"):
        if row.get(f"{key}_us"):
            row[f"{key}_x"] = round(row["cublas_us"] / row[f"{key}_us"], 3)
    row["floor_us"] = round(k * n * 2 / COPY_BPS[0] * 1e6, 2) if COPY_BPS else None
    return row


COPY_BPS: list[float] = []


def _kernel_us(p: Any, tf32: bool, config: Any = None) -> float:
    return round(bench.gpurt_graph_us(gpurt, gm.gemm, p, config, 10, torch), 2)


def _label(p: Any, stream: Any) -> str:
    gm.clear_plans()
    gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream)
    stream.synchronize()
    (call,) = [entry[0] for entry in gm._calls.values()]
    return str(gm._label(call))


def _error(p: Any, stream: Any) -> float:
    p.out.fill_(float("nan"))
    gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream)
    stream.synchronize()
    return float(f"{p.rel_error(torch):.3g}")


def run_timing(json_path: str | None, budget: float) -> None:
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    COPY_BPS.append(bench.copy_bandwidth(torch))
    rows: list[dict[str, Any]] = [{"device": torch.cuda.get_device_name(0),
                                   "copy_GBps": round(COPY_BPS[0] / 1e9, 1)}]
    print(json.dumps(rows[0]), flush=True)
    start = time.monotonic()
    for name, m, n, k, nk in SHAPES:
        if time.monotonic() - start > budget:
            print(f"budget spent: stopped before {m}x{n}x{k} {name}", flush=True)
            break
        rows.append(_row(name, m, n, k, nk, stream, l2))
        print(json.dumps(rows[-1]), flush=True)
        if json_path:
            Path(json_path).write_text(json.dumps(rows, indent=1))


def run_precompile() -> None:
    """Every program ``time`` and ``check`` compile, over 16 processes: the rowload
    candidates (split and not), the path before and the packed route's TMA kernel."""
    todo: dict[Any, None] = {("gemm_pack.cu", ("gemm_pack<unsigned short>",), "sm_90"): None}
    shapes = [s[:4] for s in SHAPES] + [(d, *s) for s in CHECKS + NK_CHECKS
                                        for d in ("bf16", "fp16")]
    for name, m, n, k in shapes:
        dtype = gpurt.bfloat16 if name == "bf16" else np.float16
        for a_k, b_k in ((True, False), (False, False), (True, True), (False, True)):
            a = gpurt.empty((m, k), dtype=dtype) if a_k else gpurt.empty((k, m), dtype=dtype).T
            b = _split_b(n, k, dtype, b_k)
            problem = _problem((a, b), dtype)
            configs = [tune._rowload_config(t) for t in rowload.candidates(problem)]
            configs += [dataclasses.replace(c, split_k=s) for c in configs for s in (1, 3)]
            configs.append(_with_disabled("rowload", functools.partial(tune.heuristic, problem)))
            configs.append(tune.heuristic(problem))
            for config in configs:
                if tune.eligible(problem, config):
                    todo[launch.program(config, problem)] = None
            plan = gm._plan(a, b, None, 0.0, None, False, False, gpurt.as_stream(None, 0))[0]
            route = gm._pack_route(plan, problem, False)
            if route is not None and a_k:
                todo[launch.program(tune.heuristic(route[1]), route[1])] = None
    print(f"precompiled {launch.compile_programs(list(todo), 16)} programs", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("check", "time", "sanitize", "precompile"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--budget", type=float, default=120.0)
    args = parser.parse_args()
    {"check": run_check, "sanitize": run_sanitize, "precompile": run_precompile}.get(
        args.mode, lambda: run_timing(args.json, args.budget))()


if __name__ == "__main__":
    main()
