"""Devices (gpurt/device.py): index parsing, the per-thread current device, the ``device``
context managers, properties (checked against torch and CuPy where installed) and NVML."""

from __future__ import annotations

import dataclasses
import importlib
import operator
import re
import types
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt

# the fake_* fixtures are used by name
from _fakes import FakeContexts, fake_gpus_fixture  # noqa: F401
from _threads import in_thread
from gpurt._core import state
from gpurt._core.driver import CudaUnavailableError, check

dev = importlib.import_module("gpurt.device")  # gpurt.device is the context manager
NO_DRIVER = pytest.mark.skipif(gpurt.is_available(), reason="checks behaviour without a driver")
MiB = 1 << 20

# every public name of gpurt.device and the test(s) that exercise it on the real driver
COVERED = {
    "Device": "test_gpu_public_functions",
    "DeviceProperties": "test_gpu_properties_are_sane",
    "is_available": "test_gpu_public_functions",
    "is_initialized": "test_gpu_public_functions",
    "init": "test_gpu_public_functions",
    "device_count": "test_gpu_public_functions",
    "current_device": "test_gpu_current_device_is_per_thread",
    "set_device": "test_gpu_current_device_is_per_thread",
    "device": "test_gpu_device_context_restores",
    "device_of": "test_gpu_device_context_restores",
    "get_device_name": "test_gpu_public_functions",
    "get_device_capability": "test_gpu_public_functions",
    "get_device_properties": "test_gpu_properties_match_torch",
    "get_arch": "test_gpu_public_functions",
    "synchronize": "test_gpu_public_functions",
    "mem_get_info": "test_gpu_mem_get_info",
    "can_device_access_peer": "test_gpu_public_functions",
    "enable_peer_access": "test_gpu_public_functions",  # with 2+ GPUs: tests/test_peer.py
    "utilization": "test_gpu_nvml_readings",
    "temperature": "test_gpu_nvml_readings",
    "power_draw": "test_gpu_nvml_readings",
    "clock_rate": "test_gpu_nvml_readings",
    "memory_usage": "test_gpu_nvml_readings",
    "device_memory_used": "test_memory_used_and_processes_match_torch",
    "list_gpu_processes": "test_memory_used_and_processes_match_torch",
    "is_bf16_supported": "test_bf16_tf32_and_arch_match_torch",
    "is_tf32_supported": "test_bf16_tf32_and_arch_match_torch",
}


def test_every_public_name_has_a_gpu_test() -> None:
    assert set(COVERED) == set(dev.__all__)
    for test in set(COVERED.values()):
        assert callable(globals()[test]), test


# ================================ CPU ================================


@pytest.mark.parametrize(
    "bad, error",
    [
        ("cpu", ValueError), ("cuda:x", ValueError), ("cuda:-1", ValueError),
        ("CUDA:0", ValueError), ("cuda:0:1", ValueError), (" cuda:0", ValueError),
        (True, TypeError), (1.0, TypeError), ([0], TypeError),
        (types.SimpleNamespace(type="cpu", index=0), TypeError),
    ],
)
def test_bad_device_specs_fail_before_touching_the_driver(bad: Any, error: type) -> None:
    with pytest.raises(error):
        dev._index(bad)


@NO_DRIVER
def test_valid_specs_need_the_driver() -> None:
    for spec in (0, "cuda", "cuda:0", None):
        with pytest.raises(CudaUnavailableError, match="no NVIDIA driver"):
            dev._index(spec)


def test_index_parsing(fake_gpus: FakeContexts) -> None:
    torch_like = types.SimpleNamespace(type="cuda", index=1)
    assert [dev._index(x) for x in (None, 0, 1, "cuda", "cuda:1", gpurt.Device(1), torch_like)] \
        == [0, 0, 1, 0, 1, 1, 1]
    gpurt.set_device(1)
    assert dev._index(None) == dev._index("cuda") == 1
    assert dev._index(types.SimpleNamespace(type="cuda", index=None)) == 1
    for bad in (2, -1, "cuda:2", types.SimpleNamespace(type="cuda", index=5)):
        with pytest.raises(ValueError, match=r"valid devices are 0\.\.1"):
            dev._index(bad)


def test_device_object(fake_gpus: FakeContexts) -> None:
    d = gpurt.Device("cuda:1")
    assert d == gpurt.Device(1) and d != gpurt.Device(0) and hash(d) == hash(gpurt.Device(1))
    assert repr(d) == "device(type='cuda', index=1)" and str(d) == "cuda:1"
    assert d.type == "cuda" and operator.index(d) == 1 and [10, 11][d] == 11
    assert gpurt.Device().index == 0
    assert d != "cuda:1"


def test_current_device_is_per_thread(fake_gpus: FakeContexts) -> None:
    gpurt.set_device(1)
    assert gpurt.current_device() == 1 and fake_gpus.bound == 1

    def other() -> tuple[int, int, int | None]:
        first = gpurt.current_device()  # a new thread starts on device 0, like the runtime
        gpurt.set_device(1)
        gpurt.set_device(0)
        return first, gpurt.current_device(), fake_gpus.bound

    assert in_thread(other) == (0, 0, 0)
    assert gpurt.current_device() == 1 and fake_gpus.bound == 1


def test_the_place_is_per_thread_and_goes_with_the_current_device(
        fake_gpus: FakeContexts) -> None:
    """The per-thread record the layers above keep (gpurt/_array/ownership.py's place) is
    dropped whenever the current device is set, also to the same device."""
    assert state.current_place() is None
    state.remember_place(("place", 0))
    assert state.current_place() == ("place", 0)
    assert in_thread(state.current_place) is None  # each thread has its own
    with gpurt.device(0):  # the device is already current: nothing changes
        assert state.current_place() == ("place", 0)
    with gpurt.device(1):
        assert state.current_place() is None
        state.remember_place(("place", 1))
    assert state.current_place() is None  # the device was set back
    state.remember_place(("place", 0))
    gpurt.set_device(0)
    assert state.current_place() is None
    state.forget_place()  # idempotent
    assert state.current_place() is None


def test_device_context_restores_on_exception_and_nests(fake_gpus: FakeContexts) -> None:
    with gpurt.device(1):
        assert gpurt.current_device() == 1
        with gpurt.device("cuda:0"):
            assert gpurt.current_device() == 0 and fake_gpus.bound == 0
        assert gpurt.current_device() == 1 and fake_gpus.bound == 1
    assert gpurt.current_device() == 0
    with pytest.raises(LookupError), gpurt.device(1):
        raise LookupError("boom")
    assert gpurt.current_device() == 0 and fake_gpus.bound == 0
    with gpurt.device(None):
        assert gpurt.current_device() == 0
    ctx = gpurt.device(1)
    with ctx:
        assert in_thread(gpurt.current_device) == 0  # other threads are unaffected
    assert gpurt.current_device() == 0


def test_device_of(fake_gpus: FakeContexts) -> None:
    on_gpu = types.SimpleNamespace(device=gpurt.Device(1))
    with gpurt.device_of(on_gpu):
        assert gpurt.current_device() == 1
    with gpurt.device_of(types.SimpleNamespace(device="cuda:1")):
        assert gpurt.current_device() == 1
    for host in (np.zeros(3), object(), types.SimpleNamespace(device="cpu"),
                 types.SimpleNamespace(device=types.SimpleNamespace(type="cpu", index=None))):
        with gpurt.device_of(host):
            assert gpurt.current_device() == 0
    assert gpurt.current_device() == 0


def test_device_properties_type() -> None:
    names = [field.name for field in dataclasses.fields(gpurt.DeviceProperties)]
    torch_names = {
        "name", "major", "minor", "total_memory", "multi_processor_count",
        "max_threads_per_multi_processor", "warp_size", "regs_per_multiprocessor",
        "shared_memory_per_block", "shared_memory_per_block_optin",
        "shared_memory_per_multiprocessor", "L2_cache_size", "uuid", "pci_bus_id",
        "pci_device_id", "pci_domain_id", "is_integrated", "is_multi_gpu_board",
        "clock_rate", "memory_clock_rate", "memory_bus_width", "max_threads_per_block",
    }
    assert torch_names <= set(names)
    values = {name: (1 if field.type in (int, "int") else "x") for name, field in
              ((f.name, f) for f in dataclasses.fields(gpurt.DeviceProperties))}
    props = gpurt.DeviceProperties(**values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        props.major = 9  # type: ignore[misc]
    assert repr(props).startswith("DeviceProperties(name=")


@NO_DRIVER
def test_nvml_readings_without_a_driver_raise_clearly() -> None:
    for reading in (gpurt.utilization, gpurt.temperature, gpurt.power_draw,
                    gpurt.clock_rate, gpurt.memory_usage):
        with pytest.raises(CudaUnavailableError):
            reading()


# ================================ GPU ================================

gpu = pytest.mark.usefixtures("gpu_state")


@pytest.mark.gpu
@gpu
def test_gpu_public_functions() -> None:
    gpurt.init()
    gpurt.init()
    assert gpurt.is_available() and gpurt.is_initialized()
    count = gpurt.device_count()
    assert count >= 1
    props = gpurt.get_device_properties(0)
    assert gpurt.Device(0).properties is props is gpurt.get_device_properties("cuda:0")
    assert gpurt.get_device_name() == props.name and props.name
    assert gpurt.get_device_capability(0) == (props.major, props.minor) and props.major >= 5
    assert gpurt.get_arch() == f"sm_{props.major}{props.minor}"
    gpurt.synchronize()
    gpurt.synchronize("cuda:0")
    assert gpurt.can_device_access_peer(0, 0) is False
    assert gpurt.enable_peer_access(0, 0) is False  # a device is not its own peer
    if count >= 2:
        assert isinstance(gpurt.can_device_access_peer(0, 1), bool)
        assert gpurt.enable_peer_access(0, 1) is gpurt.can_device_access_peer(0, 1)


@pytest.mark.gpu
@gpu
def test_gpu_properties_are_sane() -> None:
    props = gpurt.get_device_properties()
    assert isinstance(props, gpurt.DeviceProperties)
    assert props.total_memory > 1024 * MiB and props.warp_size == 32
    assert props.multi_processor_count > 0 and props.L2_cache_size > 0
    assert props.max_threads_per_block == 1024 and props.shared_memory_per_block == 48 * 1024
    assert props.shared_memory_per_block_optin >= props.shared_memory_per_block
    assert len(props.uuid) == 36 and props.uuid.count("-") == 4
    assert props.clock_rate > 0 and props.memory_bus_width > 0
    assert isinstance(props.is_integrated, bool)


def _normal_uuid(value: Any) -> str:
    text = value.hex() if isinstance(value, (bytes, bytearray)) else str(value)
    return text.lower().removeprefix("gpu-").replace("-", "")


@pytest.mark.gpu
@gpu
def test_gpu_properties_match_torch() -> None:
    torch = pytest.importorskip("torch")
    ours = gpurt.get_device_properties(0)
    theirs = torch.cuda.get_device_properties(0)
    compared = []
    for field in dataclasses.fields(ours):
        if field.name in ("uuid", "index") or not hasattr(theirs, field.name):
            continue
        assert getattr(ours, field.name) == getattr(theirs, field.name), field.name
        compared.append(field.name)
    assert len(compared) >= 12, compared
    if hasattr(theirs, "uuid"):
        assert _normal_uuid(ours.uuid) == _normal_uuid(theirs.uuid)
    assert gpurt.device_count() == torch.cuda.device_count()
    assert gpurt.get_device_capability(0) == torch.cuda.get_device_capability(0)
    assert gpurt.get_device_name(0) == torch.cuda.get_device_name(0)


CUPY_KEYS = {
    "total_memory": "totalGlobalMem", "major": "major", "minor": "minor",
    "multi_processor_count": "multiProcessorCount",
    "max_threads_per_multi_processor": "maxThreadsPerMultiProcessor",
    "max_threads_per_block": "maxThreadsPerBlock", "warp_size": "warpSize",
    "regs_per_multiprocessor": "regsPerMultiprocessor", "regs_per_block": "regsPerBlock",
    "shared_memory_per_block": "sharedMemPerBlock",
    "shared_memory_per_block_optin": "sharedMemPerBlockOptin",
    "shared_memory_per_multiprocessor": "sharedMemPerMultiprocessor",
    "L2_cache_size": "l2CacheSize", "persisting_l2_cache_max_size": "persistingL2CacheMaxSize",
    "pci_bus_id": "pciBusID", "pci_device_id": "pciDeviceID", "pci_domain_id": "pciDomainID",
    "is_integrated": "integrated", "is_multi_gpu_board": "isMultiGpuBoard",
    "clock_rate": "clockRate", "memory_clock_rate": "memoryClockRate",
    "memory_bus_width": "memoryBusWidth", "async_engine_count": "asyncEngineCount",
    "concurrent_kernels": "concurrentKernels", "cooperative_launch": "cooperativeLaunch",
    "max_blocks_per_multi_processor": "maxBlocksPerMultiProcessor",
    "unified_addressing": "unifiedAddressing", "memory_pools_supported": "memoryPoolsSupported",
}


@pytest.mark.gpu
@gpu
def test_gpu_properties_match_cupy() -> None:
    cupy = pytest.importorskip("cupy")
    ours = gpurt.get_device_properties(0)
    theirs = cupy.cuda.runtime.getDeviceProperties(0)
    compared = []
    for field, key in CUPY_KEYS.items():
        if key in theirs:
            assert getattr(ours, field) == theirs[key], (field, key)
            compared.append(field)
    assert len(compared) >= 12, compared
    name = theirs["name"]
    assert ours.name == (name.decode() if isinstance(name, bytes) else name)
    if "uuid" in theirs:
        # CuPy reads cudaDeviceProp.uuid as a C string, so its bytes end at the first zero
        # byte (an H100 of uuid e1dfd85a-0429-a09c-d51a-d6006006ac3c gave 11 bytes); torch's
        # test above compares all 16
        full = bytes.fromhex(_normal_uuid(ours.uuid))
        assert len(full) == 16
        assert full.split(b"\0", 1)[0] == bytes(theirs["uuid"]).split(b"\0", 1)[0]


@pytest.mark.gpu
@gpu
def test_gpu_invalid_ordinal_names_the_range() -> None:
    count = gpurt.device_count()
    pattern = rf"valid devices are 0\.\.{count - 1}"
    for bad in (count, -1, f"cuda:{count}"):
        with pytest.raises(ValueError, match=pattern):
            gpurt.set_device(bad)
        with pytest.raises(ValueError, match=pattern):
            gpurt.get_device_properties(bad)
    assert gpurt.current_device() == 0


def _bound_context() -> int:
    return int(check(cu.cuCtxGetCurrent()))


@pytest.mark.gpu
@gpu
def test_gpu_current_device_is_per_thread() -> None:
    gpurt.set_device(0)
    primary = int(dev.primary_context(0))
    assert _bound_context() == primary

    def other() -> tuple[int, int]:
        index = gpurt.current_device()
        gpurt.synchronize()  # binds the primary context on this thread
        return index, _bound_context()

    assert in_thread(other) == (0, primary)
    if gpurt.device_count() >= 2:
        gpurt.set_device(1)
        assert in_thread(gpurt.current_device) == 0
        assert _bound_context() == int(dev.primary_context(1))
        gpurt.set_device(0)
    assert gpurt.current_device() == 0 and _bound_context() == primary


@pytest.mark.gpu
@gpu
def test_gpu_device_context_restores() -> None:
    last = gpurt.device_count() - 1
    with pytest.raises(RuntimeError), gpurt.device(last):
        assert gpurt.current_device() == last
        raise RuntimeError("boom")
    assert gpurt.current_device() == 0
    assert _bound_context() == int(dev.primary_context(0))
    with gpurt.device_of(types.SimpleNamespace(device=gpurt.Device(last))):
        assert gpurt.current_device() == last
        assert in_thread(gpurt.current_device) == 0
    with gpurt.device_of(np.ones(2)):
        assert gpurt.current_device() == 0


@pytest.mark.gpu
@gpu
def test_gpu_mem_get_info() -> None:
    free, total = gpurt.mem_get_info()
    assert 0 < free <= total == gpurt.get_device_properties(0).total_memory
    buffer = check(cu.cuMemAlloc(256 * MiB))
    try:
        after, _ = gpurt.mem_get_info(0)
        assert after <= free - 200 * MiB
    finally:
        check(cu.cuMemFree(buffer))
    try:
        import torch
    except ImportError:
        return
    torch_free, torch_total = torch.cuda.mem_get_info(0)
    assert torch_total == total and abs(torch_free - free) < total // 10


@pytest.mark.gpu
@gpu
def test_gpu_nvml_readings() -> None:
    try:
        readings = {
            "utilization": gpurt.utilization(), "memory_usage": gpurt.memory_usage(),
            "temperature": gpurt.temperature(), "power_draw": gpurt.power_draw(),
            "clock_rate": gpurt.clock_rate(0),
        }
    except CudaUnavailableError as exc:
        pytest.skip(f"NVML is not usable here: {exc}")
    assert 0 <= readings["utilization"] <= 100
    assert 0 <= readings["memory_usage"] <= 100
    assert 5 <= readings["temperature"] <= 120  # degrees C
    assert 1_000 <= readings["power_draw"] <= 2_000_000  # mW
    assert 100 <= readings["clock_rate"] <= 5_000  # MHz


def test_forget_devices_empties_this_threads_device_state_in_place() -> None:
    """What a forked child does (gpurt/_core/state.py): THREAD stays the same object (the C
    launch path holds it), its device fields go, its current streams stay."""
    thread, streams = state.THREAD, state.THREAD.streams
    saved = dict(vars(thread))
    try:
        thread.index, thread.bound, thread.place = 1, 1, ("place",)
        state.forget_devices()
        assert state.THREAD is thread and thread.streams is streams
        assert not any(hasattr(thread, name) for name in ("index", "bound", "place"))
        assert state.current_place() is None
    finally:
        vars(thread).clear()
        vars(thread).update(saved)


# ==================== torch.cuda's capability helpers ====================
# get_arch_list / get_gencode_flags (gpurt.nvrtc: what NVRTC targets, CPU) and the device
# helpers compared with torch in the same process (GPU).


def test_arch_list_is_what_nvrtc_targets() -> None:
    archs = gpurt.get_arch_list()
    assert archs and all(re.fullmatch(r"sm_\d+", a) for a in archs)
    assert "sm_90" in archs
    flags = gpurt.get_gencode_flags().split(" ")
    assert flags[0::2] == ["-gencode"] * len(archs)
    assert flags[1::2] == [f"compute=compute_{a[3:]},code={a}" for a in archs]


def test_without_a_gpu_nothing_is_supported() -> None:
    if gpurt.is_available():
        pytest.skip("a GPU is present")
    assert gpurt.is_bf16_supported() is False
    assert gpurt.is_tf32_supported() is False


@pytest.mark.gpu
def test_bf16_tf32_and_arch_match_torch(gpu_state: None) -> None:
    torch = pytest.importorskip("torch")
    for emulation in (True, False):
        assert gpurt.is_bf16_supported(emulation) == torch.cuda.is_bf16_supported(emulation)
    if hasattr(torch.cuda, "is_tf32_supported"):
        assert gpurt.is_tf32_supported() == torch.cuda.is_tf32_supported()
    assert gpurt.get_arch() in gpurt.get_arch_list()
    major = gpurt.get_device_capability()[0]  # torch was built for this device too
    assert any(a.startswith(f"sm_{major}") for a in torch.cuda.get_arch_list())


@pytest.mark.gpu
def test_memory_used_and_processes_match_torch(gpu_state: None) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    if not hasattr(torch.cuda, "device_memory_used"):
        pytest.skip("this torch has no device_memory_used")
    torch.zeros(1 << 20, device="cuda")  # both runtimes hold a context now
    gpurt.empty(1 << 20)
    torch.cuda.synchronize()
    ours, theirs = gpurt.device_memory_used(), torch.cuda.device_memory_used()
    print("device_memory_used gpurt", ours, "torch", theirs)
    assert abs(ours - theirs) <= 4 << 20  # other processes may allocate in between
    assert ours >= gpurt.mem_get_info()[1] - gpurt.mem_get_info()[0] - (64 << 20)
    our_text, their_text = gpurt.list_gpu_processes(), torch.cuda.list_gpu_processes()
    print(our_text, their_text, sep="\n")
    assert our_text.splitlines()[0] == their_text.splitlines()[0] == "GPU:0"
    pids = [line.split()[1] for line in our_text.splitlines()[1:] if line.startswith("process")]
    assert pids == [line.split()[1] for line in their_text.splitlines()[1:]
                    if line.startswith("process")]
