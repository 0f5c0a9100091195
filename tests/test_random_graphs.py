"""gpurt.random under CUDA graphs (fresh numbers every replay, eager draws continuing the
sequence, registered generators, clear errors) and users' kernels drawing from gpurt's
generators through <gpurt/random.cuh>, eagerly and graphed."""

from __future__ import annotations

import numpy as np
import pytest

import _philox
import gpurt
from gpurt import random as grandom

pytestmark = pytest.mark.gpu
N = 4099


def offset_of(generator):
    return generator.get_offset()


def host(array):
    gpurt.synchronize()
    return array.to_numpy()


def test_replays_draw_fresh_numbers_and_eager_draws_continue(gpu_state):
    gpurt.manual_seed(1234)
    default = grandom.default_generator()
    a, b = gpurt.zeros(N, np.float32), gpurt.zeros(N, np.float16)
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        grandom.uniform_(a)
        grandom.normal_(b)
    assert offset_of(default) == 0  # capture draws nothing eagerly
    graph.replay()
    first = host(a)
    assert np.array_equal(first, _philox.uniform(1234, 0, N, 0.0, 1.0))
    assert np.array_equal(host(b), _philox.normal(1234, 4, N, 0.0, 1.0, np.float16))
    assert offset_of(default) == 8
    graph.replay()
    second = host(a)
    assert not np.array_equal(first, second)
    assert np.array_equal(second, _philox.uniform(1234, 8, N, 0.0, 1.0))
    grandom.uniform_(a)  # eager, after two replays of 8 each
    assert np.array_equal(host(a), _philox.uniform(1234, 16, N, 0.0, 1.0))


def test_replay_after_manual_seed_repeats(gpu_state):
    out = gpurt.zeros(N, np.float32)
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        grandom.bernoulli_(out, 0.5)
    gpurt.manual_seed(77)
    graph.replay()
    first = host(out)
    graph.replay()
    assert not np.array_equal(first, host(out))
    gpurt.manual_seed(77)
    graph.replay()
    assert np.array_equal(first, host(out))
    assert np.array_equal(first, _philox.bernoulli(77, 0, N, 0.5).astype(np.float32))


def test_registered_and_shared_generators(gpu_state):
    index = gpurt.current_device()
    mine = gpurt.Generator(index).manual_seed(5)
    alias = gpurt.Generator(index)
    alias.graphsafe_set_state(mine.graphsafe_get_state())  # one state, two handles
    default = grandom.default_generator().manual_seed(6)
    out = gpurt.zeros(N, np.int32)
    graph = gpurt.CUDAGraph()
    graph.register_generator_state(alias)
    with gpurt.graph(graph):
        grandom.randint_(out, 0, 1000, generator=alias)
    graph.replay()
    graph.replay()
    assert np.array_equal(host(out), _philox.randint(5, 4, N, 0, 1000, np.int32))
    assert offset_of(mine) == 8 and offset_of(default) == 0


def test_unregistered_generator_during_capture_is_a_clear_error(gpu_state):
    stranger = gpurt.Generator(gpurt.current_device()).manual_seed(3)
    out = gpurt.zeros(N, np.float32)
    graph = gpurt.CUDAGraph()
    with pytest.raises(RuntimeError, match="not registered"), gpurt.graph(graph):
        grandom.uniform_(out, generator=stranger)
    assert offset_of(stranger) == 0
    gpurt.manual_seed(4)  # the default generator left capture mode with the aborted capture
    with pytest.raises(RuntimeError, match="while a CUDA graph captures"), \
            gpurt.graph(gpurt.CUDAGraph()):
        grandom.uniform_(out)
        gpurt.manual_seed(5)
    with pytest.raises(RuntimeError, match="eager"), gpurt.graph(gpurt.CUDAGraph()):
        grandom.default_generator().philox_engine_inputs(4)
    late = gpurt.CUDAGraph()
    with pytest.raises(RuntimeError, match="before capture_begin"), gpurt.graph(late):
        late.register_generator_state(stranger)
    with pytest.raises(TypeError):
        gpurt.CUDAGraph().register_generator_state(stranger.get_state())
    graph = gpurt.CUDAGraph()  # and capturing works again afterwards
    with gpurt.graph(graph):
        grandom.uniform_(out)
    graph.replay()
    assert np.array_equal(host(out), _philox.uniform(4, 0, N, 0.0, 1.0))


FUSED = r"""
#include <gpurt/random.cuh>
// out = residual + dropout(x): one Philox block per 4 elements, like gpurt's own dropout
extern "C" __global__ void dropout_add(const float* x, const float* residual, float* out,
                                       unsigned long long n, gpurt::PhiloxCudaState ps,
                                       float keep, float scale) {
    ulonglong2 seed_offset = gpurt::philox_unpack(ps);
    unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b * 4 >= n) return;
    gpurt::Philox engine = gpurt::philox_init(seed_offset.x, b, seed_offset.y);
    uint4 w = gpurt::philox_next(engine);
    unsigned int words[4] = {w.x, w.y, w.z, w.w};
    for (int j = 0; j < 4; ++j) {
        unsigned long long i = b * 4 + j;
        if (i < n) {
            float kept = gpurt::bernoulli(words[j], keep) ? __fmul_rn(x[i], scale) : 0.0f;
            out[i] = __fadd_rn(residual[i], kept);
        }
    }
}
"""


def test_users_fused_dropout_kernel_draws_like_a_builtin_op(gpu_state):
    kernel = gpurt.compile(FUSED, include_paths=[grandom.include_dir()])["dropout_add"]
    rng = np.random.default_rng()
    x, residual = rng.standard_normal((2, N)).astype(np.float32)
    dx, dres = gpurt.asarray(x), gpurt.asarray(residual)
    out = gpurt.asarray(np.full(N, 77, np.float32))
    p = 0.3
    def args(state):
        return (dx, dres, out, N, state, np.float32(1 - p), np.float32(1 / (1 - p)))

    grid = ((N + 3) // 4 + 127) // 128

    gen = gpurt.Generator(gpurt.current_device()).manual_seed(42)
    kernel(grid, 128, args(gen.philox_cuda_state(4)))
    want, _ = _philox.dropout(42, 0, x, p)
    assert np.array_equal(host(out), residual + want)
    builtin, _ = grandom.dropout(dx, p, generator=gpurt.Generator(gen.device).manual_seed(42))
    assert np.array_equal(host(builtin), want)  # the same numbers as gpurt's dropout

    graph = gpurt.CUDAGraph()
    graph.register_generator_state(gen)
    with gpurt.graph(graph):
        kernel(grid, 128, args(gen.philox_cuda_state(4)))
    for offset in (4, 8):
        graph.replay()
        want, _ = _philox.dropout(42, offset, x, p)
        assert np.array_equal(host(out), residual + want)
    seed, offset = gen.philox_engine_inputs(4)
    assert (seed, offset) == (42, 12)
