"""Shared fixtures: the ``gpu`` marker skips without a usable GPU, and GPU tests get the
current device and stream restored after them."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

# Tests never write into the user's kernel cache: one fresh cache folder per test run
# (scripts/gpu-check sets its own), deleted when the run ends.
_MADE_CACHE: str | None = None
if not os.environ.get("GPURT_CACHE_DIR"):
    _MADE_CACHE = os.environ["GPURT_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpurt-test-cache-")

import gpurt  # noqa: E402
from gpurt._sanitizer import hooks as _sanitizer_hooks  # noqa: E402

_GPU = gpurt.is_available()
_WHY = "no usable NVIDIA GPU/driver here (gpurt.is_available() is False)"


# The files whose GPU tests took longest in session 17's suite (H100, 8 workers: 100-400 s
# each). Where xdist workers take a file each in collection order (scripts/gpu-check:
# --dist loadfile --no-loadscope-reorder), they start first, so that what is left at the end
# of a run is short files, not one of these.
_LONGEST_FIRST = ("test_gemm.py", "test_gemm_wgmma_x.py", "test_softmax_long.py",
                  "test_gemm_rowload.py", "test_gemm_lean.py", "test_softmax.py",
                  "test_softmax_persist.py", "test_gemm_swap.py", "test_gemm_stages.py",
                  "test_softmax_ends.py", "test_gpu_check.py", "test_gemm_skinny.py",
                  "test_gemm_tile192.py", "test_gemm_simt.py", "test_gemm_tile64.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker's order is the schedule's
        rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable
    if _GPU:
        return
    skip = pytest.mark.skip(reason=_WHY)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpu_state():
    """Restore this thread's current device after a GPU test."""
    before = gpurt.current_device()
    yield
    gpurt.set_device(before)


@pytest.fixture
def no_kept_memory(gpu_state):
    """Before a GPU test that counts the allocator's memory: drop what earlier tests of this
    process left allocated (the split-K workspaces and the reductions' ticket counters kept
    per stream, arrays only a reference cycle still holds), so every cached segment can go."""
    import gc

    gc.collect()
    gpurt.synchronize()
    workspace = sys.modules.get("gpurt.kernels._gemm_workspace")
    if workspace is not None:
        workspace.clear()
    from gpurt._elementwise import counters

    counters.clear()
    gpurt.synchronize()
    gpurt.empty_cache()


@pytest.fixture(autouse=True)
def _no_sanitizer_for_planted_races(request: pytest.FixtureRequest):
    """Tests marked ``races`` run with the stream sanitizer off when GPURT_SANITIZER (gpu-check
    --csan) turned it on for the run; it is back on, as it was, after them."""
    if "races" not in request.keywords or not gpurt.sanitizer.is_enabled():
        yield
        return
    raising = _sanitizer_hooks.RAISE
    gpurt.sanitizer.disable_cuda_sanitizer()
    try:
        yield
    finally:
        gpurt.sanitizer.enable_cuda_sanitizer("raise" if raising else "warn")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With GPURT_INSTAFAIL=1 (scripts/gpu-check sets it), print each failure as it happens,
    so a later crash of the process cannot take the report of earlier failures with it."""
    if report.failed and os.environ.get("GPURT_INSTAFAIL"):
        sys.stderr.write(f"\n--- FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n")
        sys.stderr.flush()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Delete the run's own kernel cache folder (never one that GPURT_CACHE_DIR named)."""
    if _MADE_CACHE is not None:
        shutil.rmtree(_MADE_CACHE, ignore_errors=True)
