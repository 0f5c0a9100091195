"""Arrays and a device for planning elementwise and reduction kernels on a machine without
a GPU: gpurt.Array objects over made-up addresses (never launched), the architecture pinned
to sm_90 so the kernels really compile through NVRTC."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpurt
from gpurt._elementwise import api, reduction


def fake_array(shape: tuple[int, ...], dtype: Any = np.float32, ptr: int = 1 << 20,
               strides: tuple[int, ...] | None = None) -> gpurt.Array:
    """A gpurt.Array that only carries metadata (its memory does not exist)."""
    dt = np.dtype(dtype)
    if strides is None:
        strides = np.empty(shape, dtype=dt).strides if shape else ()
    array = object.__new__(gpurt.Array)
    array.ptr, array.shape, array.strides, array.dtype = ptr, tuple(shape), tuple(strides), dt
    device = object.__new__(gpurt.Device)
    device.index = 0
    array.device = device
    array.stream = None
    array._owner = None
    contiguous = tuple(strides) == (np.empty(shape, dtype=dt).strides if shape else ())
    array._contiguous = contiguous
    return array


@pytest.fixture
def sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan for an sm_90 device 0 with 132 SMs, without touching a GPU."""

    class Props:
        multi_processor_count = 132

    for where in (gpurt, api):  # the machinery calls gpurt's names through _elementwise.api
        monkeypatch.setattr(where, "get_arch", lambda device=None: "sm_90")
        monkeypatch.setattr(where, "current_device", lambda: 0)
        monkeypatch.setattr(where, "get_device_properties", lambda device=None: Props())
    # the occupancy of a compiled kernel needs a device: 8 blocks of 256 threads per SM
    monkeypatch.setattr(reduction, "_blocks_per_sm", lambda kernel, device: 8)
