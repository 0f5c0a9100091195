"""gpurt.random on the GPU: every fill bit for bit against the numpy reference (tests/
_philox.py), layouts, streams, torch tensors, errors, and the statistics of 1e7 samples per
distribution and dtype (moments and a Kolmogorov-Smirnov test)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import _philox
import gpurt
from _philox import BF16
from gpurt import random as grandom
from gpurt._random import kernels

pytestmark = pytest.mark.gpu
FLOATS = [np.dtype(np.float32), np.dtype(np.float16), BF16]
N = 10_003  # not a multiple of 4: the last block is partial


def poisoned(shape, dtype):
    return gpurt.asarray(np.full(shape, 77, dtype=dtype))


def fresh(seed=None):
    g = gpurt.Generator(gpurt.current_device())
    g.manual_seed(int(np.random.default_rng().integers(2**63)) if seed is None else seed)
    return g


def same_bits(got, want):
    """Equal bit patterns (so -0.0 != 0.0 and NaN payloads count)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    a, b = got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")
    assert np.array_equal(a, b), f"first differences at {np.argwhere(a != b)[:5].tolist()}"


# ---- bit for bit -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_uniform_matches_reference_bit_for_bit(dtype, gpu_state):
    g = fresh()
    seed = g.initial_seed()
    out = poisoned(N, dtype)
    assert grandom.uniform_(out, -2.5, 3.0, generator=g) is out
    same_bits(out.to_numpy(), _philox.uniform(seed, 0, N, -2.5, 3.0, dtype))
    grandom.uniform_(out, generator=g)  # the next draw: offset 4
    same_bits(out.to_numpy(), _philox.uniform(seed, 4, N, 0.0, 1.0, dtype))
    assert g.get_offset() == 8


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_normal_matches_reference_bit_for_bit(dtype, gpu_state):
    g = fresh()
    out = poisoned(N, dtype)
    grandom.normal_(out, 1.5, 2.0, generator=g)
    same_bits(out.to_numpy(), _philox.normal(g.initial_seed(), 0, N, 1.5, 2.0, dtype))
    grandom.normal_(out, generator=g)  # the next draw: offset 4, mean 0, std 1
    same_bits(out.to_numpy(), _philox.normal(g.initial_seed(), 4, N, 0.0, 1.0, dtype))


@pytest.mark.parametrize("dtype, low, high", [
    (np.int32, -5, 17), (np.uint8, 0, 256), (np.int8, -128, 127), (np.int64, -2**40, 2**40),
    (np.int64, -2**63, 2**63), (np.uint64, 0, 2**64), (np.int16, 3, 4), (np.uint32, 7, 2**32),
    # 8-byte outputs of 32-bit draws: 32-byte packs, stored through warp shuffles
    (np.int64, -3, 1000), (np.uint64, 5, 2**32 - 9), (np.int64, -2**31, 2**31),
], ids=str)
def test_randint_matches_reference_bit_for_bit(dtype, low, high, gpu_state):
    g = fresh()
    out = poisoned(N, dtype)
    grandom.randint_(out, low, high, generator=g)
    got = out.to_numpy()
    same_bits(got, _philox.randint(g.initial_seed(), 0, N, low, high, dtype))
    assert got.min() >= low and int(got.max()) < high


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int32, np.float32, np.float16, BF16],
                         ids=str)
def test_bernoulli_matches_reference_bit_for_bit(dtype, gpu_state):
    g = fresh()
    out = poisoned(N, dtype)
    grandom.bernoulli_(out, 0.3, generator=g)
    want = _philox.bernoulli(g.initial_seed(), 0, N, 0.3).astype(dtype)
    same_bits(out.to_numpy(), want)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_dropout_matches_reference_bit_for_bit(dtype, gpu_state):
    g = fresh()
    x = np.random.default_rng().standard_normal((7, N // 7)).astype(dtype)
    out, mask = grandom.dropout(gpurt.asarray(x), 0.2, generator=g)
    want_out, want_mask = _philox.dropout(g.initial_seed(), 0, x, 0.2)
    same_bits(mask.to_numpy(), want_mask)
    same_bits(out.to_numpy(), want_out)
    assert 0.75 < want_mask.mean() < 0.85
    given_out, given_mask = poisoned(x.shape, dtype), poisoned(x.shape, np.bool_)
    again = fresh(g.initial_seed())
    result = grandom.dropout(gpurt.asarray(x), 0.2, out=given_out, mask=given_mask,
                             generator=again)
    assert result[0] is given_out and result[1] is given_mask
    same_bits(given_out.to_numpy(), want_out)


def test_values_do_not_depend_on_the_launch_configuration(monkeypatch, gpu_state):
    out = poisoned(N, np.float32)
    grandom.uniform_(out, generator=fresh(11))
    wide = out.to_numpy()
    monkeypatch.setattr(kernels, "grid_for", lambda kernel, device, chunks: 1)  # one CTA loops
    grandom.uniform_(out, generator=fresh(11))
    same_bits(out.to_numpy(), wide)


# ---- layouts, streams, foreign arrays --------------------------------------------------------

@pytest.mark.parametrize("view", ["rows", "columns", "transpose", "negative", "offset"])
def test_strided_outputs_get_the_values_of_their_c_order_index(view, gpu_state):
    base = poisoned((64, 40), np.float32)
    target = {"rows": lambda a: a[1:60:3], "columns": lambda a: a[:, 1::2],
              "transpose": lambda a: a.T, "negative": lambda a: a[::-1, ::-4],
              "offset": lambda a: a.reshape(-1)[1:2001]}[view](base)
    grandom.uniform_(target, generator=fresh(21))
    host = np.full((64, 40), 77, np.float32)
    numpy_view = {"rows": lambda a: a[1:60:3], "columns": lambda a: a[:, 1::2],
                  "transpose": lambda a: a.T, "negative": lambda a: a[::-1, ::-4],
                  "offset": lambda a: a.reshape(-1)[1:2001]}[view](host)
    numpy_view[...] = _philox.uniform(21, 0, numpy_view.size, 0.0, 1.0).reshape(numpy_view.shape)
    same_bits(base.to_numpy(), host)  # the view's elements, and nothing else, changed


def test_empty_arrays_draw_nothing_and_size_one_works(gpu_state):
    g = fresh(3)
    grandom.normal_(gpurt.empty((0, 5), np.float32), generator=g)
    assert g.get_offset() == 0
    one = poisoned(1, np.float16)
    grandom.uniform_(one, generator=g)
    same_bits(one.to_numpy(), _philox.uniform(3, 0, 1, 0.0, 1.0, np.float16))


def test_default_generator_and_streams(gpu_state):
    gpurt.manual_seed(99)
    out = poisoned(N, np.float32)
    side = gpurt.Stream()
    grandom.uniform_(out, stream=side)
    side.synchronize()
    same_bits(out.to_numpy(), _philox.uniform(99, 0, N, 0.0, 1.0))
    with side:
        grandom.uniform_(out)
    side.synchronize()
    same_bits(out.to_numpy(), _philox.uniform(99, 4, N, 0.0, 1.0))
    assert gpurt.initial_seed() == 99
    state = gpurt.get_rng_state()
    assert struct_offset(state) == 8
    gpurt.set_rng_state(state)
    assert [struct_offset(s) for s in gpurt.get_rng_state_all()][gpurt.current_device()] == 8


def struct_offset(state):
    return int(np.frombuffer(np.asarray(state).tobytes(), "<u8")[2])


def test_torch_tensors_are_filled_in_place(gpu_state):
    torch = pytest.importorskip("torch")
    t = torch.full((33, 31), 5.0, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    assert grandom.normal_(t, generator=fresh(8)) is t
    grandom.uniform_(t[:, 3:], generator=fresh(8))
    gpurt.synchronize()
    want = _philox.uniform(8, 0, 33 * 28, 0.0, 1.0, BF16).reshape(33, 28)
    got = t[:, 3:].float().cpu().numpy().astype(BF16)
    same_bits(got, want)


# ---- errors ----------------------------------------------------------------------------------

def test_bad_arguments_raise_and_leave_the_generator_alone(gpu_state):
    g = fresh(1)
    f32, i32 = gpurt.empty(8, np.float32), gpurt.empty(8, np.int32)
    cases = [
        (ValueError, lambda: grandom.uniform_(f32, 1.0, 1.0, generator=g)),
        (ValueError, lambda: grandom.uniform_(f32, 2.0, 1.0, generator=g)),
        (ValueError, lambda: grandom.uniform_(f32, 0.0, math.inf, generator=g)),
        (ValueError, lambda: grandom.normal_(f32, 0.0, -1.0, generator=g)),
        (ValueError, lambda: grandom.bernoulli_(f32, 1.5, generator=g)),
        (ValueError, lambda: grandom.bernoulli_(f32, -0.1, generator=g)),
        (ValueError, lambda: grandom.bernoulli_(f32, math.nan, generator=g)),
        (ValueError, lambda: grandom.dropout(f32, 1.0, generator=g)),
        (ValueError, lambda: grandom.randint_(i32, 5, 5, generator=g)),
        (ValueError, lambda: grandom.randint_(i32, 0, 2**31 + 1, generator=g)),
        (TypeError, lambda: grandom.uniform_(i32, generator=g)),
        (TypeError, lambda: grandom.normal_(gpurt.empty(8, np.float64), generator=g)),
        (TypeError, lambda: grandom.randint_(f32, 0, 10, generator=g)),
        (TypeError, lambda: grandom.randint_(i32, 0.5, 10, generator=g)),
        (TypeError, lambda: grandom.dropout(i32, 0.5, generator=g)),
        (TypeError, lambda: grandom.uniform_(np.zeros(8, np.float32), generator=g)),
        (TypeError, lambda: grandom.uniform_(f32, generator=g.get_state())),
        (ValueError, lambda: grandom.uniform_(_broadcast(f32), generator=g)),
        (ValueError, lambda: grandom.dropout(f32, 0.5, out=gpurt.empty(4, np.float32),
                                             generator=g)),
    ]
    for error, call in cases:
        with pytest.raises(error):
            call()
    assert g.get_offset() == 0


def _broadcast(a):
    """A (4, 8) view of ``a``'s 8 floats with a stride-0 first dimension."""
    return gpurt.asarray(_Cai(a.ptr, (4, 8), (0, 4)))


class _Cai:
    def __init__(self, ptr, shape, strides):
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": "<f4",
                                         "data": (ptr, False), "version": 3, "stream": None}


# ---- statistics ------------------------------------------------------------------------------

SAMPLES = 10_000_000


def _ks_statistic(sample: np.ndarray, cdf) -> float:
    """KS distance between the sample and the distribution of ``cdf`` rounded to the
    sample's dtype: the exact distribution of a float32 draw rounded to that dtype puts
    all its mass on representable values, so the true CDF at a value v is cdf at the
    rounding boundary above v."""
    values, counts = np.unique(sample, return_counts=True)
    empirical = np.cumsum(counts) / sample.size
    bits = values.view(f"u{values.itemsize}").astype(np.int64)
    up = np.where(values >= 0, bits + 1, bits - 1)
    nxt = up.astype(f"u{values.itemsize}").view(values.dtype).astype(np.float64)
    exact = values.astype(np.float64)
    boundary = np.where(values == 0, exact + (nxt - exact) / 2, (exact + nxt) / 2)
    below = np.concatenate([[0.0], empirical[:-1]])
    lower = np.concatenate([[-np.inf], boundary[:-1]])
    return float(max(np.max(np.abs(empirical - cdf(boundary))),
                     np.max(np.abs(below - cdf(lower)))))


def _normal_cdf(x):
    try:
        from scipy.special import ndtr
        return ndtr(x)
    except ImportError:
        from math import erf
        return 0.5 * (1 + np.vectorize(erf)(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_uniform_statistics(dtype, gpu_state):
    out = gpurt.empty(SAMPLES, dtype)
    grandom.uniform_(out, -1.0, 3.0, generator=fresh())
    x = out.to_numpy()
    x64 = x.astype(np.float64)
    assert -1.0 <= x64.min() and x64.max() <= 3.0
    assert abs(x64.mean() - 1.0) < 5 * 4 / math.sqrt(12 * SAMPLES)
    assert abs(x64.var() - 16 / 12) < 0.005
    d = _ks_statistic(x, lambda v: np.clip((v + 1.0) / 4.0, 0.0, 1.0))
    assert d < 1.95 / math.sqrt(SAMPLES), d  # p ~ 0.001


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_normal_statistics(dtype, gpu_state):
    out = gpurt.empty(SAMPLES, dtype)
    grandom.normal_(out, 0.5, 2.0, generator=fresh())
    x = out.to_numpy()
    z = (x.astype(np.float64) - 0.5) / 2.0
    assert abs(z.mean()) < 5 / math.sqrt(SAMPLES)
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2 / SAMPLES) + 2e-3 * (dtype != np.float32)
    assert abs(np.mean(z**3)) < 5 * math.sqrt(15 / SAMPLES)
    assert abs(np.mean(z**4) - 3.0) < 5 * math.sqrt(96 / SAMPLES) + 2e-2 * (dtype != np.float32)
    d = _ks_statistic(x, lambda v: _normal_cdf((v - 0.5) / 2.0))
    assert d < 1.95 / math.sqrt(SAMPLES), d


def test_bernoulli_dropout_and_randint_statistics(gpu_state):
    flags = gpurt.empty(SAMPLES, np.bool_)
    grandom.bernoulli_(flags, 0.3, generator=fresh())
    p = flags.to_numpy().mean()
    assert abs(p - 0.3) < 5 * math.sqrt(0.21 / SAMPLES)
    x = gpurt.asarray(np.full(SAMPLES, 2.0, np.float32))
    out, mask = grandom.dropout(x, 0.25, generator=fresh())
    kept = mask.to_numpy()
    assert abs(kept.mean() - 0.75) < 5 * math.sqrt(0.1875 / SAMPLES)
    assert np.array_equal(out.to_numpy(), np.where(kept, np.float32(2.0 / 0.75), 0))
    ints = gpurt.empty(SAMPLES, np.int32)
    grandom.randint_(ints, -3, 7, generator=fresh())
    counts = np.bincount(ints.to_numpy() + 3, minlength=10)
    assert counts.size == 10
    expected = SAMPLES / 10
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < 27.88, chi2  # chi-square, 9 degrees of freedom, p = 0.001
