"""A stream sanitizer (torch.cuda._sanitizer's CSAN for gpurt): finds accesses to device
memory on one stream that are not ordered after a conflicting access on another.

Enabled with :func:`enable_cuda_sanitizer` or ``GPURT_SANITIZER=1`` (``=warn`` to warn
instead of raising) in the environment when gpurt is imported, it records, for every kernel
launch, copy, fill and host transfer through gpurt, which allocations of gpurt's allocators
are read and written on which stream. A kernel's pointer parameters are known from its
declaration: ``const T*`` is read, any other pointer is read and written. Ordering comes
from event records and waits, stream waits, synchronize calls (device, stream, event) and
CUDA graph replays, as vector clocks (gpurt/_sanitizer/clocks.py). An access that is not
ordered after a conflicting one (write-read, read-write, write-write) raises
:class:`SanitizerError` before the operation is queued (or warns
:class:`SanitizerWarning`), naming both accesses' streams, kernels or copies, argument
positions and Python stacks.

Pointers into an allocation count as the whole allocation. Streams other than the default
ones are taken as non-blocking, as gpurt's, torch's and cuda.core's are: a CuPy stream,
blocking by default, has an implicit barrier with the legacy default stream that is not
seen (the driver is not asked: a handle it does not know would crash it). Memory gpurt did
not allocate (torch's, CuPy's, ``cuMemAlloc``'s) is not tracked, nor are pointers passed
inside by-value structs; bundled kernels record their operands themselves (:func:`record`).
Launches take the Python launch path while the sanitizer is on (a launch hook is
registered). The overhead per launch is in docs/sanitizer.md.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from typing import Any

from . import memory as _memory
from ._core.fork import renew_after_fork
from ._launch.args import pointer
from ._launch.kernel import Kernel, add_launch_hook, remove_launch_hook
from ._sanitizer import hooks as _hooks
from ._sanitizer.hooks import SanitizerError, SanitizerWarning
from ._sanitizer.tracker import UnorderedAccess
from .streams import as_stream_handle

__all__ = ["ENABLED", "ENV", "SanitizerError", "SanitizerWarning", "UnorderedAccess",
           "disable_cuda_sanitizer", "enable_cuda_sanitizer", "is_enabled", "record", "reset"]

ENV = "GPURT_SANITIZER"
ENABLED = False  # whether it is on: the cheap test before a record() call (read-only)

_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)
_read_pointer = struct.Struct("<Q").unpack_from


def enable_cuda_sanitizer(on_error: str = "raise") -> None:
    """Start checking stream ordering (see the module docstring); ``on_error`` is "raise"
    (:class:`SanitizerError`, the operation is not queued) or "warn"
    (:class:`SanitizerWarning`). For best results enable it before any GPU work: accesses
    made before are unknown to it. Enabling it again only changes ``on_error``."""
    if on_error not in ("raise", "warn"):
        raise ValueError(f'on_error must be "raise" or "warn", got {on_error!r}')
    with _lock:
        _hooks.RAISE = on_error == "raise"
        if _hooks.ON:
            return
        live = _memory.watch_allocations(_hooks.TRACKER)
        _hooks.TRACKER.reset(live)
        add_launch_hook(_on_launch)
        _hooks.ON = True
        _set_enabled(True)


def disable_cuda_sanitizer() -> None:
    """Stop checking and forget everything recorded."""
    with _lock:
        if not _hooks.ON:
            return
        _hooks.ON = False
        _set_enabled(False)
        remove_launch_hook(_on_launch)
        _memory.watch_allocations(None)
        _hooks.TRACKER.reset()


def _set_enabled(on: bool) -> None:
    global ENABLED
    ENABLED = on


def is_enabled() -> bool:
    """Whether the sanitizer is on."""
    return _hooks.ON


def reset() -> None:
    """Forget every access and every stream's and event's ordering, keeping the known
    allocations (tests that plant races start from a clean slate with it)."""
    with _lock:
        live = _memory.watch_allocations(_hooks.TRACKER) if _hooks.ON else None
        _hooks.TRACKER.reset(live)


def record(what: str, reads: Sequence[Any] = (), writes: Sequence[Any] = (),
           stream: Any = None) -> None:
    """Record an operation ``what`` (e.g. "gemm") about to be queued on ``stream`` (anything
    :func:`gpurt.as_stream_handle` takes; None: the current stream) that reads the arrays
    (or device pointers) ``reads`` and writes ``writes``; None entries are skipped. Raises
    or warns for what is unordered. For launches whose pointers the launch hook cannot see
    (inside by-value structs such as TMA descriptors); a no-op while the sanitizer is off.
    Callers on hot paths test :data:`ENABLED` first::

        if sanitizer.ENABLED:
            sanitizer.record("gemm", (a, b), (out,), stream)
    """
    if not _hooks.ON:
        return
    handle = as_stream_handle(stream)
    _hooks.access(handle, _operands(reads, "input"), _operands(writes, "output"), what)


def _operands(values: Sequence[Any], role: str) -> list[tuple[int, str]]:
    return [(pointer(value, None), f"{role} {i}") for i, value in enumerate(values)
            if value is not None]


# ---- kernel launches -------------------------------------------------------------------

_pointer_params: dict[int, tuple[Any, list[tuple[int, int, bool]]]] = {}


def reads_only(type_text: str) -> bool:
    """Whether a pointer parameter of C type ``type_text`` points to const data: "const"
    between the last two ``*`` (or before the only one): ``const float*``, ``float const*``
    are; ``float* const``, ``const float**`` are not."""
    stars = type_text.split("*")
    if len(stars) < 2:
        return False
    return "const" in stars[-2].replace("(", " ").split()


def _pointer_layout(kernel: Kernel) -> list[tuple[int, int, bool]]:
    """(offset in the parameter buffer, argument position, read only) of each pointer
    parameter of ``kernel`` (loaded: its plan is made)."""
    plan = kernel._plan
    found = _pointer_params.get(id(plan))
    if found is None or found[0] is not plan:
        layout = [(offset, param.index, reads_only(param.type))
                  for param, offset in zip(plan.params, plan.offsets)  # type: ignore[union-attr]
                  if param.kind == "pointer"]
        found = _pointer_params[id(plan)] = (plan, layout)
    return found[1]


def _on_launch(kernel: Kernel, handle: int, phase: str) -> None:
    """The launch hook: record the kernel's pointer arguments, read from the parameter
    buffer the launch has just packed (this thread's), before the driver call."""
    if phase != "begin" or not _hooks.ON or kernel._plan is None:
        return
    buffer, _ = kernel._plan.thread_buffers()
    reads: list[tuple[int, int]] = []
    writes: list[tuple[int, int]] = []
    for offset, position, const in _pointer_layout(kernel):
        ptr = _read_pointer(buffer, offset)[0]
        (reads if const else writes).append((ptr, position))
    _hooks.access(handle, reads, writes, f"kernel {kernel.name}")


if os.environ.get(ENV, "") not in ("", "0"):
    enable_cuda_sanitizer("warn" if os.environ[ENV] == "warn" else "raise")
