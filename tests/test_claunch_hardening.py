"""gpurt._launch._claunch under hostile inputs (issue #18): layout offsets that would overflow the
bounds check, and a device index that is no int, never reach the stack buffer or leave a
Python exception set behind a result. CPU: the extension over a pretend driver."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from gpurt._launch import kernel as glaunch
from gpurt._launch import path as _launchpath
from test_claunch import Arr, Fallback, packing

_claunch = _launchpath.claunch
pytestmark = pytest.mark.skipif(_claunch is None,
                                reason="the C extension gpurt._launch._claunch is not built")


@pytest.mark.parametrize("offset", [sys.maxsize, sys.maxsize - 3, sys.maxsize - 7])
def test_offsets_near_the_largest_size_are_refused(offset: int) -> None:
    launcher = _claunch.Launcher(1, 1, glaunch._dims3)
    with pytest.raises(ValueError, match="inside 8 bytes"):
        _claunch.PackingLauncher(launcher, 8, ((offset, "q"),), Arr, [], print, print)


def test_an_overflowing_offset_does_not_crash_the_process(tmp_path) -> None:
    """The base commit accepted the layout and wrote far past its stack buffer (SIGSEGV)."""
    code = textwrap.dedent("""
        import sys
        from gpurt._launch import kernel as launch, path as _launchpath
        c = _launchpath.claunch
        launcher = c.Launcher(1, 1, launch._dims3)
        try:
            p = c.PackingLauncher(launcher, 8, ((sys.maxsize - 3, "q"),), object, [], print, print)
        except ValueError:
            sys.exit(0)
        p(1, 1, (5,), 0, 0, 0)
        sys.exit(1)
    """)
    # from another folder: a checkout's ./gpurt (without the built extension) must not
    # shadow the installed gpurt the test runs against
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False, cwd=tmp_path)
    assert result.returncode == 0, (result.returncode, result.stderr)


@pytest.mark.parametrize("device_index", ["0", None, 1.5, 2**80])
def test_a_device_index_that_is_no_int_goes_to_the_python_launcher(device_index) -> None:
    launch, driver, fallback, _ = packing(((0, "P"),), 8)
    array = Arr(0x1000, 0)
    array.device = SimpleNamespace(index=device_index)
    assert launch(1, 1, (array,), 0, 0, -1) is None  # no SystemError: no error left set
    assert driver.calls == [] and len(fallback.calls) == 1


def test_a_device_without_an_index_goes_to_the_python_launcher() -> None:
    launch, driver, fallback, _ = packing(((0, "P"),), 8)
    array = Arr(0x1000, 0)
    array.device = SimpleNamespace()
    launch(1, 1, (array,), 0, 0, -1)
    assert driver.calls == [] and len(fallback.calls) == 1
    assert isinstance(fallback, Fallback)
