"""scripts/gpu-check and its report helper, run on the CPU against a small fake tree."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"

_spec = importlib.util.spec_from_file_location("gpu_check_report",
                                               ROOT / "scripts" / "gpu_check_report.py")
assert _spec is not None and _spec.loader is not None
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

COMPLETE_LOG = """\
============================= test session starts ==============================
collecting ... collected 5 items

tests/test_a.py::test_one PASSED                                         [ 20%]
tests/test_a.py::test_two FAILED                                         [ 40%]
tests/test_a.py::test_three SKIPPED (no GPU)                             [ 60%]
tests/test_b.py::TestX::test_p[1-2] PASSED                               [ 80%]
tests/test_b.py::test_err ERROR                                          [100%]

=========================== short test summary info ============================
SKIPPED [1] tests/test_a.py:9: no GPU
FAILED tests/test_a.py::test_two - assert 1 == 2
ERROR tests/test_b.py::test_err - RuntimeError: fixture broke
=============== 1 failed, 2 passed, 1 skipped, 1 error in 3.21s ================
"""

STOPPED_LOG = """\
tests/test_a.py::test_one PASSED                                         [ 20%]
tests/test_a.py::test_two FAILED                                         [ 40%]
tests/test_a.py::test_hangs
"""


XDIST_LOG = """\
created: 1/1 worker
1 worker [5 items]

scheduling tests via LoadScheduling

tests/test_a.py::test_one
[gw0] [ 20%] PASSED tests/test_a.py::test_one
tests/test_a.py::test_two
[gw0] [ 40%] FAILED tests/test_a.py::test_two Fatal Python error: Segmentation fault
tests/test_a.py::test_crash
[gw0] node down: Not properly terminated
[gw0] [ 60%] FAILED tests/test_a.py::test_crash

replacing crashed worker gw0

--- FAILED tests/test_a.py::test_two (call)
    def test_two():
>       assert 1 == 2
E       assert 1 == 2
worker 'gw0' crashed while running 'tests/test_a.py::test_crash'
tests/test_b.py::test_p[copy to host]
[gw1] [ 80%] PASSED tests/test_b.py::test_p[copy to host]
tests/test_b.py::test_hangs
"""

XDIST_SUMMARY = """\
=========================== short test summary info ============================
FAILED tests/test_a.py::test_two - assert 1 == 2
FAILED tests/test_a.py::test_crash - worker 'gw0' crashed while running 'tests/test_a.py::test_cr…
==================== 2 failed, 3 passed in 3.71s ====================
"""


def test_parse_complete_log() -> None:
    parsed = report.parse_pytest_log(COMPLETE_LOG)
    assert parsed["counts"] == {"passed": 2, "failed": 1, "skipped": 1, "errors": 1,
                                "xfailed": 0, "xpassed": 0, "deselected": 0}
    assert parsed["failed"] == ["tests/test_a.py::test_two", "tests/test_b.py::test_err"]
    assert parsed["failure_reasons"]["tests/test_a.py::test_two"] == "assert 1 == 2"
    assert parsed["running_when_stopped"] is None
    assert parsed["final_line"].startswith("1 failed, 2 passed")


def test_parse_stopped_log_counts_results_and_names_the_running_test() -> None:
    parsed = report.parse_pytest_log(STOPPED_LOG)
    assert parsed["counts"]["passed"] == 1 and parsed["counts"]["failed"] == 1
    assert parsed["failed"] == ["tests/test_a.py::test_two"]
    assert parsed["running_when_stopped"] == "tests/test_a.py::test_hangs"
    assert parsed["final_line"] is None


def test_parse_xdist_logs() -> None:
    stopped = report.parse_pytest_log(XDIST_LOG)
    assert (stopped["counts"]["passed"], stopped["counts"]["failed"]) == (2, 2)
    assert stopped["counts"]["deselected"] is None  # xdist's controller never says
    assert stopped["failure_reasons"] == {
        "tests/test_a.py::test_two": "assert 1 == 2",
        "tests/test_a.py::test_crash":
            "worker 'gw0' crashed while running 'tests/test_a.py::test_crash'"}
    assert stopped["running_when_stopped"] == "tests/test_b.py::test_hangs"
    complete = XDIST_LOG.replace("tests/test_b.py::test_hangs\n", "") + XDIST_SUMMARY
    parsed = report.parse_pytest_log(complete)
    assert (parsed["counts"]["passed"], parsed["counts"]["failed"]) == (3, 2)
    assert parsed["failed"] == ["tests/test_a.py::test_crash", "tests/test_a.py::test_two"]
    assert "crashed" in parsed["failure_reasons"]["tests/test_a.py::test_crash"]
    assert parsed["running_when_stopped"] is None


def test_parse_no_tests() -> None:
    parsed = report.parse_pytest_log("============= no tests ran in 0.01s =============\n")
    assert parsed["final_line"] == "no tests ran"
    assert sum(parsed["counts"].values()) == 0 and parsed["failed"] == []


def test_summary_and_bench_files(tmp_path: Path) -> None:
    (tmp_path / "pytest.log").write_text(COMPLETE_LOG)
    (tmp_path / "info.json").write_text(json.dumps({
        "devices": [{"name": "NVIDIA H100 80GB HBM3"}],
        "driver": {"cuda_version": "13.0"}, "nvrtc": {"version": "13.0"},
    }))
    summary = report.write_summary(tmp_path, rc=1, seconds=3.4, timed_out=False)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert summary["device"] == "NVIDIA H100 80GB HBM3"
    assert (summary["passed"], summary["failed"], summary["errors"]) == (2, 1, 1)
    assert summary["versions"]["cuda-bindings"]

    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "launch.json").write_text(json.dumps({"suite": "launch", "env": {"device": "X"},
                                                   "rows": [{"us": 3.1}]}))
    runs = tmp_path / "runs.tsv"
    runs.write_text("bench_launch\t0\t12\tok\nbench_gemm\t1\t3\tfailed\n")
    merged = report.write_bench(tmp_path, stage, runs)
    assert merged["env"] == {"device": "X"}
    assert merged["suites"]["launch"]["rows"] == [{"us": 3.1}]
    assert [r["status"] for r in merged["runs"]] == ["ok", "failed"]


# ---- the script end to end on a fake tree ----------------------------------------------

FAKE_TESTS = """\
import pytest
import gpurt, gpurt.kernels

def test_passes():
    assert gpurt.kernels.__name__ == "gpurt.kernels"

def test_fails():
    assert 1 == 2, "on purpose"

@pytest.mark.skip(reason="on purpose")
def test_skipped():
    pass
"""

FAKE_BENCH_OK = """\
import json, os
with open(os.path.join(os.environ["GPURT_BENCH_OUT"], "fake.json"), "w") as fh:
    json.dump({"suite": "fake", "env": {"device": None}, "rows": [{"x": 1}]}, fh)
print("fake bench ran")
"""


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    for name in ("gpurt", "kernels"):
        shutil.copytree(ROOT / name, tree / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "scripts").mkdir()
    for name in ("gpu-check", "gpu_check_report.py"):
        shutil.copy(ROOT / "scripts" / name, tree / "scripts" / name)
    (tree / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n")
    (tree / "tests").mkdir()
    (tree / "tests" / "test_fake.py").write_text(FAKE_TESTS)
    (tree / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "_merge.py", tree / "benchmarks" / "_merge.py")
    (tree / "benchmarks" / "bench_ok.py").write_text(FAKE_BENCH_OK)
    (tree / "benchmarks" / "bench_bad.py").write_text("raise SystemExit('broken on purpose')\n")
    (tree / "benchmarks" / "bench_slow.py").write_text("import time\ntime.sleep(60)\n")
    (tree / "scripts" / "sanitize_sweep.py").write_text(FAKE_SWEEP)
    return tree


# Stands in for scripts/sanitize_sweep.py (compute-sanitizer needs a GPU): records its tier.
FAKE_SWEEP = """\
import json, pathlib, sys
out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])
tier = sys.argv[sys.argv.index('--tier') + 1]
(out / 'sanitize.log').write_text('swept ' + tier)
(out / 'sanitize.json').write_text(json.dumps({'tier': tier, 'clean': True}))
print('sanitize: CLEAN')
"""


def run_check(tree: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the tree's gpu-check with python3 = this interpreter (it has gpurt's deps)."""
    bin_dir = tree.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    # PYTHONPATH stays: gpu-check puts its own copy of gpurt in front of it, and on the GPU
    # machine it holds the wheels (nvtx) that the outer gpu-check installed.
    # the outer run's kernel cache and worker count stay out (the inner counts its own tests)
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPURT_CACHE_DIR", "GPURT_CHECK_WORKERS")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["bash", str(tree / "scripts" / "gpu-check"), str(out), *args],
                          cwd=tree.parent, env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="gpu-check runs python3 -P (3.11+)")
def test_gpu_check_end_to_end(fake_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_check(fake_tree, out, "--bench-timeout", "3")
    assert res.returncode == 1, res.stdout + res.stderr  # one test fails on purpose
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench.json", "bench.log", "check.log", "info.json", "junit.xml",
                     "pytest.log", "sanitize.json", "sanitize.log", "summary.json"]
    assert json.loads((out / "sanitize.json").read_text())["tier"] == "quick"
    assert all((out / name).is_file() for name in files)  # flat: no folders
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["passed"], summary["failed"], summary["skipped"]) == (1, 1, 1)
    assert summary["failed_tests"] == ["tests/test_fake.py::test_fails"]
    assert summary["timed_out"] is False
    info = json.loads((out / "info.json").read_text())
    assert info["gpurt"]["path"] != str(fake_tree / "gpurt")  # the copy with kernels in it
    bench = json.loads((out / "bench.json").read_text())
    status = {run["bench"]: run["status"] for run in bench["runs"]}
    assert status == {"bench_bad": "failed", "bench_ok": "ok", "bench_slow": "timeout"}
    assert bench["suites"]["fake"]["rows"] == [{"x": 1}]
    assert "broken on purpose" in (out / "bench.log").read_text()
    assert "1 passed, 1 failed, 1 skipped" in res.stdout
    assert not (fake_tree / "gpurt" / "kernels").exists()  # the tree itself is untouched


# gpu-check runs pytest through pytest-xdist (one worker, replaced when a test crashes it)
# where that is installed, as on the GPU machine: the results must read the same either way.
XDIST = importlib.util.find_spec("xdist") is not None


@pytest.mark.skipif(sys.version_info < (3, 11), reason="gpu-check runs python3 -P (3.11+)")
def test_gpu_check_selects_tests_and_one_benchmark(fake_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_check(fake_tree, out, "-k", "passes")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["passed"], summary["failed"]) == (1, 0)
    assert summary["deselected"] == (None if XDIST else 2)  # xdist does not count them
    assert ("[gw0]" in (out / "pytest.log").read_text()) == XDIST
    assert not (out / "bench.json").exists()  # -k alone: tests only

    out2 = tmp_path / "out2"
    res = run_check(fake_tree, out2, "--bench", "ok")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (out2 / "summary.json").exists()  # --bench alone: that benchmark only
    bench = json.loads((out2 / "bench.json").read_text())
    assert [run["bench"] for run in bench["runs"]] == ["bench_ok"]
    assert not (out / "sanitize.json").exists() and not (out2 / "sanitize.json").exists()

    out3 = tmp_path / "out3"
    res = run_check(fake_tree, out3, "--sanitize")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((out3 / "sanitize.json").read_text())["tier"] == "full"
    assert not (out3 / "summary.json").exists() and not (out3 / "bench.json").exists()
    (fake_tree / "scripts" / "sanitize_sweep.py").write_text(
        FAKE_SWEEP.replace("'clean': True", "'clean': False"))
    res = run_check(fake_tree, tmp_path / "out4", "--sanitize")
    assert res.returncode == 1 and "not clean" in res.stdout, res.stdout + res.stderr


CSAN_TESTS = """\
import os
import gpurt

def test_csan_is_on():
    assert os.environ["GPURT_SANITIZER"] == "1" and gpurt.sanitizer.is_enabled()
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="gpu-check runs python3 -P (3.11+)")
def test_gpu_check_csan_runs_the_tests_with_the_sanitizer(fake_tree: Path, tmp_path: Path) -> None:
    (fake_tree / "tests" / "test_csan.py").write_text(CSAN_TESTS)
    out = tmp_path / "out"
    res = run_check(fake_tree, out, "--csan", "-k", "csan")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["passed"], summary["failed"]) == (1, 0)
    assert "with GPURT_SANITIZER=1" in (out / "check.log").read_text()
    assert not (out / "bench.json").exists() and not (out / "sanitize.json").exists()
    res = run_check(fake_tree, tmp_path / "out2", "-k", "csan")  # without --csan: off
    assert res.returncode == 1, res.stdout + res.stderr


def test_gpu_check_usage() -> None:
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Usage: scripts/gpu-check OUTDIR" in res.stdout


CRASHING_TESTS = """\
import os, signal

def test_first():
    pass

def test_crashes():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_later():
    pass
"""


@pytest.mark.skipif(not XDIST, reason="a crash ends the run without pytest-xdist")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="gpu-check runs python3 -P (3.11+)")
def test_gpu_check_survives_a_crashing_test(fake_tree: Path, tmp_path: Path) -> None:
    (fake_tree / "tests" / "test_fake.py").write_text(CRASHING_TESTS)
    out = tmp_path / "out"
    res = run_check(fake_tree, out, "--tests-only")
    assert res.returncode == 1, res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["passed"], summary["failed"]) == (2, 1)  # test_later still ran
    assert summary["failed_tests"] == ["tests/test_fake.py::test_crashes"]
    assert "crashed" in summary["failure_reasons"]["tests/test_fake.py::test_crashes"]
