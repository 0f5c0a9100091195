"""TCPStore: its wire protocol, its server (threads in rank 0's process) and its client; the
limits the server puts on its peers are in gpurt/distributed/_store.py's docstring. Stdlib only."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import operator
import os
import select
import socket
import struct
import threading
import time
import weakref
from datetime import timedelta

from ._storebase import (
    _MAX_WAIT,
    DEFAULT_TIMEOUT,
    DistributedError,
    DistributedTimeoutError,
    HashStore,
    Store,
    _as_bytes,
)

__all__ = ["SECRET_ENV", "TCPStore"]

_REPLY_GRACE = 10.0  # seconds a live server may take to answer, on top of a request's wait
_CLOSE_GRACE = 5.0  # seconds a closing master waits for its clients to leave

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
