"""The CUDA kernels of ``gpurt demo``: saxpy for the launch and stream steps, and a small
matmul and row softmax for the graph step when the bundled ``gpurt.kernels`` are missing.

They are plain CUDA C++ for NVRTC (no headers), fp32, written to be read, not to be fast:
the bundled kernels (gpurt.kernels.gemm, gpurt.kernels.softmax) are the fast ones.
"""

from __future__ import annotations

from typing import Any

from ..array import Array, empty

__all__ = ["SOURCE", "matmul", "softmax"]

SOURCE = r"""
// y = a * x + y over n elements, with a grid-stride loop.
extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y,
                                 long long n) {
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = a * x[i] + y[i];
}

// c[m, n] = a[m, k] @ b[k, n], row-major, 16x16 tiles staged through shared memory.
#define TILE 16
extern "C" __global__ void demo_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ c, int m, int n, int k) {
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += TILE) {
        int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        a_tile[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? a[(long long)row * k + ka] : 0.0f;
        b_tile[threadIdx.y][threadIdx.x] = (kb < k && col < n) ? b[(long long)kb * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += a_tile[threadIdx.y][kk] * b_tile[kk][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[(long long)row * n + col] = acc;
}

// Reduce v over the block (max or sum) with warp shuffles; every thread gets the result.
__device__ float block_reduce(float v, float* partials, bool is_max) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partials[warp] = v;
    __syncthreads();
    float neutral = is_max ? __int_as_float(0xff800000) : 0.0f;  // -inf or 0
    v = lane < (int)(blockDim.x >> 5) ? partials[lane] : neutral;
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();  // partials is reused by the next call
    return v;
}

// y = softmax(x) over each row of `cols` elements: one block per row.
extern "C" __global__ void demo_softmax(const float* __restrict__ x, float* __restrict__ y,
                                        int cols) {
    __shared__ float partials[32];
    const float* in = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float peak = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) peak = fmaxf(peak, in[j]);
    peak = block_reduce(peak, partials, true);
    float total = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) total += expf(in[j] - peak);
    float scale = 1.0f / block_reduce(total, partials, false);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) out[j] = expf(in[j] - peak) * scale;
}
"""

SOFTMAX_THREADS = 256


def matmul(module: Any, a: Array, b: Array) -> Array:
    """A new (m, n) array ``a @ b`` of two C-contiguous float32 arrays, on the current stream."""
    m, k = a.shape
    n = b.shape[1]
    out = empty((m, n))
    grid = ((n + 15) // 16, (m + 15) // 16)
    module["demo_matmul"](grid, (16, 16), (a, b, out, m, n, k))
    return out


def softmax(module: Any, x: Array) -> Array:
    """A new array, the softmax of each row of a C-contiguous 2-D float32 array."""
    rows, cols = x.shape
    out = empty((rows, cols))
    module["demo_softmax"](rows, SOFTMAX_THREADS, (x, out, cols))
    return out
