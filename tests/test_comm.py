"""gpurt.comm (one process, several GPUs, on NCCL) and the NCCL layer under it.

CPU: the API imports, NCCL-less installs get the install hint, dtype/op mapping and the
chunking rules. GPU (2+ devices and nccl4py): every collective against a numpy reference on
fresh random data, for every dtype NCCL has, plus stream ordering and record_stream.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import _multigpu
import gpurt
from _fakes import fake_gpus_fixture  # noqa: F401  (the fake_gpus fixture)
from gpurt import comm
from gpurt._core.driver import check
from gpurt.distributed import _nccl

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast (shared machines)

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8, np.int32,
          np.uint32, np.int64, np.uint64]


multi_gpu = _multigpu.multi_gpu()


def random(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Fresh values that sum exactly in every dtype (small integers, also as floats)."""
    dt = np.dtype(dtype)
    low = 0 if dt.kind == "u" else -8
    return rng.integers(low, 9, size=shape).astype(dt)


# ---- CPU --------------------------------------------------------------------------------


def test_missing_nccl_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_nccl, "_module", None)
    monkeypatch.setitem(sys.modules, "nccl.bindings.nccl", None)  # import fails
    monkeypatch.setitem(sys.modules, "nccl.bindings", None)
    with pytest.raises(gpurt.distributed.DistributedError, match=r"pip install 'gpurt\[nccl\]'"):
        _nccl.bindings()
    assert not _nccl.is_available()
    assert not gpurt.distributed.is_available()


@pytest.mark.parametrize("dtype,code", [(np.int8, 0), (np.uint8, 1), (np.int32, 2),
                                        (np.uint32, 3), (np.int64, 4), (np.uint64, 5),
                                        (np.float16, 6), (np.float32, 7), (np.float64, 8),
                                        (ml_dtypes.bfloat16, 9), (ml_dtypes.float8_e4m3fn, 10),
                                        (ml_dtypes.float8_e5m2, 11), (np.bool_, 1)])
def test_datatypes_are_ncclDataType_t(dtype: Any, code: int) -> None:
    assert _nccl.datatype(np.dtype(dtype), "x") == code


@pytest.mark.parametrize("dtype", [np.int16, np.complex64, np.uint16])
def test_a_dtype_nccl_lacks_is_named(dtype: Any) -> None:
    with pytest.raises(TypeError, match=f"all_reduce: NCCL has no {np.dtype(dtype).name} type"):
        _nccl.datatype(np.dtype(dtype), "all_reduce")


def test_reduce_ops_by_enum_and_name() -> None:
    f32 = np.dtype(np.float32)
    assert [_nccl.reduce_op(op, f32, "x") for op in comm.ReduceOp] == [0, 1, 2, 3, 4]
    assert _nccl.reduce_op("max", f32, "x") == 2
    with pytest.raises(ValueError, match="unknown reduce op 'median'"):
        _nccl.reduce_op("median", f32, "x")
    with pytest.raises(TypeError, match="bool arrays reduce with MAX"):
        _nccl.reduce_op(comm.ReduceOp.SUM, np.dtype(np.bool_), "x")


@pytest.mark.parametrize("length,parts", [(10, 3), (5, 4), (8, 2), (1, 3), (7, 7), (0, 2)])
def test_scatter_chunks_are_torch_chunk_sizes(length: int, parts: int) -> None:
    sizes = comm._torch_chunks(length, parts)
    assert sum(sizes) == length
    if length:  # torch.chunk: ceil(length / parts) each, the last smaller, maybe fewer
        step = -(-length // parts)
        assert sizes[:-1] == [step] * (len(sizes) - 1) and 0 < sizes[-1] <= step
    torch = pytest.importorskip("torch") if os.environ.get("GPURT_TEST_TORCH") else None
    if torch is not None and length:
        assert sizes == [len(c) for c in torch.arange(length).chunk(parts)]


def test_coalescing_runs_stay_under_the_buffer_size() -> None:
    class Sized:
        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes

    arrays: Any = [Sized(n) for n in (4, 4, 8, 1, 20, 2)]
    assert comm._chunks(arrays, 10) == [[0, 1], [2, 3], [4], [5]]
    assert comm._chunks(arrays, 1 << 40) == [[0, 1, 2, 3, 4, 5]]


def test_comm_on_a_machine_without_gpus_raises_clearly() -> None:
    if gpurt.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises((gpurt.CudaUnavailableError, TypeError, gpurt.distributed.DistributedError)):
        comm.all_reduce([np.zeros(3), np.zeros(3)])


# ---- GPU --------------------------------------------------------------------------------


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


@pytest.fixture
def devices() -> Iterator[list[int]]:
    gpurt.set_device(0)
    yield list(range(gpurt.device_count()))
    for d in range(gpurt.device_count()):
        gpurt.synchronize(d)
    gpurt.set_device(0)


def poisoned(shape: tuple[int, ...], dtype: Any, device: int) -> gpurt.Array:
    """An array whose bytes are 0x7f until something writes it."""
    out = gpurt.empty(shape, dtype, device)
    if out.nbytes:
        out.view(np.uint8).fill_(0x7F)
    return out


@multi_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_every_op(devices: list[int], rng: np.random.Generator, dtype: Any) -> None:
    ops: dict[comm.ReduceOp, Callable[..., np.ndarray]] = {
        comm.ReduceOp.SUM: np.add.reduce, comm.ReduceOp.MAX: np.maximum.reduce,
        comm.ReduceOp.MIN: np.minimum.reduce, comm.ReduceOp.PRODUCT: np.multiply.reduce,
    }
    for op, ref in ops.items():
        hosts = [random((1000, 3), dtype, rng) for _ in devices]
        if op is comm.ReduceOp.PRODUCT:  # keep products inside every dtype
            hosts = [np.clip(h, 0 if np.dtype(dtype).kind == "u" else -2, 2).astype(dtype)
                     for h in hosts]
        arrays = [gpurt.from_numpy(h, device=d) for h, d in zip(hosts, devices)]
        comm.all_reduce(arrays, op)
        want = ref(np.stack(hosts).astype(np.float64)).astype(dtype)
        for a in arrays:
            np.testing.assert_array_equal(a.numpy(), want, err_msg=f"{op.name}")


@multi_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_and_reduce_add(devices: list[int], rng: np.random.Generator,
                                  dtype: Any) -> None:
    host = random((333, 7), dtype, rng)
    src = gpurt.from_numpy(host, device=devices[-1])
    copies = comm.broadcast(src, devices)
    assert copies[-1] is src and [c.device.index for c in copies] == devices
    for c in copies:
        np.testing.assert_array_equal(c.numpy(), host)

    outs = [poisoned(host.shape, dtype, d) for d in devices]
    assert comm.broadcast(src, out=outs) == tuple(outs)
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), host)

    hosts = [random((129,), dtype, rng) for _ in devices]
    total = comm.reduce_add([gpurt.from_numpy(h, device=d) for h, d in zip(hosts, devices)],
                            destination=devices[1])
    assert total.device.index == devices[1]
    np.testing.assert_array_equal(total.numpy(), np.sum(np.stack(hosts), axis=0).astype(dtype))


@multi_gpu
@pytest.mark.gpu
def test_coalesced_calls(devices: list[int], rng: np.random.Generator) -> None:
    hosts = [random(shape, dt, rng) for shape, dt in
             [((1000,), np.float32), ((17, 3), np.int64), ((4096, 64), np.float16),
              ((5,), np.uint8)]]
    arrays = [gpurt.from_numpy(h, device=devices[0]) for h in hosts]
    per_device = comm.broadcast_coalesced(arrays, devices, buffer_size=4096)
    assert per_device[0] == tuple(arrays)
    for d, row in zip(devices, per_device):
        for h, a in zip(hosts, row):
            assert a.device.index == d
            np.testing.assert_array_equal(a.numpy(), h)

    inputs = [[gpurt.from_numpy(random(h.shape, h.dtype, rng), device=d) for h in hosts]
              for d in devices]
    sums = comm.reduce_add_coalesced(inputs, destination=devices[0], buffer_size=1000)
    for i, s in enumerate(sums):
        want = np.sum(np.stack([row[i].numpy() for row in inputs]).astype(np.float64), axis=0)
        np.testing.assert_array_equal(s.numpy(), want.astype(hosts[i].dtype))


@multi_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int64])
def test_scatter_then_gather(devices: list[int], rng: np.random.Generator, dim: int,
                             dtype: Any) -> None:
    host = random((9, 10, 3), dtype, rng)
    src = gpurt.from_numpy(host, device=devices[0])
    parts = comm.scatter(src, devices, dim=dim)
    sizes = comm._torch_chunks(host.shape[dim], len(devices))
    pieces = np.split(host, np.cumsum(sizes)[:-1], axis=dim)
    assert len(parts) == len(sizes)
    for d, part, piece in zip(devices, parts, pieces):
        assert part.device.index == d
        np.testing.assert_array_equal(part.numpy(), piece)

    uneven = [1] * (len(devices) - 1) + [host.shape[0] - len(devices) + 1]
    parts = comm.scatter(src, devices, chunk_sizes=uneven)
    assert [p.shape[0] for p in parts] == uneven

    for destination in (devices[0], devices[-1]):
        whole = comm.gather([p.contiguous() for p in comm.scatter(src, devices, dim=dim)],
                            dim=dim, destination=destination)
        assert whole.device.index == destination
        np.testing.assert_array_equal(whole.numpy(), host)
    out = poisoned(host.shape, dtype, devices[1])
    assert comm.gather([gpurt.from_numpy(p, device=d) for p, d in zip(pieces, devices)],
                       dim=dim, out=out) is out
    np.testing.assert_array_equal(out.numpy(), host)


@multi_gpu
@pytest.mark.gpu
def test_bad_arguments_raise_before_nccl(devices: list[int]) -> None:
    a = gpurt.zeros(8, np.float32, devices[0])
    b = gpurt.zeros(9, np.float32, devices[1])
    with pytest.raises(ValueError, match="array 1 has shape"):
        comm.all_reduce([a, b])
    with pytest.raises(TypeError, match="must be a device array"):
        comm.all_reduce([a, np.zeros(8, np.float32)])
    with pytest.raises(ValueError, match="name a device twice"):
        comm.broadcast(a, [devices[0], devices[0]])
    with pytest.raises(ValueError, match="must be contiguous"):
        comm.broadcast(gpurt.zeros((4, 4), np.float32, devices[0]).T, devices)
    with pytest.raises(TypeError, match="NCCL has no int16"):
        comm.all_reduce([gpurt.zeros(4, np.int16, d) for d in devices])
    with pytest.raises(ValueError, match="exactly one of devices and out"):
        comm.broadcast(a)
    with pytest.raises(ValueError, match="do not split"):
        comm.scatter(gpurt.zeros(8, np.float32, devices[0]), devices, chunk_sizes=[1, 2])


class Flag:
    """A pinned word a stream can be held on (cuStreamWaitValue32) until the host sets it."""

    def __init__(self) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        self.host = int(check(cu.cuMemHostAlloc(4, cu.CU_MEMHOSTALLOC_DEVICEMAP
                                                | cu.CU_MEMHOSTALLOC_PORTABLE)))
        self.word = ctypes.c_uint32.from_address(self.host)
        self.word.value = 0
        self.dev = int(check(cu.cuMemHostGetDevicePointer(self.host, 0)))

    def hold(self, stream: gpurt.Stream) -> None:
        check(self.cu.cuStreamWaitValue32(stream.handle, self.dev, 1, 0))  # GEQ 1

    def release(self) -> None:
        self.word.value = 1

    def free(self) -> None:
        check(self.cu.cuMemFreeHost(self.host))


@multi_gpu
@pytest.mark.gpu
def test_ordering_with_the_arrays_streams_and_record_stream(devices: list[int],
                                                            rng: np.random.Generator) -> None:
    """NCCL waits for the stream an input was written on, and an input freed right after
    the call is not handed out again while NCCL may still read it."""
    flag = Flag()
    side = gpurt.Stream(device=devices[0])
    host = random((1 << 16,), np.float32, rng)
    comm.broadcast(gpurt.zeros(8, np.float32, devices[0]), devices)  # kernels loaded first
    gpurt.synchronize(devices[0])
    try:
        src = gpurt.empty(host.shape, np.float32, devices[0], side)
        staging = gpurt.from_numpy(host, device=devices[0])
        flag.hold(side)  # the copy below waits for the flag
        src.copy_(staging)  # queued on side, behind the hold
        copies = comm.broadcast(src, devices)[1:]  # must wait for side's copy
        ptr = src.ptr
        del src
        again = gpurt.empty(host.shape, np.float32, devices[0], side)
        assert again.ptr != ptr  # still in use by NCCL's stream: not handed out
        flag.release()
        np.testing.assert_array_equal(copies[0].numpy(), host)
    finally:
        flag.release()
        side.synchronize()
        flag.free()


def test_gpurt_info_says_whether_collectives_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpurt._cli import info as _info

    assert _info.collect()["collectives"]["available"] == _nccl.is_available()
    monkeypatch.setattr(_nccl, "_module", None)
    monkeypatch.setitem(sys.modules, "nccl.bindings.nccl", None)
    monkeypatch.setitem(sys.modules, "nccl.bindings", None)
    missing = _nccl.describe()
    assert not missing["available"] and "gpurt[nccl]" in missing["why"]


# ---- every comm call's NCCL traffic, without a GPU ----------------------------------------


@pytest.fixture
def fake_nccl(fake_gpus: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple]]:
    """Two pretend devices whose allocators run over a fake backend, and an NCCL that
    records its calls; the pair's communicators are made up."""
    import types

    from allocator_model import FakeBackend
    from gpurt import array, memory
    from gpurt._array import arraycopy as _arraycopy
    from gpurt._memory import config as _allocconf
    from gpurt._memory.allocator import CachingAllocator
    from gpurt.distributed import _collective

    for module in (array, _collective, _arraycopy):
        monkeypatch.setattr(module, "bind_context", fake_gpus.bind)
    for index in (0, 1):
        monkeypatch.setitem(memory._allocators, index, CachingAllocator(
            index, FakeBackend(), _allocconf.from_environment(), memory._history))
    calls: list[tuple[str, tuple]] = []
    names = ("group_start", "group_end", "broadcast", "reduce", "all_reduce", "send", "recv")
    fake = types.SimpleNamespace(NCCLError=RuntimeError, **{
        name: (lambda op: lambda *args: calls.append((op, args)))(name) for name in names})
    monkeypatch.setattr(_nccl, "_module", fake)
    comms = {d: types.SimpleNamespace(device=d, rank=d, handle=f"comm{d}") for d in (0, 1)}
    monkeypatch.setitem(comm._cliques, (0, 1), comms)
    return calls


@pytest.mark.parametrize("call,ops", [
    (lambda a0, a1: comm.broadcast(a0, [0, 1]), ["broadcast", "broadcast"]),
    (lambda a0, a1: comm.reduce_add([a0, a1], 1), ["reduce", "reduce"]),
    (lambda a0, a1: comm.all_reduce([a0, a1], "max"), ["all_reduce", "all_reduce"]),
    (lambda a0, a1: comm.scatter(a0, [0, 1]), ["send", "recv"]),
    (lambda a0, a1: comm.gather([a1], destination=0), ["send", "recv"]),
])
def test_each_comm_call_is_one_nccl_group(fake_nccl: list[tuple[str, tuple]], call: Any,
                                          ops: list[str]) -> None:
    a0 = gpurt.empty((8, 4), np.float32, 0)
    a1 = gpurt.empty((8, 4), np.float32, 1)
    call(a0, a1)
    assert [name for name, _ in fake_nccl] == ["group_start", *ops, "group_end"]
    for _, args in fake_nccl[1:-1]:  # every NCCL op ends with (communicator, stream)
        assert args[-2] in ("comm0", "comm1") and args[-1] == 0
    devices = sorted(int(args[-2][-1]) for _, args in fake_nccl[1:-1])
    assert devices == [0, 1]  # one op on each device's communicator
