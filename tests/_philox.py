"""A numpy reference of gpurt.random: Philox4x32-10 and each distribution's transform, as
docs/random.md and <gpurt/random.cuh> define them, in the same correctly rounded float32
operations as the kernels (fused multiply-adds emulated exactly), so results compare bit for
bit. normal64 is the textbook Box-Muller in float64, to check the float32 transform's
accuracy."""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.dtype(np.float32)
MASK32 = np.uint64(0xFFFFFFFF)
M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = 0x9E3779B9, 0xBB67AE85


def philox4x32_10(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of each row of ``counters`` ((N, 4) uint32) under ``key``: (N, 4)."""
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = key
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK32
        c = [hi1 ^ c[1] ^ np.uint64(k0), lo1, hi0 ^ c[3] ^ np.uint64(k1), lo0]
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return np.stack(c, axis=1).astype(np.uint32)


def block_words(seed: int, offset: int, blocks: int) -> np.ndarray:
    """The words of element blocks 0..blocks-1 of a draw at (seed, offset): (blocks, 4)."""
    b = np.arange(blocks, dtype=np.uint64)
    off4 = offset // 4
    counters = np.stack([
        np.full(blocks, off4 & 0xFFFFFFFF, np.uint64), np.full(blocks, off4 >> 32, np.uint64),
        b & MASK32, b >> np.uint64(32)], axis=1).astype(np.uint32)
    return philox4x32_10(counters, (seed & 0xFFFFFFFF, seed >> 32))


def words(seed: int, offset: int, n: int) -> np.ndarray:
    """One 32-bit word per element (blocks of 4) for n elements."""
    return block_words(seed, offset, (n + 3) // 4).reshape(-1)[:n]


def uniform01(w: np.ndarray) -> np.ndarray:
    return (w >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 -> dtype with round-to-nearest-even (numpy and ml_dtypes both do)."""
    return values.astype(dtype)


def uniform01_halves(seed: int, offset: int, n: int) -> np.ndarray:
    """The 16-bit fills' u: 8 per block, element 8b + j from half j % 2 of word j // 2."""
    w = block_words(seed, offset, (n + 7) // 8).reshape(-1)
    halves = np.stack([w & np.uint32(0xFFFF), w >> np.uint32(16)], axis=1).reshape(-1)[:n]
    return halves.astype(np.float32) * np.float32(2.0 ** -16)


def uniform(seed: int, offset: int, n: int, low: float, high: float,
            dtype: np.dtype = F32) -> np.ndarray:
    scale = np.float32(high - low)
    u = (uniform01_halves(seed, offset, n) if np.dtype(dtype).itemsize == 2
         else uniform01(words(seed, offset, n)))
    return cast(np.float32(low) + u * scale, dtype)


def fma32(a, b, c) -> np.ndarray:
    """float32 a * b + c rounded once (CUDA's __fmaf_rn), exactly: a * b is exact in
    float64, the float64 sum's rounding error e comes from TwoSum, and where the sum lands
    exactly halfway between two float32 values e decides the side (elsewhere the float64
    rounding cannot move it across a float32 midpoint). Normal numbers only."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    v = s - p
    e = (p - (s - v)) + (c - v)
    r = s.astype(np.float32)
    back = r.astype(np.float64)
    toward = np.nextafter(r, np.where(s > back, np.float32(np.inf), np.float32(-np.inf)))
    tie = (s != back) & (toward.astype(np.float64) - s == s - back)
    wrong = tie & (e != 0) & (np.sign(e) == np.sign(s - back)) & (r != toward)
    return np.where(wrong, toward, r).astype(np.float32)


LOG_P = [float.fromhex(h) for h in (
    "0x1.662724p-4", "-0x1.2672cep-3", "0x1.32285ap-3", "-0x1.5329b8p-3", "0x1.98b808p-3",
    "-0x1.0005a6p-2", "0x1.555790p-2", "-0x1.fffff8p-2", "0x1p0")]
SIN_P = [float.fromhex(h) for h in ("-0x1.2dc17cp-15", "0x1.465fc0p-9", "-0x1.4abbbep-4",
                                    "0x1.921fb6p-1")]
COS_P = [float.fromhex(h) for h in ("0x1.d9f0a6p-19", "-0x1.55c63cp-12", "0x1.03c1dep-6",
                                    "-0x1.3bd3ccp-2", "0x1p0")]
LN2 = np.float32(float.fromhex("0x1.62e430p-1"))


def _horner(coefficients: list[float], x: np.ndarray) -> np.ndarray:
    acc = np.full(x.shape, coefficients[0], np.float32)
    for c in coefficients[1:]:
        acc = fma32(acc, x, np.float32(c))
    return acc


def log_unit24(m: np.ndarray) -> np.ndarray:
    """<gpurt/random.cuh>'s detail::log_unit24: ln(m * 2^-24) for 1 <= m < 2^24."""
    bits = m.astype(np.float32).view(np.int32)
    e = (bits >> 23) - 127 - 24
    fbits = (bits & 0x7FFFFF) | 0x3F800000
    big = fbits > 0x3FB504F3
    fbits = np.where(big, fbits - 0x00800000, fbits).astype(np.int32)
    e = e + big
    t = fbits.view(np.float32) - np.float32(1.0)
    return fma32(e.astype(np.float32), LN2, _horner(LOG_P, t) * t)


def sincos_turn24(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """<gpurt/random.cuh>'s detail::sincos_turn24: (sin, cos) of 2 pi v / 2^24."""
    octant = v >> np.uint32(21)
    odd = (octant & np.uint32(1)) == 1
    m = v & np.uint32(0x1FFFFF)
    m = np.where(odd, np.uint32(0x200000) - m, m)
    x = m.astype(np.float32) * np.float32(2.0 ** -21)
    x2 = x * x
    s = _horner(SIN_P, x2) * x
    c = _horner(COS_P, x2)
    s, c = np.where(odd, c, s), np.where(odd, s, c)
    quadrant = octant >> np.uint32(1)
    sin = np.select([quadrant == 1, quadrant == 2, quadrant == 3], [c, -s, -c], s)
    cos = np.select([quadrant == 1, quadrant == 2, quadrant == 3], [-s, -c, s], c)
    return sin.astype(np.float32), cos.astype(np.float32)


def normal(seed: int, offset: int, n: int, mean: float, std: float,
           dtype: np.dtype = F32) -> np.ndarray:
    """normal_'s values bit for bit (<gpurt/random.cuh>'s normal2 and scale_normal)."""
    w = block_words(seed, offset, (n + 3) // 4).reshape(-1, 2)
    u = (w[:, 0] >> np.uint32(8)) | np.uint32(1)
    r = np.sqrt(np.float32(-2.0) * log_unit24(u))
    sin, cos = sincos_turn24(w[:, 1] >> np.uint32(8))
    z = np.stack([r * cos, r * sin], axis=1).reshape(-1)[:n]
    return cast(fma32(z, np.float32(std), np.float32(mean)), dtype)


def normal64(seed: int, offset: int, n: int, mean: float, std: float) -> np.ndarray:
    """Box-Muller in float64 from the same words (normal's float32 values are within a
    few float32 ulp of these)."""
    w = block_words(seed, offset, (n + 3) // 4).reshape(-1, 2).astype(np.uint64)
    u = (((w[:, 0] >> np.uint64(8)) | np.uint64(1)).astype(np.float64)) * 2.0 ** -24
    v = (w[:, 1] >> np.uint64(8)).astype(np.float64) * 2.0 ** -23
    r = np.sqrt(-2.0 * np.log(u))
    z = np.stack([r * np.cos(np.pi * v), r * np.sin(np.pi * v)], axis=1).reshape(-1)[:n]
    return mean + std * z


def bernoulli(seed: int, offset: int, n: int, p: float) -> np.ndarray:
    return uniform01(words(seed, offset, n)) < np.float32(p)


def randint(seed: int, offset: int, n: int, low: int, high: int, dtype: np.dtype) -> np.ndarray:
    span = high - low
    if span <= 1 << 32:
        w = words(seed, offset, n).astype(np.uint64)
    else:
        pairs = block_words(seed, offset, (n + 1) // 2).reshape(-1, 2).astype(np.uint64)
        w = (pairs[:, 0] | (pairs[:, 1] << np.uint64(32)))[:n]
    if span < 1 << 64:
        w = w % np.uint64(span)
    values = np.uint64(low & 0xFFFFFFFFFFFFFFFF) + w  # wraps like the kernel's uint64 sum
    if np.dtype(dtype).kind == "i":
        return values.view(np.int64).astype(dtype)
    return values.astype(dtype)


def dropout(seed: int, offset: int, x: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """(out, mask) for x (flattened in C order) as the kernel computes them."""
    flat = np.asarray(x).reshape(-1)
    keep = uniform01(words(seed, offset, flat.size)) < np.float32(1.0 - p)
    scaled = flat.astype(np.float32) * np.float32(1.0 / (1.0 - p))
    out = np.where(keep, scaled, np.float32(0)).astype(flat.dtype)
    return out.reshape(np.shape(x)), keep.reshape(np.shape(x))


BF16 = np.dtype(ml_dtypes.bfloat16)
