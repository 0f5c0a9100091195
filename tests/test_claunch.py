"""gpurt._launch._claunch, the compiled launch path (gpurt/_launch/_claunch*.c).

On the CPU its Launcher and PackingLauncher call a ctypes stand-in for cuLaunchKernel
(tests/_driver_calls.py), which must receive exactly what gpurt computed; what PackingLauncher
does not pack goes untouched to the Python launcher. Also here: finding cuLaunchKernel with
cuGetProcAddress, the fallbacks (no extension, GPURT_PURE_PYTHON_LAUNCH=1) and, where
GPURT_REQUIRE_CLAUNCH=1 (scripts/gpu-check sets it), a failure unless launches go through the
extension. The end-to-end launch tests of test_launch_fake_driver.py run on both paths."""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import struct
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu
from hypothesis import given
from hypothesis import strategies as st

import gpurt
from _driver_calls import CLaunchKernel
from gpurt._launch import kernel as glaunch
from gpurt._launch import path as _launchpath

_claunch = _launchpath.claunch
needs_claunch = pytest.mark.skipif(_claunch is None,
                                   reason="the C extension gpurt._launch._claunch is not built")
REQUIRED = os.environ.get("GPURT_REQUIRE_CLAUNCH", "") not in ("", "0")
SIZES = {"b": 1, "B": 1, "h": 2, "H": 2, "e": 2, "i": 4, "I": 4, "f": 4, "q": 8, "Q": 8,
         "d": 8, "P": 8}


class Driver:
    """A cuLaunchKernel that records its arguments (with the parameter bytes of ``layout``,
    read through the void* array it gets) and returns ``result``."""

    def __init__(self, layout: tuple[tuple[int, str], ...] = (), result: int = 0) -> None:
        self.layout = layout
        self.result = result
        self.calls: list[tuple[Any, ...]] = []
        self.values: list[list[bytes]] = []
        self.c = CLaunchKernel(self.record)

    def record(self, function: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
               shared_mem: int, stream: int | None, params: int, extra: int | None) -> int:
        self.calls.append((function, (gx, gy, gz), (bx, by, bz), shared_mem, stream, extra))
        if self.layout:
            pointers = (ctypes.c_void_p * len(self.layout)).from_address(params)
            starts = [p - pointers[0] for p in pointers]
            assert starts == [offset - self.layout[0][0] for offset, _ in self.layout]
            self.values.append([ctypes.string_at(p, SIZES[code])
                                for p, (_, code) in zip(pointers, self.layout)])
        else:
            self.values.append([params])
        return self.result


class Fallback:
    """The Python launcher's stand-in: records the calls PackingLauncher hands over."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


class Arr:
    """Stands in for gpurt.Array: PackingLauncher reads .ptr and .device.index."""

    def __init__(self, ptr: Any, index: int) -> None:
        self.ptr = ptr
        self.device = SimpleNamespace(index=index)


def packing(layout: tuple[tuple[int, str], ...], size: int, result: int = 0,
            hooks: list[Any] | None = None) -> tuple[Any, Driver, Fallback, list[tuple]]:
    driver, fallback, refused = Driver(layout, result), Fallback(), []
    launcher = _claunch.Launcher(driver.c.address, 0xF00, glaunch._dims3)
    launch = _claunch.PackingLauncher(launcher, size, layout, Arr, [] if hooks is None else hooks,
                                      fallback, lambda *a: refused.append(a))
    return launch, driver, fallback, refused


# ---- Launcher: the driver call -------------------------------------------------------------


@needs_claunch
def test_launcher_hands_the_driver_exactly_what_it_is_given():
    driver = Driver(result=7)
    launch = _claunch.Launcher(driver.c.address, 0x1234, glaunch._dims3)
    assert (launch.address, launch.function) == (driver.c.address, 0x1234)
    assert "0x1234" in repr(launch)
    assert launch(4, (2, 3, 4), 100, None, 0x5000) == 7
    assert launch([np.int64(5), 2], 8, 0, 0x77, 0x6000) == 7  # other forms go through dims
    assert launch(1, 1, 0, cu.CUstream(0x88), 0x7000) == 7  # a CUstream as its handle
    assert launch(2**32 - 1, (1024, 1, 1), 2**32 - 1, 2**64 - 1, 0x8000) == 7
    assert driver.calls == [
        (0x1234, (4, 1, 1), (2, 3, 4), 100, None, None),
        (0x1234, (5, 2, 1), (8, 1, 1), 0, 0x77, None),
        (0x1234, (1, 1, 1), (1, 1, 1), 0, 0x88, None),
        (0x1234, (2**32 - 1, 1, 1), (1024, 1, 1), 2**32 - 1, 2**64 - 1, None),
    ]
    assert driver.values == [[0x5000], [0x6000], [0x7000], [0x8000]]
    assert not driver.c.errors


@needs_claunch
@pytest.mark.parametrize("call, kind, message", [
    ((-1, 1, 0, None, 0), OverflowError, "negative"),
    ((2**32, 1, 0, None, 0), OverflowError, "too large"),
    ((1, (1, 1, 2**40), 0, None, 0), OverflowError, None),
    ((1, 1, 1.0, None, 0), TypeError, "integer"),
    ((1, 1, 0, "s", 0), TypeError, "'str'"),
    ((1, 1, 0, -5, 0), OverflowError, None),
    (((4.0, 1, 1), 1, 0, None, 0), TypeError, r"grid must be an int .*got \(4.0, 1, 1\)"),
    ((1, 2048, 0, None, 0), None, None),  # too big, but the driver is the one to say so
    ((1, 1, 0, None), TypeError, "5 positional arguments"),
])
def test_launcher_converts_like_the_bindings(call, kind, message):
    driver = Driver()
    launch = _claunch.Launcher(driver.c.address, 1, glaunch._dims3)
    if kind is None:
        assert launch(*call) == 0 and len(driver.calls) == 1
        return
    with pytest.raises(kind, match=message):
        launch(*call)
    assert driver.calls == []


@needs_claunch
def test_launcher_construction_is_checked():
    with pytest.raises(ValueError, match="must not be 0"):
        _claunch.Launcher(0, 1, glaunch._dims3)
    with pytest.raises(TypeError, match="callable"):
        _claunch.Launcher(1, 1, None)
    with pytest.raises(OverflowError):
        _claunch.Launcher(-1, 1, glaunch._dims3)
    with pytest.raises(TypeError):
        _claunch.Launcher(1.0, 1, glaunch._dims3)


# ---- PackingLauncher: packing plain arguments ------------------------------------------------


def _expected(code: str, value: Any) -> bytes | None:
    """What struct packs for ``value`` ("P": a pointer as gpurt takes it), None for an error."""
    if code == "P":
        if value is None:
            return bytes(8)
        if type(value) is not int or not 0 <= value < 2**64:
            return None
        code = "Q"
    try:
        return struct.pack("<" + code, value)
    except (struct.error, OverflowError, TypeError, ValueError):
        return None


_VALUES = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.none(), st.text(max_size=2))


@needs_claunch
@given(code=st.sampled_from(sorted(SIZES)), value=_VALUES)
def test_packing_matches_struct(code, value):
    launch, driver, fallback, _ = packing(((0, code),), SIZES[code])
    launch(1, 32, (value,), 0, 0, 0)
    expected = _expected(code, value)
    if expected is None:  # the Python launcher converts it or says what is wrong
        assert driver.calls == [] and fallback.calls == [(1, 32, (value,), 0, 0, 0)]
    else:
        assert fallback.calls == [] and driver.values == [[expected]]
    assert not driver.c.errors


@needs_claunch
@pytest.mark.parametrize("code, value", [
    ("i", np.int32(-5)), ("Q", np.uint64(2**63)), ("b", np.int8(-3)), ("f", np.float32(0.1)),
    ("d", np.float64(1e300)), ("e", np.float16(0.333)), ("f", 3), ("d", 2**60), ("e", 65504.0),
    ("i", True), ("f", float("nan")), ("f", -0.0), ("f", 1e-45),
])
def test_packing_takes_what_struct_takes(code, value):
    launch, driver, fallback, _ = packing(((0, code),), SIZES[code])
    launch(1, 32, (value,), 0, 0, 0)
    assert fallback.calls == [] and driver.values == [[struct.pack("<" + code, value)]]


@needs_claunch
def test_packing_lays_out_every_parameter_at_its_offset():
    layout = ((0, "b"), (8, "d"), (16, "P"), (24, "h"), (28, "f"), (32, "P"), (40, "e"))
    launch, driver, fallback, _ = packing(layout, 42)
    args = (-3, 2.5, 0x7F0012345678, -2, 0.1, None, 1.5)
    launch((4, 2, 1), (64, 2, 1), args, 512, 0x99, 0)
    assert fallback.calls == []
    assert driver.calls == [(0xF00, (4, 2, 1), (64, 2, 1), 512, 0x99, None)]
    codes = {"P": "Q"}
    assert driver.values == [[struct.pack("<" + codes.get(c, c), 0 if v is None else v)
                              for (_, c), v in zip(layout, args)]]
    launch(1, 1, (), 0, 0, 0)  # a wrong number of arguments is the Python launcher's to report
    assert fallback.calls == [(1, 1, (), 0, 0, 0)] and len(driver.calls) == 1


@needs_claunch
def test_packing_takes_arrays_on_the_launch_device_only():
    launch, driver, fallback, _ = packing(((0, "P"), (8, "P")), 16)
    launch(1, 32, (Arr(0x1000, 2), Arr(0x2000, 2)), 0, 0, 2)
    assert driver.values == [[struct.pack("<Q", 0x1000), struct.pack("<Q", 0x2000)]]
    elsewhere = (Arr(0x1000, 2), Arr(0x2000, 3))  # the Python launcher raises for this one
    launch(1, 32, elsewhere, 0, 0, 2)
    assert fallback.calls == [(1, 32, elsewhere, 0, 0, 2)] and len(driver.calls) == 1
    broken = (Arr("0x1000", 2), Arr(0x2000, 2))  # a .ptr that is no int: left to Python too
    launch(1, 32, broken, 0, 0, 2)
    assert len(fallback.calls) == 2 and len(driver.calls) == 1


def gpurt_array(ptr: int | None, index: int) -> gpurt.Array:
    """A gpurt.Array that only has its ptr and device (made without a GPU)."""
    array = gpurt.Array.__new__(gpurt.Array)
    device = gpurt.Device.__new__(gpurt.Device)
    device.index = index
    if ptr is not None:
        array.ptr = ptr
    array.device = device
    return array


@needs_claunch
def test_packing_reads_gpurt_arrays_slots():
    driver, fallback = Driver(((0, "P"), (8, "P"))), Fallback()
    launcher = _claunch.Launcher(driver.c.address, 1, glaunch._dims3)
    launch = _claunch.PackingLauncher(launcher, 16, ((0, "P"), (8, "P")), gpurt.Array, [],
                                      fallback, print)
    launch(1, 1, (gpurt_array(0x1000, 1), gpurt_array(0x2000, 1)), 0, 0, 1)
    assert driver.values == [[struct.pack("<Q", 0x1000), struct.pack("<Q", 0x2000)]]

    class OtherDevice:  # a device of another type: read through getattr
        index = 1

    odd = gpurt_array(0x3000, 1)
    odd.device = OtherDevice()
    launch(1, 1, (odd, None), 0, 0, 1)
    assert driver.values[1] == [struct.pack("<Q", 0x3000), bytes(8)]
    no_ptr, elsewhere = (gpurt_array(None, 1), None), (gpurt_array(0x4000, 0), None)
    launch(1, 1, no_ptr, 0, 0, 1)
    launch(1, 1, elsewhere, 0, 0, 1)
    launch(1, 1, (gpurt_array(0x5000, 1), None), 0, 0, 1)  # back to gpurt's Device
    assert [call[2] for call in fallback.calls] == [no_ptr, elsewhere]
    assert driver.values[2] == [struct.pack("<Q", 0x5000), bytes(8)]


class Foreign:
    """An array of another library (``__cuda_array_interface__``)."""

    def __init__(self) -> None:
        self.__cuda_array_interface__ = {"data": (0x3000, False), "shape": (1,),
                                         "typestr": "<f4", "version": 3}


@needs_claunch
@pytest.mark.parametrize("call", [
    ([1], 32, (0x10, 5), 0, 0, 0),  # grid and block other than ints and 3-tuples of ints
    ((1, 1), 32, (0x10, 5), 0, 0, 0),
    (np.int64(1), 32, (0x10, 5), 0, 0, 0),
    ((1, 1, 1.0), 32, (0x10, 5), 0, 0, 0),
    (-1, 32, (0x10, 5), 0, 0, 0),
    (1, 2**32, (0x10, 5), 0, 0, 0),
    (1, 32, [0x10, 5], 0, 0, 0),  # a list of arguments
    (1, 32, (0x10, 5, 6), 0, 0, 0),
    (1, 32, (Foreign(), 5), 0, 0, 0),  # pointers other than ints, None and gpurt Arrays
    (1, 32, (np.uint64(0x10), 5), 0, 0, 0),
    (1, 32, (True, 5), 0, 0, 0),
    (1, 32, (-16, 5), 0, 0, 0),
    (1, 32, (np.zeros(2), 5), 0, 0, 0),
    (1, 32, (0x10, 5.5), 0, 0, 0),  # values struct would refuse
    (1, 32, (0x10, 2**31), 0, 0, 0),
    (1, 32, (0x10, "5"), 0, 0, 0),
    (1, 32, (0x10, 5), None, 0, 0),  # shared_mem and stream that are not plain
    (1, 32, (0x10, 5), 1.0, 0, 0),
    (1, 32, (0x10, 5), -1, 0, 0),
    (1, 32, (0x10, 5), 0, "stream", 0),
    (1, 32, (0x10, 5), 0, 0, "0"),
])
def test_packing_leaves_everything_else_to_the_python_launcher(call):
    launch, driver, fallback, _ = packing(((0, "P"), (8, "i")), 12)
    launch(*call)
    assert driver.calls == [] and len(fallback.calls) == 1
    assert all(a is b for a, b in zip(fallback.calls[0], call))  # handed over untouched


@needs_claunch
def test_packing_hands_launches_with_hooks_to_the_python_launcher():
    hooks: list[Any] = []
    launch, driver, fallback, _ = packing(((0, "i"),), 4, hooks=hooks)
    hooks.append(print)  # the list is shared: a hook registered later counts at once
    launch(1, 1, (5,), 0, 0, 0)
    hooks.clear()
    launch(1, 1, (5,), 0, 0, 0)
    assert len(fallback.calls) == 1 and len(driver.calls) == 1


@needs_claunch
def test_packing_sends_a_failed_result_to_refused():
    launch, driver, fallback, refused = packing(((0, "i"),), 4, result=701)
    assert launch((2, 1, 1), 2048, (5,), 64, 0, 0) is None  # the stand-in does not raise
    assert refused == [(701, (2, 1, 1), 2048, 64)] and fallback.calls == []

    def refuse(code: int, *rest: Any) -> None:
        raise gpurt.CudaError(code, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out")

    launcher = _claunch.Launcher(driver.c.address, 1, glaunch._dims3)
    raising = _claunch.PackingLauncher(launcher, 4, ((0, "i"),), Arr, [], fallback, refuse)
    with pytest.raises(gpurt.CudaError, match="CUDA_ERROR_LAUNCH_TIMEOUT") as error:
        raising(1, 1, (5,), 0, 0, 0)
    assert error.value.code == 701


@needs_claunch
@pytest.mark.parametrize("size, layout, message", [
    (4, ((0, "x"),), "code of bBhHiIqQefdP"),
    (4, ((2, "i"),), "inside 4 bytes"),
    (4, ((0, "ii"),), "code of"),
    (4, ((-1, "b"),), "inside"),
    (8192, (), "at most"),
    (4, ("i",), r"not an \(offset, code\) tuple"),
])
def test_packing_construction_is_checked(size, layout, message):
    launcher = _claunch.Launcher(1, 1, glaunch._dims3)
    with pytest.raises((ValueError, TypeError), match=message):
        _claunch.PackingLauncher(launcher, size, layout, Arr, [], print, print)


# ---- KernelCall: Kernel.__call__ -------------------------------------------------------------


@needs_claunch
def test_kernel_call_reads_as_the_python_method():
    call = gpurt.Kernel.__dict__["__call__"]
    if os.environ.get("GPURT_PURE_PYTHON_LAUNCH", "") not in ("", "0"):
        assert inspect.isfunction(call)
        return
    python = call.__wrapped__
    assert type(call) is _claunch.KernelCall and inspect.isfunction(python)
    assert call.__doc__ == python.__doc__ and "cuLaunchKernel" in call.__doc__
    assert inspect.signature(gpurt.Kernel.__call__) == inspect.signature(python)
    kernel = gpurt.compile('extern "C" __global__ void k(int n) {}', arch="sm_90")["k"]
    bound = kernel.__call__
    assert bound.__self__ is kernel and bound.__func__ is call


# ---- finding cuLaunchKernel --------------------------------------------------------------------


class ProcAddress:
    """Just cuGetProcAddress of cuda.bindings, recording what it is asked."""

    def __init__(self, result: tuple) -> None:
        self.result = result
        self.asked: list[tuple] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(cu, name)

    def cuGetProcAddress(self, symbol: bytes, version: int, flags: Any) -> tuple:
        self.asked.append((symbol, version, flags))
        return self.result


@pytest.mark.parametrize("per_thread, version, flag", [
    (None, 4000, "CU_GET_PROC_ADDRESS_LEGACY_STREAM"),
    ("0", 4000, "CU_GET_PROC_ADDRESS_LEGACY_STREAM"),
    ("1", 7000, "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM"),
    ("x", 4000, "CU_GET_PROC_ADDRESS_LEGACY_STREAM"),
])
def test_cu_launch_kernel_is_found_as_cuda_bindings_finds_it(monkeypatch, per_thread, version,
                                                            flag):
    found = cu.CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SUCCESS
    driver = ProcAddress((cu.CUresult.CUDA_SUCCESS, 0x7F00DEAD0000, found))
    monkeypatch.setattr(_launchpath, "cu", driver)
    monkeypatch.setattr(_launchpath, "init", lambda: None)
    monkeypatch.setattr(_launchpath, "_found", None)
    if per_thread is None:
        monkeypatch.delenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    else:
        monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", per_thread)
    why = "gpurt._launch._claunch calls cuLaunchKernel at 0x7f00dead0000"
    assert _launchpath.find_launch_kernel() == (0x7F00DEAD0000, why)
    assert _launchpath.find_launch_kernel()[0] == 0x7F00DEAD0000  # looked up once
    assert driver.asked == [(b"cuLaunchKernel", version, getattr(cu.CUdriverProcAddress_flags,
                                                                 flag))]


@pytest.mark.parametrize("result, why", [
    ((cu.CUresult.CUDA_ERROR_INVALID_VALUE, 0, None), "CUDA_ERROR_INVALID_VALUE"),
    ((cu.CUresult.CUDA_SUCCESS, 0, None), "found no cuLaunchKernel"),
])
def test_without_cu_launch_kernel_launches_take_the_python_path(monkeypatch, result, why):
    monkeypatch.setattr(_launchpath, "cu", ProcAddress(result))
    monkeypatch.setattr(_launchpath, "init", lambda: None)
    monkeypatch.setattr(_launchpath, "_found", None)
    monkeypatch.setattr(_launchpath, "pure_python", False)
    if _claunch is None:
        assert glaunch.launch_path()["path"] == "python"
        return
    path = glaunch.launch_path()
    assert path["path"] == "python" and why in path["why"]


_PATH_OF_A_FRESH_PROCESS = """\
import sys
if sys.argv[1] == "block":
    sys.modules["gpurt._launch._claunch"] = None  # as if it had not been built
import inspect, json, gpurt
from gpurt._launch import kernel as launch
print(json.dumps([launch.launch_path(), inspect.isfunction(gpurt.Kernel.__dict__["__call__"])]))
"""


@pytest.mark.parametrize("how", ["env", "block"])
def test_python_path_without_the_extension_or_when_asked(how):
    env = dict(os.environ)
    env.pop("GPURT_PURE_PYTHON_LAUNCH", None)
    if how == "env":
        env["GPURT_PURE_PYTHON_LAUNCH"] = "1"
    out = subprocess.run([sys.executable, "-c", _PATH_OF_A_FRESH_PROCESS, how], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    path, python_call = json.loads(out.stdout)
    assert path["path"] == "python" and python_call  # Kernel.__call__ is the Python function
    expected = "GPURT_PURE_PYTHON_LAUNCH is set" if how == "env" else "is not built"
    assert expected in path["why"]


# ---- where the compiled path is required -------------------------------------------------------


@pytest.mark.skipif(not REQUIRED, reason="GPURT_REQUIRE_CLAUNCH is not set (gpu-check sets it)")
def test_compiled_path_is_in_use_where_required():
    assert _claunch is not None, _launchpath._not_built
    assert type(gpurt.Kernel.__dict__["__call__"]) is _claunch.KernelCall
    assert glaunch.launch_path()["path"] == "compiled", glaunch.launch_path()


AXPY = r"""
extern "C" __global__ void axpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


@pytest.mark.gpu
def test_both_launch_paths_on_the_gpu(monkeypatch, gpu_state):
    n = 5001
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    expected = np.float32(0.5).astype(np.float64) * x + y
    dx, dy = gpurt.asarray(x), gpurt.asarray(y)
    kernels = {}
    for path in ("compiled", "python"):
        monkeypatch.setattr(_launchpath, "pure_python", path == "python")
        kernel = gpurt.compile(f"// {path}\n{AXPY}")["axpy"]
        plain, other = (gpurt.asarray(np.full(n, np.nan, np.float32)) for _ in range(2))
        kernel((n + 255) // 256, 256, (0.5, dx, dy, plain, n))
        kernel(((n + 127) // 128, 1, 1), [128], [0.5, dx.ptr, dy, other, np.int32(n)],
               stream=gpurt.current_stream())  # the Python launcher's share of the work
        for out in (plain, other):
            np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-6, atol=1e-6)
        kernels[path] = kernel._loaded[gpurt.current_device()]
    compiled, python = kernels["compiled"], kernels["python"]
    assert not python.compiled
    if _claunch is not None or REQUIRED:
        assert compiled.compiled and type(compiled.launch) is _claunch.PackingLauncher
    monkeypatch.setattr(_launchpath, "pure_python", False)
    refused = gpurt.compile(f"// refused\n{AXPY}")["axpy"]
    with pytest.raises(ValueError, match="at most 1024 threads"):  # the driver refuses it
        refused(1, 2048, (0.5, dx, dy, dx, n))
    assert refused._loaded[gpurt.current_device()].compiled == compiled.compiled
