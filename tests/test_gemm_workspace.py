"""Split-K's partial sums come from a workspace kept per (device, stream)
(kernels/_gemm_workspace.py): reused while big enough, grown otherwise, fresh per call on a
capturing stream or the per-thread default stream, at most MAX_KEPT streams, dropped by
clear_plans; the fused wgmma split-K's ticket counters lie in front of the partials, zeroed
once. On the GPU: split-K results stay right call after call, on two streams, and in a
replayed graph."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import pytest

import gpurt
from gpurt._streams import kept as kept_mod
from gpurt._streams.kept import PER_THREAD_STREAM, KeptPerStream
from test_gemm import check_replays, device, poisoned, rand, reference, rel_err

workspace = importlib.import_module("gpurt.kernels._gemm_workspace")
gemm_mod = importlib.import_module("gpurt.kernels.gemm")
tune = importlib.import_module("gpurt.kernels._gemm_tune")


class _Made:
    def __init__(self, count: int, dtype: Any, handle: int, zeroed: bool) -> None:
        self.shape, self.handle, self.zeroed = (count,), handle, zeroed
        self.nbytes, self.ptr = 4 * count, 0x10000 * (1 + len(_made))
        _made.append(self)


_made: list[_Made] = []


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The workspace module on fakes: ``made`` lists the arrays it allocated, ``capturing``
    the stream handles that capture."""
    state: dict[str, Any] = {"made": _made, "capturing": set()}
    _made.clear()

    def allocator(zeroed: bool) -> Any:
        def make(count: int, dtype: Any, device: int, stream: Any) -> _Made:
            assert dtype in (np.float32, np.uint32) and device == 0
            return _Made(count, dtype, stream, zeroed)
        return make

    monkeypatch.setattr(workspace, "_kept", KeptPerStream(workspace.MAX_KEPT))
    monkeypatch.setattr(workspace.gpurt, "empty", allocator(False))
    monkeypatch.setattr(workspace.gpurt, "zeros", allocator(True))
    monkeypatch.setattr(workspace.gpurt, "as_stream", lambda handle, index: handle)
    monkeypatch.setattr(workspace, "current_stream_handle", lambda index: 7)
    monkeypatch.setattr(kept_mod, "stream_is_capturing",
                        lambda index, handle: handle in state["capturing"])
    # a capture id per stream and capture: ``captures`` counts the captures begun
    state["captures"] = 1
    monkeypatch.setattr(workspace, "capture_id", lambda index, handle: 100 * state["captures"]
                        + handle if handle in state["capturing"] else None)
    monkeypatch.setattr(workspace, "_captured", KeptPerStream(workspace.MAX_KEPT))
    monkeypatch.setattr(workspace.CAPTURES, "count", 0)
    return state


def test_partials_pad_each_row_to_four_floats() -> None:
    """Split-K's partial rows are 16-byte aligned at any N (the simt kernel's partial_pitch)."""
    assert [workspace.partials_for(3, 5, n) for n in (1, 4, 7, 8, 4093)] == \
        [60, 60, 120, 120, 15 * 4096]


def test_a_stream_keeps_its_workspace_and_grows_it(fake: dict[str, Any]) -> None:
    first = workspace.take(0, None, 100)  # None: the current stream (7)
    assert first.arrays[0].handle == 7 and workspace.take(0, 7, 100) is first
    assert workspace.take(0, 7, 60) is first  # smaller: the same one
    grown = workspace.take(0, 7, 300)
    assert grown is not first and grown.partial_room == 300
    assert workspace.take(0, None, 100) is grown
    other = workspace.take(0, 9, 100)  # another stream: its own
    assert other is not grown and other.arrays[0].handle == 9
    assert len(fake["made"]) == 3 and all(made.zeroed for made in fake["made"])
    assert workspace.kept_bytes() == 4 * (300 + 100)


def test_counters_lie_in_front_of_the_partials_zeroed_and_apart(fake: dict[str, Any]) -> None:
    """The counters (zeroed once when the workspace is made, left zero by the kernels) never
    overlap partials: a call of another shape never finds a partial sum where its counters
    lie. A workspace grows both regions to what either call needed."""
    one = workspace.take(0, 7, 100, 6)
    array = one.arrays[0]
    assert array.zeroed and one.counters == array.ptr and one.counter_room == 32  # 128-byte
    assert one.partials == array.ptr + 4 * 32 and one.partial_room == 100
    assert workspace.take(0, 7, 50, 32) is one
    more = workspace.take(0, 7, 50, 33)  # more counters: a new zeroed workspace
    assert more is not one and more.arrays[0].zeroed
    assert (more.counter_room, more.partial_room) == (64, 100)
    assert more.partials - more.counters == 4 * 64 and more.partials % 128 == 0
    assert workspace.take(0, 7, 100, 64) is more


def test_a_capturing_stream_shares_one_workspace_per_capture(
        fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """While a stream captures, its calls share a workspace of the capture's own (graph
    memory, not the stream's), grown as calls need; its counters are zeroed when it is made
    (one memset node per capture and stream, not one per call). Another stream of the same
    capture, and a later capture of the stream, get their own; once no capture is underway
    they are dropped and the stream's kept workspace is back."""
    kept = workspace.take(0, 5, 100)
    fake["capturing"].update((5, 6))
    monkeypatch.setattr(workspace.CAPTURES, "count", 1)
    one = workspace.take(0, 5, 100, 4)
    assert one is not kept and workspace.take(0, 5, 60, 2) is one
    partials, counters = one.arrays  # the capture's own, its counters zeroed
    assert counters.zeroed and not partials.zeroed and one.counters == counters.ptr
    assert (one.counter_room, one.partial_room) == (4, 100)
    other = workspace.take(0, 6, 100, 4)  # another stream of the capture
    assert other is not one and workspace.take(0, 5, 100, 4) is one
    grown = workspace.take(0, 5, 300, 2)  # more room: a new one, both regions grown
    assert (grown.counter_room, grown.partial_room) == (4, 300) and grown.arrays[1].zeroed
    assert workspace.take(0, 5, 100, 4) is grown
    fake["captures"] += 1  # the stream captures again: a new graph, its own workspace
    again = workspace.take(0, 5, 100, 4)
    assert again is not grown and workspace.take(0, 5, 100, 4) is again
    assert len(fake["made"]) == 1 + 2 * 4 and workspace.kept_bytes() == 4 * 100
    fake["capturing"].clear()
    monkeypatch.setattr(workspace.CAPTURES, "count", 0)
    assert workspace.take(0, 5, 100) is kept and len(workspace._captured) == 0


def test_at_most_max_kept_streams_and_clear(fake: dict[str, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    handles = range(10, 10 + workspace.MAX_KEPT + 1)
    arrays = [workspace.take(0, handle, 10) for handle in handles]
    assert workspace.kept_bytes() == 40 * workspace.MAX_KEPT
    assert workspace.take(0, 10, 10) is not arrays[0]  # the least recently used was dropped
    assert workspace.take(0, handles[-1], 10) is arrays[-1]
    gemm_mod.clear_plans()
    assert workspace.kept_bytes() == 0


def test_the_per_thread_default_stream_keeps_none(fake: dict[str, Any]) -> None:
    """CU_STREAM_PER_THREAD is one handle but a different stream in each thread: two threads
    sharing a workspace through it would race, so each call gets its own memory."""
    one, two = workspace.take(0, PER_THREAD_STREAM, 10, 4), workspace.take(0, PER_THREAD_STREAM, 10)
    assert one is not two and one.arrays[1].zeroed and workspace.kept_bytes() == 0


def test_packed_scratch_is_aligned_kept_and_grown_alone(fake: dict[str, Any]) -> None:
    """The copies' scratch is a second array from a 128-byte boundary: kept per stream,
    grown without touching the (zeroed) split-K array and the other way round, fresh while
    the stream captures."""
    one = workspace.take(0, 7, 100, 4, scratch=1000)
    main, scratch = one.arrays
    assert main.zeroed and not scratch.zeroed
    assert one.scratch % 128 == 0 and one.scratch_room >= 1000
    assert one.scratch + one.scratch_room <= scratch.ptr + 4 * scratch.shape[0]
    assert workspace.take(0, 7, 50, 0, scratch=900) is one
    assert workspace.take(0, 7, 100, 4) is one  # no scratch asked: the same one
    bigger = workspace.take(0, 7, 10, 0, scratch=5000)
    assert bigger.arrays[0] is main and bigger.arrays[1] is not scratch
    assert (bigger.partials, bigger.partial_room, bigger.counter_room) == \
        (one.partials, one.partial_room, one.counter_room)
    more = workspace.take(0, 7, 400, 4)
    assert more.arrays[1] is bigger.arrays[1] and more.scratch == bigger.scratch
    assert more.arrays[0] is not main and more.partial_room == 400
    assert workspace.kept_bytes() == sum(array.nbytes for array in more.arrays)
    fake["capturing"].add(7)
    fresh = workspace.take(0, 7, 0, 0, scratch=300)
    assert fresh.arrays[-1] not in more.arrays and fresh.scratch % 128 == 0
    fake["capturing"].clear()
    assert workspace.take(0, 7, 0, 0, scratch=300) is more


# ---- on the GPU ----------------------------------------------------------------------------------


def _split_configs() -> list[Any]:
    configs = [dataclasses.replace(tune._MMA[3], split_k=3)]
    if gpurt.is_available() and gpurt.get_device_capability() == (9, 0):
        configs.append(dataclasses.replace(tune._WGMMA[1], split_k=4))  # fused, one launch
    return configs


@pytest.mark.gpu
def test_split_k_is_right_call_after_call_on_two_streams_and_in_a_graph(gpu_state) -> None:
    rng = np.random.default_rng(17)
    m, n, k = 136, 264, 4096
    for config in _split_configs():
        gemm_mod.clear_plans()
        side = gpurt.Stream()
        for stream in (None, side, None, side):
            a, b = rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16)
            out = poisoned((m, n), gpurt.bfloat16)
            gpurt.synchronize()  # the inputs are ready for the side stream too
            gemm_mod.gemm(device(a), device(b), out=out, config=config, stream=stream)
            gpurt.synchronize()
            assert rel_err(out.numpy(), reference(a, b)) < 1e-2, config.label()
        assert workspace.kept_bytes() >= 2 * 4 * config.split_k * m * n  # two streams
        # captured: the graph's own partials; each replay reads the inputs as they are then
        a, b = rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16)
        da, db, out = device(a), device(b), poisoned((m, n), gpurt.bfloat16)
        gemm_mod.gemm(da, db, out=out, config=config)  # planned before the capture
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph):
            gemm_mod.gemm(da, db, out=out, config=config)
        check_replays(graph, da, db, out, rng, config.label())
        del graph
        gemm_mod.clear_plans()
        assert workspace.kept_bytes() == 0


def _node_types(graph: Any) -> list[str]:
    from cuda.bindings import driver as cu

    from gpurt._graphs.nodes import ordered_nodes

    return [cu.cuGraphNodeGetType(node)[1].name.removeprefix("CU_GRAPH_NODE_TYPE_")
            for node in ordered_nodes(graph._live().graph)]


@pytest.mark.gpu
def test_a_captured_graph_of_split_k_calls_zeroes_its_counters_once(gpu_state) -> None:
    """Three split-K calls captured on one stream share the capture's workspace: one memset
    node (the counters), then the three kernels; every replay right on fresh inputs, and
    after the capture the stream's own workspace is used again."""
    rng = np.random.default_rng(23)
    m, n, k = 136, 264, 4096
    for config in _split_configs():
        gemm_mod.clear_plans()
        pairs = [(rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16))
                 for _ in range(3)]
        inputs = [(device(a), device(b)) for a, b in pairs]
        outs = [poisoned((m, n), gpurt.bfloat16) for _ in inputs]
        for (da, db), out in zip(inputs, outs):  # planned before the capture
            gemm_mod.gemm(da, db, out=out, config=config)
        kept = workspace.kept_bytes()
        graph = gpurt.CUDAGraph()
        with gpurt.graph(graph):
            for (da, db), out in zip(inputs, outs):
                gemm_mod.gemm(da, db, out=out, config=config)
        assert _node_types(graph) == ["MEMSET"] + ["KERNEL"] * 3, config.label()
        for _ in range(2):
            pairs = [(rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16))
                     for _ in range(3)]
            for (a, b), (da, db), out in zip(pairs, inputs, outs):
                da.copy_(device(a))
                db.copy_(device(b))
                out.copy_(poisoned((m, n), gpurt.bfloat16))
            graph.replay()
            gpurt.synchronize()
            for (a, b), out in zip(pairs, outs):
                assert rel_err(out.numpy(), reference(a, b)) < 1e-2, config.label()
        da, db = inputs[0]
        gemm_mod.gemm(da, db, out=outs[0], config=config)  # eager again: the kept one
        assert workspace.kept_bytes() == kept and len(workspace._captured) == 0
        del graph
        gemm_mod.clear_plans()
