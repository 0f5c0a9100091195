"""One process driving several GPUs: torch.cuda.comm's collectives, on NCCL.

``broadcast``, ``broadcast_coalesced``, ``scatter``, ``gather``, ``reduce_add``,
``reduce_add_coalesced`` take and return the same things as torch.cuda.comm's, with gpurt
Arrays (or any device array, read zero-copy); ``all_reduce`` (in place, on every device)
is gpurt's addition. Each call runs as one NCCL group over communicators made once per set
of devices (ncclCommInitAll) and kept for the process. On each device the work runs on the
current stream of that device (or the ``streams`` given), ordered after the streams the
arrays were made on, and outputs belong to that stream; see gpurt/distributed/_collective.py for how
inputs stay alive until NCCL has read them.

Needs NCCL: ``pip install 'gpurt[nccl]'``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from ._core.fork import renew_after_fork
from .array import Array, empty, zeros
from .device import DeviceLike, _index, current_device
from .distributed import _collective, _nccl
from .distributed._nccl import ReduceOp
from .streams import Stream, current_stream

__all__ = ["ReduceOp", "all_reduce", "broadcast", "broadcast_coalesced", "gather",
           "reduce_add", "reduce_add_coalesced", "scatter"]

_F = TypeVar("_F", bound=Callable[..., Any])
_BUFFER_SIZE = 10 * 1024 * 1024  # torch's default for the *_coalesced calls

_cliques: dict[tuple[int, ...], dict[int, _nccl.Communicator]] = {}
_cliques_lock = threading.Lock()
renew_after_fork(globals(), _cliques_lock=threading.Lock)


def _torch_names(**renamed: str) -> Callable[[_F], _F]:
    """Take the keyword names gpurt used before (``array=``) as torch's (``tensor=``)."""
    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got both {old}= and {new}=")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        return call  # type: ignore[return-value]
    return wrap


def _clique(devices: Sequence[int]) -> dict[int, _nccl.Communicator]:
    """Communicators for the set ``devices`` (made once, kept), by device."""
    key = tuple(sorted(set(devices)))
    comms = _cliques.get(key)
    if comms is None:
        with _cliques_lock:
            comms = _cliques.get(key)
            if comms is None:
                comms = _cliques[key] = {c.device: c for c in _nccl.init_all(key)}
    return comms


def _devices(devices: Sequence[DeviceLike], what: str) -> list[int]:
    indices = [_index(d) for d in devices]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{what}: devices {indices} name a device twice")
    return indices


def _stream(index: int, streams: Sequence[Stream | None] | None, i: int) -> Stream:
    chosen = streams[i] if streams is not None else None
    return chosen if chosen is not None else current_stream(index)


Step = tuple[Stream, list[Array], Any, tuple[Any, ...]]


def _run(what: str, steps: list[Step]) -> None:
    """Run ``steps`` as one NCCL group. A step is (stream, the arrays it touches, an NCCL
    binding, its arguments but the stream); every stream is ordered after its arrays'
    streams before, and recorded as their user after."""
    if not steps:
        return
    for stream, arrays, _, _ in steps:
        _collective.before(stream, arrays)
    _nccl.call_group(what, [(fn, (*args, stream.cuda_stream)) for stream, _, fn, args in steps])
    for stream, arrays, _, _ in steps:
        _collective.after(stream, arrays)


# ---- broadcast ---------------------------------------------------------------------------


@_torch_names(array="tensor")
def broadcast(tensor: Any, devices: Sequence[DeviceLike] | None = None, *,
              out: Sequence[Any] | None = None) -> tuple[Array, ...]:
    """Copies of ``tensor`` (a device array) on each of ``devices`` (the array itself for
    its own device), or written into ``out`` (contiguous arrays, one per device). Exactly
    one of ``devices`` and ``out``, as in torch.cuda.comm.broadcast."""
    what = "comm.broadcast"
    src = _collective.flat(_collective.device_array(tensor, what, "tensor"), what, "tensor")
    if (devices is None) == (out is None):
        raise ValueError(f"{what}: give exactly one of devices and out")
    root = src.device.index
    if out is None:
        targets = [src if d == root else empty(src.shape, src.dtype, d)
                   for d in _devices(cast(Sequence[DeviceLike], devices), what)]
    else:
        targets = _collective.flat_arrays(out, what, "out")
        _collective.same_layout([src, *targets], what)
        _devices([t.device.index for t in targets], what)
    _broadcast_group(what, [(src, targets)])
    return tuple(targets)


def _broadcast_group(what: str, pairs: list[tuple[Array, list[Array]]]) -> None:
    """For each (source, targets): copy source into every target, in one NCCL group."""
    nccl = _nccl.bindings()
    steps: list[Step] = []
    for src, targets in pairs:
        root = src.device.index
        on_root = [t for t in targets if t.device.index == root and t is not src]
        ranks = {t.device.index: t for t in targets if t.device.index != root}
        for extra in on_root[1:] if ranks else on_root:
            extra.copy_(src)
        if not ranks:
            continue
        comms = _clique([root, *ranks])
        count, dtype = src.size, _nccl.datatype(src.dtype, what)
        rank_of_root = comms[root].rank
        recv_root = on_root[0] if on_root else src
        steps.append((current_stream(root), [src, recv_root], nccl.broadcast,
                      (src.ptr, recv_root.ptr, count, dtype, rank_of_root, comms[root].handle)))
        for index, target in ranks.items():
            steps.append((current_stream(index), [target], nccl.broadcast,
                          (target.ptr, target.ptr, count, dtype, rank_of_root,
                           comms[index].handle)))
    _run(what, steps)


@_torch_names(arrays="tensors")
def broadcast_coalesced(tensors: Sequence[Any], devices: Sequence[DeviceLike],
                        buffer_size: int = _BUFFER_SIZE) -> list[tuple[Array, ...]]:
    """Broadcast several arrays, all on ``devices[0]``, to ``devices``; returns one tuple
    of arrays per device (the originals for ``devices[0]``). Small arrays go together:
    one NCCL group per ``buffer_size`` bytes, which NCCL fuses into few kernels."""
    what = "comm.broadcast_coalesced"
    indices = _devices(devices, what)
    srcs = _collective.flat_arrays(tensors, what, "tensors")
    for i, s in enumerate(srcs):
        if s.device.index != indices[0]:
            raise ValueError(f"{what}: tensors[{i}] is on {s.device}; all must be on "
                             f"devices[0] (cuda:{indices[0]})")
    outputs = [[s if d == indices[0] else empty(s.shape, s.dtype, d) for s in srcs]
               for d in indices]
    for chunk in _chunks(srcs, buffer_size):
        _broadcast_group(what, [(srcs[i], [row[i] for row in outputs[1:]]) for i in chunk])
    return [tuple(row) for row in outputs]


def _chunks(arrays: Sequence[Array], buffer_size: int) -> list[list[int]]:
    """Indices of ``arrays`` in runs of at most ``buffer_size`` bytes (at least one)."""
    runs: list[list[int]] = [[]]
    total = 0
    for i, a in enumerate(arrays):
        if runs[-1] and total + a.nbytes > buffer_size:
            runs.append([])
            total = 0
        runs[-1].append(i)
        total += a.nbytes
    return [r for r in runs if r]


# ---- reductions --------------------------------------------------------------------------


def reduce_add(inputs: Sequence[Any], destination: DeviceLike = None) -> Array:
    """The sum of ``inputs`` (same shape and dtype, one per device) as a new array on
    ``destination`` (default: the current device)."""
    return reduce_add_coalesced([[x] for x in inputs], destination, buffer_size=None)[0]


def reduce_add_coalesced(inputs: Sequence[Sequence[Any]], destination: DeviceLike = None,
                         buffer_size: int | None = _BUFFER_SIZE) -> tuple[Array, ...]:
    """``inputs[d]`` is a list of arrays on device d; returns the element-wise sums of
    ``inputs[0][i], inputs[1][i], ...`` on ``destination``, grouped into NCCL groups of
    about ``buffer_size`` bytes."""
    what = "comm.reduce_add" if buffer_size is None else "comm.reduce_add_coalesced"
    if not inputs:
        raise ValueError(f"{what}: no inputs")
    per_device = [_collective.flat_arrays(row, what, f"inputs[{d}]")
                  for d, row in enumerate(inputs)]
    if len({len(row) for row in per_device}) != 1:
        raise ValueError(f"{what}: every device must give the same number of arrays")
    indices = _devices([row[0].device.index for row in per_device], what)
    for row, index in zip(per_device, indices):
        for i, a in enumerate(row):
            if a.device.index != index:
                raise ValueError(f"{what}: the arrays of one input list must share a device "
                                 f"(array {i} is on {a.device}, not cuda:{index})")
    columns = list(zip(*per_device))
    for column in columns:
        _collective.same_layout(column, what)
    root = current_device() if destination is None else _index(destination)
    if root not in indices:  # the destination adds zeros, so it can be NCCL's root
        per_device.append([zeros(c[0].shape, c[0].dtype, root) for c in columns])
        indices.append(root)
    results = [empty(c[0].shape, c[0].dtype, root) for c in columns]
    comms = _clique(indices)
    nccl = _nccl.bindings()
    root_rank = comms[root].rank
    total = int(ReduceOp.SUM)
    for chunk in _chunks([c[0] for c in columns], buffer_size or 1 << 62):
        steps: list[Step] = []
        for index, row in zip(indices, per_device):
            stream, handle = current_stream(index), comms[index].handle
            for i in chunk:
                send = row[i]
                recv = results[i] if index == root else send
                steps.append((stream, [send, recv], nccl.reduce,
                              (send.ptr, recv.ptr, send.size, _nccl.datatype(send.dtype, what),
                               total, root_rank, handle)))
        _run(what, steps)
    return tuple(results)


def all_reduce(arrays: Sequence[Any], op: ReduceOp | str = ReduceOp.SUM) -> list[Array]:
    """Reduce ``arrays`` (one per device, same shape and dtype) with ``op`` and leave the
    result in every one of them, in place. Returns them (as gpurt Arrays)."""
    what = "comm.all_reduce"
    items = _collective.flat_arrays(arrays, what, "arrays")
    if not items:
        return []
    _collective.same_layout(items, what)
    comms = _clique(_devices([a.device.index for a in items], what))
    nccl = _nccl.bindings()
    dtype = _nccl.datatype(items[0].dtype, what)
    code = _nccl.reduce_op(op, items[0].dtype, what)
    steps: list[Step] = [(current_stream(a.device.index), [a], nccl.all_reduce,
                          (a.ptr, a.ptr, a.size, dtype, code, comms[a.device.index].handle))
                         for a in items]
    _run(what, steps)
    return items


# ---- scatter and gather ------------------------------------------------------------------


def _along(array: Array, dim: int, start: int, stop: int) -> Array:
    """The view ``array[..., start:stop, ...]`` along axis ``dim``."""
    return array[(slice(None),) * dim + (slice(start, stop),)]


def _axis(dim: int, ndim: int, what: str) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"{what}: dim {dim} is out of range for {ndim}-d arrays")
    return dim % ndim


def _torch_chunks(length: int, parts: int) -> list[int]:
    """torch.chunk's sizes: ceil(length / parts) each, the last smaller (maybe fewer)."""
    step = -(-length // parts) if length else 0
    return [min(step, length - s) for s in range(0, length, step)] if step else [0] * parts


@_torch_names(array="tensor")
def scatter(tensor: Any, devices: Sequence[DeviceLike] | None = None,
            chunk_sizes: Sequence[int] | None = None, dim: int = 0,
            streams: Sequence[Stream | None] | None = None, *,
            out: Sequence[Any] | None = None) -> tuple[Array, ...]:
    """Split ``tensor`` (a device array) along ``dim`` and send chunk i to ``devices[i]``
    (torch.chunk's sizes unless ``chunk_sizes``), or into ``out``. The chunk for
    ``tensor``'s own device is a view of it, as in torch. Chunks travel by NCCL send/recv
    on ``streams`` (default: each device's current stream)."""
    what = "comm.scatter"
    src = _collective.device_array(tensor, what, "tensor")
    axis = _axis(dim, src.ndim, what)
    if (devices is None) == (out is None):
        raise ValueError(f"{what}: give exactly one of devices and out")
    if out is not None:
        outs = _collective.flat_arrays(out, what, "out")
        indices = _devices([o.device.index for o in outs], what)
        sizes = [o.shape[axis] for o in outs]
    else:
        indices = _devices(cast(Sequence[DeviceLike], devices), what)
        sizes = list(chunk_sizes) if chunk_sizes is not None else \
            _torch_chunks(src.shape[axis], len(indices))
        indices = indices[:len(sizes)]
    if len(sizes) != len(indices) or sum(sizes) != src.shape[axis] or min(sizes) < 0:
        raise ValueError(f"{what}: chunk sizes {sizes} do not split the {src.shape[axis]} "
                         f"entries of dim {axis} over {len(indices)} devices")
    root = src.device.index
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    chunks = [_along(src, axis, s, s + n) for s, n in zip(starts, sizes)]
    if out is None:
        results = [c if d == root else empty(c.shape, c.dtype, d,
                                             _stream(d, streams, i))
                   for i, (c, d) in enumerate(zip(chunks, indices))]
    else:
        results = outs
        for c, o in zip(chunks, outs):
            _collective.same_layout([c, o], what)
    root_stream = _stream(root, streams, indices.index(root)) if root in indices else \
        current_stream(root)
    sends = []
    for i, (c, target) in enumerate(zip(chunks, results)):
        if target.device.index == root:
            if target is not c:
                target.copy_(c)
        elif c.size:
            sends.append((i, c if c.is_contiguous() else c.contiguous(), target))
    if not sends:
        return tuple(results)
    comms = _clique([root, *(indices[i] for i, _, _ in sends)])
    nccl = _nccl.bindings()
    steps: list[Step] = []
    for i, chunk, target in sends:
        dtype, peer = _nccl.datatype(chunk.dtype, what), comms[target.device.index]
        steps.append((root_stream, [chunk], nccl.send,
                      (chunk.ptr, chunk.size, dtype, peer.rank, comms[root].handle)))
        steps.append((_stream(target.device.index, streams, i), [target], nccl.recv,
                      (target.ptr, target.size, dtype, comms[root].rank, peer.handle)))
    _run(what, steps)
    return tuple(results)


@_torch_names(arrays="tensors")
def gather(tensors: Sequence[Any], dim: int = 0, destination: DeviceLike = None, *,
           out: Any = None) -> Array:
    """Concatenate ``tensors`` (device arrays, one per device) along ``dim`` into a new
    array on ``destination`` (default: the current device), or into ``out``; the parts
    travel by NCCL send/recv."""
    what = "comm.gather"
    parts = _collective.flat_arrays(tensors, what, "tensors")
    if not parts:
        raise ValueError(f"{what}: no tensors")
    axis = _axis(dim, parts[0].ndim, what)
    shape = list(parts[0].shape)
    for i, p in enumerate(parts):
        if p.dtype != parts[0].dtype or p.ndim != len(shape) or any(
                a != b for k, (a, b) in enumerate(zip(p.shape, shape)) if k != axis):
            raise ValueError(f"{what}: tensors[{i}] ({p.shape}, {p.dtype.name}) does not "
                             f"fit tensors[0] ({parts[0].shape}, {parts[0].dtype.name}) "
                             f"along dim {axis}")
    shape[axis] = sum(p.shape[axis] for p in parts)
    if out is not None:
        result = _collective.device_array(out, what, "out")
        if destination is not None and _index(destination) != result.device.index:
            raise ValueError(f"{what}: give destination or out, not both")
        if result.shape != tuple(shape) or result.dtype != parts[0].dtype:
            raise ValueError(f"{what}: out is {result.shape} {result.dtype.name}, the "
                             f"gathered array is {tuple(shape)} {parts[0].dtype.name}")
    else:
        root = current_device() if destination is None else _index(destination)
        result = empty(tuple(shape), parts[0].dtype, root)
    root = result.device.index
    remote: list[tuple[Array, Array, Array]] = []  # (part, its place in result, landing)
    start = 0
    for p in parts:
        target = _along(result, axis, start, start + p.shape[axis])
        start += p.shape[axis]
        if p.device.index == root:
            target.copy_(p)
        elif p.size:
            landing = target if target.is_contiguous() else empty(p.shape, p.dtype, root)
            remote.append((p, target, landing))
    if not remote:
        return result
    comms = _clique([root, *(p.device.index for p, _, _ in remote)])
    nccl = _nccl.bindings()
    steps: list[Step] = []
    for p, _, landing in remote:
        dtype, sender = _nccl.datatype(p.dtype, what), comms[p.device.index]
        steps.append((current_stream(sender.device), [p], nccl.send,
                      (p.ptr, p.size, dtype, comms[root].rank, sender.handle)))
        steps.append((current_stream(root), [landing], nccl.recv,
                      (landing.ptr, landing.size, dtype, sender.rank, comms[root].handle)))
    _run(what, steps)
    for _, target, landing in remote:
        if landing is not target:  # a strided place in result: one local copy
            target.copy_(landing)
    return result
