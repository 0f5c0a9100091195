"""Planned launches (gpurt/_launch/planned.py, _claunch_planned.c) on the fake driver of
test_launch_fake_driver.py, on both launch paths: a planned launch must hand the driver exactly
what the same launch through Kernel.__call__ would, check everything at plan time, and leave
what it does not take (hooks, values that do not pack, a wrong count) to the Python launch,
which explains it. The cuLaunchKernelEx structs of cluster and cooperative launches are checked
against cuda.bindings' own layout; plan keys (C and Python) are equal exactly when their items
are."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt
from _fakes import fake_gpus_fixture  # noqa: F401
from gpurt import array as garray
from gpurt._array.ownership import device_object
from gpurt._launch import kernel as glaunch
from gpurt._launch import path as _launchpath
from gpurt._launch import planned as gplanned
from gpurt._launch.config import launch_attributes
from test_launch_fake_driver import SOURCE, FakeDriver, axpy_bytes, fake  # noqa: F401

CONFIG = gpurt.LaunchConfig(4, 256)
ARGS = (0.5, 0x1000, 0x2000, 0x3000, 77)


@pytest.fixture
def planned_fake(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:  # noqa: F811
    monkeypatch.setattr(gplanned, "current_device", lambda: 0)
    return fake


def test_a_planned_launch_packs_what_a_launch_packs(planned_fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    planned = kernel.planned(CONFIG, *ARGS, varying=(1, 3), device=0)
    if _launchpath.pure_python:
        assert planned.__qualname__ == "python_launch.<locals>.launch"
    else:
        assert isinstance(planned, _launchpath.claunch.PlannedLaunch)
    planned(0x55, 0x10, 0x30)
    planned(None, None, 0x31)
    kernel(4, 256, (0.5, 0x10, 0x2000, 0x30, 77), stream=0x55)
    expected = [(b"axpy", (4, 1, 1), (256, 1, 1), 0, 0x55, axpy_bytes(0.5, 0x10, 0x2000, 0x30, 77)),
                (b"axpy", (4, 1, 1), (256, 1, 1), 0, None, axpy_bytes(0.5, 0, 0x2000, 0x31, 77))]
    assert planned_fake.launches == [*expected, expected[0]]


def test_scalars_vary_too(planned_fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    planned = kernel.planned(CONFIG, *ARGS, varying=(0, 4), device=0)
    planned(0, -2.25, 5)
    assert planned_fake.launches[-1][-1] == axpy_bytes(-2.25, 0x1000, 0x2000, 0x3000, 5)


def test_errors_are_raised_when_planning(planned_fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    with pytest.raises(TypeError, match=r"argument 4 \(n: int\)"):
        kernel.planned(CONFIG, 0.5, 1, 2, 3, "77", varying=(1,), device=0)
    with pytest.raises(ValueError, match="varying must be distinct argument positions"):
        kernel.planned(CONFIG, *ARGS, varying=(1, 5), device=0)
    with pytest.raises(ValueError, match="varying must be distinct"):
        kernel.planned(CONFIG, *ARGS, varying=(1, 1), device=0)
    assert planned_fake.launches == []


def test_what_does_not_pack_is_explained_by_the_python_launch(planned_fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    planned = kernel.planned(CONFIG, *ARGS, varying=(1, 4), device=0)
    with pytest.raises(TypeError, match=r"argument 4 \(n: int\)"):
        planned(0, 0x10, "5")
    with pytest.raises(OverflowError, match=r"argument 4 \(n: int\)"):
        planned(0, 0x10, 2**40)
    with pytest.raises(TypeError, match="takes"):
        planned(0, 0x10)
    assert planned_fake.launches == []


def test_launch_hooks_see_planned_launches(planned_fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    planned = kernel.planned(CONFIG, *ARGS, varying=(1,), device=0)
    seen: list[tuple[str, int, str]] = []

    def hook(k: Any, handle: int, phase: str) -> None:
        seen.append((k.name, handle, phase))

    gpurt.add_launch_hook(hook)
    try:
        planned(0x77, 0x10)
    finally:
        gpurt.remove_launch_hook(hook)
    assert seen == [("axpy", 0x77, "begin"), ("axpy", 0x77, "end")]
    assert planned_fake.launches[-1][-1] == axpy_bytes(0.5, 0x10, 0x2000, 0x3000, 77)


def test_another_thread_launches_the_same(planned_fake: FakeDriver) -> None:
    """A thread with no device state of its own yet takes the Python launch (which sets it
    up); the driver gets the same either way."""
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    planned = kernel.planned(CONFIG, *ARGS, varying=(2,), device=0)
    worker = threading.Thread(target=lambda: [planned(0x66, 0x20) for _ in range(2)])
    worker.start()
    worker.join()
    planned(0x66, 0x20)
    want = (b"axpy", (4, 1, 1), (256, 1, 1), 0, 0x66, axpy_bytes(0.5, 0x1000, 0x20, 0x3000, 77))
    assert planned_fake.launches == [want] * 3


def test_a_refused_launch_raises(planned_fake: FakeDriver) -> None:
    kernel = gpurt.compile(SOURCE, arch="sm_90")["axpy"]
    planned = kernel.planned(CONFIG, *ARGS, varying=(1,), device=0)
    planned_fake.result = cu.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(gpurt.CudaError, match="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        planned(0, 0x10)


# ---- cluster launches: cuLaunchKernelEx from C ----------------------------------------------

LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)


def _bindings_config(stream: int, count: int) -> bytes:
    """cuda.bindings' own CUlaunchConfig for a (6,1,1) x (128,1,1) launch with 2048 bytes of
    shared memory and ``count`` launch attributes, its attribute array replaced by 0."""
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 6, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
    config.sharedMemBytes = 2048
    config.hStream = cu.CUstream(stream)
    config.numAttrs = count
    raw = bytearray(ctypes.string_at(config.getPtr(), 56))
    raw[40:48] = bytes(8)
    return bytes(raw)


def _bindings_attributes(cluster: bool, cooperative: bool) -> bytes:
    """The CUlaunchAttribute array a cluster of (2,1,1) and / or a cooperative launch need,
    as cuda.bindings lays it out (gpurt/_launch/config.py's launch_attributes)."""
    config = gpurt.LaunchConfig(6, 128, 2048, cluster=(2, 1, 1) if cluster else None,
                                cooperative=cooperative)
    return b"".join(ctypes.string_at(a.getPtr(), 72)
                    for a in launch_attributes(config))


@pytest.mark.skipif(_launchpath.claunch is None, reason="the C extension is not built")
@pytest.mark.parametrize("cluster, cooperative", [(True, False), (False, True), (True, True)])
def test_extended_launches_pass_the_bindings_structs(monkeypatch: pytest.MonkeyPatch,
                                                     cluster: bool, cooperative: bool) -> None:
    """Clusters and cooperative launches go through cuLaunchKernelEx from C with the structs
    cuda.bindings would pass."""
    claunch = _launchpath.claunch
    monkeypatch.setattr(glaunch.THREAD, "index", 0, raising=False)  # device 0 bound here
    monkeypatch.setattr(glaunch.THREAD, "bound", 0, raising=False)
    fallback: list[Any] = []
    seen: list[tuple[bytes, bytes, int, bytes]] = []
    count = cluster + cooperative

    def launch_ex(config: int, function: int, params: int, extra: Any) -> int:
        raw = bytearray(ctypes.string_at(config, 56))
        attributes = int.from_bytes(raw[40:48], "little")
        raw[40:48] = bytes(8)
        pointer = ctypes.c_void_p.from_address(params).value or 0
        seen.append((bytes(raw), ctypes.string_at(attributes, 72 * count), function,
                     ctypes.string_at(pointer, 8)))
        return 0

    callback = LAUNCH_EX(launch_ex)
    address = ctypes.cast(callback, ctypes.c_void_p).value
    launcher = claunch.Launcher(1, 0xF00, glaunch._dims3)
    planned = claunch.PlannedLaunch(
        launcher, address, (6, 1, 1), (128, 1, 1), 2048, (2, 1, 1) if cluster else (1, 1, 1),
        gplanned._CLUSTER, bytes(8), (0,), ((0, "P", 8),), glaunch.THREAD, 0, [],
        fallback.append, print, gplanned._COOPERATIVE if cooperative else 0)
    planned(0x1234, 0xABC)
    assert fallback == []
    assert seen == [(_bindings_config(0x1234, count), _bindings_attributes(cluster, cooperative),
                     0xF00, (0xABC).to_bytes(8, "little"))]


@pytest.mark.skipif(_launchpath.claunch is None, reason="the C extension is not built")
@pytest.mark.parametrize("slots, message", [
    (((8, "P", 8),), "slot 0"), (((0, "s", 0),), "slot 0"), (((0, "x", 8),), "slot 0"),
    (((0, "i", 8),), "slot 0"), ((5,), "not \\(offset, code, size\\)"),
])
def test_planned_launch_construction_is_checked(slots: Any, message: str) -> None:
    claunch = _launchpath.claunch
    launcher = claunch.Launcher(1, 1, glaunch._dims3)
    with pytest.raises((TypeError, ValueError), match=message):
        claunch.PlannedLaunch(launcher, 0, (1, 1, 1), (1, 1, 1), 0, (1, 1, 1), 0, bytes(8),
                              (0,), slots, glaunch.THREAD, 0, [], print, print)
    with pytest.raises(ValueError, match="cuLaunchKernelEx"):
        claunch.PlannedLaunch(launcher, 0, (1, 1, 1), (1, 1, 1), 0, (2, 1, 1), 0, bytes(8),
                              (0,), (), glaunch.THREAD, 0, [], print, print)
    with pytest.raises(ValueError, match="cuLaunchKernelEx"):  # a cooperative launch too
        claunch.PlannedLaunch(launcher, 0, (1, 1, 1), (1, 1, 1), 0, (1, 1, 1), 0, bytes(8),
                              (0,), (), glaunch.THREAD, 0, [], print, print,
                              gplanned._COOPERATIVE)


# ---- plan keys --------------------------------------------------------------------------------


def _array(ptr: int = 0x1000, shape: tuple[int, ...] = (4, 8), strides: tuple[int, ...] = (32, 4),
           dtype: Any = np.float32, index: int = 0) -> gpurt.Array:
    """An Array over made-up memory (never read): what a plan key reads of it is metadata."""
    return garray._make(ptr, shape, strides, np.dtype(dtype), device_object(index), None,
                        None, True)


KEYS = [gplanned.plan_key, gplanned._python_plan_key]


@pytest.mark.parametrize("plan_key", KEYS)
def test_plan_keys_are_equal_exactly_when_the_items_are(plan_key: Any, fake_gpus: Any) -> None:
    base = (1, -1, _array(), None, _array(0x2000))
    assert plan_key(*base) == plan_key(1, -1, _array(0x3000), None, _array(0x4000))
    others = [
        (2, -1, _array(), None, _array(0x2000)),
        (1, 1, _array(), None, _array(0x2000)),
        (1, -1, _array(0x1004), None, _array(0x2000)),  # another alignment
        (1, -1, _array(shape=(8, 4), strides=(16, 4)), None, _array(0x2000)),
        (1, -1, _array(strides=(64, 4)), None, _array(0x2000)),
        (1, -1, _array(dtype=np.int32), None, _array(0x2000)),
        (1, -1, _array(index=1), None, _array(0x2000)),
        (1, -1, _array(), 0, _array(0x2000)),
        (1, -1, None, _array(), _array(0x2000)),
        (1, -1, _array(), None),
        (1, -1, _array(shape=(4, 8, 1), strides=(32, 4, 4)), None, _array(0x2000)),
    ]
    keys = [plan_key(*items) for items in [base, *others]]
    assert None not in keys and len(set(keys)) == len(keys)
    assert plan_key(_array(2**63 + 0x1000)) == plan_key(_array(0x1000))


@pytest.mark.parametrize("plan_key", KEYS)
def test_plan_keys_refuse_other_items(plan_key: Any, fake_gpus: Any) -> None:
    class Sub(gpurt.Array):
        __slots__ = ()

    sub = _array()
    sub.__class__ = Sub
    for item in (1.0, "a", (1,), sub, np.int64(3)):
        assert plan_key(1, item) is None


@pytest.mark.parametrize("keyed", [gplanned.plan_key_addresses,
                                   gplanned._python_plan_key_addresses])
def test_plan_key_addresses_match_plan_key(keyed: Any, fake_gpus: Any) -> None:
    """gemm's hot-path key: the plan key of the same items (C or Python alike) and each item's
    address, 0 for ints and None; None where an item is not keyable."""
    items = (_array(0x3008), _array(0x4000, (8, 4), (4, 32)), None, -1, True, 7)
    found = keyed(*items)
    assert found is not None
    key, addresses = found
    plain = gplanned.plan_key if keyed is gplanned.plan_key_addresses else \
        gplanned._python_plan_key
    assert key == plain(*items)
    assert addresses == (0x3008, 0x4000, 0, 0, 0, 0)
    assert keyed(_array(), 1.0) is None


def test_the_c_key_refuses_what_it_cannot_describe(fake_gpus: Any) -> None:
    if _launchpath.claunch is None:
        pytest.skip("the C extension is not built")
    many = _array(shape=(1,) * 200, strides=(4,) * 200)
    assert gplanned.plan_key(many) is None  # more words than it builds: keyed by the caller
    assert gplanned.plan_key(2**70) is None


# ---- the capture query of split-K's workspaces, from C --------------------------------------

IS_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))


@pytest.mark.skipif(_launchpath.claunch is None, reason="the C extension is not built")
def test_capture_status_calls_the_driver_function_it_is_given() -> None:
    seen: list[int] = []

    def is_capturing(stream: int, status: Any) -> int:
        seen.append(stream or 0)
        status[0] = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
        return 0

    callback = IS_CAPTURING(is_capturing)
    address = ctypes.cast(callback, ctypes.c_void_p).value
    assert _launchpath.claunch.capture_status(address, 0x5000) == (0, 1)
    assert seen == [0x5000]
    with pytest.raises(ValueError, match="cuStreamIsCapturing"):
        _launchpath.claunch.capture_status(0, 0x5000)


def test_stream_is_capturing_asks_the_bindings_without_the_c_query(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver without cuStreamIsCapturing's address for C (the query answers None): the
    bindings' call answers instead."""
    from gpurt._streams import handles

    asked: list[int] = []

    def bindings(handle: int) -> tuple[Any, Any]:
        asked.append(handle)
        return (cu.CUresult.CUDA_SUCCESS,
                cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE)

    monkeypatch.setattr(handles, "bind_context", lambda index: None)
    monkeypatch.setattr(handles, "_capture_status", lambda handle: None)
    monkeypatch.setattr(handles.cu, "cuStreamIsCapturing", bindings)
    assert handles.stream_is_capturing(0, 0x5000) is True
    assert asked == [0x5000]


@pytest.mark.parametrize("answer, capturing", [
    ((0, 0), False), ((0, 1), True), ((0, 2), True),
    ((int(cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), 0), True),
    ((int(cu.CUresult.CUDA_ERROR_INVALID_HANDLE), 0), None)])
def test_stream_is_capturing_reads_the_c_query(monkeypatch: pytest.MonkeyPatch, answer: Any,
                                               capturing: bool | None) -> None:
    """An int handle is asked through the registered C query: its status, the legacy stream's
    implicit capture counted as capturing, any other error raised as the bindings' would be."""
    from gpurt._core.driver import CudaError
    from gpurt._streams import handles

    monkeypatch.setattr(handles, "bind_context", lambda index: None)
    monkeypatch.setattr(handles, "_capture_status", lambda handle: answer)
    if capturing is None:
        with pytest.raises(CudaError, match="INVALID_HANDLE"):
            handles.stream_is_capturing(0, 0x5000)
    else:
        assert handles.stream_is_capturing(0, 0x5000) is capturing
