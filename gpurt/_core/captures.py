"""The one count of CUDA graph captures underway in this process (any thread, any device).

An allocator counts a capture while it routes the capturing stream's allocations to the
graph's private pool (``begin_allocate_to_pool`` .. ``end_allocate_to_pool``, which
gpurt.graphs brackets around cuStreamBeginCapture/cuStreamEndCapture). While any capture is
underway nothing in gpurt does what a global-mode capture forbids: the allocators free no
segments and query, record or synchronize no events, and graph releases wait
(gpurt/_graphs/capture.py).

It also knows which threads are capturing (gpurt.graphs tells it), so that a host read of
device data or a copy from host memory on such a thread raises instead of running before
the captured work (:meth:`_Captures.refuse_host_access`).
"""

from __future__ import annotations

import collections
import threading

from .driver import CudaError
from .fork import renew_after_fork

__all__ = ["CAPTURES", "GraphCaptureError"]


class GraphCaptureError(CudaError):
    """A CUDA graph capture failed; the message says which call was illegal. Raised from
    ``capture_end`` or the :class:`~gpurt.graph` context, the capture was aborted and its
    private pool released, and the stream is usable again. Also raised, without touching the
    capture, by host reads of device data on a capturing thread."""


class _Captures:
    """The count (``count``, read without the lock) and its only writer, :meth:`add`; the
    capturing threads (``threads``, by threading.get_ident, read without the lock)."""

    def __init__(self) -> None:
        self.count = 0
        self.threads: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n

    def thread_started(self, thread: int) -> None:
        """Count a capture begun by the thread ``thread`` (a threading.get_ident())."""
        with self._lock:
            self.threads[thread] += 1

    def thread_stopped(self, thread: int) -> None:
        with self._lock:
            self.threads[thread] -= 1
            if self.threads[thread] <= 0:
                del self.threads[thread]

    def refuse_host_access(self, what: str) -> None:
        """Raise GraphCaptureError when the calling thread is capturing a CUDA graph: ``what``
        (a host read of device data, or a copy from host memory) would run now, before any of
        the captured work, and the graph would lack it. Callers test ``threads`` first, so
        that code outside any capture pays one attribute read."""
        if self.threads.get(threading.get_ident()):
            raise GraphCaptureError(
                900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
                f"{what} during CUDA graph capture: a host read or a copy from host memory "
                "would run now, not at replay, and the graph would lack it (torch raises too). "
                "Do it before or after the capture; the capture is unaffected and can go on.")


CAPTURES = _Captures()
renew_after_fork(CAPTURES, _lock=threading.Lock)
