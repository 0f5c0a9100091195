"""gpurt.Device is plain data (issue #18): creating one never initialises CUDA, so it is safe
before a fork; whether the device exists is checked where it is used."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import gpurt
from _fakes import device_module as dev
from _fakes import fake_gpus  # noqa: F401 (fixture)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_creating_devices_never_initialises_cuda() -> None:
    result = run("""
        import gpurt
        devices = [gpurt.Device(1), gpurt.Device("cuda:7"), gpurt.Device(), gpurt.Device("cuda")]
        print([str(d) for d in devices], gpurt.is_initialized())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("]")[-1].strip() == "False"
    assert "'cuda:1', 'cuda:7', 'cuda:0', 'cuda:0'" in result.stdout


def test_bad_devices_are_still_refused_at_once() -> None:
    for bad, error in ((-1, ValueError), ("cpu", ValueError), ("cuda:x", ValueError),
                       (True, TypeError), (1.0, TypeError)):
        with pytest.raises(error):
            gpurt.Device(bad)


def test_a_device_that_does_not_exist_is_refused_where_it_is_used(fake_gpus) -> None:
    far = gpurt.Device(5)
    assert far.index == 5
    with pytest.raises(ValueError, match=r"valid devices are 0\.\.1"):
        dev._index(far)
    assert dev._index(gpurt.Device(1)) == 1
    gpurt.set_device(1)
    assert gpurt.Device().index == 1


@pytest.mark.gpu
def test_a_device_made_before_a_fork_leaves_the_child_free_to_use_cuda() -> None:
    result = run("""
        import os, sys
        import gpurt
        d = gpurt.Device(0)
        pid = os.fork()
        if pid == 0:
            try:
                ok = gpurt.get_device_name(d) and not gpurt._core.driver.is_forked_child()
                os._exit(0 if ok else 1)
            except BaseException:
                os._exit(2)
        sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """)
    assert result.returncode == 0, result.stderr
