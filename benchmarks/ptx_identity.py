"""PTX identity of the GEMM kernels against a git revision (s8-common-gemm.md's check; CPU only):
every name of ``_gemm_launch.programs(arch)`` in the given sources is compiled by NVRTC
(compute_90a or the arch's virtual one, -std=c++17) once from the revision's kernels/ and once
from the working tree's, and each whole ``.entry`` is compared after normalising
``_cu_<hash>_<n>``, branch-label numbering and whitespace. Prints the names that differ.

    python benchmarks/ptx_identity.py REV [SOURCE ...] [--arch sm_90a] [--exclude TEXT ...]
        [--own-name]

``--exclude`` drops the names that contain TEXT (e.g. instantiations REV cannot compile).
``--own-name`` compares each entry with the entries' mangled names (and parameters') replaced:
a template value added with a default changes every instantiation's name, not its code.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import re
import subprocess
import sys

from cuda.bindings import nvrtc

launch = importlib.import_module("gpurt.kernels._gemm_launch")
WGMMA_FAMILY = ("gemm_wgmma.cu", "gemm_wgmma_tf32.cu", "gemm_decode.cu")


def _revision_text(rev: str, name: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:kernels/{name}"], capture_output=True,
                          text=True, check=True).stdout


def _check(result: tuple) -> tuple:
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC: {result[0]}")
    return result[1:]


def entries(texts: dict[str, str], source: str, names: list[str], arch: str,
            own_name: bool = False) -> dict[str, str]:
    """Each name's normalised .entry text, compiled from ``texts`` (file name -> text);
    ``own_name``: with the entries' mangled names replaced by ENTRY."""
    headers = {key: texts[key.removeprefix("./")] for key in launch.headers(source)}
    (prog,) = _check(nvrtc.nvrtcCreateProgram(
        texts[source].encode(), source.encode(), len(headers),
        [v.encode() for v in headers.values()], [k.encode() for k in headers]))
    for name in names:
        _check(nvrtc.nvrtcAddNameExpression(prog, name.encode()))
    options = [f"--gpu-architecture=compute_{arch[3:]}".encode(), b"-std=c++17"]
    result = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        (size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(log.decode())
    lowered = {name: _check(nvrtc.nvrtcGetLoweredName(prog, name.encode()))[0].decode()
               for name in names}
    (size,) = _check(nvrtc.nvrtcGetPTXSize(prog))
    ptx = b" " * size
    nvrtc.nvrtcGetPTX(prog, ptx)
    found = {}
    for chunk in re.split(r"\n(?=\.(?:visible|weak) \.entry )", ptx.decode())[1:]:
        match = re.match(r"\.(?:visible|weak) \.entry (\S+?)\(", chunk)
        assert match is not None
        body = re.sub(r"_cu_[0-9a-f]{8}_[0-9]+", "_cu_", chunk)
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", body)
        found[match.group(1)] = " ".join(body.split())
    if own_name:  # each chunk also names the next entry (its .globl line)
        for mangled in sorted(lowered.values(), key=len, reverse=True):
            found = {key: body.replace(mangled, "ENTRY") for key, body in found.items()}
    return {name: found[lowered[name]] for name in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--exclude", action="append", default=[])
    parser.add_argument("--own-name", action="store_true")
    parser.add_argument("sources", nargs="*", default=list(WGMMA_FAMILY))
    args = parser.parse_args()
    programs = collections.defaultdict(set)
    for source, names, _ in launch.programs(args.arch):
        programs[source].update(names)
    files = {"gemm_common.cu", "gemm_wgmma.cu", *args.sources}
    new = {name: launch.text(name) for name in files}
    old = {name: _revision_text(args.rev, name) for name in files}
    total = differ = 0
    for source in args.sources:
        names = sorted(n for n in programs[source] if not any(x in n for x in args.exclude))
        before = entries(old, source, names, args.arch, args.own_name)
        after = entries(new, source, names, args.arch, args.own_name)
        for name in names:
            total += 1
            if before[name] != after[name]:
                differ += 1
                print(f"DIFF {source} {name}")
        print(f"{source}: {len(names)} names compared", flush=True)
    print(f"{total} names, {differ} differ from {args.rev}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
