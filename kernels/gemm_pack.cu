// Copies of GEMM operands whose rows TMA cannot read (a row pitch or base that is not a
// 16-byte multiple, e.g. 4099 16-bit elements = 8198 bytes) into rows of a 128-byte-multiple
// pitch, so that the wgmma kernels can load them (kernels/_gemm_pack.py). One launch copies
// up to two operands: blockIdx.y picks which. A warp copies a row at a time (grid-stride over
// rows), its lanes reading consecutive elements: coalesced at any alignment of the source,
// eight loads in flight per lane before their stores. The padding past each row is never
// written: TMA reads only the matrix's own columns (its zero fill covers the rest).
// T: unsigned short (16-bit types) or unsigned int (fp32).

typedef long long i64;

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

}  // namespace gpurt_pack

// Operand j (0 or 1, blockIdx.y): rows_j rows of width_j elements, ld_j elements apart at
// src_j, copied to dst_j with rows pitch_j elements apart.
template <typename T>
__global__ void __launch_bounds__(256) gemm_pack(
    const T* __restrict__ src0, i64 ld0, T* __restrict__ dst0, i64 pitch0, int width0,
    int rows0, const T* __restrict__ src1, i64 ld1, T* __restrict__ dst1, i64 pitch1,
    int width1, int rows1) {
    if (blockIdx.y == 0) {
        gpurt_pack::copy_rows<T>(src0, ld0, dst0, pitch0, width0, rows0);
    } else {
        gpurt_pack::copy_rows<T>(src1, ld1, dst1, pitch1, width1, rows1);
    }
}
