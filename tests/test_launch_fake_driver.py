"""gpurt._launch.kernel's host side on a fake driver: loading (and recompiling refused cache
entries), the generated launchers, error checks before a launch, dynamic shared memory and hooks.

Real kernels are compiled with NVRTC (explicit arch); only the driver calls are faked, so
this runs on any CPU. Every test runs on both launch paths: "compiled" (gpurt._launch._claunch calls
the fake cuLaunchKernel through its C address) and "python" (cuda.bindings' call, faked, as
with GPURT_PURE_PYTHON_LAUNCH=1). The GPU tests in test_launch.py run the same on the device."""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt
from _driver_calls import CLaunchKernel
from gpurt import nvrtc
from gpurt._launch import kernel as glaunch
from gpurt._launch import module as gmodule
from gpurt._launch import path as _launchpath
from gpurt._nvrtc import cache as _kcache

R = cu.CUresult
SOURCE = r"""
extern "C" __global__ void axpy(float a, const float* x, const float* y, float* out, int n) {}
extern "C" __global__ void __launch_bounds__(256) narrow(int* p) {}
"""
AXPY = struct.Struct("<f4xQQQi")  # the C layout of axpy's parameters
AXPY_SIZES = [4, 8, 8, 8, 4]
BAD_CODE = b"\x7fELF" + b"\x00" * 252  # a whole cache entry whose code the driver refuses


class FakeDriver:
    """Just enough of cuda.bindings.driver for loading and launching: a library is its code;
    code that starts like BAD_CODE is refused where ``refuse_at`` says ("load" at
    cuLibraryLoadData, "kernel" at cuLibraryGetKernel as lazy loading does); launches are
    checked like the driver does and recorded with their parameter bytes."""

    def __init__(self, sizes: dict[bytes, list[int]]) -> None:
        self.sizes = sizes  # kernel name -> its parameters' sizes
        self.names: dict[int, bytes] = {}  # CUfunction handle -> kernel name
        self.result = R.CUDA_SUCCESS  # what a launch that passes the checks returns
        self.refuse_at = "kernel"
        self.refuse_all = False
        self.loads: list[bytes] = []
        self.launches: list[tuple[Any, ...]] = []
        self.shared_limits: list[int] = []
        self.yield_in_launch = False
        self.launching_threads: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(cu, name)  # enums and types of the real bindings

    def _refused(self, code: bytes) -> bool:
        return self.refuse_all or code.startswith(BAD_CODE[:8])

    def cuLibraryLoadData(self, code: bytes, *rest: Any) -> tuple:
        self.loads.append(bytes(code))
        if self.refuse_at == "load" and self._refused(code):
            return (R.CUDA_ERROR_INVALID_IMAGE, None)
        return (R.CUDA_SUCCESS, ("library", bytes(code)))

    def cuLibraryUnload(self, library: Any) -> tuple:
        return (R.CUDA_SUCCESS,)

    def cuLibraryGetKernel(self, library: Any, name: bytes) -> tuple:
        if self.refuse_at == "kernel" and self._refused(library[1]):
            return (R.CUDA_ERROR_INVALID_IMAGE, None)
        if name not in (b"axpy", b"narrow"):
            return (R.CUDA_ERROR_NOT_FOUND, None)
        return (R.CUDA_SUCCESS, ("kernel", name))

    def cuKernelGetParamInfo(self, kernel: Any, index: int) -> tuple:
        return (R.CUDA_ERROR_NOT_SUPPORTED, 0, 0)  # an older driver: the computed layout

    def cuKernelGetFunction(self, kernel: Any) -> tuple:
        handle = 0x5000 + 0x100 * len(self.names)
        self.names[handle] = kernel[1]
        return (R.CUDA_SUCCESS, cu.CUfunction(handle))

    def cuFuncGetAttribute(self, attr: Any, function: Any) -> tuple:
        if attr == cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
            return (R.CUDA_SUCCESS, 256 if self.names[int(function)] == b"narrow" else 1024)
        limits = self.shared_limits or [48 * 1024]
        return (R.CUDA_SUCCESS, limits[-1])

    def cuFuncSetAttribute(self, function: Any, attr: Any, value: int) -> tuple:
        self.shared_limits.append(value)
        return (R.CUDA_SUCCESS,)

    def cuLaunchKernel(self, function: Any, gx: int, gy: int, gz: int, bx: int, by: int,
                       bz: int, shared_mem: int, stream: Any, params: int, extra: int) -> tuple:
        numbers = (gx, gy, gz, bx, by, bz, shared_mem)
        if not all(isinstance(n, int) for n in numbers):  # as the bindings' C conversions
            raise TypeError("an integer is required")
        if min(numbers) < 0:
            raise OverflowError("can't convert negative value to unsigned int")
        name = self.names[int(function)]  # a CUfunction, or its handle from the compiled path
        threads = bx * by * bz
        limit = 256 if name == b"narrow" else 1024
        too_big = bx > 1024 or by > 1024 or bz > 64 or gy > 65535 or gz > 65535
        if 0 in (gx, gy, gz) or threads == 0 or threads > limit or too_big:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if self.yield_in_launch:
            time.sleep(0)  # let other threads run between packing and reading the buffer
        if self.result != R.CUDA_SUCCESS:
            return (self.result,)
        sizes = self.sizes[name]
        pointers = (ctypes.c_void_p * len(sizes)).from_address(params)
        data = b"".join(ctypes.string_at(p, n) for p, n in zip(pointers, sizes))
        self.launches.append((name, (gx, gy, gz), (bx, by, bz), shared_mem, stream, data))
        self.launching_threads.append(threading.get_ident())
        return (R.CUDA_SUCCESS,)


_PYTHON_CALL = getattr(gpurt.Kernel.__call__, "__wrapped__", gpurt.Kernel.__call__)


@pytest.fixture(params=["compiled", "python"])
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
         tmp_path: Path) -> FakeDriver:
    """The fake driver in place of the real one, with device 0 current and bound, on the
    compiled launch path or the Python one."""
    driver = FakeDriver({b"axpy": AXPY_SIZES, b"narrow": [8]})
    if request.param == "compiled":
        if _launchpath.claunch is None:
            pytest.skip("the C extension gpurt._launch._claunch is not built")
        c_launch = CLaunchKernel(lambda *args: int(driver.cuLaunchKernel(*args)[0]))
        monkeypatch.setattr(_launchpath, "_found", (c_launch.address, "the fake driver"))
        monkeypatch.setattr(_launchpath, "pure_python", False)
    else:  # what GPURT_PURE_PYTHON_LAUNCH=1 makes of gpurt._launch.kernel at import
        monkeypatch.setattr(_launchpath, "pure_python", True)
        monkeypatch.setattr(gpurt.Kernel, "__call__", _PYTHON_CALL)
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GPURT_CACHE_DISABLE", raising=False)
    monkeypatch.setattr(glaunch, "cu", driver)
    monkeypatch.setattr(gmodule, "cu", driver)
    monkeypatch.setattr(glaunch, "_cuLaunchKernel", driver.cuLaunchKernel)
    monkeypatch.setattr(glaunch, "bind_context", lambda index: None)
    monkeypatch.setattr(glaunch, "current_device", lambda: 0)
    monkeypatch.setattr(glaunch, "_index", lambda device=None: 0)
    # as set_device(0) leaves this thread's state (gpurt/_core/state.py)
    monkeypatch.setattr(glaunch.THREAD, "index", 0, raising=False)
    monkeypatch.setattr(glaunch.THREAD, "bound", 0, raising=False)
    nvrtc.clear_cache()
    yield driver
    nvrtc.clear_cache()
    if request.param == "compiled":
        assert not c_launch.errors, c_launch.errors[0]


def axpy_bytes(a: float, x: int, y: int, out: int, n: int) -> bytes:
    return b"".join(AXPY.pack(a, x, y, out, n)[o: o + s]
                    for o, s in zip((0, 8, 16, 24, 32), AXPY_SIZES))


def test_launch_packs_the_arguments_it_is_given(fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    kernel(4, 256, (0.5, 0x1000, 0x2000, 0x3000, 77))
    kernel((4, 2), [32, 2], [1.5, None, np.uint64(0x20), 0x30, np.int32(5)], stream=0x1234)
    kernel((3, 1, 1), (64, 1, 1), (2.0, 1, 2, 3, 4))
    assert fake.launches == [
        (b"axpy", (4, 1, 1), (256, 1, 1), 0, None, axpy_bytes(0.5, 0x1000, 0x2000, 0x3000, 77)),
        (b"axpy", (4, 2, 1), (32, 2, 1), 0, 0x1234, axpy_bytes(1.5, 0, 0x20, 0x30, 5)),
        (b"axpy", (3, 1, 1), (64, 1, 1), 0, None, axpy_bytes(2.0, 1, 2, 3, 4)),
    ]
    assert kernel.pack(0.5, 0x1000, 0x2000, 0x3000, 77)[:4] == struct.pack("<f", 0.5)


def test_errors_are_raised_before_launch(fake: FakeDriver) -> None:
    module = gpurt.compile(SOURCE, arch="sm_90")
    kernel = module["axpy"]
    args = (1.0, 0x10, 0x20, 0x30, 8)
    bad = [
        (dict(args=(1.0, 0x10)), TypeError, r"takes 5 arguments \(float a, const float\* x"),
        (dict(args=np.zeros(5)), TypeError, "args must be a tuple"),
        (dict(args=(1.0, 0x10, 0x20, 0x30, 8.0)), TypeError, r"argument 4 \(n: int\)"),
        (dict(args=(1.0, np.zeros(3), 0x20, 0x30, 8)), TypeError, r"argument 1 \(x.*host"),
        (dict(args=(1.0, 0x10, 0x20, 0x30, 2**40)), OverflowError, r"argument 4 \(n: int\)"),
        (dict(block=2048), ValueError, "a block holds at most 1024 threads, got 2048"),
        (dict(block=(1, 1, 65)), ValueError, "block dimension z is at most 64"),
        (dict(grid=0), ValueError, "grid dimensions must be >= 1, got 0"),
        (dict(grid=-1), ValueError, "grid dimensions must be >= 1, got -1"),
        (dict(grid=(4.0, 1, 1)), TypeError, r"grid must be an int .*got \(4.0, 1, 1\)"),
        (dict(grid=True), TypeError, "got True"),
        (dict(shared_mem=1.5), TypeError, "shared_mem must be an int"),
        (dict(shared_mem=None), TypeError, "shared_mem must be an int"),
        (dict(shared_mem=-4), ValueError, "shared_mem must be >= 0"),
        (dict(stream="default"), TypeError, "expected a stream"),
    ]
    for change, kind, message in bad:
        call = dict(grid=1, block=32, args=args, **{"shared_mem": 0, "stream": None})
        call.update(change)
        with pytest.raises(kind, match=message):
            kernel(call["grid"], call["block"], call["args"], call["shared_mem"], call["stream"])
    with pytest.raises(ValueError, match=r"'narrow' runs at most 256 threads per block"):
        module["narrow"](1, 512, (0,))
    assert fake.launches == []  # nothing ran
    module["narrow"](1, 256, (0,))
    assert len(fake.launches) == 1


def test_dynamic_shared_memory_limit_only_grows(fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    args = (1.0, 0x10, 0x20, 0x30, 8)
    kernel(1, 32, args, shared_mem=np.int64(100_000))
    kernel(1, 32, args, shared_mem=60_000)
    kernel(1, 32, args, shared_mem=1000)
    kernel(1, 32, args, shared_mem=120_000)
    assert fake.shared_limits == [100_000, 120_000]  # raised when needed, never lowered
    assert [launch[3] for launch in fake.launches] == [100_000, 60_000, 1000, 120_000]
    assert all(type(launch[3]) is int for launch in fake.launches)


def test_hooks_run_around_the_driver_call_only(fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    seen: list[tuple[str, int, str]] = []

    def hook(k: Any, handle: int, phase: str) -> None:
        seen.append((k.name, handle, phase))

    gpurt.add_launch_hook(hook)
    try:
        kernel(2, 32, (1.0, 1, 2, 3, 4), stream=0x77)
        with pytest.raises(TypeError, match="argument 4"):
            kernel(2, 32, (1.0, 1, 2, 3, "4"))
        with pytest.raises(ValueError, match="1024 threads"):
            kernel(2, 2048, (1.0, 1, 2, 3, 4))
    finally:
        gpurt.remove_launch_hook(hook)
    # no hook ran for the argument error; the driver call that failed had both
    assert seen == [("axpy", 0x77, "begin"), ("axpy", 0x77, "end"),
                    ("axpy", 0, "begin"), ("axpy", 0, "end")]
    assert fake.launches == [(b"axpy", (2, 1, 1), (32, 1, 1), 0, 0x77,
                              axpy_bytes(1.0, 1, 2, 3, 4))]


def test_bound_method_hooks_are_removed(fake: FakeDriver) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.calls = 0

        def on_launch(self, kernel: Any, handle: int, phase: str) -> None:
            self.calls += 1

    recorder = Recorder()
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    gpurt.add_launch_hook(recorder.on_launch)
    kernel(1, 32, (1.0, 1, 2, 3, 4))
    gpurt.remove_launch_hook(recorder.on_launch)  # another bound-method object, equal
    kernel(1, 32, (1.0, 1, 2, 3, 4))
    assert recorder.calls == 2 and recorder.on_launch not in glaunch._hooks


def test_each_thread_packs_into_its_own_buffer(fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    kernel(1, 32, (0.0, 0, 0, 0, 0))  # loaded once, before the threads start
    fake.launches.clear()
    fake.launching_threads.clear()
    fake.yield_in_launch = True
    errors: list[BaseException] = []
    tags: dict[int, int] = {}
    alive = threading.Barrier(6)  # all alive at once: thread idents are unique meanwhile

    def run(tag: int) -> None:
        tags[threading.get_ident()] = tag
        try:
            alive.wait()
            for i in range(200):
                kernel(1, 32, (float(tag), tag, i, tag * 1000 + i, tag))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            alive.wait()

    threads = [threading.Thread(target=run, args=(tag,)) for tag in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert len(fake.launches) == 6 * 200
    for launch, ident in zip(fake.launches, fake.launching_threads):
        a, x, y, out, n = struct.unpack("<fQQQi", launch[5])
        assert a == x == n == tags[ident] and out == x * 1000 + y  # this thread's, whole


@pytest.mark.parametrize("refuse_at", ["load", "kernel"])
def test_refused_cache_entry_is_recompiled(fake: FakeDriver, tmp_path: Path,
                                           refuse_at: str) -> None:
    fake.refuse_at = refuse_at
    source = f"// {refuse_at}\n{SOURCE}"
    good = gpurt.compile(source, arch="sm_90").code
    [entry] = (tmp_path / "cache").glob("*.kernel")
    entry.write_bytes(_kcache.encode(entry.stem, _kcache.Entry(BAD_CODE, "cubin", {}, "")))
    nvrtc.clear_cache()
    module = gpurt.compile(source, arch="sm_90")
    assert module.code == BAD_CODE  # a whole entry: the cache cannot tell
    module["axpy"](1, 32, (1.0, 1, 2, 3, 4))
    assert module.code == good and fake.loads == [BAD_CODE, good]
    assert _kcache.decode(entry.stem, entry.read_bytes()).binary == good  # replaced on disk
    assert len(fake.launches) == 1
    module["narrow"](1, 32, (0,))  # the other kernel uses the fresh code at once
    assert fake.loads == [BAD_CODE, good]


def test_fresh_code_that_is_refused_is_not_recompiled(fake: FakeDriver) -> None:
    fake.refuse_all = True
    module = gpurt.compile("// refused\n" + SOURCE, arch="sm_90")
    with pytest.raises(gpurt.CudaError, match="compiled for sm_90, which this device cannot"):
        module["axpy"](1, 32, (1.0, 1, 2, 3, 4))
    assert len(fake.loads) == 1 and fake.launches == []


def test_a_missing_kernel_is_not_recompiled(fake: FakeDriver) -> None:
    source = "// missing\n" + SOURCE
    gpurt.compile(source, arch="sm_90")
    nvrtc.clear_cache()
    module = gpurt.compile(source, arch="sm_90")  # from the disk cache
    with pytest.raises(KeyError) as caught:
        module["other"]  # known from the cubin, before anything is loaded
    assert ("no kernel 'other' in this module; its kernels are: 'axpy', 'narrow'"
            in caught.value.args[0])
    assert fake.loads == []


@pytest.mark.parametrize("code, kind", [
    (R.CUDA_ERROR_ILLEGAL_ADDRESS, gpurt.CudaError),
    (R.CUDA_ERROR_OUT_OF_MEMORY, gpurt.OutOfMemoryError),
    (R.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, gpurt.CudaError),  # a block the kernel can run
])
def test_driver_errors_become_cuda_errors(fake: FakeDriver, code: Any, kind: type) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    fake.result = code
    with pytest.raises(kind) as raised:
        kernel(2, 32, (1.0, 1, 2, 3, 4))
    error = raised.value
    assert type(error) is kind and error.code == int(code) and error.name == code.name
    assert error.call == "cuLaunchKernel(axpy)" and fake.launches == []


def test_launch_path_and_loaded_launcher_agree(fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    kernel(1, 32, (1.0, 1, 2, 3, 4))
    path = glaunch.launch_path()
    loaded = kernel._loaded[0]
    assert loaded.compiled == (path["path"] == "compiled")
    if loaded.compiled:
        assert path["why"] == "the fake driver"
        assert type(loaded.launch) is _launchpath.claunch.PackingLauncher
        assert loaded.launch.launcher.function == int(loaded.function)
    else:
        assert path["why"] == "GPURT_PURE_PYTHON_LAUNCH is set"
        assert loaded.launch.__code__.co_filename.startswith("<gpurt cuda.bindings launcher")


def test_keyword_and_positional_calls_agree(fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    args = (1.0, 1, 2, 3, 4)
    kernel(1, 32, args, 64, 0x10)
    kernel(1, 32, args, shared_mem=64, stream=0x10)
    kernel(1, 32, args, stream=0x10, shared_mem=64)
    kernel(grid=1, block=32, args=args, shared_mem=64, stream=0x10)
    assert len(set(fake.launches)) == 1 and len(fake.launches) == 4
    with pytest.raises(TypeError, match="unexpected keyword argument 'streams'"):
        kernel(1, 32, args, streams=0x10)
    with pytest.raises(TypeError, match="multiple values for argument 'shared_mem'"):
        kernel(1, 32, args, 64, shared_mem=64)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'args'"):
        kernel(1, 32)
    assert len(fake.launches) == 4
