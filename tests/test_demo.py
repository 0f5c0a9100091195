"""``gpurt demo`` (gpurt/_cli/demo.py, gpurt/_cli/demo_kernels.py): the tour without and with a
GPU."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import _demo_fakes
import gpurt
from gpurt._cli import demo as _demo
from gpurt._cli import demo_kernels as _demo_kernels

HAS_GPU = gpurt.is_available()
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="checks the path taken without a GPU")


def run_demo(cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m gpurt demo`` in a fresh interpreter (cwd away from the source tree)."""
    full_env = {**os.environ, "COLUMNS": "200", **env}
    return subprocess.run([sys.executable, "-m", "gpurt", "demo"], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=300)


def quiet_console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None)


# ---- CPU ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_demo_kernels_compile_ahead_of_time(arch: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    module = gpurt.compile(_demo_kernels.SOURCE, arch=arch, program_name="gpurt_demo.cu")
    assert module.kind == "cubin" and module.code[:4] == b"\x7fELF"
    assert "warning" not in module.log
    saxpy = module["saxpy"]
    # a Python float reaches `float a` as a float, the length as a 64-bit integer
    packed = saxpy.pack(2.5, 0x1000, 0x2000, (1 << 33) + 5)
    assert np.frombuffer(packed[:4], np.float32)[0] == 2.5
    assert int.from_bytes(packed[24:32], "little") == (1 << 33) + 5
    assert [p.name for p in module["demo_matmul"].params] == ["a", "b", "c", "m", "n", "k"]
    assert [p.type for p in module["demo_softmax"].params][2] == "int"


def test_checks_decide_the_exit_code() -> None:
    tour = _demo.Tour(quiet_console())
    want = np.linspace(-1.0, 1.0, 11)
    assert tour.close("exact", want.astype(np.float32), want, rtol=1e-6, atol=1e-6)
    assert _demo._summary(tour) == 0
    assert not tour.close("off by 1e-3", (want + 1e-3).astype(np.float32), want, rtol=1e-6,
                          atol=1e-6)
    assert not tour.close("nan", np.full(11, np.nan, np.float32), want, rtol=1.0, atol=1.0)
    assert not tour.close("shape", want[:3].astype(np.float32), want, rtol=1.0, atol=1.0)
    assert _demo._summary(tour) == 1
    out = tour.console.file.getvalue()
    assert out.count("PASS") == 1 and out.count("FAIL") == 3
    assert "3 of 4 checks failed" in out


def test_steps_name_the_tour() -> None:
    titles = [step.title for step in _demo.STEPS]
    assert titles == ["Pick a device", "Allocate arrays", "Compile a kernel",
                      "Streams and events", "CUDA graphs", "Memory statistics", "Profile"]
    assert all(callable(step.run) for step in _demo.STEPS)


@no_gpu_only
def test_demo_without_gpu_compiles_ahead_of_time(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    res = run_demo(tmp_path, GPURT_CACHE_DIR=str(cache))
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "no GPU here" in out and "CUDA graphs" in out and "gpurt compile" in out
    assert "PASS a sm_90 cubin, compiled with no GPU" in out
    assert "PASS compiling it again is a memory-cache hit" in out
    assert "FAIL" not in out and "all 2 checks passed" in out
    entries = list(cache.glob("*.kernel"))
    assert len(entries) == 1 and entries[0].name in out
    again = run_demo(tmp_path, GPURT_CACHE_DIR=str(cache))
    assert again.returncode == 0 and "already there from an earlier run" in again.stdout
    assert list(cache.glob("*.kernel")) == entries


@no_gpu_only
def test_demo_without_gpu_and_without_disk_cache(tmp_path: Path) -> None:
    res = run_demo(tmp_path, GPURT_CACHE_DISABLE="1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "disk cache: off" in res.stdout


@no_gpu_only
def test_demo_without_gpu_fails_when_nvrtc_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("NVRTC is broken on purpose")

    monkeypatch.setattr(_demo, "compile", broken)
    console = quiet_console()
    assert _demo.run(console) == 1
    out = console.file.getvalue()
    assert "FAIL compiling ahead of time (RuntimeError: NVRTC is broken on purpose)" in out


# ---- GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_demo_on_gpu_passes_every_check(tmp_path: Path) -> None:
    res = run_demo(tmp_path)
    out = res.stdout
    assert res.returncode == 0, out[-4000:] + res.stderr[-2000:]
    assert "FAIL" not in out and "no GPU here" not in out
    for number, step in enumerate(_demo.STEPS, 1):
        assert f"{number}. {step.title}" in out
    passes = len(re.findall(r"^\s+PASS ", out, re.MULTILINE))
    assert passes >= 18, out[-4000:]
    assert f"all {passes} checks passed" in out
    assert "replay 3 on a new batch matches numpy" in out
    assert "every saxpy launch was timed" in out
    assert gpurt.get_device_name() in out


@pytest.mark.gpu
def test_demo_on_gpu_with_its_own_kernels(monkeypatch: pytest.MonkeyPatch, gpu_state: None) -> None:
    """The fallback matmul and softmax (used where gpurt.kernels is missing) are correct too."""
    monkeypatch.setattr(_demo, "_bundled_gemm", None)
    monkeypatch.setattr(_demo, "_bundled_softmax", None)
    monkeypatch.setattr(_demo, "_NO_GEMM", "switched off by the test")
    monkeypatch.setattr(_demo, "_NO_SOFTMAX", "switched off by the test")
    console = quiet_console()
    code = _demo.run(console)
    out = console.file.getvalue()
    assert code == 0, out[-4000:]
    assert "with the demo's matmul + the demo's softmax matches numpy" in out
    assert "FAIL" not in out


# ---- the whole tour on a numpy stand-in for the GPU (tests/_demo_fakes.py) ---------------------


@pytest.mark.parametrize("bundled, raises, label", [
    (False, False, "the demo's matmul + the demo's softmax"),
    (True, False, "gpurt.kernels.gemm + gpurt.kernels.softmax"),
    (True, True, "the demo's matmul + gpurt.kernels.softmax"),
])
def test_tour_on_a_fake_gpu(bundled: bool, raises: bool, label: str, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    machine = _demo_fakes.install(monkeypatch, str(tmp_path), bundled=bundled,
                                  bundled_raises=raises)
    console = quiet_console()
    code = _demo.run(console)
    out = console.file.getvalue()
    assert code == 0, out
    assert "FAIL" not in out and "no GPU here" not in out
    for number, step in enumerate(_demo.STEPS, 1):
        assert f"{number}. {step.title}" in out
    assert f"eager softmax(x @ w) with {label} matches numpy" in out
    assert "replay 3 on a new batch matches numpy" in out
    assert "PASS every saxpy launch was timed (22 of 22)" in out
    assert "PASS every step's NVTX range was timed on the device (6 ranges)" in out
    assert ("gpurt.kernels.gemm failed here: no kernel for this GPU" in out) == raises
    assert machine.launches.count("saxpy") == 22
    assert machine.allocated >= 0 and machine.capturing is None and machine.profile is None


@pytest.mark.parametrize("kernel, failing", [
    ("saxpy", "saxpy matches numpy"),
    ("demo_matmul", "eager softmax(x @ w) with the demo's matmul"),
    ("demo_softmax", "replay 1 on a new batch matches numpy"),
])
def test_tour_on_a_fake_gpu_reports_wrong_results(kernel: str, failing: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _demo_fakes.install(monkeypatch, str(tmp_path), bugs={kernel})
    console = quiet_console()
    assert _demo.run(console) == 1
    out = console.file.getvalue()
    assert re.search(r"FAIL " + re.escape(failing), out), out
    assert "checks failed" in out


def test_tour_on_a_fake_gpu_goes_on_after_a_step_raises(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _demo_fakes.install(monkeypatch, str(tmp_path))

    def broken() -> None:
        raise RuntimeError("stream creation failed on purpose")

    monkeypatch.setattr(_demo, "Stream", broken)
    console = quiet_console()
    assert _demo.run(console) == 1
    out = console.file.getvalue()
    assert "FAIL Streams and events ran to the end (RuntimeError: stream creation failed" in out
    assert "PASS every saxpy launch was timed (1 of 1)" in out  # the later steps still ran
