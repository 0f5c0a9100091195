// Exact fp32 GEMM on the SIMT cores: 2-D block tiling (BM x BN x BK, BK 8 or 16), each warp a
// 32 x 8*TN tile, each thread an 8 x TN block of outputs held in registers (4 x 4 quadrants, so
// its shared-memory reads are float4 and conflict-free), the next K tile prefetched into
// registers while the current one is multiplied (double-buffered shared memory, one barrier per
// tile). TN = 8 caps registers at 128 for 2 CTAs per SM; TN = 16 runs 1 CTA of 8 warps per SM.
// Layouts, epilogue and split-K conventions: gemm_common.cu.
#include "gemm_common.cu"

namespace simt {

constexpr int PAD = 4;

// Four consecutive floats of one row: elements [c, c+4) of `row` (nullptr: row outside),
// zero where c+j >= limit. VEC: the row is 16-byte aligned at multiples of 4.
template <bool VEC>
__device__ __forceinline__ float4 load4(const float* __restrict__ row, int c, int limit) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row == nullptr) return v;
    if (VEC && c + 3 < limit) return __ldg(reinterpret_cast<const float4*>(row + c));
    if (c + 0 < limit) v.x = __ldg(row + c + 0);
    if (c + 1 < limit) v.y = __ldg(row + c + 1);
    if (c + 2 < limit) v.z = __ldg(row + c + 2);
    if (c + 3 < limit) v.w = __ldg(row + c + 3);
    return v;
}

// One operand's K tile (an MN x BK slab) in registers: CH float4 chunks per thread, each with
// its row pointer fixed at construction. KMAJ: the chunks run along K (stored transposed into
// shared memory); else along M/N (stored as they are).
template <int MN, int BK, int THREADS, bool KMAJ, bool VEC>
struct TileLoader {
    static constexpr int CH = MN * BK / 4 / THREADS;
    static_assert(CH >= 1 && CH * THREADS * 4 == MN * BK, "tile does not divide among threads");
    float4 regs[CH];
    const float* base[CH];  // KMAJ: the row (nullptr outside); else column block at k = 0
    int off[CH];            // KMAJ: k offset of the chunk in the tile; else the k row in the tile
    int lim;                // KMAJ: K end; else the number of valid columns from the chunk start

    // For the matrix P with `extent` rows along M/N, tile origin mn0.
    __device__ __forceinline__ TileLoader(const float* __restrict__ P, i64 ld, int mn0, int extent,
                                          int k_end, int tid) {
#pragma unroll
        for (int i = 0; i < CH; ++i) {
            const int q = tid + i * THREADS;
            if (KMAJ) {
                const int mn = q / (BK / 4);
                off[i] = (q % (BK / 4)) * 4;
                base[i] = (mn0 + mn < extent) ? P + (i64)(mn0 + mn) * ld : nullptr;
            } else {
                off[i] = q / (MN / 4);
                base[i] = P + mn0 + (q % (MN / 4)) * 4;
            }
        }
        lim = KMAJ ? k_end : extent - mn0;
    }

    __device__ __forceinline__ void load(i64 ld, int k0, int k_end, int tid) {
#pragma unroll
        for (int i = 0; i < CH; ++i) {
            if (KMAJ) {
                regs[i] = load4<VEC>(base[i], k0 + off[i], lim);
            } else {
                const int q = tid + i * THREADS, mc = (q % (MN / 4)) * 4;
                const int k = k0 + off[i];
                regs[i] = load4<VEC>(k < k_end ? base[i] + (i64)k * ld - mc : nullptr, mc, lim);
            }
        }
    }

    // Store into smem laid out [BK][MN + PAD].
    __device__ __forceinline__ void store(float (*S)[MN + PAD], int tid) const {
#pragma unroll
        for (int i = 0; i < CH; ++i) {
            const int q = tid + i * THREADS;
            if (KMAJ) {
                const int mn = q / (BK / 4), kc = off[i];
                S[kc + 0][mn] = regs[i].x;
                S[kc + 1][mn] = regs[i].y;
                S[kc + 2][mn] = regs[i].z;
                S[kc + 3][mn] = regs[i].w;
            } else {
                *reinterpret_cast<float4*>(&S[off[i]][(q % (MN / 4)) * 4]) = regs[i];
            }
        }
    }
};

}  // namespace simt

template <int BM, int BN, int BK, int TN, bool A_K, bool B_K, bool VEC>
__global__ void __launch_bounds__((BM / 32) * (BN / (8 * TN)) * 32, TN == 8 ? 2 : 1)
gemm_simt(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
          const float* __restrict__ Cin, float* __restrict__ partial, int M, int N, int K,
          i64 lda, i64 ldb, i64 ldc, i64 ldcin, float alpha, float beta, int group_m,
          int pair_ok) {
    using namespace simt;
    static_assert(TN == 8 || TN == 16, "a thread computes 8 x 8 or 8 x 16 outputs");
    constexpr int WN = 8 * TN;  // warp tile: 32 x WN
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / 32) * WARPS_N * 32;
    __shared__ __align__(16) float As[2][BK][BM + PAD];
    __shared__ __align__(16) float Bs[2][BK][BN + PAD];

    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    int tm, tn;
    grouped_tile(blockIdx.x, tiles_m, tiles_n, group_m, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    int k_begin, k_end;
    split_range<BK>(K, k_begin, k_end);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp / WARPS_N) * 32, wn = (warp % WARPS_N) * WN;
    const int lm = (lane / 8) * 4, ln = (lane % 8) * 4;

    TileLoader<BM, BK, THREADS, A_K, VEC> a_tile(A, lda, m0, M, k_end, tid);
    TileLoader<BN, BK, THREADS, B_K, VEC> b_tile(B, ldb, n0, N, k_end, tid);
    float acc[8][TN];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    int k0 = k_begin;
    if (k0 < k_end) {
        a_tile.load(lda, k0, k_end, tid);
        b_tile.load(ldb, k0, k_end, tid);
        a_tile.store(As[0], tid);
        b_tile.store(Bs[0], tid);
    }
    __syncthreads();
    int buf = 0;
    for (; k0 < k_end; k0 += BK) {
        const bool more = k0 + BK < k_end;
        if (more) {
            a_tile.load(lda, k0 + BK, k_end, tid);
            b_tile.load(ldb, k0 + BK, k_end, tid);
        }
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[8], b[TN];
            *reinterpret_cast<float4*>(&a[0]) = *reinterpret_cast<const float4*>(&As[buf][k][wm + lm]);
            *reinterpret_cast<float4*>(&a[4]) = *reinterpret_cast<const float4*>(&As[buf][k][wm + 16 + lm]);
#pragma unroll
            for (int q = 0; q < TN / 4; ++q)
                *reinterpret_cast<float4*>(&b[4 * q]) =
                    *reinterpret_cast<const float4*>(&Bs[buf][k][wn + 32 * q + ln]);
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) {
            a_tile.store(As[buf ^ 1], tid);
            b_tile.store(Bs[buf ^ 1], tid);
        }
        __syncthreads();
        buf ^= 1;
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = m0 + wm + lm + (i % 4) + (i / 4) * 16;
#pragma unroll
        for (int j = 0; j < TN; j += 2) {
            const int c = n0 + wn + ln + (j % 4) + (j / 4) * 32;
            store_pair<DT_F32>(C, Cin, partial, M, N, ldc, ldcin, alpha, beta, r, c, acc[i][j],
                               acc[i][j + 1], pair_ok != 0);
        }
    }
}
