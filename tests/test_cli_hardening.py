"""The `gpurt` command's small hardening items (issue #18): `gpurt bench` runs only a gpurt
checkout's benchmarks/run_all.py. CPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpurt.__main__ as cli


def plant(folder: Path, marker: Path) -> None:
    (folder / "benchmarks").mkdir(parents=True)
    (folder / "benchmarks" / "run_all.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n")


def test_bench_never_runs_a_script_outside_a_gpurt_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"
    plant(tmp_path / "somewhere", marker)
    (tmp_path / "somewhere" / "pyproject.toml").write_text('[project]\nname = "other"\n')
    monkeypatch.chdir(tmp_path / "somewhere")
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "site" / "gpurt" / "__main__.py"))
    assert cli.main(["bench"]) == 2
    assert not marker.exists()
    assert "gpurt checkout" in capsys.readouterr().err


def test_bench_runs_the_checkout_that_gpurt_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    checkout = tmp_path / "src"
    plant(checkout, marker)
    (checkout / "pyproject.toml").write_text('[project]\nname = "gpurt"\n')
    (checkout / "gpurt").mkdir()
    (checkout / "gpurt" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "__file__", str(checkout / "gpurt" / "__main__.py"))
    assert cli.main(["bench"]) == 0
    assert marker.read_text() == "ran"


def test_a_test_run_leaves_no_cache_folder_behind(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GPURT_CACHE_DIR"}
    env["TMPDIR"] = str(tmp_path)
    tests = Path(__file__).parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{tests / 'test_cli_hardening.py'}::"
         "test_bench_never_runs_a_script_outside_a_gpurt_checkout"],
        env=env, cwd=tests.parent, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not list(tmp_path.glob("gpurt-test-cache-*"))
