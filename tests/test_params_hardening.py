"""bfloat16 kernel parameters take numbers only, as every other scalar type (issue #18).
CPU: kernel.pack needs NVRTC only."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import gpurt

SOURCE = r"""
#include <cuda_bf16.h>
extern "C" __global__ void k(__nv_bfloat16 bf, float f, int n) {}
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get("GPURT_CACHE_DIR"):
            patch.setenv("GPURT_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        return gpurt.compile(SOURCE, arch="sm_90")["k"]


@pytest.mark.parametrize("value", ["5", b"5", "nan", bytearray(b"1")])
def test_bfloat16_parameters_reject_strings_as_float_ones_do(kernel, value) -> None:
    with pytest.raises(TypeError, match="argument 0") as bf16_error:
        kernel.pack(value, 1.0, 0)
    with pytest.raises(TypeError, match="argument 1") as float_error:
        kernel.pack(1.0, value, 0)
    assert type(bf16_error.value) is type(float_error.value)


@pytest.mark.parametrize("value", [5, 2.5, np.float64(0.1), np.float32(-3.0), True])
def test_bfloat16_parameters_take_numbers(kernel, value) -> None:
    packed = kernel.pack(value, 1.0, 0)[:2]
    assert packed == np.array(float(value), ml_dtypes.bfloat16).tobytes()
