"""File <-> device memory throughput: gpurt.gds (cuFile) against read-then-copy.

For a file of ``--mib`` MiB (random bytes, written once), GB/s of (median of ``--repeat``):
  load   file -> device: gpurt.gds.GdsFile.load_array; the usual path, ``readinto`` a pinned
         host buffer then one host->device copy; the same with a pageable numpy buffer;
         torch.cuda.gds.GdsFile.load_storage where torch has cuFile,
  save   device -> file: GdsFile.save_array; one device->host copy into pinned memory then
         ``write``.
Every library moves the same file with the same page-cache state: the file is written first
and read once before timing, so loads mostly come from the page cache (the storage itself is
not measured; that is what a machine without GDS gives). ``compat`` in each row says whether
cuFile ran in compatibility mode (no nvidia-fs driver: POSIX I/O through bounce buffers);
``gpurt.gds (posix)`` means cuFile refused to register the file and gpurt's host path ran.

    python benchmarks/bench_gds.py [--mib N] [--repeat N] [--dir PATH] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import peer, print_rows, write_results


def _gbps(fn: Callable[[], Any], nbytes: int, repeat: int) -> float:
    fn()  # warm: page cache, registration, first-touch
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return nbytes / statistics.median(samples) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None, help="folder for the test file (default: temp)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import gpurt
    from gpurt import gds

    nbytes = args.mib << 20
    host = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    compat = gds.is_compat_mode()
    rows: list[dict[str, Any]] = []
    what = f"{args.mib} MiB"

    def row(op: str, lib: str, gbps: float) -> None:
        rows.append({"what": f"{op} {what}", "lib": lib, "compat": compat, "gbps": gbps})

    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = os.path.join(folder, "bench_gds.bin")
        host.tofile(path)
        device = gpurt.empty(nbytes, gpurt.uint8)
        pinned = gpurt.pinned_empty(nbytes, np.uint8)
        pageable = np.empty(nbytes, np.uint8)
        stream = device.stream

        with gds.GdsFile(path, os.O_RDWR) as f:
            lib = f"gpurt.gds ({f.backend})"
            row("load", lib, _gbps(lambda: f.load_array(device), nbytes, args.repeat))
            assert np.array_equal(device.to_numpy(), host), "gpurt.gds loaded wrong bytes"
            gds.gds_register_buffer(device)
            row("load", f"{lib} registered buffer",
                _gbps(lambda: f.load_array(device), nbytes, args.repeat))
            gds.gds_deregister_buffer(device)

        def read_then_copy(buffer: np.ndarray) -> None:
            with open(path, "rb", buffering=0) as fh:
                fh.readinto(memoryview(buffer))
            device.copy_(buffer)
            stream.synchronize()

        row("load", "read+copy(pinned)", _gbps(lambda: read_then_copy(pinned), nbytes,
                                              args.repeat))
        row("load", "read+copy(pageable)", _gbps(lambda: read_then_copy(pageable), nbytes,
                                                args.repeat))

        torch = peer("torch")
        if torch is not None and hasattr(torch.cuda, "gds"):
            tensor = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            try:
                theirs = torch.cuda.gds.GdsFile(path, os.O_RDONLY)
                storage = tensor.untyped_storage()
                row("load", f"torch.cuda.gds {torch.__version__}",
                    _gbps(lambda: theirs.load_storage(storage), nbytes, args.repeat))
            except (RuntimeError, OSError) as exc:  # no cuFile in torch, or O_DIRECT refused
                print(f"torch.cuda.gds skipped: {exc}")

        out = os.path.join(folder, "bench_gds_out.bin")
        with gds.GdsFile(out, os.O_CREAT | os.O_RDWR) as f:
            row("save", f"gpurt.gds ({f.backend})",
                _gbps(lambda: f.save_array(device), nbytes, args.repeat))

        def copy_then_write() -> None:
            device.to_numpy(out=pinned)
            with open(out, "wb", buffering=0) as fh:
                fh.write(memoryview(pinned))

        row("save", "D2H(pinned)+write", _gbps(copy_then_write, nbytes, args.repeat))

    print_rows(f"file <-> device, GB/s (cuFile compatibility mode: {compat})", rows)
    write_results("gds", rows, args.json)


if __name__ == "__main__":
    main()
