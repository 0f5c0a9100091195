"""NVTX range cost with no tool attached, and what profile() adds per range and per launch.

Rows (host time, median, in this process):
  push+pop        gpurt.nvtx.range_push + range_pop vs torch.cuda.nvtx (~0.27 us on the
                  device machine) and the nvtx package's push_range + pop_range,
  with range      a `with gpurt.nvtx.range(msg):` block (a prebuilt one, and one made per use),
  mark, start+end the other calls,
and on a GPU: a push+pop range and a 1-argument kernel launch, without and with
gpurt.profiler.profile() active (device events recorded on the current stream).

    python benchmarks/bench_nvtx.py [--json PATH]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from _common import host_us, peer, print_rows, write_results

KERNEL = r"""
extern "C" __global__ void noop(int n) {}
"""


def row(what: str, library: str, fn: Callable[[], Any], **kw: Any) -> dict[str, Any]:
    return {"what": what, "library": library, "host_us": host_us(fn, **kw)}


def nvtx_rows() -> list[dict[str, Any]]:
    import gpurt

    nvtx = gpurt.nvtx
    prebuilt = nvtx.range("step")

    def with_prebuilt() -> None:
        with prebuilt:
            pass

    def with_new() -> None:
        with nvtx.range("step {}", 1):
            pass

    rows = [
        row("push+pop", "gpurt", lambda: (nvtx.range_push("step"), nvtx.range_pop())),
        row("with range (prebuilt)", "gpurt", with_prebuilt),
        row("with range('step {}', 1)", "gpurt", with_new),
        row("mark", "gpurt", lambda: nvtx.mark("m")),
        row("start+end", "gpurt", lambda: nvtx.range_end(nvtx.range_start("s"))),
    ]
    package = peer("nvtx")
    if package is not None:
        rows.append(row("push+pop", "nvtx package",
                        lambda: (package.push_range("step"), package.pop_range())))
    torch = peer("torch")
    if torch is not None:
        tn = torch.cuda.nvtx
        rows.append(row("push+pop", "torch.cuda.nvtx",
                        lambda: (tn.range_push("step"), tn.range_pop())))

        def torch_with() -> None:
            with tn.range("step {}", 1):
                pass

        rows.append(row("with range('step {}', 1)", "torch.cuda.nvtx", torch_with))
    return rows


def profiled_rows() -> list[dict[str, Any]]:
    """Range and launch cost with and without an active profile (needs a GPU)."""
    import gpurt

    if not gpurt.is_available():
        return []
    nvtx = gpurt.nvtx
    kernel = gpurt.compile(KERNEL)["noop"]
    args = (1,)

    def launch() -> None:
        kernel(1, 32, args)

    # every profiled range/launch keeps its events until the profile ends: keep samples short
    settings = {"number": 200, "repeat": 9, "warmup": 50}
    rows = [
        row("push+pop, no profile", "gpurt", lambda: (nvtx.range_push("r"), nvtx.range_pop()),
            **settings),
        row("kernel launch, no profile", "gpurt", launch, **settings),
    ]
    with gpurt.profiler.profile(print_table=False):
        rows.append(row("push+pop, in profile()", "gpurt",
                        lambda: (nvtx.range_push("r"), nvtx.range_pop()), **settings))
        rows.append(row("kernel launch, in profile()", "gpurt", launch, **settings))
    gpurt.synchronize()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write results here (default: $GPURT_BENCH_OUT/nvtx.json)")
    args = parser.parse_args()
    rows = nvtx_rows() + profiled_rows()
    print_rows("NVTX and profiler overhead (host us, median)", rows)
    write_results("nvtx", rows, args.json)


if __name__ == "__main__":
    main()
