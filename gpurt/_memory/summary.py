"""memory_summary(): the allocator statistics as a table, laid out like torch's."""

from __future__ import annotations

import io
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

__all__: list[str] = []

# (statistics family, row label, is a byte count)
_ROWS = (
    ("allocated_bytes", "Allocated memory", True),
    ("active_bytes", "Active memory", True),
    ("requested_bytes", "Requested memory", True),
    ("reserved_bytes", "GPU reserved memory", True),
    ("inactive_split_bytes", "Non-releasable memory", True),
    ("allocation", "Allocations", False),
    ("active", "Active allocs", False),
    ("segment", "GPU reserved segments", False),
    ("inactive_split", "Non-releasable allocs", False),
)
_FIELDS = ("current", "peak", "allocated", "freed")


def _scaled(value: int, reference: int, units: tuple[str, ...], step: int, limit: int) -> str:
    """``value`` in the unit that suits ``reference`` (the row's peak), like torch."""
    unit = units[0]
    for bigger in units[1:]:
        if reference < limit:
            break
        unit = bigger
        value //= step
        reference //= step
    return f"{value} {unit}".rstrip()


def format_bytes(value: int, reference: int) -> str:
    return _scaled(value, reference, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), 1024, 768 * 1024)


def format_count(value: int, reference: int) -> str:
    return _scaled(value, reference, ("", "K", "M"), 1000, 750 * 1000)


def summary_table(stats: dict[str, Any], device: int, abbreviated: bool = False,
                  expandable: bool = False) -> str:
    """Render flat memory statistics (memory_stats() keys) as plain text; ``expandable``
    says that segments grow in place (their reserved memory counts mapped pages)."""
    caption = (f"CUDA OOMs: {stats.get('num_ooms', 0)}  |  "
               f"cudaMalloc retries: {stats.get('num_alloc_retries', 0)}")
    if expandable:
        caption += "  |  expandable segments: on"
    table = Table(
        title=f"gpurt CUDA memory summary, device ID {device}",
        caption=caption,
        box=box.SQUARE,
        show_lines=False,
    )
    table.add_column("Metric", no_wrap=True)
    for heading in ("Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"):
        table.add_column(heading, justify="right", no_wrap=True)
    pools: tuple[tuple[str, str], ...] = (("all", ""),)
    if not abbreviated:
        pools += (("large_pool", "      from large pool"), ("small_pool", "      from small pool"))
    for family, label, in_bytes in _ROWS:
        fmt = format_bytes if in_bytes else format_count
        for pool, sublabel in pools:
            prefix = f"{family}.{pool}."
            peak = int(stats.get(prefix + "peak", 0))
            cells = [fmt(int(stats.get(prefix + f, 0)), peak) for f in _FIELDS]
            table.add_row(sublabel or label, *cells, end_section=pool == pools[-1][0])
    for family, label in (("oversize_allocations", "Oversize allocations"),
                          ("oversize_segments", "Oversize GPU segments")):
        peak = int(stats.get(f"{family}.peak", 0))
        table.add_row(label, *[format_count(int(stats.get(f"{family}.{f}", 0)), peak)
                               for f in _FIELDS])
    out = io.StringIO()
    Console(file=out, width=100, color_system=None, force_terminal=False,
            legacy_windows=False).print(table)
    return out.getvalue()
