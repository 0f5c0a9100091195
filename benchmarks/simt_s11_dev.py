"""fp32 SIMT at issue 17's session-11 shapes (1536^3, 768^3, 1000 x 1000 x 4000 beside 1000^3
and 2053 x 3001 x 1999): the heuristic's pick and forced tiles/splits near it, timed by
simt_s10_dev.py's harness (kernel-only graph replay over rotating inputs, bench_gemm's warm
Timer, single calls; cuBLAS fp32 with TF32 off the same ways in the same process; each variant
first checked against float64 into a NaN-poisoned output); what cuBLAS launches there; one
warm call of a chosen kernel for ncu.

    python benchmarks/simt_s11_dev.py time --shapes 1536x1536x1536,... [--json PATH]
    python benchmarks/simt_s11_dev.py configs --shapes 1536x1536x1536 [--json PATH]
    python benchmarks/simt_s11_dev.py profile --shapes 1536x1536x1536,... [--json PATH]
    python benchmarks/simt_s11_dev.py precompile   (row-major A and B only)
    python benchmarks/simt_s11_dev.py one M N K cublas|auto|TILE   (TILE: an index of _SIMT,
        unsplit; two calls on the same operands, the second warm for ncu --launch-skip 1)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simt_s10_dev as s10  # noqa: E402
import torch  # noqa: E402

tune = s10.tune
_S = tune._SIMT


def _splits(base: Any, *splits: int) -> list[Any]:
    return [dataclasses.replace(base, split_k=s) for s in splits]


# forced variants per shape: every tile near the model's pick, with splits around its own
CONFIGS = {
    (1536, 1536, 1536): [*_splits(_S[3], 3, 4, 5, 6, 8), *_splits(_S[0], 3, 5, 6),
                         *_splits(_S[8], 2, 4), *_splits(_S[7], 4, 5), *_splits(_S[1], 6, 8),
                         *_splits(_S[2], 4, 8), *_splits(_S[4], 4, 8), *_splits(_S[6], 1, 4)],
    (768, 768, 768): [*_splits(_S[3], 3, 5, 7, 8), *_splits(_S[7], 4, 6),
                      *_splits(_S[6], 4, 6), *_splits(_S[2], 3), *_splits(_S[0], 6)],
    (1000, 1000, 4000): [*_splits(_S[0], 4, 8), *_splits(_S[3], 2, 3, 4),
                         *_splits(_S[2], 2), *_splits(_S[1], 4)],
    # 2053 x 3001 x 1999's tail on 16-byte rows (the packed route's copies): the tuner took
    # 32 x 128 x 8 (which the heuristic keeps for M <= 32) 5% faster than 64 x 128 x 8
    # 1000^3 warm: cuBLAS's own grid (64 x 128 x 8, 128 CTAs of 4 warps) at other ring
    # depths and K tiles, and the pick with a deeper ring
    (1000, 1000, 1000): [_S[3], *(dataclasses.replace(_S[3], stages=s) for s in (3, 5, 6)),
                         dataclasses.replace(_S[3], bk=16, stages=3),
                         dataclasses.replace(_S[0], stages=4, split_k=4)],
    (645, 3008, 1999): [*_splits(_S[7], 1, 2, 3), *_splits(_S[3], 1, 2), *_splits(_S[6], 1),
                        *_splits(_S[5], 2), *_splits(_S[8], 1)],
}


def time_configs(shapes: list[tuple[int, int, int]], json_path: str | None) -> None:
    """simt_s10_dev's ``configs`` with each shape's own CONFIGS (one JSON file per shape)."""
    for shape in shapes:
        s10.CONFIGS = CONFIGS.get(shape, [])
        path = None if json_path is None else json_path.replace(
            ".json", f"-{'x'.join(map(str, shape))}.json")
        s10.time_configs([shape], path)


def one(m: int, n: int, k: int, which: str) -> None:
    """Two calls on the same operands (the second warm: ncu's --launch-skip 1)."""
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    out = torch.empty(m, n, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    s10._mode("auto")
    config = None if which in ("cublas", "auto") else _S[int(which)]
    for _ in range(2):
        if which == "cublas":
            torch.matmul(a, b, out=out)
        else:
            s10.gm.gemm(a, b, out=out, config=config)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["time", "configs", "profile", "one", "precompile"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--shapes", default="1536x1536x1536")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in text.split("x")) for text in args.shapes.split(",")]
    if args.mode == "time":
        s10.time_shapes(shapes, args.json, ["auto"])  # type: ignore[arg-type]
    elif args.mode == "configs":
        time_configs(shapes, args.json)  # type: ignore[arg-type]
    elif args.mode == "precompile":
        s10.precompile([(True, False)])
        p = tune.Problem(256, 256, 256, tune.DT_F32, True, False, True, True, (9, 0), 132)
        gl = importlib.import_module("gpurt.kernels._gemm_launch")
        gl.compile_programs([gl.program(c, p) for c in CONFIGS[(1000, 1000, 1000)]])
    elif args.mode == "profile":
        s10.SHAPES = shapes[:3]
        s10.profile(args.json)
    else:
        m, n, k = (int(x) for x in args.args[:3])
        one(m, n, k, args.args[3])


if __name__ == "__main__":
    main()
