"""Shared measuring tools for the benchmarks: host timers, device-event timers and the
results file format. Timing follows the device README's METHOD: warm up, repeat, median.

Device timing uses raw driver events (not gpurt's) so gpurt and its peers are timed by the
same neutral clock."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as cu

__all__ = ["host_us", "device_ms", "environment", "write_results", "peer", "print_rows",
           "Timer", "copy_gbps", "FLUSH_BYTES", "COPY_BYTES"]


def host_us(fn: Callable[[], Any], *, number: int = 1000, repeat: int = 15,
            warmup: int = 200) -> float:
    """Median host time of one ``fn()`` call in microseconds (``number`` calls per sample)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number * 1e6)
    return statistics.median(samples)


def _ok(res: tuple) -> Any:
    if int(res[0]) != 0:
        raise RuntimeError(f"driver call failed: {res[0]!r}")
    return res[1] if len(res) == 2 else None


def device_ms(fn: Callable[[], Any], stream: int, *, repeat: int = 50, warmup: int = 5,
              flush: Callable[[], Any] | None = None) -> float:
    """Median device time in ms of ``fn()`` (work enqueued on ``stream``, a raw handle),
    measured with driver events recorded around each call on that stream."""
    start = _ok(cu.cuEventCreate(0))
    stop = _ok(cu.cuEventCreate(0))
    try:
        for _ in range(warmup):
            fn()
        _ok(cu.cuStreamSynchronize(stream))
        samples = []
        for _ in range(repeat):
            if flush is not None:
                flush()
            _ok(cu.cuEventRecord(start, stream))
            fn()
            _ok(cu.cuEventRecord(stop, stream))
            _ok(cu.cuEventSynchronize(stop))
            samples.append(float(_ok(cu.cuEventElapsedTime(start, stop))))
        return statistics.median(samples)
    finally:
        cu.cuEventDestroy(start)
        cu.cuEventDestroy(stop)


def peer(name: str) -> Any:
    """Import a peer library by name, or None when it is not installed."""
    try:
        return __import__(name)
    except Exception:
        return None


def environment() -> dict[str, Any]:
    """Device, driver and library versions of this run."""
    import gpurt

    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "gpurt": gpurt.__version__,
        "cuda_bindings": gpurt._core.driver.bindings_version(),
        "driver_cuda_version": gpurt._core.driver.driver_version(),
    }
    if gpurt.is_available():
        env["device"] = gpurt.get_device_name(0)
        env["capability"] = list(gpurt.get_device_capability(0))
    for name in ("torch", "cupy", "cuda.core", "numpy"):
        mod = peer(name)
        if mod is not None:
            mod = sys.modules.get(name, mod)
            env[name.replace(".", "_")] = getattr(mod, "__version__", "?")
    return env


def write_results(suite: str, rows: list[dict[str, Any]], path: str | None) -> dict[str, Any]:
    """Write ``{"suite", "env", "rows"}`` as JSON to ``path`` (or $GPURT_BENCH_OUT/suite.json)."""
    doc = {"suite": suite, "env": environment(), "rows": rows}
    if path is None and os.environ.get("GPURT_BENCH_OUT"):
        path = os.path.join(os.environ["GPURT_BENCH_OUT"], f"{suite}.json")
    if path:
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
    return doc


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    """Print rows as a rich table (plain text when not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    for k in keys:
        table.add_column(k)
    for row in rows:
        table.add_row(*[f"{row[k]:.4g}" if isinstance(row.get(k), float) else str(row.get(k, ""))
                        for k in keys])
    Console(width=160).print(table)


# ---- bandwidth suites: device time behind a busy, L2-evicting memset ---------------------------

FLUSH_BYTES = 512 << 20  # the sweep before each timed call: longer than any host launch
COPY_BYTES = 1 << 30  # the device-to-device copy that measures the copy-bandwidth ceiling
# The flush reads (it writes nothing): a memset would leave the L2 full of dirty lines, and
# the timed call would pay for writing them back (about 50 MB, ~17 us on an H100), which
# charged every bandwidth row before session 7 with work that was not its own.
# GPURT_BENCH_FLUSH=memset times the old way.
_MEMSET_FLUSH = os.environ.get("GPURT_BENCH_FLUSH") == "memset"
_SWEEP = r"""
extern "C" __global__ void bench_sweep(const uint4* __restrict__ p, long long n,
                                       unsigned int* sink) {
    unsigned int acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;  // never: the buffer is zeros; keeps the loads
}
"""


class Timer:
    """device_ms on one stream with a busy, L2-evicting read of FLUSH_BYTES before each timed
    call, so host launch time is not counted (for any library), inputs do not come from L2,
    and the L2 holds only clean lines when the call starts."""

    def __init__(self, handle: int, repeat: int) -> None:
        import gpurt

        self.handle = handle
        self.repeat = repeat
        self.scratch = gpurt.empty(FLUSH_BYTES + 16, dtype="uint8")
        _ok(cu.cuMemsetD8Async(self.scratch.ptr, 0, FLUSH_BYTES + 16, handle))
        self.sweep = gpurt.compile(_SWEEP)["bench_sweep"]
        self.blocks = 8 * gpurt.get_device_properties().multi_processor_count

    def flush(self) -> None:
        if _MEMSET_FLUSH:  # the method before session 7, to compare with
            _ok(cu.cuMemsetD8Async(self.scratch.ptr, 0, FLUSH_BYTES, self.handle))
            return
        self.sweep(self.blocks, 256, (self.scratch.ptr, FLUSH_BYTES // 16,
                                      self.scratch.ptr + FLUSH_BYTES), stream=self.handle)

    def ms(self, fn: Callable[[], Any]) -> float:
        return device_ms(fn, self.handle, repeat=self.repeat, warmup=5, flush=self.flush)


def bandwidth_timer(suite: str, json_path: str | None, repeat: int,
                    need_torch: bool = False) -> tuple[Timer, Any] | None:
    """The set-up the bandwidth suites share: (a Timer on torch's current stream, or gpurt's
    without torch; torch or None). Without a GPU (or torch, where it is needed) it says so,
    writes the suite's empty result and returns None."""
    import gpurt

    torch = peer("torch")
    if torch is not None and not torch.cuda.is_available():
        torch = None
    if not gpurt.is_available() or (need_torch and torch is None):
        print(f"bench_{suite}: needs a GPU{' and torch' if need_torch else ''}, "
              "nothing to measure")
        write_results(suite, [], json_path)
        return None
    stream = torch.cuda.current_stream() if torch is not None else gpurt.current_stream()
    return Timer(int(stream.cuda_stream), repeat), torch


def copy_gbps(timer: Timer, nbytes: int = COPY_BYTES) -> float:
    """The device's copy bandwidth in GB/s (bytes read plus written) timed by ``timer``: a
    device-to-device copy of ``nbytes`` (default 1 GiB, the ceiling; a kernel's own byte count
    gives what a single launch of that size can reach)."""
    import gpurt

    src = gpurt.empty(nbytes, dtype="uint8")
    dst = gpurt.empty(nbytes, dtype="uint8")
    _ok(cu.cuMemsetD8Async(src.ptr, 7, nbytes, timer.handle))
    ms = timer.ms(lambda: _ok(cu.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, timer.handle)))
    return 2 * nbytes / ms / 1e6


class HostBackend:
    """Allocator backend for the CPU proxies of the memory benchmarks: pretend addresses,
    reserved ranges on 2 MiB boundaries, pages that always map, events that always complete,
    a device of ``total`` bytes."""

    def __init__(self, total: int = 1 << 40) -> None:
        self.next = 1 << 40
        self.total = total

    def malloc(self, size: int, capturing: bool, stream: int = 0) -> int:
        ptr, self.next = self.next, self.next + size
        return ptr

    def reserve(self, size: int) -> int:
        ptr = -(-self.next // (2 << 20)) * (2 << 20)
        self.next = ptr + size
        return ptr

    def map(self, ptr: int, size: int, page: int, capturing: bool) -> bool:
        return True

    def mem_get_info(self) -> tuple[int, int]:
        return self.total, self.total

    def event_query(self, event: Any) -> bool:
        return True

    def may_record_events(self) -> bool:
        return True

    def oom_error(self, message: str) -> BaseException:
        return MemoryError(message)

    def free(self, ptr: int) -> None: ...
    def unmap(self, ptr: int, size: int, page: int) -> None: ...
    def unreserve(self, ptr: int, size: int) -> None: ...
    def event_create(self) -> None: ...
    def event_record(self, event: Any, stream: int) -> None: ...
    def event_synchronize(self, event: Any) -> None: ...
    def event_destroy(self, event: Any) -> None: ...
    def synchronize(self) -> None: ...
    def capture_id(self, stream: int) -> None: ...
