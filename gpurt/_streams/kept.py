"""Memory kept per (device, stream) between calls: the table behind the split-K workspaces
(kernels/_gemm_workspace.py) and the reductions' ticket counters (gpurt/_elementwise/counters.py).

Work on one stream runs in order, so the calls on a stream may reuse one piece of scratch
memory without waiting. Two streams never share a key. Two cases get no key (the caller makes
new memory for each call instead): a stream that is capturing a CUDA graph, whose replays may
run beside the stream's later work, and the per-thread default stream, one handle that is a
different stream in each thread. The table holds at most ``max_kept`` streams and drops the
least recently used first. It is not locked: its owner holds its own lock around it.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .handles import stream_is_capturing

__all__ = ["PER_THREAD_STREAM", "KeptPerStream"]

PER_THREAD_STREAM = 2  # CU_STREAM_PER_THREAD
T = TypeVar("T")


class KeptPerStream(Generic[T]):
    """A value per (device, stream handle), at most ``max_kept`` of them."""

    def __init__(self, max_kept: int) -> None:
        self.max_kept = max_kept
        self._kept: dict[tuple[int, int], T] = {}

    @staticmethod
    def key(index: int, handle: int) -> tuple[int, int] | None:
        """The key of stream ``handle`` of device ``index``, or None where a call must not
        reuse kept memory (the stream captures a graph, or is the per-thread default stream)."""
        if handle == PER_THREAD_STREAM or stream_is_capturing(index, handle):
            return None
        return (index, handle)

    def get(self, key: tuple[int, int]) -> T | None:
        """The value kept for ``key``, marked as the most recently used."""
        found = self._kept.pop(key, None)
        if found is not None:
            self._kept[key] = found
        return found

    def put(self, key: tuple[int, int], value: T) -> None:
        """Keep ``value`` for ``key`` (replacing the old one, which is then freed in its
        stream's order), dropping the least recently used beyond ``max_kept``."""
        self._kept.pop(key, None)
        while self._kept and len(self._kept) >= self.max_kept:
            self._kept.pop(next(iter(self._kept)))
        self._kept[key] = value

    def __len__(self) -> int:
        return len(self._kept)

    def keys(self) -> list[tuple[int, int]]:
        """The keys of the kept values, least recently used first."""
        return list(self._kept)

    def values(self) -> list[T]:
        """The kept values."""
        return list(self._kept.values())

    def clear(self) -> None:
        """Drop every kept value."""
        self._kept.clear()
