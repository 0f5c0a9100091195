"""The ``gpurt`` command (also ``python -m gpurt``): info, compile, build-kernels, memviz, demo,
bench."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from . import nvrtc
from ._cli import demo as _demo
from ._cli import info as _info
from ._core.driver import CudaError
from .device import get_arch, is_available

__all__ = ["main"]

_ARCH = re.compile(r"^(sm|compute)_(\d+[af]?)$")
_BENCH_SCRIPT = Path("benchmarks") / "run_all.py"


def _fail(message: str, code: int = 2) -> int:
    print(f"gpurt: {message}", file=sys.stderr)
    return code


def _cmd_info(args: argparse.Namespace) -> int:
    report = _info.collect()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _info.render(report, Console(highlight=False))
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    source = Path(args.file)
    if not source.is_file():
        return _fail(f"compile: no such file: {source}")
    arch = args.arch
    if arch is None:
        if not is_available():
            return _fail("compile: no GPU here to take the architecture from; "
                         "pass --arch (e.g. --arch sm_90)")
        arch = get_arch()
    archs = [a.strip() for a in arch.split(",") if a.strip()]
    bad = [a for a in archs if _ARCH.match(a) is None]
    if bad or not archs:
        return _fail(f"compile: invalid --arch {arch!r}: expected e.g. sm_90, sm_90a, compute_90 "
                     "or a list such as sm_80,sm_90a,sm_100")
    if len(archs) > 1:
        return _compile_fatbin(source, archs, args)
    match = _ARCH.match(arch)
    assert match is not None
    output = args.output
    if args.ptx:
        arch = f"compute_{match.group(2)}"
        output = output or str(source.with_suffix(".ptx"))
    options = [*args.option, *args.nvrtc_options]
    try:
        written = nvrtc.compile_file(str(source), arch, options, output)
    except CudaError as exc:  # gpurt.CompileError (with the log) or an NVRTC failure
        print(str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        return _fail(f"compile: {exc}", 1)
    print(f"wrote {written} ({arch})")
    return 0


def _compile_fatbin(source: Path, archs: list[str], args: argparse.Namespace) -> int:
    """gpurt compile --arch a,b,c: one fatbin (with PTX of the newest for --ptx)."""
    try:
        written = nvrtc.compile_file(str(source), archs, [*args.option, *args.nvrtc_options],
                                     args.output, ptx=args.ptx)
    except CudaError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        return _fail(f"compile: {exc}", 1)
    print(f"wrote {written} (fatbin: {', '.join(archs)}{' + PTX' if args.ptx else ''})")
    return 0


def _cmd_memviz(argv: list[str]) -> int:
    # Imported on use: the renderer is needed by this subcommand only.
    try:
        from . import memviz
    except ImportError as exc:
        return _fail(f"memviz is not available: {exc}", 1)
    return int(memviz.memviz_main(argv) or 0)


def _cmd_demo(args: argparse.Namespace) -> int:
    return _demo.run(Console(highlight=False))


def _find_bench_script() -> Path | None:
    """benchmarks/run_all.py of the current directory, else of gpurt's source checkout;
    only of a gpurt checkout (never a script that happens to sit in some folder)."""
    for root in (Path.cwd(), Path(__file__).resolve().parent.parent):
        script = root / _BENCH_SCRIPT
        if script.is_file() and _is_gpurt_checkout(root):
            return script
    return None


def _is_gpurt_checkout(root: Path) -> bool:
    """True for a folder with gpurt's pyproject.toml and its gpurt/ package."""
    try:
        project = (root / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    named = re.search(r'^name\s*=\s*"gpurt"\s*$', project, re.M) is not None
    return named and (root / "gpurt" / "__init__.py").is_file()


def _cmd_build_kernels(argv: list[str]) -> int:
    # The bundled kernels sit above this module (gpurt.kernels): imported by name on use,
    # as the demo does, so that `gpurt` works where they are not installed.
    try:
        prebuilt = importlib.import_module("gpurt.kernels._prebuilt")
    except ImportError as exc:
        return _fail(f"build-kernels: gpurt.kernels is not installed: {exc}", 1)
    return int(prebuilt.main(argv))


def _cmd_bench(argv: list[str]) -> int:
    script = _find_bench_script()
    if script is None:
        return _fail("bench: benchmarks/run_all.py of a gpurt checkout not found; the "
                     "benchmarks ship with the source tree, not the wheel: run this from a "
                     "gpurt checkout (a folder with gpurt's pyproject.toml)")
    return subprocess.call([sys.executable, str(script), *argv])


# Commands whose arguments all belong to the program they hand over to (so `--help` and
# options go through untouched): name -> (handler, help).
_PASSTHROUGH: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "memviz": (_cmd_memviz, ("render a memory snapshot: memviz SNAPSHOT -o out.html "
                             "[--png out.png]")),
    "build-kernels": (_cmd_build_kernels, ("compile the bundled kernels for --arch "
                                           "sm_80,sm_90a,... into the prebuilt archive "
                                           "gpurt.kernels loads instead of compiling")),
    "bench": (_cmd_bench, ("run the benchmark suites (benchmarks/run_all.py) on the GPU; "
                           "arguments go to run_all.py")),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpurt", description="torch.cuda's runtime layer without torch."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int],
                text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.set_defaults(handler=handler)
        return cmd

    info = command("info", _cmd_info, "report versions, the driver, NVRTC and every GPU")
    info.add_argument("--json", action="store_true", help="print one JSON object")

    comp = command("compile", _cmd_compile, "compile a CUDA C++ file to a cubin (or PTX) "
                   "with NVRTC; works without a GPU when --arch is given")
    comp.add_argument("file", help="the .cu source file")
    comp.add_argument("--arch", help="target, e.g. sm_90, sm_90a (default: this machine's GPU); "
                      "a list such as sm_80,sm_90a,sm_100 makes a fatbin")
    comp.add_argument("-o", "--output", help="output file (default: next to the source)")
    comp.add_argument("--ptx", action="store_true", help="emit PTX for compute_XX instead "
                      "(with a list: add PTX of the newest to the fatbin)")
    comp.add_argument("-O", "--option", action="append", default=[], metavar="OPT",
                      help="an NVRTC option, repeatable; write -O=-lineinfo for options "
                      "that start with a dash, or put NVRTC options after --")

    command("demo", _cmd_demo, "a short tour of gpurt on this machine's GPU")
    for name, (_, text) in _PASSTHROUGH.items():
        sub.add_parser(name, help=text)  # listed here, dispatched by main() before parsing
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpurt`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _PASSTHROUGH:
        handler, _ = _PASSTHROUGH[argv[0]]
        return int(handler(argv[1:]))
    # NVRTC options after "--" belong to compile (argparse would take them for its own).
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = _parser()
    args = parser.parse_args(argv)
    if extra and args.command != "compile":
        parser.error(f"unexpected arguments after --: {' '.join(extra)}")
    args.nvrtc_options = extra
    if args.command is None:
        parser.print_help()
        return 0
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
