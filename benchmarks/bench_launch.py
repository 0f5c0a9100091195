"""Kernel launch host time: gpurt against CuPy, cuda.core, torch and the raw driver call.

Every row launches a tiny kernel with 3 arguments (two device pointers and an int) from
Python and reports the median host time per launch in microseconds (same process, same
GPU). DESIGN.md's numbers to beat on an H200: raw cuLaunchKernel with pre-packed args 3.09,
cuda.core 3.36, CuPy RawKernel 4.27, torch x.add_(1) 4.86; gpurt must be <= cuda.core and
aims at <= 1.1x the raw call.

Without a GPU only the packing step is timed (converting and packing the arguments into the
parameter buffer, which is what gpurt adds on the host before the driver call); the rows
say so.

    python benchmarks/bench_launch.py [--json PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import struct
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


def _row(what: str, lib: str, fn: Callable[[], Any], sync: Callable[[], Any]) -> dict[str, Any]:
    """Median host microseconds per call of ``fn`` (the device drained before and after)."""
    sync()
    us = host_us(fn, number=NUMBER, repeat=15, warmup=500)
    sync()
    return {"what": what, "lib": lib, "host_us": us}


def gpurt_rows() -> list[dict[str, Any]]:
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

    def hook(kernel: Any, handle: int, phase: str) -> None:
        pass

    rows = [
        _row("raw cuLaunchKernel, pre-packed args", "driver",
             lambda: launch(function, 4, 1, 1, 256, 1, 1, 0, stream, params, 0), sync),
        _row("kernel(grid, block, args)", "gpurt", lambda: kernel(4, 256, args), sync),
        _row("kernel((4,1,1), (256,1,1), args)", "gpurt",
             lambda: kernel((4, 1, 1), (256, 1, 1), args), sync),
        _row("kernel.launch(LaunchConfig, *args)", "gpurt",
             lambda: kernel.launch(config, x, y, N), sync),
        _row("RawKernel(grid, block, args)", "gpurt", lambda: raw_kernel(4, 256, args), sync),
    ]
    gpurt.add_launch_hook(hook)
    try:
        rows.append(_row("kernel(...) with a no-op launch hook", "gpurt",
                         lambda: kernel(4, 256, args), sync))
    finally:
        gpurt.remove_launch_hook(hook)
    torch = peer("torch")
    if torch is not None:
        tx = torch.zeros(N, device="cuda")
        ty = torch.zeros(N, device="cuda")
        rows.append(_row("kernel(...) with torch tensors", "gpurt",
                         lambda: kernel(4, 256, (tx, ty, N)), sync))
    return rows


def cupy_rows() -> list[dict[str, Any]]:
    cupy = peer("cupy")
    if cupy is None:
        return []
    kernel = cupy.RawKernel(SOURCE, "add_one")
    x = cupy.zeros(N, cupy.float32)
    y = cupy.zeros(N, cupy.float32)
    n = np.int32(N)
    kernel((4,), (256,), (x, y, n))
    return [_row("RawKernel(grid, block, args)", "cupy", lambda: kernel((4,), (256,), (x, y, n)),
                 cupy.cuda.Device().synchronize)]


def cuda_core_rows() -> list[dict[str, Any]]:
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
    return [_row("launch(stream, config, kernel, *args)", "cuda.core",
                 lambda: launch(stream, config, kernel, x, y, n), stream.sync)]


def torch_rows() -> list[dict[str, Any]]:
    torch = peer("torch")
    if torch is None:
        return []
    t = torch.zeros(N, device="cuda")
    t.add_(1)
    return [_row("x.add_(1), 1024 floats", "torch", lambda: t.add_(1), torch.cuda.synchronize)]


def packing_rows() -> list[dict[str, Any]]:
    """The host-side step gpurt adds before the driver call, timed without a GPU."""
    import gpurt

    kernel = gpurt.compile(SOURCE, arch="sm_90")["add_one"]
    plan = gpurt._args.build_plan(kernel.name, kernel.params, None)
    buffer = ctypes.create_string_buffer(plan.size)

    class ForeignArray:  # the __cuda_array_interface__ path (torch, CuPy, JAX arrays)
        def __init__(self, ptr: int) -> None:
            self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (N,),
                                             "typestr": "<f4", "version": 3}

    def noop() -> None:
        pass

    ints = (0x7F0000000000, 0x7F0000001000, N)
    foreign = (ForeignArray(0x7F0000000000), ForeignArray(0x7F0000001000), N)
    return [
        {"what": "pack 3 args (int pointers), no GPU", "lib": "gpurt",
         "host_us": host_us(lambda: plan.fill(buffer, ints, None), number=20000)},
        {"what": "pack 3 args (CAI objects), no GPU", "lib": "gpurt",
         "host_us": host_us(lambda: plan.fill(buffer, foreign, None), number=20000)},
        {"what": "Python call of an empty function (scale)", "lib": "python",
         "host_us": host_us(noop, number=20000)},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import gpurt

    rows = packing_rows()
    if gpurt.is_available():
        rows += gpurt_rows() + cuda_core_rows() + cupy_rows() + torch_rows()
        raw = next(r["host_us"] for r in rows if r["lib"] == "driver")
        for row in rows:
            if "no GPU" not in row["what"] and row["lib"] != "python":
                row["vs_raw"] = row["host_us"] / raw
    print_rows("kernel launch: host time per launch (3 args)", rows)
    write_results("launch", rows, args.json)


if __name__ == "__main__":
    main()
