"""Device arrays from Python: creation and release, views, zero-copy interop, small copies.

Host time per operation (median, microseconds), gpurt and its peers in this process:
  empty+del      a cached block: allocate an array and drop it (target: gpurt.empty + del
                 no slower than torch.empty + del, DESIGN.md). Every library gets the same
                 request: the current device and stream, the dtype given explicitly (torch
                 names the device as "cuda", which is the current one; the row marked
                 device='cuda' gives gpurt the same argument),
  view           a[1], a[2:5], a.T on a 2-D array,
  import         a foreign device array as a zero-copy gpurt.Array (CAI and DLPack),
  export         a gpurt.Array consumed by torch / CuPy without a copy,
  copy 4 KiB     synchronous host->device, device->host (pageable host memory) and
                 device->device copies of 4 KiB.

``--cpu-proxy`` runs gpurt's rows that need no driver call (array creation and views, and
the allocator steps below gpurt.empty)
without a GPU: the caching allocator over a host-memory stand-in backend, as
bench_memory.py does. It profiles gpurt's Python path; it is not a result to publish.

    python benchmarks/bench_array.py [--json PATH] [--cpu-proxy]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import host_us, peer, print_rows, write_results


def _row(what: str, lib: str, fn: Callable[[], Any], number: int = 2000) -> dict[str, Any]:
    return {"what": what, "lib": lib, "host_us": host_us(fn, number=number, repeat=15)}


def gpurt_host_rows(lib: str = "gpurt") -> list[dict[str, Any]]:
    """gpurt's rows that make no driver call besides the allocator's."""
    import gpurt

    a = gpurt.empty((64, 64), gpurt.float32)

    def empty_del() -> None:
        x = gpurt.empty(1024, gpurt.float32)
        del x

    def empty_cuda_del() -> None:
        x = gpurt.empty(1024, gpurt.float32, device="cuda")
        del x

    def empty_2d_del() -> None:
        x = gpurt.empty((64, 64), gpurt.bfloat16)
        del x

    return [
        _row("empty+del (1024,)", lib, empty_del, 20000),
        _row("empty+del (1024,) device='cuda'", lib, empty_cuda_del, 20000),
        _row("empty+del (64,64) bf16", lib, empty_2d_del, 20000),
        _row("view a[1]", lib, lambda: a[1], 20000),
        _row("view a[2:5]", lib, lambda: a[2:5], 20000),
        _row("view a.T", lib, lambda: a.T, 20000),
        _row("export __cuda_array_interface__", lib, lambda: a.__cuda_array_interface__,
             20000),
    ]


def gpurt_rows() -> list[dict[str, Any]]:
    import gpurt

    a = gpurt.empty((64, 64), gpurt.float32)
    host = np.ones(1024, np.float32)
    small = gpurt.empty(1024, gpurt.float32)
    other = gpurt.empty(1024, gpurt.float32)
    out = np.empty(1024, np.float32)

    rows = gpurt_host_rows() + [
        _row("copy 4 KiB H2D", "gpurt", lambda: small.copy_(host)),
        _row("copy 4 KiB D2H", "gpurt", lambda: small.to_numpy(out=out)),
        _row("copy 4 KiB D2D", "gpurt", lambda: small.copy_(other)),
    ]
    torch = peer("torch")
    if torch is not None:
        t = torch.empty(64, 64, device="cuda")
        rows += [
            _row("import CAI (torch)", "gpurt", lambda: gpurt.asarray(t)),
            _row("import DLPack (torch)", "gpurt", lambda: gpurt.from_dlpack(t)),
            _row("export DLPack -> torch", "gpurt", lambda: torch.from_dlpack(a)),
        ]
    cupy = peer("cupy")
    if cupy is not None:
        c = cupy.empty((64, 64), cupy.float32)
        rows += [
            _row("import CAI (cupy)", "gpurt", lambda: gpurt.asarray(c)),
            _row("export CAI -> cupy", "gpurt", lambda: cupy.asarray(a)),
        ]
    return rows


def torch_rows() -> list[dict[str, Any]]:
    torch = peer("torch")
    if torch is None:
        return []
    a = torch.empty((64, 64), dtype=torch.float32, device="cuda")
    host = torch.ones(1024, dtype=torch.float32)
    small = torch.empty(1024, dtype=torch.float32, device="cuda")
    other = torch.empty(1024, dtype=torch.float32, device="cuda")
    out = torch.empty(1024, dtype=torch.float32)

    def empty_del() -> None:
        x = torch.empty(1024, dtype=torch.float32, device="cuda")
        del x

    def empty_2d_del() -> None:
        x = torch.empty((64, 64), dtype=torch.bfloat16, device="cuda")
        del x

    return [
        _row("empty+del (1024,)", "torch", empty_del, 20000),
        _row("empty+del (64,64) bf16", "torch", empty_2d_del, 20000),
        _row("view a[1]", "torch", lambda: a[1], 20000),
        _row("view a[2:5]", "torch", lambda: a[2:5], 20000),
        _row("view a.T", "torch", lambda: a.T, 20000),
        _row("export __cuda_array_interface__", "torch", lambda: a.__cuda_array_interface__,
             20000),
        _row("copy 4 KiB H2D", "torch", lambda: small.copy_(host)),
        _row("copy 4 KiB D2H", "torch", lambda: out.copy_(small)),
        _row("copy 4 KiB D2D", "torch", lambda: small.copy_(other)),
    ]


def cupy_rows() -> list[dict[str, Any]]:
    cupy = peer("cupy")
    if cupy is None:
        return []
    a = cupy.empty((64, 64), cupy.float32)

    def empty_del() -> None:
        x = cupy.empty(1024, cupy.float32)
        del x

    return [
        _row("empty+del (1024,)", "cupy", empty_del, 20000),
        _row("view a[1]", "cupy", lambda: a[1], 20000),
        _row("view a[2:5]", "cupy", lambda: a[2:5], 20000),
        _row("view a.T", "cupy", lambda: a.T, 20000),
    ]


def cpu_proxy_rows() -> list[dict[str, Any]]:
    """gpurt's host rows without a GPU: pretend CUDA is initialised with one device whose
    caching allocator runs over bench_memory's host-memory stand-in backend."""
    from bench_memory import HostBackend

    import gpurt
    from gpurt import memory
    from gpurt._core import driver as _driver
    from gpurt._memory import config as _allocconf
    from gpurt._memory.allocator import CachingAllocator

    device = sys.modules["gpurt.device"]  # the module (gpurt.device is the context manager)
    _driver._initialized = True
    device._count = 1
    allocator = CachingAllocator(0, HostBackend(), _allocconf.from_environment(),
                                 memory._history)
    memory._allocators[0] = allocator
    memory._only[:] = [allocator.free]
    assert gpurt.current_device() == 0
    malloc, free = allocator.malloc, allocator.free
    alloc, delete = gpurt.caching_allocator_alloc, gpurt.caching_allocator_delete
    return gpurt_host_rows("gpurt (cpu proxy)") + [  # the steps below gpurt.empty
        _row("allocator core malloc+free 4 KiB", "gpurt (cpu proxy)",
             lambda: free(malloc(4096, 0)), 20000),
        _row("caching_allocator_alloc+delete 4 KiB", "gpurt (cpu proxy)",
             lambda: delete(alloc(4096)), 20000),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--cpu-proxy", action="store_true",
                        help="time gpurt's Python path without a GPU (not a result)")
    args = parser.parse_args()
    if args.cpu_proxy:
        print_rows("device arrays, CPU proxy: host time per operation", cpu_proxy_rows())
        return
    rows = gpurt_rows() + torch_rows() + cupy_rows()
    rows.sort(key=lambda row: (row["what"], row["lib"]))
    print_rows("device arrays: host time per operation", rows)
    write_results("array", rows, args.json)


if __name__ == "__main__":
    main()
