"""Development harness for the packed route (kernels/_gemm_pack.py, issue 17): GEMMs whose
rows TMA cannot read (4099-wide 16-bit rows are 8198 bytes) copied into 128-byte rows first.

``time``: per shape and dtype, kernel-only (20 calls in a CUDA graph, replayed; rotating
input sets, bench_gemm_decode's harness) for cuBLAS (torch.matmul), gemm's own choice, the
mma path it had before (GPURT_GEMM_DISABLE=pack) and the packed route forced; the copy
launch alone against a device-to-device copy of the same bytes; single calls with the host
path (gemm's choice against torch); the cost model's estimates; the error against float64.
``sanitize``: a few packed calls for compute-sanitizer (every layout, offset views, beta,
split-K and decode kernels behind the copies, TF32, the automatic route).

    python benchmarks/padrows_dev.py time [--json PATH] [--quick] | sanitize | precompile
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402

import gpurt  # noqa: E402

gm = importlib.import_module("gpurt.kernels.gemm")
pack = importlib.import_module("gpurt.kernels._gemm_pack")
tune = importlib.import_module("gpurt.kernels._gemm_tune")

CASES = [("bf16", (4099, 4099, 4099)), ("fp16", (4099, 4099, 4099)), ("tf32", (4099, 4099, 4099)),
         ("bf16", (4096, 4099, 4096)), ("bf16", (4096, 4096, 4099)), ("bf16", (2053, 3001, 1999)),
         ("bf16", (128, 4099, 4099)), ("bf16", (16, 4099, 4099)), ("bf16", (1, 4099, 4099)),
         ("tf32", (2053, 3001, 1999)), ("tf32", (4096, 4099, 4096)), ("tf32", (128, 4099, 4099)),
         ("fp16", (2053, 3001, 1999)), ("bf16", (512, 4099, 4099)), ("bf16", (4099, 4096, 4096))]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}


@functools.cache
def _real_pays() -> Any:
    return pack.pays


def _route(mode: str) -> None:
    """'auto': the cost model; 'off': GPURT_GEMM_DISABLE=pack; 'on': always pack."""
    os.environ.pop("GPURT_GEMM_DISABLE", None)
    pack.pays = _real_pays()
    if mode == "off":
        os.environ["GPURT_GEMM_DISABLE"] = "pack"
    elif mode == "on":
        pack.pays = lambda *args: True
    gm.clear_plans()


def _planned(p: Any, tf32: bool, stream: Any) -> Any:
    gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream, allow_tf32=tf32)
    stream.synchronize()
    (found,) = [entry[0] for entry in gm._calls.values()]
    return found


def _copy_us(call: Any, p: Any, stream: Any) -> tuple[float, float, float]:
    """(the copy launch alone, kernel-only us; a device-to-device copy of the same bytes; the
    same copies by cuMemcpy2DAsync)."""
    itemsize = p.a[0].element_size()
    room = gpurt.empty(call.scratch // 4 + 32, dtype=np.float32, stream=stream)
    start = -(-room.ptr // 128) * 128
    args, _, _ = call.arguments(p.ga[0].ptr, p.gb[0].ptr, start)
    moved = sum(c.width * c.rows * itemsize for c in call.copies)
    src = torch.empty(moved, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    graph, graph2d = gpurt.CUDAGraph(), gpurt.CUDAGraph()
    with gpurt.graph(graph, stream=stream):
        for _ in range(bench.CALLS):
            call.kernel(call.grid, 256, args, stream=stream)
    with gpurt.graph(graph2d, stream=stream):  # the driver's 2-D copies, as s7-splitrow did
        for _ in range(bench.CALLS):
            for copy, src_ptr in zip(call.copies, (args[0], args[6])):
                params = cu.CUDA_MEMCPY2D()
                params.srcMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
                params.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
                params.srcDevice, params.dstDevice = src_ptr, start + copy.offset
                params.srcPitch, params.dstPitch = copy.src_ld * itemsize, copy.pitch * itemsize
                params.WidthInBytes, params.Height = copy.width * itemsize, copy.rows
                gpurt.check(cu.cuMemcpy2DAsync(params, cu.CUstream(stream.cuda_stream)),
                            "cuMemcpy2DAsync")
    with gpurt.stream(stream), torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        graph.replay()
        ours = bench._events_ms(torch, graph.replay, 10) * 1e3 / bench.CALLS
        graph2d.replay()
        two_d = bench._events_ms(torch, graph2d.replay, 10) * 1e3 / bench.CALLS
        memcpy = bench._events_ms(torch, lambda: dst.copy_(src), 10) * 1e3
    graph.reset()
    graph2d.reset()
    return round(ours, 2), round(memcpy, 2), round(two_d, 2)


def _row(name: str, m: int, n: int, k: int, stream: Any, l2: int, quick: bool) -> dict[str, Any]:
    tf32 = name == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    p = bench.Problem(gpurt, torch, m, n, k, DTYPES[name], False, l2)
    gemm = functools.partial(gm.gemm, allow_tf32=tf32)
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "dtype": name}
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        row["cublas_us"] = round(bench.torch_graph_us(torch, p, 10), 2)
        for mode in ("auto", "off", "on"):
            _route(mode)
            try:
                call = _planned(p, tf32, stream)
                row[f"{mode}_config"] = gm._label(call)
                if mode != "auto" and row[f"{mode}_config"] == row.get("auto_config"):
                    row[f"{mode}_us"] = row.get("auto_us")  # the same route: not again
                    continue
                row[f"{mode}_us"] = round(bench.gpurt_graph_us(gpurt, gemm, p, None, 10,
                                                               torch), 2)
                if mode == "auto":  # set 0 into a poisoned output, against float64
                    p.out.fill_(float("nan"))
                    gm.gemm(p.ga[0], p.gb[0], out=p.gout, stream=stream, allow_tf32=tf32)
                    stream.synchronize()
                    row["rel_err"] = float(f"{p.rel_error(torch):.3g}")
                    row["auto_call_us"] = round(bench.host_us(
                        torch, lambda i: gm.gemm(p.ga[i], p.gb[i], out=p.gout, stream=stream,
                                                 allow_tf32=tf32), p.sets, 15), 2)
                    row["cublas_call_us"] = round(bench.host_us(
                        torch, lambda i: torch.matmul(p.a[i], p.b[i], out=p.out), p.sets,
                        15), 2)
                if isinstance(call, pack.PackedCall) and "copy_us" not in row and not quick:
                    row["copy_us"], row["memcpy_us"], row["memcpy2d_us"] = _copy_us(call, p,
                                                                                     stream)
                    row["copy_model_us"] = round(pack.copy_us(call.copies,
                                                              p.a[0].element_size()), 1)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{row['shape']} {name} {mode}: {exc!r}", flush=True)
    _route("auto")
    for mode in ("auto", "off", "on"):
        if row.get(f"{mode}_us"):
            row[f"{mode}_x"] = round(row["cublas_us"] / row[f"{mode}_us"], 3)
    row["flops_auto_T"] = round(2 * m * n * k / row.get("auto_us", 1e30) / 1e6, 1)
    return row


def run_timing(json_path: str | None, quick: bool, only: str | None) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    rows = [{"device": torch.cuda.get_device_name(0),
             "copy_GBps": round(bench.copy_bandwidth(torch) / 1e9, 1)}]
    print(json.dumps(rows[0]), flush=True)
    print(f"{rows[0]['device']}: kernel-only us (x = cuBLAS / gpurt), copy {rows[0]['copy_GBps']}"
          " GB/s", flush=True)
    for name, (m, n, k) in CASES:
        if only and name not in only.split(","):
            continue
        rows.append(_row(name, m, n, k, stream, l2, quick))
        print(json.dumps(rows[-1]), flush=True)
        print(_summary(rows[-1]), flush=True)
        if json_path:
            Path(json_path).write_text(json.dumps(rows, indent=1))


def _summary(row: dict[str, Any]) -> str:
    """One line of a row: kernel-only us (x = cuBLAS / gpurt) per route, copy, host calls."""
    def route(mode: str) -> str:
        return f"{row.get(mode + '_us', '-')} ({row.get(mode + '_x', '-')})"

    return (f"{row['shape']:>15} {row['dtype']:>4} cuBLAS {row['cublas_us']} | auto "
            f"{route('auto')} {row.get('auto_config')} | off {route('off')} | on {route('on')}"
            f" | copy {row.get('copy_us', '-')} memcpy {row.get('memcpy_us', '-')} 2d "
            f"{row.get('memcpy2d_us', '-')} model "
            f"{row.get('copy_model_us', '-')} | call {row.get('auto_call_us', '-')} vs "
            f"{row.get('cublas_call_us', '-')} | err {row.get('rel_err', '-')}")


# ---- sanitizer cases ---------------------------------------------------------------------------

def _case(rng: Any, m: int, n: int, k: int, dtype: Any, trans_a: bool, trans_b: bool,
          config: Any = None, offset: int = 0, beta: float = 0.0, tf32: bool = False) -> None:
    def operand(rows: int, cols: int) -> tuple[Any, Any]:
        host = rng.standard_normal((rows, cols + offset)).astype(np.float32).astype(dtype)
        return host[:, offset:], gpurt.asarray(host)[:, offset:]

    a, da = operand(k if trans_a else m, m if trans_a else k)
    b, db = operand(n if trans_b else k, k if trans_b else n)
    c = rng.standard_normal((m, n)).astype(np.float32).astype(dtype)
    for _ in range(2):
        out = gpurt.asarray(c) if beta else gpurt.full((m, n), np.nan, dtype=dtype)
        gm.gemm(da, db, out=out, beta=beta, trans_a=trans_a, trans_b=trans_b, config=config,
                allow_tf32=tf32)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        want = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64) + beta * c
        got = out.numpy().astype(np.float64)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        ok = np.isfinite(got).all() and err < 1e-2
        print(f"{'PASS' if ok else 'FAIL'} {m}x{n}x{k} {np.dtype(dtype).name} "
              f"{trans_a:d}{trans_b:d} {config.label() if config else 'auto'} err {err:.2e}",
              flush=True)


def run_sanitize() -> None:
    os.environ["GPURT_GEMM_AUTOTUNE"] = "0"
    rng = np.random.default_rng(7)
    bf16 = gpurt.bfloat16
    for trans_a, trans_b in ((False, False), (True, False), (False, True), (True, True)):
        _case(rng, 133, 261, 203, bf16, trans_a, trans_b, tune._WGMMA[5])
    _case(rng, 130, 99, 77, np.float16, False, False, tune._WGMMA[0], offset=1, beta=0.5)
    _case(rng, 136, 264, 1027, bf16, False, True, dataclasses.replace(tune._WGMMA[1],
                                                                       split_k=3))
    _case(rng, 70, 300, 99, np.float32, False, False, tune._WGMMA_TF32[0], offset=1,
          beta=-1.0, tf32=True)
    aligned = gm.gemm_eligible_configs(gpurt.empty((64, 1024), dtype=bf16),
                                       gpurt.empty((1024, 2048), dtype=bf16))
    _case(rng, 64, 2051, 1027, bf16, False, False,
          next(c for c in aligned if c.kernel == "decode"))
    _case(rng, 1031, 1029, 1027, bf16, False, False)  # the route chosen by the model
    gpurt.synchronize()
    print("sanitize cases done", flush=True)


def run_precompile() -> None:
    """The wgmma, TF32 wgmma and copy kernels into the disk cache, over 16 processes."""
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    todo = [p for p in launch.programs("sm_90a")
            if p[0] in ("gemm_wgmma.cu", "gemm_wgmma_tf32.cu", pack.SOURCE)]
    print(f"precompiled {launch.compile_programs(todo, 16)} programs", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("time", "sanitize", "precompile"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="no copy-alone timings")
    parser.add_argument("--only", default=None, help="comma list of bf16, fp16, tf32")
    args = parser.parse_args()
    if args.mode == "time":
        run_timing(args.json, args.quick, args.only)
    elif args.mode == "precompile":
        run_precompile()
    else:
        run_sanitize()


if __name__ == "__main__":
    main()
