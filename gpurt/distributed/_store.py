"""Key-value stores that gpurt.distributed stands on (stdlib only: no CUDA, no NCCL), with
torch.distributed's names and meanings; the rendezvous over them is
gpurt/distributed/_rendezvous.py.

The processes of a world (one per GPU, on one or several hosts) meet through a :class:`Store`:
:class:`TCPStore` (a server thread in rank 0's process, a client in each), :class:`FileStore`
(a private directory on a filesystem they all see) or :class:`HashStore` (threads of one
process). Values are bytes; :meth:`Store.add` keeps a counter as a decimal string under its
key; :meth:`Store.get` and :meth:`Store.wait` wait for keys and raise
:class:`DistributedTimeoutError` naming them rather than hang. A TCPStore client whose server
died gets a :class:`DistributedError` at once (from a hung one: a timeout). A FileStore
deletes its keys when its ``world_size`` users have closed it (torch deletes its file).
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import hashlib
import math
import operator
import os
import socket
import struct
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import TypeVar

from .._core.files import write_atomic

__all__ = [
    "DEFAULT_TIMEOUT",
    "DistributedError",
    "DistributedTimeoutError",
    "FileStore",
    "HashStore",
    "Store",
    "TCPStore",
]

DEFAULT_TIMEOUT = 300.0  # seconds, torch's default for its stores
_REPLY_GRACE = 10.0  # seconds a live server may take to answer, on top of a request's wait
_CLOSE_GRACE = 5.0  # seconds a closing master waits for its clients to leave
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


# ---- TCPStore ---------------------------------------------------------------------------------
# A request is _REQUEST (operation, key length, payload length), the UTF-8 key and the payload
# (a value, a wait as _FLOAT seconds, an amount as _INT); a reply is _REPLY (status, payload
# length) and the payload: _OK with the result, _TIMEOUT, or _ERROR with a message.

_SET, _GET, _ADD, _DELETE = range(1, 5)
_OK, _TIMEOUT, _ERROR = range(3)
_REQUEST = struct.Struct("!BII")
_REPLY = struct.Struct("!BI")
_FLOAT = struct.Struct("!d")
_INT = struct.Struct("!q")
_MAX_MESSAGE = 1 << 31


def _send(sock: socket.socket, header: struct.Struct, code: int, *parts: bytes) -> None:
    sock.sendall(header.pack(code, *map(len, parts)) + b"".join(parts))


def _receive(sock: socket.socket, header: struct.Struct) -> tuple[int, list[bytes]]:
    """Read one message: its code and its parts (as many as ``header`` has lengths)."""
    code, *sizes = header.unpack(_receive_exactly(sock, header.size))
    if sum(sizes) > _MAX_MESSAGE:
        raise ConnectionError(f"malformed message of {sum(sizes)} bytes")
    return code, [_receive_exactly(sock, size) for size in sizes]


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:])
        if count == 0:
            raise ConnectionError("the connection was closed by the other end")
        received += count
    return bytes(buffer)


def _shutdown(sock: socket.socket) -> None:
    """Wake the thread blocked on ``sock`` (in accept or recv) before the socket is closed."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Server:
    """TCPStore's server: a thread that accepts connections and a thread per connection,
    over one HashStore."""

    def __init__(self, host: str, port: int) -> None:
        try:
            family, _, _, _, address = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            self._listener = socket.create_server(address, family=family)
        except OSError as exc:
            raise DistributedError(f"TCPStore could not listen on {host}:{port}: {exc}") from exc
        self.port: int = self._listener.getsockname()[1]
        self._store = HashStore()
        self._clients: set[socket.socket] = set()
        self._lock = threading.Condition()
        self._closing = False
        self._acceptor = threading.Thread(target=self._accept, name="gpurt-store", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # close() shut the listener (the loop ends), or a transient error
                time.sleep(0.01)
                continue
            with self._lock:
                if self._closing:
                    conn.close()
                    return
                self._clients.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                operation, (key, payload) = _receive(conn, _REQUEST)
                _send(conn, _REPLY, *self._answer(operation, key, payload))
        except OSError:
            pass  # the client left, or close() shut the connection
        finally:
            conn.close()
            with self._lock:
                self._clients.discard(conn)
                self._lock.notify_all()

    def _answer(self, operation: int, key_bytes: bytes, payload: bytes) -> tuple[int, bytes]:
        store = self._store
        try:
            key = key_bytes.decode()
            if operation == _SET:
                store.set(key, payload)
                return _OK, b""
            if operation == _GET:
                (wait,) = _FLOAT.unpack(payload)
                if not 0 <= wait <= _MAX_WAIT:  # also NaN, on which Condition.wait never returns
                    raise ValueError(f"a wait of {wait} s")
                value = store._get(key, wait)
                return (_TIMEOUT, b"") if value is None else (_OK, value)
            if operation == _ADD:
                return _OK, _INT.pack(store.add(key, _INT.unpack(payload)[0]))
            if operation == _DELETE:
                return _OK, b"\1" if store.delete_key(key) else b""
            return _ERROR, f"unknown operation {operation}".encode()
        except DistributedError as exc:
            return _ERROR, str(exc).encode()
        except (ValueError, OverflowError, struct.error) as exc:
            return _ERROR, f"malformed request: {type(exc).__name__}: {exc}".encode()

    def close(self, grace: float) -> None:
        """Stop accepting, give the connected clients ``grace`` s to leave, then cut them off."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        _shutdown(self._listener)
        self._acceptor.join(1.0)
        self._listener.close()
        with self._lock:
            self._lock.wait_for(lambda: not self._clients, grace)
            for conn in self._clients:
                _shutdown(conn)
        self._store.close()
        with self._lock:
            self._lock.wait_for(lambda: not self._clients, 1.0)


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """Connect, retrying until ``timeout`` (the master may start after its clients)."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=min(timeout, _REPLY_GRACE))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DistributedTimeoutError(
                    f"could not connect to the TCPStore at {host}:{port} within {timeout:g} s "
                    f"(is its master, rank 0, running?): {exc}"
                ) from exc
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, 0.5)


def _close_tcp(sock: socket.socket, server: _Server | None, grace: float) -> None:
    """TCPStore's close and finalizer (never raises)."""
    _shutdown(sock)
    sock.close()
    if server is not None:
        server.close(grace)


class TCPStore(Store):
    """torch.distributed.TCPStore. The master (``is_master=True``) serves the keys from
    daemon threads bound to ``host:port`` (port 0 picks a free one: see ``.port``); every
    instance, the master's too, is a client that connects with retries until ``timeout``.
    One request at a time per instance: threads that wait on each other need their own.
    ``world_size`` is recorded, as torch's; checking the world is the job of
    :func:`gpurt.distributed._rendezvous.join_world`."""

    def __init__(
        self,
        host: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(timeout)
        if not 0 <= port < 65536 or (port == 0 and not is_master):
            raise ValueError(f"TCPStore: port {port} (a client needs the master's, 1-65535)")
        self.host, self.world_size, self.is_master = host, world_size, is_master
        server = _Server(host, port) if is_master else None
        self.port: int = server.port if server else port
        self._lock = threading.Lock()
        self._broken: str | None = None  # why requests fail: closed, or the connection lost
        try:
            self._sock = _connect(host or "localhost", self.port, self.timeout)
        except BaseException:
            if server is not None:
                server.close(0.0)
            raise
        grace = min(self.timeout, _CLOSE_GRACE)
        self._finalizer = weakref.finalize(self, _close_tcp, self._sock, server, grace)

    def set(self, key: str, value: bytes | str) -> None:
        self._request(_SET, key, _as_bytes(value))

    def add(self, key: str, amount: int) -> int:
        total = self._request(_ADD, key, _INT.pack(operator.index(amount)))
        return int(_INT.unpack(total or b"")[0])

    def delete_key(self, key: str) -> bool:
        return self._request(_DELETE, key, b"") == b"\1"

    def close(self) -> None:
        """Close the connection. The master then stops its server once its clients have
        left, waiting min(timeout, 5 s) at most, so that ranks still reading keep it."""
        self._broken = self._broken or f"{self!r} is closed"
        self._finalizer()

    def _get(self, key: str, timeout: float) -> bytes | None:
        return self._request(_GET, key, _FLOAT.pack(timeout), wait=timeout)

    def _request(
        self, operation: int, key: str, payload: bytes, wait: float = 0.0
    ) -> bytes | None:
        """Send one request, read its reply: the payload, or None for _TIMEOUT. A server that
        went away, or did not answer within ``wait`` and a grace, leaves this client broken."""
        with self._lock:
            if self._broken is not None:
                raise DistributedError(self._broken)
            limit = wait + min(self.timeout, _REPLY_GRACE)
            try:
                self._sock.settimeout(limit)
                _send(self._sock, _REQUEST, operation, key.encode(), payload)
                status, (reply,) = _receive(self._sock, _REPLY)
            except TimeoutError as exc:
                self._broken = f"{self!r}: the server did not answer within {limit:g} s"
                self._finalizer()
                raise DistributedTimeoutError(self._broken) from exc
            except OSError as exc:
                self._broken = self._broken or (
                    f"{self!r}: lost the connection to the server ({exc}); "
                    "did the master process (rank 0) exit?"
                )
                self._finalizer()
                raise DistributedError(self._broken) from exc
        if status == _ERROR:
            raise DistributedError(f"{self!r}: {reply.decode(errors='replace')}")
        return None if status == _TIMEOUT else reply

    def __repr__(self) -> str:
        master = ", is_master=True" if self.is_master else ""
        return f"TCPStore({self.host!r}, {self.port}{master})"


# ---- FileStore --------------------------------------------------------------------------------

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
    fd = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
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
    with contextlib.suppress(OSError), _locked(directory):
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
