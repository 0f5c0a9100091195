"""Prebuilt code for gpurt.compile: archives registered with ``gpurt.nvrtc.add_prebuilt``
(gpurt.kernels registers the bundled kernels' archive) are searched before the disk cache.

A program is found by :func:`program_key`, a digest of what decides the code it compiles
to (program name, source, headers, options, architecture) and of nothing about the machine
that built it: a cubin runs wherever its architecture does. Code the archive does not hold,
or that fails its digest, is compiled as usual (the JIT fallback).
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from typing import Any

from .._core.fork import renew_after_fork
from .archive import Archive
from .cache import Entry

__all__ = ["program_key", "add_archive", "archives", "lookup", "clear"]

_archives: list[Archive] = []
_broken: set[str] = set()
_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)


def program_key(program_name: str, source: str, headers: tuple[tuple[str, str], ...],
                options: tuple[str, ...], arch: str) -> str:
    """The digest a program is stored under in a prebuilt archive."""
    blob = json.dumps([1, program_name, source, [list(h) for h in headers], list(options),
                       arch], separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def add_archive(path: str) -> Archive:
    """Register the archive at ``path`` (read at the first lookup); once per path."""
    with _lock:
        for archive in _archives:
            if archive.path == path:
                return archive
        archive = Archive(path)
        renew_after_fork(archive, _lock=threading.Lock)  # registered: lives with the process
        _archives.append(archive)
        return archive


def archives() -> list[Archive]:
    """The registered archives, first registered first."""
    return list(_archives)


def clear() -> None:
    """Forget every registered archive (tests)."""
    with _lock:
        for archive in _archives:
            archive.close()
        _archives.clear()
        _broken.clear()


def _usable(archive: Archive) -> bool:
    return archive.path not in _broken


def _give_up(archive: Archive, exc: BaseException) -> None:
    """Stop using ``archive`` for this process, with one warning."""
    _broken.add(archive.path)
    warnings.warn(f"gpurt: prebuilt kernel archive {archive.path!r} is not usable ({exc}); "
                  "its kernels are compiled instead", RuntimeWarning, stacklevel=4)


def lookup(key: str, exprs: tuple[str, ...]) -> Entry | None:
    """The prebuilt cubin stored under ``key`` with these name expressions, else None."""
    for archive in archives():
        if not _usable(archive):
            continue
        try:
            program = archive.find(key, exprs)
            if program is None:
                continue
            data = archive.read(program)
        except (OSError, ValueError) as exc:
            _give_up(archive, exc)
            continue
        if data is None:
            warnings.warn(f"gpurt: {program.program} ({program.arch}) in {archive.path!r} does "
                          "not match its digest; compiling it instead", RuntimeWarning,
                          stacklevel=3)
            continue
        return Entry(data, "cubin", dict(program.lowered), "")
    return None


def table(name: str) -> Any:
    """The first registered archive's table ``name`` (None where none has it)."""
    for archive in archives():
        if not _usable(archive):
            continue
        try:
            found = archive.table(name)
        except (OSError, ValueError) as exc:
            _give_up(archive, exc)
            continue
        if found is not None:
            return found
    return None
