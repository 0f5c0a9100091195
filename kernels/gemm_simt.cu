// Exact fp32 GEMM on the SIMT cores: 2-D block tiling (BM x BN x BK, BK 8 or 16), each warp a
// 32 x 8*TN tile, each thread an 8 x TN block of outputs held in registers (4 x 4 quadrants, so
// its shared-memory reads are float4 and conflict-free: lanes that share an A or B quadrant read
// the same address). Global -> shared copies are asynchronous (cp.async) into a STAGES-deep ring
// of shared tiles, both operands stored [BK][MN] (K-contiguous operands transposed on the way by
// 4-byte copies), so no register stages the next tile; the fragments of the next k step are read
// while the current one is multiplied, and one barrier per K tile both publishes a landed tile
// and frees the one last read. The main loop has no bounds checks: rows/columns past the
// matrix read its last row/column (their results are never stored) and the partial K tile is
// the first one, zero-filled below the slice start. TN = 8 caps registers at 128 for 2 CTAs per
// SM; TN = 16 takes ~233 (1 CTA of 8 warps or 2 of 4 per SM). Measured (notes_gemm.md, v4):
// 128 x 256 x 16 with TN = 16 runs at 0.96-0.97 of cuBLAS's SGEMM on an H200.
// Layouts, epilogue, split-K: gemm_common.cu.
#if !defined(GEMM_SIMT_SPLIT)  // the first pass: the helpers (see below)
#include "gemm_common.cu"

namespace simt {

constexpr int PAD = 4;  // floats after each row of a shared tile: transposing stores hit 32 banks

template <bool C, class T, class F> struct pick { typedef T type; };
template <class T, class F> struct pick<false, T, F> { typedef F type; };

// Copies BYTES (4 or 16) from global `src` to shared `dst`, zero-filling past `src_bytes`
// (cp.async, sm_80+; a plain load and store on older GPUs, where commit/wait are no-ops).
template <int BYTES>
__device__ __forceinline__ void copy_async(u32 dst, const float* src, int src_bytes) {
#if __CUDA_ARCH__ >= 800
    if constexpr (BYTES == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(dst), "l"(src), "r"(src_bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                     :: "r"(dst), "l"(src), "r"(src_bytes));
    }
#else
#pragma unroll
    for (int i = 0; i < BYTES / 4; ++i) {
        const float v = 4 * i < src_bytes ? src[i] : 0.f;
        asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(dst + 4 * i), "f"(v));
    }
#endif
}

__device__ __forceinline__ void copy_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void copy_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}

__device__ __forceinline__ void load_shared(float* to, u32 addr) {
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(to[0]), "=f"(to[1]), "=f"(to[2]), "=f"(to[3]) : "r"(addr));
}

// One operand's MN x BK slab when K is contiguous in global memory (row-major A, or B given
// N x K), copied transposed into a shared [BK][MN + PAD] tile element by element. A thread
// copies KPT elements (KL apart along K) of each of P rows (R apart); KL = 8 threads side by
// side along K where P <= 8 rows a thread allow it make every warp-wide copy read whole
// 32-byte sectors (fewer read parts of sectors: 4 threads lost 3-40% on B given N x K, H100,
// session 21). Each call copies the next K tile, starting at k_first (the constructor's).
// Where the slab's elements do not divide that way among the threads (tiles of 3 warp rows:
// 96 or 192 threads), KL = 8 threads side by side along K and R rows apart, the last pass's
// rows past the slab copying nothing.
template <int MN, int BK, int THREADS>
struct KMajorShape {
    static constexpr int E = MN * BK / THREADS, KPT = E > BK ? E / 8 : BK / 8, P = E / KPT,
                         KL = BK / KPT;
    static constexpr bool EXACT = E * THREADS == MN * BK && P * KPT == E && KL * KPT == BK &&
                                  THREADS % KL == 0 && (THREADS / KL) * P == MN;
};

template <int MN, int BK, int THREADS>
struct KMajorCopy {
    using Shape = KMajorShape<MN, BK, THREADS>;
    static constexpr bool EXACT = Shape::EXACT;
    static constexpr int KL = EXACT ? Shape::KL : 8, KPT = BK / KL, R = THREADS / KL,
                         P = EXACT ? Shape::P : (MN + R - 1) / R;
    static_assert(KL * KPT == BK && R * KL == THREADS && R * P >= MN && R < MN + PAD,
                  "tile does not divide among threads");
    const float* row[P];  // this thread's first element of each row in the next tile (rows
                          // past the matrix: its last row)
    u32 dst;              // the byte offset of that element in a shared tile
    int kl, k;            // its k in the tile; the next tile's first k

    __device__ __forceinline__ KMajorCopy(const float* __restrict__ src, i64 ld, int mn0,
                                          int extent, int k_first, int tid)
        : dst(4 * ((tid % KL) * (MN + PAD) + tid / KL)), kl(tid % KL), k(k_first) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int r = min(mn0 + tid / KL + p * R, extent - 1);
            row[p] = src + (i64)r * ld + k_first + kl;
        }
    }

    // Copies the next K tile into the shared tile at `tile`. FIRST: it is the partial one,
    // zero where k < k_lo (read from `fallback` there, with no bytes taken).
    template <bool FIRST>
    __device__ __forceinline__ void copy(u32 tile, int k_lo, const float* fallback) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            if constexpr (!EXACT) {  // rows past the slab (its last pass) copy nothing
                if ((int)(dst / 4) % (MN + PAD) + p * R >= MN) break;
            }
#pragma unroll
            for (int e = 0; e < KPT; ++e) {
                const bool ok = !FIRST || k + kl + e * KL >= k_lo;
                copy_async<4>(tile + dst + 4 * (e * KL * (MN + PAD) + p * R),
                              ok ? row[p] + e * KL : fallback, ok ? 4 : 0);
            }
            row[p] += BK;
        }
        k += BK;
    }
};

// One operand's MN x BK slab when MN is contiguous in global memory (row-major B, or A given
// K x M), copied as it is into a shared [BK][MN + PAD] tile, 4 floats a thread per k row: one
// 16-byte copy of adjacent floats (VEC: 16-byte aligned rows), else four 4-byte copies of
// floats ML apart, so that each warp-wide copy reads and writes consecutive words. A warp
// copies whole rows of the slab; each thread C chunks, R rows of K apart (where R does not
// divide BK, the last of them past the slab copies nothing).
template <int MN, int BK, int THREADS, bool VEC>
struct MNMajorCopy {
    static constexpr int ML = MN / 4, R = THREADS / ML, C = (BK + R - 1) / R;
    static_assert(R * ML == THREADS && C * R >= BK, "tile does not divide among threads");
    const float* next;  // this thread's chunk in the next tile
    i64 ld;
    u32 dst;            // the chunk's byte offset in a shared tile
    int kr, valid, k;   // the chunk's k row in the tile; VEC: its elements inside the matrix
                        // (0..4), else the columns left from its first; the next tile's first k

    __device__ __forceinline__ MNMajorCopy(const float* __restrict__ src, i64 ld_, int mn0,
                                           int extent, int k_first, int tid)
        : ld(ld_), kr(tid / ML), k(k_first) {
        const int col = VEC ? (tid % ML) * 4 : tid % ML;
        valid = VEC ? max(0, min(4, extent - mn0 - col)) : extent - mn0 - col;
        dst = 4 * (kr * (MN + PAD) + col);
        next = src + (i64)(k_first + kr) * ld + (valid > 0 ? mn0 + col : 0);
    }

    template <bool FIRST>
    __device__ __forceinline__ void copy(u32 tile, int k_lo, const float* fallback) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (C * R != BK && kr + c * R >= BK) break;  // past the slab (the last chunk)
            const float* from = next + (i64)c * R * ld;
            const u32 to = tile + dst + 4 * c * R * (MN + PAD);
            const bool ok = !FIRST || k + kr + c * R >= k_lo;
            if (VEC) {
                copy_async<16>(to, ok ? from : fallback, ok ? 4 * valid : 0);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool in = ok && e * ML < valid;
                    copy_async<4>(to + 4 * e * ML, in ? from + e * ML : fallback, in ? 4 : 0);
                }
            }
        }
        next += BK * ld;
        k += BK;
    }
};

template <int MN, int BK, int THREADS, bool KMAJ, bool VEC>
using TileCopy = typename pick<KMAJ, KMajorCopy<MN, BK, THREADS>,
                               MNMajorCopy<MN, BK, THREADS, VEC>>::type;

// Split-K's partial sums: slice s holds M rows of NP = N rounded up to 4 floats (each row
// 16-byte aligned at any N, so every access below is one 16-byte access), at s * M * NP.
__device__ __forceinline__ int partial_pitch(int N) { return (N + 3) & ~3; }

// Loads the 4 columns c..c+3 (c % 4 == 0) of row r of one split-K slice past L1 (other CTAs
// wrote them). Chunks past the matrix read its last chunk (the caller never stores those sums).
__device__ __forceinline__ float4 load_slice4(const float* __restrict__ slice, int r, int c,
                                              int NP) {
    return __ldcg(reinterpret_cast<const float4*>(slice + (i64)r * NP + min(c, NP - 4)));
}

// The sums over K slices 0..gridDim.z - 1, in that order, of ROWS x TN outputs (rows `rows`,
// columns c0 + 32 q + 0..3): each slice's loads of them issued together, so their latencies
// overlap.
template <int ROWS, int TN>
__device__ __forceinline__ void sum_slices(const float* __restrict__ partial, i64 total,
                                           const int (&rows)[ROWS], int c0, int NP,
                                           float4 (&sum)[ROWS][TN / 4]) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int q = 0; q < TN / 4; ++q) sum[i][q] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 2
    for (int s = 0; s < (int)gridDim.z; ++s) {
        float4 v[ROWS][TN / 4];
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
#pragma unroll
            for (int q = 0; q < TN / 4; ++q)
                v[i][q] = load_slice4(partial + s * total, rows[i], c0 + 32 * q, NP);
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
#pragma unroll
            for (int q = 0; q < TN / 4; ++q) {
                sum[i][q].x += v[i][q].x;
                sum[i][q].y += v[i][q].y;
                sum[i][q].z += v[i][q].z;
                sum[i][q].w += v[i][q].w;
            }
    }
}

// The sums over K slices 0..gridDim.z - 1, in that order, of U chunks of 4 outputs (row r[u],
// columns c[u]..c[u] + 3), each slice's U loads issued together.
template <int U>
__device__ __forceinline__ void sum_chunks(const float* __restrict__ partial, i64 total,
                                           const int (&r)[U], const int (&c)[U], int NP,
                                           float4 (&sum)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) sum[u] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int s = 0; s < (int)gridDim.z; ++s) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = load_slice4(partial + s * total, r[u], c[u], NP);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            sum[u].x += v[u].x;
            sum[u].y += v[u].y;
            sum[u].z += v[u].z;
            sum[u].w += v[u].w;
        }
    }
}

// Split-K's end spread over the tile's CTAs (`spread`: a cooperative launch, so every CTA of
// the grid is resident and none waits on one that cannot run). Each CTA, after its slice's
// partial sums are stored, takes a ticket and waits until every slice of its tile has; then
// CTA z sums rows [z R, z R + R) of the tile (R = BM / gridDim.z rounded up) over the slices in
// slice order (the same bits as the last-CTA ending) and stores them to C. Where the last CTA
// read all BM x BN x slices partial sums itself (~1 MiB for 128 x 256 x 8: ~10 us at one SM's
// L2 bandwidth), each CTA reads 1 / slices of them. The counter counts to 2 x slices (a
// second ticket after the sums) and the CTA that takes the last one resets it to 0.
template <int BM, int BN, int THREADS>
__device__ __forceinline__ void splitk_spread(float* __restrict__ C,
                                              const float* __restrict__ Cin,
                                              const float* __restrict__ partial,
                                              unsigned* __restrict__ counters, int M, int N,
                                              i64 ldc, i64 ldcin, float alpha, float beta,
                                              int m0, int n0, bool pair_ok) {
    constexpr int CW = BN / 4, U = 2;  // float4 chunks per tile row; chunks per thread at once
    const unsigned slices = gridDim.z;
    unsigned* counter = counters + blockIdx.x;
    __threadfence();  // this thread's slice stores, before the ticket
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(counter, 1u);
        unsigned seen;
        do {
#if __CUDA_ARCH__ >= 700
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(counter)
                         : "memory");
#else
            seen = *reinterpret_cast<volatile unsigned*>(counter);
            __threadfence();
#endif
        } while (seen < slices);
    }
    __syncthreads();
    const int rows = (BM + (int)slices - 1) / (int)slices;
    const int r_first = m0 + (int)blockIdx.z * rows;
    const int r_stop = min(min(m0 + BM, M), r_first + rows);
    const int chunks = max(0, r_stop - r_first) * CW;
    const int NP = partial_pitch(N);
    const i64 total = (i64)M * NP;
    for (int e0 = threadIdx.x; e0 < chunks; e0 += U * THREADS) {
        int r[U], c[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int e = min(e0 + u * THREADS, chunks - 1);  // repeats past the end: not stored
            r[u] = r_first + e / CW;
            c[u] = n0 + 4 * (e % CW);
        }
        float4 sum[U];
        sum_chunks<U>(partial, total, r, c, NP, sum);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (e0 + u * THREADS >= chunks) continue;
            store_pair<DT_F32>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r[u], c[u],
                               sum[u].x, sum[u].y, pair_ok);
            store_pair<DT_F32>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r[u], c[u] + 2,
                               sum[u].z, sum[u].w, pair_ok);
        }
    }
    __syncthreads();  // every thread's loads done before the CTA's second ticket
    if (threadIdx.x == 0 && atomicAdd(counter, 1u) == 2 * slices - 1) *counter = 0;
}

// Split-K's end (gemm_simt_splitk): each thread stores the raw sums it holds (acc[i][j]: row
// r0 + i % 4 + 16 (i / 4), column c0 + j % 4 + 32 (j / 4)) to its K slice's partial[slice]
// (float4: rows of partial_pitch(N)), takes the tile's ticket, and in the tile's last CTA sums
// the same outputs over the slices and stores C with alpha, beta and Cin. The sums are
// splitk_finish's (slice order, from 0: the same bits), but where its loop loaded one pair of
// one slice at a time, each thread here loads ROWS rows x TN columns (the outputs it held) of
// two slices at once, 16 bytes wide (ROWS = 1 for 8 x 8 thread tiles: they keep to 128
// registers).
template <int BM, int BN, int TN, int THREADS>
__device__ __forceinline__ void splitk_end(const float (&acc)[8][TN], float* __restrict__ C,
                                           const float* __restrict__ Cin,
                                           float* __restrict__ partial,
                                           unsigned* __restrict__ counters, int M, int N,
                                           i64 ldc, i64 ldcin, float alpha, float beta, int r0,
                                           int c0, int m0, int n0, bool pair_ok, bool spread) {
    constexpr int ROWS = TN == 16 ? 2 : 1;
    const int NP = partial_pitch(N);
    const i64 total = (i64)M * NP;
    float* mine = partial + blockIdx.z * total;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = r0 + i % 4 + (i / 4) * 16;
#pragma unroll
        for (int q = 0; q < TN / 4; ++q) {
            const int c = c0 + 32 * q;
            if (r >= M || c >= N) continue;
            *reinterpret_cast<float4*>(mine + (i64)r * NP + c) = make_float4(
                acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]);
        }
    }
    if (spread) {
        splitk_spread<BM, BN, THREADS>(C, Cin, partial, counters, M, N, ldc, ldcin, alpha,
                                       beta, m0, n0, pair_ok);
        return;
    }
    if (!splitk_is_last(counters)) return;
#pragma unroll
    for (int i0 = 0; i0 < 8; i0 += ROWS) {
        int rows[ROWS];  // rows past the matrix read its last row (never stored)
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
            rows[i] = min(r0 + (i0 + i) % 4 + ((i0 + i) / 4) * 16, M - 1);
        float4 sum[ROWS][TN / 4];
        sum_slices<ROWS, TN>(partial, total, rows, c0, NP, sum);
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = r0 + (i0 + i) % 4 + ((i0 + i) / 4) * 16;
#pragma unroll
            for (int q = 0; q < TN / 4; ++q) {
                const int c = c0 + 32 * q;
                store_pair<DT_F32>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r, c,
                                   sum[i][q].x, sum[i][q].y, pair_ok);
                store_pair<DT_F32>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r, c + 2,
                                   sum[i][q].z, sum[i][q].w, pair_ok);
            }
        }
    }
}

}  // namespace simt

// Two kernels from the one text below: gemm_simt_splitk (this file included again, as
// "./gemm_simt.cu": NVRTC mishandles an include of the program's own name, with
// GEMM_SIMT_SPLIT 1), then gemm_simt (GEMM_SIMT_SPLIT 0). The split kernel's last CTA of each
// tile sums the K slices and stores C (splitk_finish in gemm_common.cu; `counters`: one zeroed
// ticket counter per tile, left zero). Not a __device__ body that both kernels call: inlining
// one changes the tuned gemm_simt's code (its PTX), which this way stays as it was.
#define GEMM_SIMT_SPLIT 1
#include "./gemm_simt.cu"
#undef GEMM_SIMT_SPLIT
#define GEMM_SIMT_SPLIT 0
#endif  // !defined(GEMM_SIMT_SPLIT)

template <int BM, int BN, int BK, int TN, int STAGES, bool A_K, bool B_K, bool VEC>
__global__ void __launch_bounds__((BM / 32) * (BN / (8 * TN)) * 32, TN == 8 ? 2 : 1)
#if GEMM_SIMT_SPLIT
gemm_simt_splitk(
#else
gemm_simt(
#endif
    const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
    const float* __restrict__ Cin, float* __restrict__ partial, int M, int N, int K, i64 lda,
    i64 ldb, i64 ldc, i64 ldcin, float alpha, float beta, int group_m, int pair_ok
#if GEMM_SIMT_SPLIT
    , unsigned* __restrict__ counters, int spread
#endif
    ) {
    using namespace simt;
    static_assert(TN == 8 || TN == 16, "a thread computes 8 x 8 or 8 x 16 outputs");
    static_assert(STAGES >= 2, "the ring needs two stages at least");
    constexpr int WN = 8 * TN;  // warp tile: 32 x WN
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / 32) * WARPS_N * 32;
    // The ring: STAGES x (A tile [BK][BM + PAD], B tile [BK][BN + PAD]).
    constexpr int A_TILE = BK * (BM + PAD) * 4, STAGE = A_TILE + BK * (BN + PAD) * 4;
    extern __shared__ __align__(16) float smem[];
    const u32 ring = smem_addr(smem);

    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    int tm, tn;
    grouped_tile(blockIdx.x, tiles_m, tiles_n, group_m, tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    int k_begin, k_end;
    split_range<BK>(K, k_begin, k_end);
    const int tiles = (k_end - k_begin + BK - 1) / BK;
    const int k_first = k_end - tiles * BK;  // the first tile is the partial one

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int am = (warp / WARPS_N) * 32 + (lane / 8) * 4;  // first A row, B column read
    const int bn = (warp % WARPS_N) * WN + (lane % 8) * 4;

    TileCopy<BM, BK, THREADS, A_K, VEC> a_copy(A, lda, m0, M, k_first, tid);
    TileCopy<BN, BK, THREADS, B_K, VEC> b_copy(B, ldb, n0, N, k_first, tid);
    if (tiles > 0) {
        a_copy.template copy<true>(ring, k_begin, A);
        b_copy.template copy<true>(ring + A_TILE, k_begin, B);
    }
    copy_commit();
#pragma unroll
    for (int s = 1; s < STAGES - 1; ++s) {
        if (s < tiles) {
            a_copy.template copy<false>(ring + s * STAGE, 0, A);
            b_copy.template copy<false>(ring + s * STAGE + A_TILE, 0, B);
        }
        copy_commit();
    }
    copy_wait<STAGES - 2>();
    __syncthreads();

    float acc[8][TN];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    float a[2][8], b[2][TN];  // fragments of k steps k (multiplied) and k + 1 (being read)
    u32 read = 0, write = (STAGES - 1) * STAGE;  // ring offsets of the tile multiplied/copied
    const u32 a_frag = ring + 4 * am, b_frag = ring + A_TILE + 4 * bn;
    auto load_fragments = [&](int n, int k) {
        load_shared(&a[n][0], a_frag + read + 4 * k * (BM + PAD));
        load_shared(&a[n][4], a_frag + read + 4 * (k * (BM + PAD) + 16));
#pragma unroll
        for (int q = 0; q < TN / 4; ++q)
            load_shared(&b[n][4 * q], b_frag + read + 4 * (k * (BN + PAD) + 32 * q));
    };
    load_fragments(0, 0);
    for (int t = 0; t < tiles; ++t) {
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            if (k == BK - 1) {  // copy tile t + STAGES - 1 into the stage tile t - 1 used
                if (t + STAGES - 1 < tiles) {
                    a_copy.template copy<false>(ring + write, 0, A);
                    b_copy.template copy<false>(ring + write + A_TILE, 0, B);
                }
                copy_commit();
                copy_wait<STAGES - 2>();  // tile t + 1 has landed ...
                __syncthreads();          // ... for every thread, and tile t - 1 is free
                write = read;
                read = read == (STAGES - 1) * STAGE ? 0 : read + STAGE;
            }
            load_fragments((k + 1) % 2, (k + 1) % BK);
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] = fmaf(a[k % 2][i], b[k % 2][j], acc[i][j]);
        }
    }

#if GEMM_SIMT_SPLIT
    splitk_end<BM, BN, TN, THREADS>(acc, C, Cin, partial, counters, M, N, ldc, ldcin, alpha,
                                    beta, m0 + am, n0 + bn, m0, n0, pair_ok != 0, spread != 0);
#else
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = m0 + am + (i % 4) + (i / 4) * 16;
#pragma unroll
        for (int j = 0; j < TN; j += 2) {
            const int c = n0 + bn + (j % 4) + (j / 4) * 32;
            store_pair<DT_F32>(C, Cin, partial, M, N, ldc, ldcin, alpha, beta, r, c, acc[i][j],
                               acc[i][j + 1], pair_ok != 0);
        }
    }
#endif
}
