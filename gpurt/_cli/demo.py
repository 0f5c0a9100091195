"""``gpurt demo``: a short tour of gpurt that a new user runs first on a GPU machine.

The tour is a list of :class:`Step` s run in order inside one ``gpurt.profiler.profile()``,
each inside an NVTX range; the last step prints that profile. Every result is compared with
numpy (float64 references on fresh random inputs) and reported as PASS or FAIL; the exit
code is 0 when every check passed. Without a GPU the tour is described, and what works
there is shown: compiling the tour's kernels for sm_90 ahead of time into the kernel cache.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .. import nvtx, profiler
from .._core.driver import CudaError
from .._nvrtc.cache import cache_dir
from ..array import Array, asarray, empty, zeros
from ..device import (
    current_device,
    device_count,
    get_arch,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    mem_get_info,
)
from ..graphs import CUDAGraph, graph
from ..memory import (
    empty_cache,
    max_memory_allocated,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
)
from ..nvrtc import Module, compile
from ..streams import Event, Stream, current_stream
from . import demo_kernels as _demo_kernels

# The bundled kernels (the top-level kernels/ folder, installed as gpurt.kernels). Any
# failure to import them, not only ImportError, must leave the `gpurt` command working:
# the tour then uses its own kernels and says why.
try:
    _bundled_gemm = importlib.import_module("gpurt.kernels.gemm").gemm
except Exception as exc:  # noqa: BLE001
    _bundled_gemm, _NO_GEMM = None, f"{type(exc).__name__}: {exc}"
else:
    _NO_GEMM = ""
try:
    _bundled_softmax = importlib.import_module("gpurt.kernels.softmax").softmax
except Exception as exc:  # noqa: BLE001
    _bundled_softmax, _NO_SOFTMAX = None, f"{type(exc).__name__}: {exc}"
else:
    _NO_SOFTMAX = ""

__all__ = ["STEPS", "Step", "Tour", "run"]

AHEAD_OF_TIME_ARCH = "sm_90"
STREAM_ELEMENTS = 1 << 24  # floats per array in the streams step (64 MiB)
LAYER = (64, 1024, 4096)  # batch, inputs, outputs of the graph step's softmax(x @ w)
_MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Check:
    step: str
    what: str
    ok: bool
    detail: str


class Tour:
    """What the steps share: the console, the checks so far, random inputs, the compiled
    kernels, the profile and the captured graph."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.checks: list[Check] = []
        self.step = ""
        self.rng = np.random.default_rng()
        self.profile: profiler.Profile | None = None
        self.graph: CUDAGraph | None = None
        self.saxpy_launches = 0
        self._module: Module | None = None

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        """Record and print one PASS/FAIL line."""
        self.checks.append(Check(self.step, what, bool(ok), detail))
        mark = "[bold green]PASS[/bold green]" if ok else "[bold red]FAIL[/bold red]"
        extra = f" [dim]({escape(detail)})[/dim]" if detail else ""
        self.console.print(f"  {mark} {escape(what)}{extra}")
        return bool(ok)

    def close(self, what: str, got: np.ndarray, want: np.ndarray, rtol: float,
              atol: float) -> bool:
        """Check ``got`` against the float64 reference ``want`` elementwise."""
        if got.shape != want.shape:
            return self.check(what, False, f"shape {got.shape}, expected {want.shape}")
        err = np.abs(got.astype(np.float64) - want)
        ok = bool(np.all(np.isfinite(got)) and np.all(err <= atol + rtol * np.abs(want)))
        return self.check(what, ok, f"max abs error {float(err.max(initial=0.0)):.1e}")

    def say(self, text: str) -> None:
        self.console.print(f"  {text}")

    def code(self, text: str) -> None:
        self.console.print(Text("  >>> " + text, style="cyan"))

    def kernels(self) -> Module:
        """The tour's kernels (_demo_kernels.SOURCE), compiled once for this device."""
        if self._module is None:
            self._module = compile(_demo_kernels.SOURCE, program_name="gpurt_demo.cu")
        return self._module

    def saxpy(self, grid: int, a: float, x: Array, y: Array) -> None:
        self.kernels()["saxpy"](grid, 256, (a, x, y, x.size))
        self.saxpy_launches += 1


@dataclasses.dataclass(frozen=True)
class Step:
    """One stop of the tour: a title, what it shows, and the code that shows it."""

    title: str
    what: str
    run: Callable[[Tour], None]


def _softmax64(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def _kernel_files(directory: str | None) -> set[str]:
    if directory is None or not os.path.isdir(directory):
        return set()
    return {name for name in os.listdir(directory) if name.endswith(".kernel")}


def _mib(n: int) -> str:
    return f"{n / _MiB:.1f} MiB"


# ---- the steps -------------------------------------------------------------------------------


def _pick_device(tour: Tour) -> None:
    index = current_device()
    props = get_device_properties(index)
    free, total = mem_get_info(index)
    tour.code("gpurt.current_device(), gpurt.get_device_properties(), gpurt.mem_get_info()")
    tour.say(f"{device_count()} device(s); using cuda:{index}: [bold]{escape(props.name)}[/bold] "
             f"({get_arch(index)}), {props.multi_processor_count} SMs, "
             f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
    tour.say("[dim]another GPU: gpurt.set_device(1), `with gpurt.device(1):` or "
             "CUDA_VISIBLE_DEVICES[/dim]")
    major, minor = get_device_capability(index)
    tour.check("get_arch() names the compute capability",
               get_arch(index).startswith(f"sm_{major}{minor}"), get_arch(index))
    tour.check("mem_get_info() is within the device's memory",
               0 < free <= total <= props.total_memory, f"{free:,} of {total:,} B free")


def _allocate(tour: Tour) -> None:
    n = 1 << 20
    host = tour.rng.standard_normal(n, dtype=np.float32)
    before = memory_allocated()
    tour.code("x = gpurt.asarray(numpy_array); z = gpurt.zeros(n); e = gpurt.empty((1024, 1024))")
    x = asarray(host)
    z = zeros(n)
    e = empty((1024, 1024))
    tour.say(f"x: {x.shape} {x.dtype} on {x.device}, address 0x{x.ptr:x}")
    tour.check("asarray(numpy) -> to_numpy() round-trips exactly",
               np.array_equal(x.to_numpy(), host))
    tour.check("zeros() is all zeros", not np.any(z.to_numpy()))
    tour.check("empty((1024, 1024)) is C-contiguous float32",
               e.strides == (4096, 4) and e.nbytes == 4 * _MiB and e.is_contiguous())
    grown = memory_allocated() - before
    tour.check("memory_allocated() grew by the arrays' bytes", grown == 3 * 4 * _MiB,
               f"+{grown} B")
    del x, z, e
    tour.check("dropping them gives the bytes back to the cache", memory_allocated() == before)
    tour.say(f"the caching allocator keeps {_mib(memory_reserved())} reserved for the next "
             "allocations; gpurt.empty_cache() would return it to the driver")


def _compile(tour: Tour) -> None:
    directory = cache_dir()
    files_before = _kernel_files(directory)
    tour.code('module = gpurt.compile(source); saxpy = module["saxpy"]')
    t0 = time.perf_counter()
    module = tour.kernels()
    first_ms = (time.perf_counter() - t0) * 1e3
    stored = _kernel_files(directory) - files_before
    how = "compiled by NVRTC and stored in the disk cache" if stored else (
        "found in the disk cache" if directory else "compiled (disk cache off)")
    tour.say(f"{escape(repr(module))}: {how} in {first_ms:.1f} ms")
    t0 = time.perf_counter()
    again = compile(_demo_kernels.SOURCE, program_name="gpurt_demo.cu")
    hit_us = (time.perf_counter() - t0) * 1e6
    tour.say(f"compiling it again is a memory-cache hit: {hit_us:.0f} us; "
             f"disk cache: {escape(str(directory))}")
    tour.check("compiled a cubin for this device's architecture",
               module.kind == "cubin" and module.arch == get_arch() and again is module,
               module.arch)
    saxpy = module["saxpy"]
    tour.say(f"{escape(repr(saxpy))}: {saxpy.num_regs} registers per thread")
    n = (1 << 20) + 3  # not a multiple of the block: the loop's bounds check matters
    x_host = tour.rng.standard_normal(n, dtype=np.float32)
    y_host = tour.rng.standard_normal(n, dtype=np.float32)
    x, y = asarray(x_host), asarray(y_host)
    tour.code("saxpy(grid, 256, (2.5, x, y, n))   # float a, const float* x, float* y, long long n")
    tour.saxpy(4 * get_device_properties().multi_processor_count, 2.5, x, y)
    want = 2.5 * x_host.astype(np.float64) + y_host
    tour.close("saxpy matches numpy", y.to_numpy(), want, rtol=1e-6, atol=1e-6)


def _streams(tour: Tour) -> None:
    n, reps, a = STREAM_ELEMENTS, 10, 0.5
    grid = 4 * get_device_properties().multi_processor_count
    streams = (Stream(), Stream())
    inputs = [(tour.rng.standard_normal(n, dtype=np.float32),
               tour.rng.standard_normal(n, dtype=np.float32)) for _ in streams]
    arrays, timers = [], []
    tour.code("with s1: start.record(); saxpy(...) x10; end.record()   # the same on s2")
    for stream, (x_host, y_host) in zip(streams, inputs):
        with stream:
            tour.check("inside `with stream:` it is the current stream",
                       current_stream().cuda_stream == stream.cuda_stream)
            x, y = asarray(x_host), asarray(y_host)
            start, end = Event(enable_timing=True), Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                tour.saxpy(grid, a, x, y)
            end.record()
        arrays.append((x, y))
        timers.append((start, end))
    s1, s2 = streams
    (_, y1), (_, y2) = arrays
    tour.code("s2.wait_event(s1.record_event()); with s2: saxpy(1.0, y1, y2)   # y2 += y1")
    s2.wait_event(s1.record_event())
    with s2:
        tour.saxpy(grid, 1.0, y1, y2)
    y1.record_stream(s2)  # y1 was used on s2: its memory waits for s2 when freed
    s1.synchronize()
    s2.synchronize()
    for i, (start, end) in enumerate(timers, 1):
        ms = start.elapsed_time(end)
        gbps = reps * 12 * n / (ms * 1e6)
        tour.say(f"stream {i}: {reps} saxpy over {n:,} floats in {ms:.3f} ms ({gbps:.0f} GB/s)")
    want1 = inputs[0][1] + reps * a * inputs[0][0].astype(np.float64)
    want2 = inputs[1][1] + reps * a * inputs[1][0].astype(np.float64) + want1
    tour.close("stream 1 result matches numpy", y1.to_numpy(), want1, rtol=1e-5, atol=1e-5)
    tour.close("stream 2 waited for stream 1: y2 + y1 matches numpy", y2.to_numpy(), want2,
               rtol=1e-5, atol=1e-5)


Forward = Callable[[Array, Array], Array]


def _choose_forward(tour: Tour, x: Array, w: Array, want: np.ndarray) -> tuple[Forward, str]:
    """softmax(x @ w) from gpurt.kernels where they import and run, else the tour's own
    kernels; run once eagerly and checked against numpy."""
    module = tour.kernels()
    matmul: Callable[[Array, Array], Array] = functools.partial(_demo_kernels.matmul, module)
    softmax: Callable[[Array], Array] = functools.partial(_demo_kernels.softmax, module)
    names = ["the demo's matmul", "the demo's softmax"]
    if _bundled_gemm is not None or _bundled_softmax is not None:
        tour.say("[dim]the first run compiles (and tunes) the bundled kernels for this GPU; "
                 "later runs load them from the kernel cache[/dim]")
    if _bundled_gemm is None:
        tour.say(f"[yellow]gpurt.kernels.gemm is not available ({escape(_NO_GEMM)})[/yellow]")
    else:
        try:
            _bundled_gemm(x, w)
            matmul, names[0] = _bundled_gemm, "gpurt.kernels.gemm"
        except Exception as exc:  # noqa: BLE001 - shown, and the tour goes on without it
            tour.say(f"[yellow]gpurt.kernels.gemm failed here: {escape(str(exc))}[/yellow]")
    if _bundled_softmax is None:
        tour.say(f"[yellow]gpurt.kernels.softmax is not available "
                 f"({escape(_NO_SOFTMAX)})[/yellow]")
    else:
        try:
            _bundled_softmax(matmul(x, w))
            softmax, names[1] = _bundled_softmax, "gpurt.kernels.softmax"
        except Exception as exc:  # noqa: BLE001
            tour.say(f"[yellow]gpurt.kernels.softmax failed here: {escape(str(exc))}[/yellow]")

    def forward(inputs: Array, weights: Array) -> Array:
        return softmax(matmul(inputs, weights))

    label = " + ".join(names)
    tour.close(f"eager softmax(x @ w) with {label} matches numpy", forward(x, w).to_numpy(),
               want, rtol=1e-4, atol=1e-6)
    return forward, label


def _graphs(tour: Tour) -> None:
    (batch, d_in, d_out), iters = LAYER, 20
    w_host = (tour.rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(np.float32)
    batches = [tour.rng.standard_normal((batch, d_in), dtype=np.float32) for _ in range(4)]

    def reference(x_host: np.ndarray) -> np.ndarray:
        return _softmax64(x_host.astype(np.float64) @ w_host.astype(np.float64))

    stream = Stream()
    with stream:
        w, x = asarray(w_host), asarray(batches[0])
        forward, label = _choose_forward(tour, x, w, reference(batches[0]))
        tour.code("g = gpurt.CUDAGraph()\n  ... with gpurt.graph(g, stream=s): "
                  "probs = softmax(x @ w)\n  ... x.copy_(next_batch); g.replay()")
        g = CUDAGraph()
        with graph(g, stream=stream):
            probs = forward(x, w)
        tour.graph = g
        tour.say(f"captured {len(g.kernel_nodes())} kernel launches ({escape(label)}) "
                 f"for a {batch}x{d_in} @ {d_in}x{d_out} layer; outputs live in the graph's "
                 f"private pool {g.pool()}")
        for i, x_host in enumerate(batches[1:], 1):
            x.copy_(x_host)
            g.replay()
            tour.close(f"replay {i} on a new batch matches numpy", probs.to_numpy(),
                       reference(x_host), rtol=1e-4, atol=1e-6)
        timings = {}
        for name, step in (("eager", lambda: forward(x, w)), ("graph replay", g.replay)):
            start, end = Event(enable_timing=True), Event(enable_timing=True)
            stream.synchronize()
            t0 = time.perf_counter()
            start.record()
            for _ in range(iters):
                step()
            end.record()
            host_us = (time.perf_counter() - t0) * 1e6 / iters
            end.synchronize()
            timings[name] = (host_us, start.elapsed_time(end) * 1e3 / iters)
    for name, (host_us, device_us) in timings.items():
        tour.say(f"{name:>12}: {host_us:8.1f} us of host time, {device_us:8.1f} us on the "
                 f"device per forward")
    saved = timings["eager"][0] / max(timings["graph replay"][0], 1e-9)
    tour.say(f"replaying the graph takes {saved:.1f}x less host time than launching eagerly "
             "[dim](eager launches here also pay for the profile's events)[/dim]")


def _memory(tour: Tour) -> None:
    stats = memory_stats()
    table = Table(box=None, padding=(0, 2))
    table.add_column("gpurt.memory_stats()[...]")
    table.add_column("value", justify="right")
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "reserved_bytes.all.peak", "segment.all.current",
                "num_alloc_retries", "num_ooms", "num_device_alloc"):
        value = stats.get(key, 0)
        table.add_row(key, _mib(value) if "bytes" in key else str(value))
    tour.console.print(table)
    tour.code("print(gpurt.memory_summary(abbreviated=True))")
    tour.console.print(Text(memory_summary(abbreviated=True)))
    allocated, reserved = memory_allocated(), memory_reserved()
    tour.check("allocated <= reserved, and peaks >= current values",
               allocated <= reserved and max_memory_allocated() >= allocated
               and stats.get("reserved_bytes.all.peak", 0) >= reserved)
    tour.check("no out-of-memory retries or errors",
               stats.get("num_ooms", 0) == 0 and stats.get("num_alloc_retries", 0) == 0)
    if tour.graph is not None:
        tour.graph.reset()  # gives its private pool back
        tour.graph = None
    empty_cache()
    tour.say(f"after graph.reset() and gpurt.empty_cache(): {_mib(memory_reserved())} reserved "
             f"(was {_mib(reserved)})")
    tour.check("empty_cache() kept what is in use and returned only cached memory",
               memory_allocated() <= memory_reserved() <= reserved)


def _profile(tour: Tour) -> None:
    profile = tour.profile
    if profile is None:
        tour.check("the profile ran", False, "gpurt.profiler.profile() could not start")
        return
    tour.code("with gpurt.profiler.profile() as prof: ...   # every step in gpurt.nvtx.range()")
    result = profile.result
    result.print(console=tour.console)
    ranges = {r.name for r in result.records if r.kind == "range"}
    saxpy = sum(1 for r in result.records if r.kind == "kernel" and r.name == "saxpy")
    wanted = [_range_name(i, step) for i, step in enumerate(STEPS[:-1], 1)]
    missing = [name for name in wanted if name not in ranges]
    tour.check("every step's NVTX range was timed on the device", not missing,
               f"missing: {', '.join(missing)}" if missing else f"{len(wanted)} ranges")
    tour.check("every saxpy launch was timed", saxpy == tour.saxpy_launches,
               f"{saxpy} of {tour.saxpy_launches}")
    tour.say("[dim]prof.export_chrome_trace('trace.json') writes the timeline for "
             "ui.perfetto.dev; under Nsight Systems the same ranges show as NVTX[/dim]")


STEPS: list[Step] = [
    Step("Pick a device", "current_device, get_device_properties, mem_get_info", _pick_device),
    Step("Allocate arrays", "device arrays from numpy through the caching allocator", _allocate),
    Step("Compile a kernel", "NVRTC for the device's exact architecture, with the disk cache",
         _compile),
    Step("Streams and events", "launch on two streams and time the kernels with events",
         _streams),
    Step("CUDA graphs", "capture an inference-style softmax(x @ w) loop and replay it", _graphs),
    Step("Memory statistics", "memory_stats and memory_summary of everything above", _memory),
    Step("Profile", "NVTX ranges around each step and the device-timed profile table", _profile),
]


def _range_name(number: int, step: Step) -> str:
    return f"demo {number}. {step.title}"


def _run_step(tour: Tour, number: int, step: Step) -> None:
    tour.step = step.title
    tour.console.rule(f"{number}. {step.title}", align="left")
    tour.console.print(f"[dim]{escape(step.what)}[/dim]")
    try:
        with nvtx.range(_range_name(number, step)):
            step.run(tour)
    except Exception as exc:  # noqa: BLE001 - a failing step is reported, the tour goes on
        tour.check(f"{step.title} ran to the end", False, f"{type(exc).__name__}: {exc}")


def _tour(console: Console) -> Tour:
    tour = Tour(console)
    index = current_device()
    console.print(Panel(f"gpurt on cuda:{index}, {escape(get_device_name(index))}: "
                        f"{len(STEPS)} steps, each checked against numpy",
                        title="gpurt demo", title_align="left"))
    profile = profiler.profile(print_table=False)
    try:
        tour.profile = profile.__enter__()
    except Exception as exc:  # noqa: BLE001
        tour.step = "Profile"
        tour.check("gpurt.profiler.profile() starts", False, f"{type(exc).__name__}: {exc}")
    try:
        for number, step in enumerate(STEPS[:-1], 1):
            _run_step(tour, number, step)
    finally:
        if tour.profile is not None:
            profile.__exit__(None, None, None)
    _run_step(tour, len(STEPS), STEPS[-1])
    return tour


# ---- without a GPU ---------------------------------------------------------------------------


def _describe(console: Console, reason: str) -> None:
    tour = "\n".join(f"  {i}. {s.title}: {s.what}" for i, s in enumerate(STEPS, 1))
    console.print(
        Panel(
            f"[red]no GPU here:[/red] {escape(reason)}\n\n"
            f"On a GPU machine the demo runs this tour:\n{tour}\n\n"
            "What runs here: [bold]gpurt info[/bold], and compiling kernels ahead of time "
            "with [bold]gpurt compile FILE.cu --arch sm_90[/bold] (or gpurt.compile(source, "
            "arch='sm_90')), as below.",
            title="gpurt demo",
            title_align="left",
        )
    )


def _ahead_of_time(tour: Tour) -> None:
    """Compile the tour's kernels for sm_90 with no GPU and show the kernel cache."""
    arch = AHEAD_OF_TIME_ARCH
    directory = cache_dir()
    before = _kernel_files(directory)
    tour.console.rule(f"Compile ahead of time for {arch}", align="left")
    tour.code(f"module = gpurt.compile(source, arch={arch!r})")
    t0 = time.perf_counter()
    module = compile(_demo_kernels.SOURCE, arch=arch, program_name="gpurt_demo.cu")
    first_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    again = compile(_demo_kernels.SOURCE, arch=arch, program_name="gpurt_demo.cu")
    hit_us = (time.perf_counter() - t0) * 1e6
    tour.check(f"a {arch} cubin, compiled with no GPU",
               module.kind == "cubin" and module.code[:4] == b"\x7fELF",
               f"{len(module.code):,} bytes in {first_ms:.1f} ms")
    for name in ("saxpy", "demo_matmul", "demo_softmax"):
        tour.say(escape(repr(module[name])))
    tour.check("compiling it again is a memory-cache hit", again is module, f"{hit_us:.0f} us")
    after = _kernel_files(directory)
    if directory is None:
        tour.say("disk cache: off (GPURT_CACHE_DISABLE=1)")
        return
    new = after - before
    tour.say(f"disk cache: {escape(directory)} holds {len(after)} compiled program(s)"
             + (f"; this run added {', '.join(sorted(new))}" if new else
                "; this program was already there from an earlier run"))
    if not after:
        tour.say("[yellow]the folder is not usable: kernels are cached in memory only[/yellow]")
    tour.say("[dim]on a GPU machine with the same NVRTC and options, this entry loads in a "
             "fraction of a millisecond instead of being compiled again[/dim]")


def _summary(tour: Tour) -> int:
    failed = tour.failed
    if failed:
        lines = "\n".join(f"  {escape(c.step)}: {escape(c.what)}" for c in failed)
        tour.console.print(Panel(f"[bold red]{len(failed)} of {len(tour.checks)} checks "
                                 f"failed[/bold red]\n{lines}", title="gpurt demo",
                                 title_align="left"))
        return 1
    tour.console.print(f"[bold green]all {len(tour.checks)} checks passed[/bold green]")
    return 0


def run(console: Console) -> int:
    """Run the tour (or, without a GPU, describe it and compile ahead of time); returns the
    exit code: 0 when every check passed."""
    try:
        init()
        reason = None if is_available() else "the driver found no CUDA device"
    except CudaError as exc:
        reason = str(exc)
    if reason is not None:
        _describe(console, reason)
        tour = Tour(console)
        tour.step = "ahead of time"
        try:
            _ahead_of_time(tour)
        except Exception as exc:  # noqa: BLE001
            tour.check("compiling ahead of time", False, f"{type(exc).__name__}: {exc}")
        return _summary(tour)
    return _summary(_tour(console))
