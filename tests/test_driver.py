"""The driver layer (gpurt/_core/driver.py): check(), the exception family, lazy init, no-driver
behaviour and the fork guard."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

import gpurt
from gpurt._core import driver as _driver
from gpurt._core.driver import CudaError, CudaUnavailableError, OutOfMemoryError, check

NO_DRIVER = pytest.mark.skipif(gpurt.is_available(), reason="checks behaviour without a driver")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK_MESSAGE = "Cannot re-initialize CUDA in forked subprocess"


def run_python(source: str) -> str:
    """Run ``source`` in a fresh interpreter that imports this checkout; return its stdout."""
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=path), check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_in_fork(child: Callable[[], str], timeout: float = 60.0) -> str:
    """Fork, run ``child()`` in the child and return the text it returned (or the repr of
    what it raised). A child that hangs is killed and fails the test."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns about fork() with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 0
        try:
            os.close(read_end)
            try:
                text = child()
            except BaseException as exc:  # noqa: BLE001  (reported to the parent)
                text = f"raised {type(exc).__name__}: {exc}"
            os.write(write_end, text.encode())
        except BaseException:  # noqa: BLE001  (the child must reach os._exit)
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        chunks = []
        while True:
            ready, _, _ = select.select([read_end], [], [], timeout)
            if not ready:
                os.kill(pid, 9)
                pytest.fail(f"forked child hung for {timeout}s")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def describe(fn: Callable[[], Any]) -> str:
    """What calling ``fn`` did, as text (for children that report back)."""
    try:
        fn()
    except CudaUnavailableError as exc:
        return f"CudaUnavailableError: {exc}"
    except BaseException as exc:  # noqa: BLE001  (described, not raised)
        return f"{type(exc).__name__}: {exc}"
    return "returned"


# ---------------------------------------------------------------- check() and errors


def test_check_unwraps_results() -> None:
    ok = cu.CUresult.CUDA_SUCCESS
    assert check((ok,)) is None
    assert check((ok, 7)) == 7
    assert check((ok, 1, "two")) == (1, "two")
    assert check((nvrtc.nvrtcResult.NVRTC_SUCCESS, b"log")) == b"log"


def test_check_raises_cuda_error_with_code_name_and_description() -> None:
    with pytest.raises(CudaError) as info:
        check((cu.CUresult.CUDA_ERROR_INVALID_VALUE, None), "cuMemAlloc")
    exc = info.value
    assert isinstance(exc, RuntimeError) and not isinstance(exc, MemoryError)
    assert exc.code == 1 and exc.name == "CUDA_ERROR_INVALID_VALUE"
    assert exc.call == "cuMemAlloc" and isinstance(exc.description, str) and exc.description
    assert str(exc).startswith("CUDA_ERROR_INVALID_VALUE: ") and "(in cuMemAlloc)" in str(exc)
    if gpurt.is_available():  # the driver's own text
        assert exc.description == "invalid argument"


def test_out_of_memory_is_also_a_memory_error() -> None:
    with pytest.raises(MemoryError) as info:
        check((cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY,), "cuMemAlloc")
    assert isinstance(info.value, OutOfMemoryError) and isinstance(info.value, CudaError)
    assert info.value.name == "CUDA_ERROR_OUT_OF_MEMORY" and info.value.code == 2


def test_nvrtc_errors_use_nvrtc_names_and_text() -> None:
    with pytest.raises(CudaError) as info:
        check((nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION,), "nvrtcCompileProgram")
    assert info.value.name == "NVRTC_ERROR_COMPILATION"
    assert "compilation" in info.value.description.lower()
    # nvrtc's code 2 (INVALID_INPUT) is not CUDA's code 2 (OUT_OF_MEMORY)
    with pytest.raises(CudaError) as info:
        check((nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_INPUT,))
    assert not isinstance(info.value, OutOfMemoryError)
    assert info.value.name == "NVRTC_ERROR_INVALID_INPUT"


def test_unavailable_error_is_a_cuda_error() -> None:
    exc = CudaUnavailableError("no NVIDIA driver was found")
    assert isinstance(exc, CudaError) and isinstance(exc, RuntimeError)
    assert str(exc) == "no NVIDIA driver was found" and exc.args == ("no NVIDIA driver was found",)


def test_bindings_version() -> None:
    assert _driver.bindings_version().split(".")[0] in {"12", "13"}


# ---------------------------------------------------------------- import and lazy init


def test_import_does_not_initialise_cuda() -> None:
    out = run_python(
        "import gpurt\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(gpurt.is_initialized(), 'libcuda.so' in maps)\n"
    )
    assert out.split() == ["False", "False"]


# ---------------------------------------------------------------- without a driver

GPU_CALLS: dict[str, Callable[[], Any]] = {
    "init": gpurt.init,
    "current_device": gpurt.current_device,
    "set_device": lambda: gpurt.set_device(0),
    "Device.properties": lambda: gpurt.Device(0).properties,  # Device(0) itself is lazy
    "device ctx": lambda: gpurt.device(0),
    "get_device_properties": gpurt.get_device_properties,
    "get_device_name": gpurt.get_device_name,
    "get_arch": gpurt.get_arch,
    "synchronize": gpurt.synchronize,
    "mem_get_info": gpurt.mem_get_info,
    "can_device_access_peer": lambda: gpurt.can_device_access_peer(0, 1),
    "Stream": gpurt.Stream,
    "current_stream": gpurt.current_stream,
}


@NO_DRIVER
def test_no_driver_means_no_devices() -> None:
    assert gpurt.is_available() is False
    assert gpurt.device_count() == 0
    assert gpurt.is_initialized() is False
    assert _driver.driver_version() is None


@NO_DRIVER
@pytest.mark.parametrize("name", sorted(GPU_CALLS))
def test_no_driver_error_is_clear_and_short(name: str) -> None:
    with pytest.raises(CudaUnavailableError, match="no NVIDIA driver was found") as info:
        GPU_CALLS[name]()
    exc = info.value
    assert exc.__cause__ is None and exc.__suppress_context__ is True
    files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    assert not [f for f in files if "cuda/bindings" in f or "cuda/pathfinder" in f], files
    text = "".join(traceback.format_exception(exc))
    assert "DynamicLibNotFoundError" not in text.replace("[DynamicLibNotFoundError]", "")


@NO_DRIVER
def test_repeated_failures_do_not_grow_the_traceback() -> None:
    def frames() -> int:
        try:
            _driver.init()
        except CudaUnavailableError as exc:
            return len(traceback.extract_tb(exc.__traceback__))
        raise AssertionError("init() did not raise")

    first = frames()
    for _ in range(20):
        gpurt.device_count()
    assert frames() == first


# ---------------------------------------------------------------- fork guard


def test_fork_guard_logic(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU: pretend the parent initialised CUDA; the forked child must refuse, clearly."""
    monkeypatch.setattr(_driver, "_initialized", True)

    def child() -> str:
        forked = _driver.is_forked_child() and not _driver.is_initialized()
        return f"{forked}|{describe(_driver.init)}|{describe(gpurt.current_device)}"

    forked, init_result, device_result = run_in_fork(child).split("|")
    assert forked == "True"
    assert init_result.startswith("CudaUnavailableError") and FORK_MESSAGE in init_result
    assert FORK_MESSAGE in device_result
    assert not _driver.is_forked_child()  # the parent is untouched


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_state")
def test_gpu_fork_after_init_gives_a_clear_error() -> None:
    gpurt.init()
    gpurt.set_device(0)
    gpurt.synchronize()  # this thread has a bound context the child inherits
    stream = gpurt.Stream()

    def child() -> str:
        calls: list[Callable[[], Any]] = [
            gpurt.synchronize, gpurt.mem_get_info, gpurt.Stream, stream.synchronize,
            lambda: gpurt.Event().record(),
        ]
        results = [describe(call) for call in calls]
        in_thread: list[str] = []
        worker = threading.Thread(target=lambda: in_thread.append(describe(gpurt.Stream)))
        worker.start()
        worker.join(30)
        return "\n".join(results + in_thread)

    results = run_in_fork(child).splitlines()
    assert len(results) == 6, results
    for line in results:
        assert line.startswith("CudaUnavailableError") and FORK_MESSAGE in line, line
    stream.synchronize()  # the parent still works
    assert gpurt.is_initialized()


@pytest.mark.gpu
def test_gpu_driver_version() -> None:
    version = _driver.driver_version()
    assert version is not None and version >= 12000


# ---- the at-fork registry (gpurt/_core/fork.py) ------------------------------------------


def test_every_at_fork_step_is_registered_and_runs_in_order(monkeypatch: pytest.MonkeyPatch):
    from gpurt._core import fork

    assert fork.ORDER[0] == "driver"  # it decides whether the later steps have work
    assert set(fork._steps) == set(fork.ORDER)  # import gpurt registered every step
    ran: list[str] = []
    steps = {step: (lambda step=step: ran.append(step)) for step in reversed(fork.ORDER)}
    monkeypatch.setattr(fork, "_steps", steps)
    fork._after_fork_in_child()
    assert ran == list(fork.ORDER)


def test_at_fork_steps_are_named_and_registered_once(monkeypatch: pytest.MonkeyPatch):
    from gpurt._core import fork

    monkeypatch.setattr(fork, "_steps", {})
    with pytest.raises(ValueError, match="unknown at-fork step 'later'"):
        fork.at_fork_in_child("later", lambda: None)
    fork.at_fork_in_child("devices", lambda: None)
    with pytest.raises(ValueError, match="registered already"):
        fork.at_fork_in_child("devices", lambda: None)
