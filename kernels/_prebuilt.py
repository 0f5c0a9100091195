"""The bundled kernels prebuilt: the archive gpurt.kernels finds at import, and its builder.

``gpurt build-kernels --arch sm_80,sm_90a,sm_100`` compiles every program the GEMM and
softmax heuristics and tuner can choose (enumerated from their code: each config of
``_gemm_tune.all_configs`` in each layout, each softmax ``Variant`` ``choose_variant`` can
return for the architecture) into one archive (gpurt/_nvrtc/archive.py), with the default
GEMM tuning table (the JSON results files given, by default kernels/tuning/*.json). At
import gpurt.kernels registers the archive (``GPURT_PREBUILT``: another file, or 0 for
none; default prebuilt.gpak next to this module) with ``gpurt.nvrtc.add_prebuilt``:
gpurt.compile then takes matching programs from it and JIT-compiles only what is missing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
from cuda.bindings import nvrtc as _nvrtc

import gpurt
import gpurt.nvrtc
from gpurt._nvrtc import archive as _archive
from gpurt._nvrtc import prebuilt as _registry

from . import _gemm_launch as gemm_launch
from . import _gemm_tuner as tuner
from . import _softmax_plan as softmax_plan

__all__ = ["archive_path", "register", "tuning_defaults", "requests", "build", "report", "main"]

ARCHIVE_NAME = "prebuilt.gpak"
TUNING_TABLE = "gemm-tune-v1"
_HERE = pathlib.Path(__file__).resolve().parent
_SOFTMAX_BATCH = 8  # softmax variants per NVRTC program (found by subset at run time)

Request = tuple[str, tuple[str, ...], str]  # (program name, name expressions, arch)


def archive_path() -> str | None:
    """The archive in use: ``GPURT_PREBUILT`` (a path; 0/off/none: no archive), else the
    package's prebuilt.gpak where it exists."""
    value = os.environ.get("GPURT_PREBUILT", "").strip()
    if value.lower() in ("0", "off", "none", "false", "no"):
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    path = _HERE / ARCHIVE_NAME
    return str(path) if path.is_file() else None


def register() -> None:
    """Register the archive in use with gpurt.compile (reads nothing until first needed)."""
    path = archive_path()
    if path is not None:
        gpurt.nvrtc.add_prebuilt(path)


def tuning_defaults() -> dict[str, dict[str, Any]]:
    """The default GEMM tuning results of the registered archives (checked like a results
    file; malformed entries are left out)."""
    found = _registry.table(TUNING_TABLE)
    if not isinstance(found, dict):
        return {}
    return tuner.parse_results({"schema": tuner.SCHEMA, "results": found})


# ---- what to build ----------------------------------------------------------------------------


def _plain(arch: str) -> str:
    """'sm_90' for 'sm_90a': the architecture gpurt.get_arch() reports."""
    return "sm_" + "".join(ch for ch in arch[3:] if ch.isdigit())


def softmax_variants(arch: str) -> list[softmax_plan.Variant]:
    """Every softmax Variant choose_variant returns on ``arch`` for 16-byte aligned arrays
    (what gpurt, torch and CuPy allocate): each dtype and op, for row lengths around every
    power of two (its thresholds are all powers of two in vectors), with the access width
    and edges row_access gives them, for many rows and for one (smaller ticket chunks), and
    the split that stands in where a row's ticket chunks do not fit the device (and the
    forms that stand in for softmax_ends and the persistent chunks in launches of one wave:
    Variant.launch_forms).
    Misaligned views compile their variants at first use."""
    clusters = int(_plain(arch)[3:]) >= 90
    found: dict[softmax_plan.Variant, None] = {}
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        size = np.dtype(dtype).itemsize
        for op in range(4):
            for power in range(25):
                for offset in range(-9, 10):
                    cols = (1 << power) * (16 // size) + offset
                    if cols < 1:
                        continue
                    vec, edges = softmax_plan.row_access(cols, size)
                    for rows, tickets in ((None, True), (1, True), (None, False)):
                        found[softmax_plan.choose_variant(
                            cols, dtype, op, vec=vec, edges=edges, clusters=clusters,
                            rows=rows, tickets=tickets)] = None
    for variant in list(found):
        found.update(dict.fromkeys(variant.launch_forms()))
    return list(found)


def requests(arch: str) -> list[Request]:
    """The programs to build for ``arch``: softmax variants in batches (the longest
    compiles, first), then GEMM programs (each at the arch gemm compiles it for, sm_90a
    for wgmma)."""
    found: list[Request] = []
    variants = softmax_variants(arch)
    for start in range(0, len(variants), _SOFTMAX_BATCH):
        names = tuple(n for v in variants[start:start + _SOFTMAX_BATCH] for n in v.names())
        found.append(("softmax.cu", names, _plain(arch)))
    return found + [(source, names, target)
                    for source, names, target in gemm_launch.programs(arch)]


def _compile(request: Request) -> tuple[Request, str, bytes, dict[str, str]] | str:
    """Build one request: (request, key, cubin, lowered names), or the error's text."""
    program, names, arch = request
    try:
        if program == "softmax.cu":
            source = softmax_plan.source_text()
            headers: dict[str, str] = {}
        else:
            source = gemm_launch.text(program)
            headers = gemm_launch.headers(program)
        key, entry = gpurt.nvrtc.prebuild(source, (), names, headers, arch=arch,
                                          program_name=program)
    except Exception as exc:  # a variant NVRTC cannot build for this arch: reported, skipped
        return f"{program} {arch} {names[0]}: {str(exc).splitlines()[0]}"
    return request, key, entry.binary, dict(entry.lowered)


def supported(arch: str) -> bool:
    """Whether this NVRTC can target ``arch``."""
    archs = gpurt.check(_nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    return int(_plain(arch)[3:]) in {int(a) for a in archs}


def _tables(tuning: Sequence[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for path in tuning:
        results.update(tuner.read_results(path))
    return {TUNING_TABLE: results} if results else {}


def build(archs: Sequence[str], output: str, jobs: int | None = None,
          tuning: Sequence[str] = (), limit: int | None = None,
          say: Any = print) -> dict[str, Any]:
    """Build the archive for ``archs`` into ``output`` with ``jobs`` processes; ``limit``
    builds only the first programs of each arch (tests). Returns a summary. The tuning
    files are read first: OSError/ValueError for one that is not a results file."""
    tables = _tables(tuning)
    todo: list[Request] = []
    skipped = []
    for arch in archs:
        if not supported(arch):
            skipped.append(arch)
            say(f"skipping {arch}: this NVRTC cannot target it")
            continue
        todo += requests(arch)[:limit]
    started = time.monotonic()
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo) or 1))
    if jobs == 1:
        results = [_compile(r) for r in todo]
    else:
        context = multiprocessing.get_context("spawn")  # a fork would copy a CUDA context
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            results = list(pool.map(_compile, todo, chunksize=1))
    programs, failed = [], [r for r in results if isinstance(r, str)]
    for result in results:
        if not isinstance(result, str):
            (program, _, arch), key, binary, lowered = result
            programs.append((_archive.Program(key, arch, program, lowered), binary))
    meta = {"gpurt": gpurt.__version__, "archs": [a for a in archs if a not in skipped],
            "nvrtc": list(gpurt.check(_nvrtc.nvrtcVersion(), "nvrtcVersion")),
            "source_digest": gemm_launch.source_digest()}
    size = _archive.write_archive(output, programs, tables, meta)
    for line in failed:
        say(f"not built: {line}")
    return {"programs": len(programs), "failed": len(failed), "skipped_archs": skipped,
            "bytes": size, "seconds": round(time.monotonic() - started, 1), "output": output}


# ---- reporting and the command -------------------------------------------------------------


def report(arch: str | None = None, device_name: str | None = None) -> dict[str, Any]:
    """What the registered archive holds for ``arch`` (programs by source; tuning entries
    for ``device_name``), for ``gpurt info``."""
    path = archive_path()
    if path is None:
        return {"archive": None}
    try:
        archive = _registry.add_archive(path)
        programs = archive.programs()
        meta = archive.meta()
        table = archive.table(TUNING_TABLE)
    except (OSError, ValueError) as exc:
        return {"archive": path, "error": str(exc)}
    wanted = None if arch is None else {arch, arch + "a"}
    counts: dict[str, int] = {}
    for program in programs:
        if wanted is None or program.arch in wanted:
            counts[program.program] = counts.get(program.program, 0) + 1
    tuned = sum(1 for key in (table or {}) if device_name and key.startswith(device_name + "|"))
    return {"archive": path, "archs": meta.get("archs", []), "programs": counts,
            "source_current": meta.get("source_digest") == gemm_launch.source_digest(),
            "tuned_problems": tuned}


def _default_tuning() -> list[str]:
    folder = _HERE / "tuning"
    return sorted(str(p) for p in folder.glob("*.json")) if folder.is_dir() else []


def main(argv: Sequence[str] | None = None) -> int:
    """``gpurt build-kernels``: write the prebuilt archive."""
    parser = argparse.ArgumentParser(prog="gpurt build-kernels", description=(
        "compile the bundled kernels (every GEMM and softmax variant their heuristics can "
        "choose) for the given architectures into one archive that gpurt.kernels loads "
        "instead of compiling; needs no GPU"))
    parser.add_argument("--arch", default=os.environ.get("GPURT_BUILD_KERNELS") or None,
                        help="comma-separated architectures, e.g. sm_80,sm_90a,sm_100 "
                        "(default: $GPURT_BUILD_KERNELS)")
    parser.add_argument("-o", "--output", default=str(_HERE / ARCHIVE_NAME),
                        help="the archive to write (default: the installed package's)")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="compiler processes (default: one per CPU)")
    parser.add_argument("--tuning", action="append", default=None, metavar="FILE",
                        help="a GEMM tuning results file for the default table, repeatable "
                        "(default: kernels/tuning/*.json)")
    parser.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.arch:
        parser.error("give --arch (or set GPURT_BUILD_KERNELS), e.g. --arch sm_80,sm_90a,sm_100")
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    for arch in archs:
        if not arch.startswith("sm_") or not arch[3:].removesuffix("a").isdigit():
            parser.error(f"invalid architecture {arch!r}: expected e.g. sm_80, sm_90a, sm_100")
    tuning = _default_tuning() if args.tuning is None else args.tuning
    try:
        summary = build(archs, args.output, args.jobs, tuning, args.limit,
                        say=lambda line: print(line, file=sys.stderr))
    except (OSError, ValueError) as exc:
        print(f"gpurt build-kernels: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0 if summary["programs"] else 1
