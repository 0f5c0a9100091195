"""The main loop of gemm_simt kernels in SASS (CPU only): each name compiled by NVRTC to an
sm_90 cubin (kernels/ as gemm compiles it), disassembled by nvdisasm (``--nvdisasm``, else
on PATH; pip's nvidia-cuda-nvdisasm carries one), and for each kernel the loop with the most
FFMAs: its length, FFMA share, other instructions by opcode, and FFMAs whose three source
registers (reuse-cached ones left out) share one register bank (register number parity,
Volta's two banks; not documented for Hopper).

    python benchmarks/simt_sass.py "gemm_simt<64, 128, 8, 8, 4, true, false, true>" ...
        [--nvdisasm PATH] [--dump FILE.sass] [--usage]

``--usage`` prints ptxas's registers / spill lines for each name (NVRTC's -v log).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cuda.bindings import nvrtc

launch = importlib.import_module("gpurt.kernels._gemm_launch")


def _check(result: tuple) -> tuple:
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC: {result[0]}")
    return result[1:]


def cubin(names: list[str], arch: str = "sm_90", source: str = "gemm_simt.cu",
          usage: bool = False) -> bytes:
    headers = {key: launch.text(key.removeprefix("./")) for key in launch.headers(source)}
    (prog,) = _check(nvrtc.nvrtcCreateProgram(
        launch.text(source).encode(), source.encode(), len(headers),
        [v.encode() for v in headers.values()], [k.encode() for k in headers]))
    for name in names:
        _check(nvrtc.nvrtcAddNameExpression(prog, name.encode()))
    options = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    options += [b"--ptxas-options=-v"] if usage else []
    ok = nvrtc.nvrtcCompileProgram(prog, len(options), options)[0] == \
        nvrtc.nvrtcResult.NVRTC_SUCCESS
    (size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog))
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    if not ok:
        raise RuntimeError(log.decode())
    if usage:
        print("\n".join(x for x in log.decode().splitlines()
                        if "registers" in x or "spill" in x or "Compiling entry" in x))
    (size,) = _check(nvrtc.nvrtcGetCUBINSize(prog))
    code = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, code)
    return code


def _functions(sass: str) -> dict[str, tuple[list[str], dict[str, int]]]:
    """Each function's instructions (text without address and ';') and label positions."""
    found: dict[str, tuple[list[str], dict[str, int]]] = {}
    current = None
    for line in sass.splitlines():
        match = re.match(r"\s*\.text\.(\S+):", line)
        if match:
            current = found.setdefault(match.group(1), ([], {}))
            continue
        if current is None:
            continue
        match = re.match(r"^(\.L_x_\d+):", line)
        if match:
            current[1][match.group(1)] = len(current[0])
            continue
        match = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if match:
            current[0].append(match.group(1))
    return found


def _opcode(ins: str) -> str:
    words = ins.split()
    return words[1] if words[0].startswith("@") else words[0]


def main_loop(ins: list[str], labels: dict[str, int]) -> list[str]:
    """The backward branch's body holding the most FFMAs."""
    best: list[str] = []
    for end, text in enumerate(ins):
        match = re.search(r"BRA `\((\.L_x_\d+)\)", text)
        if match and labels[match.group(1)] <= end:
            body = ins[labels[match.group(1)]:end + 1]
            if sum("FFMA" in x for x in body) > sum("FFMA" in x for x in best):
                best = body
    return best


def same_bank_ffmas(body: list[str]) -> int:
    """FFMAs whose source registers read from the register file all have one parity."""
    count, previous = 0, None
    for text in body:
        if _opcode(text) != "FFMA":
            previous = None
            continue
        sources = [s.strip() for s in text.split(None, 1)[1].split(",")[1:]]
        parsed = [re.match(r"R(\d+)(\.reuse)?", s) for s in sources]
        read = [int(m.group(1)) % 2 for slot, m in enumerate(parsed)
                if m and not (previous and previous[slot] and previous[slot][0] == m.group(1)
                              and previous[slot][1])]
        count += len(read) == 3 and len(set(read)) == 1
        previous = [(m.group(1), bool(m.group(2))) if m else None for m in parsed]
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+")
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm"))
    parser.add_argument("--dump", default=None)
    parser.add_argument("--usage", action="store_true")
    args = parser.parse_args()
    if not args.nvdisasm:
        print("no nvdisasm (pip install nvidia-cuda-nvdisasm, or --nvdisasm PATH)")
        return 1
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin(args.names, usage=args.usage))
        f.flush()
        sass = subprocess.run([args.nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    if args.dump:
        Path(args.dump).write_text(sass)
    for name, (ins, labels) in _functions(sass).items():
        body = main_loop(ins, labels)
        ffma = sum(_opcode(x) == "FFMA" for x in body)
        others = collections.Counter(_opcode(x) for x in body if _opcode(x) != "FFMA")
        print(f"{name}: loop {len(body)} instructions, {ffma} FFMA "
              f"({ffma / max(1, len(body)):.3f}), {same_bank_ffmas(body)} FFMA on one bank")
        print("   ", ", ".join(f"{op} {n}" for op, n in others.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
