"""Development harness for 16-bit GEMMs whose rows are not 128-byte multiples (issue 17:
1000^3, 2000^3, 3000x5000x2000 run at 0.63-0.87 of cuBLAS, 0.87-0.93 with the same values in
128-byte-pitched rows; notes_gemm.md, session 7): times the chosen config kernel-only (graph
replay, inputs rotating past the L2) next to cuBLAS, with each TMA L2 promotion (none, 64, 128,
256 bytes; cuTensorMapEncodeTiled's argument, 256 in gpurt) on the split rows and on padded
rows, every result checked against float64 on a poisoned output.

    python benchmarks/pitch_dev.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm_decode as bench  # noqa: E402
import grid_dev  # noqa: E402
import torch  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402

import gpurt  # noqa: E402

gm, launch, tune = grid_dev.gm, grid_dev.launch, grid_dev.tune
SHAPES = ((1000, 1000, 1000), (2000, 2000, 2000), (3000, 5000, 2000), (2000, 3000, 1000))
_P = cu.CUtensorMapL2promotion
PROMOTIONS = {"none": _P.CU_TENSOR_MAP_L2_PROMOTION_NONE,
              "64": _P.CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
              "128": _P.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
              "256": _P.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}


class _Driver:
    """cuda.bindings' driver with the L2 promotion of every tensor map replaced."""

    def __init__(self, promotion: Any) -> None:
        self.promotion = promotion

    def __getattr__(self, name: str) -> Any:
        return getattr(cu, name)

    def cuTensorMapEncodeTiled(self, *args: Any) -> Any:
        args = list(args)
        args[9] = self.promotion
        return cu.cuTensorMapEncodeTiled(*args)


def pad_inputs(p: Any) -> None:
    """Replace p's inputs by copies whose row pitches are multiples of 64 elements."""
    def padded(x: Any) -> Any:
        rows, cols = x.shape
        wide = torch.empty(rows, -(-cols // 64) * 64, device=x.device, dtype=x.dtype)
        wide[:, :cols] = x
        return wide[:, :cols]

    p.a = [padded(x) for x in p.a]
    p.b = [padded(x) for x in p.b]
    p.ga = [gpurt.asarray(x) for x in p.a]
    p.gb = [gpurt.asarray(x) for x in p.b]


def time_shape(m: int, n: int, k: int, pad: bool, stream: Any, l2: int) -> dict[str, Any]:
    p = bench.Problem(gpurt, torch, m, n, k, torch.bfloat16, False, l2)
    if pad:
        pad_inputs(p)
    problem = grid_dev.problem_of(p.a[0], p.b[0], False)
    row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "pad": pad, "pitch128": problem.pitch128,
                           "config": tune.heuristic(problem).label(),
                           "cublas_us": grid_dev.cublas_us(p)}
    ref = p.a[0].double() @ p.b[0].double()
    for name, promotion in PROMOTIONS.items():
        launch.cu = _Driver(promotion)
        launch._maps.clear()
        gm.clear_plans()
        try:
            err = grid_dev.error(p, None, False, stream, ref)
            us = grid_dev.ours_us(p, None, False, stream)
        finally:
            launch.cu = cu
            launch._maps.clear()
            gm.clear_plans()
        row[name] = {"us": us, "x": round(row["cublas_us"] / us, 3), "err": float(f"{err:.2g}"),
                     "ok": err < 1e-2}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = gpurt.Stream()
    rows = []
    with torch.cuda.stream(torch.cuda.ExternalStream(stream.cuda_stream)):
        for (m, n, k) in SHAPES:
            for pad in (False, True):
                rows.append(time_shape(m, n, k, pad, stream, l2))
                print(json.dumps(rows[-1]), flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{torch.cuda.get_device_name()}: kernel-only us; x = cuBLAS / gpurt, per L2 "
          "promotion of the tensor maps")
    for row in rows:
        cells = " ".join(f"{name}={row[name]['us']:.1f}/x{row[name]['x']:.3f}"
                         f"{'' if row[name]['ok'] else ' BAD'}" for name in PROMOTIONS)
        print(f"{row['shape']:>15}{' pad' if row['pad'] else '    '} {row['config']} cuBLAS "
              f"{row['cublas_us']:.1f} | {cells}")


if __name__ == "__main__":
    main()
