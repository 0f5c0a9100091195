"""Bookkeeping behind gpurt.graphs: capture modes, capture errors with a clear message, and
the safe release of captured graphs.

Releasing a graph destroys its driver handles and hands its private pool back to the
allocator. A replay still in flight is safe: the driver frees a destroyed executable graph
when it completes, and the allocator returns a released pool's segments only through
empty_cache (cuMemFree waits for the device). While any capture is underway even these calls
are avoided, so releases that happen then, mostly from garbage collection, are queued and
run when the last capture ends (likewise for a finalizer run on the driver's callback thread).
"""

from __future__ import annotations

import warnings
from typing import Any

from cuda.bindings import driver as cu

from .. import memory as _memory
from .._core.captures import CAPTURES, GraphCaptureError
from .._core.driver import CudaError, check
from .._streams.handles import deferred_while_unsafe, in_host_callback
from ..device import bind_context

__all__ = ["GraphCaptureError", "GraphUpdateError"]

PoolId = tuple[int, int]

MODES = {
    "global": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}
WRONG_THREAD = "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"
IMPLICIT = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"

# Why a driver call failed during capture, by the error's name.
CAPTURE_HINTS = {
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": (
        "{call} is not allowed while a CUDA graph capture is in progress (synchronizing, "
        "querying events or streams, copies to pageable host memory and driver memory "
        "allocation cannot be captured)"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": (
        "an earlier illegal call invalidated the capture ({call} reported it)"
    ),
    IMPLICIT: (
        "{call} used the legacy default stream, which would synchronize implicitly with "
        "the capturing stream"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_ISOLATION": (
        "{call} mixed captured work with work outside the capture (in 'global' mode a "
        "stream that is not part of the capture cannot wait on captured work, nor the "
        "reverse)"
    ),
    "CUDA_ERROR_CAPTURED_EVENT": "{call} queried or waited on an event recorded during capture",
    "CUDA_ERROR_STREAM_CAPTURE_UNJOINED": (
        "the capture forked into other streams that were not joined back into the capturing "
        "stream (make it wait on them) before capture_end"
    ),
    "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED": "{call} ended a capture not begun on this stream",
    "CUDA_ERROR_STREAM_CAPTURE_MERGE": "{call} merged two independent captures",
    WRONG_THREAD: (
        "{call} ran on another thread than capture_begin; only a 'relaxed' capture may end "
        "on another thread"
    ),
}


class GraphUpdateError(CudaError):
    """An instantiated graph could not be updated in place (cuGraphExecUpdate refused)."""


def capture_error(exc: CudaError, stream_handle: int, aborted: bool) -> GraphCaptureError:
    """The driver's error for a call made during capture, as a GraphCaptureError."""
    call = exc.call or "a driver call"
    hint = CAPTURE_HINTS.get(exc.name, "{call} failed during graph capture").format(call=call)
    tail = (
        " The capture was aborted and its private memory pool released; the stream is usable."
        if aborted
        else ""
    )
    text = (
        f"CUDA graph capture on stream 0x{stream_handle:x} failed: {hint} "
        f"[{exc.description}].{tail}"
    )
    return GraphCaptureError(exc.code, exc.name, text, exc.call)


def update_error(exc: CudaError, reason: str, node_kind: str) -> GraphUpdateError:
    """cuGraphExecUpdate's refusal (``reason``: a CUgraphExecUpdateResult name) explained."""
    where = f" at a {node_kind} node" if node_kind else ""
    text = (
        f"cannot update the instantiated graph in place: {reason}{where}. Only node "
        "parameters may change (kernel arguments, launch sizes, copy addresses); the source "
        "graph must have the same nodes and edges, kernels from the same context and no "
        "new node types. Capture into a new CUDAGraph instead."
    )
    return GraphUpdateError(exc.code, exc.name, text, exc.call)


def capture_mode(name: str) -> Any:
    """The CUstreamCaptureMode for "global", "thread_local" or "relaxed"."""
    try:
        return MODES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"capture_error_mode must be one of {sorted(MODES)}, got {name!r}"
        ) from None


def pool_id(pool: Any) -> PoolId:
    """Validate a private-pool handle (a pair of ints)."""
    if (
        isinstance(pool, tuple)
        and len(pool) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in pool)
    ):
        return (pool[0], pool[1])
    raise TypeError(
        f"pool must be a handle from gpurt.graph_pool_handle() or CUDAGraph.pool(), got {pool!r}"
    )


class GraphState:
    """What releasing a captured graph needs; its finalizer holds this, never the graph."""

    __slots__ = ("device", "graph", "exec", "pools", "keepalive")

    def __init__(self, device: int, graph: Any, exec_: Any, pool: PoolId) -> None:
        self.device = device
        self.graph = graph
        self.exec = exec_
        self.pools = [pool]  # the graph's own pool, then pools retained by update()
        self.keepalive: dict[Any, Any] = {}  # objects the graph's kernels now point into


def captures_active() -> int:
    """Number of gpurt captures underway in this process (any thread, any device)."""
    return CAPTURES.count


def pending_releases() -> int:
    """Number of graph releases waiting for the captures underway to end."""
    return CAPTURES.deferred(release)


def release(state: GraphState, warn: bool = False) -> None:
    """Destroy a graph's handles and release its pools now, or queue that while a capture
    is underway or on the driver's host-callback thread (where a finalizer may run, and no
    CUDA call is allowed). Called from finalizers: never raises."""
    if not deferred_while_unsafe(release, state):
        _destroy(state, warn)


def drain_deferred() -> None:
    """Run the releases queued during captures (CAPTURES.defer: graphs' and other
    finalizers'), once none is underway."""
    if not in_host_callback():
        CAPTURES.run_deferred()


def _destroy(state: GraphState, warn: bool) -> None:
    problems: list[str] = []
    try:
        bind_context(state.device)
        check(cu.cuGraphExecDestroy(state.exec), "cuGraphExecDestroy")
        check(cu.cuGraphDestroy(state.graph), "cuGraphDestroy")
    except Exception as exc:
        problems.append(str(exc))
    for pool in state.pools:
        try:
            _memory.release_pool(state.device, pool)
        except Exception as exc:
            problems.append(str(exc))
    state.pools = []
    state.keepalive.clear()
    if problems and warn:
        text = "; ".join(problems)
        warnings.warn(f"releasing a CUDA graph: {text}", RuntimeWarning, stacklevel=3)
