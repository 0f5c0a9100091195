"""The one count of CUDA graph captures underway in this process (any thread, any device).

An allocator counts a capture while it routes the capturing stream's allocations to the
graph's private pool (``begin_allocate_to_pool`` .. ``end_allocate_to_pool``, which
gpurt.graphs brackets around cuStreamBeginCapture/cuStreamEndCapture). While any capture is
underway nothing in gpurt does what a global-mode capture forbids: the allocators free no
segments and query, record or synchronize no events, and graph releases wait
(gpurt/_graphs/capture.py).
"""

from __future__ import annotations

import threading

__all__ = ["CAPTURES"]


class _Captures:
    """The count (``count``, read without the lock) and its only writer, :meth:`add`."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n


CAPTURES = _Captures()
