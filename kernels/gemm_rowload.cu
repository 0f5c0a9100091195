// fp16/bf16 and fp32 GEMM for a few rows of A times a B streamed once, whose rows need not be
// 16-byte aligned (issue 17: 1 x 4099 x 4099, B = K x N with 8198-byte rows).
//
// C[M,N] = alpha * A[M,K] @ B[K,N] + beta * Cin, B N-major (B[k][n] at B + k*ldb + n), any
// pitch and any 2-byte-aligned base; A in either layout (it is small: staged in shared memory
// as fp32). B is streamed once with 16-byte aligned loads covering each row's span: lane l of
// a warp loads the aligned 16 bytes that hold column c = n0 + 8 l (they start s elements
// before it: s = the row's misalignment), takes the next lane's 16 bytes with a shuffle and
// funnel-shifts the 32 bytes down by s elements, so it holds columns c..c+7 of row k in
// registers; lane 31's load only feeds lane 30, so a warp's 32 loads give 248 columns. s
// depends on the row only through k mod 8 (8 rows are 16*ldb bytes apart), so warp w of the
// CTA's 8 takes rows k = w (mod 8): its s is one value, a template argument of its loop (the
// shifts are then constant: 4 funnel shifts a chunk).
// Bytes outside the row are loaded only within an aligned 16-byte block that holds one of the
// row's elements, and feed only columns >= N, which are never stored.
//
// A CTA (8 warps) takes MT rows of A, BN = 248 * SLOTS columns and a K slice (blockIdx.z of
// gridDim.z); each lane accumulates MT x 8 x SLOTS fp32 sums with R rows' loads in flight,
// the 8 warps' sums are added in warp order through shared memory, and a split K ends like
// the mma kernels' (gemm_common.cu's splitk_finish: the last CTA of a tile adds the slices in
// slice order): deterministic, one launch. Same arguments as gemm_mma / gemm_mma_splitk.
#include "gemm_common.cu"

namespace rowload {

constexpr int WARPS = 8;             // one per residue of k mod 8
constexpr int STAGE_FLOATS = 8192;   // A's fp32 values staged at a time (32 KiB)

// A 16-byte load's elements (EPC) and a warp load's columns (31 lanes' outputs) of type DT.
template <int DT>
struct Lanes {
    typedef typename Elem<DT>::T E;
    static constexpr int EPC = 16 / (int)sizeof(E);
    static constexpr int COLS = 31 * EPC;
};

__device__ __forceinline__ void load16(u32 (&w)[4], const void* p) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
}

// Elements S..S+7 of the 16 held in x (0..7) and y (8..15), as 4 words.
template <int S>
__device__ __forceinline__ void realign(u32 (&o)[4], const u32 (&x)[4], const u32 (&y)[4]) {
    const u32 seq[8] = {x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]};
    constexpr int Q = S / 2;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (S % 2 == 0) {
            o[i] = seq[Q + i];
        } else {
            o[i] = __funnelshift_r(seq[Q + i], seq[Q + i + 1], 16);
        }
    }
}

// fp32: elements S..S+3 of the 8 held in x (0..3) and y (4..7).
template <int S>
__device__ __forceinline__ void realign32(u32 (&o)[4], const u32 (&x)[4], const u32 (&y)[4]) {
    const u32 seq[8] = {x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]};
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = seq[S + i];
}

template <int DT>
__device__ __forceinline__ void unpack8(float (&v)[Lanes<DT>::EPC], const u32 (&w)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (is_f32(DT)) {
            v[i] = __uint_as_float(w[i]);
        } else if constexpr (DT == DT_BF16) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            v[2 * i] = f16_to_f32((u16)(w[i] & 0xffffu));
            v[2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
        }
    }
}

// The EPC elements of this lane from its loaded 16 bytes x (misalignment S: the next lane's
// bytes by shuffle; lane 31's are not used), zero from k1 on where `tail` (the elements are k,
// k + 1, ...).
template <int DT, int S>
__device__ __forceinline__ void w_lane(float (&v)[Lanes<DT>::EPC], const u32 (&x)[4], bool tail,
                                       int k, int k1) {
    u32 w[4];
    if constexpr (S == 0) {
        realign<0>(w, x, x);
    } else {
        u32 y[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) y[q] = __shfl_down_sync(0xffffffffu, x[q], 1);
        if constexpr (is_f32(DT)) {
            realign32<S>(w, x, y);
        } else {
            realign<S>(w, x, y);
        }
    }
    unpack8<DT>(v, w);
    if (tail) {  // W's elements past the slice (or the row) may be anything
#pragma unroll
        for (int e = 0; e < Lanes<DT>::EPC; ++e) v[e] = k + e < k1 ? v[e] : 0.f;
    }
}

// One warp's rows k = first, first + 8, ... < end (all with misalignment S) times the staged
// A (As[(k - staged) * MT + m]), added into acc[m][EPC j + e] (column c + COLS j + e).
template <int DT, int MT, int SLOTS, int R, int S>
__device__ __forceinline__ void rows(float (&acc)[MT][Lanes<DT>::EPC * SLOTS],
                                     const typename Elem<DT>::T* __restrict__ B, i64 ldb, int N,
                                     int c, const float* As, int staged, int first, int end,
                                     int lane) {
    typedef Lanes<DT> L;
    for (int k0 = first; k0 < end; k0 += WARPS * R) {
        u32 x[R][SLOTS][4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int k = k0 + WARPS * r;
            const auto* row = B + (i64)k * ldb + c - S;  // 16-byte aligned
#pragma unroll
            for (int j = 0; j < SLOTS; ++j) {
                x[r][j][0] = x[r][j][1] = x[r][j][2] = x[r][j][3] = 0u;
                if (k < end && c + L::COLS * j - S < N) load16(x[r][j], row + L::COLS * j);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int k = k0 + WARPS * r;
            float a[MT];
#pragma unroll
            for (int m = 0; m < MT; ++m) a[m] = k < end ? As[(k - staged) * MT + m] : 0.f;
#pragma unroll
            for (int j = 0; j < SLOTS; ++j) {
                float v[L::EPC];
                w_lane<DT, S>(v, x[r][j], false, 0, 0);
                if (k >= end) continue;  // zero loads; A's value is not staged
#pragma unroll
                for (int m = 0; m < MT; ++m) {
#pragma unroll
                    for (int e = 0; e < L::EPC; ++e)
                        acc[m][L::EPC * j + e] = fmaf(a[m], v[e], acc[m][L::EPC * j + e]);
                }
            }
        }
    }
}

template <int DT, int MT, int SLOTS, int R>
__device__ __forceinline__ void rows_shifted(int s, float (&acc)[MT][Lanes<DT>::EPC * SLOTS],
                                             const typename Elem<DT>::T* __restrict__ B,
                                             i64 ldb, int N, int c, const float* As, int staged,
                                             int first, int end, int lane) {
#define ROWLOAD_ROWS(S) rows<DT, MT, SLOTS, R, S>(acc, B, ldb, N, c, As, staged, first, end, lane)
    if constexpr (is_f32(DT)) {  // 4 elements a load: 4 shifts
        switch (s) {
            case 0: ROWLOAD_ROWS(0); break;
            case 1: ROWLOAD_ROWS(1); break;
            case 2: ROWLOAD_ROWS(2); break;
            default: ROWLOAD_ROWS(3); break;
        }
    } else {
        switch (s) {
            case 0: ROWLOAD_ROWS(0); break;
            case 1: ROWLOAD_ROWS(1); break;
            case 2: ROWLOAD_ROWS(2); break;
            case 3: ROWLOAD_ROWS(3); break;
            case 4: ROWLOAD_ROWS(4); break;
            case 5: ROWLOAD_ROWS(5); break;
            case 6: ROWLOAD_ROWS(6); break;
            default: ROWLOAD_ROWS(7); break;
        }
    }
#undef ROWLOAD_ROWS
}

// As[(k - k0) * MT + m] = A(m0 + m, k) for k in [k0, k1), zero for rows past M.
template <int DT, int MT, bool A_K>
__device__ __forceinline__ void stage_a(float* As, const typename Elem<DT>::T* __restrict__ A,
                                        i64 lda, int M, int m0, int k0, int k1) {
    const int len = k1 - k0;
    for (int e = threadIdx.x; e < len * MT; e += blockDim.x) {
        // consecutive threads on A's contiguous dimension
        const int m = A_K ? e / len : e % MT, kk = A_K ? e % len : e / MT;
        const int row = m0 + m, k = k0 + kk;
        float v = 0.f;
        if (row < M) v = to_f32<DT>(A_K ? A[(i64)row * lda + k] : A[(i64)k * lda + row]);
        As[kk * MT + m] = v;
    }
}

// A, B, C and Cin hold fp32 for DT_F32 (typed u16* so the 16-bit kernels keep their symbols).
template <int DT, int MT, int SLOTS, int R, bool A_K>
__device__ __forceinline__ void run(const u16* __restrict__ A_, const u16* __restrict__ B_,
                                    u16* __restrict__ C_, const u16* __restrict__ Cin_,
                                    float* __restrict__ partial, int M, int N, int K, i64 lda,
                                    i64 ldb, i64 ldc, i64 ldcin, float alpha, float beta,
                                    int pair_ok, unsigned* __restrict__ counters) {
    typedef Lanes<DT> L;
    typedef typename L::E E;
    const E* __restrict__ A = reinterpret_cast<const E*>(A_);
    const E* __restrict__ B = reinterpret_cast<const E*>(B_);
    E* __restrict__ C = reinterpret_cast<E*>(C_);
    const E* __restrict__ Cin = reinterpret_cast<const E*>(Cin_);
    constexpr int BN = L::COLS * SLOTS;
    constexpr int STAGE_K = STAGE_FLOATS / MT;  // a multiple of 8
    static_assert(WARPS * BN <= STAGE_FLOATS, "the warps' sums reuse A's staging");
    __shared__ __align__(16) float smem[STAGE_FLOATS];
    const int tiles_n = (N + BN - 1) / BN;
    const int m0 = (blockIdx.x / tiles_n) * MT, n0 = (blockIdx.x % tiles_n) * BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int k_begin, k_end;
    split_range<8>(K, k_begin, k_end);

    float acc[MT][L::EPC * SLOTS];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int e = 0; e < L::EPC * SLOTS; ++e) acc[m][e] = 0.f;
    }
    const int c = n0 + L::EPC * lane;
    for (int k0 = k_begin; k0 < k_end; k0 += STAGE_K) {  // k0 - k_begin: a multiple of 8
        const int k1 = min(k_end, k0 + STAGE_K);
        __syncthreads();  // the last stage's readers are done
        stage_a<DT, MT, A_K>(smem, A, lda, M, m0, k0, k1);
        __syncthreads();
        // the misalignment (elements) of column n0 in rows k0 + warp + 8 i
        const unsigned long long at =
            reinterpret_cast<unsigned long long>(B + (i64)(k0 + warp) * ldb + n0);
        const int s = (int)(at % 16) / (int)sizeof(E);
        rows_shifted<DT, MT, SLOTS, R>(s, acc, B, ldb, N, c, smem, k0, k0 + warp, k1, lane);
    }

    // the 8 warps' sums, added in warp order, one row of A at a time
    float* sums = smem;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m0 + m >= M) break;  // the same in every thread
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SLOTS; ++j) {
            if (lane == 31) break;
            float4* to =
                reinterpret_cast<float4*>(sums + warp * BN + L::COLS * j + L::EPC * lane);
            const float* v = acc[m] + L::EPC * j;
#pragma unroll
            for (int q = 0; q < L::EPC / 4; ++q)
                to[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        }
        __syncthreads();
        for (int p = threadIdx.x; p < BN / 2; p += blockDim.x) {
            float v0 = 0.f, v1 = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                v0 += sums[w * BN + 2 * p];
                v1 += sums[w * BN + 2 * p + 1];
            }
            store_pair<DT>(C, Cin, partial, M, N, ldc, ldcin, alpha, beta, m0 + m, n0 + 2 * p,
                           v0, v1, pair_ok != 0);
        }
    }
    if (counters != nullptr)
        splitk_finish<DT, MT, BN>(C, Cin, partial, counters, M, N, ldc, ldcin, alpha, beta, m0,
                                  n0, pair_ok != 0);
}


// ---- a K-major B (B^T = W, N x K: the weight of x @ W.T): dot products along W's rows ----------
//
// A CTA takes MT (<= 4, or 8 for fp32) rows of A, 8 RW rows of W and a K slice; warp w takes rows
// n0 + w + 8 i (i < RW: all of them in flight), whose misalignment is one value, and steps
// along K by SLOTS warp loads a row: lane l holds W(n, k..k+7) for k = kc + 8 l + COLS j
// (fp32: k..k+3, kc + 4 l + COLS j) and the matching A(m, k..) from shared memory, and keeps
// one fp32 sum per (m, row). On rows that need realigning (as above) lane 31 only feeds lane
// 30 (COLS = 31 elements a lane); on 16-byte aligned rows every lane's load is its own (COLS =
// 32 a lane: no byte is read twice, and the slices split K in whole 512-byte steps). At the
// end each warp adds its lanes' sums (a fixed shuffle tree), so no sum crosses warps. Past 4
// rows of A a lane takes its W values of every row first and then A's a row at a time (4
// registers of A, not MT x 4).

// The columns one warp load covers: 32 lanes' elements on aligned rows, else 31.
template <int DT, bool FULL>
__host__ __device__ constexpr int nk_cols() {
    return (FULL ? 32 : 31) * Lanes<DT>::EPC;
}

// A(m, k..k+EPC-1) of this lane from the staged row at `from` (zero where `in` is false: k
// past the slice; A is staged as zeros up to a multiple of 8 past it).
template <int EPC>
__device__ __forceinline__ void a_lane(float (&a)[EPC], const float* from, bool in) {
    const float4* f4 = reinterpret_cast<const float4*>(from);
#pragma unroll
    for (int q = 0; q < EPC / 4; ++q) {
        const float4 f = in ? f4[q] : make_float4(0.f, 0.f, 0.f, 0.f);
        a[4 * q] = f.x; a[4 * q + 1] = f.y; a[4 * q + 2] = f.z; a[4 * q + 3] = f.w;
    }
}

template <int DT, int MT, int SLOTS, int RW, int S, bool FULL>
__device__ __forceinline__ void dots(float (&acc)[MT][RW],
                                     const typename Elem<DT>::T* __restrict__ W, i64 ldw, int N,
                                     int K, int n_first, const float* As, int stride,
                                     int staged, int k0, int k1, int lane) {
    constexpr int EPC = Lanes<DT>::EPC, COLS = nk_cols<DT, FULL>(), KW = COLS * SLOTS;
    for (int kc = k0; kc < k1; kc += KW) {
        u32 x[RW][SLOTS][4];
#pragma unroll
        for (int i = 0; i < RW; ++i) {
            const int n = n_first + 8 * i;
            const auto* row = W + (i64)n * ldw + kc + EPC * lane - S;  // 16-byte aligned
#pragma unroll
            for (int j = 0; j < SLOTS; ++j) {
                x[i][j][0] = x[i][j][1] = x[i][j][2] = x[i][j][3] = 0u;
                if (n < N && kc + EPC * lane + COLS * j - S < K)
                    load16(x[i][j], row + COLS * j);
            }
        }
        if constexpr (MT <= 4) {
            float a[MT][SLOTS][EPC];  // every row of A's values first
#pragma unroll
            for (int j = 0; j < SLOTS; ++j) {
                const int k = kc + EPC * lane + COLS * j;
#pragma unroll
                for (int m = 0; m < MT; ++m)
                    a_lane<EPC>(a[m][j], As + m * stride + k - staged, k < k1);
            }
            const bool tail = kc + KW > k1;  // the same in every lane
#pragma unroll
            for (int i = 0; i < RW; ++i) {
#pragma unroll
                for (int j = 0; j < SLOTS; ++j) {
                    float v[EPC];
                    w_lane<DT, S>(v, x[i][j], tail, kc + EPC * lane + COLS * j, k1);
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
#pragma unroll
                        for (int e = 0; e < EPC; ++e) acc[m][i] = fmaf(a[m][j][e], v[e], acc[m][i]);
                    }
                }
            }
        } else {  // 8 rows of A (fp32): every row of W's values first, then A a row at a time
            const bool tail = kc + KW > k1;
            float v[RW][SLOTS][EPC];
#pragma unroll
            for (int i = 0; i < RW; ++i) {
#pragma unroll
                for (int j = 0; j < SLOTS; ++j)
                    w_lane<DT, S>(v[i][j], x[i][j], tail, kc + EPC * lane + COLS * j, k1);
            }
#pragma unroll
            for (int j = 0; j < SLOTS; ++j) {
                const int k = kc + EPC * lane + COLS * j;
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    float a[EPC];
                    a_lane<EPC>(a, As + m * stride + k - staged, k < k1);
#pragma unroll
                    for (int i = 0; i < RW; ++i) {
#pragma unroll
                        for (int e = 0; e < EPC; ++e)
                            acc[m][i] = fmaf(a[e], v[i][j][e], acc[m][i]);
                    }
                }
            }
        }
    }
}

template <int DT, int MT, int SLOTS, int RW, bool FULL>
__device__ __forceinline__ void dots_shifted(int s, float (&acc)[MT][RW],
                                             const typename Elem<DT>::T* __restrict__ W,
                                             i64 ldw, int N, int K, int n_first, const float* As,
                                             int stride, int staged, int k0, int k1, int lane) {
#define ROWLOAD_DOTS(S) \
        case S: dots<DT, MT, SLOTS, RW, S, false>(acc, W, ldw, N, K, n_first, As, stride, \
                                                  staged, k0, k1, lane); break;
    if constexpr (FULL) {  // every row starts 16-byte aligned
        dots<DT, MT, SLOTS, RW, 0, true>(acc, W, ldw, N, K, n_first, As, stride, staged, k0, k1,
                                         lane);
    } else if constexpr (is_f32(DT)) {  // 4 misalignments of 4-byte elements
        switch (s) {
            ROWLOAD_DOTS(0) ROWLOAD_DOTS(1) ROWLOAD_DOTS(2)
            default: dots<DT, MT, SLOTS, RW, 3, false>(acc, W, ldw, N, K, n_first, As, stride,
                                                       staged, k0, k1, lane); break;
        }
    } else {
        switch (s) {
            ROWLOAD_DOTS(0) ROWLOAD_DOTS(1) ROWLOAD_DOTS(2) ROWLOAD_DOTS(3)
            ROWLOAD_DOTS(4) ROWLOAD_DOTS(5) ROWLOAD_DOTS(6)
            default: dots<DT, MT, SLOTS, RW, 7, false>(acc, W, ldw, N, K, n_first, As, stride,
                                                       staged, k0, k1, lane); break;
        }
    }
#undef ROWLOAD_DOTS
}

// As[m * stride + (k - k0)] = A(m0 + m, k) for k in [k0, k1), zero up to k0 + stride and for
// rows past M.
template <int DT, int MT, bool A_K>
__device__ __forceinline__ void stage_a_rows(float* As, int stride,
                                             const typename Elem<DT>::T* __restrict__ A,
                                             i64 lda, int M, int m0, int k0, int k1) {
    for (int e = threadIdx.x; e < stride * MT; e += blockDim.x) {
        const int m = A_K ? e / stride : e % MT, kk = A_K ? e % stride : e / MT;
        const int row = m0 + m, k = k0 + kk;
        float v = 0.f;
        if (row < M && k < k1)
            v = to_f32<DT>(A_K ? A[(i64)row * lda + k] : A[(i64)k * lda + row]);
        As[m * stride + kk] = v;
    }
}

// FULL: W's base and row pitch are 16-byte multiples (each path keeps its sizes constant).
// smem: STAGE_FLOATS floats.
template <int DT, int MT, int SLOTS, int RW, bool A_K, bool FULL>
__device__ __forceinline__ void run_nk(float* smem, const u16* __restrict__ A_,
                                       const u16* __restrict__ W_,
                                       u16* __restrict__ C_, const u16* __restrict__ Cin_,
                                       float* __restrict__ partial, int M, int N, int K,
                                       i64 lda, i64 ldw, i64 ldc, i64 ldcin, float alpha,
                                       float beta, int pair_ok, unsigned* __restrict__ counters) {
    typedef typename Elem<DT>::T E;
    const E* __restrict__ A = reinterpret_cast<const E*>(A_);
    const E* __restrict__ W = reinterpret_cast<const E*>(W_);
    E* __restrict__ C = reinterpret_cast<E*>(C_);
    const E* __restrict__ Cin = reinterpret_cast<const E*>(Cin_);
    constexpr int NK_ROWS = 8 * RW;  // rows of W per CTA: RW per warp
    constexpr int KW = nk_cols<DT, FULL>() * SLOTS;
    constexpr int STRIDE = (STAGE_FLOATS / MT - 8) / KW * KW + 8;  // k staged per row, padded
    constexpr int STAGE_K = STRIDE - 8;
    static_assert(STAGE_K >= KW && MT * STRIDE <= STAGE_FLOATS, "A's staging");
    const int tiles_n = (N + NK_ROWS - 1) / NK_ROWS;
    const int m0 = (blockIdx.x / tiles_n) * MT, n0 = (blockIdx.x % tiles_n) * NK_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int k_begin, k_end;
    split_range<KW>(K, k_begin, k_end);  // whole steps of KW

    float acc[MT][RW];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int i = 0; i < RW; ++i) acc[m][i] = 0.f;
    }
    // rows n0 + warp + 8 i all start at the same misalignment (8 rows: 16 * ldw bytes)
    const unsigned long long at =
        reinterpret_cast<unsigned long long>(W + (i64)(n0 + warp) * ldw + k_begin);
    const int s = (int)(at % 16) / (int)sizeof(E);
    for (int k0 = k_begin; k0 < k_end; k0 += STAGE_K) {
        const int k1 = min(k_end, k0 + STAGE_K);
        __syncthreads();
        stage_a_rows<DT, MT, A_K>(smem, STRIDE, A, lda, M, m0, k0, k1);
        __syncthreads();
        dots_shifted<DT, MT, SLOTS, RW, FULL>(s, acc, W, ldw, N, K, n0 + warp, smem, STRIDE, k0,
                                              k0, k1, lane);
    }
    // each warp's lanes (0..30 where rows are realigned), added in a fixed tree; C's tile
    // [MT][NK_ROWS] in shared memory
    __syncthreads();
    float* tile = smem;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int i = 0; i < RW; ++i) {
            float v = lane == 31 && !FULL ? 0.f : acc[m][i];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) tile[m * NK_ROWS + warp + 8 * i] = v;
        }
    }
    __syncthreads();
    for (int p = threadIdx.x; p < MT * NK_ROWS / 2; p += blockDim.x) {
        const int m = p / (NK_ROWS / 2), c = 2 * (p % (NK_ROWS / 2));
        if (m0 + m < M)
            store_pair<DT>(C, Cin, partial, M, N, ldc, ldcin, alpha, beta, m0 + m, n0 + c,
                           tile[m * NK_ROWS + c], tile[m * NK_ROWS + c + 1], pair_ok != 0);
    }
    if (counters != nullptr)
        splitk_finish<DT, MT, NK_ROWS>(C, Cin, partial, counters, M, N, ldc, ldcin, alpha, beta,
                                       m0, n0, pair_ok != 0);
}

// run_nk on 16-byte aligned rows of W (every lane's load its own, K split in whole steps of
// 32 lanes' loads) or on any others.
template <int DT, int MT, int SLOTS, int RW, bool A_K>
__device__ __forceinline__ void run_nk_any(const u16* __restrict__ A, const u16* __restrict__ W,
                                           u16* __restrict__ C, const u16* __restrict__ Cin,
                                           float* __restrict__ partial, int M, int N, int K,
                                           i64 lda, i64 ldw, i64 ldc, i64 ldcin, float alpha,
                                           float beta, int pair_ok,
                                           unsigned* __restrict__ counters) {
    constexpr int EPC = Lanes<DT>::EPC;
    __shared__ __align__(16) float smem[STAGE_FLOATS];
    if (reinterpret_cast<unsigned long long>(W) % 16 == 0 && ldw % EPC == 0) {
        run_nk<DT, MT, SLOTS, RW, A_K, true>(smem, A, W, C, Cin, partial, M, N, K, lda, ldw,
                                             ldc, ldcin, alpha, beta, pair_ok, counters);
    } else {
        run_nk<DT, MT, SLOTS, RW, A_K, false>(smem, A, W, C, Cin, partial, M, N, K, lda, ldw,
                                              ldc, ldcin, alpha, beta, pair_ok, counters);
    }
}

}  // namespace rowload

// MT rows of A x 248 * SLOTS columns per CTA of 256 threads, R rows per warp in flight.
template <int DT, int MT, int SLOTS, int R, bool A_K>
__global__ void __launch_bounds__(256, MT >= 16 ? 1 : 2)
gemm_rowload(const u16* __restrict__ A, const u16* __restrict__ B, u16* __restrict__ C,
             const u16* __restrict__ Cin, float* __restrict__ partial, int M, int N, int K,
             i64 lda, i64 ldb, i64 ldc, i64 ldcin, float alpha, float beta, int group_m,
             int pair_ok) {
    rowload::run<DT, MT, SLOTS, R, A_K>(A, B, C, Cin, nullptr, M, N, K, lda, ldb, ldc, ldcin,
                                        alpha, beta, pair_ok, nullptr);
}

// The same with K split over gridDim.z (fp32 slices in `partial`, one counter per tile).
template <int DT, int MT, int SLOTS, int R, bool A_K>
__global__ void __launch_bounds__(256, MT >= 16 ? 1 : 2)
gemm_rowload_splitk(const u16* __restrict__ A, const u16* __restrict__ B, u16* __restrict__ C,
                    const u16* __restrict__ Cin, float* __restrict__ partial, int M, int N,
                    int K, i64 lda, i64 ldb, i64 ldc, i64 ldcin, float alpha, float beta,
                    int group_m, int pair_ok, unsigned* __restrict__ counters) {
    rowload::run<DT, MT, SLOTS, R, A_K>(A, B, C, Cin, partial, M, N, K, lda, ldb, ldc, ldcin,
                                        alpha, beta, pair_ok, counters);
}

// MT (<= 4; fp32 also 8) rows of A x 8 RW rows of a K-major B (W = B^T) per CTA, SLOTS warp
// loads of 248 k a row a step (fp32: 124; 256 and 128 on 16-byte aligned rows).
template <int DT, int MT, int SLOTS, int RW, bool A_K>
__global__ void __launch_bounds__(256, 2)
gemm_rowload_nk(const u16* __restrict__ A, const u16* __restrict__ B, u16* __restrict__ C,
                const u16* __restrict__ Cin, float* __restrict__ partial, int M, int N, int K,
                i64 lda, i64 ldb, i64 ldc, i64 ldcin, float alpha, float beta, int group_m,
                int pair_ok) {
    rowload::run_nk_any<DT, MT, SLOTS, RW, A_K>(A, B, C, Cin, nullptr, M, N, K, lda, ldb, ldc,
                                                ldcin, alpha, beta, pair_ok, nullptr);
}

template <int DT, int MT, int SLOTS, int RW, bool A_K>
__global__ void __launch_bounds__(256, 2)
gemm_rowload_nk_splitk(const u16* __restrict__ A, const u16* __restrict__ B,
                       u16* __restrict__ C, const u16* __restrict__ Cin,
                       float* __restrict__ partial, int M, int N, int K, i64 lda, i64 ldb,
                       i64 ldc, i64 ldcin, float alpha, float beta, int group_m, int pair_ok,
                       unsigned* __restrict__ counters) {
    rowload::run_nk_any<DT, MT, SLOTS, RW, A_K>(A, B, C, Cin, partial, M, N, K, lda, ldb, ldc,
                                                ldcin, alpha, beta, pair_ok, counters);
}
