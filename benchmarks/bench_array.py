"""Device arrays from Python: creation and release, views, zero-copy interop, small copies.

Host time per operation (median, microseconds), gpurt and its peers in this process:
  empty+del      a cached block: allocate an array and drop it (target: gpurt.empty + del
                 no slower than torch.empty + del, DESIGN.md),
  view           a[1], a[2:5], a.T on a 2-D array,
  import         a foreign device array as a zero-copy gpurt.Array (CAI and DLPack),
  export         a gpurt.Array consumed by torch / CuPy without a copy,
  copy 4 KiB     synchronous host->device and device->host copies of 4 KiB.

    python benchmarks/bench_array.py [--json PATH]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import host_us, peer, print_rows, write_results


def _row(what: str, lib: str, fn: Callable[[], Any], number: int = 2000) -> dict[str, Any]:
    return {"what": what, "lib": lib, "host_us": host_us(fn, number=number, repeat=15)}


def gpurt_rows() -> list[dict[str, Any]]:
    import gpurt

    a = gpurt.empty((64, 64))
    host = np.ones(1024, np.float32)
    small = gpurt.empty(1024)
    out = np.empty(1024, np.float32)

    def empty_del() -> None:
        x = gpurt.empty(1024)
        del x

    def empty_2d_del() -> None:
        x = gpurt.empty((64, 64), gpurt.bfloat16)
        del x

    rows = [
        _row("empty+del (1024,)", "gpurt", empty_del, 20000),
        _row("empty+del (64,64) bf16", "gpurt", empty_2d_del, 20000),
        _row("view a[1]", "gpurt", lambda: a[1], 20000),
        _row("view a[2:5]", "gpurt", lambda: a[2:5], 20000),
        _row("view a.T", "gpurt", lambda: a.T, 20000),
        _row("export __cuda_array_interface__", "gpurt", lambda: a.__cuda_array_interface__,
             20000),
        _row("copy 4 KiB H2D", "gpurt", lambda: small.copy_(host)),
        _row("copy 4 KiB D2H", "gpurt", lambda: small.to_numpy(out=out)),
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
    a = torch.empty(64, 64, device="cuda")
    host = torch.ones(1024)
    small = torch.empty(1024, device="cuda")
    out = torch.empty(1024)

    def empty_del() -> None:
        x = torch.empty(1024, device="cuda")
        del x

    def empty_2d_del() -> None:
        x = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rows = gpurt_rows() + torch_rows() + cupy_rows()
    rows.sort(key=lambda row: (row["what"], row["lib"]))
    print_rows("device arrays: host time per operation", rows)
    write_results("array", rows, args.json)


if __name__ == "__main__":
    main()
