"""fp32 SIMT, session 12 (issue 17): the K tile's steps as a loop of ``kstep`` steps (less code
per K tile: the instruction cache) against the straight-line K tile (kstep 0, the old kernel:
its PTX is unchanged), timed by simt_s10_dev.py's harness (kernel-only graph replay over
rotating inputs, bench_gemm's warm Timer, single calls; cuBLAS fp32 with TF32 off the same
ways in the same process; each variant first checked against float64 into a NaN-poisoned
output); forced tiles at 1000^3 and on 2053 x 3001 x 1999's tail; one warm call for ncu.

    python benchmarks/simt_s12_dev.py time --shapes 1000x1000x1000,... [--json PATH]
    python benchmarks/simt_s12_dev.py configs --shapes 1000x1000x1000,645x3008x1999 [--json P]
    python benchmarks/simt_s12_dev.py profile --shapes 2053x3001x1999,1000x1000x1000 [--json P]
    python benchmarks/simt_s12_dev.py one M N K cublas|auto|BM,BN,BK,WN,STAGES,SPLIT,KSTEP
    python benchmarks/simt_s12_dev.py sanitize [STEP]
    python benchmarks/simt_s12_dev.py precompile

``time`` runs each shape as ``auto`` (the heuristic's plan, old kernel), ``ks8`` (every
16-deep simt tile of the plan with kstep 8) and ``ks4`` (every tile with kstep 4), by
patching the heuristic's tile table (kernels/_gemm_tune._SIMT) and the cut's heads.
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
rows_mod = s10.rows_mod
_S = tune._SIMT
_HEADS = rows_mod._HEADS
# mode -> kstep per tile depth (bk); a depth not listed keeps kstep 0
MODES: dict[str, dict[int, int]] = {"auto": {}, "ks8": {16: 8}, "ks4": {16: 4, 8: 4}}


def with_kstep(config: Any, steps: dict[int, int]) -> Any:
    return dataclasses.replace(config, kstep=steps.get(config.bk, 0))


def _apply(steps: dict[int, int]) -> None:
    tune._SIMT = tuple(with_kstep(c, steps) for c in _S)
    rows_mod._HEADS = tuple(with_kstep(c, steps) for c in _HEADS)


_REAL_MODE = s10._mode


def _mode(kind: str, forced: Any = None) -> None:
    """simt_s10_dev's modes, and MODES' kstep patches (``auto`` clears them)."""
    _REAL_MODE("auto" if kind in MODES else kind, forced)
    _apply(MODES.get(kind, {}))


s10._mode = _mode


def _ks(base: Any, kstep: int, **changes: Any) -> Any:
    return dataclasses.replace(base, kstep=kstep, **changes)


# forced variants: 1000^3 on cuBLAS's grid (64 x 128 x 8, 128 CTAs of 4 warps) with the K loop
# rolled, 16-deep K tiles (half the barriers), the pick's wide tile rolled; 2053 x 3001 x 1999's
# tail on the packed copies: the tuner's 32 x 128 x 8 and tiles of 8 x 16 outputs a thread that
# fill the GPU once (64 x 256 split 2: 264 CTAs, 2 an SM); 4096^3's wide tile with a deeper ring
# and with 8-deep K tiles (half the straight-line code, as cuBLAS's 256 x 128 x 8)
CONFIGS = {
    (1000, 1000, 1000): [_S[3], _ks(_S[3], 4), _ks(_S[3], 2), _ks(_S[3], 0, bk=16, stages=3),
                         _ks(_S[3], 8, bk=16, stages=3), _ks(_S[3], 0, bk=16, stages=4),
                         _ks(_S[0], 0, split_k=4), _ks(_S[0], 8, split_k=4),
                         _ks(_S[0], 4, split_k=4), _ks(_S[1], 0, split_k=2),
                         _ks(_S[1], 8, split_k=2)],
    (4096, 4096, 4096): [_ks(_S[0], 0, stages=4), _ks(_S[0], 8, stages=4),
                         _ks(_S[0], 0, bk=8, stages=4)],
    (645, 3008, 1999): [_S[7], _ks(_S[7], 4), _S[3], _ks(_S[3], 4), _ks(_S[4], 0, split_k=2),
                        _ks(_S[4], 8, split_k=2), _ks(_S[4], 0, split_k=3),
                        _ks(_S[1], 0, split_k=2), _ks(_S[0], 0, split_k=2)],
}


def one(m: int, n: int, k: int, which: str) -> None:
    """Two calls on the same operands (the second warm: ncu's --launch-skip 1)."""
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    out = torch.empty(m, n, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    _mode("auto")
    config = None
    if which not in ("cublas", "auto"):
        bm, bn, bk, wn, stages, split, kstep = (int(x) for x in which.split(","))
        config = tune.Config("simt", bm, bn, bk, 32 if wn else 0, wn, stages=stages,
                             split_k=split, kstep=kstep)
    for _ in range(2):
        if which == "cublas":
            torch.matmul(a, b, out=out)
        else:
            s10.gm.gemm(a, b, out=out, config=config)
    torch.cuda.synchronize()


def _checked(a: Any, b: Any, ta: bool, tb: bool, config: Any) -> float:
    """One forced call (alpha 0.5, beta -1.5 with C in) into a NaN-poisoned output; its
    relative error against float64."""
    m, n = a.shape[1] if ta else a.shape[0], b.shape[0] if tb else b.shape[1]
    c = torch.randn(m, n, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda")
    s10.gm.gemm(a, b, out=out, trans_a=ta, trans_b=tb, alpha=0.5, beta=-1.5, c=c,
                config=config)
    ref = 0.5 * ((a.double().T if ta else a.double()) @ (b.double().T if tb else b.double()))
    ref -= 1.5 * c.double()
    err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
    return err if err == err else float("inf")


def sanitize(step: int = 1) -> None:
    """Rolled tiles (split and not, 8 x 8 and 8 x 16 outputs a thread, 3 warp rows) in two
    layouts on offset views, alpha/beta/Cin, into NaN-poisoned outputs (every ``step``-th
    case: racecheck takes ~9 s a call)."""
    cases = [(_ks(_S[3], 4, split_k=3), 131, 261, 1003), (_ks(_S[0], 8), 137, 300, 411),
             (_ks(_S[8], 2), 100, 130, 77)]
    combos = [(c, t) for c in cases for t in ((False, False), (True, True))]
    for (config, m, n, k), (ta, tb) in combos[::step]:
        a = torch.randn((k, m + 3) if ta else (m, k + 3), device="cuda")[:, 3:]
        b = torch.randn((n, k) if tb else (k, n), device="cuda")
        err = _checked(a, b, ta, tb, config)
        print("PASS" if err < 1e-5 else "FAIL", config.label(), m, n, k, ta, tb,
              f"{err:.2e}", flush=True)


def precompile() -> None:
    """What the timing, the sanitizer and the simt GPU tests need: every simt tile (and
    tests/test_gemm_simt_kstep.py's rolled ones) in every layout, each mode's tiles and
    CONFIGS with row-major A and B; with and without 16-byte rows, split and not."""
    gl = importlib.import_module("gpurt.kernels._gemm_launch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    rolled = [dataclasses.replace(c, kstep=s) for c, s in
              importlib.import_module("test_gemm_simt_kstep").ROLLED]
    row_major = [c for cs in CONFIGS.values() for c in cs]
    row_major += [with_kstep(c, steps) for c in _S for steps in MODES.values()]
    layouts = [(a_k, b_k) for a_k in (True, False) for b_k in (True, False)]
    todo: dict[Any, None] = {}
    for configs, lays in ((row_major, [(True, False)]), ([*_S, *rolled], layouts)):
        for config, (a_k, b_k), vec, split in [(c, lay, v, s) for c in configs for lay in lays
                                               for v in (True, False) for s in (1, 2)]:
            p = tune.Problem(256, 256, 256, tune.DT_F32, a_k, b_k, vec, vec, (9, 0), 132)
            todo[gl.program(dataclasses.replace(config, split_k=split), p)] = None
    todo[("gemm_pack.cu", ("gemm_pack<unsigned int>",), "sm_90")] = None
    print(f"compiling {len(todo)} programs", flush=True)
    gl.compile_programs(list(todo))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["time", "configs", "one", "sanitize", "precompile",
                                         "profile"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--shapes", default="1000x1000x1000")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in text.split("x")) for text in args.shapes.split(",")]
    if args.mode == "time":
        s10.time_shapes(shapes, args.json, args.modes.split(","))  # type: ignore[arg-type]
    elif args.mode == "configs":
        s11.CONFIGS = CONFIGS
        s11.time_configs(shapes, args.json)  # type: ignore[arg-type]
    elif args.mode == "profile":  # each kernel's name, grid and time (ours: copy, head, tail)
        s10.SHAPES = shapes
        s10.profile(args.json)
    elif args.mode == "sanitize":
        sanitize(int(args.args[0]) if args.args else 1)
    elif args.mode == "precompile":
        precompile()
    else:
        m, n, k = (int(x) for x in args.args[:3])
        one(m, n, k, args.args[3])


if __name__ == "__main__":
    main()
