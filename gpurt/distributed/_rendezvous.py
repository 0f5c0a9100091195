"""The rendezvous of gpurt.distributed over the stores of gpurt/distributed/_store.py (stdlib
only: no CUDA, no NCCL), with torch.distributed's names and meanings.

:func:`rendezvous` reads torch's ``init_method`` (``env://``, ``tcp://host:port``,
``file:///path``), opens the store and calls :func:`join_world`: each rank appends
``rank world_size pid host`` to a join log that every rank reads in order, so a rank out of
range, a rank joined twice or ranks disagreeing on the world size fail in each process that
reads the conflicting entry, as soon as it is written; ranks that do not come in time give a
timeout that lists the joined and the missing ranks. Keys left in a store by a run that died
are recognised by their pids and explained. :func:`barrier` is a CPU-side barrier on a store.
"""

from __future__ import annotations

import operator
import os
import socket
import time
import urllib.parse
from datetime import timedelta
from typing import NamedTuple

from ._store import (
    DEFAULT_TIMEOUT,
    DistributedError,
    DistributedTimeoutError,
    FileStore,
    Store,
    TCPStore,
)
from ._storebase import _seconds

__all__ = ["barrier", "join_world", "rendezvous"]

_ENV_NEEDS = (
    "init_process_group(init_method='env://') needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
)


def rendezvous(
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    timeout: float | timedelta = DEFAULT_TIMEOUT,
) -> tuple[Store, int, int]:
    """Open the store that ``init_method`` names and join the world: ``(store, rank,
    world_size)``. ``env://`` (the default) reads RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT, as torchrun sets them; ``tcp://host:port`` (rank 0 serves) and
    ``file:///path`` take rank and world_size from ``?rank=..&world_size=..`` or RANK and
    WORLD_SIZE. Arguments win over both."""
    method = init_method or "env://"
    url = urllib.parse.urlsplit(method)
    if url.scheme not in ("env", "tcp", "file"):
        raise DistributedError(
            f"init_method={method!r} is not supported: use env://, tcp://host:port or file:///path"
        )
    rank = _setting("rank", rank, url, minimum=0)
    world_size = _setting("world_size", world_size, url, minimum=1)
    store: Store
    if url.scheme == "file":
        if url.netloc not in ("", "localhost") or not url.path:
            raise DistributedError(f"init_method={method!r}: expected file:///absolute/path")
        store = FileStore(urllib.parse.unquote(url.path), world_size, timeout)
    else:
        host, port = _env_master() if url.scheme == "env" else (url.hostname, _url_port(url))
        if not host or not port:
            raise DistributedError(f"init_method={method!r}: expected tcp://host:port")
        store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    try:
        join_world(store, rank, world_size, timeout)
    except BaseException:
        store.close()
        raise
    return store, rank, world_size


def _setting(name: str, given: int | None, url: urllib.parse.SplitResult, minimum: int) -> int:
    """rank or world_size: the argument, else the URL's query, else the environment."""
    variable = name.upper()
    query = urllib.parse.parse_qs(url.query)
    raw: int | str
    if given is not None:
        raw, source = given, f"{name}="
    elif name in query:
        raw, source = query[name][-1], f"?{name}="
    elif os.environ.get(variable):
        raw, source = os.environ[variable], f"{variable}="
    elif url.scheme == "env":
        raise DistributedError(f"{variable} is not set; {_ENV_NEEDS}")
    else:
        raise DistributedError(
            f"{name} is not given; init_method={url.geturl()!r} needs rank and world_size "
            "(arguments, ?rank=..&world_size=.. or RANK and WORLD_SIZE)"
        )
    try:
        value = int(raw) if isinstance(raw, str) else operator.index(raw)
    except (TypeError, ValueError):
        raise DistributedError(f"{source}{raw!r} is not an integer") from None
    if value < minimum:
        raise DistributedError(f"{source}{raw!r}: {name} must be at least {minimum}")
    return value


def _env_master() -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT, for env://."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise DistributedError(f"{name} is not set; {_ENV_NEEDS}")
    port = os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(f"MASTER_PORT={port!r} is not a TCP port (1-65535)")
    return os.environ["MASTER_ADDR"], int(port)


def _url_port(url: urllib.parse.SplitResult) -> int | None:
    try:
        return url.port
    except ValueError:
        return None


class _Member(NamedTuple):
    """An entry of the join log."""

    rank: int
    world_size: int
    pid: int
    host: str

    def encode(self) -> bytes:
        return f"{self.rank} {self.world_size} {self.pid} {self.host}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> _Member:
        try:
            rank, world_size, pid, host = raw.decode().split(" ", 3)
            return cls(int(rank), int(world_size), int(pid), host)
        except ValueError:
            raise DistributedError(f"the store holds {raw!r:.60}, not a join entry") from None

    def gone(self) -> bool:
        """A process of this host that no longer runs: its entry is from an earlier run."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass  # alive, and another user's
        return False


def join_world(
    store: Store, rank: int, world_size: int, timeout: float | timedelta | None = None
) -> None:
    """Register this process as ``rank`` of ``world_size`` and wait for the others, checking
    each entry of the join log: a rank out of range, a rank joined twice or a different world
    size raises DistributedError in every process that reads it; ranks still missing after
    ``timeout`` (the store's by default) raise DistributedTimeoutError naming them."""
    seconds = store.timeout if timeout is None else _seconds(timeout)
    deadline = time.monotonic() + seconds
    me = _Member(rank, world_size, os.getpid(), socket.gethostname())
    mine = store.add("world/joined", 1)
    store.set(f"world/member/{mine}", me.encode())
    members: dict[int, _Member] = {}
    first = me
    index = 1
    while index <= mine or len(members) < world_size:
        try:
            raw = store.get(f"world/member/{index}", max(deadline - time.monotonic(), 1e-3))
        except DistributedTimeoutError:
            joined = _runs(sorted(members))
            raise DistributedTimeoutError(
                f"{store!r}: {len(members)} of {world_size} ranks joined within {seconds:g} s; "
                f"joined: {_ranks(joined)}; missing: {_ranks(_gaps(joined, world_size))}"
            ) from None
        entry = _Member.decode(raw)
        first = entry if index == 1 else first
        _check_entry(store, first, members, entry)
        members[entry.rank] = entry
        index += 1


def _check_entry(store: Store, first: _Member, members: dict[int, _Member], entry: _Member) -> None:
    """Raise DistributedError when ``entry`` conflicts with the world of the join log."""
    if entry.world_size != first.world_size:
        low, high = sorted((first, entry))
        earlier = first
        conflict = (
            f"rank {low.rank} says world_size={low.world_size}, "
            f"rank {high.rank} says {high.world_size}"
        )
    elif not 0 <= entry.rank < entry.world_size:
        raise DistributedError(
            f"rank {entry.rank} is out of range for world_size={entry.world_size} "
            f"(pid {entry.pid} on {entry.host}); ranks are 0 to {entry.world_size - 1}"
        )
    elif entry.rank in members:
        earlier = members[entry.rank]
        pids = f"pids {earlier.pid} and {entry.pid}"
        if earlier.host != entry.host:
            pids = f"pid {earlier.pid} on {earlier.host} and pid {entry.pid} on {entry.host}"
        conflict = f"rank {entry.rank} joined twice: {pids}"
    else:
        return
    if earlier.gone():
        conflict += (
            f"; pid {earlier.pid} no longer runs: {store!r} holds the keys of an earlier run "
            "that did not close it; delete them or use a new store"
        )
    raise DistributedError(conflict)


_SHOWN = 16  # runs of ranks a message lists; it counts the rest
_SCANNED = 4096  # ranks a barrier's timeout checks one by one


def _runs(ranks: list[int]) -> list[tuple[int, int]]:
    """Sorted ranks as runs of consecutive ones: (first, last) pairs."""
    runs: list[tuple[int, int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    return runs


def _gaps(runs: list[tuple[int, int]], world_size: int) -> list[tuple[int, int]]:
    """The runs of 0..world_size-1 that ``runs`` leave out."""
    gaps, start = [], 0
    for first, last in runs:
        if first > start:
            gaps.append((start, first - 1))
        start = last + 1
    if start < world_size:
        gaps.append((start, world_size - 1))
    return gaps


def _ranks(runs: list[tuple[int, int]]) -> str:
    """Runs of ranks as "0-3, 7", with at most _SHOWN runs and a count of the rest (a message
    about a huge world stays short)."""
    if not runs:
        return "none"
    text = ", ".join(f"{a}-{b}" if b > a + 1 else ", ".join(map(str, dict.fromkeys((a, b))))
                     for a, b in runs[:_SHOWN])
    if len(runs) > _SHOWN:
        rest = sum(b - a + 1 for a, b in runs[_SHOWN:])
        text += f" and {rest} more"
    return text


def barrier(
    store: Store, rank: int, world_size: int, tag: str, timeout: float | timedelta | None = None
) -> None:
    """Wait until all ``world_size`` ranks have reached the barrier ``tag`` (a name used for no
    other barrier on this store); a timeout names the ranks that did not come."""
    prefix = f"barrier/{tag}"
    store.set(f"{prefix}/{rank}", b"")
    arrived = store.add(f"{prefix}/arrived", 1)
    if arrived > world_size:
        raise DistributedError(
            f"barrier {tag!r}: {arrived} arrivals in a world of {world_size} (a tag used twice?)"
        )
    if arrived == world_size:
        store.set(f"{prefix}/done", b"")
    try:
        store.wait([f"{prefix}/done"], timeout)
    except DistributedTimeoutError:
        scanned = range(min(world_size, _SCANNED))
        missing = [r for r in scanned if not store.check([f"{prefix}/{r}"])]
        absent = world_size - store.add(f"{prefix}/arrived", 0)
        more = f" (ranks from {_SCANNED} on not checked)" if world_size > _SCANNED else ""
        raise DistributedTimeoutError(
            f"{store!r}: barrier {tag!r} timed out; ranks that did not arrive: "
            f"{_ranks(_runs(missing))}{more} ({absent} of {world_size} in all)"
        ) from None
