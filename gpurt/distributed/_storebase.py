"""The Store base class, its errors and HashStore: what every store of gpurt.distributed shares
(gpurt/distributed/_store.py gathers them with TCPStore and FileStore). Stdlib only."""

from __future__ import annotations

import abc
import math
import operator
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TypeVar

__all__ = [
    "DEFAULT_TIMEOUT",
    "DistributedError",
    "DistributedTimeoutError",
    "HashStore",
    "Store",
]

DEFAULT_TIMEOUT = 300.0  # seconds, torch's default for its stores
_MAX_WAIT = 1e8  # seconds (three years): longer timeouts are cut to this (Condition.wait overflows)
_Self = TypeVar("_Self", bound="Store")


class DistributedError(RuntimeError):
    """A rendezvous or store failure: a bad init_method, a mismatched world, a lost server."""


class DistributedTimeoutError(DistributedError, TimeoutError):
    """A store wait or a rendezvous that did not complete in time."""


def _seconds(timeout: float | timedelta) -> float:
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not 0 < seconds < math.inf:
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    return min(seconds, _MAX_WAIT)


def _as_bytes(value: bytes | str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a store value is bytes or str, not {type(value).__name__}")


def _counter(key: str, value: bytes | None, amount: int) -> bytes:
    """The counter ``key`` (``value``, None when unset) plus ``amount``, as a stored value."""
    try:
        return str(int(value or b"0") + operator.index(amount)).encode()
    except ValueError:
        message = f"add({key!r}): the key holds {value!r:.40}, not a counter"
        raise DistributedError(message) from None


class Store(abc.ABC):
    """torch.distributed.Store: set/get/add/wait/check/delete_key, close() and a context
    manager; ``timeout`` (seconds, or a timedelta) is the default wait of get and wait."""

    def __init__(self, timeout: float | timedelta = DEFAULT_TIMEOUT) -> None:
        self.timeout = _seconds(timeout)

    @abc.abstractmethod
    def set(self, key: str, value: bytes | str) -> None:
        """Set ``key`` to ``value`` (a str is stored UTF-8 encoded)."""

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key`` (0 when unset), atomically: the new value."""

    @abc.abstractmethod
    def delete_key(self, key: str) -> bool:
        """Delete ``key``; False when it was not set."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store (idempotent); later calls raise DistributedError."""

    @abc.abstractmethod
    def _get(self, key: str, timeout: float) -> bytes | None:
        """The value of ``key`` after waiting up to ``timeout`` s (may be 0); None if unset."""

    def get(self, key: str, timeout: float | timedelta | None = None) -> bytes:
        """The value of ``key``, waiting for it to be set (``timeout``: the store's default)."""
        seconds = self.timeout if timeout is None else _seconds(timeout)
        value = self._get(key, seconds)
        if value is None:
            raise DistributedTimeoutError(f"{self!r}: key {key!r} was not set within {seconds:g} s")
        return value

    def wait(self, keys: Sequence[str], timeout: float | timedelta | None = None) -> None:
        """Wait until every key is set; the timeout error names the keys still missing."""
        seconds = self.timeout if timeout is None else _seconds(timeout)
        deadline = time.monotonic() + seconds
        keys = list(keys)
        for key in keys:
            if self._get(key, max(deadline - time.monotonic(), 0.0)) is None:
                missing = [name for name in keys if not self.check([name])]
                raise DistributedTimeoutError(
                    f"{self!r}: keys {missing} were not set within {seconds:g} s"
                )

    def check(self, keys: Sequence[str]) -> bool:
        """True when every key is set, without waiting."""
        return all(self._get(key, 0.0) is not None for key in keys)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class HashStore(Store):
    """An in-process store for the threads of one process (torch.distributed.HashStore): a
    dict behind one condition variable. TCPStore's server keeps its keys in one."""

    def __init__(self, timeout: float | timedelta = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        self._values: dict[str, bytes] = {}
        self._changed = threading.Condition()
        self._closed = False

    def set(self, key: str, value: bytes | str) -> None:
        with self._changed:
            self._open()
            self._values[key] = _as_bytes(value)
            self._changed.notify_all()

    def add(self, key: str, amount: int) -> int:
        with self._changed:
            self._open()
            self._values[key] = total = _counter(key, self._values.get(key), amount)
            self._changed.notify_all()
            return int(total)

    def delete_key(self, key: str) -> bool:
        with self._changed:
            self._open()
            return self._values.pop(key, None) is not None

    def close(self) -> None:
        """Close; threads waiting in get and wait raise DistributedError."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _get(self, key: str, timeout: float) -> bytes | None:
        with self._changed:
            self._changed.wait_for(lambda: self._closed or key in self._values, timeout)
            self._open()
            return self._values.get(key)

    def _open(self) -> None:
        if self._closed:
            raise DistributedError(f"{self!r} is closed")

    def __repr__(self) -> str:
        return "HashStore()"

