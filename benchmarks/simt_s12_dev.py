"""fp32 SIMT, session 12 (issue 17): forced tiles at 1000^3, on 2053 x 3001 x 1999's tail and at
4096^3 (simt_s11_dev's ``configs``), each kernel's time under torch.profiler (ours at
2053 x 3001 x 1999: the packed copy, the cut's head and tail), the heuristic's plans timed by
simt_s10_dev.py's harness (kernel-only graph replay over rotating inputs, bench_gemm's warm
Timer, single calls; cuBLAS fp32 with TF32 off the same ways in the same process; each
variant first checked against float64 into a NaN-poisoned output), and one warm call of a
given tile for ncu. Session 12's device call ran this with the rolled K tile (``kstep``) as
well: commit f4707ee (the variant lost everywhere and was removed; notes_gemm.md).

    python benchmarks/simt_s12_dev.py time --shapes 1000x1000x1000,... [--json PATH]
    python benchmarks/simt_s12_dev.py configs --shapes 1000x1000x1000,645x3008x1999 [--json P]
    python benchmarks/simt_s12_dev.py profile --shapes 2053x3001x1999,1000x1000x1000 [--json P]
    python benchmarks/simt_s12_dev.py one M N K cublas|auto|BM,BN,BK,WN,STAGES,SPLIT
    python benchmarks/simt_s12_dev.py precompile
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
import simt_s11_dev as s11  # noqa: E402
import torch  # noqa: E402

tune = s10.tune
_S = tune._SIMT


def _with(base: Any, **changes: Any) -> Any:
    return dataclasses.replace(base, **changes)


# forced variants: 1000^3 on cuBLAS's grid (64 x 128 x 8, 128 CTAs of 4 warps), with 16-deep
# K tiles (half the barriers), the pick's wide tile; 2053 x 3001 x 1999's tail on the packed
# copies: the tuner's 32 x 128 x 8 and tiles of 8 x 16 outputs a thread that fill the GPU once
# (64 x 256 split 2: 264 CTAs, 2 an SM); 4096^3's wide tile with a deeper ring and with 8-deep
# K tiles (half the straight-line code, as cuBLAS's 256 x 128 x 8)
CONFIGS = {
    (1000, 1000, 1000): [_S[3], _with(_S[3], bk=16, stages=3), _with(_S[3], bk=16, stages=4),
                         _with(_S[0], split_k=4), _with(_S[1], split_k=2)],
    (4096, 4096, 4096): [_with(_S[0], stages=4), _with(_S[0], bk=8, stages=4)],
    (645, 3008, 1999): [_S[7], _S[3], _with(_S[4], split_k=2), _with(_S[4], split_k=3),
                        _with(_S[1], split_k=2), _with(_S[0], split_k=2)],
}


def one(m: int, n: int, k: int, which: str) -> None:
    """Two calls on the same operands (the second warm: ncu's --launch-skip 1)."""
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    out = torch.empty(m, n, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    s10._mode("auto")
    config = None
    if which not in ("cublas", "auto"):
        bm, bn, bk, wn, stages, split = (int(x) for x in which.split(","))
        config = tune.Config("simt", bm, bn, bk, 32 if wn else 0, wn, stages=stages,
                             split_k=split)
    for _ in range(2):
        if which == "cublas":
            torch.matmul(a, b, out=out)
        else:
            s10.gm.gemm(a, b, out=out, config=config)
    torch.cuda.synchronize()


def precompile() -> None:
    """Every simt tile in every layout (simt_s10_dev's: the GPU tests' too), then CONFIGS'
    programs with row-major A and B, with and without 16-byte rows, split and not."""
    s10.precompile()
    gl = importlib.import_module("gpurt.kernels._gemm_launch")
    todo: dict[Any, None] = {}
    for config, vec, split in [(c, v, s) for cs in CONFIGS.values() for c in cs
                               for v in (True, False) for s in (1, 2)]:
        p = tune.Problem(256, 256, 256, tune.DT_F32, True, False, vec, vec, (9, 0), 132)
        todo[gl.program(dataclasses.replace(config, split_k=split), p)] = None
    print(f"compiling {len(todo)} programs", flush=True)
    gl.compile_programs(list(todo))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["time", "configs", "one", "precompile", "profile"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--shapes", default="1000x1000x1000")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in text.split("x")) for text in args.shapes.split(",")]
    if args.mode == "time":
        s10.time_shapes(shapes, args.json, ["auto"])  # type: ignore[arg-type]
    elif args.mode == "configs":
        s11.CONFIGS = CONFIGS
        s11.time_configs(shapes, args.json)  # type: ignore[arg-type]
    elif args.mode == "profile":  # each kernel's name, grid and time (ours: copy, head, tail)
        s10.SHAPES = shapes
        s10.profile(args.json)
    elif args.mode == "precompile":
        precompile()
    else:
        m, n, k = (int(x) for x in args.args[:3])
        one(m, n, k, args.args[3])


if __name__ == "__main__":
    main()
