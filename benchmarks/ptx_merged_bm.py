"""PTX of the merged 64-/192-row kernel (kernels/gemm_wgmma.cu gemm_wgmma_bm, session 12)
against the two wrappers it replaced at a revision before the merge (gemm_wgmma_x.cu's
gemm_wgmma_64 and gemm_wgmma.cu's gemm_wgmma_bm without PS; CPU only): every gemm_wgmma_bm
name of ``_gemm_launch.programs`` plus the 64-row pipelined stores, each whole ``.entry``
compared as ptx_identity.py does, with the kernels' mangled names (which the new template
value PS changes) and the trailing comment naming the next entry taken out. The 64-row tiles in
clusters (new) are left out.

    python benchmarks/ptx_merged_bm.py REV
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptx_identity as pi  # noqa: E402

launch = importlib.import_module("gpurt.kernels._gemm_launch")
FILES = ("gemm_common.cu", "gemm_wgmma.cu", "gemm_wgmma_x.cu")


def _args(name: str) -> list[str]:
    return [a.strip() for a in name[name.index("<") + 1:-1].split(",")]


def _clustered_64(name: str) -> bool:
    """A 64-row tile in clusters (new in session 12: nothing to compare with)."""
    args = _args(name)
    return args[1] == "64" and args[6] != "1"


def old_name(name: str) -> tuple[str, str]:
    """The instantiation (and its file) at REV that ``name`` replaces."""
    dt, bm, bn, stages, a_k, b_k, _, epi, *ps = _args(name)
    if bm == "64":
        return f"gemm_wgmma_64<{', '.join([dt, bn, stages, a_k, b_k, epi, *ps])}>", FILES[2]
    return name, FILES[1]


def normalised(text: str) -> str:
    text = re.sub(r"_Z\d+gemm_wgmma_\w+?(?=_param|\(|\s|$)", "KERNEL", text)
    return re.sub(r"\s*// \.weak KERNEL\s*$", "", text.rstrip("\x00 "))


def main(rev: str) -> int:
    names = sorted({n for _, found, _ in launch.programs("sm_90a") for n in found
                    if n.startswith("gemm_wgmma_bm<") and not _clustered_64(n)})
    names += [f"gemm_wgmma_bm<{dt}, 64, 128, 8, {a}, {b}, 1, true, true>" for dt in (1, 2)
              for a in ("true", "false") for b in ("true", "false")]
    old = {f: pi._revision_text(rev, f) for f in FILES}
    new = {f: launch.text(f) for f in FILES}
    after = pi.entries(new, FILES[1], names, "sm_90a")
    pairs = {name: old_name(name) for name in names}
    before: dict[str, str] = {}
    for source in {src for _, src in pairs.values()}:
        before |= pi.entries(old, source, [o for o, src in pairs.values() if src == source],
                             "sm_90a")
    differ = 0
    for name, (was, _) in pairs.items():
        if normalised(before[was]) != normalised(after[name]):
            differ += 1
            print(f"DIFF {was} -> {name}")
    print(f"{len(names)} names, {differ} differ from {rev}'s (mangled names aside)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
