#!/usr/bin/env python3
"""Development harness for kernels/softmax.cu on a GPU machine, independent of gpurt's
runtime modules: compiles with cuda.bindings.nvrtc, launches with cuLaunchKernel on torch
tensors, checks variants against float64 and times alternatives for the target shapes next
to torch and a device-to-device copy. The product benchmark is bench_softmax.py; this one
is for choosing the tuning constants in kernels/_softmax_plan.py (see notes_softmax.md).

    python benchmarks/softmax_dev.py check [--kinds rows,cluster,split] [--out DIR]
    python benchmarks/softmax_dev.py sweep [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import device_ms  # noqa: E402


def _load_plan() -> Any:
    spec = importlib.util.spec_from_file_location("softmax_plan", ROOT / "kernels" / "_softmax_plan.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


plan = _load_plan()
Variant = plan.Variant
TORCH_DTYPES = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}
NP_DTYPES = {0: "float32", 1: "float16", 2: plan.ml_dtypes.bfloat16}


def ok(result: tuple) -> Any:
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err!r}")
    return result[1] if len(result) == 2 else result[1:]


# ---- compile and launch -------------------------------------------------------------------


class Kernels:
    """All requested name expressions compiled in one NVRTC program (cached in /tmp)."""

    def __init__(self, names: list[str], arch: str) -> None:
        source = plan.SOURCE_PATH.read_text()
        key = hashlib.sha256((source + arch + "\n".join(sorted(names))).encode()).hexdigest()[:16]
        cache = Path(f"/tmp/softmax_dev_{key}.json")
        if cache.exists():
            doc = json.loads(cache.read_text())
        else:
            doc = self._compile(source, sorted(set(names)), arch)
            cache.write_text(json.dumps(doc))
        self.resources = doc["resources"]
        self._image = np.frombuffer(bytes.fromhex(doc["cubin"]), dtype=np.uint8).copy()
        self.module = ok(cu.cuModuleLoadData(self._image.ctypes.data))
        self.functions = {n: ok(cu.cuModuleGetFunction(self.module, low.encode()))
                          for n, low in doc["lowered"].items()}

    @staticmethod
    def _compile(source: str, names: list[str], arch: str) -> dict:
        t0 = time.time()
        prog = ok(nvrtc.nvrtcCreateProgram(source.encode(), b"softmax.cu", 0, [], []))
        try:
            for n in names:
                ok(nvrtc.nvrtcAddNameExpression(prog, n.encode()))
            opts = [f"-arch={arch}".encode(), b"-std=c++17", b"--ptxas-options=-v"]
            res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            log = log.decode(errors="replace")
            if int(res[0]) != 0:
                raise RuntimeError("NVRTC failed:\n" + log[:4000])
            size = ok(nvrtc.nvrtcGetCUBINSize(prog))
            cubin = b" " * size
            ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
            lowered = {n: ok(nvrtc.nvrtcGetLoweredName(prog, n.encode())).decode() for n in names}
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        by_lowered = {v: k for k, v in lowered.items()}
        resources: dict[str, str] = {}
        current = None
        for line in log.splitlines():
            m = re.search(r"Compiling entry function '(\S+)'", line)
            if m:
                current = by_lowered.get(m.group(1))
            elif current and ("Used" in line or "stack frame" in line):
                resources[current] = (resources.get(current, "") + " " + line.split(":", 1)[-1].strip()).strip()
        print(f"compiled {len(names)} kernels in {time.time() - t0:.1f} s", flush=True)
        return {"cubin": cubin.hex(), "lowered": lowered, "resources": resources}


def resident_ctas(func: Any, threads: int, smem: int) -> int:
    per_sm = ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(func, threads, smem))
    return per_sm * torch.cuda.get_device_properties(0).multi_processor_count


def launcher(kernels: Kernels, variant: Any, a: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor, rows: int, cols: int, stream: int = 0,
             resident: int = 0) -> Callable[[], None]:
    """A closure that launches ``variant`` (both launches for split) with packed arguments;
    ``resident`` caps a stream variant's grid (default: what the device holds)."""
    if variant.kind != "split" and variant.capacity < cols:
        raise ValueError(f"{variant} holds {variant.capacity} < {cols} columns")
    funcs = [kernels.functions[n] for n in variant.names()]
    smem = variant.shared_mem
    for f in funcs:
        if smem > 48 * 1024:
            ok(cu.cuFuncSetAttribute(
                f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    if variant.kind == "stream" and not resident:
        resident = resident_ctas(funcs[0], variant.threads, smem)
    grid = variant.grid(rows, cols, resident)
    ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (a, b, out)]
    r, c = ctypes.c_int64(rows), ctypes.c_int32(cols)
    if variant.kind == "split":
        partials = torch.empty((grid, 2), dtype=torch.float32, device=a.device)
        pp = ctypes.c_void_p(partials.data_ptr())
        ch = ctypes.c_int32(variant.chunks(cols))
        arglists = [[ptrs[0], ptrs[1], pp, r, c, ch], [ptrs[0], ptrs[1], ptrs[2], pp, r, c, ch]]
    else:
        partials = None
        arglists = [[*ptrs, r, c]]
    packed = []
    for args in arglists:
        arr = (ctypes.c_void_p * len(args))(*[ctypes.addressof(x) for x in args])
        packed.append(arr)

    def run() -> None:
        for f, arr in zip(funcs, packed):
            ok(cu.cuLaunchKernel(f, grid, 1, 1, variant.threads, 1, 1, smem, stream,
                                 ctypes.addressof(arr), 0))

    run.keep = (ptrs, r, c, arglists, packed, partials)  # type: ignore[attr-defined]
    return run


# ---- correctness --------------------------------------------------------------------------

TOL = {0: 1e-5, 1: 1e-3, 2: 8e-3}
CHECK_COLS = (1, 7, 33, 1000, 1024, 4097, 8192, 32768, 65536, 131072, 262144, 1_000_000)


def make_inputs(op: int, rows: int, cols: int, dt: torch.dtype, gen: torch.Generator,
                scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, b, float64 reference, float64 magnitude): forward a = x; backward a = y, b = dy.
    The magnitude is what errors are measured against: |ref| forward; backward, the size of
    the terms that cancel (|y| (|dy| + |sum dy y|), or |dy| + exp(y) |sum dy|), since the
    result itself can be far smaller than the rounding of those terms in float32."""
    dev = "cuda"
    x = torch.randn(rows, cols, generator=gen, device=dev, dtype=torch.float64) * scale
    if op < 2:
        if cols > 3:
            mask = torch.rand(rows, cols, generator=gen, device=dev) < 0.02
            x[mask] = -float("inf")
        if rows > 1:
            x[rows // 2] = -float("inf")  # a fully -inf row: NaN like torch
        xq = x.to(dt)
        ref = (torch.softmax if op == 0 else torch.log_softmax)(xq.double(), -1)
        return xq, xq, ref, ref.abs()
    fwd = torch.softmax if op == 2 else torch.log_softmax
    y = fwd(x, -1).to(dt)
    dy = torch.randn(rows, cols, generator=gen, device=dev, dtype=torch.float64).to(dt)
    y64, dy64 = y.double(), dy.double()
    if op == 2:
        dot = (dy64 * y64).sum(-1, keepdim=True)
        ref = y64 * (dy64 - dot)
        size = y64.abs() * (dy64.abs() + dot.abs())
    else:
        total = dy64.sum(-1, keepdim=True)
        ref = dy64 - torch.exp(y64) * total
        size = dy64.abs() + torch.exp(y64) * total.abs()
    return y, dy, ref, size


def compare(out: torch.Tensor, ref: torch.Tensor, size: torch.Tensor) -> tuple[float, str]:
    """(L2 error of out against the reference rounded to out's dtype, relative to the L2
    norm of ``size``; '' or what mismatched). NaN and inf positions must match exactly."""
    ref_t = ref.to(out.dtype).double()
    got = out.double()
    if not torch.equal(torch.isnan(got), torch.isnan(ref_t)):
        return float("inf"), f"NaN mismatch ({int(torch.isnan(got).sum())} vs {int(torch.isnan(ref_t).sum())})"
    inf = torch.isinf(ref_t)
    if not torch.equal(got[inf], ref_t[inf]):
        return float("inf"), "inf mismatch"
    fin = torch.isfinite(ref_t)
    if not torch.isfinite(got[fin]).all():
        return float("inf"), "non-finite output where reference is finite"
    num = torch.linalg.vector_norm(got[fin] - ref_t[fin])
    den = torch.linalg.vector_norm(size[fin])
    return float(num / den) if den > 0 else float(num), ""


def check_cases(kinds: set[str]) -> list[tuple[Any, int, int, float]]:
    cases = []
    for dt in (0, 1, 2):
        for op in range(4):
            for cols in CHECK_COLS:
                variant = plan.choose_variant(cols, NP_DTYPES[dt], op)
                if variant.kind not in kinds:
                    continue
                rows = max(3, min(67, 4_000_000 // cols))
                for scale in (1.0, 1e4 if dt != 1 else 1e3):
                    cases.append((variant, rows, cols, scale))
    # misaligned: vec below the widest (odd pointers are not made here; force narrower vec)
    for dt in (0, 2):
        for cols in (1024, 8192):
            v = plan.choose_variant(cols, NP_DTYPES[dt], 0, vec=2)
            if v.kind in kinds:
                cases.append((v, 5, cols, 1.0))
    # every sweep candidate at its own length, and one length below it (a ragged tail)
    for rows, cols, dt, op, candidates in sweep_sets():
        for v in candidates:
            if v.kind not in kinds:
                continue
            for length in (cols, cols - 3 * v.vec):
                cases.append((v, 67 if v.kind != "cluster" else 9, length, 1.0))
    return cases


def run_check(kernels: Kernels, cases: list, results: list) -> int:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    failures = 0
    for variant, rows, cols, scale in cases:
        dt = TORCH_DTYPES[variant.dtype]
        a, b, ref, size = make_inputs(variant.op, rows, cols, dt, gen, scale)
        out = torch.full((rows, cols), 12345.0, dtype=dt, device="cuda")
        # stream variants: 7 CTAs, so each loops over ~10 rows (both buffers, the tail)
        launcher(kernels, variant, a, b, out, rows, cols, resident=7)()
        torch.cuda.synchronize()
        err, why = compare(out, ref, size)
        passed = not why and err < TOL[variant.dtype]
        failures += not passed
        results.append({"variant": variant.names()[0], "kind": variant.kind, "rows": rows,
                        "cols": cols, "scale": scale, "rel_err": err, "why": why,
                        "passed": passed})
        if not passed:
            print(f"FAIL {variant.names()[0]} rows={rows} cols={cols} scale={scale}: "
                  f"err={err:.3g} {why}", flush=True)
    return failures


# ---- sweep --------------------------------------------------------------------------------


def V(kind: str, dt: int, op: int, vec: int, items: int, group: int, threads: int,
      cluster: int = 1, stage: int = 0, min_blocks: int = 1) -> Any:
    return Variant(kind, dt, op, vec, items, group, threads, cluster, stage, min_blocks)


def sweep_sets() -> list[tuple[int, int, int, int, list]]:
    """(rows, cols, dtype, op, candidate variants); the chooser's pick is added first."""
    f, b = 0, 2
    return [
        (4096, 8192, 0, f, [V("rows", 0, f, 4, 4, 512, 512), V("rows", 0, f, 4, 8, 256, 1024),
                            V("rows", 0, f, 4, 8, 256, 256, min_blocks=5),
                            V("rows", 0, f, 4, 4, 512, 512, min_blocks=4),
                            V("rows", 0, f, 4, 4, 512, 1024, min_blocks=2),
                            V("stream", 0, f, 4, 8, 256, 256, min_blocks=3),
                            V("rows", 0, f, 4, 4, 512, 1024), V("stream", 0, f, 4, 8, 256, 256),
                            V("stream", 0, f, 4, 4, 512, 512), V("stream", 0, f, 4, 16, 128, 128),
                            V("stream", 0, f, 4, 2, 1024, 1024)]),
        (65536, 1024, 0, f, [V("rows", 0, f, 4, 2, 128, 128), V("rows", 0, f, 4, 8, 32, 128),
                             V("stream", 0, f, 4, 2, 128, 128), V("stream", 0, f, 4, 4, 64, 64),
                             V("stream", 0, f, 4, 1, 256, 256)]),
        (8192, 32768, 0, f, [V("rows", 0, f, 4, 8, 1024, 1024), V("cluster", 0, f, 4, 8, 512, 512, 2)]),
        (1024, 131072, 0, f, [V("cluster", 0, f, 4, 8, 1024, 1024, 4), V("cluster", 0, f, 4, 8, 512, 512, 8),
                              V("cluster", 0, f, 4, 4, 1024, 1024, 8)]),
        (16384, 4096, 2, f, [V("rows", 2, f, 8, 4, 128, 128), V("rows", 2, f, 8, 8, 64, 64),
                             V("rows", 2, f, 8, 4, 128, 128, min_blocks=16),
                             V("rows", 2, f, 8, 2, 256, 256, min_blocks=8),
                             V("rows", 2, f, 8, 1, 512, 512, min_blocks=4),
                             V("rows", 2, f, 8, 4, 128, 128, min_blocks=12),
                             V("rows", 2, f, 8, 8, 64, 64, min_blocks=24),
                             V("stream", 2, f, 8, 4, 128, 128, min_blocks=12),
                             V("rows", 2, f, 8, 4, 128, 512), V("rows", 2, f, 8, 2, 256, 1024),
                             V("rows", 2, f, 8, 8, 64, 512), V("stream", 2, f, 8, 4, 128, 128),
                             V("stream", 2, f, 8, 2, 256, 256), V("stream", 2, f, 8, 8, 64, 64)]),
        (16384, 4096, 1, f, [V("stream", 1, f, 8, 4, 128, 128), V("rows", 1, f, 8, 4, 128, 128, min_blocks=16)]),
        (4096, 8192, 0, 1, [V("stream", 0, 1, 4, 8, 256, 256), V("rows", 0, 1, 4, 4, 512, 512, min_blocks=4)]),
        (64, 1_000_000, 0, f, []),
        # backward
        (4096, 8192, 0, b, [V("rows", 0, b, 4, 4, 512, 512), V("stream", 0, b, 4, 4, 512, 512),
                            V("stream", 0, b, 4, 8, 256, 256)]),
        (65536, 1024, 0, b, [V("rows", 0, b, 4, 2, 128, 128), V("stream", 0, b, 4, 2, 128, 128)]),
        (8192, 32768, 0, b, [V("rows", 0, b, 4, 8, 1024, 1024, 1, 1), V("cluster", 0, b, 4, 4, 256, 256, 8)]),
        (1024, 131072, 0, b, [V("cluster", 0, b, 4, 4, 1024, 1024, 8), V("cluster", 0, b, 4, 8, 1024, 1024, 4, 1),
                              V("cluster", 0, b, 4, 8, 512, 512, 8, 1)]),
        (16384, 4096, 2, b, [V("rows", 2, b, 8, 1, 512, 512), V("stream", 2, b, 8, 2, 256, 256)]),
        (4096, 8192, 0, 3, []),
    ]


def measure_copy(stream: int) -> dict[str, float]:
    out = {}
    for mib in (256, 1024):
        n = mib << 20
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ms = device_ms(lambda: ok(cu.cuMemcpyDtoDAsync(dst.data_ptr(), src.data_ptr(), n, stream)),
                       stream, repeat=30)
        out[f"memcpy_{mib}MiB_GBps"] = 2 * n / ms / 1e6
        ms = device_ms(lambda: dst.copy_(src), stream, repeat=30)
        out[f"torch_copy_{mib}MiB_GBps"] = 2 * n / ms / 1e6
        del src, dst
    return out


def torch_fn(op: int, a: torch.Tensor, b: torch.Tensor) -> Callable[[], Any]:
    if op == 0:
        return lambda: torch.softmax(a, -1)
    if op == 1:
        return lambda: torch.log_softmax(a, -1)
    if op == 2:
        return lambda: torch._softmax_backward_data(b, a, -1, a.dtype)
    return lambda: torch._log_softmax_backward_data(b, a, -1, a.dtype)


def run_sweep(kernels: Kernels, results: dict) -> None:
    stream = torch.cuda.current_stream().cuda_stream
    copy = measure_copy(stream)
    results["copy"] = copy
    ceiling = max(copy.values())
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    rows_out = []
    print(f"copy GB/s: " + ", ".join(f"{k}={v:.0f}" for k, v in copy.items()), flush=True)
    for rows, cols, dt, op, candidates in sweep_sets():
        tdt = TORCH_DTYPES[dt]
        a, b, ref, size = make_inputs(op, rows, cols, tdt, gen, 1.0)
        del ref, size
        if op < 2:
            a = torch.randn(rows, cols, generator=gen, device="cuda", dtype=torch.float32).to(tdt)
        passes = 2 if op < 2 else 3
        nbytes = passes * rows * cols * a.element_size()
        ms = device_ms(torch_fn(op, a, b), stream, repeat=30)
        torch_gbps = nbytes / ms / 1e6
        chosen = plan.choose_variant(cols, NP_DTYPES[dt], op)
        # the chosen one first and again last: the spread of a repeat says what is noise
        for variant in [chosen] + [v for v in candidates if v != chosen] + [chosen]:
            out = torch.empty_like(a)
            fn = launcher(kernels, variant, a, b, out, rows, cols, stream)
            try:
                ms = device_ms(fn, stream, repeat=40)
            except Exception as exc:  # record and go on
                rows_out.append({"shape": f"{rows}x{cols}", "variant": variant.names()[0], "error": str(exc)})
                print(f"ERROR {variant.names()[0]}: {exc}", flush=True)
                continue
            gbps = nbytes / ms / 1e6
            row = {"shape": f"{rows}x{cols}", "dtype": str(tdt).replace("torch.", ""),
                   "op": op, "variant": variant.names()[0], "chosen": variant == chosen,
                   "ms": ms, "GBps": gbps, "pct_copy": 100 * gbps / ceiling,
                   "torch_GBps": torch_gbps, "vs_torch": gbps / torch_gbps,
                   "resources": kernels.resources.get(variant.names()[0], "")}
            rows_out.append(row)
            print(f"{row['shape']:>13} {row['dtype']:>8} op{op} {'*' if row['chosen'] else ' '} "
                  f"{variant.names()[0]:<42} {gbps:7.0f} GB/s {row['pct_copy']:5.1f}% "
                  f"torch {torch_gbps:6.0f} x{row['vs_torch']:.2f}", flush=True)
            del out, fn
        del a, b
        torch.cuda.empty_cache()
    results["rows"] = rows_out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("check", "sweep"))
    parser.add_argument("--kinds", default="rows,stream,cluster,split")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    ok(cu.cuInit(0))
    props = torch.cuda.get_device_properties(0)
    arch = f"sm_{props.major}{props.minor}"
    kinds = set(args.kinds.split(","))
    cases = check_cases(kinds) if args.mode == "check" else []
    sweeps = sweep_sets() if args.mode == "sweep" else []
    names = {n for v, *_ in cases for n in v.names()}
    for rows, cols, dt, op, cands in sweeps:
        for v in [plan.choose_variant(cols, NP_DTYPES[dt], op), *cands]:
            names.update(v.names())
    kernels = Kernels(sorted(names), arch)
    results: dict[str, Any] = {"device": props.name, "arch": arch, "torch": torch.__version__,
                               "nvrtc": ok(nvrtc.nvrtcVersion())}
    if args.mode == "check":
        checks: list = []
        failures = run_check(kernels, cases, checks)
        results["checks"] = checks
        worst: dict[int, float] = {}
        for c in checks:
            dt = int(c["variant"].split("<")[1].split(",")[0])
            worst[dt] = max(worst.get(dt, 0.0), c["rel_err"])
        print(f"check {args.kinds}: {len(checks) - failures}/{len(checks)} passed; "
              f"worst rel err by dtype {worst}", flush=True)
    else:
        run_sweep(kernels, results)
    name = f"softmax_dev_{args.mode}_{args.kinds.replace(',', '-') if args.mode == 'check' else 'all'}.json"
    Path(args.out, name).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
