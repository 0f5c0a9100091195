"""Tests for gpurt/distributed/_tcpstore.py and gpurt/distributed/_rendezvous.py: the stores
(HashStore, TCPStore, FileStore), rendezvous and its world checks, and the store barrier. CPU only.

Each store passes the same set/get/add/wait/timeout tests; the multi-process tests start
``python -c`` workers (ports are picked free, folders are tmp_path) and assert the messages
that every process involved reports. Every blocking call has a timeout.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from _threads import in_thread
from gpurt.distributed import _filestore, _storebase, _tcpstore
from gpurt.distributed._rendezvous import barrier, join_world, rendezvous
from gpurt.distributed._store import (
    DistributedError,
    DistributedTimeoutError,
    FileStore,
    HashStore,
    Store,
    TCPStore,
)

ROOT = Path(__file__).resolve().parent.parent
ENV_NAMES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")

# One rank of a world: rendezvous, exchange a value with every rank, barrier, close. Prints
# one JSON line: the values read, or the DistributedError raised.
WORKER = textwrap.dedent(
    """
    import json, os, sys
    from gpurt.distributed._rendezvous import barrier, rendezvous
    from gpurt.distributed._store import DistributedError
    spec = json.loads(sys.argv[1])
    result = {"pid": os.getpid()}
    try:
        store, rank, world = rendezvous(
            spec.get("init"), spec.get("rank"), spec.get("world_size"), timeout=spec["timeout"]
        )
        if spec.get("crash"):  # leave without closing the store, as a crashed run does
            print(json.dumps({**result, "crashed": True}), flush=True)
            os._exit(0)
        store.wait(spec.get("wait_for", []))  # keys that a test wants set before going on
        store.set(f"value/{rank}", f"hello from {rank}")
        result["values"] = [store.get(f"value/{r}").decode() for r in range(world)]
        barrier(store, rank, world, "end")
        store.close()
    except DistributedError as exc:
        result.update(error=type(exc).__name__, message=str(exc))
    print(json.dumps(result), flush=True)
    """
)

# A TCPStore master that prints its port and lives until it is killed.
MASTER = (
    "import time; from gpurt.distributed._store import TCPStore; "
    "store = TCPStore('127.0.0.1', 0, is_master=True, timeout=5); "
    "print(store.port, flush=True); time.sleep(60)"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in ENV_NAMES}
    return {**env, **(extra or {})}


def start_worker(spec: dict[str, Any]) -> subprocess.Popen[str]:
    """A worker for ``spec``, with its "env" added to a clean environment."""
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, json.dumps(spec)],
        cwd=ROOT,
        env=clean_env(spec.get("env")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_world(specs: list[dict[str, Any]], limit: float = 30.0) -> list[dict[str, Any]]:
    """Run one worker per spec; their results, in the order of ``specs``."""
    return collect([start_worker(spec) for spec in specs], limit)


def collect(procs: list[subprocess.Popen[str]], limit: float = 30.0) -> list[dict[str, Any]]:
    """The results of started workers; workers still running after ``limit`` s fail the test."""
    deadline = time.monotonic() + limit
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            assert proc.returncode == 0 and out.strip(), err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    return results


def tcp_world(world: list[tuple[int, int]], timeout: float = 10.0) -> list[dict[str, Any]]:
    """Specs for tcp://: one (rank, world_size) per process."""
    init = f"tcp://127.0.0.1:{free_port()}"
    return [{"init": init, "rank": r, "world_size": w, "timeout": timeout} for r, w in world]


def file_world(
    path: Path, world: list[tuple[int, int]], timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Specs for file:// with rank and world_size in the URL's query."""
    return [
        {"init": f"file://{path}?rank={r}&world_size={w}", "timeout": timeout} for r, w in world
    ]


def world_specs(
    transport: str, tmp_path: Path, world: list[tuple[int, int]], **kw: float
) -> list[dict[str, Any]]:
    return tcp_world(world, **kw) if transport == "tcp" else file_world(tmp_path / "s", world, **kw)


def elapsed(fn: Callable[[], object]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


# ---- every store ----------------------------------------------------------------------------


@pytest.fixture(params=["hash", "tcp", "file"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """A factory of stores sharing their keys: a HashStore (the same one), a TCPStore (the
    master first, then clients) or FileStores of one folder. All closed afterwards."""
    made: list[Store] = []

    def make() -> Store:
        store: Store
        if request.param == "hash":
            store = made[0] if made else HashStore(timeout=5)
        elif request.param == "tcp":
            port = made[0].port if made else 0  # type: ignore[attr-defined]
            store = TCPStore("127.0.0.1", port, is_master=not made, timeout=5)
        else:
            store = FileStore(tmp_path / "store", timeout=5)
        made.append(store)
        return store

    yield make
    for store in reversed(made):  # clients before the TCP master
        store.close()


def test_set_get_check_delete(stores: Callable[[], Store]) -> None:
    first, second = stores(), stores()
    first.set("a/b c", b"\x00\xffbytes")
    second.set("text", "héllo")
    assert second.get("a/b c") == b"\x00\xffbytes"
    assert first.get("text", timeout=1) == "héllo".encode()
    first.set("text", b"")
    assert second.get("text") == b""
    assert first.check(["a/b c", "text"]) and not first.check(["a/b c", "nothing"])
    assert second.delete_key("text") is True
    assert first.delete_key("text") is False
    assert not second.check(["text"])
    with pytest.raises(TypeError, match="bytes or str"):
        first.set("number", 5)  # type: ignore[arg-type]


def test_add_is_an_atomic_counter(stores: Callable[[], Store]) -> None:
    store = stores()
    assert store.add("count", 3) == 3
    assert store.add("count", -5) == -2
    assert store.get("count") == b"-2"
    store.set("word", b"nine")
    with pytest.raises(DistributedError, match=r"add\('word'\): the key holds b'nine', not a"):
        store.add("word", 1)

    def count(client: Store) -> list[int]:
        return [client.add("shared", 1) for _ in range(50)]

    with ThreadPoolExecutor(4) as pool:  # four clients (threads of one HashStore) at once
        totals = list(pool.map(count, [stores() for _ in range(4)], timeout=20))
    assert sorted(sum(totals, [])) == list(range(1, 201))
    assert store.get("shared") == b"200"


def test_get_waits_for_a_later_set(stores: Callable[[], Store]) -> None:
    reader, writer = stores(), stores()
    timer = threading.Timer(0.2, writer.set, args=("late", b"here"))
    timer.start()
    start = time.monotonic()
    assert reader.get("late", timeout=5) == b"here"
    assert time.monotonic() - start >= 0.15
    timer.join(5)
    reader.wait(["late"], timeout=timedelta(seconds=1))


def test_get_and_wait_time_out_naming_the_keys(stores: Callable[[], Store]) -> None:
    store = stores()
    store.set("present", b"1")
    start = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match="key 'missing' was not set within 0.2 s"):
        store.get("missing", timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2
    assert issubclass(DistributedTimeoutError, TimeoutError)
    with pytest.raises(DistributedTimeoutError, match=r"keys \['absent'\] were not set within"):
        store.wait(["present", "absent"], timeout=timedelta(seconds=0.2))
    with pytest.raises(ValueError, match="positive"):
        store.get("present", timeout=0)


def test_closed_store_raises(stores: Callable[[], Store]) -> None:
    with stores() as store:
        store.set("k", b"v")
    store.close()  # idempotent
    for call in (lambda: store.get("k"), lambda: store.set("k", b""), lambda: store.add("n", 1)):
        with pytest.raises(DistributedError, match="closed"):
            call()


def test_store_timeout_validation() -> None:
    assert HashStore(timeout=timedelta(minutes=2)).timeout == 120.0
    assert HashStore(timeout=timedelta(days=36500)).timeout == _storebase._MAX_WAIT
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout must be"):
            HashStore(timeout=bad)


def test_hash_store_close_wakes_waiters() -> None:
    store = HashStore()
    threading.Timer(0.2, store.close).start()
    with pytest.raises(DistributedError, match="closed"):
        in_thread(lambda: store.get("never", timeout=10))


# ---- TCPStore ---------------------------------------------------------------------------------


def test_tcp_client_waits_for_a_late_master() -> None:
    port = free_port()
    masters: list[TCPStore] = []
    timer = threading.Timer(
        0.3, lambda: masters.append(TCPStore("127.0.0.1", port, is_master=True, timeout=5))
    )
    timer.start()
    with TCPStore("127.0.0.1", port, timeout=5) as client:
        timer.join(5)
        masters[0].set("k", b"v")
        assert client.get("k") == b"v"
    masters[0].close()


def test_tcp_client_without_a_master_times_out() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(DistributedTimeoutError, match=f"TCPStore at 127.0.0.1:{port} within 0.5 s"):
        TCPStore("127.0.0.1", port, timeout=0.5)
    assert time.monotonic() - start < 3


def test_tcp_ports_and_a_taken_port() -> None:
    with pytest.raises(ValueError, match="port 0"):
        TCPStore("127.0.0.1", 0, timeout=1)
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=1) as master:
        assert master.port > 0
        with pytest.raises(DistributedError, match=f"could not listen on 127.0.0.1:{master.port}"):
            TCPStore("127.0.0.1", master.port, is_master=True, timeout=1)


def test_tcp_client_of_a_killed_master_fails_instead_of_hanging() -> None:
    master = subprocess.Popen(
        [sys.executable, "-c", MASTER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert master.stdout is not None
        assert select.select([master.stdout], [], [], 20)[0], "the master did not start"
        port = int(master.stdout.readline())
        client = TCPStore("127.0.0.1", port, timeout=5)
        client.set("k", b"v")
        assert client.get("k") == b"v"
        threading.Timer(0.3, master.send_signal, args=(signal.SIGKILL,)).start()
        start = time.monotonic()
        with pytest.raises(DistributedError, match="lost the connection to the server"):
            client.get("never", timeout=10)  # blocked in the server when the master dies
        assert time.monotonic() - start < 5
        with pytest.raises(DistributedError, match="lost the connection"):
            client.get("k")
        client.close()
        master.wait(5)
        with pytest.raises(DistributedTimeoutError, match="could not connect"):
            TCPStore("127.0.0.1", port, timeout=0.3)
    finally:
        master.kill()
        master.wait(5)


def test_tcp_master_close_lets_clients_finish() -> None:
    """A master closing right after its last set: the waiting client still gets the value,
    and the master's close returns once that client has left."""
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    client = TCPStore("127.0.0.1", master.port, timeout=5)
    got: list[bytes] = []

    def read_then_close() -> None:
        got.append(client.get("done", timeout=5))
        time.sleep(0.2)
        client.close()

    reader = threading.Thread(target=read_then_close)
    reader.start()
    time.sleep(0.1)
    master.set("done", b"yes")
    assert 0.1 < elapsed(master.close) < 4
    reader.join(5)
    assert got == [b"yes"]


def test_tcp_server_survives_malformed_requests() -> None:
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=5) as master:
        with socket.create_connection(("127.0.0.1", master.port), timeout=5) as rogue:
            assert _tcpstore._receive(rogue, _tcpstore._REPLY)[0] == _tcpstore._OK  # the hello
            for wait in (float("nan"), float("inf"), -1.0):  # a get of key "x" with a bad wait
                payload = _tcpstore._FLOAT.pack(wait)
                header = _tcpstore._REQUEST.pack(_tcpstore._GET, 1, len(payload))
                rogue.sendall(header + b"x" + payload)
                status, (message,) = _tcpstore._receive(rogue, _tcpstore._REPLY)
                assert status == _tcpstore._ERROR
                assert message.startswith(b"malformed request: ValueError: a wait of")
            rogue.sendall(b"\xff" * 9)  # a header announcing two 4 GiB parts
            assert _tcpstore._receive(rogue, _tcpstore._REPLY)[0] == _tcpstore._ERROR
            assert rogue.recv(1) == b""  # the server hangs up on it
        master.set("still", b"serving")
        with TCPStore("127.0.0.1", master.port, timeout=5) as client:
            assert client.get("still") == b"serving"


# ---- FileStore --------------------------------------------------------------------------------


def test_file_store_creates_a_private_directory(tmp_path: Path) -> None:
    old_umask = os.umask(0)
    try:
        FileStore(tmp_path / "new" / "store").close()
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "new" / "store").stat().st_mode) == 0o700
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    os.chmod(existing, 0o755)
    FileStore(existing).close()
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755  # not ours to change
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(DistributedError, match="is not a directory"):
        FileStore(tmp_path / "file")


def test_file_store_writes_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer, reader = FileStore(tmp_path / "s"), FileStore(tmp_path / "s")
    values = (b"a" * (1 << 20), b"b" * (1 << 20))
    writer.set("big", values[0])

    def write() -> None:
        for i in range(30):
            writer.set("big", values[i % 2])

    thread = threading.Thread(target=write)
    thread.start()
    seen = set()
    while thread.is_alive():
        seen.add(reader.get("big", timeout=1))
    thread.join(20)
    assert seen <= set(values)

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        writer.set("big", b"never seen")
    monkeypatch.undo()
    assert reader.get("big") == values[1]
    assert not [name for name in os.listdir(tmp_path / "s") if name.startswith("tmp.")]


def test_file_store_deletes_its_keys_when_all_users_closed(tmp_path: Path) -> None:
    path = tmp_path / "s"
    first, second, late = (FileStore(path, world_size=2) for _ in range(3))
    first.set("k", b"v")
    first.close()
    second.close()
    assert late.get("k") == b"v"  # a world_size's worth have left, but one is still open
    late.close()
    with FileStore(path) as after:
        assert not any(after.check([key]) for key in ("k", _filestore._USERS, _filestore._LEFT))


# ---- rendezvous across processes ------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "env", "file"])
def test_rendezvous_across_processes(transport: str, tmp_path: Path) -> None:
    world = [(rank, 4) for rank in range(4)]
    if transport == "env":
        master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "4"}
        specs = [{"env": {**master, "RANK": str(r)}, "timeout": 10.0} for r, _ in world]
    else:
        specs = world_specs(transport, tmp_path, world)
    expected = [f"hello from {r}" for r in range(4)]
    assert [result.get("values") for result in run_world(specs)] == [expected] * 4, specs


@pytest.mark.parametrize("transport", ["tcp", "file"])
def test_mismatched_world_sizes(transport: str, tmp_path: Path) -> None:
    results = run_world(world_specs(transport, tmp_path, [(0, 2), (1, 3)]))
    for result in results:
        assert result.get("message") == "rank 0 says world_size=2, rank 1 says 3", result


@pytest.mark.parametrize("transport", ["tcp", "file"])
def test_rank_out_of_range(transport: str, tmp_path: Path) -> None:
    results = run_world(world_specs(transport, tmp_path, [(0, 2), (5, 2)]))
    for result in results:
        assert result.get("message", "").startswith(
            "rank 5 is out of range for world_size=2 (pid "
        ), result


@pytest.mark.parametrize("transport", ["tcp", "file"])
def test_rank_joined_twice(transport: str, tmp_path: Path) -> None:
    # The two that make a world wait for the third entry of the join log before they go on
    # and close, so the late twin finds the log. Rank 0 opens a FileStore first: twins that
    # meet, fail and close before it opens would delete their keys and leave it waiting for
    # rank 1 (its error is then a timeout); a TCPStore's twins wait for the master anyway.
    specs = world_specs(transport, tmp_path, [(0, 2), (1, 2), (1, 2)])
    specs = [{**spec, "wait_for": ["world/member/3"]} for spec in specs]
    procs = [start_worker(specs[0])]
    if transport == "file":
        with FileStore(tmp_path / "s") as view:
            view.wait(["world/member/1"], timeout=20)
    results = collect(procs + [start_worker(spec) for spec in specs[1:]])
    twins = {results[1]["pid"], results[2]["pid"]}
    failed = [result for result in results if "error" in result]
    assert failed, results  # the later rank 1 at least; the others if they read its entry
    for result in failed:
        assert result["error"] == "DistributedError", result
        pids = result["message"].removeprefix("rank 1 joined twice: pids ").split(" and ")
        assert {int(pid) for pid in pids} == twins, result
    for result in results:
        assert result in failed or result["values"] == ["hello from 0", "hello from 1"]


@pytest.mark.parametrize("transport", ["tcp", "file"])
def test_missing_rank_times_out_naming_it(transport: str, tmp_path: Path) -> None:
    start = time.monotonic()
    results = run_world(world_specs(transport, tmp_path, [(0, 3), (1, 3)], timeout=2.0))
    for result in results:
        assert result["error"] == "DistributedTimeoutError", result
        assert "2 of 3 ranks joined within 2 s; joined: 0, 1; missing: 2" in result["message"]
    assert time.monotonic() - start < 10


def test_file_store_reused_after_a_crashed_run(tmp_path: Path) -> None:
    path = tmp_path / "s"
    clean = file_world(path, [(0, 2), (1, 2)])
    assert all("values" in result for result in run_world(clean))
    # A run that closed its store left the path empty: the next one joins (and crashes).
    assert all(r.get("crashed") for r in run_world([{**spec, "crash": True} for spec in clean]))
    for result in run_world(clean):
        assert "joined twice" in result["message"], result
        assert f"no longer runs: FileStore('{path}') holds the keys of an earlier run" in (
            result["message"]
        )


# ---- rendezvous arguments and environment -----------------------------------------------------


@pytest.mark.parametrize(
    ("init", "env", "message"),
    [
        (None, {}, "RANK is not set; init_process_group(init_method='env://') needs RANK, "
                   "WORLD_SIZE, MASTER_ADDR and MASTER_PORT"),
        ("env://", {"RANK": "0"}, "WORLD_SIZE is not set; init_process_group"),
        (None, {"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        (None, {"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1': rank must be at least 0"),
        (None, {"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0': world_size must be at least 1"),
        (None, {"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set; init_process_group"),
        (None, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT is not set"),
        (None, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "http"},
         "MASTER_PORT='http' is not a TCP port"),
        (None, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
         "MASTER_PORT='70000' is not a TCP port"),
        ("tcp://127.0.0.1:1234", {}, "rank is not given; init_method='tcp://127.0.0.1:1234' needs"),
        ("tcp://127.0.0.1?rank=0&world_size=1", {}, "expected tcp://host:port"),
        ("file://relative/path?rank=0&world_size=1", {}, "expected file:///absolute/path"),
        ("file:///tmp/x?rank=zero&world_size=1", {}, "?rank='zero' is not an integer"),
        ("nccl://", {}, "init_method='nccl://' is not supported"),
    ],
)
def test_rendezvous_argument_errors(
    init: str | None, env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistributedError) as info:
        rendezvous(init, timeout=1)
    assert message in str(info.value)


def test_rendezvous_arguments_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    env = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store, rank, world_size = rendezvous(rank=0, world_size=1, timeout=5)
    with store:
        assert (rank, world_size) == (0, 1)
        assert isinstance(store, TCPStore) and store.port == port and store.is_master
    with pytest.raises(DistributedError, match="rank=1.5 is not an integer"):
        rendezvous(rank=1.5, world_size=1, timeout=1)  # type: ignore[arg-type]


# ---- join_world and barrier in one process ------------------------------------------------------


def test_join_world_explains_stale_entries_of_a_dead_process() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    store = HashStore()
    store.add("world/joined", 1)
    store.set("world/member/1", f"0 2 {dead.pid} {socket.gethostname()}")
    message = (
        rf"rank 0 joined twice: pids {dead.pid} and {os.getpid()}; pid {dead.pid} no longer "
        r"runs: HashStore\(\) holds the keys of an earlier run"
    )
    with pytest.raises(DistributedError, match=message):
        join_world(store, 0, 2, timeout=1)


def test_join_world_and_barrier_in_threads() -> None:
    store = HashStore(timeout=5)
    world = 3
    order: list[str] = []

    def rank(r: int) -> None:
        join_world(store, r, world)
        time.sleep(0.05 * r)
        order.append(f"before {r}")
        barrier(store, r, world, "one")
        order.append(f"after {r}")

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(order[:world]) == [f"before {r}" for r in range(world)]
    assert sorted(order[world:]) == [f"after {r}" for r in range(world)]


def test_barrier_timeout_names_the_missing_ranks() -> None:
    store = HashStore()
    errors: list[Exception] = []

    def rank_2() -> None:
        try:
            barrier(store, 2, 3, "t", timeout=0.5)
        except DistributedTimeoutError as exc:
            errors.append(exc)

    thread = threading.Thread(target=rank_2)
    thread.start()
    with pytest.raises(DistributedTimeoutError, match="barrier 't' timed out; ranks that did not"):
        barrier(store, 0, 3, "t", timeout=0.5)
    thread.join(5)
    assert "ranks that did not arrive: 1" in str(errors[0])
    barrier(store, 1, 3, "t", timeout=0.5)  # the last arrival completes it
    with pytest.raises(DistributedError, match="4 arrivals in a world of 3 \\(a tag used twice"):
        barrier(store, 1, 3, "t", timeout=0.5)
