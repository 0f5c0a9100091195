"""The public gpurt names that the elementwise machinery (and gpurt.amp) call, taken from the
modules that define them: the package ``gpurt`` imports these modules, so they must not
import it back. Used as ``from ._elementwise import api as gpurt``, so the code reads as it
would in user code."""

from __future__ import annotations

from ..array import Array, asarray, bfloat16, empty, full, zeros
from ..device import current_device, device, get_arch, get_device_properties
from ..nvrtc import LaunchConfig, add_dispatch, compile, dispatch, plan_key
from ..streams import current_stream_handle

__all__ = ["Array", "LaunchConfig", "add_dispatch", "asarray", "bfloat16", "compile",
           "current_device", "current_stream_handle", "device", "dispatch", "empty", "full",
           "get_arch", "get_device_properties", "plan_key", "zeros"]
