"""fp32 SIMT, session 13 (issue 17): the branch-free K-tile copies (``Config.flat``,
kernels/gemm_simt.cu's FLAGS bit 1) and 64 x 32 warps (bit 2) against the kernels they vary.
``time``: the heuristic's plans (``auto``) and the same plans with every simt tile flat
(``flat``), kernel-only cold (graph replay over rotating inputs), warm and single calls,
cuBLAS (fp32, TF32 off) the same ways in the same process (simt_s10_dev's harness, each
variant first checked against float64 into a NaN-poisoned output); ``configs``: forced tiles
(CONFIGS) cold and warm; ``sanitize``: a few variant calls for compute-sanitizer;
``precompile``: what these and tests/test_gemm_simt*.py compile, in parallel.

    python benchmarks/simt_s13_dev.py time --shapes 1000x1000x1000,... [--json PATH]
    python benchmarks/simt_s13_dev.py configs --shapes 1000x1000x1000,645x3008x1999 [--json P]
    python benchmarks/simt_s13_dev.py sanitize [--count N]
    python benchmarks/simt_s13_dev.py precompile
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
_BASE = tune._SIMT
_S = _BASE


def _flat(config: Any) -> Any:
    return dataclasses.replace(config, flat=True)


S3 = tune.Config("simt", 64, 128, 8, stages=3)  # cuBLAS's 64 x 128 x 8, 3 stages
TALL = dataclasses.replace(S3, wm=64, wn=32)  # ... and its warps of 64 x 32
# 1000^3 on cuBLAS's grid (128 CTAs of 4 warps) old, flat, tall, both, and the pick (128 x 256
# split 4) flat; 2053 x 3001 x 1999's tail on the packed copies (645 x 3008 x 1999, 264 CTAs
# of 64 x 128: the heuristic's tile) the same ways; 768^3
CONFIGS = {
    (1000, 1000, 1000): [S3, _flat(S3), TALL, _flat(TALL), _S[3], _flat(_S[3]),
                         _flat(dataclasses.replace(_S[3], wm=64, wn=32)),
                         dataclasses.replace(_S[0], split_k=4),
                         _flat(dataclasses.replace(_S[0], split_k=4))],
    (645, 3008, 1999): [_S[3], _flat(_S[3]), S3, _flat(S3), _flat(TALL),
                        _flat(dataclasses.replace(_S[3], wm=64, wn=32))],
    # 64 x 128 x 8 split 7 (the pick: 504 CTAs, all resident at 124 registers, the spread
    # ending) and flat (2 CTAs an SM: two waves, the last-CTA ending), flat splits that fit
    (768, 768, 768): [dataclasses.replace(_S[3], split_k=7),
                      _flat(dataclasses.replace(_S[3], split_k=7)),
                      _flat(dataclasses.replace(_S[3], split_k=3)),
                      _flat(dataclasses.replace(_S[3], split_k=4)),
                      _flat(dataclasses.replace(_S[3], wm=64, wn=32, split_k=3))],
}

# compute-sanitizer's calls (config, m, n, k, split): offset views (4-byte copies), one layout
# each in turn
SANITIZE = [(_flat(TALL), 131, 261, 1003, 1), (_flat(TALL), 70, 133, 5, 1),
            (_flat(TALL), 131, 261, 1003, 3), (TALL, 129, 130, 203, 1),
            (_flat(_S[0]), 137, 300, 2056, 2), (_flat(_S[8]), 200, 130, 520, 1)]

LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]  # (trans_a, trans_b)
_REAL_MODE = s10._mode


def _mode(kind: str, forced: Any = None) -> None:
    """simt_s10_dev's modes, plus ``flat``: the heuristic's plans with every simt tile flat
    (the model unchanged, so the same tiles and splits as ``auto``)."""
    tune._SIMT = tuple(_flat(c) for c in _BASE) if kind == "flat" else _BASE
    rows_mod._HEADS = (tune._SIMT[0], tune._SIMT[1])
    _REAL_MODE("auto" if kind == "flat" else kind, forced)


s10._mode = _mode


def sanitize(count: int) -> None:
    """Variant calls on odd sizes, offset views, beta/Cin, every layout once: tall and flat
    64 x 128 unsplit, split (spread and last-CTA endings) and with K below one tile; the wide
    tile flat split; a 3-warp-row tile flat (the first ``count`` of them)."""
    gl = importlib.import_module("gpurt.kernels._gemm_launch")
    for index, (config, m, n, k, split) in enumerate(SANITIZE[:count]):
        ta, tb = LAYOUTS[index % 4]
        for spread in (True, False) if split > 1 else (True,):
            gl.SPREAD_SPLIT_K = spread
            s10.gm.clear_plans()
            a = torch.randn((k, m + 3) if ta else (m, k + 3), device="cuda")[:, 3:]
            b = torch.randn((n, k) if tb else (k, n), device="cuda")
            c = torch.randn(m, n, device="cuda")
            out = torch.full((m, n), float("nan"), device="cuda")
            cfg = dataclasses.replace(config, split_k=split)
            s10.gm.gemm(a, b, out=out, trans_a=ta, trans_b=tb, alpha=0.5, beta=-1.5, c=c,
                        config=cfg)
            ref = 0.5 * ((a.double().T if ta else a.double()) @
                         (b.double().T if tb else b.double())) - 1.5 * c.double()
            err = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
            print("PASS" if err < 1e-5 else "FAIL", cfg.label(), m, n, k, ta, tb,
                  f"spread={spread}", f"{err:.2e}", flush=True)
    gl.SPREAD_SPLIT_K = True


def precompile() -> None:
    """The timed plans' tiles flat and not (row-major A and B, 16-byte rows, split and not),
    CONFIGS', the sanitizer's and tests/test_gemm_simt_flat.py's cases' programs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    flat_tests = importlib.import_module("test_gemm_simt_flat")
    gl = importlib.import_module("gpurt.kernels._gemm_launch")
    todo: dict[Any, None] = {}

    def add(config: Any, a_k: bool, b_k: bool, vec: bool, split: int) -> None:
        p = tune.Problem(256, 256, 256, tune.DT_F32, a_k, b_k, vec, vec, (9, 0), 132)
        todo[gl.program(dataclasses.replace(config, split_k=split), p)] = None

    for config in (_S[0], _S[1], _S[3]):
        for split in (1, 2):
            add(config, True, False, True, split)
            add(_flat(config), True, False, True, split)
    for config in (c for cs in CONFIGS.values() for c in cs):
        add(config, True, False, True, config.split_k)
    for base, variants in flat_tests.PAIRS:
        for ta, tb, offset, _, _, _, split in flat_tests.cases(base):
            for config in (base, *variants):
                add(config, not ta, tb, not offset, split)
    for index, (config, *_, split) in enumerate(SANITIZE):
        ta, tb = LAYOUTS[index % 4]
        for vec in (True, False):
            add(config, not ta, tb, vec, split)
    todo[("gemm_pack.cu", ("gemm_pack<unsigned int>",), "sm_90")] = None
    print(f"compiling {len(todo)} programs", flush=True)
    gl.compile_programs(list(todo))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["time", "configs", "sanitize", "precompile"])
    parser.add_argument("--shapes", default="1000x1000x1000")
    parser.add_argument("--json", default=None)
    parser.add_argument("--count", type=int, default=len(SANITIZE), help="sanitize: cases")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in text.split("x")) for text in args.shapes.split(",")]
    if args.mode == "time":
        s10.time_shapes(shapes, args.json, ["auto", "flat"])  # type: ignore[arg-type]
    elif args.mode == "configs":
        s11.CONFIGS = CONFIGS
        s11.time_configs(shapes, args.json)  # type: ignore[arg-type]
    elif args.mode == "sanitize":
        sanitize(args.count)
    else:
        precompile()


if __name__ == "__main__":
    main()
