// fp16/bf16 (and TF32) GEMM on the tensor cores with mma.sync (sm_80 and newer): the portable
// path, and the one Hopper uses for shapes the wgmma kernel does not take (unaligned rows,
// split-K).
//
// A CTA computes a BM x BN tile with (BM/WM) x (BN/WN) warps, each a WM x WN tile of
// m16n8k16 (TF32: m16n8k8) products accumulated in fp32. K tiles of BK stream through a
// STAGES-deep ring of shared memory filled with cp.async (16 bytes, zero-filled past the
// matrix edge). 16-bit fragments are read with ldmatrix (.trans for M/N-major operands), TF32
// ones with 32-bit loads (rounded with cvt.rna.tf32). Rows are padded by 16 bytes, which keeps
// the copies and the fragment reads free of bank conflicts. VEC=false (a row pitch or base
// not a multiple of 16 bytes): fp32 copies element by element with 4-byte cp.async (as
// asynchronous as the 16-byte ones); 16-bit elements (2-byte aligned: no cp.async) are read
// into registers (fetch_tile) and written to shared memory later (put_tile): the prologue's
// stages are all read before the first is written, and in the main loop the next stage is
// read before the current one's math and written after it, so the loads' latency overlaps.
// Layouts, epilogue and split-K conventions: gemm_common.cu.
#if !defined(GEMM_MMA_SPLIT)  // the first pass: the helpers (see below)
#include "gemm_common.cu"

namespace mma {

// Elements of one stage of an operand tile (MN x BK) of E, rows padded by 16 bytes.
template <typename E, int MN, int BK, bool KMAJ>
struct TileShape {
    static constexpr int VEC = 16 / sizeof(E);             // elements per 16-byte chunk
    static constexpr int ROWS = KMAJ ? MN : BK;            // smem rows
    static constexpr int COLS = (KMAJ ? BK : MN) + VEC;    // smem row pitch in elements
    static constexpr int ELEMS = ROWS * COLS;
};

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Copy the operand tile at (mn0, k0) into one stage. P is KMAJ (P[mn][k] at mn*ld + k) or
// MN-major (P[k][mn] at k*ld + mn); `extent` is M or N.
template <typename E, int MN, int BK, int THREADS, bool KMAJ, bool VEC>
__device__ __forceinline__ void load_tile(E* stage, const E* __restrict__ P, i64 ld, int mn0,
                                          int extent, int k0, int k_end, int tid) {
    typedef TileShape<E, MN, BK, KMAJ> S;
    constexpr int W = S::VEC;
    constexpr int PER_ROW = (KMAJ ? BK : MN) / W;  // 16-byte chunks per smem row
    constexpr int CHUNKS = S::ROWS * PER_ROW;
    static_assert(CHUNKS % THREADS == 0, "tile chunks do not divide among threads");
#pragma unroll
    for (int i = 0; i < CHUNKS / THREADS; ++i) {
        const int q = tid + i * THREADS;
        const int row = q / PER_ROW, col = (q % PER_ROW) * W;
        // (outer index, inner index) in the matrix, the inner one contiguous
        const int outer = KMAJ ? mn0 + row : k0 + row;
        const int inner = KMAJ ? k0 + col : mn0 + col;
        const int outer_end = KMAJ ? extent : k_end;
        const int inner_end = KMAJ ? k_end : extent;
        E* dst = stage + row * S::COLS + col;
        const E* src = P + (i64)outer * ld + inner;
        int valid = (outer < outer_end) ? min(max(inner_end - inner, 0), W) : 0;
        if (VEC) {
            cp_async16(smem_addr(dst), valid > 0 ? src : P, valid * (int)sizeof(E));
        } else if constexpr (sizeof(E) == 4) {
#pragma unroll
            for (int j = 0; j < W; ++j)
                cp_async4(smem_addr(dst + j), j < valid ? src + j : P, j < valid ? 4 : 0);
        } else {
            union {
                uint4 packed;
                E v[W];
            } chunk;
#pragma unroll
            for (int j = 0; j < W; ++j) chunk.v[j] = j < valid ? src[j] : (E)0;
            *reinterpret_cast<uint4*>(dst) = chunk.packed;
        }
    }
}

// VEC=false, 16-bit: a thread's chunks of one operand tile (load_tile's, in its order), read
// element by element into registers (fetch_tile), then written to a stage (put_tile).
template <typename E, int MN, int BK, int THREADS, bool KMAJ>
struct Staged {
    typedef TileShape<E, MN, BK, KMAJ> S;
    static constexpr int PER_ROW = (KMAJ ? BK : MN) / S::VEC;
    static constexpr int COUNT = S::ROWS * PER_ROW / THREADS;
    uint4 chunk[COUNT];
};

template <typename E, int MN, int BK, int THREADS, bool KMAJ>
__device__ __forceinline__ void fetch_tile(Staged<E, MN, BK, THREADS, KMAJ>& regs,
                                           const E* __restrict__ P, i64 ld, int mn0, int extent,
                                           int k0, int k_end, int tid) {
    typedef Staged<E, MN, BK, THREADS, KMAJ> R;
    constexpr int W = R::S::VEC;
#pragma unroll
    for (int i = 0; i < R::COUNT; ++i) {
        const int q = tid + i * THREADS;
        const int row = q / R::PER_ROW, col = (q % R::PER_ROW) * W;
        const int outer = KMAJ ? mn0 + row : k0 + row;
        const int inner = KMAJ ? k0 + col : mn0 + col;
        const int outer_end = KMAJ ? extent : k_end;
        const int inner_end = KMAJ ? k_end : extent;
        const E* src = P + (i64)outer * ld + inner;
        const int valid = (outer < outer_end) ? min(max(inner_end - inner, 0), W) : 0;
        union {
            uint4 packed;
            E v[W];
        } c;
#pragma unroll
        for (int j = 0; j < W; ++j) c.v[j] = j < valid ? src[j] : (E)0;
        regs.chunk[i] = c.packed;
    }
}

template <typename E, int MN, int BK, int THREADS, bool KMAJ>
__device__ __forceinline__ void put_tile(E* stage, const Staged<E, MN, BK, THREADS, KMAJ>& regs,
                                         int tid) {
    typedef Staged<E, MN, BK, THREADS, KMAJ> R;
#pragma unroll
    for (int i = 0; i < R::COUNT; ++i) {
        const int q = tid + i * THREADS;
        const int row = q / R::PER_ROW, col = (q % R::PER_ROW) * R::S::VEC;
        *reinterpret_cast<uint4*>(stage + row * R::S::COLS + col) = regs.chunk[i];
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

__device__ __forceinline__ void mma1688_tf32(float* d, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ u32 to_tf32(float v) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}

}  // namespace mma

// Two kernels from the one text below: gemm_mma_splitk (this file included again, as
// "./gemm_mma.cu": NVRTC mishandles an include of the program's own name, with GEMM_MMA_SPLIT
// 1), then gemm_mma (GEMM_MMA_SPLIT 0). The split kernel's last CTA of each tile sums the K
// slices and stores C (splitk_finish in gemm_common.cu; `counters`: one zeroed ticket counter
// per tile, left zero). Not a __device__ body that both kernels call: inlining one changes the
// tuned gemm_mma's code (its PTX), which this way stays as it was.
#define GEMM_MMA_SPLIT 1
#include "./gemm_mma.cu"
#undef GEMM_MMA_SPLIT
#define GEMM_MMA_SPLIT 0
#endif  // !defined(GEMM_MMA_SPLIT)

template <int DT, int BM, int BN, int BK, int WM, int WN, int STAGES, bool A_K, bool B_K, bool VEC>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
#if GEMM_MMA_SPLIT
gemm_mma_splitk(
#else
gemm_mma(
#endif
    const typename Elem<DT>::T* __restrict__ A, const typename Elem<DT>::T* __restrict__ B,
    typename Elem<DT>::T* __restrict__ C, const typename Elem<DT>::T* __restrict__ Cin,
    float* __restrict__ partial, int M, int N, int K, i64 lda, i64 ldb, i64 ldc, i64 ldcin,
    float alpha, float beta, int group_m, int pair_ok
#if GEMM_MMA_SPLIT
    , unsigned* __restrict__ counters
#endif
    ) {
    using namespace mma;
    typedef typename Elem<DT>::T E;
    constexpr bool TF32 = DT == DT_TF32;
    constexpr int KSTEP = TF32 ? 8 : 16;
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int MI = WM / 16, NI = WN / 8;
    static_assert(NI % 2 == 0 && BK % 16 == 0, "warp tile must be 16k x 16n multiples");
    typedef TileShape<E, BM, BK, A_K> SA;
    typedef TileShape<E, BN, BK, B_K> SB;
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    E* a_stages = reinterpret_cast<E*>(smem_bytes);
    E* b_stages = a_stages + STAGES * SA::ELEMS;

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
        load_tile<E, BM, BK, THREADS, A_K, VEC>(a_stages + stage * SA::ELEMS, A, lda, m0, M, k0,
                                                k_end, tid);
        load_tile<E, BN, BK, THREADS, B_K, VEC>(b_stages + stage * SB::ELEMS, B, ldb, n0, N, k0,
                                                k_end, tid);
    };

    // VEC=false, 16-bit: element loads staged through registers (fetch_tile / put_tile)
    constexpr bool STAGED = !VEC && !is_f32(DT);
    typedef Staged<E, BM, BK, THREADS, A_K> StagedA;
    typedef Staged<E, BN, BK, THREADS, B_K> StagedB;
    auto fetch_stage = [&](StagedA& ra, StagedB& rb, int kt) {
        const int k0 = k_begin + kt * BK;
        fetch_tile<E, BM, BK, THREADS, A_K>(ra, A, lda, m0, M, k0, k_end, tid);
        fetch_tile<E, BN, BK, THREADS, B_K>(rb, B, ldb, n0, N, k0, k_end, tid);
    };
    auto put_stage = [&](int stage, const StagedA& ra, const StagedB& rb) {
        put_tile<E, BM, BK, THREADS, A_K>(a_stages + stage * SA::ELEMS, ra, tid);
        put_tile<E, BN, BK, THREADS, B_K>(b_stages + stage * SB::ELEMS, rb, tid);
    };

    // the prologue's stages all read before the first is written, where their registers
    // (4 per chunk) stay few; else one after another
    constexpr int CHUNKS = StagedA::COUNT + StagedB::COUNT;
    constexpr int AHEAD = (STAGES - 1) * CHUNKS <= 16 ? STAGES - 1 : 1;
    if constexpr (STAGED) {
#pragma unroll
        for (int s0 = 0; s0 < STAGES - 1; s0 += AHEAD) {
            StagedA ra[AHEAD];
            StagedB rb[AHEAD];
#pragma unroll
            for (int s = 0; s < AHEAD; ++s)
                if (s0 + s < k_tiles) fetch_stage(ra[s], rb[s], s0 + s);
#pragma unroll
            for (int s = 0; s < AHEAD; ++s)
                if (s0 + s < k_tiles) put_stage(s0 + s, ra[s], rb[s]);
        }
    } else {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < k_tiles) load_stage(s, s);
            cp_async_commit();
        }
    }

    // Per-lane fragment offsets (in elements) inside a stage, before the mi/ni/kk terms.
    // 16-bit, ldmatrix.x4: an A fragment (16 x 16) is matrices (rows 0-7 | 8-15) x
    // (k 0-7 | 8-15), lane l feeding matrix l/8, row l%8. K-major smem [m][k]: row
    // m = (l%8) + 8*((l/8)%2), k = 8*(l/16); M-major smem [k][m] with .trans: k = (l%8) +
    // 8*(l/16), m = 8*((l/8)%2). A B fragment pair (16k x 16n) is matrices (k 0-7, n 0-7),
    // (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15): N-major smem [k][n] with .trans:
    // k = (l%8) + 8*((l/8)%2), n = 8*(l/16); K-major smem [n][k]: n = (l%8) + 8*(l/16),
    // k = 8*((l/8)%2).
    // TF32, 32-bit loads: lane l holds A (g, t), (g+8, t), (g, t+4), (g+8, t+4) and
    // B (k t, n g), (k t+4, n g) with g = l/4, t = l%4.
    const int l8 = lane % 8, lhi = (lane / 8) % 2, lq = lane / 16;
    const int g = lane / 4, t = lane % 4;
    int a_off, b_off;
    if constexpr (TF32) {
        a_off = A_K ? (wm + g) * SA::COLS + t : t * SA::COLS + wm + g;
        b_off = B_K ? (wn + g) * SB::COLS + t : t * SB::COLS + wn + g;
    } else {
        a_off = A_K ? (wm + l8 + 8 * lhi) * SA::COLS + 8 * lq : (l8 + 8 * lq) * SA::COLS + wm + 8 * lhi;
        b_off = B_K ? (wn + l8 + 8 * lq) * SB::COLS + 8 * lhi : (l8 + 8 * lhi) * SB::COLS + wn + 8 * lq;
    }
    // Element offset of (mn, k) inside an operand's stage.
    auto at_a = [](int mm, int kk) { return A_K ? mm * SA::COLS + kk : kk * SA::COLS + mm; };
    auto at_b = [](int nn, int kk) { return B_K ? nn * SB::COLS + kk : kk * SB::COLS + nn; };

    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        StagedA next_a;
        StagedB next_b;
        if constexpr (STAGED) {  // read now, written after this stage's math (below)
            if (next < k_tiles) fetch_stage(next_a, next_b, next);
        } else {
            if (next < k_tiles) load_stage(next % STAGES, next);
            cp_async_commit();
        }
        const int stage = kt % STAGES;
        const E* a_tile = a_stages + stage * SA::ELEMS + a_off;
        const E* b_tile = b_stages + stage * SB::ELEMS + b_off;
#pragma unroll
        for (int kk = 0; kk < BK; kk += KSTEP) {
            u32 af[MI][4], bf[NI][2];
            if constexpr (TF32) {
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    const float* p = reinterpret_cast<const float*>(a_tile) + at_a(i * 16, kk);
                    af[i][0] = to_tf32(p[0]);
                    af[i][1] = to_tf32(p[at_a(8, 0)]);
                    af[i][2] = to_tf32(p[at_a(0, 4)]);
                    af[i][3] = to_tf32(p[at_a(8, 4)]);
                }
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    const float* p = reinterpret_cast<const float*>(b_tile) + at_b(j * 8, kk);
                    bf[j][0] = to_tf32(p[0]);
                    bf[j][1] = to_tf32(p[at_b(0, 4)]);
                }
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma1688_tf32(acc[i][j], af[i], bf[j]);
            } else {
                const u32 a_base = smem_addr(a_tile), b_base = smem_addr(b_tile);
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    ldmatrix_x4<!A_K>(a_base + at_a(i * 16, kk) * 2, af[i][0], af[i][1], af[i][2],
                                      af[i][3]);
                }
#pragma unroll
                for (int j = 0; j < NI; j += 2) {
                    ldmatrix_x4<!B_K>(b_base + at_b(j * 8, kk) * 2, bf[j][0], bf[j][1],
                                      bf[j + 1][0], bf[j + 1][1]);
                }
#pragma unroll
                for (int i = 0; i < MI; ++i)
#pragma unroll
                    for (int j = 0; j < NI; ++j) mma16816<DT>(acc[i][j], af[i], bf[j]);
            }
        }
        // the stage read last iteration (every thread passed this one's barrier since)
        if constexpr (STAGED) {
            if (next < k_tiles) put_stage(next % STAGES, next_a, next_b);
        }
    }
    cp_async_wait<0>();

    const int t2 = t * 2;
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
#if GEMM_MMA_SPLIT
    splitk_finish<DT, BM, BN>(C, Cin, partial, counters, M, N, ldc, ldcin, alpha, beta, m0, n0,
                              pair_ok != 0);
#endif
}
