"""The ``gpurt`` command: info, compile, demo, bench, memviz (gpurt/__main__.py, _info, _demo)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cuda.bindings import nvrtc as cuda_nvrtc
from rich.console import Console

import gpurt
import gpurt.__main__ as cli
from gpurt import nvrtc
from gpurt._cli import info as _info
from gpurt._core.driver import CudaError

HAS_GPU = gpurt.is_available()
_BROKEN = cuda_nvrtc.nvrtcResult.NVRTC_ERROR_INTERNAL_ERROR
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="checks what happens on a machine without a GPU")
needs_compile_file = pytest.mark.skipif(
    not hasattr(nvrtc, "compile_file"), reason="gpurt.nvrtc.compile_file is not written yet"
)

KERNEL = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps at 80 columns when not on a terminal; keep lines whole for the asserts."""
    monkeypatch.setenv("COLUMNS", "400")


def run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m gpurt ARGS`` in a fresh interpreter (cwd away from the source tree)."""
    return subprocess.run(
        [sys.executable, "-m", "gpurt", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )


def info_json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert cli.main(["info", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


class FakeCompile:
    """Stands in for nvrtc.compile_file and records what the command passed."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.error = error

    def __call__(self, path: str, arch: str, options: Any = (), output: Any = None) -> str:
        self.calls.append((path, arch, list(options), output))
        if self.error is not None:
            raise self.error
        return output or path + ".cubin"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "scale.cu"
    path.write_text(KERNEL)
    return path


# ---- command line ----------------------------------------------------------------------


def test_module_help_lists_the_commands(tmp_path: Path) -> None:
    res = run_module("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for name in ("info", "compile", "memviz", "demo", "bench"):
        assert name in res.stdout


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = shutil.which("gpurt", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("no gpurt console script beside this interpreter (not pip-installed)")
    assert script is not None
    res = subprocess.run([script, "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "compile" in res.stdout


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 0
    assert "usage: gpurt" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["no-such-command"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# ---- info ------------------------------------------------------------------------------


def test_info_json_reports_versions(capsys: pytest.CaptureFixture[str]) -> None:
    report = info_json(capsys)
    assert report["gpurt"]["version"] == gpurt.__version__
    assert report["packages"]["cuda-bindings"] == gpurt._core.driver.bindings_version()
    major, minor = cuda_nvrtc.nvrtcVersion()[1:]
    assert report["nvrtc"]["version"] == f"{major}.{minor}"
    assert "sm_90" in report["nvrtc"]["supported_archs"]
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))


def test_info_json_in_a_fresh_process_is_one_object(tmp_path: Path) -> None:
    res = run_module("info", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["driver"]["available"] is HAS_GPU
    assert len(report["devices"]) == gpurt.device_count()


@no_gpu_only
def test_info_without_gpu_says_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "No GPU here" in out
    assert "missing: no usable GPU" in out
    assert "driver" in out
    assert "still works here" in out
    assert "gpurt compile FILE.cu --arch sm_90" in out
    assert "NVRTC" in out and "cuda-bindings" in out


@no_gpu_only
def test_info_json_without_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    report = info_json(capsys)
    assert report["driver"] == {
        "available": False,
        "cuda_version": None,
        "device_count": 0,
        "error": report["driver"]["error"],
    }
    assert report["driver"]["error"]
    assert report["devices"] == []
    assert any("no usable GPU" in item for item in report["missing"])
    assert any("gpurt compile" in item for item in report["works_without_gpu"])


def test_info_reports_environment(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPURT_CACHE_DIR", "/tmp/some [odd] dir")
    assert info_json(capsys)["environment"]["GPURT_CACHE_DIR"] == "/tmp/some [odd] dir"
    assert cli.main(["info"]) == 0  # brackets are printed, not read as rich markup
    assert "/tmp/some [odd] dir" in capsys.readouterr().out


def test_info_when_nvrtc_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_info._nvrtc, "nvrtcVersion", lambda: (_BROKEN, 0, 0))
    report = _info.collect()
    assert report["nvrtc"]["version"] is None and report["nvrtc"]["error"]
    assert any(item.startswith("NVRTC cannot be used") for item in report["missing"])
    assert not any("gpurt compile" in item for item in report["works_without_gpu"])


def test_info_renders_a_device(capsys: pytest.CaptureFixture[str]) -> None:
    """The device table, from a made-up device (so it is checked without a GPU too)."""
    fields = {f.name: f.type for f in dataclasses.fields(gpurt.DeviceProperties)}
    values: dict[str, Any] = {name: (name != "is_integrated") if kind in (bool, "bool") else 7
                              for name, kind in fields.items()}
    values.update(index=0, name="Made-up GPU [test]", uuid="0-1", total_memory=80 * 2**30,
                  clock_rate=1_980_000, major=9, minor=0)
    report = _info.collect()
    report["devices"] = [{
        "index": 0, "name": values["name"], "arch": "sm_90",
        "properties": dataclasses.asdict(gpurt.DeviceProperties(**values)),
        "memory": {"free": 60 * 2**30, "total": 80 * 2**30},
        "nvml": {"temperature": {"value": 41, "unit": "C"},
                 "power_draw": {"error": "NVML down"}},
    }]
    console = Console(file=io.StringIO(), width=300)
    _info.render(report, console)
    out = console.file.getvalue()
    assert "cuda:0  Made-up GPU [test]  (sm_90)" in out
    assert "60.0 GiB / 80.0 GiB" in out
    assert "41 C" in out and "n/a (NVML down)" in out
    assert "1980 MHz" in out and "is_integrated" in out


# ---- compile ---------------------------------------------------------------------------


def test_compile_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(tmp_path / "none.cu"), "--arch", "sm_90"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_compile_missing_file_in_a_fresh_process(tmp_path: Path) -> None:
    res = run_module("compile", "none.cu", "--arch", "sm_90", cwd=tmp_path)
    assert res.returncode != 0
    assert "no such file: none.cu" in res.stderr
    assert "Traceback" not in res.stderr


@no_gpu_only
def test_compile_without_gpu_needs_arch(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(source)]) == 2
    assert "pass --arch" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["90", "sm90", "sm_", "compute_x"])
def test_compile_rejects_bad_arch(source: Path, arch: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compile", str(source), "--arch", arch]) == 2
    assert "invalid --arch" in capsys.readouterr().err


def test_compile_passes_arch_options_and_output(source: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeCompile()
    monkeypatch.setattr(nvrtc, "compile_file", fake, raising=False)
    argv = ["compile", str(source), "--arch", "sm_90a", "-O=-lineinfo", "-O-DN=4",
            "-o", "out.cubin", "--", "--use_fast_math"]
    assert cli.main(argv) == 0
    assert fake.calls == [
        (str(source), "sm_90a", ["-lineinfo", "-DN=4", "--use_fast_math"], "out.cubin")
    ]
    assert "wrote out.cubin (sm_90a)" in capsys.readouterr().out


def test_compile_ptx_targets_compute_arch(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCompile()
    monkeypatch.setattr(nvrtc, "compile_file", fake, raising=False)
    assert cli.main(["compile", str(source), "--arch", "sm_90", "--ptx"]) == 0
    assert fake.calls == [(str(source), "compute_90", [], str(source.with_suffix(".ptx")))]


def test_compile_error_prints_the_log(source: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    error = CudaError(6, "NVRTC_ERROR_COMPILATION", "scale.cu(3): error: expected a ';'")
    monkeypatch.setattr(nvrtc, "compile_file", FakeCompile(error), raising=False)
    assert cli.main(["compile", str(source), "--arch", "sm_90"]) == 1
    assert "expected a ';'" in capsys.readouterr().err


@needs_compile_file
@pytest.mark.parametrize("ptx", [False, True])
def test_compile_with_nvrtc(source: Path, tmp_path: Path, ptx: bool,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / ("scale.ptx" if ptx else "scale.cubin")
    argv = ["compile", str(source), "--arch", "sm_90", "-o", str(out)] + (["--ptx"] if ptx else [])
    assert cli.main(argv) == 0
    data = out.read_bytes()
    if ptx:
        assert b".target sm_90" in data and b".entry scale" in data
    else:
        assert data[:4] == b"\x7fELF"


@needs_compile_file
def test_compile_error_with_nvrtc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path / "cache"))
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void f(float* x) { x[0] = undeclared_name; }\n')
    assert cli.main(["compile", str(broken), "--arch", "sm_90"]) == 1
    assert "undeclared_name" in capsys.readouterr().err


# ---- demo, bench, memviz ---------------------------------------------------------------


@no_gpu_only
def test_demo_without_gpu_describes_the_tour(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "no GPU here" in out
    assert "CUDA graphs" in out and "gpurt compile" in out


def test_bench_runs_run_all_with_its_arguments(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "gpurt"\n')  # a checkout
    (tmp_path / "gpurt").mkdir()
    (tmp_path / "gpurt" / "__init__.py").write_text("")
    seen = tmp_path / "argv.json"
    (tmp_path / "benchmarks" / "run_all.py").write_text(
        "import json, sys\n"
        f"json.dump(sys.argv[1:], open({str(seen)!r}, 'w'))\n"
        "sys.exit(3)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "--quick", "-k", "softmax"]) == 3
    assert json.loads(seen.read_text()) == ["--quick", "-k", "softmax"]


def test_bench_without_run_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "_BENCH_SCRIPT", Path("benchmarks") / "no_such_run_all.py")
    assert cli.main(["bench"]) == 2
    assert "not found" in capsys.readouterr().err


def test_memviz_hands_every_argument_over(monkeypatch: pytest.MonkeyPatch) -> None:
    memviz = pytest.importorskip("gpurt.memviz")
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setattr(memviz, "memviz_main", fake_main)
    argv = ["snap.json", "-o", "out.html", "--png", "out.png"]
    assert cli.main(["memviz", *argv]) == 0
    assert seen == [argv]


# ---- on a GPU --------------------------------------------------------------------------


@pytest.mark.gpu
def test_info_json_on_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    report = info_json(capsys)
    driver = report["driver"]
    assert driver["available"] is True and driver["error"] is None
    version = gpurt._core.driver.driver_version()
    assert version is not None
    assert driver["cuda_version"] == f"{version // 1000}.{version % 1000 // 10}"
    assert len(report["devices"]) == driver["device_count"] == gpurt.device_count()
    assert report["missing"] == [] and report["works_without_gpu"] == []
    for index, dev in enumerate(report["devices"]):
        props = gpurt.get_device_properties(index)
        assert dev["name"] == props.name == dev["properties"]["name"]
        assert dev["arch"] == gpurt.get_arch(index)
        assert dev["properties"]["multi_processor_count"] == props.multi_processor_count > 0
        memory = dev["memory"]
        assert 0 < memory["free"] <= memory["total"] <= props.total_memory
        assert set(dev["nvml"]) == {"utilization", "memory_usage", "temperature",
                                    "power_draw", "clock_rate"}
        for name, reading in dev["nvml"].items():
            assert ("value" in reading) != ("error" in reading), name
        if "value" in dev["nvml"]["temperature"]:
            assert 5 <= dev["nvml"]["temperature"]["value"] <= 110
        if "value" in dev["nvml"]["utilization"]:
            assert 0 <= dev["nvml"]["utilization"]["value"] <= 100


@pytest.mark.gpu
def test_info_on_gpu_shows_each_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "No GPU here" not in out
    for index in range(gpurt.device_count()):
        assert f"cuda:{index}  {gpurt.get_device_name(index)}" in out
        assert "memory free/total" in out


@pytest.mark.gpu
def test_compile_defaults_to_this_gpu(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCompile()
    monkeypatch.setattr(nvrtc, "compile_file", fake, raising=False)
    assert cli.main(["compile", str(source)]) == 0
    assert fake.calls[0][1] == gpurt.get_arch()


@pytest.mark.gpu
def test_demo_on_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert gpurt.get_device_name(gpurt.current_device()) in out
    assert "no GPU here" not in out
