"""Tune the bundled GEMM on common shapes and write the results file that ``gpurt build-kernels
--tuning`` puts into the prebuilt archive as its default tuning table (docs/aot.md).

Runs on the GPU the table is for (results are keyed by device name and kernel sources):

    GPURT_PREBUILT=k.gpak python benchmarks/tune_defaults.py -o kernels/tuning/gemm-tune-h100.json
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

import gpurt
from gpurt.kernels import tunable
from gpurt.kernels.gemm import gemm

SHAPES = (1024, 2048, 4096, 8192)
DTYPES = (ml_dtypes.bfloat16, np.float16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds in all")
    args = parser.parse_args()
    started = time.monotonic()
    rng = np.random.default_rng(0)
    for dtype in DTYPES:
        for n in SHAPES:
            if time.monotonic() - started > args.budget:
                break
            a = gpurt.asarray(rng.standard_normal((n, n)).astype(dtype))
            b = gpurt.asarray(rng.standard_normal((n, n)).astype(dtype))
            t0 = time.monotonic()
            gemm(a, b)
            gpurt.synchronize()
            print(f"{np.dtype(dtype).name} {n}^3 tuned in {time.monotonic() - t0:.2f} s",
                  flush=True)
    tunable.write_file(args.output)
    print(f"wrote {args.output}: {len(tunable.get_results())} results")


if __name__ == "__main__":
    main()
