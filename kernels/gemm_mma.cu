// fp16/bf16 GEMM on the tensor cores with mma.sync (sm_80 and newer): the portable path, and
// the one Hopper uses for shapes the wgmma kernel does not take (unaligned rows, split-K).
//
// A CTA computes a BM x BN tile with (BM/WM) x (BN/WN) warps, each a WM x WN tile of
// m16n8k16 products accumulated in fp32. K tiles of BK stream through a STAGES-deep ring of
// shared memory filled with cp.async (16 bytes, zero-filled past the matrix edge) and read with
// ldmatrix (.trans for M/N-major operands). Rows are padded by 8 elements, which keeps both
// the 16-byte copies and the ldmatrix phases free of bank conflicts. VEC=false (a row pitch or
// base not a multiple of 16 bytes) loads element by element instead of cp.async.
// Layouts, epilogue and split-K conventions: gemm_common.cu.
#include "gemm_common.cu"

namespace mma {

constexpr int PAD = 8;

// Elements of one stage of an operand tile (MN x BK), padded.
template <int MN, int BK, bool KMAJ>
struct TileShape {
    static constexpr int ROWS = KMAJ ? MN : BK;      // smem rows
    static constexpr int COLS = (KMAJ ? BK : MN) + PAD;  // smem row pitch in elements
    static constexpr int ELEMS = ROWS * COLS;
};

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Copy the operand tile at (mn0, k0) into one stage. P is KMAJ (P[mn][k] at mn*ld + k) or
// MN-major (P[k][mn] at k*ld + mn); `extent` is M or N.
template <int MN, int BK, int THREADS, bool KMAJ, bool VEC>
__device__ __forceinline__ void load_tile(u16* stage, const u16* __restrict__ P, i64 ld, int mn0,
                                          int extent, int k0, int k_end, int tid) {
    typedef TileShape<MN, BK, KMAJ> S;
    constexpr int PER_ROW = (KMAJ ? BK : MN) / 8;  // 16-byte chunks per smem row
    constexpr int CHUNKS = S::ROWS * PER_ROW;
    static_assert(CHUNKS % THREADS == 0, "tile chunks do not divide among threads");
#pragma unroll
    for (int i = 0; i < CHUNKS / THREADS; ++i) {
        const int q = tid + i * THREADS;
        const int row = q / PER_ROW, col = (q % PER_ROW) * 8;
        // (outer index, inner index) in the matrix, the inner one contiguous
        const int outer = KMAJ ? mn0 + row : k0 + row;
        const int inner = KMAJ ? k0 + col : mn0 + col;
        const int outer_end = KMAJ ? extent : k_end;
        const int inner_end = KMAJ ? k_end : extent;
        u16* dst = stage + row * S::COLS + col;
        const u16* src = P + (i64)outer * ld + inner;
        int valid = (outer < outer_end) ? min(max(inner_end - inner, 0), 8) : 0;
        if (VEC) {
            cp_async16(smem_addr(dst), valid > 0 ? src : P, valid * 2);
        } else {
            u16 v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = j < valid ? src[j] : (u16)0;
            uint4 packed;
            packed.x = v[0] | ((u32)v[1] << 16);
            packed.y = v[2] | ((u32)v[3] << 16);
            packed.z = v[4] | ((u32)v[5] << 16);
            packed.w = v[6] | ((u32)v[7] << 16);
            *reinterpret_cast<uint4*>(dst) = packed;
        }
    }
}

template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    if (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
    }
}

template <int DT>
__device__ __forceinline__ void mma16816(float* d, const u32* a, const u32* b) {
    if (DT == DT_BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

}  // namespace mma

template <int DT, int BM, int BN, int BK, int WM, int WN, int STAGES, bool A_K, bool B_K, bool VEC>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
gemm_mma(const u16* __restrict__ A, const u16* __restrict__ B, u16* __restrict__ C,
         const u16* __restrict__ Cin, float* __restrict__ partial, int M, int N, int K, i64 lda,
         i64 ldb, i64 ldc, i64 ldcin, float alpha, float beta, int group_m, int pair_ok) {
    using namespace mma;
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int MI = WM / 16, NI = WN / 8;
    static_assert(NI % 2 == 0 && BK % 16 == 0, "warp tile must be 16k x 16n multiples");
    typedef TileShape<BM, BK, A_K> SA;
    typedef TileShape<BN, BK, B_K> SB;
    extern __shared__ __align__(16) u16 smem[];
    u16* a_stages = smem;
    u16* b_stages = smem + STAGES * SA::ELEMS;

    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    int tm, tn;
    grouped_tile(blockIdx.x, tiles_m, tiles_n, group_m, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    int k_begin, k_end;
    split_range<BK>(K, k_begin, k_end);
    const int k_tiles = (k_end - k_begin + BK - 1) / BK;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

    auto load_stage = [&](int stage, int kt) {
        const int k0 = k_begin + kt * BK;
        load_tile<BM, BK, THREADS, A_K, VEC>(a_stages + stage * SA::ELEMS, A, lda, m0, M, k0,
                                             k_end, tid);
        load_tile<BN, BK, THREADS, B_K, VEC>(b_stages + stage * SB::ELEMS, B, ldb, n0, N, k0,
                                             k_end, tid);
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        cp_async_commit();
    }

    // Per-lane ldmatrix offsets (in elements) inside a stage, before the mi/ni/kk terms.
    // A fragment (16 x 16): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15), lane l feeds matrix
    // l/8, row l%8. K-major smem [m][k]: row m = (l%8) + 8*((l/8)%2), k = 8*(l/16).
    // M-major smem [k][m] with .trans: k = (l%8) + 8*(l/16), m = 8*((l/8)%2).
    const int l8 = lane % 8, lhi = (lane / 8) % 2, lq = lane / 16;
    const int a_off = A_K ? (wm + l8 + 8 * lhi) * SA::COLS + 8 * lq
                          : (l8 + 8 * lq) * SA::COLS + wm + 8 * lhi;
    // B fragment pair (16k x 16n): matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
    // (k 8-15, n 8-15). N-major smem [k][n] with .trans: k = (l%8) + 8*((l/8)%2), n = 8*(l/16).
    // K-major smem [n][k]: n = (l%8) + 8*(l/16), k = 8*((l/8)%2).
    const int b_off = B_K ? (wn + l8 + 8 * lq) * SB::COLS + 8 * lhi
                          : (l8 + 8 * lhi) * SB::COLS + wn + 8 * lq;

    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        {
            const int next = kt + STAGES - 1;
            if (next < k_tiles) load_stage(next % STAGES, next);
            cp_async_commit();
        }
        const int stage = kt % STAGES;
        const u32 a_base = smem_addr(a_stages + stage * SA::ELEMS + a_off);
        const u32 b_base = smem_addr(b_stages + stage * SB::ELEMS + b_off);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            u32 af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int off = A_K ? (i * 16) * SA::COLS + kk : kk * SA::COLS + i * 16;
                ldmatrix_x4<!A_K>(a_base + off * 2, af[i][0], af[i][1], af[i][2], af[i][3]);
            }
#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                const int off = B_K ? (j * 8) * SB::COLS + kk : kk * SB::COLS + j * 8;
                ldmatrix_x4<!B_K>(b_base + off * 2, bf[j][0], bf[j][1], bf[j + 1][0], bf[j + 1][1]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma16816<DT>(acc[i][j], af[i], bf[j]);
        }
    }
    cp_async_wait<0>();

    const int g = lane / 4, t2 = (lane % 4) * 2;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int r = m0 + wm + i * 16 + g, c = n0 + wn + j * 8 + t2;
            store_pair<DT>(C, Cin, partial, M, N, ldc, ldcin, alpha, beta, r, c, acc[i][j][0],
                           acc[i][j][1], pair_ok != 0);
            store_pair<DT>(C, Cin, partial, M, N, ldc, ldcin, alpha, beta, r + 8, c, acc[i][j][2],
                           acc[i][j][3], pair_ok != 0);
        }
    }
}
