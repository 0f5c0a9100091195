"""gpurt.distributed: several processes, one GPU each, on NCCL.

CPU: the API imports, errors are clear before init and without NCCL. GPU (2+ devices and
nccl4py): tests/_dist_worker.py runs in one process per GPU, through env://, tcp:// and
file:// rendezvous; every collective and dtype is checked there against numpy, a peer that
dies gives the others a timeout instead of a hang, and a mismatched world fails clearly.
NCCL_NVLS_ENABLE=0 is set for every process (no NVLink multicast on shared machines).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import _multigpu
import gpurt
from gpurt import distributed as dist
from gpurt.distributed import _nccl

WORKER = Path(__file__).with_name("_dist_worker.py")


multi_gpu = _multigpu.multi_gpu()


# ---- CPU --------------------------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda: dist.get_rank(), lambda: dist.get_world_size(), lambda: dist.barrier(),
    lambda: dist.all_reduce(np.zeros(3)), lambda: dist.broadcast(np.zeros(3), 0),
])
def test_calls_before_init_say_so(call) -> None:  # type: ignore[no-untyped-def]
    assert not dist.is_initialized()
    with pytest.raises(dist.DistributedError, match=r"call init_process_group\(\) first"):
        call()


def test_only_nccl_and_only_the_world() -> None:
    with pytest.raises(ValueError, match="NCCL only, not 'gloo'"):
        dist.init_process_group("gloo")
    with pytest.raises(NotImplementedError, match="one group, the world"):
        dist._group(object())  # type: ignore[arg-type]


def test_init_without_nccl_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_nccl, "_module", None)
    monkeypatch.setitem(sys.modules, "nccl.bindings.nccl", None)
    monkeypatch.setitem(sys.modules, "nccl.bindings", None)
    with pytest.raises(dist.DistributedError, match="nccl4py"):
        dist.init_process_group(init_method="tcp://127.0.0.1:1", rank=0, world_size=1,
                                timeout=1)
    assert not dist.is_initialized()


def test_exceptions_are_torch_like() -> None:
    assert issubclass(dist.DistributedTimeoutError, TimeoutError)
    assert issubclass(dist.NcclError, dist.DistributedError)
    assert issubclass(dist.DistributedError, RuntimeError)
    assert [op.name for op in dist.ReduceOp] == ["SUM", "PRODUCT", "MAX", "MIN", "AVG"]


# ---- several processes ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, world: int, init: str | None = None, timeout: float = 240,
           extra: dict[int, dict[str, str]] | None = None) -> list[tuple[int, str]]:
    """Run the worker in ``world`` processes; (exit code, output) per rank."""
    port, seed = _free_port(), str(np.random.default_rng().integers(1 << 30))
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NCCL_NVLS_ENABLE": "0",
               "PYTHONUNBUFFERED": "1", "GPURT_TEST_SEED": seed}
        if init:
            env["GPURT_TEST_INIT"] = init
        env.update((extra or {}).get(rank, {}))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), scenario], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            pytest.fail(f"{scenario}: a rank hung for {timeout} s:\n{out[-3000:]}")
        results.append((p.returncode, out))
    return results


def _assert_ok(results: list[tuple[int, str]]) -> None:
    for rank, (code, out) in enumerate(results):
        assert code == 0 and "\nOK" in "\n" + out, f"rank {rank} (exit {code}):\n{out[-4000:]}"


@multi_gpu
@pytest.mark.gpu
@pytest.mark.slow
def test_every_collective_and_dtype_against_numpy() -> None:
    _assert_ok(launch("ops", gpurt.device_count()))


@multi_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("how", ["tcp", "file"])
def test_tcp_and_file_rendezvous(how: str, tmp_path: Path) -> None:
    init = (f"tcp://127.0.0.1:{_free_port()}" if how == "tcp"
            else f"file://{tmp_path / 'rendezvous'}")
    _assert_ok(launch("errors", 2, init=init))


@multi_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("scenario", ["peer_dies", "peer_dies_early"])
def test_a_dead_peer_gives_a_timeout_not_a_hang(scenario: str) -> None:
    start = time.monotonic()
    results = launch(scenario, 2, timeout=120, extra={r: {"GPURT_TEST_TIMEOUT": "8"}
                                                       for r in range(2)})
    _assert_ok(results)
    assert "timed out after" in results[0][1]
    assert time.monotonic() - start < 90


@multi_gpu
@pytest.mark.gpu
def test_a_mismatched_world_fails_clearly() -> None:
    results = launch("ops", 2, timeout=60, extra={1: {"GPURT_TEST_WORLD": "3",
                                                      "GPURT_TEST_TIMEOUT": "10"}})
    for rank, (code, out) in enumerate(results):
        assert code != 0, f"rank {rank} passed with a mismatched world:\n{out[-2000:]}"
        assert "world_size" in out or "world size" in out, out[-2000:]


# ---- the watchdog, without a GPU ----------------------------------------------------------


class FakeComm:
    """A communicator that only records what the watchdog does to it."""

    def __init__(self) -> None:
        self.handle, self.device, self.alive, self.aborted, self.error = object(), 0, True, 0, 0

    def async_error(self) -> int:
        return self.error

    def abort(self) -> None:  # like the real one: frees once, later calls do nothing
        self.aborted += self.alive
        self.alive = False

    def destroy(self) -> None:
        self.alive = False


def _watched_group(monkeypatch: pytest.MonkeyPatch, timeout: float) -> tuple[dist._Group, FakeComm]:
    from gpurt.distributed._store import HashStore

    monkeypatch.setattr(dist, "bind_context", lambda index: None)
    monkeypatch.setattr(dist, "_WATCH_PERIOD", 0.01)
    comm = FakeComm()
    return dist._Group(HashStore(), 0, 2, 0, timeout, comm), comm  # type: ignore[arg-type]


def _until(condition, seconds: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    return bool(condition())


def test_watchdog_aborts_a_collective_past_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    group, comm = _watched_group(monkeypatch, timeout=0.2)
    work = dist.Work(group, "all_reduce")  # never recorded: stuck, as behind a dead peer
    group.pending.append(work)
    with pytest.warns(RuntimeWarning, match="all_reduce on rank 0 did not finish within 0.2 s"):
        assert _until(lambda: group.failure is not None)
    assert comm.aborted == 1 and not comm.alive
    with pytest.raises(dist.DistributedTimeoutError, match="communicator was aborted"):
        work.wait()
    with pytest.raises(dist.DistributedTimeoutError):
        group.raise_failure()  # every later call says why
    group.close()
    assert comm.aborted == 1  # aborted once, not again on close


def test_watchdog_turns_an_async_nccl_error_into_the_groups_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    group, comm = _watched_group(monkeypatch, timeout=60)
    comm.error = 6  # ncclRemoteError, as NCCL reports a peer's network failure
    with pytest.warns(RuntimeWarning, match="NCCL reported it asynchronously"):
        assert _until(lambda: group.failure is not None)
    assert isinstance(group.failure, dist.NcclError) and group.failure.status == 6
    assert comm.aborted == 1
    group.close()


def test_a_healthy_group_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    group, comm = _watched_group(monkeypatch, timeout=60)
    time.sleep(0.1)
    assert group.failure is None and comm.aborted == 0
    group.close()
    assert not comm.alive and comm.aborted == 0  # destroyed, not aborted
