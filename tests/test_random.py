"""gpurt.random without a GPU: the state API, validation, the layout the kernels get, and
the numpy Philox reference against Random123's known-answer vectors. The GPU side is in
test_random_gpu.py and test_random_graphs.py."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import _philox
import gpurt
from gpurt import random as grandom
from gpurt._random import capture, kernels, state

# ---- the reference ---------------------------------------------------------------------------

# Random123's kat_vectors for philox4x32-10: counter, key -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_reference_philox_matches_random123_known_answers(counter, key, expected):
    got = _philox.philox4x32_10(np.array([counter], dtype=np.uint32), key)
    assert tuple(int(x) for x in got[0]) == expected


def test_reference_element_mapping_is_curand_subsequence_layout():
    # block b of a draw at offset o is Philox(counter=(o/4, 0, b, 0), key=seed)
    seed, offset = 0x1234_5678_9ABC_DEF0, 40
    blocks = _philox.block_words(seed, offset, 3)
    counter = np.array([[10, 0, 2, 0]], dtype=np.uint32)
    direct = _philox.philox4x32_10(counter, (0x9ABCDEF0, 0x12345678))
    assert np.array_equal(blocks[2], direct[0])
    assert not np.array_equal(blocks[1], blocks[2])


def test_reference_uniform_is_in_unit_interval_and_exact_multiples():
    u = _philox.uniform(7, 0, 10_000, 0.0, 1.0)
    assert u.dtype == np.float32 and 0.0 <= u.min() and u.max() < 1.0
    assert np.array_equal(u * np.float32(2.0 ** 24), np.floor(u * np.float32(2.0 ** 24)))


def test_reference_16_bit_uniform_takes_8_values_per_block():
    u = _philox.uniform(7, 0, 1001, 0.0, 1.0, np.float16)
    w = _philox.block_words(7, 0, 126).reshape(-1)
    halves = np.stack([w & 0xFFFF, w >> 16], axis=1).reshape(-1)[:1001]
    assert np.array_equal(u, (halves * 2.0**-16).astype(np.float16))
    assert 0.0 <= float(u.min()) and float(u.max()) <= 1.0


@pytest.mark.parametrize("a, b, c", [
    (1 + 2**-12, 1 + 2**-12, 2**-60), (1 + 2**-12, 1 + 2**-12, -(2**-60)),  # ties broken by c
    (1 + 2**-12, 1 + 2**-12, 0.0), (3.0, 1 / 3, -1.0), (-1.5, 2**20, 7.25)])
def test_reference_fma_is_correctly_rounded(a, b, c):
    from fractions import Fraction
    exact = Fraction(float(np.float32(a))) * Fraction(float(np.float32(b))) + \
        Fraction(float(np.float32(c)))
    got = _philox.fma32(np.float32(a), np.float32(b), np.float32(c))
    nearest = np.float32(float(exact))
    neighbours = [np.nextafter(nearest, np.float32(-np.inf)), nearest,
                  np.nextafter(nearest, np.float32(np.inf))]
    best = min(neighbours, key=lambda v: (abs(Fraction(float(v)) - exact),
                                          int(np.asarray(v).view(np.uint32)) & 1))
    assert got == best


def test_reference_normal_is_box_muller_to_a_few_ulp():
    z = _philox.normal(123, 8, 200_003, 0.0, 1.0)
    want = _philox.normal64(123, 8, 200_003, 0.0, 1.0)
    assert z.dtype == np.float32
    assert np.all(np.abs(z - want) <= 3 * 2.0**-24 * np.maximum(np.abs(want), 1.0) * 2)
    m = np.array([1, 2, 3, 0xB504F3, 0xB504F4, 1 << 23, (1 << 24) - 1], np.uint32)
    ln = _philox.log_unit24(m)
    assert np.allclose(ln, np.log(m * 2.0**-24), rtol=2e-7, atol=0)  # the tail: u = 2^-24
    v = np.arange(0, 1 << 24, 1 << 18, dtype=np.uint32)  # octant edges among them
    sin, cos = _philox.sincos_turn24(v)
    assert np.allclose(sin, np.sin(2 * np.pi * v / 2**24), rtol=0, atol=6e-8)
    assert np.allclose(cos, np.cos(2 * np.pi * v / 2**24), rtol=0, atol=6e-8)
    same = _philox.normal(123, 8, 200_003, 0.5, 2.0, np.float16)
    assert np.array_equal(same, _philox.fma32(z, 2.0, 0.5).astype(np.float16))


# ---- generators and states -------------------------------------------------------------------

def test_generator_seed_offset_and_state_round_trip():
    g = gpurt.Generator(0)
    assert g.initial_seed() == state.DEFAULT_SEED and g.get_offset() == 0
    g.manual_seed(1234)
    assert g.philox_engine_inputs(5) == (1234, 0)  # 5 rounds up to 8
    assert g.philox_engine_inputs(1) == (1234, 8)
    saved = g.get_state()
    assert saved.dtype == np.uint8 and saved.shape == (24,)
    assert struct.unpack("<QQQ", saved.tobytes()) == (1, 1234, 12)
    assert g.philox_engine_inputs(4) == (1234, 12)
    g.set_state(saved)
    assert g.philox_engine_inputs(4) == (1234, 12)
    g.set_state(bytes(saved))  # bytes work as well as the array
    assert g.get_offset() == 12


def test_manual_seed_wraps_negative_seeds_and_resets_offset():
    g = gpurt.Generator(0)
    g.philox_engine_inputs(16)
    g.manual_seed(-1)
    assert g.initial_seed() == 2**64 - 1 and g.get_offset() == 0


def test_seed_draws_a_fresh_seed():
    g = gpurt.Generator(0)
    first = g.seed()
    assert g.initial_seed() == first
    assert g.seed() != first  # 2^-64 to fail


@pytest.mark.parametrize("bad, error", [
    (b"\x01" * 23, ValueError),
    (struct.pack("<QQQ", 2, 1, 0), ValueError),  # unknown version
    (struct.pack("<QQQ", 1, 1, 3), ValueError),  # offset not a multiple of 4
    (np.zeros(24, dtype=np.int8), ValueError),
    ("state", TypeError),
])
def test_set_state_validates_and_keeps_the_old_state(bad, error):
    g = gpurt.Generator(0).manual_seed(9)
    g.philox_engine_inputs(4)
    with pytest.raises(error):
        g.set_state(bad)
    assert (g.initial_seed(), g.get_offset()) == (9, 4)


def test_clone_state_copies_and_graphsafe_state_shares():
    g = gpurt.Generator(0).manual_seed(5)
    clone = g.clone_state()
    clone.philox_engine_inputs(4)
    assert g.get_offset() == 0 and clone.get_offset() == 4
    shared = gpurt.Generator(0)
    shared.graphsafe_set_state(g.graphsafe_get_state())
    shared.philox_engine_inputs(4)
    assert g.get_offset() == 4 and shared.initial_seed() == 5
    with pytest.raises(TypeError):
        shared.graphsafe_set_state(g.get_state())


def test_bad_seeds_and_increments_raise():
    g = gpurt.Generator(0)
    with pytest.raises(TypeError):
        g.manual_seed(1.5)
    with pytest.raises(TypeError):
        gpurt.manual_seed("1")
    with pytest.raises(ValueError):
        g.philox_engine_inputs(-4)
    with pytest.raises(ValueError):
        gpurt.Generator(-1)


def test_philox_cuda_state_struct_is_48_bytes_and_packs_as_the_header_declares():
    ps = grandom.PhiloxCudaState(seed=1, offset=8)
    assert len(bytes(ps)) == 48
    assert struct.unpack("<QQQQQII", bytes(ps)) == (1, 8, 0, 0, 0, 0, 0)
    assert "seed=1" in repr(ps)


def test_torch_cuda_random_names_are_exported():
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
                 "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
                 "Generator"):
        assert name in gpurt.__all__ and callable(getattr(gpurt, name))
    assert "random" in gpurt.__all__


def test_header_is_shipped_and_offered_both_ways():
    text = grandom.headers()["gpurt/random.cuh"]
    assert "philox4x32_10" in text and "PhiloxCudaState" in text
    path = kernels.INCLUDE_DIR / "gpurt" / "random.cuh"
    assert grandom.include_dir() == str(kernels.INCLUDE_DIR) and path.read_text() == text


def test_header_and_kernels_compile_without_a_gpu():
    user = r'''
#include <gpurt/random.cuh>
extern "C" __global__ void k(float* out, gpurt::PhiloxCudaState ps) {
    ulonglong2 so = gpurt::philox_unpack(ps);
    gpurt::Philox p = gpurt::philox_init(so.x, threadIdx.x, so.y);
    out[threadIdx.x] = gpurt::uniform01(gpurt::philox_next(p).x);
}'''
    assert gpurt.compile(user, headers=grandom.headers(), arch="sm_90")
    assert gpurt.compile(user, include_paths=[grandom.include_dir()], arch="sm_90")
    names = ["fill_uniform<__half>", "fill_randint64<long long>", "dropout<__nv_bfloat16>"]
    module = gpurt.compile(kernels.source(), name_expressions=names,
                           include_paths=[str(kernels.INCLUDE_DIR)], arch="sm_90",
                           program_name="random.cu")
    assert all(module[name] for name in names)


# ---- layouts ---------------------------------------------------------------------------------

def _unpack(raw: bytes) -> tuple[int, int, list[int], list[int]]:
    values = struct.unpack(f"<qq{kernels.MAX_DIMS}q{kernels.MAX_DIMS}q", raw)
    ndim, mode = values[0], values[1]
    return ndim, mode, list(values[2:2 + ndim]), list(values[2 + kernels.MAX_DIMS:][:ndim])


def test_layout_merges_contiguous_dims_and_picks_the_mode():
    assert _unpack(kernels.layout((4, 8), (32, 4), 4, 4096, 4)) == (1, 0, [1], [1])
    assert _unpack(kernels.layout((4, 8), (32, 4), 4, 4100, 4))[1] == 1  # unaligned
    assert _unpack(kernels.layout((4, 3), (32, 4), 4, 0, 4)) == (2, 2, [4, 3], [8, 1])
    assert _unpack(kernels.layout((3, 1, 5), (4, 99, 12), 4, 0, 4)) == (2, 2, [3, 5], [1, 3])
    assert _unpack(kernels.layout((6,), (-8,), 4, 0, 4)) == (1, 2, [6], [-2])


@pytest.mark.parametrize("shape, strides", [((4, 3), (0, 4)), ((3, 3), (4, 4)), ((2, 5), (8, 4))])
def test_layout_refuses_outputs_whose_elements_share_memory(shape, strides):
    with pytest.raises(ValueError, match="share memory"):
        kernels.layout(shape, strides, 4, 0, 4)
    kernels.layout(shape, strides, 4, 0, 4, written=False)  # fine for an input


def test_layout_refuses_too_many_dims_and_odd_strides():
    shape, strides = (2,) * 9, tuple(4 * 3**i for i in reversed(range(9)))
    with pytest.raises(ValueError, match="up to 8"):
        kernels.layout(shape, strides, 4, 0, 4)
    with pytest.raises(ValueError, match="item size"):
        kernels.layout((3,), (6,), 4, 0, 4)


# ---- graph bookkeeping (the driver side runs in test_random_graphs.py) -----------------------

def test_graph_generators_capture_and_replay_bookkeeping(monkeypatch):
    graph = capture.GraphGenerators()
    g = gpurt.Generator(0).manual_seed(3)
    graph.register(g)
    graph.register(g.graphsafe_get_state())  # the same state: registered once
    assert graph.registered == [g._state]
    with pytest.raises(TypeError):
        graph.register(g.get_state())
    default = grandom.default_generator(0)._state
    graph.begin(0)
    try:
        assert g._state.capturing and default.capturing
        with pytest.raises(RuntimeError, match="before capture_begin"):
            graph.register(gpurt.Generator(0))
        with pytest.raises(RuntimeError, match="captures"):
            g.manual_seed(1)
        g._state.intragraph = 8  # as if two fills had been captured
    finally:
        graph.end()
    assert not g._state.capturing and not default.capturing
    assert graph.increments == {default: 0, g._state: 8}
    writes = []
    monkeypatch.setattr(capture, "_write_state",
                        lambda buffer, seed, offset, handle: writes.append((seed, offset, handle)))
    graph.replay(123)
    graph.replay(123)
    assert writes == [(3, 0, 123), (3, 8, 123)] and g.get_offset() == 16


def test_graph_generators_refuse_other_devices_and_abort_cleanly():
    graph = capture.GraphGenerators()
    graph.register(gpurt.Generator(1))
    with pytest.raises(ValueError, match="cuda:1"):
        graph.begin(0)
    assert not grandom.default_generator(0)._state.capturing
    clean = capture.GraphGenerators()
    clean.begin(0)
    clean.abort()
    assert not grandom.default_generator(0)._state.capturing and clean.increments == {}
