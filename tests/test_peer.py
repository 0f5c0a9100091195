"""Peer access and copies between arrays on different GPUs (2+ devices; no NCCL needed)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest
from cuda.bindings import driver as cu

import _multigpu
import gpurt
from gpurt._core.driver import check

pytestmark = [pytest.mark.gpu, _multigpu.multi_gpu(nccl=False)]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


@pytest.fixture(autouse=True)
def on_device_0() -> Iterator[None]:
    gpurt.set_device(0)
    yield
    for d in range(gpurt.device_count()):
        gpurt.synchronize(d)
    gpurt.set_device(0)


def poisoned(shape: tuple[int, ...], device: int) -> gpurt.Array:
    out = gpurt.empty(shape, np.float32, device)
    out.view(np.uint8).fill_(0x7F)
    return out


def test_copy_between_devices(rng: np.random.Generator) -> None:
    host = rng.standard_normal((257, 33)).astype(np.float32)
    a = gpurt.from_numpy(host, device=0)
    b = poisoned(host.shape, 1)
    assert b.copy_(a) is b
    np.testing.assert_array_equal(b.numpy(), host)
    back = poisoned(host.shape, 0).copy_(b)  # and the other way
    np.testing.assert_array_equal(back.numpy(), host)
    # strided on either side: a transposed source, a transposed destination
    t = poisoned((33, 257), 1)
    t.copy_(a.T)
    np.testing.assert_array_equal(t.numpy(), host.T)
    u = poisoned((33, 257), 0)
    u.T.copy_(b)
    np.testing.assert_array_equal(u.numpy(), host.T)


def test_to_another_device(rng: np.random.Generator) -> None:
    host = rng.standard_normal(1000).astype(np.float32)
    a = gpurt.from_numpy(host, device=0)
    assert a.to(0) is a and a.to("cuda:0") is a
    b = a.to("cuda:1")
    assert b.device.index == 1 and b.ptr != a.ptr
    np.testing.assert_array_equal(b.numpy(), host)
    assert a.to(0, copy=True).ptr != a.ptr


class Flag:
    """A pinned word a stream can be held on until the host sets it."""

    def __init__(self) -> None:
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        self.host = int(check(cu.cuMemHostAlloc(4, flags)))
        self.word = ctypes.c_uint32.from_address(self.host)
        self.word.value = 0
        self.dev = int(check(cu.cuMemHostGetDevicePointer(self.host, 0)))

    def hold(self, stream: gpurt.Stream) -> None:
        check(cu.cuStreamWaitValue32(stream.handle, self.dev, 1, 0))  # GEQ 1

    def release(self) -> None:
        self.word.value = 1


def test_copy_waits_for_the_source_stream(rng: np.random.Generator) -> None:
    host = rng.standard_normal(1 << 18).astype(np.float32)
    flag = Flag()
    side = gpurt.Stream(device=0)
    staging = gpurt.from_numpy(host, device=0)
    src = gpurt.empty(host.shape, np.float32, 0, side)
    dst = poisoned(host.shape, 1)
    gpurt.synchronize(0)
    gpurt.synchronize(1)
    try:
        flag.hold(side)
        src.copy_(staging)  # queued behind the hold
        dst.copy_(src)  # must wait for side
        del src  # safe: side waits for the copy before the memory can be reused
        assert not gpurt.current_stream(1).query()  # dst's stream is waiting too
        flag.release()
        np.testing.assert_array_equal(dst.numpy(), host)
    finally:
        flag.release()
        side.synchronize()
        check(cu.cuMemFreeHost(flag.host))


def test_enable_peer_access_lets_a_kernel_read_the_peer(rng: np.random.Generator) -> None:
    if not gpurt.can_device_access_peer(0, 1):
        pytest.skip("no P2P path between devices 0 and 1")
    assert gpurt.enable_peer_access(0, 1) and gpurt.enable_peer_access(0, 1)  # once, then cached
    assert not gpurt.enable_peer_access(0, 0)
    host = rng.standard_normal(4096).astype(np.float32)
    remote = gpurt.from_numpy(host, device=1)
    out = poisoned(host.shape, 0)
    kernel = gpurt.RawKernel(r"""
    extern "C" __global__ void twice(const float* peer, float* out, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = 2.0f * peer[i];
    }""", "twice")
    gpurt.synchronize(1)
    kernel((host.size + 255) // 256, 256, (remote.ptr, out, host.size))
    np.testing.assert_array_equal(out.numpy(), 2.0 * host)


def test_foreign_arrays_on_device_1_are_seen_there() -> None:
    """Where a foreign array lives comes from its memory, whatever device is current."""
    g = gpurt.zeros(4, np.float32, device=1)

    class Shim:  # only __cuda_array_interface__, so gpurt must ask the driver
        __cuda_array_interface__ = g.__cuda_array_interface__

    for current in (0, 1):
        gpurt.set_device(current)
        assert gpurt.asarray(Shim()).device.index == 1
    torch = pytest.importorskip("torch")
    t = torch.ones(4, device="cuda:1")
    gpurt.set_device(0)
    wrapped = gpurt.asarray(t)
    assert wrapped.device.index == 1 and wrapped.ptr == t.data_ptr()
    np.testing.assert_array_equal(wrapped.numpy(), np.ones(4, np.float32))
