"""Shared fixtures: the ``gpu`` marker skips without a usable GPU, and GPU tests get the
current device and stream restored after them."""

from __future__ import annotations

import pytest

import gpurt

_GPU = gpurt.is_available()
_WHY = "no usable NVIDIA GPU/driver here (gpurt.is_available() is False)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
