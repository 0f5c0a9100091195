"""The one count of CUDA graph captures underway in this process (any thread, any device).

An allocator counts a capture while it routes the capturing stream's allocations to the
graph's private pool (``begin_allocate_to_pool`` .. ``end_allocate_to_pool``, which
gpurt.graphs brackets around cuStreamBeginCapture/cuStreamEndCapture). While any capture is
underway nothing in gpurt does what a global-mode capture forbids: the allocators free no
segments and query, record or synchronize no events. Finalizers whose driver calls would
invalidate a capture (a graph's release, a collected module's unload, a communicator's
destroy: garbage collection may run mid-capture) queue them here instead
(:meth:`_Captures.defer`), and they run once the last capture has ended.

It also knows which threads are capturing (gpurt.graphs tells it), so that a host read of
device data or a copy from host memory on such a thread raises instead of running before
the captured work (:meth:`_Captures.refuse_host_access`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

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
        self._later: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            collections.deque())

    def defer(self, release: Callable[..., Any], *args: Any) -> None:
        """Queue ``release(*args)``, a finalizer's driver call that a capture forbids (one
        that waits for the device, such as unloading code), for :meth:`run_deferred`."""
        self._later.append((release, args))

    def deferred(self, release: Callable[..., Any] | None = None) -> int:
        """How many releases :meth:`defer` queued (of ``release`` alone, if given) still
        wait."""
        if release is None:
            return len(self._later)
        return sum(fn is release for fn, _ in self._later.copy())

    def run_deferred(self) -> None:
        """Run the releases queued now, while no capture is underway. A release must not
        raise; one that finds it still cannot run (on the driver's host-callback thread)
        queues itself again, for the next call."""
        for _ in range(len(self._later)):
            if self.count:
                return
            try:
                release, args = self._later.popleft()
            except IndexError:  # another thread emptied it
                return
            release(*args)

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
# (a forked child drops the parent's queued releases: their handles are the parent's)
renew_after_fork(CAPTURES, _lock=threading.Lock, _later=collections.deque)
