"""CUDA graphs: capture work from a stream once, replay it with one launch (torch.cuda's API).

A :class:`CUDAGraph` captures everything enqueued on the current stream between
``capture_begin()`` and ``capture_end()`` (wraps cuStreamBeginCapture / cuStreamEndCapture),
instantiates it (cuGraphInstantiate) and replays it with cuGraphLaunch. Memory allocated
during capture comes from a private pool of the caching allocator that the graph owns
(shareable with other graphs through :func:`graph_pool_handle` or ``g.pool()``); it is given
back when the graph is reset or garbage collected (see gpurt._graphs.capture for how releases
during another capture are queued).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from cuda.bindings import driver as cu

from . import memory as _memory
from . import streams as _streams
from ._core import driver as _driver
from ._core.captures import CAPTURES
from ._core.driver import CudaError, check
from ._core.fork import renew_after_fork
from ._graphs import capture as _capture
from ._graphs.capture import GraphCaptureError, GraphUpdateError, PoolId, capture_error
from ._graphs.nodes import KernelNode, kernel_nodes_of
from ._random.capture import GraphGenerators  # generators drawing in a graph (gpurt.random)
from ._sanitizer import hooks as _csan
from .array import Array
from .device import bind_context, current_device, synchronize

__all__ = [
    "CUDAGraph",
    "GraphCaptureError",
    "GraphUpdateError",
    "GraphedCallable",
    "KernelNode",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
    "stream_capture_mode",
]

_NOT_CAPTURING = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
_INSTANTIATE_FLAGS = int(
    cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
)
_DOT_VERBOSE = int(cu.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE)
_LEGACY_STREAMS = (0, 1)  # the NULL stream and CU_STREAM_LEGACY: not capturable


# ---- CUDAGraph -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Capture:
    stream: Any  # the gpurt Stream being captured (kept alive while capturing)
    device: int
    pool: PoolId
    thread: int = dataclasses.field(default_factory=threading.get_ident)  # capture_begin's


class CUDAGraph:
    """Work captured from a stream, replayed with one launch (like torch.cuda.CUDAGraph).

    Capture with the :class:`graph` context manager (or ``capture_begin``/``capture_end``
    on a non-default current stream), then ``replay()`` on the current stream. Memory
    allocated during capture lives in the graph's private pool until ``reset()`` or garbage
    collection. ``kernel_nodes()`` and ``update()`` change a captured graph in place.
    """

    def __init__(self) -> None:
        self._state: _capture.GraphState | None = None
        self._capturing: _Capture | None = None
        self._finalizer: weakref.finalize | None = None
        self._debug = False
        self._generators = GraphGenerators()  # RNG hook: generators drawing in this graph
        self._accesses: Any = None  # the sanitizer's log of what the capture accessed

    def __repr__(self) -> str:
        capture = self._capturing
        if capture is not None:
            return f"CUDAGraph(capturing on cuda:{capture.device}, pool={capture.pool})"
        if self._state is not None:
            return f"CUDAGraph(cuda:{self._state.device}, pool={self._state.pools[0]})"
        return "CUDAGraph(empty)"

    def capture_begin(self, pool: PoolId | None = None, capture_error_mode: str = "global") -> None:
        """Begin capturing the current stream (wraps cuStreamBeginCapture); allocations on it
        come from the private pool ``pool`` (a new one when None) until capture ends.
        ``capture_error_mode`` is "global", "thread_local" or "relaxed" (CUstreamCaptureMode)."""
        mode = _capture.capture_mode(capture_error_mode)
        if self._capturing is not None:
            raise RuntimeError("this CUDAGraph is already capturing")
        if self._state is not None:
            raise RuntimeError(
                "this CUDAGraph already holds a captured graph; call reset() before capturing again"
            )
        stream = _streams.current_stream()
        if int(stream.cuda_stream) in _LEGACY_STREAMS:
            raise RuntimeError(
                "CUDA graphs must be captured on a non-default stream (use gpurt.graph(...) or "
                "`with gpurt.Stream():`); replaying on the default stream is fine"
            )
        index = stream.device_index
        pool_id = _memory.new_pool_id() if pool is None else _capture.pool_id(pool)
        _capture.drain_deferred()
        bind_context(index)
        capture = _Capture(stream, index, pool_id)
        self._generators.begin(index)  # RNG hook: generators enter capture mode
        _memory.retain_pool(index, pool_id)
        try:
            _memory.begin_allocate_to_pool(index, pool_id, int(stream.cuda_stream))
        except BaseException:
            _memory.release_pool(index, pool_id)
            self._generators.abort()  # RNG hook
            raise
        CAPTURES.thread_started(capture.thread)
        try:
            check(cu.cuStreamBeginCapture(stream.handle, mode), "cuStreamBeginCapture")
        except BaseException:
            self._stop_pool_routing(capture)
            _memory.release_pool(index, pool_id)
            self._generators.abort()  # RNG hook
            raise
        self._capturing = capture
        if _csan.ON:
            _csan.TRACKER.capture_begin(int(stream.cuda_stream), index)

    def capture_end(self) -> None:
        """End the capture and instantiate the graph (wraps cuStreamEndCapture and
        cuGraphInstantiate). A capture invalidated by an illegal call raises
        :class:`GraphCaptureError` after cleaning up."""
        capture = self._capturing
        if capture is None:
            raise RuntimeError("capture_end() without a matching capture_begin()")
        bind_context(capture.device)
        try:
            graph = check(cu.cuStreamEndCapture(capture.stream.handle), "cuStreamEndCapture")
        except CudaError as exc:
            if exc.name == _capture.WRONG_THREAD:  # the capture is still running on its own thread
                raise capture_error(exc, int(capture.stream.cuda_stream), aborted=False) from exc
            self._capturing = None
            self._generators.abort()  # RNG hook
            self._stop_pool_routing(capture)
            _memory.release_pool(capture.device, capture.pool)
            _capture.drain_deferred()
            raise capture_error(exc, int(capture.stream.cuda_stream), aborted=True) from exc
        self._capturing = None
        self._generators.end()  # RNG hook: each generator's increment per replay
        self._stop_pool_routing(capture)
        try:
            exec_ = check(cu.cuGraphInstantiate(graph, _INSTANTIATE_FLAGS), "cuGraphInstantiate")
        except BaseException:
            _quietly(cu.cuGraphDestroy, graph)
            _memory.release_pool(capture.device, capture.pool)
            raise
        state = _capture.GraphState(capture.device, graph, exec_, capture.pool)
        self._state = state
        self._finalizer = weakref.finalize(self, _capture.release, state)
        self._finalizer.atexit = False  # at exit the driver reclaims everything itself
        if not check(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[-1]:
            warnings.warn(
                "the captured CUDA graph is empty: no work was enqueued on the capturing stream "
                "(was it launched on another stream or device?)",
                UserWarning,
                stacklevel=2,
            )
        _capture.drain_deferred()

    def _stop_pool_routing(self, capture: _Capture) -> None:
        # every end of a capture comes here: the sanitizer's log of it (None when off)
        self._accesses = _csan.TRACKER.capture_end(int(capture.stream.cuda_stream),
                                                   capture.device)
        try:
            _memory.end_allocate_to_pool(capture.device, capture.pool)
        finally:
            CAPTURES.thread_stopped(capture.thread)

    def _abort_capture(self) -> None:
        """End a failed capture without instantiating it, never raising (used when the
        code being captured raised)."""
        capture = self._capturing
        if capture is None:
            return
        bind_context(capture.device)
        try:
            graph = check(cu.cuStreamEndCapture(capture.stream.handle), "cuStreamEndCapture")
        except CudaError as exc:
            if exc.name == _capture.WRONG_THREAD:
                warnings.warn(
                    "cannot abort a CUDA graph capture from another thread; end it on the "
                    "thread that began it",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
            graph = None  # an invalidated capture returns no graph
        self._capturing = None
        self._generators.abort()  # RNG hook
        if graph is not None and int(graph):
            _quietly(cu.cuGraphDestroy, graph)
        try:
            self._stop_pool_routing(capture)
            _memory.release_pool(capture.device, capture.pool)
        except Exception as exc:
            warnings.warn(
                f"releasing the pool of an aborted capture: {exc}", RuntimeWarning, stacklevel=3
            )
        _capture.drain_deferred()

    def replay(self) -> None:
        """Launch the graph on the current stream of its device (wraps cuGraphLaunch)."""
        state = self._state
        if state is None:
            raise RuntimeError("replay() needs a successful capture first")
        bind_context(state.device)
        handle = _streams.current_stream_handle(state.device)
        self._generators.replay(handle)  # RNG hook: fresh seed/offset for this replay
        if _csan.ON:
            _csan.replay(self._accesses, handle, state.device)
        check(cu.cuGraphLaunch(state.exec, handle), "cuGraphLaunch")

    def register_generator_state(self, generator: Any) -> None:
        """Let ``generator`` (a gpurt.Generator) draw inside this graph's next capture, like
        the capture device's default generator, which is registered automatically; call it
        before capture_begin(). See gpurt/_random/capture.py."""
        self._generators.register(generator)

    def reset(self) -> None:
        """Destroy the graph (cuGraphExecDestroy, cuGraphDestroy) and release its private
        pool, whose memory the next empty_cache() returns. The object can capture again."""
        if self._capturing is not None:
            raise RuntimeError("reset() during capture: call capture_end() first")
        state, finalizer = self._state, self._finalizer
        self._state = self._finalizer = self._accesses = None
        if state is not None and finalizer is not None and finalizer.detach() is not None:
            _capture.release(state, warn=True)  # detach() is None when the finalizer already ran
        _capture.drain_deferred()

    def pool(self) -> PoolId:
        """The id of this graph's private memory pool, to share it with another capture
        (``capture_begin(pool=g.pool())``)."""
        if self._state is not None:
            return self._state.pools[0]
        if self._capturing is not None:
            return self._capturing.pool
        raise RuntimeError("pool() needs a capture: call capture_begin() first")

    def enable_debug_mode(self) -> None:
        """Make ``debug_dump`` write verbose DOT (node parameters and handles)."""
        self._debug = True

    def debug_dump(self, path: str | os.PathLike[str]) -> None:
        """Write the graph as a Graphviz DOT file (wraps cuGraphDebugDotPrint)."""
        state = self._live()
        bind_context(state.device)
        flags = _DOT_VERBOSE if self._debug else 0
        check(
            cu.cuGraphDebugDotPrint(state.graph, os.fsencode(path), flags), "cuGraphDebugDotPrint"
        )

    def raw_cuda_graph(self) -> int:
        """The CUgraph handle as an int (owned by this object)."""
        return int(self._live().graph)

    def raw_cuda_graph_exec(self) -> int:
        """The CUgraphExec handle as an int (owned by this object)."""
        return int(self._live().exec)

    def kernel_nodes(self) -> list[KernelNode]:
        """The graph's kernel launches in dependency order (launch order for a
        single-stream capture); change their arguments with ``set_args``/``set_arg``."""
        state = self._live()
        bind_context(state.device)
        return [KernelNode(self, node, i) for i, node in enumerate(kernel_nodes_of(state.graph))]

    def update(self, source: CUDAGraph) -> None:
        """Take the node parameters of ``source``, a graph with the same topology (e.g. the
        same code captured with other arrays), without re-instantiating (wraps
        cuGraphExecUpdate). Raises :class:`GraphUpdateError` naming what differs when the
        driver refuses. Keeps ``source``'s memory pool alive as long as this graph."""
        state, other = self._live(), source._live()
        if other.device != state.device:
            raise ValueError(
                f"cannot update a graph on cuda:{state.device} from one on cuda:{other.device}"
            )
        bind_context(state.device)
        result = cu.cuGraphExecUpdate(state.exec, other.graph)
        try:
            check(result, "cuGraphExecUpdate")
        except CudaError as exc:
            raise _update_error(exc, result[1]) from None
        _copy_kernel_params(other.graph, state.graph)
        for pool in other.pools:
            _memory.retain_pool(state.device, pool)
            state.pools.append(pool)
        state.keepalive.setdefault("updates", []).append(dict(other.keepalive))

    def _live(self) -> _capture.GraphState:
        state = self._state
        if state is None:
            raise RuntimeError("this CUDAGraph holds no captured graph (capture one first)")
        return state


def _quietly(destroy: Callable[[Any], tuple], handle: Any) -> None:
    """Destroy a handle on an error path where a second error would hide the first."""
    try:
        check(destroy(handle))
    except CudaError:
        pass


def _update_error(exc: CudaError, info: Any) -> GraphUpdateError:
    """Explain a cuGraphExecUpdate refusal from its CUgraphExecUpdateResultInfo."""
    reason = getattr(getattr(info, "result", None), "name", "CU_GRAPH_EXEC_UPDATE_ERROR")
    node = getattr(info, "errorNode", None)
    kind = ""
    if node is not None and int(node):
        try:
            kind = check(cu.cuGraphNodeGetType(node), "cuGraphNodeGetType").name
        except CudaError:
            kind = f"0x{int(node):x}"
    return _capture.update_error(exc, reason, kind)


def _copy_kernel_params(source: Any, target: Any) -> None:
    """Mirror ``source``'s kernel parameters into ``target``'s nodes after an update, so
    kernel_nodes() and debug_dump() describe what the executable graph now runs."""
    for src, dst in zip(kernel_nodes_of(source), kernel_nodes_of(target)):
        params = check(cu.cuGraphKernelNodeGetParams(src), "cuGraphKernelNodeGetParams")
        check(cu.cuGraphKernelNodeSetParams(dst, params), "cuGraphKernelNodeSetParams")


# ---- module functions and the capture context ----------------------------------------


def graph_pool_handle() -> PoolId:
    """A new private-pool id that several captures can share (torch.cuda.graph_pool_handle)."""
    return _memory.new_pool_id()


def is_current_stream_capturing() -> bool:
    """True while the current stream of the current device is capturing (wraps
    cuStreamIsCapturing; also True for the legacy default stream while a blocking stream
    captures, since using it would break that capture). False before CUDA is initialised."""
    if not _driver.is_initialized():
        return False
    index = current_device()
    bind_context(index)
    try:
        status = check(
            cu.cuStreamIsCapturing(_streams.current_stream_handle(index)), "cuStreamIsCapturing"
        )
    except CudaError as exc:
        if exc.name == _capture.IMPLICIT:
            return True
        raise
    return status != _NOT_CAPTURING


class stream_capture_mode:
    """Context manager that sets this thread's stream-capture interaction mode ("global",
    "thread_local" or "relaxed") and restores the previous one on exit (wraps
    cuThreadExchangeStreamCaptureMode). "relaxed" lets this thread make calls that a
    capture on another thread would otherwise forbid."""

    def __init__(self, mode: str) -> None:
        self.mode = _capture.capture_mode(mode)
        self._previous: list[Any] = []

    def __enter__(self) -> stream_capture_mode:
        _driver.init()
        previous = check(
            cu.cuThreadExchangeStreamCaptureMode(self.mode), "cuThreadExchangeStreamCaptureMode"
        )
        self._previous.append(previous)
        return self

    def __exit__(self, *exc: object) -> None:
        check(
            cu.cuThreadExchangeStreamCaptureMode(self._previous.pop()),
            "cuThreadExchangeStreamCaptureMode",
        )


_capture_streams: dict[int, Any] = {}
_capture_streams_lock = threading.Lock()
renew_after_fork(globals(), _capture_streams_lock=threading.Lock)


def _default_capture_stream(index: int) -> Any:
    """One side stream per device for captures that name none (torch's
    graph.default_capture_stream)."""
    with _capture_streams_lock:
        stream = _capture_streams.get(index)
        if stream is None:
            stream = _capture_streams[index] = _streams.Stream(index)
    return stream


class graph:
    """Context manager that captures the work in its body into ``cuda_graph`` (like
    torch.cuda.graph): it synchronizes the device, collects garbage and empties the cache,
    makes ``stream`` (a side stream by default) and its device current, captures, and
    restores the current device and stream on exit. If the body raises, the capture is
    aborted cleanly and the error re-raised (a driver error caused by the capture as a
    :class:`GraphCaptureError` naming the illegal call)."""

    def __init__(
        self,
        cuda_graph: CUDAGraph,
        pool: PoolId | None = None,
        stream: Any = None,
        capture_error_mode: str = "global",
    ) -> None:
        _capture.capture_mode(capture_error_mode)
        self.cuda_graph = cuda_graph
        self.pool = None if pool is None else _capture.pool_id(pool)
        self.capture_error_mode = capture_error_mode
        if stream is None:
            stream = _default_capture_stream(current_device())
        self.capture_stream = stream
        self._stream_ctx = _streams.stream(self.capture_stream)  # also makes its device current

    def __enter__(self) -> CUDAGraph:
        synchronize(self.capture_stream.device_index)
        gc.collect()  # run pending finalizers now rather than during capture
        _memory.empty_cache()
        self._stream_ctx.__enter__()
        try:
            self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise
        return self.cuda_graph

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is None:
                self.cuda_graph.capture_end()
                return
            self.cuda_graph._abort_capture()
            if (
                isinstance(exc, CudaError)
                and not isinstance(exc, GraphCaptureError)
                and exc.name in _capture.CAPTURE_HINTS
            ):
                handle = int(self.capture_stream.cuda_stream)
                raise capture_error(exc, handle, aborted=True) from exc
        finally:
            self._stream_ctx.__exit__(None, None, None)


# ---- graphed callables ---------------------------------------------------------------


class GraphedCallable:
    """A function captured once into a CUDA graph. Calling it copies the new inputs into the
    static input arrays (on the current stream), replays the graph, and returns the static
    outputs: the same objects every call, overwritten by the next call. Arguments that are
    not gpurt Arrays were baked into the graph: they must be passed again unchanged."""

    def __init__(self, fn: Callable[..., Any], cuda_graph: CUDAGraph,
                 static_inputs: tuple[Any, ...], static_outputs: Any) -> None:
        self.fn = fn
        self.graph = cuda_graph
        self.static_inputs = static_inputs
        self.static_outputs = static_outputs
        self._is_array = tuple(isinstance(a, Array) for a in static_inputs)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"GraphedCallable({name}, {self.graph!r})"

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.static_inputs):
            raise TypeError(
                f"graphed {getattr(self.fn, '__name__', 'callable')} was captured with "
                f"{len(self.static_inputs)} arguments, got {len(args)}"
            )
        for i, (new, static, is_array) in enumerate(zip(args, self.static_inputs, self._is_array)):
            if new is static:
                continue
            if is_array:
                _copy_input(static, new, i)
            elif not _same_constant(new, static):
                raise ValueError(
                    f"argument {i} ({new!r}) differs from the value {static!r} the graph was "
                    "captured with; arguments other than gpurt Arrays are baked into the graph"
                )
        self.graph.replay()
        return self.static_outputs


def _same_constant(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _copy_input(static: Array, new: Any, position: int) -> None:
    """Copy ``new`` into the static input array so that a replay on the current stream
    sees it: a device-to-device copy on the current stream (after ``new``'s own stream)
    for contiguous gpurt Arrays, else ``static.copy_(new)`` (host data, foreign device
    arrays, strided views) followed by a wait."""
    shape = tuple(getattr(new, "shape", ()))
    if shape != static.shape:
        raise ValueError(f"argument {position}: expected shape {static.shape}, got {shape}")
    is_array = isinstance(new, Array)
    if is_array and new.dtype != static.dtype:
        raise ValueError(f"argument {position}: expected dtype {static.dtype}, got {new.dtype}")
    index = static.device.index
    current = _streams.current_stream(index)
    if is_array and new.device == static.device and new.is_contiguous() and static.is_contiguous():
        _order_after(current, new.stream)
        if static.nbytes:
            bind_context(index)
            check(
                cu.cuMemcpyDtoDAsync(static.ptr, new.ptr, static.nbytes, current.cuda_stream),
                "cuMemcpyDtoDAsync",
            )
        return
    static.copy_(new)  # on static's own stream
    _order_after(current, static.stream)


def _order_after(consumer: Any, producer: Any) -> None:
    """Make ``consumer`` wait for the work queued on ``producer`` unless they are the same
    stream (the legacy default stream under either of its handles, 0 and 1)."""
    a, b = int(consumer.cuda_stream), int(producer.cuda_stream)
    if a != b and not (a <= 1 and b <= 1):
        consumer.wait_stream(producer)


def make_graphed_callables(
    callables: Callable[..., Any] | Sequence[Callable[..., Any]],
    sample_args: tuple[Any, ...] | Sequence[tuple[Any, ...]],
    num_warmup_iters: int = 3,
    pool: PoolId | None = None,
) -> Any:
    """Capture inference functions into graphs (like torch.cuda.make_graphed_callables,
    without autograd). Each function must launch its work on the current stream using the
    arrays it is given; ``sample_args`` (a tuple per function) become the static inputs.
    Each function runs ``num_warmup_iters`` times on a side stream first (to compile and
    load kernels), then is captured; all captures share one private pool, so graphed
    callables made together must be called in the order given.

    Returns a :class:`GraphedCallable`, or a tuple of them for a sequence of functions.
    Arguments other than gpurt Arrays are constants baked into the graph."""
    single = callable(callables)
    fns = cast(tuple[Callable[..., Any], ...],
               (callables,) if single else tuple(cast(Sequence[Any], callables)))
    all_args = (sample_args,) if single else tuple(sample_args)
    if len(fns) != len(all_args):
        raise ValueError(f"got {len(fns)} callables but {len(all_args)} sample argument tuples")
    for fn, args in zip(fns, all_args):
        if not callable(fn):
            raise TypeError(f"expected a callable, got {fn!r}")
        if not isinstance(args, tuple):
            raise TypeError(f"sample_args must be a tuple of arguments per callable, got {args!r}")
    if num_warmup_iters < 0:
        raise ValueError(f"num_warmup_iters must be >= 0, got {num_warmup_iters}")
    index = current_device()
    synchronize(index)
    with _streams.stream(_streams.Stream(index)):
        for fn, args in zip(fns, all_args):
            for _ in range(num_warmup_iters):
                fn(*args)
    synchronize(index)
    shared_pool = graph_pool_handle() if pool is None else _capture.pool_id(pool)
    graphed = []
    for fn, args in zip(fns, all_args):
        cuda_graph = CUDAGraph()
        with graph(cuda_graph, pool=shared_pool):
            outputs = fn(*args)
        graphed.append(GraphedCallable(fn, cuda_graph, args, outputs))
    return graphed[0] if single else tuple(graphed)
