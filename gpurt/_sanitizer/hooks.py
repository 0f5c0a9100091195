"""The switch every recording site reads, and what those sites call.

Sites test ``hooks.ON`` (one module attribute read) and only then call in; gpurt.sanitizer
turns it on and off. Raw stream handles are resolved per device here: 0, 1 and 2 name a
different default stream on each device, so the device is the one given or, for copies and
fills, the one whose context the thread has bound (copies.py binds it before every call).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from typing import Any

from .._core.fork import renew_after_fork
from .._core.state import THREAD
from .._core.syncdebug import user_stacklevel
from .tracker import CaptureLog, Position, Tracker, UnorderedAccess

__all__ = ["ON", "SanitizerError", "SanitizerWarning", "TRACKER", "access", "report"]

ON = False  # set by gpurt.sanitizer.enable_cuda_sanitizer / disable_cuda_sanitizer
RAISE = True  # raise SanitizerError (else warn SanitizerWarning)
TRACKER = Tracker()
renew_after_fork(TRACKER, _lock=threading.Lock)


class SanitizerError(RuntimeError):
    """Unordered accesses across streams found by gpurt's stream sanitizer; ``unordered``
    lists them (both accesses' streams, operations, argument positions and stacks)."""

    def __init__(self, unordered: list[UnorderedAccess]) -> None:
        self.unordered = unordered
        head = f"gpurt sanitizer: {len(unordered)} unordered access(es) across streams"
        super().__init__("\n".join([head, *map(str, unordered)]))


class SanitizerWarning(RuntimeWarning):
    """An unordered access found while the sanitizer warns instead of raising."""


def report(found: list[UnorderedAccess]) -> None:
    """Raise or warn for what a record found (nothing found: nothing to do)."""
    if not found:
        return
    if RAISE:
        raise SanitizerError(found)
    warnings.warn(str(SanitizerError(found)), SanitizerWarning, stacklevel=user_stacklevel())


def bound_device() -> int:
    """The device whose context this thread has bound (0 before any)."""
    return THREAD.__dict__.get("bound", 0)


def access(handle: int, reads: Iterable[tuple[int, Position]],
           writes: Iterable[tuple[int, Position]], what: str, device: int | None = None) -> None:
    """Record an operation on stream ``handle`` (of ``device``, default the bound one) and
    report what is unordered."""
    report(TRACKER.access(handle, bound_device() if device is None else device, reads, writes,
                          what, RAISE))


def copy(dst: int, src: int, handle: int, what: str) -> None:
    """A copy on ``handle`` from ``src`` to ``dst`` (0: a side in host memory)."""
    access(handle, ((src, None),) if src else (), ((dst, None),) if dst else (), what)


def replay(log: CaptureLog | None, handle: int, device: int) -> None:
    if log is not None:
        report(TRACKER.replay(log, handle, device, RAISE))


def event_key(event: Any) -> int:
    """The key of a raw CUevent (its handle as an int)."""
    return int(event)
