"""A fork while other threads hold gpurt's locks, or are inside cuInit, must not deadlock the
child (issue #18): every module-level lock (and the locks of module-level singletons) is
renewed in the child, and a child forked during CUDA initialisation gets the clear fork
error. CPU: cuInit is faked to block; GPU: a real cuInit on another thread."""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable

import pytest

import gpurt
from gpurt._core import driver as _driver

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def gpurt_locks() -> dict[str, Callable[[], object]]:
    """Every lock held at module level in gpurt, or by a module-level singleton, by name,
    as a getter that reads it afresh (the child must see the renewed one)."""
    for info in pkgutil.walk_packages(gpurt.__path__, "gpurt."):
        if info.name not in ("gpurt.__main__",) and not info.name.startswith("gpurt.kernels"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(info.name)
    found: dict[str, Callable[[], object]] = {}
    for name, module in list(sys.modules.items()):
        if not (name == "gpurt" or name.startswith("gpurt.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, LOCK_TYPES):
                found[f"{name}.{attr}"] = lambda m=module, a=attr: getattr(m, a)
            elif not isinstance(value, type) and isinstance(
                getattr(value, "_lock", None), LOCK_TYPES
            ) and type(value).__module__.startswith("gpurt"):
                found[f"{name}.{attr}._lock"] = lambda v=value: v._lock
    return found


def fork_and_check(child: Callable[[], int], limit: float = 20.0) -> int:
    """Fork; run ``child`` there (its int is the exit code); the child's exit code, or -1
    when it hung past ``limit`` (then it is killed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads running
        pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = child()
        finally:
            os._exit(code)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


def test_the_lock_census_finds_the_known_locks() -> None:
    names = set(gpurt_locks())
    for expected in ("gpurt._core.driver._lock", "gpurt.device._lock", "gpurt.memory._lock",
                     "gpurt._core.state._all_streams_lock", "gpurt._nvrtc.cache._state_lock",
                     "gpurt._memory.pinned._host._lock", "gpurt.profiler._pool._lock",
                     "gpurt._core.captures.CAPTURES._lock"):
        assert expected in names


def test_every_module_lock_is_free_in_a_child_forked_while_others_hold_them() -> None:
    locks = gpurt_locks()
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        taken = list({id(lock): lock for lock in (get() for get in locks.values())}.values())
        for lock in taken:
            lock.acquire()
        held.set()
        release.wait(30)
        for lock in reversed(taken):
            lock.release()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    try:
        def child() -> int:
            stuck = []
            for name, get in locks.items():
                lock = get()
                if lock.acquire(timeout=2):
                    lock.release()
                else:
                    stuck.append(name)
            if stuck:
                os.write(2, f"locks still held in the child: {stuck}\n".encode())
            return 1 if stuck else 0

        assert fork_and_check(child) == 0
    finally:
        release.set()
        thread.join(10)


def test_a_fork_during_cuda_init_gives_the_child_the_fork_error(monkeypatch) -> None:
    entered, leave = threading.Event(), threading.Event()

    real_cu = _driver.cu

    class SlowInit:
        def __getattr__(self, name: str) -> object:
            return getattr(real_cu, name)

        @staticmethod
        def cuInit(flags: int) -> tuple:
            entered.set()
            leave.wait(30)
            return (real_cu.CUresult.CUDA_ERROR_NO_DEVICE,)

    monkeypatch.setattr(_driver, "_initialized", False)
    monkeypatch.setattr(_driver, "_init_error", None)
    monkeypatch.setattr(_driver, "_forked_child", False)
    monkeypatch.setattr(_driver, "cu", SlowInit())
    thread = threading.Thread(target=lambda: pytest.raises(gpurt.CudaError, _driver.init))
    thread.start()
    assert entered.wait(10)
    try:
        def child() -> int:
            try:
                _driver.init()
            except _driver.CudaUnavailableError as exc:
                return 0 if "fork" in str(exc) else 2
            return 1

        assert fork_and_check(child) == 0
    finally:
        leave.set()
        thread.join(10)


@pytest.mark.gpu
def test_a_fork_during_a_real_cuda_init_does_not_hang() -> None:
    """Run in a fresh interpreter: this process has initialised CUDA long ago."""
    import subprocess

    code = r"""
import os, sys, threading, time, warnings
import gpurt
from gpurt._core import driver as _driver
t = threading.Thread(target=_driver.init)
t.start()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pid = os.fork()
if pid == 0:
    try:
        gpurt.device_count()
        code = 0
    except gpurt.CudaError:
        code = 0  # the clear fork error: fine, it did not hang
    os._exit(code)
t.join()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.02)
os.kill(pid, 9)
sys.exit(7)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
