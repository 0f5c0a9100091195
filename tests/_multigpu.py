"""The skip condition shared by the tests that need several GPUs (and NCCL)."""

from __future__ import annotations

import pytest

import gpurt
from gpurt.distributed import _nccl


def why_not(nccl: bool) -> str | None:
    """Why the multi-GPU tests cannot run here (None when they can)."""
    if not gpurt.is_available():
        return "no GPU"
    if gpurt.device_count() < 2:
        return f"needs 2+ GPUs, this machine has {gpurt.device_count()}"
    if nccl and not _nccl.is_available():
        return "NCCL (nccl4py) is not installed: pip install '.[nccl]'"
    return None


def multi_gpu(nccl: bool = True) -> pytest.MarkDecorator:
    """Skip (with the reason) unless 2+ GPUs, and NCCL if ``nccl``, are there."""
    reason = why_not(nccl)
    return pytest.mark.skipif(reason is not None, reason=str(reason))
