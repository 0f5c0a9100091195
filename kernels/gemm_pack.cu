// Copies of GEMM operands whose rows TMA cannot read (a row pitch or base that is not a
// 16-byte multiple, e.g. 4099 16-bit elements = 8198 bytes) into rows of a 128-byte-multiple
// pitch, so that the wgmma kernels can load them (kernels/_gemm_pack.py). One launch copies
// up to two operands: blockIdx.y picks which. A warp copies a row at a time (grid-stride over
// rows). Into 16-byte aligned rows (the operands' copies) each lane reads the aligned 16-byte
// blocks that hold one 16-byte chunk of the row (the block of its first byte and, where the
// row does not start on a block, the next one, read only where it holds a byte of the row),
// shifts them into place and stores the chunk whole (the row's last, partial chunk element
// by element), eight chunks in flight per lane. Into rows of any other alignment (C's copy
// back into the user's C) the lanes copy element by element, coalesced, eight loads in
// flight per lane before their stores. Nothing past a row is written: TMA reads only the
// matrix's own columns (its zero fill covers the rest).
// T: unsigned short (16-bit types) or unsigned int (fp32).

typedef long long i64;
typedef unsigned int u32;
typedef unsigned long long u64;

namespace gpurt_pack {

constexpr int kWarps = 8;   // warps per block (256 threads)
constexpr int kUnroll = 8;  // loads in flight per lane

template <typename T>
__device__ __forceinline__ void copy_rows(const T* __restrict__ src, i64 ld,
                                          T* __restrict__ dst, i64 pitch, int width,
                                          int rows) {
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * kWarps;
    for (i64 row = (i64)blockIdx.x * kWarps + (threadIdx.x >> 5); row < rows; row += warps) {
        const T* s = src + row * ld;
        T* d = dst + row * pitch;
        int col = lane;
        for (; col + 32 * (kUnroll - 1) < width; col += 32 * kUnroll) {
            T v[kUnroll];
#pragma unroll
            for (int i = 0; i < kUnroll; ++i) v[i] = s[col + 32 * i];
#pragma unroll
            for (int i = 0; i < kUnroll; ++i) d[col + 32 * i] = v[i];
        }
        for (; col < width; col += 32) d[col] = s[col];
    }
}

// The 16 bytes at byte s (0..15) of the 32 in (x, y): s/4 words by two select steps, then
// s%4 bytes by funnel shifts.
__device__ __forceinline__ uint4 shifted(const uint4& x, const uint4& y, int s) {
    const u32 w[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
    u32 t[6], u[5];
#pragma unroll
    for (int j = 0; j < 6; ++j) t[j] = (s & 8) ? w[j + 2] : w[j];
#pragma unroll
    for (int j = 0; j < 5; ++j) u[j] = (s & 4) ? t[j + 1] : t[j];
    const int bits = (s & 3) * 8;
    return make_uint4(__funnelshift_r(u[0], u[1], bits), __funnelshift_r(u[1], u[2], bits),
                      __funnelshift_r(u[2], u[3], bits), __funnelshift_r(u[3], u[4], bits));
}

// copy_rows into rows whose base and pitch are 16-byte multiples: 16-byte chunks.
template <typename T>
__device__ __forceinline__ void copy_rows_vec(const T* __restrict__ src, i64 ld,
                                              T* __restrict__ dst, i64 pitch, int width,
                                              int rows) {
    constexpr int kPer = 16 / (int)sizeof(T);  // elements per chunk
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * kWarps;
    const int chunks = (width + kPer - 1) / kPer;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (i64 row = (i64)blockIdx.x * kWarps + (threadIdx.x >> 5); row < rows; row += warps) {
        const u64 start = reinterpret_cast<u64>(src + row * ld);
        const int s = (int)(start & 15);
        const i64 end = s + (i64)width * (i64)sizeof(T);  // bytes from the first block on
        const uint4* from = reinterpret_cast<const uint4*>(start & ~(u64)15);
        uint4* to = reinterpret_cast<uint4*>(dst + row * pitch);
        for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
            uint4 x[kUnroll], y[kUnroll];
#pragma unroll
            for (int i = 0; i < kUnroll; ++i) {
                const int c = c0 + 32 * i;
                x[i] = c < chunks ? __ldg(from + c) : zero;
                y[i] = c < chunks && s != 0 && 16 * (i64)(c + 1) < end ? __ldg(from + c + 1)
                                                                       : zero;
            }
#pragma unroll
            for (int i = 0; i < kUnroll; ++i) {
                const int c = c0 + 32 * i;
                if (c >= chunks) continue;
                union {
                    uint4 whole;
                    T e[kPer];
                } chunk;
                chunk.whole = shifted(x[i], y[i], s);
                const i64 left = width - (i64)c * kPer;  // the row's elements from this chunk
                if (left >= kPer) {
                    to[c] = chunk.whole;
                } else {  // the row's last chunk: its own elements only
                    T* d = reinterpret_cast<T*>(to + c);
#pragma unroll
                    for (int j = 0; j < kPer; ++j)
                        if (j < left) d[j] = chunk.e[j];
                }
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void copy_operand(const T* __restrict__ src, i64 ld,
                                             T* __restrict__ dst, i64 pitch, int width,
                                             int rows) {
    if ((reinterpret_cast<u64>(dst) | (u64)(pitch * (i64)sizeof(T))) % 16 == 0) {
        copy_rows_vec<T>(src, ld, dst, pitch, width, rows);
    } else {
        copy_rows<T>(src, ld, dst, pitch, width, rows);
    }
}

}  // namespace gpurt_pack

// Operand j (0 or 1, blockIdx.y): rows_j rows of width_j elements, ld_j elements apart at
// src_j, copied to dst_j with rows pitch_j elements apart.
template <typename T>
__global__ void __launch_bounds__(256) gemm_pack(
    const T* __restrict__ src0, i64 ld0, T* __restrict__ dst0, i64 pitch0, int width0,
    int rows0, const T* __restrict__ src1, i64 ld1, T* __restrict__ dst1, i64 pitch1,
    int width1, int rows1) {
    if (blockIdx.y == 0) {
        gpurt_pack::copy_operand<T>(src0, ld0, dst0, pitch0, width0, rows0);
    } else {
        gpurt_pack::copy_operand<T>(src1, ld1, dst1, pitch1, width1, rows1);
    }
}
