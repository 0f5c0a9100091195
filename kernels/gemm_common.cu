// Shared pieces of the GEMM kernels (included by gemm_simt.cu, gemm_mma.cu, gemm_wgmma.cu).
//
// Problem: C[M,N] = alpha * A[M,K] @ B[K,N] + beta * Cin[M,N], fp32 accumulation.
// Every operand is a row/column-major view: element (i, j) of A lives at A + i*lda + j when A is
// K-major (A_K, row-major M x K) and at A + j*lda + i when it is M-major (column-major); B is
// K-major (B_K: B[k][n] at B + n*ldb + k) or N-major (B + k*ldb + n). C is always row-major
// (the host swaps the operands for a column-major output). 16-bit types travel as raw
// `unsigned short` bits and are converted with PTX, so no CUDA header has to be parsed.
#pragma once

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// Element type codes (template parameter DT): the same numbers as kernels/_gemm_tune.py.
// DT_TF32: fp32 data multiplied on the TF32 tensor cores.
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_TF32 3

template <int DT> struct Elem { typedef u16 T; };
template <> struct Elem<DT_F32> { typedef float T; };
template <> struct Elem<DT_TF32> { typedef float T; };

__host__ __device__ constexpr bool is_f32(int dt) { return dt == DT_F32 || dt == DT_TF32; }

#if __CUDA_ARCH__ >= 900
// A cluster barrier after which every thread of the cluster may read (ld.shared::cluster) what
// every thread wrote to its own CTA's shared memory before it: the release and acquire are
// restricted to shared memory, which on an H100 costs ~0.3 us where a barrier.cluster arrive
// with release semantics (which orders global memory too) costs ~0.9
// (benchmarks/cluster_cost_dev.py).
__device__ __forceinline__ void cluster_publish_shared() {
    asm volatile("fence.release.sync_restrict::shared::cta.cluster;\n"
                 "barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n"
                 "fence.acquire.sync_restrict::shared::cluster.cluster;\n" ::: "memory");
}
// Every thread of every CTA in the cluster (barrier.cluster with release / acquire). Also the
// last barrier before a CTA whose shared memory its peers read may exit: its arrive keeps
// release semantics there, since a relaxed one does not wait for this thread's own
// ld.shared::cluster loads to return (the compiler may place it before their values' uses),
// and a peer that passed its wait could exit while a load into it is in flight.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
                 ::: "memory");
}
#endif

__device__ __forceinline__ float bf16_to_f32(u16 v) { return __uint_as_float(((u32)v) << 16); }

__device__ __forceinline__ float f16_to_f32(u16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}

template <int DT> __device__ __forceinline__ float to_f32(typename Elem<DT>::T v);
template <> __device__ __forceinline__ float to_f32<DT_F32>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<DT_TF32>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<DT_F16>(u16 v) { return f16_to_f32(v); }
template <> __device__ __forceinline__ float to_f32<DT_BF16>(u16 v) { return bf16_to_f32(v); }

// Two floats -> two 16-bit values packed in 32 bits (lo in the low half), round to nearest.
template <int DT> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<DT_F16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ u32 pack2<DT_BF16>(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

template <int DT> __device__ __forceinline__ typename Elem<DT>::T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<DT_F32>(float v) { return v; }
template <> __device__ __forceinline__ float from_f32<DT_TF32>(float v) { return v; }
template <> __device__ __forceinline__ u16 from_f32<DT_F16>(float v) {
    return (u16)(pack2<DT_F16>(v, 0.f) & 0xffffu);
}
template <> __device__ __forceinline__ u16 from_f32<DT_BF16>(float v) {
    return (u16)(pack2<DT_BF16>(v, 0.f) & 0xffffu);
}

// The epilogue arguments every kernel takes. `partial` != nullptr means split-K: the kernel
// writes raw fp32 sums for its K slice to partial[slice][M][N], and the last CTA of each tile
// sums the slices and applies alpha/beta (splitk_finish; the wgmma kernel's own).
struct Epilogue {
    float alpha;
    float beta;
};

// out(r, c..c+1) = alpha * acc + beta * cin, for a pair of adjacent columns (c even or not).
// `pair_ok`: C's base and row pitch are even (in elements) and its base 4-byte aligned for
// 16-bit types (8 for fp32), so a pair at an even column is stored with one instruction.
template <int DT>
__device__ __forceinline__ void store_pair(typename Elem<DT>::T* __restrict__ C,
                                           const typename Elem<DT>::T* __restrict__ Cin,
                                           float* __restrict__ partial, int M, int N, i64 ldc,
                                           i64 ldcin, float alpha, float beta, int r, int c,
                                           float v0, float v1, bool pair_ok) {
    typedef typename Elem<DT>::T T;
    if (r >= M || c >= N) return;
    if (partial != nullptr) {
        // The slice of split blockIdx.z starts at an odd element when M * N is odd: the
        // pair is 8-byte aligned only where its whole index is even.
        const i64 at = (i64)blockIdx.z * M * N + (i64)r * N + c;
        float* p = partial + at;
        if (c + 1 < N && (at & 1) == 0) {
            *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
        } else {
            p[0] = v0;
            if (c + 1 < N) p[1] = v1;
        }
        return;
    }
    v0 *= alpha;
    v1 *= alpha;
    if (beta != 0.f) {
        const T* src = Cin + (i64)r * ldcin + c;
        v0 += beta * to_f32<DT>(src[0]);
        if (c + 1 < N) v1 += beta * to_f32<DT>(src[1]);
    }
    T* dst = C + (i64)r * ldc + c;
    if (c + 1 < N && pair_ok && (c & 1) == 0) {
        if constexpr (is_f32(DT)) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
            *reinterpret_cast<u32*>(dst) = pack2<DT>(v0, v1);
        }
    } else {
        dst[0] = from_f32<DT>(v0);
        if (c + 1 < N) dst[1] = from_f32<DT>(v1);
    }
}

// Split-K: v0[p], v1[p] = the sums over slices 0..splits-1 (in that order) of elements at[p]
// and at[p] + 1 of partial[slice][total], for NP pairs at once; count[p] is how many of the two
// are in C (0: none, 1: the first, 2: both). Read past L1 (other CTAs wrote them). The loads of
// SB slices of all NP pairs issue before the first of their adds, so a thread waits for one L2
// round trip per SB slices of NP pairs, not one per slice of each pair; the adds keep slice
// order, so the bits are those of a plain loop. A pair is one 8-byte load where it is 8-byte
// aligned in every slice (at[p] and total even), else two 4-byte loads.
template <int NP, int SB>
__device__ __forceinline__ void sum_partial_pairs(const float* __restrict__ partial, i64 total,
                                                  int splits, const i64 (&at)[NP],
                                                  const int (&count)[NP], float (&v0)[NP],
                                                  float (&v1)[NP]) {
#pragma unroll
    for (int p = 0; p < NP; ++p) v0[p] = v1[p] = 0.f;
    for (int first = 0; first < splits; first += SB) {
        float2 got[NP][SB];
#pragma unroll
        for (int p = 0; p < NP; ++p) {
#pragma unroll
            for (int b = 0; b < SB; ++b) {
                got[p][b] = make_float2(0.f, 0.f);
                if (first + b >= splits || count[p] == 0) continue;
                const float* q = partial + (i64)(first + b) * total + at[p];
                if (count[p] == 2 && ((at[p] | total) & 1) == 0) {
                    got[p][b] = __ldcg(reinterpret_cast<const float2*>(q));
                } else {
                    got[p][b].x = __ldcg(q);
                    if (count[p] == 2) got[p][b].y = __ldcg(q + 1);
                }
            }
        }
#pragma unroll
        for (int p = 0; p < NP; ++p) {
#pragma unroll
            for (int b = 0; b < SB; ++b) {
                if (first + b < splits) {
                    v0[p] += got[p][b].x;
                    v1[p] += got[p][b].y;
                }
            }
        }
    }
}

// Split-K's ticket: after the CTA stored its K slice (blockIdx.z of gridDim.z) of tile
// blockIdx.x, it takes a ticket on the tile's counter (after a fence, so its slice is visible
// first). True in every thread of the CTA that takes the last one, which resets the counter to
// 0. Every thread of the CTA must call it.
__device__ __forceinline__ bool splitk_is_last(unsigned* __restrict__ counters) {
    __threadfence();  // this thread's slice stores, before the ticket
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) {
        last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.z - 1;
        if (last) {
            counters[blockIdx.x] = 0;  // every slice has arrived: nothing else touches it
            __threadfence();
        }
    }
    return __syncthreads_or(last);
}

// Split-K in one launch for the kernels of one CTA per (tile, K slice) (mma; slice blockIdx.z
// of gridDim.z, tile blockIdx.x): after the CTA stored its slice of the BM x BN tile at (m0,
// n0), it takes a ticket (splitk_is_last); the CTA that takes the last one sums the tile's
// slices in slice order (sum_partial_pairs: the same bits every run) and stores C with alpha,
// beta and Cin. Every thread of the CTA must call it. No CTA waits on another.
template <int DT, int BM, int BN>
__device__ __forceinline__ void splitk_finish(typename Elem<DT>::T* __restrict__ C,
                                              const typename Elem<DT>::T* __restrict__ Cin,
                                              const float* __restrict__ partial,
                                              unsigned* __restrict__ counters, int M, int N,
                                              i64 ldc, i64 ldcin, float alpha, float beta,
                                              int m0, int n0, bool pair_ok) {
    if (!splitk_is_last(counters)) return;
    // Consecutive threads on consecutive pairs (coalesced), one pair per thread at a time with
    // 4 of its slices in flight: more pairs would raise the kernels' register counts and cut
    // their main loops' CTAs per SM (the TF32 64 x 64 mma kernel needs 64 registers).
    constexpr int NP = 1, PAIRS = BM * BN / 2;
    for (int e0 = threadIdx.x; e0 < PAIRS; e0 += NP * blockDim.x) {
        int r[NP], c[NP], count[NP];
        i64 at[NP];
        float v0[NP], v1[NP];
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            const int e = e0 + p * blockDim.x;
            r[p] = m0 + e / (BN / 2);
            c[p] = n0 + 2 * (e % (BN / 2));
            at[p] = (i64)r[p] * N + c[p];
            count[p] = e >= PAIRS || r[p] >= M || c[p] >= N ? 0 : (c[p] + 1 < N ? 2 : 1);
        }
        sum_partial_pairs<NP, 4>(partial, (i64)M * N, gridDim.z, at, count, v0, v1);
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            if (count[p] != 0)
                store_pair<DT>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r[p], c[p], v0[p],
                               v1[p], pair_ok);
        }
    }
}

// The K range [k_begin, k_end) of split `blockIdx.z` out of gridDim.z, in whole multiples of BK.
template <int BK>
__device__ __forceinline__ void split_range(int K, int& k_begin, int& k_end) {
    int tiles = (K + BK - 1) / BK;
    int per = (tiles + gridDim.z - 1) / gridDim.z;
    k_begin = min(K, (int)blockIdx.z * per * BK);
    k_end = min(K, k_begin + per * BK);
}

// The tile order of a flat grid: groups of GROUP_M tile rows swept column by column, so the
// CTAs running at one time share A rows and B columns in L2.
__device__ __forceinline__ void grouped_tile(int tile, int tiles_m, int tiles_n, int group_m,
                                             int& tm, int& tn) {
    int per_group = group_m * tiles_n;
    int group = tile / per_group;
    int first = group * group_m;
    int rows = min(tiles_m - first, group_m);
    int in_group = tile - group * per_group;
    tm = first + in_group % rows;
    tn = in_group / rows;
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
