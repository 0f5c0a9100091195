"""A pretend graph driver and allocator for CPU tests of gpurt.graphs' bookkeeping.

:class:`FakeGraphDriver` answers the stream-capture and graph calls gpurt.graphs makes the
way the driver does (capture state per stream, handles that die once destroyed, an invalid
capture returns no graph), and :class:`FakePools` records the private-pool calls into
gpurt.memory with a reference count per pool. The ``fake_graphs`` fixture installs both over
the streams helper's ``fake_driver``; the real driver runs the same code in the gpu tests.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import threading
from typing import Any

import pytest
from cuda.bindings import driver as cu

from _fakes import FakeDriver, fake_driver, fake_gpus  # noqa: F401  (fixtures used below)
from gpurt import graphs
from gpurt._core.captures import CAPTURES
from gpurt._graphs import capture as _capture
from gpurt._graphs import nodes as _graph_nodes

OK = cu.CUresult.CUDA_SUCCESS
INVALID_VALUE = cu.CUresult.CUDA_ERROR_INVALID_VALUE
ACTIVE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
INVALIDATED = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED
NONE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class FakeKernel:
    """A kernel's parameter layout and the node-owned argument storage the driver keeps."""

    def __init__(self, sizes: list[int], values: list[bytes]) -> None:
        self.layout = []
        offset = 0
        for size in sizes:
            offset = (offset + size - 1) // size * size
            self.layout.append((offset, size))
            offset += size
        self.set(values)

    def set(self, values: list[bytes]) -> None:
        self.values = list(values)
        self._storage = [ctypes.create_string_buffer(v, len(v)) for v in values]
        self._pointers = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.addressof(s) for s in self._storage]
        )


class FakeGraphDriver:
    """The capture and graph calls of gpurt.graphs, on bookkeeping only."""

    def __init__(self, streams: FakeDriver) -> None:
        self.streams = streams
        self._ids = itertools.count(0x9000, 0x10)
        self.capturing: dict[int, dict[str, Any]] = {}  # stream -> mode, nodes, status
        self.graphs: dict[int, dict[str, Any]] = {}  # graph -> alive, nodes (kernels)
        self.execs: dict[int, dict[str, Any]] = {}  # exec -> alive, graph
        self.launches: list[tuple[int, int]] = []  # (exec, stream)
        self.calls: list[str] = []
        self.begin_result = OK
        self.thread_modes: dict[int, Any] = {}
        self.exec_params: dict[tuple[int, int], list[bytes]] = {}  # (exec, node) -> args
        self.copies: list[tuple[int, int, int, int]] = []  # dst, src, bytes, stream

    # -- test helpers --
    def launch_kernel(self, stream: Any, sizes: list[int], values: list[bytes]) -> None:
        """Pretend a kernel was launched on ``stream`` (captured if it is capturing)."""
        capture = self.capturing.get(int(stream))
        if capture is not None:
            capture["kernels"].append(FakeKernel(sizes, values))

    def break_capture(self, stream: Any) -> None:
        self.capturing[int(stream)]["status"] = INVALIDATED

    def live(self, table: dict[int, dict[str, Any]]) -> int:
        return sum(1 for info in table.values() if info["alive"])

    # -- capture --
    def cuStreamBeginCapture(self, stream: Any, mode: Any) -> tuple:
        self.calls.append("cuStreamBeginCapture")
        if self.begin_result != OK:
            return (self.begin_result,)
        if int(stream) in self.capturing:
            return (cu.CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        self.capturing[int(stream)] = {"mode": mode, "kernels": [], "status": ACTIVE,
                                       "thread": threading.get_ident()}
        return (OK,)

    def cuStreamEndCapture(self, stream: Any) -> tuple:
        self.calls.append("cuStreamEndCapture")
        capture = self.capturing.get(int(stream))
        if capture is None:
            return (cu.CUresult.CUDA_ERROR_ILLEGAL_STATE, None)
        relaxed = capture["mode"] == cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        if capture["thread"] != threading.get_ident() and not relaxed:
            return (cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, None)
        del self.capturing[int(stream)]
        if capture["status"] == INVALIDATED:
            return (cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None)
        handle = next(self._ids)
        self.graphs[handle] = {"alive": True, "kernels": capture["kernels"],
                               "nodes": [next(self._ids) for _ in capture["kernels"]]}
        return OK, cu.CUgraph(handle)

    def cuStreamIsCapturing(self, stream: Any) -> tuple:
        capture = self.capturing.get(int(stream))
        return OK, (capture["status"] if capture else NONE)

    def cuThreadExchangeStreamCaptureMode(self, mode: Any) -> tuple:
        key = threading.get_ident()
        previous = self.thread_modes.get(key, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        self.thread_modes[key] = mode
        return OK, previous

    # -- graphs --
    def _graph(self, graph: Any) -> dict[str, Any] | None:
        info = self.graphs.get(int(graph))
        return info if info and info["alive"] else None

    def cuGraphInstantiate(self, graph: Any, flags: int) -> tuple:
        self.calls.append(f"cuGraphInstantiate(flags={int(flags)})")
        if self._graph(graph) is None:
            return (INVALID_VALUE, None)
        handle = next(self._ids)
        self.execs[handle] = {"alive": True, "graph": int(graph)}
        return OK, cu.CUgraphExec(handle)

    def cuGraphLaunch(self, exec_: Any, stream: Any) -> tuple:
        info = self.execs.get(int(exec_))
        if not info or not info["alive"]:
            return (INVALID_VALUE,)
        self.launches.append((int(exec_), int(stream)))
        return (OK,)

    def cuGraphExecDestroy(self, exec_: Any) -> tuple:
        self.calls.append("cuGraphExecDestroy")
        info = self.execs.get(int(exec_))
        if not info or not info["alive"]:
            return (INVALID_VALUE,)
        info["alive"] = False
        return (OK,)

    def cuGraphDestroy(self, graph: Any) -> tuple:
        self.calls.append("cuGraphDestroy")
        info = self._graph(graph)
        if info is None:
            return (INVALID_VALUE,)
        info["alive"] = False
        return (OK,)

    def cuGraphGetNodes(self, graph: Any, count: int = 0) -> tuple:
        info = self._graph(graph)
        if info is None:
            return (INVALID_VALUE, None, 0)
        nodes = info["nodes"]
        listed = [cu.CUgraphNode(n) for n in nodes[:count]] if count else []
        return OK, listed, len(nodes)

    def cuGraphGetEdges(self, graph: Any, count: int = 0) -> tuple:
        nodes = self.graphs[int(graph)]["nodes"]
        edges = list(zip(nodes, nodes[1:]))  # a single-stream chain
        if not count:
            return OK, [], [], len(edges)
        return (OK, [cu.CUgraphNode(a) for a, _ in edges][:count],
                [cu.CUgraphNode(b) for _, b in edges][:count], len(edges))

    def cuGraphNodeGetType(self, node: Any) -> tuple:
        return OK, cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL

    def _kernel(self, node: Any) -> FakeKernel:
        for info in self.graphs.values():
            if int(node) in info["nodes"]:
                return info["kernels"][info["nodes"].index(int(node))]
        raise KeyError(int(node))

    def cuGraphKernelNodeGetParams(self, node: Any) -> tuple:
        kernel = self._kernel(node)
        params = cu.CUDA_KERNEL_NODE_PARAMS()
        params.func = cu.CUfunction(int(node))  # one fake function per node
        params.gridDimX, params.blockDimX = 4, 256
        params.gridDimY = params.gridDimZ = params.blockDimY = params.blockDimZ = 1
        params.kernelParams = ctypes.addressof(kernel._pointers)
        return OK, params

    def cuFuncGetName(self, func: Any) -> tuple:
        return OK, f"kernel_{int(func):x}".encode()

    def cuFuncGetParamInfo(self, func: Any, index: int) -> tuple:
        layout = self._kernel(int(func)).layout
        if index >= len(layout):
            return (INVALID_VALUE, 0, 0)
        return (OK, *layout[index])

    def _read_args(self, node: Any, params: Any) -> list[bytes]:
        layout = self._kernel(node).layout
        pointers = (ctypes.c_void_p * len(layout)).from_address(int(params.kernelParams))
        return [ctypes.string_at(pointers[i], size) for i, (_, size) in enumerate(layout)]

    def cuGraphExecKernelNodeSetParams(self, exec_: Any, node: Any, params: Any) -> tuple:
        self.exec_params[(int(exec_), int(node))] = self._read_args(node, params)
        return (OK,)

    def cuGraphKernelNodeSetParams(self, node: Any, params: Any) -> tuple:
        self._kernel(node).set(self._read_args(node, params))
        return (OK,)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, nbytes: int, stream: Any) -> tuple:
        self.copies.append((int(dst), int(src), int(nbytes), int(stream)))
        return (OK,)

    def cuGraphDebugDotPrint(self, graph: Any, path: bytes, flags: int) -> tuple:
        if self._graph(graph) is None:
            return (INVALID_VALUE,)
        with open(path, "w") as fh:
            fh.write(f"digraph fake {{ // flags={int(flags)}\n}}\n")
        return (OK,)


class FakePools:
    """Stands in for gpurt.memory's private-pool API, counting references per pool."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.refs: collections.Counter[tuple[int, tuple[int, int]]] = collections.Counter()
        self.routing: dict[tuple[int, int], tuple[int, int]] = {}  # (device, stream) -> pool
        self.calls: list[tuple[str, Any]] = []

    def new_pool_id(self) -> tuple[int, int]:
        return (0, next(self._ids))

    def retain_pool(self, index: int, pool: tuple[int, int]) -> None:
        self.calls.append(("retain", pool))
        self.refs[(index, pool)] += 1

    def release_pool(self, index: int, pool: tuple[int, int]) -> None:
        self.calls.append(("release", pool))
        assert self.refs[(index, pool)] > 0, f"pool {pool} released more often than retained"
        self.refs[(index, pool)] -= 1

    def begin_allocate_to_pool(self, index: int, pool: tuple[int, int], stream: int) -> None:
        self.calls.append(("begin", pool))
        self.routing[(index, stream)] = pool
        CAPTURES.add(1)  # as the real allocators count a capture (gpurt/_core/captures.py)

    def end_allocate_to_pool(self, index: int, pool: tuple[int, int]) -> None:
        self.calls.append(("end", pool))
        keys = [k for k, p in self.routing.items() if p == pool and k[0] == index]
        if not keys:
            raise RuntimeError(f"not allocating to private pool {pool!r}")
        for key in keys:
            del self.routing[key]
        CAPTURES.add(-1)

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", None))

    def held(self) -> int:
        """Pools that some graph still holds a reference to."""
        return sum(1 for n in self.refs.values() if n)


class FakeGraphs:
    def __init__(self, streams: FakeDriver, driver: FakeGraphDriver, pools: FakePools) -> None:
        self.streams = streams
        self.driver = driver
        self.pools = pools


@pytest.fixture
def fake_graphs(
    fake_driver: FakeDriver, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> FakeGraphs:
    """The streams helper's ``fake_driver`` (two pretend devices, fake streams) plus a
    fake graph driver and allocator under gpurt.graphs, with fresh capture bookkeeping."""
    driver = FakeGraphDriver(fake_driver)
    pools = FakePools()
    for module in (graphs, _capture, _graph_nodes):
        monkeypatch.setattr(module, "cu", driver)
        monkeypatch.setattr(module, "bind_context", fake_driver.contexts.bind)
    monkeypatch.setattr(graphs, "_memory", pools)
    monkeypatch.setattr(_capture, "_memory", pools)
    monkeypatch.setattr(graphs, "synchronize", lambda index=None: driver.calls.append("sync"))
    monkeypatch.setattr(graphs, "_capture_streams", {})
    monkeypatch.setattr(CAPTURES, "_later", collections.deque())
    monkeypatch.setattr(CAPTURES, "count", 0)
    return FakeGraphs(fake_driver, driver, pools)
