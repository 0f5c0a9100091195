"""How an exporter learns that its importers are done: one shared counter per export.

The exporter creates a small file (in /dev/shm where there is one, else the temp folder)
holding the number of importers that have not closed yet, as a little-endian uint64; each
importing process decrements it once, under an fcntl lock, when its last Array over the
export is gone. The exporter frees the block once the count reads zero
(gpurt.ipc_collect). This is torch's scheme (a ref-counter file per sent block) without a
shared allocator of counter slots.

The importer finds the file from the exporter's pid and a random token carried in the
handle: both are validated, the file is opened without following links and must be a
regular file of 8 bytes owned by this user. No driver calls here.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import tempfile

__all__: list[str] = []

_PREFIX = "gpurt-ipc-"
_COUNT = struct.Struct("<Q")


def folder() -> str:
    """Where counters live: /dev/shm (memory, not disk) where it exists."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def path_of(pid: int, token: bytes) -> str:
    """The counter file of export ``token`` made by process ``pid``."""
    return os.path.join(folder(), f"{_PREFIX}{int(pid)}-{bytes(token).hex()}")


def create(pid: int, token: bytes, importers: int) -> int:
    """Make the counter, set to ``importers``; returns its open descriptor."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path_of(pid, token), flags, 0o600)
    try:
        os.pwrite(fd, _COUNT.pack(importers), 0)
    except BaseException:
        os.close(fd)
        remove(pid, token)
        raise
    return fd


def read(fd: int) -> int:
    """The number of importers still open."""
    with _locked(fd):
        data = os.pread(fd, _COUNT.size, 0)
    return _COUNT.unpack(data)[0] if len(data) == _COUNT.size else 0


def remove(pid: int, token: bytes) -> None:
    try:
        os.unlink(path_of(pid, token))
    except FileNotFoundError:
        pass


def open_existing(pid: int, token: bytes) -> int:
    """Open the exporter's counter; ValueError when it is missing or not what gpurt made."""
    path = path_of(pid, token)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(
            f"IPC handle: the exporter's counter {path} cannot be opened ({exc.strerror}); "
            "the exporting process has collected this export or exited"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != _COUNT.size \
            or info.st_uid != os.geteuid():
        os.close(fd)
        raise ValueError(f"IPC handle: {path} is not a counter made by gpurt for this user")
    return fd


def decrement(fd: int) -> None:
    """One importer is done (never below zero), then close the descriptor."""
    try:
        with _locked(fd):
            data = os.pread(fd, _COUNT.size, 0)
            count = _COUNT.unpack(data)[0] if len(data) == _COUNT.size else 0
            if count:
                os.pwrite(fd, _COUNT.pack(count - 1), 0)
    finally:
        os.close(fd)


class _locked:
    """An exclusive fcntl lock on the counter file for the ``with`` body."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN)
