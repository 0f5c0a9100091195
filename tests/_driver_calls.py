"""Stand-ins for the driver's cuLaunchKernel that gpurt._launch._claunch can call: a ctypes callback
with its C signature, whose address takes the place of the one cuGetProcAddress returns."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

# CUresult cuLaunchKernel(CUfunction, 3 x grid, 3 x block, unsigned shared, CUstream,
#                         void** params, void** extra); pointers arrive as int or None
LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class CLaunchKernel:
    """A C-callable cuLaunchKernel that calls ``fn`` with the C arguments and returns what it
    returns. An exception in ``fn`` cannot cross the C call: it is kept in ``errors`` (check
    that it stays empty) and the launch returns CUDA_ERROR_UNKNOWN (999)."""

    def __init__(self, fn: Callable[..., int]) -> None:
        self.errors: list[BaseException] = []

        def call(*args: Any) -> int:
            try:
                return int(fn(*args))
            except BaseException as exc:  # noqa: BLE001  (reported through self.errors)
                self.errors.append(exc)
                return 999

        self.callback = LAUNCH_KERNEL(call)  # kept alive as long as this object
        self.address = ctypes.cast(self.callback, ctypes.c_void_p).value or 0
