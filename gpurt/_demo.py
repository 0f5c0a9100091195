"""``gpurt demo``: a short tour of gpurt that a new user runs first on a GPU machine.

The tour is a list of :class:`Step`; a step without ``run`` is announced but not run yet
(the full tour lands with the runtime modules). Without a GPU the tour is described, not run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from ._driver import CudaError
from .device import current_device, get_arch, get_device_name, init, is_available, mem_get_info

__all__ = ["STEPS", "Step", "run"]


@dataclasses.dataclass(frozen=True)
class Step:
    """One stop of the tour: a title, what it shows, and the code that shows it."""

    title: str
    what: str
    run: Callable[[Console], None] | None = None


def _pick_device(console: Console) -> None:
    index = current_device()
    free, total = mem_get_info(index)
    console.print(
        f"gpurt.current_device() = {index}: {escape(get_device_name(index))} "
        f"({get_arch(index)}), {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"
    )


STEPS: list[Step] = [
    Step("Pick a device", "current_device, get_device_name, mem_get_info", _pick_device),
    Step("Allocate arrays", "device arrays from numpy through the caching allocator"),
    Step("Compile a kernel", "NVRTC for the device's exact architecture, with the disk cache"),
    Step("Streams and events", "launch on two streams and time the kernels with events"),
    Step("CUDA graphs", "capture an inference-style softmax(x @ w) loop and replay it"),
    Step("Memory statistics", "memory_stats and memory_summary of everything above"),
    Step("Profile", "NVTX ranges around each step and the device-timed profile table"),
]


def _describe(console: Console, reason: str) -> None:
    tour = "\n".join(f"  {i}. {s.title}: {s.what}" for i, s in enumerate(STEPS, 1))
    console.print(
        Panel(
            f"[red]no GPU here:[/red] {escape(reason)}\n\n"
            f"On a GPU machine the demo runs this tour:\n{tour}\n\n"
            "What runs here: [bold]gpurt info[/bold], and compiling kernels ahead of time "
            "with [bold]gpurt compile FILE.cu --arch sm_90[/bold].",
            title="gpurt demo",
            title_align="left",
        )
    )


def run(console: Console) -> int:
    """Run the tour (or describe it where there is no GPU); returns the exit code."""
    try:
        init()
    except CudaError as exc:
        _describe(console, str(exc))
        return 0
    if not is_available():
        _describe(console, "the driver found no CUDA device")
        return 0
    for i, step in enumerate(STEPS, 1):
        console.rule(f"{i}. {step.title}", align="left")
        if step.run is None:
            console.print(f"[dim]not in the tour yet: {escape(step.what)}[/dim]")
        else:
            step.run(console)
    return 0
