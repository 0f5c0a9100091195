"""A numpy reference of gpurt.random: Philox4x32-10 and each distribution's transform, as
docs/random.md and <gpurt/random.cuh> define them (float32 arithmetic where the kernels
round in float32, so results compare bit for bit; float64 for the normal transform)."""

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


def uniform(seed: int, offset: int, n: int, low: float, high: float,
            dtype: np.dtype = F32) -> np.ndarray:
    scale = np.float32(high - low)
    values = np.float32(low) + uniform01(words(seed, offset, n)) * scale
    return cast(values, dtype)


def normal64(seed: int, offset: int, n: int, mean: float, std: float) -> np.ndarray:
    """Box-Muller in float64 (the kernels use float32 logf/sqrtf/sincospif: a few ulp off)."""
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
