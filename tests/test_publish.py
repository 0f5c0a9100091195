"""benchmarks/publish.py and benchmarks/run_all.py on synthetic results (CPU only)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _merge
import publish
import run_all

H200_ENV = {"date": "2026-11-21T10:00:00+00:00", "python": "3.12.3", "gpurt": "0.1.0",
            "cuda_bindings": "13.3.0", "driver_cuda_version": 13000, "device": "NVIDIA H200",
            "capability": [9, 0], "torch": "2.11.0", "cupy": "14.0.0", "numpy": "2.3.0"}

# one suite per row shape the benchmarks write
SUITES: dict[str, list[Any]] = {
    # wide rows: one line each, a column per implementation
    "gemm": [
        {"name": "4096^3", "dtype": "bf16", "unit": "TFLOP/s", "gpurt": 700.0, "torch": 745.0,
         "ratio": 0.94},
        {"shape": "127x257x61", "dtype": "fp32", "unit": "TFLOP/s", "gpurt": 2.0,
         "torch": 1.0},
    ],
    # prefixed columns, as bench_gemm.py and bench_softmax.py write them
    "gemm2": [
        {"shape": "4096x4096x4096", "dtype": "bf16", "config": "128x256x64 *",
         "gpurt_tflops": 700.0, "cublas_tflops": 745.0, "ratio": 0.94, "gpurt_ms": 0.196,
         "cublas_ms": 0.184, "rel_err": 0.0021, "autotune": "1"},
    ],
    "softmax": [
        {"shape": "4096x8192", "dtype": "float32", "op": "softmax", "gpurt_GBps": 3600.0,
         "copy_GBps": 4000.0, "pct_copy": 90.0, "torch_GBps": 1800.0, "vs_torch": 2.0,
         "target_pct": 90, "meets_target": True},
    ],
    # long rows: one implementation per row, versions in the name, two measurements
    "graphs": [
        {"impl": "gpurt", "mode": "eager", "host_us": 300.0, "device_ms": 0.2, "kernels": 100},
        {"impl": "gpurt", "mode": "graph replay", "host_us": 50.0, "device_ms": 0.1,
         "kernels": 100},
        {"impl": "torch 2.11.0", "mode": "graph replay", "host_us": 100.0, "device_ms": 0.1,
         "kernels": 100},
        {"summary": {"gpurt_capture_host_speedup": 6.0, "capture_target_met(>=4x)": True}},
    ],
    # long rows under "lib", a peer missing on one line, a row that fits no convention
    "array": [
        {"what": "empty+del (1024,)", "lib": "gpurt", "host_us": 1.0},
        {"what": "empty+del (1024,)", "lib": "torch", "host_us": 1.5},
        {"what": "empty+del (1024,)", "lib": "cupy", "host_us": 0.8},
        {"what": "view a.T", "lib": "gpurt", "host_us": 0.5},
        {"comment": "nothing measured here"},
    ],
    # a unit with no known direction: values shown, no ratio
    "odd": [{"name": "widgets", "unit": "widgets", "gpurt": 3.0, "cupy": 4.0}],
}


def merged_doc(env: dict[str, Any], suites: dict[str, list[Any]]) -> dict[str, Any]:
    runs = [_merge.run_record(f"bench_{name}", 0, 1.5, "ok") for name in suites]
    runs.append(_merge.run_record("bench_softmax", 1, 3.0, "failed", "exit code 1: boom"))
    docs: dict[str, Any] = {name: {"suite": name, "env": env, "rows": rows}
                            for name, rows in suites.items()}
    docs["broken"] = {"error": "unreadable broken.json"}
    return {"env": env, "runs": runs, "suites": docs}


README_TEXT = """# gpurt

Intro.

## Performance

<!-- perf:begin -->
old text
<!-- perf:end -->

## License

Apache-2.0.
"""


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(merged_doc(H200_ENV, SUITES)))
    results = tmp_path / "results"
    readme = tmp_path / "README.md"
    readme.write_text(README_TEXT)
    report = publish.publish(bench, results, readme)
    return results, readme, report


def lines_of(table: publish.SuiteTable) -> dict[str, publish.Line]:
    return {f"{line.name} [{line.unit}]": line for line in table.lines}


def test_wide_rows() -> None:
    table = publish.read_rows("gemm", SUITES["gemm"])
    lines = lines_of(table)
    bf16 = lines["4096^3 (bf16) [TFLOP/s]"]
    assert bf16.values == {"gpurt": 700.0, "torch": 745.0}
    assert bf16.better == "higher"
    assert bf16.ratio("torch") == pytest.approx(700 / 745)  # the bench's own ratio is not used
    fp32 = lines["127x257x61 · fp32 [TFLOP/s]"]
    assert fp32.ratio("torch") == pytest.approx(2.0)
    assert table.peers == ["torch"]


def test_prefixed_columns() -> None:
    gemm = lines_of(publish.read_rows("gemm2", SUITES["gemm2"]))
    name = "4096x4096x4096 · bf16 · 128x256x64 * · autotune=1"
    rate, time = gemm[f"{name} [TFLOP/s]"], gemm[f"{name} [ms]"]
    assert rate.values == {"gpurt": 700.0, "cublas": 745.0}
    assert rate.ratio("cublas") == pytest.approx(700 / 745)
    assert time.ratio("cublas") == pytest.approx(0.184 / 0.196)
    assert rate.details == "rel_err=0.0021"
    softmax = publish.read_rows("softmax", SUITES["softmax"])
    line = lines_of(softmax)["4096x8192 · float32 · softmax [GB/s]"]
    assert line.values == {"gpurt": 3600.0, "copy": 4000.0, "torch": 1800.0}
    assert line.ratio("torch") == pytest.approx(2.0) and line.ratio("copy") == pytest.approx(0.9)
    assert line.details == "pct_copy=90, target_pct=90, meets_target=True"
    assert softmax.peers == ["torch", "copy"]


def test_chart_bars_tell_bounds_from_peers() -> None:
    bars = publish.ratio_bars([publish.read_rows("softmax", SUITES["softmax"])])
    assert [(b.other, b.reference) for b in bars] == [("torch", False), ("copy", True)]
    assert bars[1].text() == "softmax: 4096x8192 · float32 · softmax [GB/s] vs memcpy"
    assert bars[1].text(width=10).startswith("softmax...")


def test_long_rows_are_pivoted_per_measurement() -> None:
    table = publish.read_rows("graphs", SUITES["graphs"])
    lines = lines_of(table)
    replay = lines["graph replay · kernels=100 [us (host)]"]
    assert replay.values == {"gpurt": 50.0, "torch": 100.0}
    assert replay.better == "lower"
    assert replay.ratio("torch") == pytest.approx(2.0)  # torch's time / gpurt's time
    assert lines["graph replay · kernels=100 [ms (device)]"].ratio("torch") == pytest.approx(1.0)
    assert lines["eager · kernels=100 [us (host)]"].ratio("torch") is None  # no torch value
    assert table.notes == ["gpurt_capture_host_speedup: 6", "capture_target_met(>=4x): True"]
    assert table.other == []


def test_other_and_unknown_units() -> None:
    array = publish.read_rows("array", SUITES["array"])
    assert array.impls == ["gpurt", "torch", "cupy"]
    empty = lines_of(array)["empty+del (1024,) [us (host)]"]
    assert empty.ratio("torch") == pytest.approx(1.5)
    assert empty.ratio("cupy") == pytest.approx(0.8)
    assert array.other == [{"comment": "nothing measured here"}]
    odd = publish.read_rows("odd", SUITES["odd"])
    assert odd.lines[0].better is None and odd.lines[0].ratio("cupy") is None


@pytest.mark.parametrize("text, impl", [("torch 2.11.0", "torch"), ("torch.cuda.nvtx", "torch"),
                                        ("cuda.core 0.4", "cuda_core"), ("CuPy", "cupy"),
                                        ("nvtx package", "nvtx"), ("gpurt", "gpurt"),
                                        ("driver", "raw"), ("cuda_core", "cuda_core")])
def test_impl_names(text: str, impl: str) -> None:
    assert publish.impl_name(text) == impl


def test_units_and_slugs() -> None:
    assert publish.metric_unit("host_us") == ("us (host)", "lower")
    assert publish.metric_unit("gbps") == ("GB/s", "higher")
    assert publish.metric_unit("kernels") is None
    assert publish.direction("GB/s") == "higher" and publish.direction("us") == "lower"
    assert publish.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert publish.slug(None) == "unknown-device"


def test_publish_writes_result_files(published: tuple[Path, Path, list[str]]) -> None:
    results, _, report = published
    names = sorted(p.name for p in results.iterdir())
    expected = ["RESULTS.md", "array-nvidia-h200.json", "gemm-nvidia-h200.json",
                "gemm2-nvidia-h200.json", "graphs-nvidia-h200.json", "odd-nvidia-h200.json",
                "softmax-nvidia-h200.json"]
    if publish.Figure is not None:
        expected.append("ratios-nvidia-h200.png")
    assert names == sorted(expected)
    (results / "notes.json").write_text(json.dumps({"suite": "x", "env": {}, "rows": [{}]}))
    assert [t.suite for t in publish.load_results(results)] == [
        "array", "gemm", "gemm2", "graphs", "odd", "softmax"]  # only the files publish wrote
    doc = json.loads((results / "gemm-nvidia-h200.json").read_text())
    assert doc["rows"] == SUITES["gemm"] and doc["env"]["device"] == "NVIDIA H200"
    assert doc["run"]["status"] == "ok"
    assert any("broken: no rows (unreadable broken.json)" in line for line in report)
    assert any("bench_softmax: failed (exit code 1: boom)" in line for line in report)


def test_results_markdown(published: tuple[Path, Path, list[str]]) -> None:
    results, _, _ = published
    text = (results / "RESULTS.md").read_text()
    assert "## NVIDIA H200" in text and "### graphs" in text
    assert "NVIDIA H200, 2026-11-21; driver CUDA 13.0, cuda-bindings 13.3.0" in text
    assert "same process, in the same run" in text
    assert ("| graph replay · kernels=100 | us (host) | 50 | 100 | 2.00x |") in text
    assert "| what | unit | gpurt | torch | CuPy | gpurt vs torch | gpurt vs CuPy |" in text
    assert "| empty+del (1024,) | us (host) | 1 | 1.5 | 0.8 | 1.50x | 0.80x |" in text
    assert "- gpurt_capture_host_speedup: 6" in text
    assert '- row: `{"comment": "nothing measured here"}`' in text


def test_readme_section_is_replaced(published: tuple[Path, Path, list[str]]) -> None:
    _, readme, _ = published
    text = readme.read_text()
    assert "old text" not in text
    assert text.startswith("# gpurt\n\nIntro.\n") and text.endswith("## License\n\nApache-2.0.\n")
    section = text[text.index(publish.BEGIN): text.index(publish.END)]
    assert "**NVIDIA H200**, 2026-11-21; driver CUDA 13.0" in section
    assert "same run" in section and "results/RESULTS.md" in section
    assert "| graphs | graph replay · kernels=100 | us (host) | 50 | torch 100 | 2.00x torch |" \
        in section
    assert "view a.T" not in section  # lines without a peer stay in RESULTS.md only
    if publish.Figure is not None:
        assert "results/ratios-nvidia-h200.png" in section


def test_publish_is_idempotent_and_keeps_other_devices(
        published: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    results, readme, _ = published
    first = readme.read_text()
    h100 = dict(H200_ENV, device="NVIDIA H100 80GB HBM3", date="2026-11-22T08:00:00+00:00")
    bench = tmp_path / "h100.json"
    bench.write_text(json.dumps(merged_doc(h100, {"array": SUITES["array"]})))
    publish.publish(bench, results, readme)
    assert (results / "array-nvidia-h100-80gb-hbm3.json").exists()
    assert (results / "array-nvidia-h200.json").exists()
    text = (results / "RESULTS.md").read_text()
    assert "## NVIDIA H100 80GB HBM3" in text and "## NVIDIA H200" in text
    second = readme.read_text()
    assert "**NVIDIA H100 80GB HBM3**, 2026-11-22" in second
    # the H200's results (2026-11-21) predate the H100's: said once per device, in both files
    older = "Older results: this device last ran on 2026-11-21, before the newest results here"
    assert second.count(older) == 1 and text.count(older) == 1
    assert second.index(older) > second.index("**NVIDIA H200**")
    publish.publish(bench, results, readme)
    assert readme.read_text() == second != first


def test_no_results_and_missing_markers(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"env": None, "runs": [], "suites": {}}))
    readme = tmp_path / "README.md"
    readme.write_text(README_TEXT)
    publish.publish(bench, tmp_path / "results", readme)
    assert "Not measured yet" in readme.read_text()
    assert "No results yet" in (tmp_path / "results" / "RESULTS.md").read_text()
    readme.write_text("# no markers\n")
    assert publish.main([str(bench), "--results", str(tmp_path / "r2"),
                         "--readme", str(readme)]) == 1


def test_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "chart.png"
    bars = [publish.Bar("a: x [us]", "torch", 1.5, False),
            publish.Bar("b: y", "cupy", 0.5, False),
            publish.Bar("c: z [GB/s]", "copy", 0.9, True)]
    assert publish.write_chart(bars, "GPU", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not publish.write_chart([], "GPU", tmp_path / "none.png")


def test_repository_readme_has_the_markers() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.count(publish.BEGIN) == 1 and text.count(publish.END) == 1
    assert text.index(publish.BEGIN) > text.index("## Performance")


# ---- run_all -------------------------------------------------------------------------------


def test_select_and_names(tmp_path: Path) -> None:
    benches = [tmp_path / "bench_graphs.py", tmp_path / "bench_nvtx.py"]
    assert run_all.suite_name("bench_nvtx.py") == "nvtx"
    assert run_all.select(benches, []) == benches
    assert run_all.select(benches, ["bench_nvtx", "graphs.py"]) == benches
    assert run_all.select(benches, ["nvtx"]) == [benches[1]]
    with pytest.raises(ValueError, match="no benchmark named gemm"):
        run_all.select(benches, ["gemm"])
    assert {p.name for p in run_all.discover()} >= {"bench_graphs.py", "bench_nvtx.py"}


FAKE_OK = """
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
doc = {"suite": "fake", "env": {"device": "Fake GPU", "date": "2026-01-01"},
       "rows": [{"name": "x", "unit": "us", "gpurt": 1.0, "torch": 2.0}]}
with open(os.path.join(os.environ["GPURT_BENCH_OUT"], "fake.json"), "w") as fh:
    json.dump(doc, fh)
print("fake ran")
"""


def test_run_suites_in_their_own_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bench_fake.py").write_text(FAKE_OK)
    (tmp_path / "bench_bad.py").write_text("print('about to fail')\nraise SystemExit(3)\n")
    (tmp_path / "bench_silent.py").write_text("pass\n")
    (tmp_path / "bench_slow.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(run_all, "gpu_missing", lambda: None)
    console = run_all.Console(file=io.StringIO(), width=200)
    out = tmp_path / "out"
    merged = run_all.run(run_all.discover(tmp_path), out, 5.0, False, console)
    status = {r["bench"]: r["status"] for r in merged["runs"]}
    assert status == {"bench_bad": "failed", "bench_fake": "ok", "bench_silent": "failed",
                      "bench_slow": "timeout"}
    notes = {r["bench"]: r.get("note", "") for r in merged["runs"]}
    assert "about to fail" in notes["bench_bad"] and "wrote no results" in notes["bench_silent"]
    assert merged["suites"]["fake"]["rows"][0]["gpurt"] == 1.0
    assert merged["env"]["device"] == "Fake GPU"  # the suite's environment wins
    assert json.loads((out / "bench.json").read_text()) == merged
    log = (out / "bench.log").read_text()
    assert "==== bench_fake" in log and "fake ran" in log
    # the merged file publishes as it is
    publish.publish(out / "bench.json", tmp_path / "results", None)
    assert (tmp_path / "results" / "fake-fake-gpu.json").exists()


def test_without_gpu_every_suite_is_skipped(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bench_fake.py").write_text(FAKE_OK)
    monkeypatch.setattr(run_all, "gpu_missing", lambda: "no NVIDIA driver")
    monkeypatch.setattr(run_all, "environment", lambda: {"device": None, "date": "today"})
    console = run_all.Console(file=io.StringIO(), width=200)
    merged = run_all.run(run_all.discover(tmp_path), tmp_path / "out", 5.0, False, console)
    assert [r["status"] for r in merged["runs"]] == ["skipped"]
    assert merged["suites"] == {} and merged["env"] == {"device": None, "date": "today"}
    assert merged["notes"][0] == "no GPU: no NVIDIA driver"


def test_gpurt_bench_command_lists_the_suites(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "gpurt", "bench", "--list"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "graphs" in res.stdout and "nvtx" in res.stdout
    res = subprocess.run([sys.executable, "-m", "gpurt", "bench", "--only", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no benchmark named nope" in res.stdout
