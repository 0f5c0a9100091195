"""NVRTC compilation through gpurt's caches, and CuPy's for comparison.

Rows (milliseconds or microseconds, median):
  cold compile        a small kernel never seen before (NVRTC runs; DESIGN.md: ~44 ms),
  memory hit          the same compile() call again in the process (target <= 20 us),
  disk hit, fresh     compile() in a new process whose cache folder has the entry
                      (target <= 2 ms; the import of gpurt is reported separately),
  CuPy                RawKernel(...).kernel cold and from CuPy's in-memory cache
                      (DESIGN.md: 16 us).

Works without a GPU (compiles for --arch, default sm_90 there, the device's arch on one).

    python benchmarks/bench_nvrtc.py [--arch sm_90] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from _common import host_us, peer, print_rows, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SOURCE = r"""
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import gpurt
t1 = time.perf_counter()
module = gpurt.compile(sys.argv[1], arch=sys.argv[2])
kernel = module["axpy"]
t2 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "hit_ms": (t2 - t1) * 1e3}))
"""


def fresh(source: str) -> str:
    return f"// {uuid.uuid4().hex}\n{source}"


def ms(seconds: float) -> float:
    return seconds * 1e3


def gpurt_rows(arch: str) -> list[dict[str, Any]]:
    import gpurt

    cold = []
    for _ in range(5):
        source = fresh(SOURCE)
        start = time.perf_counter()
        gpurt.compile(source, arch=arch)
        cold.append(time.perf_counter() - start)
    gpurt.compile(SOURCE, arch=arch)
    rows = [
        {"what": "cold compile", "lib": "gpurt", "ms": ms(statistics.median(cold))},
        {"what": "memory hit: compile()", "lib": "gpurt",
         "us": host_us(lambda: gpurt.compile(SOURCE, arch=arch), number=2000, repeat=9)},
        {"what": "memory hit: compile() + kernel lookup", "lib": "gpurt",
         "us": host_us(lambda: gpurt.compile(SOURCE, arch=arch)["axpy"], number=2000, repeat=9)},
    ]
    if gpurt.is_available():  # the default target: the current device's arch
        gpurt.compile(SOURCE)
        rows.append({"what": "memory hit: compile(), arch from the device", "lib": "gpurt",
                     "us": host_us(lambda: gpurt.compile(SOURCE), number=2000, repeat=9)})
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "GPURT_CACHE_DIR": folder, "PYTHONPATH": ROOT}
        env.pop("GPURT_CACHE_DISABLE", None)
        samples = []
        for i in range(8):  # the first run writes the entry (and the toolchain record)
            done = subprocess.run([sys.executable, "-c", CHILD, SOURCE, arch], env=env,
                                  capture_output=True, text=True, check=True)
            if i:
                samples.append(json.loads(done.stdout))
    rows += [
        {"what": "disk hit, fresh process", "lib": "gpurt",
         "ms": statistics.median(s["hit_ms"] for s in samples)},
        {"what": "import gpurt (fresh process)", "lib": "gpurt",
         "ms": statistics.median(s["import_ms"] for s in samples)},
    ]
    return rows


def cupy_rows() -> list[dict[str, Any]]:
    cupy = peer("cupy")
    if cupy is None:
        return []
    cold = []
    for _ in range(5):
        source = fresh(SOURCE)
        start = time.perf_counter()
        _ = cupy.RawKernel(source, "axpy").kernel  # compiles on first access
        cold.append(time.perf_counter() - start)
    _ = cupy.RawKernel(SOURCE, "axpy").kernel
    return [
        {"what": "cold compile", "lib": "cupy", "ms": ms(statistics.median(cold))},
        {"what": "memory hit: compile() + kernel lookup", "lib": "cupy",
         "us": host_us(lambda: cupy.RawKernel(SOURCE, "axpy").kernel, number=2000, repeat=9)},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", help="target (default: the device's, or sm_90 without one)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import gpurt

    arch = args.arch or (gpurt.get_arch() if gpurt.is_available() else "sm_90")
    with tempfile.TemporaryDirectory(prefix="gpurt-bench-") as folder:
        os.environ["GPURT_CACHE_DIR"] = folder  # cold compiles must not fill the user's cache
        rows = gpurt_rows(arch) + cupy_rows()
    for row in rows:
        row["arch"] = arch
    print_rows("NVRTC compile and kernel cache", rows)
    write_results("nvrtc", rows, args.json)


if __name__ == "__main__":
    main()
