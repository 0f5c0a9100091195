"""``GPURT_ALLOC_CONF``: the allocator's settings, with torch's PYTORCH_CUDA_ALLOC_CONF keys.

The text is a comma-separated list of ``key:value`` pairs, e.g.
``max_split_size_mb:128,garbage_collection_threshold:0.6`` or
``roundup_power2_divisions:[256:1,512:2,>:8]``. A bad key or value raises
:class:`AllocatorConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import os

__all__: list[str] = []

MB = 1 << 20
LARGE_BUFFER = 20 * MB  # torch's kLargeBuffer
UNLIMITED = (1 << 64) - 1  # torch's SIZE_MAX: no max_split_size
ROUNDUP_INTERVALS = 16  # power-of-two intervals from 1 MiB to 64 GiB
BACKENDS = ("native", "cudaMallocAsync")
KEYS = (
    "backend",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
)


class AllocatorConfigError(ValueError):
    """A GPURT_ALLOC_CONF setting is not understood; the message names the key."""


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """Allocator settings (defaults are torch's)."""

    backend: str = "native"
    max_split_size: int = UNLIMITED
    max_non_split_rounding_size: int = LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    expandable_segments: bool = False
    caching: bool = True  # False with GPURT_NO_CACHING=1

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise AllocatorConfigError(
                f"backend: unknown allocator backend {self.backend!r}; options are native "
                "and cudaMallocAsync"
            )
        if len(self.roundup_power2_divisions) != ROUNDUP_INTERVALS:
            raise AllocatorConfigError(
                f"roundup_power2_divisions: expected {ROUNDUP_INTERVALS} intervals"
            )

    @property
    def max_split_size_stat(self) -> int:
        """max_split_size as torch reports it in memory_stats (-1 when unlimited)."""
        return -1 if self.max_split_size == UNLIMITED else self.max_split_size

    @property
    def expandable(self) -> bool:
        """Expandable segments in effect (not with caching off, as in torch)."""
        return self.expandable_segments and self.caching

    @property
    def rounds_to_power2(self) -> bool:
        return any(d > 1 for d in self.roundup_power2_divisions)


def _bool(key: str, text: str) -> bool:
    if text not in ("True", "False"):
        raise AllocatorConfigError(f"{key}: expected True or False, got {text!r}")
    return text == "True"


def _int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise AllocatorConfigError(f"{key}: expected an integer, got {text!r}") from None


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _size_mb(key: str, text: str) -> int:
    value = _int(key, text)
    floor = LARGE_BUFFER // MB
    if value < floor:
        raise AllocatorConfigError(f"{key}: {value} is too small, must be >= {floor}")
    return min(value * MB, UNLIMITED)


def _divisions(key: str, text: str) -> tuple[int, ...]:
    """torch's roundup_power2_divisions: one number for all intervals, or a list
    ``[size_mb:divisions, ..., >:divisions]`` with power-of-two sizes in MiB."""
    if not text.startswith("["):
        value = _int(key, text)
        if not _power_of_two(value):
            raise AllocatorConfigError(f"{key}: divisions must be a power of 2, got {value}")
        return (value,) * ROUNDUP_INTERVALS
    if not text.endswith("]"):
        raise AllocatorConfigError(f"{key}: missing ']' in {text!r}")
    table = [0] * ROUNDUP_INTERVALS
    first, last_index = True, 0
    for item in filter(None, (s.strip() for s in text[1:-1].split(","))):
        interval, sep, count_text = item.partition(":")
        if not sep:
            raise AllocatorConfigError(f"{key}: expected size:divisions, got {item!r}")
        count = _int(key, count_text)
        if count != 0 and not _power_of_two(count):
            raise AllocatorConfigError(f"{key}: divisions must be a power of 2 or 0, got {count}")
        if interval == ">":
            table[last_index:] = [count] * (ROUNDUP_INTERVALS - last_index)
            continue
        size_mb = _int(key, interval)
        if not _power_of_two(size_mb):
            raise AllocatorConfigError(f"{key}: interval sizes must be powers of 2, got {size_mb}")
        index = min(size_mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:
            table[:index] = [count] * index
            first = False
        table[index] = count
        last_index = index
    return tuple(table)


def _split_items(text: str) -> list[str]:
    """Split on commas that are not inside [...]."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse(text: str | None, no_caching: bool = False) -> AllocatorConfig:
    """Parse a GPURT_ALLOC_CONF string (None or '' gives the defaults)."""
    return AllocatorConfig(caching=not no_caching, **parse_settings(text))  # type: ignore[arg-type]


def parse_settings(text: str | None) -> dict[str, object]:
    """The AllocatorConfig fields that a GPURT_ALLOC_CONF string sets, by field name."""
    settings: dict[str, object] = {}
    for item in _split_items((text or "").replace(" ", "")):
        key, sep, value = item.partition(":")
        if not sep or not value:
            raise AllocatorConfigError(f"{key}: expected '{key}:<value>' in GPURT_ALLOC_CONF")
        if key == "backend":
            if value not in BACKENDS:
                raise AllocatorConfigError(
                    f"backend: unknown allocator backend {value!r}; options are native and "
                    "cudaMallocAsync"
                )
            settings["backend"] = value
        elif key == "max_split_size_mb":
            settings["max_split_size"] = _size_mb(key, value)
        elif key == "max_non_split_rounding_mb":
            settings["max_non_split_rounding_size"] = _size_mb(key, value)
        elif key == "garbage_collection_threshold":
            try:
                threshold = float(value)
            except ValueError:
                raise AllocatorConfigError(f"{key}: expected a number, got {value!r}") from None
            if not 0.0 < threshold < 1.0:
                raise AllocatorConfigError(f"{key}: {threshold} is invalid, set it in (0.0, 1.0)")
            settings["garbage_collection_threshold"] = threshold
        elif key == "roundup_power2_divisions":
            settings["roundup_power2_divisions"] = _divisions(key, value)
        elif key == "expandable_segments":
            settings["expandable_segments"] = _bool(key, value)
        elif key in ("release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                     "pinned_use_background_threads"):
            _bool(key, value)  # accepted for compatibility; no effect in gpurt
        elif key == "pinned_num_register_threads":
            if not _power_of_two(_int(key, value)):
                raise AllocatorConfigError(f"{key}: must be a power of 2, got {value}")
        else:
            raise AllocatorConfigError(
                f"{key}: unrecognized GPURT_ALLOC_CONF key; known keys: {', '.join(KEYS)}"
            )
    return settings


def from_environment() -> AllocatorConfig:
    """Settings from $GPURT_ALLOC_CONF and $GPURT_NO_CACHING."""
    no_caching = os.environ.get("GPURT_NO_CACHING", "") not in ("", "0")
    return parse(os.environ.get("GPURT_ALLOC_CONF"), no_caching=no_caching)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """torch's roundup_power2_next_division: round ``size`` up to the next of
    ``divisions`` equal steps between the powers of two around it."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def divisions_for(config: AllocatorConfig, size: int) -> int:
    """torch's roundup_power2_divisions(size): the interval of ``size`` from 1 MiB up."""
    index = (size.bit_length() - 1) - 20
    index = min(max(index, 0), ROUNDUP_INTERVALS - 1)
    return config.roundup_power2_divisions[index]
