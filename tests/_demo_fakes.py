"""A numpy stand-in for the parts of gpurt that ``gpurt demo`` uses, so that every step of the
tour (its control flow, its numpy references and its checks) runs on a CPU. The kernels of
gpurt/_cli/demo_kernels.py are emulated in float32; a CUDA graph records launches during capture
and re-runs them on replay; the profile records ranges and the launches made outside a
capture, as gpurt.profiler does. The real gpurt runs the same tour in the ``gpu`` tests."""

from __future__ import annotations

import contextlib
import itertools
import time
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from gpurt._cli import demo as _demo
from gpurt._cli import demo_kernels as _demo_kernels

_ptrs = itertools.count(0x7F0000000000, 1 << 24)


class Machine:
    """The fake device's state: memory counters, the current stream, capture and profile."""

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak = 0
        self.current: FakeStream | None = None
        self.default = FakeStream(self, handle=0)
        self.capturing: FakeGraph | None = None
        self.profile: FakeProfile | None = None
        self.launches: list[str] = []

    def alloc(self, nbytes: int) -> None:
        self.allocated += -(-nbytes // 512) * 512
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= -(-nbytes // 512) * 512

    def stream(self) -> FakeStream:
        return self.current or self.default

    def launch(self, name: str, run: Callable[[], None]) -> None:
        """Run a kernel now, or record it into the graph being captured."""
        if self.capturing is not None:
            self.capturing.ops.append(run)
            return
        run()
        self.launches.append(name)
        if self.profile is not None:
            self.profile.records.append(types.SimpleNamespace(name=name, kind="kernel"))


class FakeArray:
    def __init__(self, machine: Machine, data: np.ndarray) -> None:
        self.data = data
        self.stream = machine.stream()
        self.device = "cuda:0"
        self.ptr = next(_ptrs)
        machine.alloc(data.nbytes)
        weakref.finalize(self, machine.free, data.nbytes)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)
    nbytes = property(lambda self: self.data.nbytes)
    strides = property(lambda self: self.data.strides)

    def is_contiguous(self) -> bool:
        return bool(self.data.flags.c_contiguous)

    def to_numpy(self) -> np.ndarray:
        return self.data.copy()

    def copy_(self, src: np.ndarray) -> FakeArray:
        self.data[...] = src
        return self

    def record_stream(self, stream: FakeStream) -> None:
        assert isinstance(stream, FakeStream)


class FakeStream:
    _handles = itertools.count(0x1000)

    def __init__(self, machine: Machine, handle: int | None = None) -> None:
        self.machine = machine
        self.cuda_stream = next(self._handles) if handle is None else handle
        self._saved: list[FakeStream | None] = []

    def __enter__(self) -> FakeStream:
        self._saved.append(self.machine.current)
        self.machine.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.machine.current = self._saved.pop()

    def synchronize(self) -> None:
        pass

    def record_event(self) -> FakeEvent:
        event = FakeEvent()
        event.record(self)
        return event

    def wait_event(self, event: FakeEvent) -> None:
        assert event.when is not None, "waiting for an event that was never recorded"


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.when: float | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        self.when = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.when is not None and end.when is not None
        return (end.when - self.when) * 1e3 + 1e-3


def _softmax32(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


class FakeKernel:
    """Runs the demo kernels in numpy; ``bugs`` names kernels that compute a wrong result."""

    def __init__(self, machine: Machine, name: str, bugs: set[str]) -> None:
        self.machine, self.name, self.bugs = machine, name, bugs
        self.num_regs = 32

    def __repr__(self) -> str:
        return f"<fake Kernel {self.name}>"

    def _run(self, args: tuple[Any, ...]) -> None:
        wrong = np.float32(1.001 if self.name in self.bugs else 1.0)
        if self.name == "saxpy":
            a, x, y, n = args
            assert isinstance(a, float) and n == x.size == y.size
            y.data[...] = (np.float32(a) * x.data + y.data) * wrong
        elif self.name == "demo_matmul":
            a, b, c, m, n, k = args
            assert (m, k) == a.shape and (k, n) == b.shape and (m, n) == c.shape
            c.data[...] = (a.data @ b.data) * wrong
        elif self.name == "demo_softmax":
            x, y, cols = args
            assert cols == x.shape[1]
            y.data[...] = _softmax32(x.data) * wrong
        else:
            raise AssertionError(f"unknown kernel {self.name}")

    def __call__(self, grid: Any, block: Any, args: tuple[Any, ...]) -> None:
        self.machine.launch(self.name, lambda: self._run(args))


class FakeModule:
    def __init__(self, machine: Machine, arch: str, bugs: set[str]) -> None:
        self.kind, self.arch, self.code = "cubin", arch, b"\x7fELF" + bytes(100)
        self._kernels = {n: FakeKernel(machine, n, bugs)
                         for n in ("saxpy", "demo_matmul", "demo_softmax")}

    def __getitem__(self, name: str) -> FakeKernel:
        return self._kernels[name]


class FakeGraph:
    def __init__(self) -> None:
        self.ops: list[Callable[[], None]] = []

    def kernel_nodes(self) -> list[Any]:
        return list(self.ops)

    def pool(self) -> tuple[int, int]:
        return (0, 1)

    def replay(self) -> None:
        for op in self.ops:
            op()

    def reset(self) -> None:
        self.ops = []


class FakeProfile:
    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.records: list[Any] = []

    def __enter__(self) -> FakeProfile:
        self.machine.profile = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.machine.profile = None

    @property
    def result(self) -> Any:
        def show(console: Any) -> None:
            console.print(f"{len(self.records)} records")

        return types.SimpleNamespace(records=list(self.records), print=show)


def install(monkeypatch: pytest.MonkeyPatch, cache: str, bugs: set[str] = frozenset(),
            bundled: bool = False, bundled_raises: bool = False) -> Machine:
    """Point gpurt/_cli/demo.py (and _demo_kernels.py) at a fake one-GPU machine."""
    machine = Machine()
    modules: dict[str, FakeModule] = {}

    def compile(source: str, arch: str | None = None, program_name: str = "") -> FakeModule:
        assert source == _demo_kernels.SOURCE
        arch = arch or "sm_90"
        if arch not in modules:
            modules[arch] = FakeModule(machine, arch, set(bugs))
        return modules[arch]

    def array(data: np.ndarray) -> FakeArray:
        return FakeArray(machine, np.array(data, order="C"))  # a copy, like the device

    @contextlib.contextmanager
    def graph(g: FakeGraph, stream: FakeStream) -> Iterator[FakeGraph]:
        with stream:
            machine.capturing = g
            try:
                yield g
            finally:
                machine.capturing = None

    @contextlib.contextmanager
    def nvtx_range(name: str) -> Iterator[None]:
        yield
        if machine.profile is not None:
            machine.profile.records.append(types.SimpleNamespace(name=name, kind="range"))

    def stats() -> dict[str, int]:
        return {"allocated_bytes.all.current": machine.allocated,
                "allocated_bytes.all.peak": machine.peak,
                "reserved_bytes.all.current": machine.reserved,
                "reserved_bytes.all.peak": machine.reserved, "num_ooms": 0,
                "num_alloc_retries": 0}

    def empty_cache() -> None:
        machine.reserved = machine.allocated

    props = types.SimpleNamespace(name="Fake GPU", multi_processor_count=4,
                                  total_memory=8 << 30)
    fakes: dict[str, Any] = {
        "init": lambda: None, "is_available": lambda: True, "current_device": lambda: 0,
        "device_count": lambda: 1, "get_device_name": lambda index=0: "Fake GPU",
        "get_device_properties": lambda index=0: props, "get_arch": lambda index=0: "sm_90",
        "get_device_capability": lambda index=0: (9, 0),
        "mem_get_info": lambda index=0: (6 << 30, 8 << 30),
        "asarray": array, "zeros": lambda n: array(np.zeros(n, np.float32)),
        "empty": lambda shape: array(np.full(shape, np.nan, np.float32)),
        "Stream": lambda: FakeStream(machine), "Event": FakeEvent,
        "current_stream": machine.stream, "compile": compile, "CUDAGraph": FakeGraph,
        "graph": graph, "memory_allocated": lambda: machine.allocated,
        "memory_reserved": lambda: machine.reserved, "max_memory_allocated": lambda: machine.peak,
        "memory_stats": stats, "memory_summary": lambda abbreviated=False: "fake summary",
        "empty_cache": empty_cache, "cache_dir": lambda: cache,
        "nvtx": types.SimpleNamespace(range=nvtx_range),
        "profiler": types.SimpleNamespace(profile=lambda print_table: FakeProfile(machine),
                                          Profile=FakeProfile),
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(_demo, name, fake)
    monkeypatch.setattr(_demo, "STREAM_ELEMENTS", 1 << 16)  # numpy is slower than a GPU
    monkeypatch.setattr(_demo, "LAYER", (16, 256, 512))
    monkeypatch.setattr(_demo_kernels, "empty", fakes["empty"])

    def bundled_gemm(a: FakeArray, b: FakeArray) -> FakeArray:
        if bundled_raises:
            raise RuntimeError("no kernel for this GPU")
        out = fakes["empty"]((a.shape[0], b.shape[1]))
        machine.launch("gemm", lambda: out.data.__setitem__(..., a.data @ b.data))
        return out

    def bundled_softmax(x: FakeArray) -> FakeArray:
        out = fakes["empty"](x.shape)
        machine.launch("softmax", lambda: out.data.__setitem__(..., _softmax32(x.data)))
        return out

    monkeypatch.setattr(_demo, "_bundled_gemm", bundled_gemm if bundled else None)
    monkeypatch.setattr(_demo, "_bundled_softmax", bundled_softmax if bundled else None)
    return machine
