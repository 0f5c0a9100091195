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

A TCPStore server bounds what a peer can make it hold (docs/distributed.md, "What the store
exposes"): ``GPURT_STORE_MAX_VALUE`` bytes per value, ``GPURT_STORE_MAX_CONNECTIONS``
connections, a half-sent request dropped after 30 s and an idle connection after
``GPURT_STORE_IDLE_TIMEOUT`` s (clients reconnect); with ``GPURT_STORE_SECRET`` set on every
rank, only peers that prove they know it (HMAC-SHA256 challenge-response) get in.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import hashlib
import hmac
import math
import operator
import os
import select
import socket
import stat
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
# On connect the server sends a hello, a reply (_OK: its value limit as _INT and, when it wants a
# secret, a 32-byte nonce; _ERROR: why it refuses). With a nonce the client sends an _AUTH
# request (key: its own nonce, payload: _proof(secret, "client", server nonce + its nonce)) and
# the server answers _OK with _proof(secret, "server", ...) or _ERROR and hangs up: neither side
# ever sends the secret, each proves it knows it. Then a request is _REQUEST (operation, key
# length, payload length), the UTF-8 key and the payload (a value, a wait as _FLOAT seconds, an
# amount as _INT); a reply is _REPLY (status, payload length) and the payload: _OK with the
# result, _TIMEOUT, or _ERROR with a message.

_SET, _GET, _ADD, _DELETE, _AUTH = range(1, 6)
_OK, _TIMEOUT, _ERROR = range(3)
_REQUEST = struct.Struct("!BII")
_REPLY = struct.Struct("!BI")
_FLOAT = struct.Struct("!d")
_INT = struct.Struct("!q")
_MAX_MESSAGE = 1 << 31
_MAX_KEY = 1 << 16  # bytes of a key
_NONCE = 32  # bytes of a challenge
_CHUNK = 1 << 16  # bytes received at a time: a buffer grows only as bytes arrive
_READ_TIMEOUT = 30.0  # seconds a started request (or the handshake) may take to arrive
_POLL = 1.0  # seconds between checks that a waiting GET's client is still connected
SECRET_ENV = "GPURT_STORE_SECRET"


def _limit(variable: str, default: float) -> float:
    """A positive limit from the environment variable ``variable``, else ``default``."""
    raw = os.environ.get(variable, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise DistributedError(f"{variable}={raw!r}: expected a positive number")
    return value


def _secret() -> bytes | None:
    secret = os.environ.get(SECRET_ENV)
    return secret.encode() if secret else None


def _proof(secret: bytes, side: bytes, nonces: bytes) -> bytes:
    return hmac.new(secret, b"gpurt-store-1 " + side + b" " + nonces, hashlib.sha256).digest()


def _send(sock: socket.socket, header: struct.Struct, code: int, *parts: bytes) -> None:
    sock.sendall(header.pack(code, *map(len, parts)) + b"".join(parts))


def _receive(
    sock: socket.socket, header: struct.Struct, limit: int = _MAX_MESSAGE
) -> tuple[int, list[bytes]]:
    """Read one message: its code and its parts (as many as ``header`` has lengths), refusing
    one over ``limit`` bytes before reading it."""
    code, *sizes = header.unpack(_receive_exactly(sock, header.size))
    if sum(sizes) > limit:
        raise ConnectionError(f"malformed message of {sum(sizes)} bytes (limit {limit})")
    return code, [_receive_exactly(sock, size) for size in sizes]


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        chunk = sock.recv(min(size - len(buffer), _CHUNK))
        if not chunk:
            raise ConnectionError("the connection was closed by the other end")
        buffer += chunk
    return bytes(buffer)


def _shutdown(sock: socket.socket) -> None:
    """Wake the thread blocked on ``sock`` (in accept or recv) before the socket is closed."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _readable(sock: socket.socket) -> bool:
    """True when ``sock`` has data or end-of-file to read (without blocking)."""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed meanwhile
        return True


class _Server:
    """TCPStore's server: a thread that accepts connections and a thread per connection,
    over one HashStore. Each connection is bounded (see the module's docstring)."""

    def __init__(self, host: str, port: int) -> None:
        self.max_value = int(_limit("GPURT_STORE_MAX_VALUE", 16 << 20))
        self.max_connections = int(_limit("GPURT_STORE_MAX_CONNECTIONS", 1024))
        self.idle_timeout = _limit("GPURT_STORE_IDLE_TIMEOUT", 600.0)
        self._secret = _secret()
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
                full = len(self._clients) >= self.max_connections
                if not full:
                    self._clients.add(conn)
            if full:
                self._refuse(conn)
            else:
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _refuse(self, conn: socket.socket) -> None:
        message = (f"the TCPStore has {self.max_connections} connections already "
                   "(GPURT_STORE_MAX_CONNECTIONS)")
        with contextlib.suppress(OSError):
            conn.settimeout(0.1)
            _send(conn, _REPLY, _ERROR, message.encode())
        _shutdown(conn)
        conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(_READ_TIMEOUT)
            if self._greet(conn):
                while True:
                    conn.settimeout(self.idle_timeout)  # until a request starts
                    operation, (key, payload) = self._read_request(conn)
                    _send(conn, _REPLY, *self._answer(conn, operation, key, payload))
        except OSError:
            pass  # the client left, was too slow or broke the protocol, or close() shut it
        finally:
            _shutdown(conn)
            conn.close()
            with self._lock:
                self._clients.discard(conn)
                self._lock.notify_all()

    def _read_request(self, conn: socket.socket) -> tuple[int, list[bytes]]:
        """One request, its sizes checked against the limits before the key and payload are
        read; a request over them gets an _ERROR reply and the connection is dropped."""
        first = _receive_exactly(conn, 1)
        conn.settimeout(_READ_TIMEOUT)
        operation, key_size, size = _REQUEST.unpack(first + _receive_exactly(conn, 8))
        if key_size > _MAX_KEY or size > self.max_value:
            message = (f"request refused: a key of {key_size} bytes (limit {_MAX_KEY}) and a "
                       f"value of {size} bytes (limit {self.max_value}: GPURT_STORE_MAX_VALUE)")
            _send(conn, _REPLY, _ERROR, message.encode())
            raise ConnectionError(message)
        return operation, [_receive_exactly(conn, key_size), _receive_exactly(conn, size)]

    def _greet(self, conn: socket.socket) -> bool:
        """Send the hello; with a secret, run the challenge. False: the peer failed it."""
        nonce = os.urandom(_NONCE) if self._secret else b""
        _send(conn, _REPLY, _OK, _INT.pack(self.max_value) + nonce)
        if self._secret is None:
            return True
        operation, (client_nonce, proof) = _receive(conn, _REQUEST, 2 * _NONCE + 64)
        nonces = nonce + client_nonce
        if operation != _AUTH or not hmac.compare_digest(
            proof, _proof(self._secret, b"client", nonces)
        ):
            _send(conn, _REPLY, _ERROR, f"authentication failed ({SECRET_ENV})".encode())
            return False
        _send(conn, _REPLY, _OK, _proof(self._secret, b"server", nonces))
        return True

    def _answer(
        self, conn: socket.socket, operation: int, key_bytes: bytes, payload: bytes
    ) -> tuple[int, bytes]:
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
                value = self._wait(conn, key, wait)
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

    def _wait(self, conn: socket.socket, key: str, wait: float) -> bytes | None:
        """A GET's wait, given up (ConnectionError) once its client has gone: a client sends
        nothing while it waits, so anything to read (its end-of-file first) means that."""
        deadline = time.monotonic() + wait
        while True:
            value = self._store._get(key, min(max(deadline - time.monotonic(), 0.0), _POLL))
            if value is not None or time.monotonic() >= deadline:
                return value
            if _readable(conn):
                raise ConnectionError("the client left during a GET")

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


def _connect(host: str, port: int, timeout: float, retry: bool = True) -> socket.socket:
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
            if not retry:
                raise
            if remaining <= 0:
                raise DistributedTimeoutError(
                    f"could not connect to the TCPStore at {host}:{port} within {timeout:g} s "
                    f"(is its master, rank 0, running?): {exc}"
                ) from exc
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, 0.5)


def _handshake(sock: socket.socket, secret: bytes | None, timeout: float) -> int:
    """Read the server's hello and answer its challenge: the server's value limit."""
    sock.settimeout(min(timeout, _READ_TIMEOUT))
    try:
        status, (hello,) = _receive(sock, _REPLY, _MAX_KEY)
        if status != _OK:
            reason = hello.decode(errors="replace")
            raise DistributedError(f"the TCPStore refused the connection: {reason}")
        (limit,), nonce = _INT.unpack(hello[:_INT.size]), hello[_INT.size:]
        if not nonce:
            if secret is not None:
                raise DistributedError(
                    f"{SECRET_ENV} is set but the TCPStore server does not ask for it: set it "
                    "for every rank, rank 0 too (or unset it everywhere)")
            return int(limit)
        if secret is None:
            raise DistributedError(f"the TCPStore server wants a secret: set {SECRET_ENV} "
                                   "to rank 0's value")
        mine = os.urandom(_NONCE)
        _send(sock, _REQUEST, _AUTH, mine, _proof(secret, b"client", nonce + mine))
        status, (proof,) = _receive(sock, _REPLY, _MAX_KEY)
        if status != _OK or not hmac.compare_digest(proof, _proof(secret, b"server", nonce + mine)):
            raise DistributedError(
                f"authentication with the TCPStore failed: rank 0 has a different {SECRET_ENV}")
        return int(limit)
    except (OSError, struct.error) as exc:
        raise DistributedError(f"the TCPStore handshake failed: {exc}") from exc


def _close_tcp(conn: list[socket.socket], server: _Server | None, grace: float) -> None:
    """TCPStore's close and finalizer (never raises)."""
    _shutdown(conn[0])
    conn[0].close()
    if server is not None:
        server.close(grace)


class TCPStore(Store):
    """torch.distributed.TCPStore. The master (``is_master=True``) serves the keys from
    daemon threads bound to ``host:port`` (port 0 picks a free one: see ``.port``); every
    instance, the master's too, is a client that connects with retries until ``timeout``.
    One request at a time per instance: threads that wait on each other need their own.
    ``world_size`` is recorded, as torch's; checking the world is the job of
    :func:`gpurt.distributed._rendezvous.join_world`. With ``GPURT_STORE_SECRET`` set (the same on
    every rank) the server admits only clients that know it, and clients only such a server."""

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
        self._secret = _secret()
        try:
            self._conn = [self._open(self.timeout)]
        except BaseException:
            if server is not None:
                server.close(0.0)
            raise
        grace = min(self.timeout, _CLOSE_GRACE)
        self._finalizer = weakref.finalize(self, _close_tcp, self._conn, server, grace)

    def _open(self, timeout: float, retry: bool = True) -> socket.socket:
        sock = _connect(self.host or "localhost", self.port, timeout, retry)
        try:
            self._max_value = _handshake(sock, self._secret, timeout)
        except BaseException:
            sock.close()
            raise
        return sock

    def set(self, key: str, value: bytes | str) -> None:
        value = _as_bytes(value)
        if len(value) > self._max_value:
            raise DistributedError(
                f"{self!r}: a value of {len(value)} bytes is over the server's limit of "
                f"{self._max_value} (GPURT_STORE_MAX_VALUE on rank 0)")
        self._request(_SET, key, value)

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
        encoded = key.encode()
        if len(encoded) > _MAX_KEY:
            raise ValueError(f"a store key is at most {_MAX_KEY} bytes, not {len(encoded)}")
        with self._lock:
            if self._broken is not None:
                raise DistributedError(self._broken)
            limit = wait + min(self.timeout, _REPLY_GRACE)
            try:
                if _readable(self._conn[0]):  # the server hung up on an idle connection
                    self._reconnect()
                self._conn[0].settimeout(limit)
                _send(self._conn[0], _REQUEST, operation, encoded, payload)
                status, (reply,) = _receive(self._conn[0], _REPLY)
            except TimeoutError as exc:
                self._broken = f"{self!r}: the server did not answer within {limit:g} s"
                self._finalizer()
                raise DistributedTimeoutError(self._broken) from exc
            except (OSError, DistributedError) as exc:
                self._broken = self._broken or (
                    f"{self!r}: lost the connection to the server ({exc}); "
                    "did the master process (rank 0) exit?"
                )
                self._finalizer()
                raise DistributedError(self._broken) from exc
        if status == _ERROR:
            raise DistributedError(f"{self!r}: {reply.decode(errors='replace')}")
        return None if status == _TIMEOUT else reply

    def _reconnect(self) -> None:
        """Replace a connection the server closed (one try: a dead server fails at once)."""
        old, self._conn[0] = self._conn[0], self._open(min(self.timeout, _REPLY_GRACE), retry=False)
        old.close()

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
