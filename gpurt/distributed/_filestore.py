"""FileStore: a store in a private directory that the processes of a world share, one file per
key under an flock'd lock file. Stdlib only."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import time
import urllib.parse
import weakref
from collections.abc import Iterator
from datetime import timedelta

from .._core.files import write_atomic
from ._storebase import DEFAULT_TIMEOUT, DistributedError, Store, _as_bytes, _counter

__all__ = ["FileStore"]

# A FileStore with a world_size counts its users (open, less closed) and how many have left.
_USERS, _LEFT = "__store/users", "__store/left"


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


def _write(path: str, value: bytes) -> None:
    """Write atomically, so a reader sees the old value or the new one, never a part."""
    write_atomic(path, value, "tmp.")


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    """Hold the store's lock file (flock: exclusive between processes and between threads)."""
    path = os.path.join(directory, "lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:  # ELOOP: a symbolic link was planted there
        raise DistributedError(f"FileStore: cannot open its lock file {path}: {exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise DistributedError(
                f"FileStore: {path} is not a regular file of this user; refusing to use it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _key_file(directory: str, key: str) -> str:
    name = "key." + urllib.parse.quote(key, safe="")
    if len(name) > 200:
        name = "hash." + hashlib.sha256(key.encode()).hexdigest()
    return os.path.join(directory, name)


def _add_locked(directory: str, key: str, amount: int) -> int:
    """Store.add for a FileStore whose lock the caller holds."""
    path = _key_file(directory, key)
    total = _counter(key, _read(path), amount)
    _write(path, total)
    return int(total)


def _leave_file_store(directory: str, world_size: int | None) -> None:
    """FileStore's close and finalizer (never raises): once ``world_size`` users have left
    and none is still open (torch's rule), the last one deletes the keys, so that the next
    run at this path starts empty."""
    if world_size is None:
        return
    with contextlib.suppress(OSError, DistributedError), _locked(directory):
        users = _add_locked(directory, _USERS, -1)
        if _add_locked(directory, _LEFT, 1) >= world_size and users <= 0:
            for name in os.listdir(directory):
                if name.startswith(("key.", "hash.")):
                    os.unlink(os.path.join(directory, name))


class FileStore(Store):
    """torch.distributed.FileStore over a directory that the processes share (one host, or a
    shared filesystem), created with mode 0700 when missing: one file per key, written
    atomically under an flock'd lock file; waits poll (1 ms, doubling up to 50 ms). With
    ``world_size``, the store's keys are deleted when at least that many users have closed
    it and none is open. Keys left by processes that died are not: see
    :func:`gpurt.distributed._rendezvous.join_world`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        world_size: int | None = None,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(timeout)
        self.path = os.path.abspath(os.fspath(path))
        self.world_size = world_size
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            os.mkdir(self.path, 0o700)
            os.chmod(self.path, 0o700)  # mkdir's mode is masked by the umask
        except FileExistsError:
            if not os.path.isdir(self.path):
                raise DistributedError(
                    f"FileStore: {self.path} is not a directory; give a directory or a new path"
                ) from None
            if os.stat(self.path).st_mode & stat.S_IWOTH:
                raise DistributedError(
                    f"FileStore: {self.path} is world-writable, so any user could read and "
                    "forge its keys; give a private directory (chmod 700) or a new path"
                ) from None
        if world_size is not None:
            with _locked(self.path):
                _add_locked(self.path, _USERS, 1)
        self._closed = False
        self._finalizer = weakref.finalize(self, _leave_file_store, self.path, world_size)

    def set(self, key: str, value: bytes | str) -> None:
        with _locked(self._directory()):
            _write(_key_file(self.path, key), _as_bytes(value))

    def add(self, key: str, amount: int) -> int:
        with _locked(self._directory()):
            return _add_locked(self.path, key, amount)

    def delete_key(self, key: str) -> bool:
        with _locked(self._directory()):
            try:
                os.unlink(_key_file(self.path, key))
                return True
            except FileNotFoundError:
                return False

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def _get(self, key: str, timeout: float) -> bytes | None:
        path = _key_file(self._directory(), key)
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            value = _read(path)
            remaining = deadline - time.monotonic()
            if value is not None or remaining <= 0:
                return value
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, 0.05)

    def _directory(self) -> str:
        if self._closed:
            raise DistributedError(f"{self!r} is closed")
        return self.path

    def __repr__(self) -> str:
        return f"FileStore({self.path!r})"
