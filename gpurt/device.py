"""Devices: counting, choosing, describing and synchronising GPUs (torch.cuda's names).

Each device is used through its primary context, retained once per process. The current
device is per thread (a new thread starts on device 0, as in the CUDA runtime); the driver
context bound to a thread follows it lazily through :func:`bind_context`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as cu

from ._core import driver as _driver
from ._core.driver import CudaError, CudaUnavailableError, check
from ._core.fork import at_fork_in_child, renew_after_fork
from ._core.state import THREAD as _tls  # this thread's index, bound (see _core/state.py)
from ._core.state import forget_devices, forget_place
from ._sanitizer import hooks as _csan

__all__ = [
    "Device",
    "DeviceProperties",
    "is_available",
    "is_initialized",
    "init",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "device_of",
    "get_device_name",
    "get_device_capability",
    "get_device_properties",
    "get_arch",
    "synchronize",
    "mem_get_info",
    "can_device_access_peer",
    "enable_peer_access",
    "utilization",
    "temperature",
    "power_draw",
    "clock_rate",
    "memory_usage",
    "device_memory_used",
    "list_gpu_processes",
    "is_bf16_supported",
    "is_tf32_supported",
]


class Device:
    """A CUDA device by ordinal; compares equal to torch's ``device(type='cuda', index=i)``
    in spirit (``type`` and ``index``). Creating one never initialises CUDA (it is plain
    data, as torch.device: safe before a fork); ``Device()`` and ``Device("cuda")`` name
    this thread's current device, 0 when none was set. Whether the device exists is checked
    where it is used."""

    __slots__ = ("index",)
    type = "cuda"

    def __init__(self, index: DeviceLike = None) -> None:
        ordinal = _ordinal(index, _current_or_first)
        if ordinal < 0:
            raise ValueError(f"invalid device ordinal {ordinal}: ordinals start at 0")
        self.index = ordinal

    def __repr__(self) -> str:
        return f"device(type='cuda', index={self.index})"

    def __str__(self) -> str:
        return f"cuda:{self.index}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("cuda", self.index))

    def __index__(self) -> int:
        return self.index

    @property
    def properties(self) -> Any:  # a DeviceProperties (made below by make_dataclass)
        return get_device_properties(self.index)


DeviceLike = int | str | Device | None

_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)
_primary: dict[int, Any] = {}
_count: int | None = None


def init() -> None:
    """Initialise CUDA now instead of on first use (like ``torch.cuda.init``)."""
    _driver.init()
    device_count()


def is_initialized() -> bool:
    """True once CUDA has been initialised in this process."""
    return _driver.is_initialized()


def is_available() -> bool:
    """True when a driver and at least one device can be used; never raises."""
    return device_count() > 0


def device_count() -> int:
    """Number of visible CUDA devices; 0 without a driver (never raises)."""
    global _count
    if _count is not None:
        return _count
    try:
        _driver.init()
        count = int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))
    except CudaError:
        return 0
    _count = count
    return count


def _require() -> int:
    """Initialise CUDA and return the device count, raising clearly if there is none."""
    _driver.init()
    count = device_count()
    if count == 0:
        raise CudaUnavailableError("no CUDA device is visible (check CUDA_VISIBLE_DEVICES)")
    return count


def _index(device: Any) -> int:
    """Ordinal for an int, 'cuda', 'cuda:N', Device, torch.device or None (= current),
    checked against the visible devices (initialises CUDA)."""
    if device is None:
        return current_device()
    if isinstance(device, Device):
        index = device.index
        if _count is not None and index < _count:  # the common case, without a call
            return index
    else:
        index = _ordinal(device, current_device)
    count = _require()
    if not 0 <= index < count:
        raise ValueError(f"invalid device ordinal {index}: valid devices are 0..{count - 1}")
    return index


def _ordinal(device: Any, current: Callable[[], int]) -> int:
    """The ordinal that ``device`` names, not checked against the visible devices: an int,
    'cuda:N', Device or torch.device; ``current()`` for None, 'cuda' and torch's
    device('cuda')."""
    if device is None:
        return current()
    if isinstance(device, Device):
        return device.index
    if isinstance(device, bool):
        raise TypeError(f"expected a device, got {device!r}")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        kind, _, rest = device.partition(":")
        if kind != "cuda":
            raise ValueError(
                f"expected a CUDA device string like 'cuda' or 'cuda:1', got {device!r}")
        if not rest:
            return current()
        if not rest.isdigit():
            raise ValueError(f"invalid device string {device!r}")
        index = int(rest)
    elif getattr(device, "type", None) == "cuda":  # torch.device and alikes
        idx = getattr(device, "index", None)
        return current() if idx is None else _ordinal(int(idx), current)
    else:
        raise TypeError(f"expected a device (int, 'cuda:N' or Device), got {type(device).__name__}")
    return index


def _current_or_first() -> int:
    """This thread's current device if one was set or used, else 0 (no CUDA call)."""
    index = getattr(_tls, "index", None)
    return 0 if index is None else index


def _forget_contexts_after_fork() -> None:
    """In a child forked after CUDA was initialised, no context the parent bound is valid:
    forget them, so the next call goes through _driver.init() and raises its clear fork
    error instead of reaching the driver (whose behaviour in such a child is undefined)."""
    if _driver.is_forked_child():  # set by _driver's own at-fork step, which runs first
        forget_devices()
        _primary.clear()


at_fork_in_child("devices", _forget_contexts_after_fork)


def primary_context(index: int) -> Any:
    """The retained primary context of device ``index`` (retained once per process)."""
    ctx = _primary.get(index)
    if ctx is None:
        with _lock:
            ctx = _primary.get(index)
            if ctx is None:
                dev = check(cu.cuDeviceGet(index), "cuDeviceGet")
                ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                _primary[index] = ctx
    return ctx


def primary_index(context: Any) -> int | None:
    """The device whose primary context gpurt holds is ``context``, or None."""
    handle = int(context)
    return next((i for i, ctx in list(_primary.items()) if int(ctx) == handle), None)


def bind_context(index: int) -> None:
    """Make device ``index``'s primary context current on this thread (cheap if it is)."""
    if getattr(_tls, "bound", None) != index:
        _driver.init()
        check(cu.cuCtxSetCurrent(primary_context(index)), "cuCtxSetCurrent")
        _tls.bound = index


def current_device() -> int:
    """Index of this thread's current device (initialises CUDA, like torch)."""
    index = getattr(_tls, "index", None)
    if index is None:
        _require()
        index = _tls.index = 0
    return index


def set_device(device: DeviceLike) -> None:
    """Make ``device`` current on this thread (wraps cuCtxSetCurrent on its primary context)."""
    index = _index(device)
    bind_context(index)
    _tls.index = index
    forget_place()


class device:
    """Context manager that makes ``device`` current and restores the previous one on exit
    (also on exceptions). ``None`` is a no-op, as in torch."""

    def __init__(self, device: DeviceLike) -> None:
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> device:
        if self.idx >= 0:
            self.prev_idx = current_device()
            if self.prev_idx != self.idx:
                set_device(self.idx)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0 and self.prev_idx != self.idx:
            set_device(self.prev_idx)


class device_of(device):
    """Context manager that makes the device of ``obj`` (anything with a ``.device``)
    current; a no-op for objects on the host."""

    def __init__(self, obj: Any) -> None:
        dev = getattr(obj, "device", None)
        # numpy >= 2 arrays (Array API) have device == "cpu": a string, not a device object
        kind = dev.partition(":")[0] if isinstance(dev, str) else getattr(dev, "type", "cuda")
        on_gpu = dev is not None and kind == "cuda"
        super().__init__(dev if on_gpu else None)


# ---- properties, derived from one table ------------------------------------------------

_A = cu.CUdevice_attribute
# field name (torch's where torch has one) -> driver attribute
_ATTRIBUTES: dict[str, Any] = {
    "major": _A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    "minor": _A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    "multi_processor_count": _A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    "max_threads_per_multi_processor": _A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
    "max_threads_per_block": _A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    "max_blocks_per_multi_processor": _A.CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
    "warp_size": _A.CU_DEVICE_ATTRIBUTE_WARP_SIZE,
    "regs_per_multiprocessor": _A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
    "regs_per_block": _A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK,
    "shared_memory_per_block": _A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
    "shared_memory_per_block_optin": _A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    "shared_memory_per_multiprocessor": _A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
    "L2_cache_size": _A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
    "persisting_l2_cache_max_size": _A.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
    "pci_bus_id": _A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
    "pci_device_id": _A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
    "pci_domain_id": _A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
    "is_integrated": _A.CU_DEVICE_ATTRIBUTE_INTEGRATED,
    "is_multi_gpu_board": _A.CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD,
    "clock_rate": _A.CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
    "memory_clock_rate": _A.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
    "memory_bus_width": _A.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH,
    "async_engine_count": _A.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT,
    "concurrent_kernels": _A.CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS,
    "cooperative_launch": _A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
    "cluster_launch": _A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH,
    "memory_pools_supported": _A.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
    "unified_addressing": _A.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
}
_BOOL_FIELDS = {
    "is_integrated", "is_multi_gpu_board", "concurrent_kernels", "cooperative_launch",
    "cluster_launch", "memory_pools_supported", "unified_addressing",
}


def _field_type(name: str) -> type:
    return bool if name in _BOOL_FIELDS else int


DeviceProperties = dataclasses.make_dataclass(
    "DeviceProperties",
    [("index", int), ("name", str), ("total_memory", int), ("uuid", str)]
    + [(name, _field_type(name)) for name in _ATTRIBUTES],
    frozen=True,
    namespace={
        "__doc__": "A device's properties, named as in torch.cuda.get_device_properties. "
        "Clock rates are in kHz, memory and caches in bytes.",
        "__repr__": lambda self: (
            f"DeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 2**20}MB, "
            f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
            f"L2_cache_size={self.L2_cache_size // 2**20}MB)"
        ),
    },
)
DeviceProperties.__module__ = __name__

_properties: dict[int, Any] = {}


def _uuid_text(raw: bytes) -> str:
    h = bytes(raw).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def get_device_properties(device: DeviceLike = None) -> Any:
    """Properties of ``device`` as a frozen :class:`DeviceProperties` (cached)."""
    index = _index(device)
    props = _properties.get(index)
    if props is None:
        dev = check(cu.cuDeviceGet(index), "cuDeviceGet")
        values: dict[str, Any] = {
            "index": index,
            "name": check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
            .split(b"\0", 1)[0]
            .decode(),
            "total_memory": int(check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
            "uuid": _uuid_text(check(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes),
        }
        for name, attr in _ATTRIBUTES.items():
            value = check(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute")
            values[name] = _field_type(name)(value)
        props = _properties[index] = DeviceProperties(**values)
    return props


def get_device_name(device: DeviceLike = None) -> str:
    """The device's marketing name, e.g. 'NVIDIA H100 80GB HBM3'."""
    return str(get_device_properties(device).name)


def get_device_capability(device: DeviceLike = None) -> tuple[int, int]:
    """Compute capability as (major, minor), e.g. (9, 0)."""
    props = get_device_properties(device)
    return (props.major, props.minor)


def get_arch(device: DeviceLike = None) -> str:
    """The exact SASS target of ``device`` for compilers, e.g. 'sm_90'."""
    major, minor = get_device_capability(device)
    return f"sm_{major}{minor}"


def synchronize(device: DeviceLike = None) -> None:
    """Wait for all work on ``device`` to finish (wraps cuCtxSynchronize)."""
    index = _index(device)
    bind_context(index)
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    if _csan.ON:
        _csan.TRACKER.device_synchronize(index)
    if getattr(_tls, "index", index) != index:
        bind_context(_tls.index)


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """(free, total) device memory in bytes, as the driver sees it (wraps cuMemGetInfo)."""
    index = _index(device)
    bind_context(index)
    free, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
    if getattr(_tls, "index", index) != index:
        bind_context(_tls.index)
    return int(free), int(total)


def can_device_access_peer(device: DeviceLike, peer_device: DeviceLike) -> bool:
    """True if ``device`` can map memory of ``peer_device`` (wraps cuDeviceCanAccessPeer)."""
    a, b = _index(device), _index(peer_device)
    if a == b:
        return False
    dev_a = check(cu.cuDeviceGet(a), "cuDeviceGet")
    dev_b = check(cu.cuDeviceGet(b), "cuDeviceGet")
    return bool(check(cu.cuDeviceCanAccessPeer(dev_a, dev_b), "cuDeviceCanAccessPeer"))


_peers_enabled: set[tuple[int, int]] = set()
_PEER_ALREADY_ENABLED = cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED


def enable_peer_access(device: DeviceLike, peer_device: DeviceLike) -> bool:
    """Map ``peer_device``'s memory into ``device``'s address space, once per pair
    (cuCtxEnablePeerAccess), so that kernels on ``device`` may dereference pointers to it.
    False where the pair cannot (no P2P path, or the same device); gpurt calls it itself
    for copies between devices, as torch does."""
    a, b = _index(device), _index(peer_device)
    if (a, b) in _peers_enabled:
        return True
    if not can_device_access_peer(a, b):
        return False
    peer_context = primary_context(b)  # before the lock, which primary_context takes
    with _lock:
        if (a, b) not in _peers_enabled:
            bind_context(a)
            try:
                (err,) = cu.cuCtxEnablePeerAccess(peer_context, 0)
                if err != _PEER_ALREADY_ENABLED:
                    check((err,), "cuCtxEnablePeerAccess")
            finally:
                bind_context(current_device())
            _peers_enabled.add((a, b))
    return True


# ---- NVML readings ---------------------------------------------------------------------

_nvml_handles: dict[int, Any] = {}
_nvml_module: Any = None


def _nvml() -> Any:
    """cuda.bindings' NVML module, initialised once; a clear error where NVML is missing."""
    global _nvml_module
    if _nvml_module is None:
        try:
            from cuda.bindings import nvml as module
        except ImportError as exc:  # cuda-bindings older than the NVML bindings
            raise CudaUnavailableError(
                f"NVML readings need cuda-bindings with cuda.bindings.nvml ({exc})"
            ) from None
        try:
            module.init_v2()
        except Exception as exc:  # libnvidia-ml missing or the driver refused
            raise CudaUnavailableError(f"NVML is not available here: {exc}") from None
        _nvml_module = module
    return _nvml_module


def _pci_bus_id(index: int) -> str:
    props = get_device_properties(index)
    return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def _nvml_handle(device: DeviceLike) -> Any:
    index = _index(device)
    handle = _nvml_handles.get(index)
    if handle is None:
        handle = _nvml().device_get_handle_by_pci_bus_id_v2(_pci_bus_id(index))
        _nvml_handles[index] = handle
    return handle


def _nvml_read(device: DeviceLike, read: Callable[[Any, Any], Any]) -> Any:
    nvml = _nvml()
    handle = _nvml_handle(device)
    try:
        return read(nvml, handle)
    except nvml.NvmlError as exc:
        raise CudaError(-1, "NVML_ERROR", str(exc)) from None


def utilization(device: DeviceLike = None) -> int:
    """Percent of time over the last sample period a kernel was running (NVML)."""
    return int(_nvml_read(device, lambda n, h: n.device_get_utilization_rates(h).gpu))


def temperature(device: DeviceLike = None) -> int:
    """GPU core temperature in degrees Celsius (NVML)."""
    return int(_nvml_read(device, lambda n, h: n.device_get_temperature_v(h, 0)))


def power_draw(device: DeviceLike = None) -> int:
    """Current power draw in milliwatts (NVML)."""
    return int(_nvml_read(device, lambda n, h: n.device_get_power_usage(h)))


def clock_rate(device: DeviceLike = None) -> int:
    """Current SM clock in MHz (NVML)."""
    return int(_nvml_read(device, lambda n, h: n.device_get_clock_info(h, n.ClockType.CLOCK_SM)))


def memory_usage(device: DeviceLike = None) -> int:
    """Percent of time over the last sample period device memory was read or written (NVML)."""
    return int(_nvml_read(device, lambda n, h: n.device_get_utilization_rates(h).memory))


# ---- memory and processes as NVML sees them (all processes, not only this one) ----------


def _pynvml(device: DeviceLike, missing: CudaUnavailableError) -> tuple[Any, Any]:
    """nvidia-ml-py's module and device handle, where cuda.bindings has no NVML."""
    try:
        import pynvml
    except ImportError:
        raise CudaUnavailableError(
            f"{missing}; nvidia-ml-py is not installed either (pip install nvidia-ml-py)"
        ) from None
    try:
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(_pci_bus_id(_index(device)))
    except pynvml.NVMLError as exc:
        raise CudaUnavailableError(f"NVML is not available here: {exc}") from None


def _nvml_memory_and_processes(device: DeviceLike) -> tuple[int, list[tuple[int, int | None]]]:
    """(bytes used on the device, [(pid, bytes used or None)] of its compute processes)."""
    try:
        _nvml()
    except CudaUnavailableError as exc:
        pynvml, handle = _pynvml(device, exc)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        return used, [(int(p.pid), p.usedGpuMemory)
                      for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    info = _nvml_read(device, lambda n, h: n.device_get_memory_info_v2(h))
    found = _nvml_read(device, lambda n, h: n.device_get_compute_running_processes_v3(h))
    processes = []
    for i in range(len(found)):
        memory = int(found[i].used_gpu_memory)
        processes.append((int(found[i].pid), None if memory == _NVML_NOT_AVAILABLE else memory))
    # NVML's version-1 "used" (torch's reading) is total - free; v2 splits off "reserved"
    return int(info.total - info.free), processes


_NVML_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long


def device_memory_used(device: DeviceLike = None) -> int:
    """Bytes of ``device``'s memory in use by all processes, as NVML reports it
    (torch.cuda.device_memory_used; nvidia-smi's "used")."""
    return _nvml_memory_and_processes(device)[0]


def list_gpu_processes(device: DeviceLike = None) -> str:
    """The processes running on ``device`` and their memory, as NVML reports them, in
    torch.cuda.list_gpu_processes()'s format."""
    index = _index(device)
    lines = [f"GPU:{index}"]
    processes = _nvml_memory_and_processes(index)[1]
    if not processes:
        lines.append("no processes are running")
    for pid, memory in processes:
        used = "n/a" if memory is None else f"{memory / (1024 * 1024):>12.3f}"
        lines.append(f"process {pid:>10d} uses {used:>12} MB GPU memory")
    return "\n".join(lines)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True when the current device computes in bfloat16 natively (compute capability 8.0
    or newer) or, with ``including_emulation``, can hold bfloat16 arrays at all (any
    device); False without a GPU. torch.cuda.is_bf16_supported's results."""
    if not is_available():
        return False
    return get_device_capability()[0] >= 8 or bool(including_emulation)


def is_tf32_supported() -> bool:
    """True when the current device has TF32 tensor cores (compute capability 8.0 or
    newer), as torch.cuda.is_tf32_supported."""
    return is_bf16_supported(including_emulation=False)
