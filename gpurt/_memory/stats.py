"""Allocator statistics with torch's keys and meanings, cheap enough for the hot path.

torch keeps, per device, a ``Stat`` (current, peak, allocated, freed) for each family in
:data:`FAMILIES` and each pool type (all, small_pool, large_pool). Updating ~20 such stats
one Python int at a time would cost more than the whole allocation is allowed to, so every
family of one pool type lives in one *packed* integer, one ``FIELD_BITS``-wide field per
family, and a change to any number of families is a single integer addition:

- ``inc``   cumulative increases ("allocated"), fields never negative;
- ``slack`` ``BIAS + peak - current`` per field. A change that would lift some current
  above its peak drives that field below ``BIAS``, which clears its ``BIAS`` bit, so one
  ``&`` tells the hot path whether any peak moved (it rarely does once a workload is warm);
  only then :meth:`DeviceStats.refresh_peaks` unpacks and updates the peaks.

Current values follow as ``BIAS + peak - slack`` and "freed" as ``base + inc - current``
(``base`` is current at the last reset of the accumulated counters), so nothing else is
touched per call. The "all" pool type is the sum of small and large, except its peak, which
has its own slack. Packed integers are plain Python ints: the arithmetic is exact, and a
field's value can be read back whenever every field is within ``[0, 2**FIELD_BITS)``.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []

FAMILIES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
    "oversize_allocations",  # not split by pool in torch: reported from the "all" sums
    "oversize_segments",
)
POOL_FAMILIES = FAMILIES[:9]
POOL_TYPES = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")

FIELD_BITS = 80  # 2**78 bytes of cumulative traffic before a field could overflow
BIAS_BIT = FIELD_BITS - 2
_FIELD_MASK = (1 << FIELD_BITS) - 1
_N = len(FAMILIES)


def unit(family: str) -> int:
    """The packed vector with 1 in ``family``'s field."""
    return 1 << (FAMILIES.index(family) * FIELD_BITS)


def pack(values: list[int]) -> int:
    """Packed vector of per-family values (each in [0, 2**FIELD_BITS))."""
    return sum(v << (i * FIELD_BITS) for i, v in enumerate(values))


def unpack(vector: int) -> list[int]:
    """Per-family values of a packed vector whose fields are all in range."""
    return [(vector >> (i * FIELD_BITS)) & _FIELD_MASK for i in range(_N)]


BIAS = pack([1 << BIAS_BIT] * _N)  # also the mask of the "still within peak" bits

# Vectors the allocator adds on its hot path (see _allocator.py).
ALLOC_COUNTS = unit("allocation") + unit("active")
ALLOC_BYTES = unit("allocated_bytes") + unit("active_bytes")
ALLOCATION = unit("allocation")
ALLOCATED_BYTES = unit("allocated_bytes")
ACTIVE = unit("active")
ACTIVE_BYTES = unit("active_bytes")
REQUESTED_SHIFT = FAMILIES.index("requested_bytes") * FIELD_BITS
SPLIT = unit("inactive_split")
SPLIT_BYTES = unit("inactive_split_bytes")
SEGMENT = unit("segment")
RESERVED_BYTES = unit("reserved_bytes")
OVERSIZE_ALLOCATION = unit("oversize_allocations")
OVERSIZE_SEGMENT = unit("oversize_segments")


class PoolStats:
    """The packed statistics of one pool type (small or large) of one device."""

    __slots__ = ("inc", "slack", "peak", "base")

    def __init__(self) -> None:
        self.inc = 0
        self.slack = BIAS
        self.peak = 0
        self.base = 0

    def current(self) -> int:
        return BIAS + self.peak - self.slack


class DeviceStats:
    """All statistics of one device allocator. The allocator updates ``small``/``large``
    and ``all_slack`` inline (see :meth:`change` for the reference form)."""

    __slots__ = (
        "small", "large", "all_slack", "all_peak",
        "num_alloc_retries", "num_ooms", "num_sync_all_streams",
        "num_device_alloc", "num_device_free",
    )

    def __init__(self) -> None:
        self.small = PoolStats()
        self.large = PoolStats()
        self.all_slack = BIAS
        self.all_peak = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    def change(self, pool: PoolStats, increase: int, decrease: int) -> None:
        """Apply ``increase`` and ``decrease`` (packed, non-negative fields) to ``pool``."""
        delta = decrease - increase
        pool.inc += increase
        pool.slack += delta
        self.all_slack += delta
        if (pool.slack & self.all_slack & BIAS) != BIAS:
            self.refresh_peaks()

    def refresh_peaks(self) -> None:
        """Raise every peak that a current value passed, and recompute the slacks."""
        currents = []
        for pool in (self.small, self.large):
            cur = pool.current()
            pool.peak = pack([max(p, c) for p, c in zip(unpack(pool.peak), unpack(cur))])
            pool.slack = BIAS + pool.peak - cur
            currents.append(cur)
        cur_all = currents[0] + currents[1]
        all_cur = BIAS + self.all_peak - self.all_slack
        assert all_cur == cur_all, "allocator statistics drifted"
        self.all_peak = pack([max(p, c) for p, c in zip(unpack(self.all_peak), unpack(cur_all))])
        self.all_slack = BIAS + self.all_peak - cur_all

    def reset_peak(self) -> None:
        """torch's resetPeakStats: every peak becomes the current value."""
        for pool in (self.small, self.large):
            pool.peak = pool.current()
            pool.slack = BIAS
        self.all_peak = BIAS + self.all_peak - self.all_slack
        self.all_slack = BIAS

    def reset_accumulated(self) -> None:
        """torch's resetAccumulatedStats: allocated/freed counters and event counts to 0."""
        for pool in (self.small, self.large):
            pool.base = pool.current()
            pool.inc = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    def current(self, family: str, pool_type: str = "all") -> int:
        """Current value of one statistic."""
        i = FAMILIES.index(family)
        pools = {"all": (self.small, self.large), "small_pool": (self.small,),
                 "large_pool": (self.large,)}[pool_type]
        return sum(unpack(p.current())[i] for p in pools)

    def table(self) -> dict[str, list[dict[str, int]]]:
        """{family: [stat for all, small_pool, large_pool]} with each stat a dict of
        current/peak/allocated/freed."""
        columns: list[list[dict[str, int]]] = [[] for _ in range(_N)]
        sums = [[0, 0, 0] for _ in range(_N)]  # current, allocated, freed for "all"
        per_pool = []
        for pool in (self.small, self.large):
            cur = pool.current()
            freed = pool.base + pool.inc - cur
            per_pool.append((unpack(cur), unpack(pool.peak), unpack(pool.inc), unpack(freed)))
        all_peak = unpack(self.all_peak)
        for i in range(_N):
            for p_cur, _, p_inc, p_freed in per_pool:
                sums[i][0] += p_cur[i]
                sums[i][1] += p_inc[i]
                sums[i][2] += p_freed[i]
            columns[i].append(_stat(sums[i][0], all_peak[i], sums[i][1], sums[i][2]))
            for p_cur, p_peak, p_inc, p_freed in per_pool:
                columns[i].append(_stat(p_cur[i], p_peak[i], p_inc[i], p_freed[i]))
        return dict(zip(FAMILIES, columns))

    def as_nested_dict(self, max_split_size: int) -> dict[str, Any]:
        """The dict torch.cuda.memory_stats_as_nested_dict returns, same keys and order."""
        table = self.table()
        result: dict[str, Any] = {
            "num_alloc_retries": self.num_alloc_retries,
            "num_ooms": self.num_ooms,
            "max_split_size": max_split_size,
            "num_sync_all_streams": self.num_sync_all_streams,
            "num_device_alloc": self.num_device_alloc,
            "num_device_free": self.num_device_free,
        }
        for family in POOL_FAMILIES:
            result[family] = dict(zip(POOL_TYPES, table[family]))
        result["oversize_allocations"] = table["oversize_allocations"][0]
        result["oversize_segments"] = table["oversize_segments"][0]
        return result


def _stat(current: int, peak: int, allocated: int, freed: int) -> dict[str, int]:
    return {"current": current, "peak": peak, "allocated": allocated, "freed": freed}


def flatten(nested: dict[str, Any]) -> dict[str, Any]:
    """torch.cuda.memory_stats' flattening: dotted keys, sorted."""
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for key, value in obj.items():
                walk(f"{prefix}.{key}" if prefix else key, value)
        else:
            out.append((prefix, obj))

    walk("", nested)
    out.sort()
    return dict(out)


def empty_nested_stats(max_split_size: int = -1) -> dict[str, Any]:
    """Nested statistics of an allocator that has done nothing yet."""
    return DeviceStats().as_nested_dict(max_split_size)


# ---- simple unpacked statistics (pinned host allocator, cudaMallocAsync backend) ------


class Stat:
    """One torch ``Stat``: current, peak, allocated (total increase), freed (total decrease)."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated = self.freed = 0

    def as_dict(self) -> dict[str, int]:
        return _stat(self.current, self.peak, self.allocated, self.freed)


class DurationStat:
    """torch's ``DurationStat`` (microseconds): total, max, min, count, avg."""

    __slots__ = ("total", "max", "min", "count")

    def __init__(self) -> None:
        self.total = self.max = self.min = self.count = 0

    def add(self, us: int) -> None:
        self.total += us
        self.count += 1
        self.max = max(self.max, us)
        self.min = us if self.count == 1 else min(self.min, us)

    def reset_accumulated(self) -> None:
        self.total = self.count = 0

    def reset_peak(self) -> None:
        self.max = self.min = 0

    def as_dict(self) -> dict[str, int]:
        avg = self.total // self.count if self.count else 0
        return {"total": self.total, "max": self.max, "min": self.min, "count": self.count,
                "avg": avg}


def format_size(size: int) -> str:
    """torch's format_size: '512 bytes', '4.00 KiB', '20.00 MiB', '1.50 GiB'."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1 << 20:
        return f"{size / 1024:.2f} KiB"
    if size <= 1 << 30:
        return f"{size / (1 << 20):.2f} MiB"
    return f"{size / (1 << 30):.2f} GiB"
