"""The GEMM autotuner: times a problem's candidates (kernels/_gemm_tune.py) once per (device,
kernels' source, dtype, layout, alignment, shape) and remembers the winner on disk next to gpurt's
kernel cache. ``GPURT_GEMM_AUTOTUNE=0`` turns it off (heuristics only, the results file is
neither read nor written).

Plain Python with no GPU calls, so all of it is tested on a CPU; kernels/gemm.py does the
timing.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable
from typing import Any

from ._gemm_config import Config, Problem
from ._gemm_types import DT_NAMES as _DT_NAMES

__all__ = ["Tuner", "autotune_enabled", "problem_key", "parse_results", "read_results",
           "FILE_NAME", "SCHEMA", "TUNE_MIN_MACS", "DEFAULT_MARGIN", "ROUNDS"]

# Tuning a problem below this many multiply-adds costs more than it could ever save.
TUNE_MIN_MACS = 1 << 27
# How much faster than the first candidate (the heuristic's pick) another must time to replace
# it. The tuner's few short batches carry a few percent of spread, and on an H100 the heuristic's
# picks ran faster than the tuner's plain fastest at most of issue 17's shapes (8192x8192x512
# 0.94 against 0.88 of cuBLAS, 16x4096^2 0.95 against 0.73, 128x4096^2 0.99 against 0.92;
# benchmarks/notes_gemm.md, session 10's final runs), where the picks it beat were within 5%.
DEFAULT_MARGIN = 0.05
# Each candidate's timing is the median of this many batches, taken in rounds over all
# candidates, so that a drift of the clocks while tuning (an idle GPU ramping up) reaches every
# candidate alike instead of the first ones alone.
ROUNDS = 3
_SCHEMA = 1
FILE_NAME = "gemm-tune-v1.json"


def autotune_enabled() -> bool:
    """False when ``GPURT_GEMM_AUTOTUNE`` is 0/false/off/no."""
    value = os.environ.get("GPURT_GEMM_AUTOTUNE", "1").strip().lower()
    return value not in ("0", "false", "off", "no")


def problem_key(problem: Problem, device: str, source_digest: str) -> str:
    """The results file key: device, kernels' source, dtype, layout, alignment, shape. The
    shape is exact, as torch's TunableOp keys it: the best tiles follow the number of tiles per
    wave, which shapes of one power-of-two bucket do not share (1536^3 ran 128 x 256 tiles,
    2048^3's pick, at 0.61 of cuBLAS where its own 128 x 192 runs 0.75)."""
    layout = ("K" if problem.a_kmajor else "M") + ("K" if problem.b_kmajor else "N")
    align = ("tma" if problem.tma else "vec") if problem.vec else "any"
    if problem.tma and not problem.pitch128:  # the best tiles differ (notes_gemm.md)
        align = "tma16"
    shape = f"{problem.m}x{problem.n}x{problem.k}"
    return "|".join([device, source_digest, _DT_NAMES[problem.dt], layout, align, shape])


_MAX_FILE_BYTES = 16 << 20  # a results file is a few KiB; anything this large is not one


def _read_results(path: str) -> dict[str, dict[str, Any]]:
    """The well-formed results in the file at ``path``. The file is untrusted: opened
    without following a symbolic link, a regular file of bounded size, JSON of the results
    shape; entries whose config is not a valid Config are left out. OSError/ValueError for
    a file that cannot be read as results."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if info.st_size > _MAX_FILE_BYTES:
            raise ValueError(f"{path} is {info.st_size} bytes, more than a results file holds")
        raw = fh.read(_MAX_FILE_BYTES + 1)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is not a GEMM tuning results file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != _SCHEMA or \
            not isinstance(doc.get("results"), dict):
        raise ValueError(f"{path} is not a GEMM tuning results file (schema {_SCHEMA})")
    return parse_results(doc)


read_results = _read_results
SCHEMA = _SCHEMA


def parse_results(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The well-formed entries of a results document (``{"schema", "results"}``): those
    whose config is a valid Config."""
    found = {}
    for key, entry in doc.get("results", {}).items():
        if not (isinstance(key, str) and isinstance(entry, dict)
                and isinstance(entry.get("config"), dict)
                and isinstance(entry.get("ms"), (int, float))):
            continue
        try:
            Config.from_json(entry["config"])
        except (TypeError, ValueError):
            continue
        found[key] = entry
    return found


class Tuner:
    """Chooses configs by timing the candidates once per key; results are kept in memory and
    in ``<directory>/<file_name>`` (default gemm-tune-v1.json; a 0700 folder, atomic writes,
    merged with what other processes wrote meanwhile). ``directory=None`` keeps them in
    memory only."""

    def __init__(self, directory: str | None, file_name: str = FILE_NAME) -> None:
        self.directory = directory
        self.file_name = file_name
        self._results: dict[str, dict[str, Any]] = {}
        self.defaults: dict[str, dict[str, Any]] = {}  # a prebuilt archive's default table
        self._loaded = False
        self._lock = threading.Lock()

    @property
    def path(self) -> str | None:
        return None if self.directory is None else os.path.join(self.directory, self.file_name)

    def _read_file(self) -> dict[str, dict[str, Any]]:
        path = self.path
        if path is None or not os.path.lexists(path):
            return {}
        try:
            return _read_results(path)
        except (OSError, ValueError):
            return {}  # unreadable or corrupt: tune again and overwrite it

    def _write_file(self, path: str | None = None) -> bool:
        target = path or self.path
        if target is None:
            return False
        directory = os.path.dirname(target) or "."
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            merged = {**self._read_file(), **self._results} if path is None else self._results
            fd, tmp = tempfile.mkstemp(prefix=".tmp-gemm-", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump({"schema": _SCHEMA, "results": merged}, fh, indent=1, sort_keys=True)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
            except BaseException:
                os.unlink(tmp)
                raise
            return True
        except OSError as exc:
            warnings.warn(f"gpurt: could not save GEMM tuning results in {target}: {exc}",
                          RuntimeWarning, stacklevel=3)
            if path is None:
                self.directory = None
            return False

    def write(self, path: str | None = None) -> bool:
        """Write every known result to ``path`` (default: this tuner's file)."""
        self.lookup("")
        with self._lock:
            return self._write_file(path)

    def read(self, path: str | None = None) -> dict[str, dict[str, Any]]:
        """Add the results in ``path`` (default: this tuner's file) and return them."""
        target = path or self.path
        if target is None:
            return {}
        found = _read_results(target)
        self.lookup("")
        with self._lock:
            self._results.update(found)
        return found

    def _entry(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            if not self._loaded:
                self._results = {**self._read_file(), **self._results}
                self._loaded = True
            return self._results.get(key) or self.defaults.get(key)

    def lookup(self, key: str) -> Config | None:
        """The remembered config for ``key``, or None."""
        found = self._entry(key)
        if found is None:
            return None
        try:
            return Config.from_json(found["config"])
        except (KeyError, TypeError, ValueError):
            return None

    def lookup_ms(self, key: str) -> float | None:
        """The remembered config's time for ``key`` (ms per call), or None."""
        found = self._entry(key)
        ms = None if found is None else found.get("ms")
        return float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None

    def choose(self, key: str, configs: list[Config],
               time_ms: Callable[[Config], float | None]) -> Config:
        """The remembered winner for ``key``, else the fastest of ``configs`` by ``time_ms``
        (one batch's ms per call; None or an exception: that config cannot run and is
        skipped from then on), remembered. Each config's time is the median of :data:`ROUNDS`
        calls, made in rounds over the configs. The first config (the heuristic's pick) stays
        the winner unless another times at least :data:`DEFAULT_MARGIN` faster."""
        known = self.lookup(key)
        if known is not None and known in configs:
            return known
        samples: dict[Config, list[float]] = {config: [] for config in configs}
        for _ in range(ROUNDS):
            for config in [c for c in configs if c in samples]:
                ms = self._time_one(config, time_ms)
                if ms is None:
                    del samples[config]
                else:
                    samples[config].append(ms)
        timed = {config: sorted(times)[len(times) // 2] for config, times in samples.items()}
        if not timed:
            return configs[0]
        best = min(timed, key=timed.__getitem__)
        if configs[0] in timed and timed[best] > timed[configs[0]] * (1.0 - DEFAULT_MARGIN):
            best = configs[0]
        with self._lock:
            self._results[key] = {"config": best.to_json(), "ms": round(timed[best], 5),
                                  "timings_ms": {c.label(): round(ms, 5)
                                                 for c, ms in timed.items()}}
            self._write_file()
        return best

    @staticmethod
    def _time_one(config: Config, time_ms: Callable[[Config], float | None]) -> float | None:
        try:
            return time_ms(config)
        except Exception as exc:  # a variant that fails to compile or launch is skipped
            warnings.warn(f"gpurt: GEMM variant {config.label()} failed while tuning: {exc}",
                          RuntimeWarning, stacklevel=3)
            return None

    def results(self) -> dict[str, dict[str, Any]]:
        """A copy of every result known to this process (after loading the file)."""
        self.lookup("")
        with self._lock:
            return json.loads(json.dumps(self._results))

    def clear(self) -> None:
        """Forget the results, in memory and on disk."""
        with self._lock:
            self._results = {}
            self._loaded = True
            path = self.path
            if path is not None and os.path.exists(path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
