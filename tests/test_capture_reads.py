"""Host reads of device data, and copies from host memory, during a CUDA graph capture raise
GraphCaptureError naming the operation (issue #18), from the capturing thread only, and
leave the capture and the process usable. CPU: the bookkeeping over the fake graph driver;
GPU: the real thing."""

from __future__ import annotations

import threading
import timeit
import types

import numpy as np
import pytest

import gpurt
from _graph_fakes import FakeGraphs, fake_driver, fake_gpus, fake_graphs  # noqa: F401
from gpurt._core.captures import CAPTURES
from gpurt.graphs import GraphCaptureError

N = 4096


def stub() -> types.SimpleNamespace:
    """Enough of an Array for the checks that come before any device access."""
    return types.SimpleNamespace(size=1, shape=(1,), dtype=np.dtype(np.float32))


READS = {
    "Array.to_numpy()": lambda a: gpurt.Array.to_numpy(a),
    "Array.numpy()": lambda a: gpurt.Array.numpy(a),
    "Array.item()": lambda a: gpurt.Array.item(a),
    "Array.copy_() from host memory": lambda a: gpurt.Array.copy_(a, np.ones(1, np.float32)),
}


@pytest.mark.parametrize("what", sorted(READS))
def test_host_access_in_a_capture_names_the_operation(fake_graphs: FakeGraphs, what: str) -> None:
    g = gpurt.CUDAGraph()
    with pytest.raises(GraphCaptureError, match=rf"{what.replace('(', '[(]').replace(')', '[)]')} "
                       "during CUDA graph capture"):
        with gpurt.graph(g):
            READS[what](stub())
    assert CAPTURES.count == 0 and not CAPTURES.threads
    assert not gpurt.is_current_stream_capturing()
    with gpurt.graph(gpurt.CUDAGraph()):  # the process can capture again
        pass


def test_the_capture_goes_on_after_a_refused_read(fake_graphs: FakeGraphs) -> None:
    g = gpurt.CUDAGraph()
    with gpurt.graph(g):
        with pytest.raises(GraphCaptureError, match="Array.item"):
            gpurt.Array.item(stub())
        assert gpurt.is_current_stream_capturing()
        stream = gpurt.current_stream()
        fake_graphs.driver.launch_kernel(stream.cuda_stream, [8], [bytes(8)])
    assert g.raw_cuda_graph_exec() is not None


def test_other_threads_are_not_refused(fake_graphs: FakeGraphs) -> None:
    seen: list[BaseException] = []

    def other() -> None:
        try:
            CAPTURES.refuse_host_access("x")
        except BaseException as exc:  # noqa: BLE001 (recorded)
            seen.append(exc)

    with gpurt.graph(gpurt.CUDAGraph()):
        assert sum(CAPTURES.threads.values()) == 1
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(5)
        with pytest.raises(GraphCaptureError):
            CAPTURES.refuse_host_access("x")
    assert seen == []


def test_no_capture_no_error_and_no_cost() -> None:
    assert not CAPTURES.threads
    CAPTURES.refuse_host_access("x")  # no capture on this thread: nothing
    # What a read pays outside captures: one attribute read and a branch.
    check = timeit.timeit("if c.threads: c.refuse_host_access('x')",
                          globals={"c": CAPTURES}, number=200_000) / 200_000
    assert check < 1e-6  # ~30 ns on a laptop CPU; a to_numpy() is ~10 us


# ---- GPU --------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_reads_and_uploads_during_a_real_capture_raise(gpu_state) -> None:
    rng = np.random.default_rng()
    x_host = rng.standard_normal(N).astype(np.float32)
    s = gpurt.Stream()
    with s:  # the arrays' stream is the capturing stream: their copies are captured
        x = gpurt.asarray(x_host)
        y = gpurt.asarray(np.full(N, np.nan, np.float32))
    s.synchronize()
    for what, action in [
        ("to_numpy", lambda: x.to_numpy()),
        ("item", lambda: x[3].item()),
        ("numpy", lambda: x.numpy()),
        ("copy_", lambda: y.copy_(x_host)),
    ]:
        with pytest.raises(GraphCaptureError, match=rf"Array\.{what}"):
            with gpurt.graph(gpurt.CUDAGraph(), stream=s):
                y.copy_(x)
                action()
        assert not gpurt.is_current_stream_capturing()
    # The process is usable: eager reads, and a fresh capture that replays correctly.
    np.testing.assert_array_equal(x.to_numpy(), x_host)
    assert x[3].item() == float(x_host[3])
    y.copy_(np.full(N, np.nan, np.float32))
    g = gpurt.CUDAGraph()
    with gpurt.graph(g, stream=s):
        y.copy_(x)
    assert np.isnan(y.to_numpy()).all()  # captured, not run
    g.replay()
    gpurt.synchronize()
    np.testing.assert_array_equal(y.to_numpy().astype(np.float64), x_host.astype(np.float64))
