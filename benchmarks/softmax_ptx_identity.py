"""PTX identity of the softmax kernels against a git revision (CPU only): the instantiations
the chooser picks over a grid of row lengths, dtypes, operations and row counts, and the GPU
tests' variants, compiled by NVRTC once from the revision's softmax.cu + softmax_ends.cu and
once from the working tree's; each ``.entry`` compared with its mangled name replaced
(ptx_identity.entries, ``own_name``: a template value added with a default changes every
instantiation's name, not its code). Prints the names that differ.

    python benchmarks/softmax_ptx_identity.py REV [--arch sm_90]
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from ptx_identity import entries

plan = importlib.import_module("gpurt.kernels._softmax_plan")
ROOT = Path(__file__).resolve().parents[1]
COLS = (7, 1000, 4099, 12001, 32001, 50257, 65536, 131071, 131072, 200003, 300001, 1_000_003)
ROWS = (None, 1, 8, 32, 64, 300)


def names() -> list[str]:
    """Every name the chooser picks on the grid (sm_90, aligned and odd rows), the split's,
    and the GPU tests' variants."""
    sys.path.insert(0, str(ROOT / "tests"))
    tests = importlib.import_module("test_softmax_long")
    persist = importlib.import_module("test_softmax_persist")
    ends = importlib.import_module("test_softmax_ends")
    variants = [*tests.ticket_variants(), *persist.persist_variants(),
                *persist.persist_variants(long=True), *tests.forward16_variants(),
                *ends.ends_variants(), *ends.ends_variants(long=True)]
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        for op in range(4):
            for cols in COLS:
                variants.append(plan.choose_variant(cols, dtype, op, tickets=False))
                variants += [plan.choose_variant(cols, dtype, op, rows=rows) for rows in ROWS]
    return sorted({n for v in variants for n in v.names()})


def _text(rev: str | None) -> str:
    if rev is None:
        return plan.source_text()
    return "\n".join(subprocess.run(["git", "show", f"{rev}:kernels/{name}"], cwd=ROOT,
                                    capture_output=True, text=True, check=True).stdout
                     for name in ("softmax.cu", "softmax_ends.cu"))


def _local_names(body: str) -> str:
    """``body`` with its static shared variables' names (the kernel's mangled name inside
    ``_ZZ...E<n><name>``, which own_name leaves) cut to a common prefix."""
    return re.sub(r"_ZZ\w+?E(?=\d+[A-Za-z_])", "_ZZENTRY", body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    found = names()
    # ptx_identity offers the GEMM headers too; softmax.cu includes none
    old, new = ({"softmax.cu": _text(rev), "gemm_common.cu": ""} for rev in (args.rev, None))
    before, after = ({name: _local_names(body) for name, body in
                      entries(texts, "softmax.cu", found, args.arch, own_name=True).items()}
                     for texts in (old, new))
    differ = [name for name in found if before[name] != after[name]]
    for name in differ:
        print(f"DIFF {name}")
    print(f"{len(found)} names, {len(differ)} differ from {args.rev}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
