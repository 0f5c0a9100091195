"""The stores under hostile peers (issue #18): TCPStore limits, timeouts and the shared-secret
handshake; FileStore's folder and lock-file checks; bounded rendezvous messages. CPU only."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import stat
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpurt.distributed import _filestore, _tcpstore
from gpurt.distributed._rendezvous import barrier, join_world
from gpurt.distributed._store import (
    DistributedError,
    DistributedTimeoutError,
    FileStore,
    HashStore,
    TCPStore,
)


@pytest.fixture
def master(monkeypatch: pytest.MonkeyPatch) -> Iterator[TCPStore]:
    monkeypatch.delenv(_tcpstore.SECRET_ENV, raising=False)
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=5) as store:
        yield store


def server_of(store: TCPStore) -> _tcpstore._Server:
    server = store._finalizer.peek()[2][1]
    assert isinstance(server, _tcpstore._Server)
    return server


def raw(store: TCPStore) -> socket.socket:
    """A bare connection to ``store``'s server, its hello read."""
    sock = socket.create_connection(("127.0.0.1", store.port), timeout=5)
    assert _tcpstore._receive(sock, _tcpstore._REPLY)[0] == _tcpstore._OK
    return sock


def until(condition, limit: float = 5.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


# ---- sizes ------------------------------------------------------------------------------------


def test_a_huge_declared_value_is_refused_before_anything_is_allocated(master: TCPStore) -> None:
    with raw(master) as sock:
        sock.sendall(_tcpstore._REQUEST.pack(_tcpstore._SET, 1, 1 << 31))  # 2 GiB announced
        status, (message,) = _tcpstore._receive(sock, _tcpstore._REPLY)
        assert status == _tcpstore._ERROR and b"GPURT_STORE_MAX_VALUE" in message
        assert sock.recv(1) == b""
    master.set("still", b"serving")
    assert master.get("still") == b"serving"


def test_buffers_grow_as_bytes_arrive(master: TCPStore) -> None:
    with raw(master) as sock:
        tracemalloc.start()
        try:
            sock.sendall(_tcpstore._REQUEST.pack(_tcpstore._SET, 1, 8 << 20) + b"k" + b"v" * 100)
            time.sleep(0.3)  # the server thread has read what was sent
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 1 << 20  # not the 8 MiB announced


def test_the_value_limit_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPURT_STORE_MAX_VALUE", "1000")
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=5) as store:
        store.set("fits", b"x" * 1000)
        with pytest.raises(DistributedError, match="over the server's limit of 1000"):
            store.set("big", b"x" * 1001)
        assert store.get("fits") == b"x" * 1000  # the client still works
    monkeypatch.setenv("GPURT_STORE_MAX_VALUE", "lots")
    with pytest.raises(DistributedError, match="GPURT_STORE_MAX_VALUE='lots'"):
        TCPStore("127.0.0.1", 0, is_master=True, timeout=5)


def test_long_keys_are_refused(master: TCPStore) -> None:
    with pytest.raises(ValueError, match="at most 65536 bytes"):
        master.set("k" * 70000, b"")
    master.set("ok", b"1")


# ---- timeouts and the connection limit --------------------------------------------------------


def test_a_half_sent_request_is_dropped(master: TCPStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tcpstore, "_READ_TIMEOUT", 0.3)
    server = server_of(master)
    with raw(master) as sock:
        sock.sendall(_tcpstore._REQUEST.pack(_tcpstore._SET, 1, 10)[:3])
        sock.settimeout(3)
        assert sock.recv(1) == b""
    assert until(lambda: len(server._clients) == 1)  # the master's own client is left


def test_idle_connections_are_dropped_and_clients_reconnect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_tcpstore.SECRET_ENV, raising=False)
    monkeypatch.setenv("GPURT_STORE_IDLE_TIMEOUT", "0.3")
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=5) as store:
        server = server_of(store)
        with raw(store) as sock:
            sock.settimeout(3)
            assert sock.recv(1) == b""  # dropped
        store.set("a", b"1")
        assert until(lambda: not server._clients)
        assert store.get("a") == b"1"  # reconnected once, transparently
        assert store.add("n", 2) == 2


def test_connections_are_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_tcpstore.SECRET_ENV, raising=False)
    monkeypatch.setenv("GPURT_STORE_MAX_CONNECTIONS", "3")
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=5) as store:
        held = [raw(store), raw(store)]
        with pytest.raises(DistributedError, match="GPURT_STORE_MAX_CONNECTIONS"):
            TCPStore("127.0.0.1", store.port, timeout=5)
        held.pop().close()
        assert until(lambda: len(server_of(store)._clients) == 2)
        with TCPStore("127.0.0.1", store.port, timeout=5) as client:
            client.set("in", b"yes")
        held.pop().close()


def test_a_waiting_get_ends_when_its_client_leaves(
    master: TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tcpstore, "_POLL", 0.05)
    server = server_of(master)
    sock = raw(master)
    payload = _tcpstore._FLOAT.pack(1e8)
    sock.sendall(_tcpstore._REQUEST.pack(_tcpstore._GET, 5, len(payload)) + b"never" + payload)
    assert until(lambda: len(server._clients) == 2)
    sock.close()
    assert until(lambda: len(server._clients) == 1, 3.0)


# ---- the shared secret ------------------------------------------------------------------------


def test_a_shared_secret_admits_only_peers_that_know_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_tcpstore.SECRET_ENV, "s3cret")
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=5) as store:
        with TCPStore("127.0.0.1", store.port, timeout=5) as peer:
            peer.set("k", b"v")
            assert store.get("k") == b"v"
        monkeypatch.setenv(_tcpstore.SECRET_ENV, "wrong")
        with pytest.raises(DistributedError, match="authentication .* failed"):
            TCPStore("127.0.0.1", store.port, timeout=5)
        monkeypatch.delenv(_tcpstore.SECRET_ENV)
        with pytest.raises(DistributedError, match="wants a secret"):
            TCPStore("127.0.0.1", store.port, timeout=5)
        with socket.create_connection(("127.0.0.1", store.port), timeout=5) as sock:
            _tcpstore._receive(sock, _tcpstore._REPLY)  # the hello with its challenge
            header = _tcpstore._REQUEST.pack(_tcpstore._GET, 1, 8)
            sock.sendall(header + b"k" + _tcpstore._FLOAT.pack(0))
            status, (message,) = _tcpstore._receive(sock, _tcpstore._REPLY)
            assert status == _tcpstore._ERROR and b"authentication failed" in message
            assert sock.recv(1) == b""


def test_a_client_with_a_secret_refuses_a_server_without_one(
    master: TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_tcpstore.SECRET_ENV, "s3cret")
    with pytest.raises(DistributedError, match="does not ask for it"):
        TCPStore("127.0.0.1", master.port, timeout=5)


def test_the_secret_is_never_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_tcpstore.SECRET_ENV, "s3cret-value")
    listener = socket.create_server(("127.0.0.1", 0))
    nonce = os.urandom(32)
    seen: list[bytes] = []

    def fake_server() -> None:
        conn, _ = listener.accept()
        with conn:
            _tcpstore._send(conn, _tcpstore._REPLY, _tcpstore._OK, _tcpstore._INT.pack(100) + nonce)
            _, (client_nonce, proof) = _tcpstore._receive(conn, _tcpstore._REQUEST)
            seen.extend([client_nonce, proof])
            _tcpstore._send(conn, _tcpstore._REPLY, _tcpstore._ERROR, b"no")

    thread = threading.Thread(target=fake_server)
    thread.start()
    with pytest.raises(DistributedError):
        TCPStore("127.0.0.1", listener.getsockname()[1], timeout=5)
    thread.join(5)
    listener.close()
    client_nonce, proof = seen
    assert b"s3cret" not in client_nonce + proof
    expected = hmac.new(b"s3cret-value", b"gpurt-store-1 client " + nonce + client_nonce,
                        hashlib.sha256).digest()
    assert proof == expected


# ---- FileStore --------------------------------------------------------------------------------


def test_file_store_refuses_a_world_writable_folder(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(DistributedError, match="world-writable"):
        FileStore(folder)
    folder.chmod(0o700)
    FileStore(folder).close()


def test_file_store_never_follows_a_planted_lock_link(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    (folder / "lock").symlink_to(target)
    with pytest.raises(DistributedError, match="lock file"):
        FileStore(folder, world_size=1)
    store = FileStore(folder)
    with pytest.raises(DistributedError, match="lock file"):
        store.set("k", b"v")
    assert not target.exists()


def test_file_store_close_never_raises(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s", world_size=2)
    users = _filestore._key_file(store.path, _filestore._USERS)
    Path(users).write_bytes(b"not a number")
    store.close()  # documented never to raise
    store.close()


def test_file_store_lock_must_be_a_regular_file(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    os.mkfifo(folder / "lock")
    store = FileStore(folder)
    with pytest.raises(DistributedError):
        store.set("k", b"v")
    assert stat.S_ISFIFO(os.lstat(folder / "lock").st_mode)


# ---- rendezvous messages ----------------------------------------------------------------------


def test_a_rendezvous_timeout_in_a_huge_world_stays_short() -> None:
    store = HashStore(timeout=0.2)
    with pytest.raises(DistributedTimeoutError) as caught:
        join_world(store, 5, 10**6)
    message = str(caught.value)
    assert len(message) < 300, message
    assert "joined: 5; missing: 0-4, 6-999999" in message


def test_a_barrier_timeout_in_a_huge_world_stays_short() -> None:
    store = HashStore(timeout=0.2)
    with pytest.raises(DistributedTimeoutError) as caught:
        barrier(store, 0, 10**6, "t")
    message = str(caught.value)
    assert len(message) < 300, message
    assert "did not arrive: 1-4095" in message and "999999 of 1000000" in message
