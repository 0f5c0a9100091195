"""Session 21's device scripts' helper: merge s19_mma.py JSON files into one and print their
rows as a table of each (shape, config)'s time per tag.

    python benchmarks/s21_rows.py OUT.json IN.json ...   (missing inputs are skipped)
"""

from __future__ import annotations

import collections
import json
import os
import sys


def main() -> None:
    out, *paths = sys.argv[1:]
    parts = [json.load(open(p)) for p in paths if os.path.exists(p)]
    rows = [row for part in parts for row in part["rows"]]
    with open(out, "w") as f:
        json.dump({"device": parts[0]["device"] if parts else None, "rows": rows}, f, indent=1)
    table: dict = collections.defaultdict(dict)
    for r in rows:
        table[(r["shape"], r["config"])][r["tag"]] = r["us"]
        table[(r["shape"], r["config"])]["cublas"] = r["cublas_us"]
    for (shape, config), times in table.items():
        print(shape, config.replace("simt ", "")[:60], times)


if __name__ == "__main__":
    main()
