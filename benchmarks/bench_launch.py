"""Kernel launch host time: gpurt against CuPy, cuda.core, torch and the raw driver call.

Every row launches a tiny kernel with 3 arguments (two device pointers and an int) from
Python and reports the median host time per launch in microseconds (same process, same
GPU). DESIGN.md's numbers to beat on an H200: raw cuLaunchKernel with pre-packed args 3.09,
cuda.core 3.36, CuPy RawKernel 4.27, torch x.add_(1) 4.86; gpurt must be <= cuda.core and
aims at <= 1.1x the raw call.

gpurt's rows say which launch path they take ("path"): "compiled" (gpurt._launch._claunch, the
default where it is built) or "python" (cuda.bindings' cuLaunchKernel from Python, as with
GPURT_PURE_PYTHON_LAUNCH=1), measured side by side on the main case.

Without a GPU only gpurt's host steps are timed (packing the arguments into the parameter
buffer, and the launchers with a driver call that does nothing: a Python function for the
Python path, a C function compiled here with the C compiler for the compiled one); the rows
say so. With a GPU the rows are measured in interleaved rounds, each keeping its best median.

    python benchmarks/bench_launch.py [--json PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import struct
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import host_us, peer, print_rows, write_results

N = 1024
SOURCE = r"""
extern "C" __global__ void add_one(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.0f;
}
"""
NUMBER = 5000
ROUNDS = 3  # every row is measured once per round, rows interleaved; a row keeps its best

Case = tuple[str, str, Callable[[], Any], Callable[[], Any]]  # what, lib, fn, sync
PATH_KEY = " [python path]"  # marks the rows of gpurt's Python launch path


def python_path_kernel(kernel: Any) -> Any:
    """The same kernel, compiled again and loaded on gpurt's Python launch path: launches
    through cuda.bindings' cuLaunchKernel and Kernel.__call__ in Python, as a process started
    with GPURT_PURE_PYTHON_LAUNCH=1 has them."""
    import gpurt
    from gpurt._launch import path as _launchpath

    python_call = getattr(gpurt.Kernel.__call__, "__wrapped__", gpurt.Kernel.__call__)

    class PythonPathKernel(gpurt.Kernel):
        __call__ = python_call

    other = gpurt.compile(kernel.module.source + "\n// python path")[kernel.name]
    other.__class__ = PythonPathKernel  # its __call__ is the Python one; the rest is the same
    pure, _launchpath.pure_python = _launchpath.pure_python, True
    try:
        other._load(gpurt.current_device())
    finally:
        _launchpath.pure_python = pure
    return other


def gpurt_cases() -> list[Case]:
    from cuda.bindings import driver as cu

    import gpurt

    module = gpurt.compile(SOURCE)
    kernel = module["add_one"]
    x = gpurt.asarray(np.random.default_rng(0).standard_normal(N).astype(np.float32))
    y = gpurt.zeros(N)
    args = (x, y, N)
    kernel(4, 256, args)
    np.testing.assert_allclose(y.to_numpy(), x.to_numpy() + 1.0, rtol=1e-6)  # it really ran
    sync = gpurt.synchronize

    # the raw driver call with pre-packed arguments, on the same function and stream
    function = kernel._loaded[gpurt.current_device()].function
    buffer = ctypes.create_string_buffer(20)
    struct.pack_into("<QQi", buffer, 0, x.ptr, y.ptr, N)
    base = ctypes.addressof(buffer)
    pointers = (ctypes.c_void_p * 3)(base, base + 8, base + 16)
    params = ctypes.addressof(pointers)
    stream = cu.CUstream(gpurt.current_stream().cuda_stream)
    launch = cu.cuLaunchKernel

    config = gpurt.LaunchConfig(4, 256)
    raw_kernel = gpurt.RawKernel(SOURCE, "add_one")
    raw_kernel(4, 256, args)
    side = gpurt.Stream()
    ints = (x.ptr, y.ptr, N)
    python_path = python_path_kernel(kernel)
    cases: list[Case] = [
        ("raw cuLaunchKernel, pre-packed args", "driver",
         # keep= holds the packed buffers alive: params is only their address
         lambda keep=(buffer, pointers): launch(function, 4, 1, 1, 256, 1, 1, 0, stream,
                                                params, 0), sync),
        ("kernel(grid, block, args)", "gpurt", lambda: kernel(4, 256, args), sync),
        ("kernel(grid, block, args)" + PATH_KEY, "gpurt",
         lambda: python_path(4, 256, args), sync),
        ("kernel(grid, block, args), int pointers", "gpurt", lambda: kernel(4, 256, ints), sync),
        ("kernel((4,1,1), (256,1,1), args)", "gpurt",
         lambda: kernel((4, 1, 1), (256, 1, 1), args), sync),
        ("kernel(grid, block, args, stream=Stream)", "gpurt",
         lambda: kernel(4, 256, args, stream=side), sync),
        ("kernel.launch(LaunchConfig, *args)", "gpurt",
         lambda: kernel.launch(config, x, y, N), sync),
        ("RawKernel(grid, block, args)", "gpurt", lambda: raw_kernel(4, 256, args), sync),
    ]
    torch = peer("torch")
    if torch is not None:
        tx = torch.zeros(N, device="cuda")
        ty = torch.zeros(N, device="cuda")
        cases.append(("kernel(...) with torch tensors", "gpurt",
                      lambda: kernel(4, 256, (tx, ty, N)), sync))
    return cases


def hook_rows() -> list[dict[str, Any]]:
    """A launch with a no-op launch hook registered (measured alone: hooks are global)."""
    import gpurt

    kernel = gpurt.compile(SOURCE)["add_one"]
    x, y = gpurt.zeros(N), gpurt.zeros(N)

    def hook(kernel: Any, handle: int, phase: str) -> None:
        pass

    gpurt.add_launch_hook(hook)
    try:
        return [_row("kernel(...) with a no-op launch hook", "gpurt",
                     lambda: kernel(4, 256, (x, y, N)), gpurt.synchronize)]
    finally:
        gpurt.remove_launch_hook(hook)


def cupy_cases() -> list[Case]:
    cupy = peer("cupy")
    if cupy is None:
        return []
    kernel = cupy.RawKernel(SOURCE, "add_one")
    x = cupy.zeros(N, cupy.float32)
    y = cupy.zeros(N, cupy.float32)
    n = np.int32(N)
    kernel((4,), (256,), (x, y, n))
    return [("RawKernel(grid, block, args)", "cupy", lambda: kernel((4,), (256,), (x, y, n)),
             cupy.cuda.Device().synchronize)]


def cuda_core_cases() -> list[Case]:
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
    except ImportError:
        try:
            from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, launch
        except ImportError:
            return []
    import gpurt

    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    options = ProgramOptions(arch=gpurt.get_arch(0))
    program = Program(SOURCE, code_type="c++", options=options)
    kernel = program.compile("cubin").get_kernel("add_one")
    x = device.allocate(4 * N, stream=stream)
    y = device.allocate(4 * N, stream=stream)
    n = np.int32(N)
    config = LaunchConfig(grid=4, block=256)
    launch(stream, config, kernel, x, y, n)
    return [("launch(stream, config, kernel, *args)", "cuda.core",
             lambda: launch(stream, config, kernel, x, y, n), stream.sync)]


def torch_cases() -> list[Case]:
    torch = peer("torch")
    if torch is None:
        return []
    t = torch.zeros(N, device="cuda")
    t.add_(1)
    return [("x.add_(1), 1024 floats", "torch", lambda: t.add_(1), torch.cuda.synchronize)]


def _row(what: str, lib: str, fn: Callable[[], Any], sync: Callable[[], Any]) -> dict[str, Any]:
    """Median host microseconds per call of ``fn`` (the device drained before and after)."""
    sync()
    us = host_us(fn, number=NUMBER, repeat=15, warmup=500)
    sync()
    return {"what": what, "lib": lib, "host_us": us}


def measure(cases: list[Case]) -> list[dict[str, Any]]:
    """One row per case: the best of ROUNDS medians, the cases interleaved round by round
    so that a slow spell of the machine does not land on one row only."""
    best: dict[int, dict[str, Any]] = {}
    for _ in range(ROUNDS):
        for i, (what, lib, fn, sync) in enumerate(cases):
            row = _row(what, lib, fn, sync)
            if i not in best or row["host_us"] < best[i]["host_us"]:
                best[i] = row
    return [best[i] for i in range(len(cases))]


def packing_rows() -> list[dict[str, Any]]:
    """The host-side steps gpurt adds before the driver call, timed without a GPU: packing
    alone, the generated Python launcher with a Python driver call that does nothing, and the
    compiled launcher with a C one (where the extension and a C compiler are there)."""
    import gpurt
    from gpurt._launch import path as _launchpath
    from gpurt._launch.kernel import _dims3

    kernel = gpurt.compile(SOURCE, arch="sm_90")["add_one"]
    plan = gpurt._launch.args.build_plan(kernel.name, kernel.params, None)
    buffer = ctypes.create_string_buffer(plan.size)

    class ForeignArray:  # the __cuda_array_interface__ path (torch, CuPy, JAX arrays)
        def __init__(self, ptr: int) -> None:
            self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (N,),
                                             "typestr": "<f4", "version": 3}

    def noop(*args: Any) -> tuple:
        return (0,)

    def unused(*args: Any) -> None:
        raise AssertionError("not reached")

    launch = plan.launcher(noop, compiled=False, function=None, dims=_dims3, hooks=[],
                           hooked=unused, explain=unused, refused=unused)
    ints = (0x7F0000000000, 0x7F0000001000, N)
    foreign = (ForeignArray(0x7F0000000000), ForeignArray(0x7F0000001000), N)
    rows = [
        {"what": "pack 3 args (int pointers), no GPU", "lib": "gpurt",
         "host_us": host_us(lambda: plan.fill(buffer, ints, None), number=20000)},
        {"what": "pack 3 args (CAI objects), no GPU", "lib": "gpurt",
         "host_us": host_us(lambda: plan.fill(buffer, foreign, None), number=20000)},
        {"what": "generated launcher, no-op driver call, no GPU", "lib": "gpurt",
         "path": "python",
         "host_us": host_us(lambda: launch(4, 256, ints, 0, 0, 0), number=20000)},
    ]
    address, library = noop_c_function()  # library: keeps the no-op loaded while timed
    claunch = _launchpath.claunch
    if address and claunch is not None and plan.layout is not None:
        launcher = claunch.Launcher(address, 0x1000, _dims3)
        compiled = claunch.PackingLauncher(launcher, plan.size, plan.layout, gpurt.Array, [],
                                           unused, unused)
        rows += [
            {"what": "compiled launcher, no-op C driver call, no GPU", "lib": "gpurt",
             "path": "compiled",
             "host_us": host_us(lambda: compiled(4, 256, ints, 0, 0, 0), number=20000)},
            {"what": "Launcher alone, no-op C driver call, no GPU (scale)", "lib": "gpurt",
             "path": "compiled",
             "host_us": host_us(lambda: launcher(4, 256, 0, 0, 0x1000), number=20000)},
        ]
    rows.append({"what": "no-op driver call alone (scale)", "lib": "python",
                 "host_us": host_us(lambda: noop(None, 4, 1, 1, 256, 1, 1, 0, None, 0, 0),
                                    number=20000)})
    return rows


NOOP_C = ("int noop(void *f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, "
          "unsigned g, unsigned h, void *s, void **p, void **x) { return 0; }\n")


def noop_c_function() -> tuple[int, Any]:
    """The address of a C function with cuLaunchKernel's signature that does nothing, built
    here with the C compiler (0 where there is none), and the library to keep loaded."""
    compiler = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(compiler.split()[0]) is None:
        return 0, None
    with tempfile.TemporaryDirectory() as folder:
        source, library = os.path.join(folder, "noop.c"), os.path.join(folder, "noop.so")
        with open(source, "w") as fh:
            fh.write(NOOP_C)
        built = subprocess.run([*compiler.split(), "-O2", "-shared", "-fPIC", source, "-o",
                                library], capture_output=True, check=False)
        if built.returncode != 0:
            return 0, None
        lib = ctypes.CDLL(library)
    return ctypes.cast(lib.noop, ctypes.c_void_p).value or 0, lib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import gpurt
    from gpurt._launch import path as _launchpath

    rows = packing_rows()
    if gpurt.is_available():
        cases = gpurt_cases() + cuda_core_cases() + cupy_cases() + torch_cases()
        rows += measure(cases) + hook_rows()
        raw = next(r["host_us"] for r in rows if r["lib"] == "driver")
        path = _launchpath.launch_path()["path"]
        for row in rows:
            if "no GPU" not in row["what"] and row["lib"] != "python":
                row["vs_raw"] = row["host_us"] / raw
            if row["lib"] == "gpurt" and "path" not in row:
                python = row["what"].endswith(PATH_KEY)
                row["what"] = row["what"].removesuffix(PATH_KEY)
                row["path"] = "python" if python else path
    print_rows("kernel launch: host time per launch (3 args)", rows)
    write_results("launch", rows, args.json)


if __name__ == "__main__":
    main()
