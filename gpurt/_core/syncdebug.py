"""torch.cuda's sync debug mode: warn or raise when a gpurt call makes the host wait for the
device without being asked to.

As in torch (c10/cuda/CUDAFunctions: ``warn_or_error_on_sync``), the mode is one setting
for the process, and what counts is what torch counts: a copy to host memory that waits
(``Array.to_numpy()``, ``numpy()``, ``item()``, a blocking ``copy_`` from host memory), a
stream's ``synchronize()`` (torch's ``Stream.synchronize`` goes through
``c10::cuda::stream_synchronize``, which checks), and, beyond torch, an allocation that
synchronizes the device to free cached memory and retry. ``gpurt.synchronize()`` and
``Event.synchronize()`` never do, as ``torch.cuda.synchronize()`` and
``torch.cuda.Event.synchronize()`` don't.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

__all__ = ["get_sync_debug_mode", "set_sync_debug_mode", "user_stacklevel",
           "warn_or_error_on_sync"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # gpurt/

LEVEL = 0  # 0 default (silent), 1 warn, 2 error; read by the synchronizing sites

_NAMES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: Any) -> None:
    """Warn (``"warn"`` or 1) or raise (``"error"`` or 2) at every gpurt call that
    synchronizes the host with the device; ``"default"`` or 0 turns that off (torch's
    ``torch.cuda.set_sync_debug_mode``)."""
    global LEVEL
    if isinstance(debug_mode, str):
        if debug_mode not in _NAMES:
            raise RuntimeError(f'invalid value of debug_mode {debug_mode!r}, expected one of '
                               f'"default", "warn", "error" or 0, 1, 2')
        LEVEL = _NAMES[debug_mode]
        return
    if isinstance(debug_mode, bool) or not isinstance(debug_mode, int) or not 0 <= debug_mode <= 2:
        raise RuntimeError(f'invalid value of debug_mode {debug_mode!r}, expected one of '
                           f'"default", "warn", "error" or 0, 1, 2')
    LEVEL = debug_mode


def get_sync_debug_mode() -> int:
    """The sync debug mode as torch reports it: 0 default, 1 warn, 2 error."""
    return LEVEL


def warn_or_error_on_sync(what: str) -> None:
    """Called by a synchronizing site (named by ``what``) when ``LEVEL`` is not 0."""
    if LEVEL == 2:
        raise RuntimeError(f"called a synchronizing CUDA operation: {what}")
    if LEVEL == 1:
        warnings.warn(f"called a synchronizing CUDA operation: {what}", UserWarning,
                      stacklevel=user_stacklevel())


def user_stacklevel() -> int:
    """The ``stacklevel`` for a warning issued by this function's caller that points at
    the first frame outside the gpurt package (the user's call)."""
    frame: Any = sys._getframe(2)  # the warning caller's caller
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level
