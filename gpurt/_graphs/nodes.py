"""The nodes of a captured CUDA graph, and changing kernel arguments without recapturing.

A captured graph is walked in dependency order (ties broken by the driver's node order, so a
single-stream capture lists its kernels in launch order). Each kernel node is a
:class:`KernelNode`; ``set_args``/``set_arg`` pack new values against the kernel's real
parameter layout (``cuFuncGetParamInfo``) and apply them to the executable graph with
``cuGraphExecKernelNodeSetParams`` (and to the graph node, so later reads and debug dumps
agree). Values are packed by the parameter sizes (:func:`pack_arg`, a pure function), or by
the declared parameter types when the gpurt Kernel is given (``Kernel.pack``).
"""

from __future__ import annotations

import ctypes
import heapq
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, cast

import numpy as np
from cuda.bindings import driver as cu

from .._core.driver import CudaError, check
from .._launch.kernel import Kernel
from ..device import bind_context
from .capture import GraphState


class CUDAGraph(Protocol):
    """What a kernel node needs of its gpurt.CUDAGraph (graphs.py imports this module, not
    the reverse)."""

    def _live(self) -> GraphState: ...

__all__ = ["KernelNode"]

_KERNEL = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
_POINTER_SIZE = 8
_FLOAT_FORMATS = {2: "<e", 4: "<f", 8: "<d"}


def pack_arg(value: Any, size: int, index: int) -> bytes:
    """The bytes a kernel parameter of ``size`` bytes receives for ``value``.

    Device arrays (anything with ``__cuda_array_interface__``, gpurt Arrays included) and
    ``None`` become pointers; numpy scalars, ctypes values and ``bytes`` must already have
    the parameter's size; a Python int fills the parameter as a little-endian integer
    (range-checked); a Python float becomes float16/32/64 by the parameter's size.
    """
    where = f"kernel parameter {index} ({size} bytes)"
    if value is None:
        return _pointer(0, size, where)
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is not None:
        return _pointer(int(interface["data"][0]), size, where)
    if isinstance(value, (bool, np.bool_)):
        return int(value).to_bytes(size, "little")
    if isinstance(value, int):
        try:
            return value.to_bytes(size, "little", signed=value < 0)
        except OverflowError:
            raise ValueError(f"{where}: {value} does not fit in {size} bytes") from None
    if isinstance(value, float):
        fmt = _FLOAT_FORMATS.get(size)
        if fmt is None:
            raise TypeError(f"{where}: a Python float needs a 2, 4 or 8 byte parameter")
        return struct.pack(fmt, value)
    if isinstance(value, (np.generic, np.ndarray)):
        if isinstance(value, np.ndarray) and value.ndim != 0:
            raise TypeError(
                f"{where}: got a host numpy array of shape {value.shape}; kernels take "
                "device arrays (gpurt.asarray copies host data to the device)"
            )
        raw = value.tobytes()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    elif isinstance(value, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union)):
        raw = bytes(value)
    else:
        raise TypeError(
            f"{where}: cannot pass {type(value).__name__}; use a device array, None, an int, "
            "a float, a numpy scalar, a ctypes value or bytes"
        )
    if len(raw) != size:
        raise TypeError(f"{where}: got a {len(raw)}-byte {type(value).__name__}")
    return raw


def _pointer(address: int, size: int, where: str) -> bytes:
    if size != _POINTER_SIZE:
        raise TypeError(f"{where}: a device pointer needs an 8-byte parameter")
    return address.to_bytes(_POINTER_SIZE, "little")


def topological_order(nodes: Sequence[int], edges: Iterable[tuple[int, int]]) -> list[int]:
    """``nodes`` in dependency order (every edge ``(a, b)`` puts ``a`` before ``b``); among
    nodes that are ready together, the one listed first in ``nodes`` comes first."""
    position = {node: i for i, node in enumerate(nodes)}
    waiting_on = dict.fromkeys(nodes, 0)
    after: dict[int, list[int]] = {node: [] for node in nodes}
    for a, b in edges:
        after[a].append(b)
        waiting_on[b] += 1
    ready = [position[n] for n in nodes if waiting_on[n] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for nxt in after[node]:
            waiting_on[nxt] -= 1
            if waiting_on[nxt] == 0:
                heapq.heappush(ready, position[nxt])
    if len(order) != len(nodes):
        raise ValueError("the graph has a dependency cycle")
    return order


def ordered_nodes(graph: Any) -> list[Any]:
    """The nodes of ``graph`` (a CUgraph) in dependency order (wraps cuGraphGetNodes and
    cuGraphGetEdges; both return the count last on cuda-bindings 12.x and 13.x)."""
    count = check(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[-1]
    if not count:
        return []
    nodes = list(check(cu.cuGraphGetNodes(graph, count), "cuGraphGetNodes")[0])[:count]
    n_edges = check(cu.cuGraphGetEdges(graph, 0), "cuGraphGetEdges")[-1]
    edges: list[tuple[int, int]] = []
    if n_edges:
        out = check(cu.cuGraphGetEdges(graph, n_edges), "cuGraphGetEdges")
        edges = [(int(a), int(b)) for a, b in zip(out[0][:n_edges], out[1][:n_edges])]
    by_handle = {int(node): node for node in nodes}
    return [by_handle[h] for h in topological_order([int(n) for n in nodes], edges)]


def kernel_nodes_of(graph: Any) -> list[Any]:
    """The kernel nodes of ``graph`` in dependency order."""
    return [
        node for node in ordered_nodes(graph)
        if check(cu.cuGraphNodeGetType(node), "cuGraphNodeGetType") == _KERNEL
    ]


def param_layout(params: Any) -> list[tuple[int, int]]:
    """(offset, size) of every parameter of the node's kernel (wraps cuFuncGetParamInfo, or
    cuKernelGetParamInfo for a node that names a library kernel; CUDA 12.4+)."""
    if int(params.func):
        query, target, call = cu.cuFuncGetParamInfo, params.func, "cuFuncGetParamInfo"
    else:
        query, target, call = cu.cuKernelGetParamInfo, params.kern, "cuKernelGetParamInfo"
    layout: list[tuple[int, int]] = []
    while True:
        try:
            offset, size = check(query(target, len(layout)), call)
        except CudaError as exc:
            if exc.name == "CUDA_ERROR_INVALID_VALUE":  # past the last parameter
                return layout
            raise
        layout.append((int(offset), int(size)))


class KernelNode:
    """One kernel launch inside a captured :class:`~gpurt.CUDAGraph`.

    ``set_args(*args)`` / ``set_arg(i, value)`` change what the next replays pass to the
    kernel, without recapturing or re-instantiating (wraps cuGraphExecKernelNodeSetParams).
    Arrays passed here are kept alive by the graph until it is reset.
    """

    __slots__ = ("_graph", "_node", "index", "_layout")

    def __init__(self, graph: CUDAGraph, node: Any, index: int) -> None:
        self._graph = graph
        self._node = node
        self.index = index
        self._layout: list[tuple[int, int]] | None = None

    def __repr__(self) -> str:
        return f"KernelNode(index={self.index}, node=0x{int(self._node):x})"

    def _params(self) -> Any:
        bind_context(self._graph._live().device)
        return check(cu.cuGraphKernelNodeGetParams(self._node), "cuGraphKernelNodeGetParams")

    @property
    def name(self) -> str:
        """The kernel's (possibly mangled) name (wraps cuFuncGetName / cuKernelGetName)."""
        p = self._params()
        if int(p.func):
            raw = check(cu.cuFuncGetName(p.func), "cuFuncGetName")
        else:
            raw = check(cu.cuKernelGetName(p.kern), "cuKernelGetName")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    @property
    def grid(self) -> tuple[int, int, int]:
        p = self._params()
        return (int(p.gridDimX), int(p.gridDimY), int(p.gridDimZ))

    @property
    def block(self) -> tuple[int, int, int]:
        p = self._params()
        return (int(p.blockDimX), int(p.blockDimY), int(p.blockDimZ))

    @property
    def shared_mem(self) -> int:
        return int(self._params().sharedMemBytes)

    @property
    def param_sizes(self) -> tuple[int, ...]:
        """Size in bytes of each kernel parameter, in declaration order."""
        return tuple(size for _, size in self._param_layout(self._params()))

    @property
    def args(self) -> tuple[bytes, ...]:
        """The raw bytes each parameter currently receives."""
        params = self._params()
        return tuple(self._current(params, self._param_layout(params)))

    def set_args(self, *args: Any, kernel: Kernel | None = None) -> None:
        """Replace every argument. Given the gpurt ``kernel`` this node launches, values
        are converted by its declared parameter types, exactly as a launch would;
        otherwise by the parameter sizes (:func:`pack_arg`)."""
        params = self._params()
        layout = self._param_layout(params)
        if len(args) != len(layout):
            raise TypeError(
                f"kernel node {self.index} takes {len(layout)} arguments, got {len(args)}"
            )
        if kernel is None:
            values = [pack_arg(v, size, i) for i, (v, (_, size)) in enumerate(zip(args, layout))]
        else:
            raw = kernel.pack(*args, device=self._graph._live().device)
            if layout and len(raw) < layout[-1][0] + layout[-1][1]:
                raise TypeError(
                    f"kernel node {self.index}: {kernel!r} packs {len(raw)} bytes of "
                    "arguments, fewer than this node's kernel takes; is it the same kernel?"
                )
            values = [raw[offset: offset + size] for offset, size in layout]
        self._apply(params, values, dict(enumerate(args)))

    def set_arg(self, position: int, value: Any) -> None:
        """Replace one argument, keeping the others."""
        params = self._params()
        layout = self._param_layout(params)
        if not 0 <= position < len(layout):
            raise IndexError(
                f"kernel node {self.index} has {len(layout)} parameters; no parameter {position}"
            )
        values = self._current(params, layout)
        values[position] = pack_arg(value, layout[position][1], position)
        self._apply(params, values, {position: value})

    def _param_layout(self, params: Any) -> list[tuple[int, int]]:
        if self._layout is None:
            self._layout = param_layout(params)
        return self._layout

    def _current(self, params: Any, layout: list[tuple[int, int]]) -> list[bytes]:
        address = int(params.kernelParams)
        if not layout:
            return []
        if not address:
            raise RuntimeError(
                f"kernel node {self.index} passes its arguments through 'extra'; "
                "use set_args() with every argument"
            )
        pointers = (ctypes.c_void_p * len(layout)).from_address(address)
        return [ctypes.string_at(cast(int, pointers[i]), size)
                for i, (_, size) in enumerate(layout)]

    def _apply(self, params: Any, values: list[bytes], keep: dict[int, Any]) -> None:
        state = self._graph._live()
        storage = [ctypes.create_string_buffer(v, max(len(v), 1)) for v in values]
        pointers = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.addressof(s) for s in storage]
        )
        params.kernelParams = ctypes.addressof(pointers)
        params.extra = 0
        check(
            cu.cuGraphExecKernelNodeSetParams(state.exec, self._node, params),
            "cuGraphExecKernelNodeSetParams",
        )
        check(cu.cuGraphKernelNodeSetParams(self._node, params), "cuGraphKernelNodeSetParams")
        state.keepalive.setdefault(("args", int(self._node)), {}).update(keep)
