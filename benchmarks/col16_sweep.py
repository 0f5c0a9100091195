"""compute-sanitizer target for the 16-bit column sums of session 12 (s12-col16): the reduce
cases of scripts/sanitize_sweep.py's quick tier plus bfloat16 realigned column splits (one
level, a tree of 137 splits, offset and padded views), every result checked
against float64, with the knobs given on the command line set first:

    python3 -P benchmarks/col16_sweep.py [module.NAME=VALUE ...]
    (e.g. reduction.COLUMN_WIDE_MIN_BLOCKS=6 reduction.FOLD_VECTOR=True)

Prints ``calls: N`` as the sweep does."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(TREE / "tests"), str(TREE / "scripts")]

import numpy as np  # noqa: E402
import sanitize_sweep  # noqa: E402

from _bandwidth_cases import ReduceCase, run_reduce  # noqa: E402
from gpurt._elementwise import reduce_codegen, reduction  # noqa: E402

MODULES = {"reduction": reduction, "reduce_codegen": reduce_codegen}
# (rows, cols, offset, pad): bfloat16 realigned column sums, split
SPLITS = [(2100, 1041, 0, 0), (2100, 1041, 1, 3), (9000, 301, 2, 0), (4099, 1001, 3, 5),
          (70_000, 37, 1, 0)]


def main() -> None:
    for knob in sys.argv[1:]:
        name, value = knob.split("=", 1)
        module, attr = name.split(".")
        if not hasattr(MODULES[module], attr):
            raise SystemExit(f"col16_sweep: no knob {name}")
        setattr(MODULES[module], attr, ast.literal_eval(value))
    calls = sanitize_sweep.run_cases("quick", ("reduce",))
    rng = np.random.default_rng(12)
    for rows, cols, offset, pad in SPLITS:
        run_reduce(ReduceCase("bfloat16", rows, cols, 0, False, offset, pad), rng)
        calls += 1
    print(f"calls: {calls}")


if __name__ == "__main__":
    main()
