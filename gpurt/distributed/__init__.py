"""Several processes, one GPU each: torch.distributed's NCCL collectives on gpurt Arrays.

``init_process_group`` finds the other ranks through a store (``env://`` torchrun-style
variables, ``tcp://host:port`` or ``file:///path``; see gpurt/distributed/_rendezvous.py),
which also checks that every rank agrees on the world; rank 0's NCCL unique id travels through it,
and each rank opens its NCCL communicator on its GPU (``device_id``, else LOCAL_RANK, else
rank % device_count; that device becomes current). The collectives take gpurt Arrays or
any device array (torch, CuPy, JAX; read zero-copy) and run on the current stream of that
device, as torch's do from the caller's view: they return once queued, or a :class:`Work`
with ``async_op=True``.

A peer that dies must not hang the others. Every collective gets a deadline (the group's
``timeout``); a watchdog thread aborts the communicator when one passes or when NCCL
reports an asynchronous error, which also frees kernels stuck waiting for the dead peer.
From then on every call raises the reason (:class:`DistributedTimeoutError` or
:class:`NcclError`); ``Work.wait()`` raises it at once. torch's ``work.wait()`` only
orders streams; gpurt's waits on the host until the collective has finished, so a
caller can tell success from failure. Capturing a collective into a CUDA graph raises
NotImplementedError for now.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from cuda.bindings import driver as cu

from .._core.driver import check
from .._core.fork import renew_after_fork
from ..array import Array
from ..device import bind_context, device_count, set_device
from ..streams import Stream, current_stream
from . import _collective, _nccl, _rendezvous, _storebase
from ._nccl import NcclError, ReduceOp
from ._store import DistributedError, DistributedTimeoutError, Store

__all__ = [
    "DistributedError", "DistributedTimeoutError", "NcclError", "ReduceOp", "Work",
    "all_gather", "all_gather_into_tensor", "all_reduce", "barrier", "broadcast",
    "destroy_process_group", "get_backend", "get_rank", "get_world_size", "init_process_group",
    "irecv", "is_available", "is_initialized", "is_nccl_available", "isend", "recv", "reduce",
    "reduce_scatter_tensor", "send",
]

DEFAULT_TIMEOUT = 600.0  # seconds, torch's default for NCCL process groups
_WATCH_PERIOD = 0.05  # seconds between the watchdog's looks
_NO_TIMING = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
_NOT_READY = cu.CUresult.CUDA_ERROR_NOT_READY
_CAPTURE_NONE = int(cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)
_events_lock = threading.Lock()
renew_after_fork(globals(), _events_lock=threading.Lock)
_QUEUEING = object()  # a Work whose collective is being queued


def is_available() -> bool:
    """True if NCCL (nccl4py and libnccl) can be loaded in this process."""
    return _nccl.is_available()


is_nccl_available = is_available


def _seconds(timeout: float | timedelta | None) -> float:
    """``timeout`` in seconds, checked as the stores check theirs; None: the default."""
    return DEFAULT_TIMEOUT if timeout is None else _storebase._seconds(timeout)


class Work:
    """A queued collective: :meth:`wait` blocks until it has finished on the device (or
    raises why it never will); :meth:`is_completed` asks without blocking."""

    __slots__ = ("_group", "what", "deadline", "_event")

    def __init__(self, group: _Group, what: str) -> None:
        self._group, self.what = group, what
        self.deadline = time.monotonic() + group.timeout
        self._event: Any = _QUEUEING  # then an event recorded after it, then None: done

    def __repr__(self) -> str:
        return f"<gpurt.distributed.Work {self.what}>"

    def _recorded(self, stream: Stream) -> None:
        event = check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate")
        check(cu.cuEventRecord(event, stream.cuda_stream), "cuEventRecord")
        self._event = event

    def _query(self) -> bool:
        """True once finished on the device (the event is then freed). The watchdog and
        the caller both ask: one lock keeps an event from being freed while asked."""
        with _events_lock:
            event = self._event
            if event is None or event is _QUEUEING:
                return event is None
            (err,) = cu.cuEventQuery(event)
            if err == _NOT_READY:
                return False
            self._event = None
            cu.cuEventDestroy(event)
        check((err,), "cuEventQuery")
        return True

    def is_completed(self) -> bool:
        """True if the collective has finished; raises if the group has failed."""
        self._group.raise_failure()
        return self._query()

    def wait(self, timeout: float | timedelta | None = None) -> bool:
        """Block until the collective has finished on the device. Raises the group's
        failure (a timed-out or aborted communicator), or DistributedTimeoutError after
        ``timeout`` seconds if given (the group's own deadline still applies)."""
        limit = None if timeout is None else time.monotonic() + _seconds(timeout)
        pause = 20e-6
        while not self.is_completed():
            if limit is not None and time.monotonic() > limit:
                raise DistributedTimeoutError(f"{self.what} did not finish within "
                                              f"{_seconds(timeout):g} s")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        return True

    synchronize = wait


class _Group:
    """The process group: the store, this rank's communicator and the watchdog."""

    def __init__(self, store: Store, rank: int, size: int, device: int, timeout: float,
                 comm: _nccl.Communicator) -> None:
        self.store, self.rank, self.size, self.device = store, rank, size, device
        self.timeout, self.comm = timeout, comm
        self.lock = threading.RLock()  # held while a collective is queued, and to abort
        self.pending: collections.deque[Work] = collections.deque()
        self.failure: DistributedError | None = None
        self.barriers = 0
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                          name=f"gpurt-nccl-watchdog-rank{rank}")
        self._watchdog.start()

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    # -- the watchdog ---------------------------------------------------------------------

    def _watch(self) -> None:
        bind_context(self.device)
        while not self._stop.wait(_WATCH_PERIOD) and self.failure is None:
            try:
                problem = self._look()
            except Exception as exc:  # a CUDA error seen on an event: the context is gone
                problem = DistributedError(f"the watchdog saw a CUDA error: {exc}")
            if problem is not None:
                self.fail(problem)
                return

    def _look(self) -> DistributedError | None:
        while self.pending and self.pending[0]._query():
            self.pending.popleft()
        status = self.comm.async_error() if self.comm.alive else 0
        if status not in (0, _nccl._IN_PROGRESS):
            return NcclError("an earlier collective", status,
                             f"{_nccl.error_text(status)}; NCCL reported it asynchronously")
        now = time.monotonic()
        late = next((w for w in self.pending if w.deadline < now), None)
        if late is not None:
            return DistributedTimeoutError(
                f"{late.what} on rank {self.rank} did not finish within {self.timeout:g} s: "
                "a peer process may have died or not called it; the NCCL communicator "
                "was aborted"
            )
        return None

    def fail(self, problem: DistributedError) -> None:
        """Record ``problem`` and abort the communicator, so nothing waits for a dead peer."""
        # A thread stuck inside an NCCL call holds the lock; NCCL lets another thread abort.
        locked = self.lock.acquire(timeout=1.0)
        try:
            if self.failure is None:
                self.failure = problem
            self.comm.abort()
        finally:
            if locked:
                self.lock.release()
        warnings.warn(f"gpurt.distributed: {problem}", RuntimeWarning, stacklevel=1)

    def close(self) -> None:
        self._stop.set()
        if self._watchdog is not threading.current_thread():
            self._watchdog.join()
        with self.lock:
            if self.failure is None and self.comm.alive:
                self.comm.destroy()
            else:
                self.comm.abort()
        self.store.close()

    # -- queueing collectives -------------------------------------------------------------

    def run(self, what: str, arrays: Sequence[Array], calls: Sequence[Any],
            async_op: bool) -> Work | None:
        """Queue ``calls`` (each ``fn(comm handle, stream handle)``; several run as one
        NCCL group) on the device's current stream, ordered around ``arrays``."""
        stream = current_stream(self.device)
        if _capturing(stream):
            raise NotImplementedError(
                f"{what}: gpurt.distributed cannot capture collectives into a CUDA graph yet "
                "(the watchdog could not watch them); run it outside the capture")
        _collective.before(stream, arrays)
        work = Work(self, what)
        with self.lock:
            self.raise_failure()
            self.pending.append(work)  # the deadline watches a call stuck in NCCL too
            bind_context(self.device)
            handle = self.comm.handle
            try:
                if len(calls) == 1:
                    _nccl.call(what, calls[0], handle, stream.cuda_stream)
                else:
                    _nccl.call_group(what, [(fn, (handle, stream.cuda_stream)) for fn in calls])
            except NcclError as exc:
                # a call the watchdog aborted (stuck connecting to a dead peer) reports the
                # deadline, not NCCL's view of the abort; any other failure ends the group too
                if self.failure is None:
                    self.fail(exc)
                raise cast(DistributedError, self.failure) from exc
            work._recorded(stream)
        _collective.after(stream, arrays)
        return work if async_op else None


def _capturing(stream: Stream) -> bool:
    """True while ``stream`` is being captured into a CUDA graph (or may not be used
    because another stream captures)."""
    err, status = cu.cuStreamIsCapturing(stream.cuda_stream)
    return int(err) != 0 or int(status) != _CAPTURE_NONE


_world: _Group | None = None
_world_lock = threading.Lock()
renew_after_fork(globals(), _world_lock=threading.Lock)
_groups_made = 0  # keys in the store stay distinct when a process re-initialises


def _group(group: None = None) -> _Group:
    """The process group (the world, the only one gpurt has)."""
    if group is not None:
        raise NotImplementedError("gpurt.distributed has one group, the world: pass group=None")
    world = _world
    if world is None:
        raise DistributedError("gpurt.distributed: call init_process_group() first")
    return world


def _pick_device(device_id: Any, rank: int) -> int:
    if device_id is not None:
        return device_id.index if hasattr(device_id, "index") else int(device_id)
    local = os.environ.get("LOCAL_RANK")
    if local is not None:
        try:
            return int(local)
        except ValueError:
            raise DistributedError(f"LOCAL_RANK={local!r} is not an integer") from None
    return rank % device_count()


def init_process_group(backend: str = "nccl", init_method: str | None = None,
                       timeout: float | timedelta | None = None, world_size: int = -1,
                       rank: int = -1, store: Store | None = None,
                       device_id: Any = None) -> None:
    """Join the group of ``world_size`` processes as ``rank`` and open this rank's NCCL
    communicator; blocks until every rank has joined (or ``timeout`` passes). Arguments
    as torch.distributed.init_process_group's; ``backend`` must be "nccl"."""
    global _world, _groups_made
    if backend.lower() != "nccl":
        raise ValueError(f"gpurt.distributed runs on NCCL only, not {backend!r}")
    seconds = _seconds(timeout)
    with _world_lock:
        if _world is not None:
            raise DistributedError("the process group is already initialised; call "
                                   "destroy_process_group() first")
        _nccl.bindings()  # the install hint, before any waiting
        given_rank = None if rank < 0 else rank
        given_size = None if world_size < 0 else world_size
        if store is None:
            store, rank, world_size = _rendezvous.rendezvous(init_method, given_rank,
                                                             given_size, seconds)
        elif given_rank is None or given_size is None:
            raise ValueError("with a store, give rank and world_size too")
        else:
            rank, world_size = given_rank, given_size
        try:
            device = _pick_device(device_id, rank)
            set_device(device)
            key = f"gpurt/nccl/{_groups_made}/unique_id"
            if rank == 0:
                store.set(key, _nccl.unique_id())
            uid = store.get(key, seconds)
            comm = _nccl.init_rank(world_size, uid, rank, device)
        except BaseException:
            store.close()
            raise
        _groups_made += 1
        _world = _Group(store, rank, world_size, device, seconds, comm)


def is_initialized() -> bool:
    return _world is not None


def destroy_process_group() -> None:
    """Free the communicator (aborting it if it failed) and leave the store."""
    global _world
    with _world_lock:
        group, _world = _world, None
    if group is not None:
        group.close()


def get_rank() -> int:
    return _group().rank


def get_world_size() -> int:
    return _group().size


def get_backend() -> str:
    _group()
    return "nccl"


# ---- collectives ---------------------------------------------------------------------------


def _on_device(group: _Group, obj: Any, what: str, name: str) -> Array:
    array = _collective.flat(_collective.device_array(obj, what, name), what, name)
    if array.device.index != group.device:
        raise ValueError(f"{what}: {name} is on {array.device}, but this rank's NCCL "
                         f"communicator is on cuda:{group.device}")
    return array


def _rank(group: _Group, value: int, what: str, name: str) -> int:
    if not 0 <= value < group.size:
        raise ValueError(f"{what}: {name}={value} is not a rank of this group "
                         f"(0..{group.size - 1})")
    return value


def all_reduce(array: Any, op: ReduceOp | str = ReduceOp.SUM, group: None = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``array`` over all ranks with ``op``, in place on every rank."""
    what, g = "all_reduce", _group(group)
    a = _on_device(g, array, what, "array")
    dtype, code = _nccl.datatype(a.dtype, what), _nccl.reduce_op(op, a.dtype, what)
    nccl = _nccl.bindings()
    return g.run(what, [a], [lambda c, s: nccl.all_reduce(a.ptr, a.ptr, a.size, dtype, code,
                                                           c, s)], async_op)


def broadcast(array: Any, src: int, group: None = None, async_op: bool = False) -> Work | None:
    """Copy rank ``src``'s ``array`` into ``array`` on every other rank."""
    what, g = "broadcast", _group(group)
    a = _on_device(g, array, what, "array")
    root, dtype = _rank(g, src, what, "src"), _nccl.datatype(a.dtype, what)
    nccl = _nccl.bindings()
    return g.run(what, [a], [lambda c, s: nccl.broadcast(a.ptr, a.ptr, a.size, dtype, root,
                                                          c, s)], async_op)


def reduce(array: Any, dst: int, op: ReduceOp | str = ReduceOp.SUM, group: None = None,
           async_op: bool = False) -> Work | None:
    """Reduce ``array`` over all ranks with ``op`` into ``array`` on rank ``dst``."""
    what, g = "reduce", _group(group)
    a = _on_device(g, array, what, "array")
    root = _rank(g, dst, what, "dst")
    dtype, code = _nccl.datatype(a.dtype, what), _nccl.reduce_op(op, a.dtype, what)
    nccl = _nccl.bindings()
    return g.run(what, [a], [lambda c, s: nccl.reduce(a.ptr, a.ptr, a.size, dtype, code, root,
                                                       c, s)], async_op)


def _sized(g: _Group, big: Array, small: Array, what: str, names: tuple[str, str]) -> int:
    """Check ``big`` holds world_size times ``small`` (same dtype); the count of ``small``."""
    if big.dtype != small.dtype:
        raise TypeError(f"{what}: {names[0]} is {big.dtype.name}, {names[1]} is "
                        f"{small.dtype.name}")
    if big.size != small.size * g.size:
        raise ValueError(f"{what}: {names[0]} has {big.size} elements, which must be "
                         f"world_size ({g.size}) x the {small.size} of {names[1]}")
    return small.size


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: None = None,
                           async_op: bool = False) -> Work | None:
    """Concatenate every rank's ``input_tensor`` (in rank order) into ``output_tensor``,
    which has world_size times its elements (torch's name)."""
    what, g = "all_gather_into_tensor", _group(group)
    out = _on_device(g, output_tensor, what, "output_tensor")
    inp = _on_device(g, input_tensor, what, "input_tensor")
    count = _sized(g, out, inp, what, ("output_tensor", "input_tensor"))
    dtype = _nccl.datatype(inp.dtype, what)
    nccl = _nccl.bindings()
    return g.run(what, [out, inp], [lambda c, s: nccl.all_gather(inp.ptr, out.ptr, count,
                                                                  dtype, c, s)], async_op)


def all_gather(tensor_list: list[Any], tensor: Any, group: None = None,
               async_op: bool = False) -> Work | None:
    """Fill ``tensor_list[r]`` with rank r's ``tensor`` on every rank (one NCCL group of
    broadcasts, so the list's arrays need not be one buffer)."""
    what, g = "all_gather", _group(group)
    inp = _on_device(g, tensor, what, "tensor")
    if len(tensor_list) != g.size:
        raise ValueError(f"{what}: tensor_list has {len(tensor_list)} arrays, the world has "
                         f"{g.size} ranks")
    outs = [_on_device(g, t, what, f"tensor_list[{r}]") for r, t in enumerate(tensor_list)]
    _collective.same_layout([inp, *outs], what)
    dtype, count = _nccl.datatype(inp.dtype, what), inp.size
    nccl = _nccl.bindings()

    def step(root: int, out: Array) -> Any:
        return lambda c, s: nccl.broadcast(inp.ptr, out.ptr, count, dtype, root, c, s)

    return g.run(what, [inp, *outs], [step(r, o) for r, o in enumerate(outs)], async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: ReduceOp | str = ReduceOp.SUM,
                          group: None = None, async_op: bool = False) -> Work | None:
    """Reduce ``input`` (world_size blocks) over all ranks; rank r gets block r in
    ``output`` (torch's name)."""
    what, g = "reduce_scatter_tensor", _group(group)
    out = _on_device(g, output, what, "output")
    inp = _on_device(g, input, what, "input")
    count = _sized(g, inp, out, what, ("input", "output"))
    dtype, code = _nccl.datatype(inp.dtype, what), _nccl.reduce_op(op, inp.dtype, what)
    nccl = _nccl.bindings()
    return g.run(what, [out, inp], [lambda c, s: nccl.reduce_scatter(inp.ptr, out.ptr, count,
                                                                      dtype, code, c, s)],
                 async_op)


def _point_to_point(kind: str, tensor: Any, peer: int, group: None) -> Work:
    """Queue a send to, or a receive from, rank ``peer`` (``kind``: "send" or "recv")."""
    g = _group(group)
    a = _on_device(g, tensor, kind, "tensor")
    other = _rank(g, peer, kind, "dst" if kind == "send" else "src")
    if other == g.rank:
        raise ValueError(f"{kind}: rank {other} cannot {kind} to or from itself")
    dtype, nccl = _nccl.datatype(a.dtype, kind), _nccl.bindings()
    fn = nccl.send if kind == "send" else nccl.recv
    work = g.run(kind, [a], [lambda c, s: fn(a.ptr, a.size, dtype, other, c, s)], True)
    assert work is not None
    return work


def isend(tensor: Any, dst: int, group: None = None, tag: int = 0) -> Work:
    """Send ``tensor`` to rank ``dst``, which must post a matching :func:`recv`."""
    return _point_to_point("send", tensor, dst, group)


def irecv(tensor: Any, src: int, group: None = None, tag: int = 0) -> Work:
    """Receive into ``tensor`` what rank ``src`` sends."""
    return _point_to_point("recv", tensor, src, group)


def send(tensor: Any, dst: int, group: None = None, tag: int = 0) -> None:
    """Send ``tensor`` to rank ``dst`` and wait until it has gone."""
    isend(tensor, dst, group, tag).wait()


def recv(tensor: Any, src: int, group: None = None, tag: int = 0) -> int:
    """Receive into ``tensor`` from rank ``src`` and wait until it has arrived; returns
    ``src`` as torch does."""
    irecv(tensor, src, group, tag).wait()
    return src


def barrier(group: None = None, timeout: float | timedelta | None = None) -> None:
    """Wait until every rank has reached its barrier (a store barrier: no GPU work)."""
    g = _group(group)
    g.raise_failure()
    g.barriers += 1
    _rendezvous.barrier(g.store, g.rank, g.size, f"gpurt/barrier/{g.barriers}",
                        _seconds(timeout) if timeout is not None else g.timeout)
