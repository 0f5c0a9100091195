"""Register spills of every bundled GEMM program and softmax variant as this process's NVRTC
builds them (CPU only): the kernels whose ptxas report has spill stores or loads.

The GPU machine's NVRTC may differ from ours, and ptxas's spills differ between versions
(session 13: NVRTC 13.0 spilled 32 bytes in a float32 softmax kernel that 13.5 builds with
8, and the kernel wrote 7% more to L2). To see what the GPU machine builds, load pip's
nvidia-cuda-nvrtc of its version in front of ours:

    python -m venv /tmp/nv && /tmp/nv/bin/pip install "nvidia-cuda-nvrtc==13.0.*"
    L=/tmp/nv/lib/python3.*/site-packages/nvidia/cu13/lib
    GPURT_CACHE_DIR=/tmp/c130 LD_LIBRARY_PATH=$L \\
        LD_PRELOAD="$L/libnvrtc.so.13 $L/libnvrtc-builtins.so.13.0" \\
        python benchmarks/ptxas_spills.py [--only gemm|softmax]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from cuda.bindings import nvrtc

import gpurt

SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
CHUNK = 40  # name expressions per NVRTC program


def spills(source: str, names: list[str], arch: str, program: str,
           headers: dict | None = None) -> Iterator[tuple[str, str]]:
    """(name, ptxas's spill line) of each of ``names`` that spills."""
    for i in range(0, len(names), CHUNK):
        module = gpurt.compile(source, options=("--ptxas-options=-v",), arch=arch,
                               name_expressions=names[i:i + CHUNK], program_name=program,
                               **({"headers": headers} if headers else {}))
        by_symbol = {symbol: name for name, symbol in module.lowered_names.items()}
        current = None
        for line in module.log.splitlines():
            if "Function properties for" in line:
                current = by_symbol.get(line.rsplit(" ", 1)[-1], line.rsplit(" ", 1)[-1])
            found = SPILL.search(line)
            if found and found.groups() != ("0", "0") and current:
                yield current, found.group(0)


def gemm() -> Iterator[tuple[str, str]]:
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    by_source: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for source, names, arch in launch.programs("sm_90a"):
        by_source[source, arch].update(names)
    for (source, arch), names in sorted(by_source.items()):
        yield from spills(launch.text(source), sorted(names), arch, source,
                          launch.headers(source))


def softmax() -> Iterator[tuple[str, str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    every_variant = importlib.import_module("test_softmax").every_variant
    sm = importlib.import_module("gpurt.kernels.softmax")
    names = sorted({n for v in every_variant() for n in v.names()})
    yield from spills(sm.source(), names, "sm_90", "softmax.cu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("gemm", "softmax"))
    args = parser.parse_args()
    print(f"NVRTC {'.'.join(map(str, nvrtc.nvrtcVersion()[1:]))}", flush=True)
    for kind, walk in (("gemm", gemm), ("softmax", softmax)):
        if args.only in (None, kind):
            for name, line in walk():
                print(f"{kind}: {name}: {line}", flush=True)


if __name__ == "__main__":
    main()
