"""Memory pools and pluggable allocators (gpurt.MemPool, gpurt.use_mem_pool,
gpurt.PluggableAllocator, gpurt.CUDAPluggableAllocator, gpurt.change_current_allocator).

On a CPU: the caching core routes a thread's allocations to a pool (other threads, captures
and nesting as torch), takes a pool's segments from its pluggable allocator, and the
pluggable backend checks what a user's malloc returns; a real shared library is loaded
through CUDAPluggableAllocator. On the GPU: the same with device memory, and
change_current_allocator in a fresh process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from allocator_model import FakeBackend, KiB, MiB
from gpurt._memory import pluggable
from gpurt._memory import stats as ms
from gpurt._memory.allocator import CachingAllocator
from gpurt._memory.config import AllocatorConfig, parse
from gpurt._memory.pluggable import CUDAPluggableAllocator, PluggableAllocator, PluggableBackend

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
POOL, OTHER = (0, 101), (0, 102)

# A pluggable allocator library with torch's signatures over the driver (dlopen'ed, so no
# CUDA headers are needed), counting its calls. On a CPU only loading and calling it is tested.
LIBRARY = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <sys/types.h>
typedef int (*alloc_t)(unsigned long long*, size_t);
typedef int (*free_t)(unsigned long long);
static alloc_t cu_alloc;
static free_t cu_free;
static int allocs, frees;
static long long last_size = -1;
static void load(void) {
    if (!cu_alloc) {
        void* h = dlopen("libcuda.so.1", RTLD_NOW);
        if (h) {
            cu_alloc = (alloc_t)dlsym(h, "cuMemAlloc_v2");
            cu_free = (free_t)dlsym(h, "cuMemFree_v2");
        }
    }
}
void* my_alloc(ssize_t size, int device, void* stream) {
    unsigned long long p = 0;
    allocs++;
    last_size = size;
    load();
    if (!cu_alloc || cu_alloc(&p, (size_t)size) != 0) return 0;
    return (void*)p;
}
void my_free(void* ptr, ssize_t size, int device, void* stream) {
    frees++;
    load();
    if (cu_free) cu_free((unsigned long long)ptr);
}
int alloc_calls(void) { return allocs; }
int free_calls(void) { return frees; }
long long last_alloc_size(void) { return last_size; }
"""


def build_library(folder) -> str:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the test allocator library")
    source, path = os.path.join(folder, "alloc.c"), os.path.join(folder, "liballoc.so")
    with open(source, "w") as fh:
        fh.write(LIBRARY)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", source, "-o", path, "-ldl"], check=True)
    return path


class HostAllocator(PluggableAllocator):
    """A pluggable allocator handing out pretend addresses, recording its calls."""

    def __init__(self, capacity: int = 1 << 34) -> None:
        self.capacity, self.next, self.live, self.calls = capacity, 1 << 44, {}, []

    def malloc(self, size: int, device: int, stream: int) -> int:
        self.calls.append(("malloc", size, device, stream))
        if sum(self.live.values()) + size > self.capacity:
            return 0
        ptr, self.next = self.next, self.next + size + MiB
        self.live[ptr] = size
        return ptr

    def free(self, ptr: int, size: int, device: int, stream: int) -> None:
        self.calls.append(("free", size, device, stream))
        assert self.live.pop(ptr) == size


@pytest.fixture
def no_context(monkeypatch):
    """Context binds of the pluggable backend recorded instead of made (no driver here)."""
    bound: list[int] = []
    monkeypatch.setattr(pluggable, "bind_context", bound.append)
    return bound


def make() -> tuple[CachingAllocator, FakeBackend]:
    backend = FakeBackend()
    return CachingAllocator(0, backend, AllocatorConfig()), backend


# ---- routing a thread's allocations to a pool (CPU) -------------------------------------


def test_a_threads_allocations_go_to_its_pool_and_come_back_there():
    a, backend = make()
    a.retain_pool(POOL)
    outside = a.malloc(4 * KiB, 0)
    a.begin_thread_pool(POOL)
    inside = a.malloc(4 * KiB, 0)
    big = a.malloc(3 * MiB, 0)
    a.end_thread_pool(POOL)
    after = a.malloc(4 * KiB, 0)
    assert after == outside + 4 * KiB  # the default pool's segment, not the pool's
    pools = {tuple(s["segment_pool_id"]) for s in a.snapshot() for b in s["blocks"]
             if b["address"] in (inside, big)}
    assert pools == {POOL} and len(backend.live) == 3
    a.free(inside)
    a.begin_thread_pool(POOL)
    assert a.malloc(4 * KiB, 0) == inside  # freed back into the pool, reused from it
    a.end_thread_pool(POOL)
    assert a.pool_use_count(POOL) == 1 and a.pool_use_count(OTHER) == 0
    assert not a.captures_underway()  # a pool is not a capture


def test_other_threads_do_not_use_the_pool_and_pools_nest():
    a, _ = make()
    a.retain_pool(POOL)
    a.retain_pool(OTHER)
    a.begin_thread_pool(POOL)
    seen = {}

    def elsewhere() -> None:
        seen["ptr"] = a.malloc(4 * KiB, 0)

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    a.begin_thread_pool(OTHER)
    inner = a.malloc(4 * KiB, 0)
    a.end_thread_pool(OTHER)
    outer = a.malloc(4 * KiB, 0)
    a.end_thread_pool(POOL)
    owner = {b["address"]: tuple(s["segment_pool_id"]) for s in a.snapshot() for b in s["blocks"]}
    assert owner[seen["ptr"]] == (0, 0) and owner[inner] == OTHER and owner[outer] == POOL


def test_misuse_is_reported():
    a, _ = make()
    with pytest.raises(RuntimeError, match="does not exist"):
        a.begin_thread_pool(POOL)
    a.retain_pool(POOL)
    with pytest.raises(RuntimeError, match="not allocating"):
        a.end_thread_pool(POOL)
    a.begin_thread_pool(POOL)
    failure = []
    worker = threading.Thread(target=lambda: failure.append(
        pytest.raises(RuntimeError, a.end_thread_pool, POOL)))
    worker.start()
    worker.join()
    assert failure  # another thread cannot end this thread's use
    a.end_thread_pool(POOL)


def test_a_pools_segments_come_from_its_pluggable_allocator(no_context):
    a, backend = make()
    user = HostAllocator()
    a.retain_pool(POOL, PluggableBackend(0, user))
    a.begin_thread_pool(POOL)
    small, large = a.malloc(100, 7), a.malloc(5 * MiB, 7)
    a.end_thread_pool(POOL)
    assert sorted(size for _, size, _, _ in user.calls) == [2 * MiB, 20 * MiB]
    assert all(device == 0 and stream == 7 for _, _, device, stream in user.calls)
    assert not backend.live and set(user.live) == {small, large}
    a.free(small)
    a.free(large)
    a.release_pool(POOL)
    a.empty_cache()  # the pool has no references left: its segments go back
    assert not user.live and [c[0] for c in user.calls].count("free") == 2
    assert no_context and set(no_context) == {0}


# ---- the pluggable backend (CPU) --------------------------------------------------------


def test_pluggable_allocator_accepts_callables_objects_and_subclasses():
    calls = []
    by_functions = PluggableAllocator(lambda n, d, s: calls.append(n) or 64,
                                      lambda p, n, d, s: calls.append(-n))
    assert by_functions.malloc(10, 0, 0) == 64 and by_functions.free(64, 10, 0, 0) is None
    assert calls == [10, -10]
    assert isinstance(PluggableAllocator.from_object(HostAllocator()), PluggableAllocator)
    with pytest.raises(TypeError, match="two callables"):
        PluggableAllocator(lambda n, d, s: 0, None)
    with pytest.raises(TypeError, match="needs malloc and free"):
        PluggableAllocator()
    with pytest.raises(TypeError, match="no malloc and free"):
        PluggableAllocator.from_object(object())


@pytest.mark.parametrize("returned, error", [
    (-5, TypeError), ("0x10", TypeError), (True, TypeError), (1.5, TypeError)])
def test_a_bad_pointer_from_the_users_malloc_is_an_error(no_context, returned, error):
    backend = PluggableBackend(0, PluggableAllocator(lambda n, d, s: returned,
                                                     lambda p, n, d, s: None))
    a = CachingAllocator(0, backend, parse("", no_caching=True))
    with pytest.raises(error, match="malloc returned"):
        a.malloc(4 * KiB, 0)
    assert ms.flatten(a.nested_stats())["allocation.all.current"] == 0


def test_uncached_mode_over_a_pluggable_allocator(no_context, monkeypatch):
    """change_current_allocator's setup: every request is a malloc of the user's, each free
    a free of the user's at the next call, and the statistics follow."""
    user = HostAllocator(capacity=8 * MiB)
    backend = PluggableBackend(0, user)
    monkeypatch.setattr(backend, "mem_get_info", lambda: (0, 8 * MiB))
    a = CachingAllocator(0, backend, parse("", no_caching=True))
    p = a.malloc(1000, 3)
    assert user.calls == [("malloc", 1024, 0, 3)]
    a.free(p)
    assert len(user.calls) == 1  # not from free itself (it may run in a finalizer)
    q = a.malloc(2 * MiB, 3)
    assert [c[0] for c in user.calls] == ["malloc", "free", "malloc"]
    with pytest.raises(MemoryError, match="out of memory"):
        a.malloc(7 * MiB, 3)
    stats = ms.flatten(a.nested_stats())
    assert stats["allocation.all.current"] == 1 and stats["segment.all.current"] == 1
    assert stats["num_ooms"] == 1
    twice = PluggableBackend(0, PluggableAllocator(lambda n, d, s: 4096, lambda *args: None))
    twice.malloc(64, False)
    with pytest.raises(ValueError, match="still in use"):
        twice.malloc(64, False)  # the user's malloc hands out a live pointer again
    a.free(q)
    a.empty_cache()
    assert not user.live


def test_cuda_pluggable_allocator_loads_a_shared_library(tmp_path, no_context):
    path = build_library(str(tmp_path))
    allocator = CUDAPluggableAllocator(path, "my_alloc", "my_free")
    ptr = allocator.malloc(4096, 0, 0)  # None without a driver (or a context)
    assert ptr is None or isinstance(ptr, int)
    allocator.free(ptr or 0, 4096, 0, 0)
    import ctypes
    library = ctypes.CDLL(path)
    assert library.alloc_calls() == 1 and library.free_calls() == 1
    assert library.last_alloc_size() == 4096
    with pytest.raises(ValueError, match="no_such_function"):
        CUDAPluggableAllocator(path, "no_such_function", "my_free")


# ---- the public API without a GPU ---------------------------------------------------------


def test_public_names_and_argument_checks():
    import gpurt
    from gpurt import memory

    for name in ("MemPool", "use_mem_pool", "PluggableAllocator", "CUDAPluggableAllocator",
                 "change_current_allocator", "get_current_allocator"):
        assert getattr(gpurt, name) is getattr(memory, name)
    with pytest.raises(TypeError, match="PluggableAllocator"):
        gpurt.change_current_allocator(object())
    with pytest.raises(TypeError, match="MemPool"):
        with gpurt.use_mem_pool(object()):
            pass
    assert gpurt.get_current_allocator() is None


# ---- on the GPU -------------------------------------------------------------------------


@pytest.mark.gpu
def test_mem_pool_on_the_gpu(gpu_state):
    import numpy as np
    from cuda.bindings import driver as cu

    import gpurt

    gpurt.init()
    made = []

    def malloc(size: int, device: int, stream: int) -> int:
        err, ptr = cu.cuMemAlloc(size)
        made.append(size)
        return int(ptr) if int(err) == 0 else 0

    def free(ptr: int, size: int, device: int, stream: int) -> None:
        made.append(-size)
        assert int(cu.cuMemFree(ptr)[0]) == 0

    plain, own = gpurt.MemPool(), gpurt.MemPool(gpurt.PluggableAllocator(malloc, free))
    assert plain.use_count() == 1 and plain.id != own.id
    rng = np.random.default_rng(5)
    host = rng.standard_normal(300_000).astype(np.float32)
    outside = gpurt.asarray(host)
    with gpurt.use_mem_pool(plain) as used:
        assert used is plain and plain.use_count() == 2
        inside = gpurt.asarray(host * 2)
        with gpurt.use_mem_pool(own):
            nested = gpurt.asarray(host * 3)
    assert plain.use_count() == 1
    for array, factor in ((outside, 1), (inside, 2), (nested, 3)):
        np.testing.assert_array_equal(array.to_numpy(), host * factor)
    addresses = {b["address"] for s in plain.snapshot() for b in s["blocks"]}
    assert inside.data_ptr() in addresses and outside.data_ptr() not in addresses
    assert nested.data_ptr() in {b["address"] for s in own.snapshot() for b in s["blocks"]}
    assert made == [20 * MiB]  # the 1.2 MB array: a large-pool segment from the user's malloc
    stats = plain.memory_stats()
    assert stats["allocated_bytes.all.current"] == inside.nbytes + (-inside.nbytes % 512)
    assert stats["segment.all.current"] == 1
    del inside, nested, own, array  # (the loop's variable held the last array)
    gpurt.synchronize()
    gpurt.empty_cache()  # the released pool's segment goes back through the user's free
    assert made == [20 * MiB, -20 * MiB]
    with pytest.raises(ValueError, match="device"):
        with gpurt.use_mem_pool(plain, device=gpurt.device_count()):
            pass


@pytest.mark.gpu
def test_change_current_allocator_in_a_fresh_process(tmp_path):
    path = build_library(str(tmp_path))
    code = textwrap.dedent(f"""
        import ctypes, numpy as np, gpurt
        lib = ctypes.CDLL({path!r})
        gpurt.change_current_allocator(gpurt.CUDAPluggableAllocator({path!r}, "my_alloc",
                                                                    "my_free"))
        host = np.arange(1 << 20, dtype=np.float32)
        a = gpurt.asarray(host)
        b = gpurt.empty(1000, np.uint8)
        assert lib.alloc_calls() == 2 and lib.last_alloc_size() == 1024, lib.alloc_calls()
        assert np.array_equal(a.to_numpy(), host)
        stats = gpurt.memory_stats()
        assert stats["allocation.all.current"] == 2 and stats["segment.all.current"] == 2
        del a, b
        gpurt.empty_cache()
        assert lib.free_calls() == 2, lib.free_calls()
        try:
            gpurt.change_current_allocator(gpurt.CUDAPluggableAllocator({path!r}, "my_alloc",
                                                                        "my_free"))
        except RuntimeError as exc:
            assert "before the first allocation" in str(exc)
        else:
            raise AssertionError("switching after allocations must fail")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
