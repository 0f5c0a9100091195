"""One rank of a gpurt.distributed test: ``python tests/_dist_worker.py SCENARIO``, run by
tests/test_distributed.py in world_size processes with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT (or GPURT_TEST_INIT) set. Exit code 0 and a last line "OK ..." mean the rank's
checks passed; anything else prints why.

Every rank draws its data from a generator seeded by (seed, rank), so each can rebuild the
others' inputs and check results against a float64 numpy reference.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import gpurt  # noqa: E402
from gpurt import distributed as dist  # noqa: E402

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8, np.int32,
          np.uint32, np.int64, np.uint64]
OPS: dict[dist.ReduceOp, Callable[..., np.ndarray]] = {
    dist.ReduceOp.SUM: np.add.reduce, dist.ReduceOp.MAX: np.maximum.reduce,
    dist.ReduceOp.MIN: np.minimum.reduce, dist.ReduceOp.PRODUCT: np.multiply.reduce,
}


def data(seed: int, rank: int, shape: tuple[int, ...], dtype: Any,
         small: bool = False) -> np.ndarray:
    """Rank ``rank``'s input: small integers, exact in every dtype and under every op."""
    rng = np.random.default_rng([seed, rank])
    dt = np.dtype(dtype)
    low, high = (0, 3) if small else (0 if dt.kind == "u" else -8, 9)
    if small and dt.kind != "u":
        low = -2
    return rng.integers(low, high, size=shape).astype(dt)


def check_equal(got: gpurt.Array | np.ndarray, want: np.ndarray, what: str) -> None:
    host = got.numpy() if isinstance(got, gpurt.Array) else got
    np.testing.assert_array_equal(host, want, err_msg=what)


def poisoned(shape: tuple[int, ...], dtype: Any) -> gpurt.Array:
    out = gpurt.empty(shape, dtype)
    out.view(np.uint8).fill_(0x7F)
    return out


def ops(seed: int) -> None:
    """Every collective, every dtype, against numpy."""
    rank, size = dist.get_rank(), dist.get_world_size()
    n = 1001
    for dtype in DTYPES:
        name = np.dtype(dtype).name
        for op, ref in OPS.items():
            small = op is dist.ReduceOp.PRODUCT
            mine = data(seed, rank, (n,), dtype, small)
            everyone = np.stack([data(seed, r, (n,), dtype, small) for r in range(size)])
            want = ref(everyone.astype(np.float64)).astype(dtype)
            a = gpurt.from_numpy(mine)
            dist.all_reduce(a, op)
            check_equal(a, want, f"all_reduce {op.name} {name}")
            b = gpurt.from_numpy(mine)
            dist.reduce(b, dst=size - 1, op=op)
            check_equal(b, want if rank == size - 1 else mine, f"reduce {op.name} {name}")
            blocks = np.stack([data(seed + 1, r, (size * 8,), dtype, small) for r in range(size)])
            out = poisoned((8,), dtype)
            dist.reduce_scatter_tensor(out, gpurt.from_numpy(blocks[rank]), op)
            check_equal(out, ref(blocks.astype(np.float64))[rank * 8:(rank + 1) * 8]
                        .astype(dtype), f"reduce_scatter {op.name} {name}")
        mine = data(seed, rank, (3, 5), dtype)
        b = gpurt.from_numpy(mine if rank == 1 else np.zeros_like(mine))
        dist.broadcast(b, src=1)
        check_equal(b, data(seed, 1, (3, 5), dtype), f"broadcast {name}")
        gathered = poisoned((size, 3, 5), dtype)
        dist.all_gather_into_tensor(gathered, gpurt.from_numpy(mine))
        everyone = np.stack([data(seed, r, (3, 5), dtype) for r in range(size)])
        check_equal(gathered, everyone, f"all_gather_into_tensor {name}")
        parts = [poisoned((3, 5), dtype) for _ in range(size)]
        dist.all_gather(parts, gpurt.from_numpy(mine))
        for r, p in enumerate(parts):
            check_equal(p, everyone[r], f"all_gather[{r}] {name}")
    # point to point: a ring, each rank sends to the next
    mine = data(seed, rank, (777,), np.float32)
    got = poisoned((777,), np.float32)
    dst, src = (rank + 1) % size, (rank - 1) % size
    if rank % 2 == 0:
        dist.send(gpurt.from_numpy(mine), dst)
        dist.recv(got, src)
    else:
        dist.recv(got, src)
        dist.send(gpurt.from_numpy(mine), dst)
    check_equal(got, data(seed, src, (777,), np.float32), "send/recv ring")
    # async work, a side stream, and a torch tensor if torch is there
    side = gpurt.Stream()
    with side:
        a = gpurt.from_numpy(data(seed, rank, (1 << 20,), np.float32))
        work = dist.all_reduce(a, async_op=True)
    assert isinstance(work, dist.Work)
    assert work.wait() and work.is_completed()
    want = np.add.reduce(np.stack([data(seed, r, (1 << 20,), np.float32)
                                   for r in range(size)]).astype(np.float64)).astype(np.float32)
    check_equal(a, want, "async all_reduce on a side stream")
    dist.barrier()
    try:
        import torch
    except ImportError:
        return
    t = torch.arange(16, dtype=torch.float32, device=f"cuda:{gpurt.current_device()}") * (rank + 1)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want_t = np.arange(16, dtype=np.float32) * sum(range(1, size + 1))
    np.testing.assert_array_equal(t.cpu().numpy(), want_t, err_msg="torch tensor all_reduce")


def errors(seed: int) -> None:
    """Bad arguments raise before NCCL and leave the group usable."""
    size = dist.get_world_size()
    a = gpurt.zeros(8, np.float32)
    for call, kind, text in [
        (lambda: dist.all_reduce(np.zeros(8, np.float32)), TypeError, "must be a device array"),
        (lambda: dist.all_reduce(gpurt.zeros(4, np.int16)), TypeError, "NCCL has no int16"),
        (lambda: dist.broadcast(a, src=size), ValueError, "is not a rank"),
        (lambda: dist.all_gather_into_tensor(gpurt.zeros(3, np.float32), a), ValueError,
         "world_size"),
        (lambda: dist.all_reduce(gpurt.zeros((4, 4), np.float32).T), ValueError, "contiguous"),
        (lambda: dist.all_reduce(a, op="median"), ValueError, "unknown reduce op"),
        (lambda: dist.send(a, dist.get_rank()), ValueError, "itself"),
    ]:
        try:
            call()
        except kind as exc:
            assert text in str(exc), (text, str(exc))
        else:
            raise AssertionError(f"no {kind.__name__} for {text!r}")
    if gpurt.device_count() > size:  # an array on a device that is not this rank's
        other_device = (gpurt.current_device() + 1) % gpurt.device_count()
        other = gpurt.zeros(8, np.float32, device=other_device)
        try:
            dist.all_reduce(other)
        except ValueError as exc:
            assert "communicator is on" in str(exc)
    b = gpurt.full(8, 1.0, np.float32)
    dist.all_reduce(b)
    check_equal(b, np.full(8, size, np.float32), "all_reduce after the errors")


def peer_dies(seed: int) -> None:
    """The last rank leaves after one all_reduce; the others must get a timeout, not hang."""
    rank, size = dist.get_rank(), dist.get_world_size()
    a = gpurt.full(1 << 16, 1.0, np.float32)
    dist.all_reduce(a)
    check_equal(a, np.full(1 << 16, size, np.float32), "all_reduce before the death")
    gpurt.synchronize()
    if rank == size - 1:
        print("OK leaving without a word", flush=True)
        os._exit(0)
    time.sleep(0.5)
    start = time.monotonic()
    work = dist.all_reduce(a, async_op=True)
    try:
        work.wait()
    except dist.DistributedTimeoutError as exc:
        waited = time.monotonic() - start
        assert "did not finish within" in str(exc), str(exc)
    else:
        raise AssertionError("all_reduce with a dead peer finished")
    try:
        dist.all_reduce(a)
    except dist.DistributedError as exc:
        assert "did not finish within" in str(exc)
    else:
        raise AssertionError("the failed group accepted more work")
    gpurt.synchronize()  # the aborted kernels have let go of the stream
    dist.destroy_process_group()
    print(f"OK timed out after {waited:.1f} s", flush=True)


def peer_dies_early(seed: int) -> None:
    """The last rank leaves before any collective (NCCL has not connected the ranks yet):
    the others must still get a timeout, not a hang."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == size - 1:
        print("OK leaving before the first collective", flush=True)
        os._exit(0)
    a = gpurt.full(1 << 16, 1.0, np.float32)
    start = time.monotonic()
    try:
        dist.all_reduce(a, async_op=True).wait()
    except dist.DistributedTimeoutError as exc:
        assert "did not finish within" in str(exc), str(exc)
    else:
        raise AssertionError("all_reduce with a dead peer finished")
    waited = time.monotonic() - start
    gpurt.synchronize()
    dist.destroy_process_group()
    print(f"OK timed out after {waited:.1f} s", flush=True)


SCENARIOS = {"ops": ops, "errors": errors, "peer_dies": peer_dies,
             "peer_dies_early": peer_dies_early}


def main() -> None:
    scenario = sys.argv[1]
    timeout = float(os.environ.get("GPURT_TEST_TIMEOUT", "60"))
    init = os.environ.get("GPURT_TEST_INIT") or None
    world = os.environ.get("GPURT_TEST_WORLD")  # a deliberately wrong world size
    dist.init_process_group("nccl", init_method=init, timeout=timeout,
                            world_size=int(world) if world else -1,
                            rank=int(os.environ["RANK"]) if init else -1)
    SCENARIOS[scenario](int(os.environ.get("GPURT_TEST_SEED", "1")))
    if dist.is_initialized():
        dist.destroy_process_group()
    print(f"OK {scenario} rank {os.environ['RANK']}", flush=True)


if __name__ == "__main__":
    main()
