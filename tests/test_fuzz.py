"""Fuzzing what gpurt reads from outside the process (issue #18), bounded so that it stays
in the CPU suite: the TCPStore protocol (server and client side), the kernel cache's entry
decoder and toolchain record check, and the memviz snapshot loader."""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpurt import memviz
from gpurt._nvrtc import cache as _kcache
from gpurt._profiler.memtimeline import SnapshotError, build_timelines, load_snapshot
from gpurt.distributed import _tcpstore
from gpurt.distributed._store import DistributedError, TCPStore

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


# ---- the store protocol -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(_tcpstore.SECRET_ENV, raising=False)
        patch.setattr(_tcpstore, "_READ_TIMEOUT", 0.2)
        patch.setattr(_tcpstore, "_POLL", 0.02)
        with TCPStore("127.0.0.1", 0, is_master=True, timeout=5) as store:
            yield store


@FUZZ
@given(st.binary(max_size=64))
def test_the_server_survives_any_bytes(server: TCPStore, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        _tcpstore._receive(sock, _tcpstore._REPLY)  # the hello
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):  # replies, an error, then the server hangs up
                pass
        except OSError:
            pass  # it hung up already
    server.set("alive", b"yes")
    assert server.get("alive") == b"yes"


def get_wait() -> st.SearchStrategy[bytes]:
    """A GET payload: short waits only (a long valid wait would just wait)."""
    return st.one_of(
        st.floats(min_value=0, max_value=0.01).map(_tcpstore._FLOAT.pack),
        st.sampled_from([float("nan"), float("inf"), -1.0, 1e300]).map(_tcpstore._FLOAT.pack),
        st.binary(max_size=12).filter(lambda b: len(b) != 8),
    )


@FUZZ
@given(st.integers(0, 255), st.binary(max_size=40), st.data())
def test_every_request_gets_an_answer(server: TCPStore, operation: int, key: bytes,
                                      data: st.DataObject) -> None:
    payload = data.draw(get_wait() if operation == _tcpstore._GET else st.binary(max_size=40))
    answer = _tcpstore._Server._answer(server_of(server), None, operation, key, payload)
    status, reply = answer
    assert status in (_tcpstore._OK, _tcpstore._TIMEOUT, _tcpstore._ERROR)
    assert isinstance(reply, bytes)


def server_of(store: TCPStore) -> _tcpstore._Server:
    return store._finalizer.peek()[2][1]


@FUZZ
@given(st.integers(0, 255), st.binary(max_size=80),
       st.one_of(st.none(), st.binary(min_size=1, max_size=16)))
def test_the_client_handshake_never_fails_oddly(status: int, hello: bytes,
                                                secret: bytes | None) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        def serve() -> None:
            try:
                _tcpstore._send(theirs, _tcpstore._REPLY, status, hello)
                _tcpstore._receive(theirs, _tcpstore._REQUEST)
                _tcpstore._send(theirs, _tcpstore._REPLY, status, hello[:32])
            except OSError:
                pass
            theirs.close()

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            limit = _tcpstore._handshake(ours, secret, 2.0)
        except DistributedError:
            pass
        else:
            assert status == _tcpstore._OK and isinstance(limit, int)
        ours.shutdown(socket.SHUT_RDWR)  # the stand-in server may still wait for a request
        thread.join(5)
        assert not thread.is_alive()


# ---- the kernel cache -------------------------------------------------------------------------

names = st.text(max_size=12)
entries = st.builds(_kcache.Entry, st.binary(max_size=64), st.sampled_from(["cubin", "ptx"]),
                    st.dictionaries(names, names, max_size=3), st.text(max_size=20))


@FUZZ
@given(st.binary(max_size=256))
def test_decode_takes_any_bytes(data: bytes) -> None:
    assert _kcache.decode("k", data) is None or isinstance(_kcache.decode("k", data),
                                                            _kcache.Entry)


@FUZZ
@given(entries, st.integers(min_value=0), st.integers(0, 255))
def test_decode_round_trips_and_spots_damage(entry: _kcache.Entry, where: int,
                                             byte: int) -> None:
    data = _kcache.encode("k", entry)
    assert _kcache.decode("k", data) == entry
    assert _kcache.decode("other", data) is None
    damaged = bytearray(data)
    damaged[where % len(data)] = byte
    decoded = _kcache.decode("k", bytes(damaged))
    assert decoded is None or decoded == entry or bytes(damaged) == data


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


@FUZZ
@given(st.one_of(json_values, st.fixed_dictionaries(
    {"nvrtc_version": json_values, "include_dirs": json_values, "stamps": json_values})))
def test_record_check_takes_any_json(record) -> None:
    assert _kcache._record_ok(record) in (True, False)


# ---- the memviz loader ------------------------------------------------------------------------

events = st.fixed_dictionaries({}, optional={
    "action": st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc",
                               "segment_free", "oom", "empty_cache"]) | json_values,
    "addr": st.integers(0, 1 << 20) | json_values,
    "size": st.integers(0, 1 << 20) | json_values,
    "stream": st.integers(0, 4) | json_values,
    "time_us": st.floats(0, 1e6) | json_values,
    "frames": st.lists(st.fixed_dictionaries({}, optional={
        "filename": st.text(max_size=10) | json_values, "line": st.integers(0, 99),
        "name": st.text(max_size=10)}), max_size=2) | json_values,
})
snapshots = st.fixed_dictionaries({}, optional={
    "segments": st.lists(st.fixed_dictionaries({}, optional={
        "device": st.integers(0, 2) | json_values, "stream": st.integers(0, 3),
        "total_size": st.integers(0, 1 << 20),
        "blocks": st.lists(st.fixed_dictionaries({}, optional={
            "address": st.integers(0, 1 << 20), "size": st.integers(0, 1 << 20) | json_values,
            "state": st.sampled_from(["active_allocated", "inactive"]) | json_values}),
            max_size=3)}), max_size=2) | json_values,
    "device_traces": st.lists(st.lists(events, max_size=6) | st.none(), max_size=2)
    | json_values,
})


@FUZZ
@given(snapshots)
def test_the_loader_accepts_or_names_the_problem(snapshot) -> None:
    try:
        load_snapshot(snapshot)
    except SnapshotError as exc:
        assert str(exc)
        return
    build_timelines(snapshot, max_bands=8)  # what loads also draws


@FUZZ
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_the_loader_takes_any_file(tmp_path_factory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("snap") / "s.json"
    path.write_bytes(data)
    try:
        load_snapshot(str(path))
    except SnapshotError:
        return
    out = path.with_suffix(".html")
    memviz.render_html(str(path), out, max_bands=8)
    assert out.read_text().count("</script>") == memviz.PAGE.count("</script>")


def test_struct_sizes_are_what_the_fuzzers_assume() -> None:
    assert _tcpstore._REQUEST.size == 9 and _tcpstore._REPLY.size == 5
    assert struct.calcsize("!d") == 8
