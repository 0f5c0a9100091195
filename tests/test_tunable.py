"""gpurt.kernels.tunable: torch.cuda.tunable's controls over the GEMM autotuner (CPU), and
their effect on gemm (GPU)."""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt

tunable = importlib.import_module("gpurt.kernels.tunable")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
tuning = importlib.import_module("gpurt.kernels._gemm_tuner")
gemm_mod = importlib.import_module("gpurt.kernels.gemm")
plans = importlib.import_module("gpurt.kernels._gemm_plan")
choosing = importlib.import_module("gpurt.kernels._gemm_choose")

GOOD = {"config": tune._MMA[0].to_json(), "ms": 0.5, "timings_ms": {"x": 0.5}}


@pytest.fixture(autouse=True)
def _restore_settings(tmp_path):
    saved = tunable.SETTINGS.__dict__.copy()
    tunable.set_filename(str(tmp_path / "results.json"))
    yield
    tunable.SETTINGS.__dict__.update(saved)
    gemm_mod.clear_plans()


def write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def test_switches_and_limits():
    tunable.enable(False)
    assert not tunable.is_enabled()
    tunable.enable()
    assert tunable.is_enabled()
    tunable.tuning_enable(False)
    assert not tunable.tuning_is_enabled()
    tunable.set_max_tuning_duration(12.5)
    assert tunable.get_max_tuning_duration() == 12.5
    tunable.set_max_tuning_iterations(7)
    assert tunable.get_max_tuning_iterations() == 7
    with pytest.raises(ValueError, match="duration"):
        tunable.set_max_tuning_duration(0)
    with pytest.raises(ValueError, match="iterations"):
        tunable.set_max_tuning_iterations(0)


def test_rotating_buffer_size_has_torchs_meaning():
    assert tunable.get_rotating_buffer_size() == -1  # the default: the L2's size
    assert tunable.rotating_bytes(50 << 20) == 50 << 20
    tunable.set_rotating_buffer_size(256)
    assert tunable.get_rotating_buffer_size() == 256
    assert tunable.rotating_bytes(50 << 20) == 256 << 20
    tunable.set_rotating_buffer_size(0)  # off: the callers' operands only
    assert tunable.rotating_bytes(50 << 20) == 0


def test_operand_spans_cover_the_last_element():
    op = plans.Operand(None, 0, 40, True)  # rows of k = 30 elements, pitch 40
    assert choosing.span_bytes(op, 10, 30, 2) == (9 * 40 + 30) * 2
    op = plans.Operand(None, 0, 12, False)  # column-major: k columns of 10 rows, pitch 12
    assert choosing.span_bytes(op, 10, 30, 4) == (29 * 12 + 10) * 4


def test_enabled_follows_the_environment_until_set(monkeypatch):
    tunable.SETTINGS.enabled = None
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "off")
    assert not tunable.is_enabled()
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "1")
    assert tunable.is_enabled()


def test_a_setting_change_forgets_gemm_plans():
    gemm_mod._calls[("fake",)] = None  # type: ignore[assignment]
    tunable.tuning_enable(True)
    assert not gemm_mod._calls


def test_filename_read_write_and_results(tmp_path):
    assert tunable.get_filename() == str(tmp_path / "results.json")
    source = write(tmp_path / "elsewhere.json", {"schema": 1, "results": {"k1": GOOD}})
    assert tunable.read_file(source) == {"k1": GOOD}
    assert tunable.get_results()["k1"]["ms"] == 0.5
    assert tunable.write_file()
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["results"]["k1"] == GOOD
    copy = tmp_path / "copy" / "out.json"
    assert tunable.write_file(str(copy))
    assert json.loads(copy.read_text())["results"] == {"k1": GOOD}


def test_read_file_keeps_only_well_formed_results(tmp_path):
    bad_config = {**GOOD, "config": {"kernel": "cublas", "bm": 1, "bn": 1, "bk": 1}}
    doc = {"schema": 1, "results": {"good": GOOD, "bad": bad_config, "worse": [1, 2],
                                    "no_ms": {"config": GOOD["config"]}}}
    assert set(tunable.read_file(write(tmp_path / "mixed.json", doc))) == {"good"}


@pytest.mark.parametrize("content", [
    "[]", '{"schema": 2, "results": {}}', '{"schema": 1, "results": []}', "not json",
    "[" * 100000 + "]" * 100000,
])
def test_read_file_refuses_what_is_not_a_results_file(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError):
        tunable.read_file(str(path))


def test_read_file_does_not_follow_links_or_read_devices(tmp_path):
    target = write(tmp_path / "real.json", {"schema": 1, "results": {"k": GOOD}})
    link = tmp_path / "link.json"
    os.symlink(target, link)
    with pytest.raises(OSError):
        tunable.read_file(str(link))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="regular"):
        tunable.read_file(str(fifo))  # returns at once: no hang on a FIFO


def test_read_file_refuses_huge_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "_MAX_FILE_BYTES", 100)
    path = write(tmp_path / "big.json", {"schema": 1, "results": {f"k{i}": GOOD
                                                                   for i in range(10)}})
    with pytest.raises(ValueError, match="bytes"):
        tunable.read_file(path)


def test_a_corrupt_default_file_is_tuned_over(tmp_path):
    (tmp_path / "results.json").write_text("{")
    assert tunable.tuner().lookup("anything") is None  # no exception: tune again


@pytest.mark.gpu
def test_tuning_disabled_uses_known_results_and_heuristics(gpu_state, tmp_path):
    rng = np.random.default_rng(3)
    a = gpurt.asarray(rng.standard_normal((512, 512)).astype(np.float16))
    b = gpurt.asarray(rng.standard_normal((512, 512)).astype(np.float16))
    tunable.enable(True)
    tunable.tuning_enable(False)
    gemm_mod.gemm(a, b)
    assert tunable.get_results() == {}  # nothing was timed
    tunable.tuning_enable(True)
    tunable.set_max_tuning_iterations(3)
    out = gemm_mod.gemm(a, b)
    (entry,) = tunable.get_results().values()
    assert entry["ms"] > 0
    want = a.to_numpy().astype(np.float64) @ b.to_numpy().astype(np.float64)
    got = np.asarray(out.to_numpy(), dtype=np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    assert (tmp_path / "results.json").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 3])
def test_rotating_copies_hold_the_operands_at_their_alignment(gpu_state, offset):
    """The tuner's timed runs rotate over copies that hold the same values at the same
    address modulo 256 bytes (the kernels' eligibility depends on it), enough of them to fill
    the rotating buffer, and none for operands larger than it."""
    rng = np.random.default_rng(5)
    m, n, k = 96, 200, 136
    base = rng.standard_normal(m * k + offset).astype(np.float16)
    a = gpurt.asarray(base)[offset:].reshape(m, k)
    b = gpurt.asarray(rng.standard_normal((k, n)).astype(np.float16))
    plan, _, _ = plans.make_plan(a, b, None, 0.0, None, False, False, gpurt.current_stream())
    tunable.set_rotating_buffer_size(1)  # 1 MB: (m*k + k*n) * 2 bytes = 79 KB a pair
    stream = gpurt.Stream()
    pairs, held = choosing.rotating_operands(plan, stream)
    stream.synchronize()
    spans = [choosing.span_bytes(op, rows, k, 2) for op, rows in ((plan.a, plan.m),
                                                                   (plan.b, plan.n))]
    assert len(pairs) == 1 + -(-(1 << 20) // sum(spans)) and len(held) == 2 * (len(pairs) - 1)
    host = [np.empty(span, np.uint8) for span in spans]
    for ptrs in pairs:
        for ptr, orig, span, out in zip(ptrs, (plan.a.ptr, plan.b.ptr), spans, host):
            assert ptr % 256 == orig % 256
            gpurt.check(cu.cuMemcpyDtoH(out.ctypes.data, ptr, span), "cuMemcpyDtoH")
            want = np.empty(span, np.uint8)
            gpurt.check(cu.cuMemcpyDtoH(want.ctypes.data, orig, span), "cuMemcpyDtoH")
            assert np.array_equal(out, want)
    tunable.set_rotating_buffer_size(0)
    assert choosing.rotating_operands(plan, stream)[0] == [(plan.a.ptr, plan.b.ptr)]


@pytest.mark.gpu
def test_shapes_of_one_bucket_are_tuned_apart(gpu_state):
    """768^3 and 1024^3 fp32 (one power-of-two bucket, different best grids) are each timed
    and kept under their own exact-shape key (before session 11, 768^3 ran 1024^3's 128 x 256
    split 4), and each result is right against float64."""
    rng = np.random.default_rng(11)
    tunable.enable(True)
    tunable.tuning_enable(True)
    tunable.set_max_tuning_iterations(3)
    for size in (1024, 768):
        a = rng.standard_normal((size, size)).astype(np.float32)
        b = rng.standard_normal((size, size)).astype(np.float32)
        out = gpurt.asarray(np.full((size, size), np.nan, np.float32))
        gemm_mod.gemm(gpurt.asarray(a), gpurt.asarray(b), out=out)
        want = a.astype(np.float64) @ b.astype(np.float64)
        got = out.to_numpy().astype(np.float64)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    shapes = sorted(key.rsplit("|", 1)[1] for key in tunable.get_results())
    assert shapes == ["1024x1024x1024", "768x768x768"]


def test_the_shipped_tuning_table_is_keyed_to_the_current_kernels():
    """kernels/tuning/*.json (built into the kernel archive) holds results keyed by the GEMM
    sources' digest: after a kernel source change, the table is re-keyed (where the timed
    kernels' PTX is unchanged: benchmarks/ptx_identity.py) or re-tuned, never left stale —
    stale keys are ignored silently and every tuned shape falls back to the heuristic."""
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    prebuilt = importlib.import_module("gpurt.kernels._prebuilt")
    files = prebuilt._default_tuning()
    assert files
    digest = launch.source_digest()
    for path in files:
        keys = json.loads(open(path).read())["results"]
        stale = {key.split("|")[1] for key in keys} - {digest}
        assert keys and not stale, (path, stale, digest)
