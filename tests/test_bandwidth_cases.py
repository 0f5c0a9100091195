"""gpurt.random's fills and ReductionKernel sums on stored views (tests/_bandwidth_cases.py):
every fill kernel bit for bit at every store path (aligned vectors, misaligned, strided),
sums over rows, columns and everything, and nothing written outside the output views."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cases = pytest.importorskip("_bandwidth_cases")


@pytest.mark.parametrize("case", cases.fill_cases("quick"), ids=str)
def test_fill_of_a_stored_view(case, gpu_state):
    cases.run_fill(case, np.random.default_rng(zlib.crc32(str(case).encode())))


@pytest.mark.parametrize("case", cases.reduce_cases("quick"), ids=str)
def test_sum_of_a_stored_view(case, gpu_state):
    cases.run_reduce(case, np.random.default_rng(zlib.crc32(str(case).encode())))
