"""The SMs this process may use on a device: fewer than the device has under MPS with an
active thread percentage (the context's execution affinity). Kernels whose CTAs wait for each
other (a cooperative launch, softmax's ticket chunks) must count these, not the device's, or
be refused or never finish; the wave models count them too."""

from __future__ import annotations

from cuda.bindings import driver as cu

import gpurt

__all__ = ["usable_sms"]

_usable: dict[int, int] = {}


def usable_sms(index: int, sm_count: int) -> int:
    """SMs this process may use on device ``index`` (of its ``sm_count``), cached per device."""
    found = _usable.get(index)
    if found is None:
        with gpurt.device(index):
            err, param = cu.cuCtxGetExecAffinity(
                cu.CUexecAffinityType.CU_EXEC_AFFINITY_TYPE_SM_COUNT)
        # a driver without execution affinity: nothing limits the context
        limit = int(param.param.smCount.val) if err == cu.CUresult.CUDA_SUCCESS else sm_count
        found = _usable[index] = min(sm_count, limit) if limit > 0 else sm_count
    return found
