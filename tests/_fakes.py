"""A pretend two-GPU machine for CPU tests of gpurt's bookkeeping.

The ``fake_gpus`` fixture makes gpurt believe CUDA is initialised with two devices and
records which device's context each thread binds. The ``fake_driver`` fixture also replaces
the ``cuda.bindings.driver`` functions gpurt.streams calls with :class:`FakeDriver`, which
checks handles the way the driver does (unknown or destroyed handle ->
CUDA_ERROR_INVALID_HANDLE) and runs host callbacks on a separate thread, through their real
C function pointer, when the stream is synchronised. The real driver runs the same code
paths in the ``gpu`` tests.
"""

from __future__ import annotations

import collections
import ctypes
import importlib
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from cuda.bindings import driver as cu

from gpurt import streams
from gpurt._core import driver as _driver
from gpurt._core import state
from gpurt._core.state import THREAD
from gpurt._streams import handles as _handles

# gpurt.device is the torch-style `device` context manager; the module is reached by name
device_module = importlib.import_module("gpurt.device")

OK = cu.CUresult.CUDA_SUCCESS
BAD_HANDLE = cu.CUresult.CUDA_ERROR_INVALID_HANDLE
NOT_READY = cu.CUresult.CUDA_ERROR_NOT_READY
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class FakeContexts:
    """Stands in for device.bind_context: remembers each thread's bound device."""

    def __init__(self) -> None:
        self._tls = threading.local()
        self.binds = 0

    def bind(self, index: int) -> None:
        self._tls.bound = index
        self.binds += 1

    @property
    def bound(self) -> int | None:
        return getattr(self._tls, "bound", None)


class FakeDriver:
    """The driver calls gpurt.streams makes, on bookkeeping only."""

    CUresult = cu.CUresult
    CUstream = cu.CUstream
    CUevent = cu.CUevent
    CUipcEventHandle = cu.CUipcEventHandle

    def __init__(self, contexts: FakeContexts) -> None:
        self.contexts = contexts
        self._ids = itertools.count(0x1000, 0x10)
        self.streams: dict[int, dict[str, Any]] = {}  # handle -> device, flags, priority, alive
        self.events: dict[int, dict[str, Any]] = {}  # handle -> device, flags, alive
        self.calls: list[tuple[str, int | None, tuple]] = []  # name, bound device, args
        self.ready = True  # what queries answer
        self.fail_host_launch = False
        self.capturing: set[int] = set()  # stream handles that pretend to capture a graph
        self.host_work: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)

    # -- helpers --
    def _log(self, name: str, *args: Any) -> None:
        self.calls.append((name, self.contexts.bound, args))

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]

    def _stream_device(self, handle: Any) -> int | None:
        """Device of a live stream handle (0 = the bound context's NULL stream), or None."""
        h = int(handle)
        if h == 0:
            return self.contexts.bound
        info = self.streams.get(h)
        return info["device"] if info and info["alive"] else None

    def _event_ok(self, handle: Any) -> bool:
        info = self.events.get(int(handle))
        return bool(info and info["alive"])

    # -- streams --
    def cuStreamCreateWithPriority(self, flags: int, priority: int) -> tuple:
        self._log("cuStreamCreateWithPriority", flags, priority)
        h = next(self._ids)
        self.streams[h] = {"device": self.contexts.bound, "flags": flags,
                           "priority": max(-5, min(0, priority)), "alive": True}
        return OK, cu.CUstream(h)

    def cuStreamDestroy(self, handle: Any) -> tuple:
        self._log("cuStreamDestroy", int(handle))
        info = self.streams.get(int(handle))
        if not info or not info["alive"]:
            return (BAD_HANDLE,)
        info["alive"] = False
        return (OK,)

    def cuStreamGetPriority(self, handle: Any) -> tuple:
        if self._stream_device(handle) is None:
            return (BAD_HANDLE,)
        info = self.streams.get(int(handle))
        return OK, (info["priority"] if info else 0)

    def cuCtxGetStreamPriorityRange(self) -> tuple:
        return OK, 0, -5

    def cuStreamQuery(self, handle: Any) -> tuple:
        self._log("cuStreamQuery", int(handle))
        if self._stream_device(handle) is None:
            return (BAD_HANDLE,)
        return (OK,) if self.ready else (NOT_READY,)

    def cuStreamSynchronize(self, handle: Any) -> tuple:
        self._log("cuStreamSynchronize", int(handle))
        if self._stream_device(handle) is None:
            return (BAD_HANDLE,)
        work = self.host_work.pop(int(handle), [])
        worker = threading.Thread(target=self._run_host_work, args=(work,))
        worker.start()
        worker.join()
        return (OK,)

    def replay_host_work(self, handle: int) -> None:
        """Run a stream's launched host functions without forgetting them (a graph replay)."""
        self._run_host_work(self.host_work[handle])

    @staticmethod
    def _run_host_work(work: list[tuple[int, int]]) -> None:
        for fn_ptr, user_data in work:  # like the driver's callback thread, in order
            HOST_FN(fn_ptr)(user_data)

    def cuStreamIsCapturing(self, handle: Any) -> tuple:
        if self._stream_device(handle) is None:
            return (BAD_HANDLE,)
        status = cu.CUstreamCaptureStatus
        capturing = int(handle) in self.capturing
        return OK, (status.CU_STREAM_CAPTURE_STATUS_ACTIVE if capturing
                    else status.CU_STREAM_CAPTURE_STATUS_NONE)

    def cuLaunchHostFunc(self, handle: Any, fn: Any, user_data: int) -> tuple:
        self._log("cuLaunchHostFunc", int(handle))
        if self.fail_host_launch or self._stream_device(handle) is None:
            return (BAD_HANDLE,)
        self.host_work[int(handle)].append((int(fn), int(user_data)))
        return (OK,)

    # -- events --
    def cuEventCreate(self, flags: int) -> tuple:
        self._log("cuEventCreate", flags)
        h = next(self._ids)
        self.events[h] = {"device": self.contexts.bound, "flags": flags, "alive": True}
        return OK, cu.CUevent(h)

    def cuEventDestroy(self, handle: Any) -> tuple:
        self._log("cuEventDestroy", int(handle))
        info = self.events.get(int(handle))
        if not info or not info["alive"]:
            return (BAD_HANDLE,)
        info["alive"] = False
        return (OK,)

    def cuEventRecord(self, event: Any, stream: Any) -> tuple:
        self._log("cuEventRecord", int(event), int(stream))
        device_of_stream = self._stream_device(stream)
        if not self._event_ok(event) or device_of_stream is None:
            return (BAD_HANDLE,)
        if self.events[int(event)]["device"] != device_of_stream:
            return (cu.CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        return (OK,)

    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: int) -> tuple:
        self._log("cuStreamWaitEvent", int(stream), int(event))
        if not self._event_ok(event) or self._stream_device(stream) is None:
            return (BAD_HANDLE,)
        return (OK,)

    def cuEventQuery(self, event: Any) -> tuple:
        self._log("cuEventQuery", int(event))
        if not self._event_ok(event):
            return (BAD_HANDLE,)
        return (OK,) if self.ready else (NOT_READY,)

    def cuEventSynchronize(self, event: Any) -> tuple:
        self._log("cuEventSynchronize", int(event))
        return (OK,) if self._event_ok(event) else (BAD_HANDLE,)

    def cuEventElapsedTime(self, start: Any, end: Any) -> tuple:
        self._log("cuEventElapsedTime", int(start), int(end))
        if not (self._event_ok(start) and self._event_ok(end)):
            return (BAD_HANDLE,)
        return (OK, 1.5) if self.ready else (NOT_READY,)

    def cuIpcGetEventHandle(self, event: Any) -> tuple:
        if not self._event_ok(event):
            return (BAD_HANDLE,)
        ipc = cu.CUipcEventHandle()
        data = int(event).to_bytes(8, "little") * 8
        ctypes.memmove(ipc.getPtr(), data, len(data))
        return OK, ipc

    def cuIpcOpenEventHandle(self, ipc: Any) -> tuple:
        data = ctypes.string_at(ipc.getPtr(), 64)
        source = int.from_bytes(data[:8], "little")
        if not self._event_ok(source):
            return (cu.CUresult.CUDA_ERROR_INVALID_VALUE,)
        self._log("cuIpcOpenEventHandle", source)
        h = next(self._ids)
        self.events[h] = {"device": self.contexts.bound, "flags": self.events[source]["flags"],
                          "alive": True, "opened_from": source}
        return OK, cu.CUevent(h)


def fresh_device_state() -> Callable[[], None]:
    """Empty this thread's device state (gpurt/_core/state.py); returns what puts it back."""
    names = ("index", "bound", "place")
    saved = {name: THREAD.__dict__.pop(name) for name in names if name in THREAD.__dict__}

    def restore() -> None:
        for name in names:
            THREAD.__dict__.pop(name, None)
        THREAD.__dict__.update(saved)

    return restore


@pytest.fixture(name="fake_gpus")
def fake_gpus_fixture(monkeypatch: pytest.MonkeyPatch,
                      request: pytest.FixtureRequest) -> FakeContexts:
    """gpurt sees two initialised devices; context binds are recorded, not made."""
    contexts = FakeContexts()
    monkeypatch.setattr(_driver, "_initialized", True)
    monkeypatch.setattr(_driver, "_forked_child", False)
    monkeypatch.setattr(device_module, "_count", 2)
    request.addfinalizer(fresh_device_state())
    monkeypatch.setattr(device_module, "bind_context", contexts.bind)
    monkeypatch.setattr(_handles, "bind_context", contexts.bind)
    # The real allocators' stream hooks must never see fake stream handles: on a GPU machine
    # they would record events on them through the real driver.
    monkeypatch.setattr(_handles, "_stream_hooks", [])
    return contexts


@pytest.fixture(name="fake_driver")
def fake_driver_fixture(fake_gpus: FakeContexts, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    """:func:`fake_gpus` plus a fake driver under gpurt.streams, with fresh stream state."""
    driver = FakeDriver(fake_gpus)
    monkeypatch.setattr(streams, "cu", driver)
    monkeypatch.setattr(
        streams,
        "launch_host_func",
        lambda handle, key: driver.cuLaunchHostFunc(handle, _handles._HOST_FN_ADDRESS, key),
    )
    fresh = state.ThreadStreams()  # this thread's current streams start empty
    with state._all_streams_lock:
        state._all_streams.add(fresh)
    monkeypatch.setattr(state.THREAD, "streams", fresh)
    monkeypatch.setattr(streams, "_defaults", {})
    monkeypatch.setattr(_handles, "_pending", collections.deque())
    monkeypatch.setattr(_handles, "_live", collections.Counter())
    return driver


# Importable under the fixtures' own names too (tests/_graph_fakes.py does so); a test module
# that imports the *_fixture names instead keeps its parameters from shadowing an import.
fake_gpus = fake_gpus_fixture
fake_driver = fake_driver_fixture
