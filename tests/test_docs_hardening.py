"""The documentation items of issue #18: migration.md's list of what gpurt does not have is
complete (the torch.cuda features the issue names) and true (gpurt has none of them), and
README says that memviz's --png needs the plot extra."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpurt
import gpurt.memory

ROOT = Path(__file__).resolve().parent.parent
MISSING = ["cudart", "check_error"]


def section() -> str:
    text = (ROOT / "docs" / "migration.md").read_text()
    return text[text.index("## What gpurt does not have"):]


@pytest.mark.parametrize("name", MISSING)
def test_the_list_of_what_is_missing_is_complete(name: str) -> None:
    assert name in section()


@pytest.mark.parametrize("name", ["cudart", "check_error"])
def test_the_list_is_true(name: str) -> None:
    assert not hasattr(gpurt, name) and not hasattr(gpurt.memory, name)


def test_what_left_the_list_is_there() -> None:
    import importlib

    assert callable(gpurt.manual_seed) and callable(gpurt.get_rng_state)
    for name in ("get_arch_list", "get_gencode_flags", "is_bf16_supported",
                 "is_tf32_supported", "list_gpu_processes", "device_memory_used", "ipc_collect"):
        assert callable(getattr(gpurt, name)), name
    assert callable(gpurt.gds.GdsFile) and callable(gpurt.ipc.export_array)
    assert callable(gpurt.set_sync_debug_mode) and callable(gpurt.get_sync_debug_mode)
    assert callable(gpurt.sanitizer.enable_cuda_sanitizer)
    assert callable(gpurt.MemPool) and callable(gpurt.use_mem_pool)
    assert callable(gpurt.CUDAPluggableAllocator) and callable(gpurt.change_current_allocator)
    assert callable(gpurt.memory._set_allocator_settings)
    assert callable(importlib.import_module("gpurt.kernels.tunable").tuning_enable)


def test_readme_says_png_needs_the_plot_extra() -> None:
    line = next(row for row in (ROOT / "README.md").read_text().splitlines()
                if "--png" in row)
    assert "gpurt[plot]" in line
