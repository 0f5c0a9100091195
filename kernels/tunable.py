"""Controls of the GEMM autotuner with torch.cuda.tunable's names and meanings.

gemm chooses its kernel variant by timing the candidates once per (device, dtype, layout,
alignment, shape bucket, heuristic's pick) and remembering the fastest in a results file;
without tuning it uses heuristics. Unlike torch's TunableOp, tuning is on by default here
(turn it off with ``enable(False)`` or ``GPURT_GEMM_AUTOTUNE=0``), and the results file is
written after each newly tuned problem (atomically, merged with what other processes wrote
meanwhile)::

    from gpurt.kernels import tunable
    tunable.tuning_enable(False)          # use known results, tune nothing new
    tunable.set_max_tuning_duration(10)   # ms of timed runs per candidate
    tunable.set_rotating_buffer_size(0)   # time on the callers' operands only (L2-warm)
    tunable.set_filename("/data/gemm-tuning.json")
    tunable.read_file("tuned-on-h100.json")  # results from elsewhere
    tunable.write_file()                  # to get_filename()

A change here applies to the signatures gemm plans from then on (it calls
``gemm.clear_plans()`` for you).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

import gpurt.nvrtc

from . import _gemm_tuner as _tuner
from . import _prebuilt

__all__ = [
    "enable", "is_enabled", "tuning_enable", "tuning_is_enabled", "set_max_tuning_duration",
    "get_max_tuning_duration", "set_max_tuning_iterations", "get_max_tuning_iterations",
    "set_filename", "get_filename", "get_results", "write_file", "read_file", "tuner",
    "on_change", "set_rotating_buffer_size", "get_rotating_buffer_size", "rotating_bytes",
]


@dataclasses.dataclass
class _Settings:
    enabled: bool | None = None  # None: GPURT_GEMM_AUTOTUNE (on unless 0/false/off/no)
    tuning: bool = True
    max_duration_ms: float = 30.0
    max_iterations: int = 100
    filename: str | None = None  # None: gemm-tune-v1.json in gpurt's kernel cache folder
    rotating_mb: int = -1  # operand copies the timed runs rotate over: < 0 the L2's size


SETTINGS = _Settings()
_listeners: list[Callable[[], None]] = []  # gemm.clear_plans: plans remember the settings
_tuners: dict[tuple[str | None, str], _tuner.Tuner] = {}
_lock = threading.Lock()
# a forked child gets a fresh lock (a parent thread may have held this one at the fork)
os.register_at_fork(after_in_child=lambda: globals().update(_lock=threading.Lock()))


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever a setting changes (gemm forgets its plans then)."""
    _listeners.append(listener)


def _replanned() -> None:
    for listener in _listeners:
        listener()


def tuner() -> _tuner.Tuner:
    """The tuner of the results file in use: :func:`get_filename`'s."""
    where: tuple[str | None, str]
    if SETTINGS.filename is not None:
        where = (os.path.dirname(os.path.abspath(SETTINGS.filename)),
                 os.path.basename(SETTINGS.filename))
    else:
        where = (gpurt.nvrtc.cache_dir(), _tuner.FILE_NAME)
    found = _tuners.get(where)
    if found is None:
        fresh = _tuner.Tuner(*where)
        fresh.defaults = _prebuilt.tuning_defaults()
        with _lock:
            found = _tuners.setdefault(where, fresh)
    return found


def enable(val: bool = True) -> None:
    """Use tuning results at all (False: heuristics only, no file is read or written)."""
    SETTINGS.enabled = bool(val)
    _replanned()


def is_enabled() -> bool:
    return _tuner.autotune_enabled() if SETTINGS.enabled is None else SETTINGS.enabled


def tuning_enable(val: bool = True) -> None:
    """Time candidates for problems that have no result yet (False: known results only,
    heuristics for the rest)."""
    SETTINGS.tuning = bool(val)
    _replanned()


def tuning_is_enabled() -> bool:
    return SETTINGS.tuning


def set_max_tuning_duration(duration: float) -> None:
    """At most ``duration`` ms of timed runs per candidate (at least one run each)."""
    if not duration > 0:
        raise ValueError(f"the tuning duration must be positive (ms), got {duration!r}")
    SETTINGS.max_duration_ms = float(duration)


def get_max_tuning_duration() -> float:
    return SETTINGS.max_duration_ms


def set_max_tuning_iterations(iterations: int) -> None:
    """At most ``iterations`` timed runs per candidate (their batches' median counts)."""
    if int(iterations) < 1:
        raise ValueError(f"the tuning iterations must be at least 1, got {iterations!r}")
    SETTINGS.max_iterations = int(iterations)


def get_max_tuning_iterations() -> int:
    return SETTINGS.max_iterations


def set_rotating_buffer_size(buffer_size: int) -> None:
    """Time each candidate on copies of the operands that together hold at least
    ``buffer_size`` MB, one copy per timed run in turn, so that every run reads its operands
    from device memory as a model's weights are read, not from an L2 the run before warmed
    (which favours other tiles on problems whose operands fit it); below zero (the default):
    the L2's size; zero: the callers' operands only."""
    SETTINGS.rotating_mb = int(buffer_size)
    _replanned()


def get_rotating_buffer_size() -> int:
    """The rotating buffer's size as set, in MB (below zero: the L2's size)."""
    return SETTINGS.rotating_mb


def rotating_bytes(l2_bytes: int) -> int:
    """Bytes of operand copies the timed runs rotate over, on a device with ``l2_bytes``."""
    return l2_bytes if SETTINGS.rotating_mb < 0 else SETTINGS.rotating_mb << 20


def set_filename(filename: str | None, insert_device_ordinal: bool = False) -> None:
    """Keep the results in ``filename`` (None: the default in gpurt's kernel cache folder).
    ``insert_device_ordinal`` is accepted for torch's signature; one file serves every
    device here, since results are keyed by the device's name."""
    del insert_device_ordinal
    SETTINGS.filename = None if filename is None else os.fspath(filename)
    _replanned()


def get_filename() -> str | None:
    """The results file in use (None when results are kept in memory only)."""
    return tuner().path


def get_results() -> dict[str, dict[str, Any]]:
    """Every result known to this process: key -> {config, ms, timings_ms}."""
    return tuner().results()


def write_file(filename: str | None = None) -> bool:
    """Write the results to ``filename`` (default: :func:`get_filename`); True on success."""
    return tuner().write(filename)


def read_file(filename: str | None = None) -> dict[str, dict[str, Any]]:
    """Add the results of ``filename`` (default: :func:`get_filename`) to this process's,
    and return what was read. Entries that are not well-formed results are left out; a file
    that is not a results file raises ValueError."""
    found = tuner().read(filename)
    _replanned()
    return found

