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

# (M, N, K): the squares, then the decode and projection shapes of issue 17 and its irregular
# sizes (a result covers the shapes of its power-of-two bucket that the heuristic picks alike),
# squares first so that a short budget still tunes them.
SQUARES = tuple((n, n, n) for n in (1024, 2048, 4096, 8192))
INFERENCE = tuple((m, n, k) for m in (1, 16, 64, 128)
                  for n, k in ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096)))
IRREGULAR = ((1000, 1000, 1000), (3000, 5000, 2000), (8192, 8192, 512))
SHAPES = SQUARES + INFERENCE + IRREGULAR
DTYPES = (ml_dtypes.bfloat16, np.float16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds in all")
    args = parser.parse_args()
    started = time.monotonic()
    rng = np.random.default_rng(0)
    for m, n, k in SHAPES:
        for dtype in DTYPES:
            if time.monotonic() - started > args.budget:
                break
            a = gpurt.asarray(rng.standard_normal((m, k)).astype(dtype))
            b = gpurt.asarray(rng.standard_normal((k, n)).astype(dtype))
            t0 = time.monotonic()
            gemm(a, b)
            gpurt.synchronize()
            print(f"{np.dtype(dtype).name} {m}x{n}x{k} tuned in {time.monotonic() - t0:.2f} s",
                  flush=True)
    tunable.write_file(args.output)
    print(f"wrote {args.output}: {len(tunable.get_results())} results")


if __name__ == "__main__":
    main()
