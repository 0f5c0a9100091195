#!/usr/bin/env python3
"""Development harness for kernels/softmax.cu on a GPU machine, independent of gpurt's
runtime modules: compiles with cuda.bindings.nvrtc, launches with cuLaunchKernel on torch
tensors, checks the chosen variants (and the sweep's candidates) against float64, and times
candidate variants for chosen shapes next to torch and a device-to-device copy (each timed
call after a busy 512 MiB memset, as in bench_softmax.py). The product benchmark is
bench_softmax.py; this one is for choosing the tuning in kernels/_softmax_plan.py (see
notes_softmax.md). Needs torch.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import device_ms  # noqa: E402


def _load_plan() -> Any:
    spec = importlib.util.spec_from_file_location("softmax_plan",
                                                  ROOT / "kernels" / "_softmax_plan.py")
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

    def __init__(self, names: list[str], arch: str, options: tuple[str, ...] = ()) -> None:
        source = plan.source_text()
        text = source + arch + "\n".join(sorted(names)) + " ".join(options)
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        cache = Path(f"/tmp/softmax_dev_{key}.json")
        if cache.exists():
            doc = json.loads(cache.read_text())
        else:
            doc = self._compile(source, sorted(set(names)), arch, options)
            cache.write_text(json.dumps(doc))
        self.resources = doc["resources"]
        self._image = np.frombuffer(bytes.fromhex(doc["cubin"]), dtype=np.uint8).copy()
        self.module = ok(cu.cuModuleLoadData(self._image.ctypes.data))
        self.functions = {n: ok(cu.cuModuleGetFunction(self.module, low.encode()))
                          for n, low in doc["lowered"].items()}

    @staticmethod
    def _compile(source: str, names: list[str], arch: str, options: tuple[str, ...] = ()) -> dict:
        t0 = time.time()
        prog = ok(nvrtc.nvrtcCreateProgram(source.encode(), b"softmax.cu", 0, [], []))
        try:
            for n in names:
                ok(nvrtc.nvrtcAddNameExpression(prog, n.encode()))
            opts = [f"-arch={arch}".encode(), b"-std=c++17", b"--ptxas-options=-v",
                    *(o.encode() for o in options)]
            res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
            log = bytearray(size)  # never b" " * size: a shared object for size 1
            nvrtc.nvrtcGetProgramLog(prog, log)
            log = log.decode(errors="replace")
            if int(res[0]) != 0:
                raise RuntimeError("NVRTC failed:\n" + log[:4000])
            size = ok(nvrtc.nvrtcGetCUBINSize(prog))
            cubin = bytearray(size)
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
                used = line.split(":", 1)[-1].strip()
                resources[current] = (resources.get(current, "") + " " + used).strip()
        print(f"compiled {len(names)} kernels in {time.time() - t0:.1f} s", flush=True)
        return {"cubin": cubin.hex(), "lowered": lowered, "resources": resources}


def launcher(kernels: Kernels, variant: Any, a: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor, rows: int, cols: int, stream: int = 0,
             grid: int | None = None) -> Callable[[], None]:
    """A closure that launches ``variant`` (both launches for split) with packed arguments;
    ``grid``: CTAs of a cluster variant when not one cluster per row (persistent clusters
    looping over the rows)."""
    if variant.kind != "split" and variant.capacity < cols:
        raise ValueError(f"{variant} holds {variant.capacity} < {cols} columns")
    funcs = [kernels.functions[n] for n in variant.names()]
    smem = variant.shared_mem
    if smem:  # (static shared memory counts towards the 48 KiB default too)
        for f in funcs:
            ok(cu.cuFuncSetAttribute(
                f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    grid = grid or variant.grid(rows, cols)
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
    packed = [(ctypes.c_void_p * len(args))(*[ctypes.addressof(x) for x in args])
              for args in arglists]

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
        return float("inf"), (f"NaN mismatch ({int(torch.isnan(got).sum())} vs "
                              f"{int(torch.isnan(ref_t).sum())})")
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
    for _rows, cols, dt, _op, candidates in sweep_sets():
        for build, v in map(with_build, candidates):
            if v.kind not in kinds or build == "waitall":
                continue
            large = 1e4 if dt != 1 else 1e3
            for length, scale in ((cols, 1.0), (cols - 3 * v.vec, 1.0), (cols, large)):
                if build == "persist":  # 3 clusters over 9 rows
                    cases.append((v, 9, length, scale, 3 * v.cluster))
                else:
                    cases.append((v, 67 if v.kind != "cluster" else 9, length, scale))
    return cases


def run_check(kernels: Kernels, cases: list, results: list) -> int:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    failures = 0
    for variant, rows, cols, scale, *grid in cases:
        dt = TORCH_DTYPES[variant.dtype]
        a, b, ref, size = make_inputs(variant.op, rows, cols, dt, gen, scale)
        out = torch.full((rows, cols), 12345.0, dtype=dt, device="cuda")
        launcher(kernels, variant, a, b, out, rows, cols, grid=grid[0] if grid else None)()
        torch.cuda.synchronize()
        err, why = compare(out, ref, size)
        passed = not why and err < TOL[variant.dtype]
        failures += not passed
        results.append({"variant": variant.names()[0], "kind": variant.kind, "rows": rows,
                        "cols": cols, "scale": scale, "grid": grid[0] if grid else None,
                        "rel_err": err, "why": why, "passed": passed})
        if not passed:
            print(f"FAIL {variant.names()[0]} rows={rows} cols={cols} scale={scale}: "
                  f"err={err:.3g} {why}", flush=True)
    return failures


# ---- sweep --------------------------------------------------------------------------------


def V(kind: str, dt: int, op: int, vec: int, items: int, group: int, threads: int,
      cluster: int = 1, min_blocks: int = 1, smem: int = 0) -> Any:
    return Variant(kind, dt, op, vec, items, group, threads, cluster, min_blocks, smem)


# Builds: NVRTC options. "waitall" makes the shared-memory items wait for all their copies
# at the first use (before run 5: after loading), against the default wait per vector.
# "persist" is the base build launched with only as many clusters as fit at once, each
# looping over rows.
BUILDS = {"base": (), "waitall": ("-DSM_COPY_WAIT_ALL",)}


def sweep_sets() -> list[tuple[int, int, int, int, list]]:
    """(rows, cols, dtype, op, other candidates: variants, or (build, variant) pairs); the
    chooser's pick is timed first and again last, the candidates between."""
    f, lg, b = 0, 1, 2
    return [
        (4096, 8192, 0, f, []),  # first and last: run 5 read 82.6% here after the long rows
        (1024, 131072, 0, f, [V("cluster", 0, f, 4, 16, 1024, 1024, 2, smem=12),  # run 4
                              V("cluster", 0, f, 4, 16, 512, 512, 4, 2, smem=8),  # run 5
                              V("cluster", 0, f, 4, 16, 512, 512, 4, 2, smem=6),
                              V("cluster", 0, f, 4, 16, 1024, 1024, 2, smem=8),
                              V("cluster", 0, f, 4, 32, 512, 512, 2, smem=8),
                              V("cluster", 0, f, 4, 32, 512, 512, 2, smem=12),
                              V("cluster", 0, f, 4, 32, 512, 512, 2, smem=16),
                              V("cluster", 0, f, 4, 32, 256, 256, 4, 2, smem=12),
                              V("cluster", 0, f, 4, 16, 256, 256, 8, 4, smem=12),
                              V("cluster", 0, f, 4, 16, 512, 512, 4)]),
        (2048, 65536, 0, f, [V("rows", 0, f, 4, 16, 1024, 1024, smem=12),  # run 4
                             V("cluster", 0, f, 4, 16, 512, 512, 2, 2, smem=12),
                             V("cluster", 0, f, 4, 16, 512, 512, 2, 2, smem=8),
                             V("rows", 0, f, 4, 32, 512, 512, smem=16),
                             V("cluster", 0, f, 4, 16, 512, 512, 2)]),
        (1024, 131072, 2, f, [V("cluster", 2, f, 8, 8, 1024, 1024, 2, smem=6),  # run 4
                              V("cluster", 2, f, 8, 8, 256, 256, 8, 4, smem=6),
                              V("cluster", 2, f, 8, 8, 512, 512, 4, 2, smem=6),
                              V("cluster", 2, f, 8, 16, 512, 512, 2, smem=4),
                              V("cluster", 2, f, 8, 16, 512, 512, 2, smem=8)]),
        (1024, 131072, 0, lg, [V("cluster", 0, lg, 4, 8, 1024, 1024, 4),  # run 4
                               V("cluster", 0, lg, 4, 32, 512, 512, 2, smem=12)]),
        (1024, 131072, 0, b, [V("cluster", 0, b, 4, 16, 512, 512, 4, smem=4),
                              V("cluster", 0, b, 4, 16, 512, 512, 4, smem=6)]),
        (8192, 32768, 0, b, []),
        (65536, 1024, 0, f, []),
        (8192, 32768, 0, f, []),
        (16384, 4096, 2, f, []),
        (4096, 8192, 0, f, []),
    ]


def with_build(candidate: Any) -> tuple[str, Any]:
    """A sweep candidate as (build, variant)."""
    return candidate if isinstance(candidate, tuple) else ("base", candidate)


def build_of(name: str) -> str:
    """The compiled build a sweep build name uses."""
    return "base" if name == "persist" else name


_SCRATCH: list[torch.Tensor] = []


def timed(fn: Callable[[], Any], stream: int, repeat: int = 40) -> float:
    """device_ms with a 512 MiB memset before each call: the device is busy while the host
    launches (host launch time is not counted) and the inputs leave L2."""
    if not _SCRATCH:
        _SCRATCH.append(torch.empty(512 << 20, dtype=torch.uint8, device="cuda"))
    scratch = _SCRATCH[0]
    flush = lambda: ok(cu.cuMemsetD8Async(scratch.data_ptr(), 0, scratch.numel(), stream))  # noqa: E731
    return device_ms(fn, stream, repeat=repeat, flush=flush)


def measure_copy(stream: int) -> dict[str, float]:
    out = {}
    for mib in (256, 1024):
        n = mib << 20
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ms = timed(lambda dst=dst, src=src, n=n: ok(
            cu.cuMemcpyDtoDAsync(dst.data_ptr(), src.data_ptr(), n, stream)), stream, repeat=30)
        out[f"memcpy_{mib}MiB_GBps"] = 2 * n / ms / 1e6
        ms = timed(lambda dst=dst, src=src: dst.copy_(src), stream, repeat=30)
        out[f"torch_copy_{mib}MiB_GBps"] = 2 * n / ms / 1e6
        ms = device_ms(lambda dst=dst, src=src, n=n: ok(
            cu.cuMemcpyDtoDAsync(dst.data_ptr(), src.data_ptr(), n, stream)), stream, repeat=30)
        out[f"memcpy_{mib}MiB_noflush_GBps"] = 2 * n / ms / 1e6
        del src, dst
    return out


def occupancy(kernels: Kernels, variant: Any) -> dict[str, int]:
    """CTAs per multiprocessor and (clusters) clusters resident at once, as the driver's
    occupancy calculator sees them; empty when it cannot tell."""
    func = kernels.functions[variant.names()[0]]
    found: dict[str, int] = {}
    try:
        found["ctas_per_sm"] = int(ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            func, variant.threads, variant.shared_mem)))
        if variant.kind == "cluster":
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = variant.cluster * 1024, 1, 1
            config.blockDimX, config.blockDimY, config.blockDimZ = variant.threads, 1, 1
            config.sharedMemBytes = variant.shared_mem
            found["clusters"] = int(ok(cu.cuOccupancyMaxActiveClusters(func, config)))
    except Exception as exc:  # informative only
        print(f"occupancy of {variant.names()[0]}: {exc}", flush=True)
    return found


def torch_fn(op: int, a: torch.Tensor, b: torch.Tensor) -> Callable[[], Any]:
    if op == 0:
        return lambda: torch.softmax(a, -1)
    if op == 1:
        return lambda: torch.log_softmax(a, -1)
    if op == 2:
        return lambda: torch._softmax_backward_data(b, a, -1, a.dtype)
    return lambda: torch._log_softmax_backward_data(b, a, -1, a.dtype)


def run_sweep(builds: dict[str, Kernels], results: dict) -> None:
    stream = torch.cuda.current_stream().cuda_stream
    copy = measure_copy(stream)
    results["copy"] = copy
    ceiling = max(v for k, v in copy.items() if "noflush" not in k)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    rows_out = []
    print("copy GB/s: " + ", ".join(f"{k}={v:.0f}" for k, v in copy.items()), flush=True)
    for rows, cols, dt, op, candidates in sweep_sets():
        tdt = TORCH_DTYPES[dt]
        a, b, ref, size = make_inputs(op, rows, cols, tdt, gen, 1.0)
        del ref, size
        if op < 2:
            a = torch.randn(rows, cols, generator=gen, device="cuda", dtype=torch.float32).to(tdt)
        passes = 2 if op < 2 else 3
        nbytes = passes * rows * cols * a.element_size()
        ms = timed(torch_fn(op, a, b), stream, repeat=30)
        torch_gbps = nbytes / ms / 1e6
        chosen = plan.choose_variant(cols, NP_DTYPES[dt], op)
        # the chosen one first and again last: the spread of that repeat says what is noise
        runs = [("base", chosen)]
        runs += [c for c in map(with_build, candidates) if c != ("base", chosen)]
        runs += [("base", chosen)]
        for build, variant in runs:
            kernels = builds[build_of(build)]
            out = torch.empty_like(a)
            fn = launcher(kernels, variant, a, b, out, rows, cols, stream)
            occupied = occupancy(kernels, variant)
            if build == "persist":
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                clusters = (occupied.get("clusters")
                            or sms * occupied.get("ctas_per_sm", 1) // variant.cluster)
                occupied["grid"] = min(rows, clusters) * variant.cluster
                fn = launcher(kernels, variant, a, b, out, rows, cols, stream,
                              grid=occupied["grid"])
            try:
                ms = timed(fn, stream)
            except Exception as exc:  # record and go on
                rows_out.append({"shape": f"{rows}x{cols}", "variant": variant.names()[0],
                                 "build": build, "error": str(exc)})
                print(f"ERROR {variant.names()[0]}: {exc}", flush=True)
                continue
            gbps = nbytes / ms / 1e6
            row = {"shape": f"{rows}x{cols}", "dtype": str(tdt).replace("torch.", ""),
                   "op": op, "variant": variant.names()[0], "build": build,
                   "chosen": (build, variant) == ("base", chosen), "ms": ms, "GBps": gbps,
                   "pct_copy": 100 * gbps / ceiling, "torch_GBps": torch_gbps,
                   "vs_torch": gbps / torch_gbps,
                   "resources": kernels.resources.get(variant.names()[0], ""), **occupied}
            rows_out.append(row)
            print(f"{row['shape']:>11} {row['dtype'][:4]} op{op} {'*' if row['chosen'] else ' '}"
                  f"{build[:5]:>5} {variant.names()[0][8:]:<34} {gbps:5.0f} "
                  f"{row['pct_copy']:5.1f}% torch {torch_gbps:5.0f} x{row['vs_torch']:.2f} "
                  f"{row.get('ctas_per_sm', '?')}/SM {row.get('clusters', '-')} clusters",
                  flush=True)
            del out, fn
        del a, b
        torch.cuda.empty_cache()
    results["rows"] = rows_out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("check", "sweep"))
    parser.add_argument("--kinds", default="rows,cluster,split")
    parser.add_argument("--build", default="base", choices=sorted(BUILDS),
                        help="check: the build options to check")
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
    build_names: dict[str, set[str]] = {"base": set()}
    for _rows, cols, dt, op, cands in sweeps:
        for build, v in map(with_build, [plan.choose_variant(cols, NP_DTYPES[dt], op), *cands]):
            build_names.setdefault(build_of(build), set()).update(v.names())
    results: dict[str, Any] = {"device": props.name, "arch": arch, "torch": torch.__version__,
                               "nvrtc": ok(nvrtc.nvrtcVersion())}
    if args.mode == "check":
        kernels = Kernels(sorted(names), arch, BUILDS[args.build])
        checks: list = []
        failures = run_check(kernels, cases, checks)
        results["checks"] = checks
        worst: dict[int, float] = {}
        for c in checks:
            dt = int(c["variant"].split("<")[1].split(",")[0])
            worst[dt] = max(worst.get(dt, 0.0), c["rel_err"])
        print(f"check {args.kinds} {args.build}: {len(checks) - failures}/{len(checks)} passed; "
              f"worst rel err by dtype {worst}", flush=True)
    else:
        run_sweep({b: Kernels(sorted(build_names[b]), arch, BUILDS[b]) for b in build_names},
                  results)
    tag = f"{args.kinds.replace(',', '-')}_{args.build}" if args.mode == "check" else "all"
    name = f"softmax_dev_{args.mode}_{tag}.json"
    Path(args.out, name).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
