// fp16/bf16 GEMM for skinny problems (decode shapes: a few rows of activations times a weight).
//
// One operand is small (`S`, n_small x K: at most a few dozen rows) and the other big (`G`,
// n_big x K); the kernel computes C(i, j) = alpha * sum_k S(i, k) G(j, k) + beta * Cin(i, j) for
// i < n_small, j < n_big, reading G from device memory once, streamed with 16-byte loads
// straight into registers (no shared-memory staging), and multiplying on the tensor cores:
// G takes the 16-row side of mma.m16n8k16, S the 8-wide side (padded with zeros), so one
// token costs the same loads as 8.
//
// The k order inside a 32-k chunk is free as long as both operands use the same one: thread
// (g = lane / 4, t = lane % 4) owns k = 8t..8t+7 of the chunk, which an m16n8k16 step s (0, 1)
// sees as logical k {2t, 2t+1} = physical 8t+4s+{0,1} and {2t+8, 2t+9} = 8t+4s+{2,3}. Then a
// K-major operand gives each thread 16 contiguous bytes per row and chunk: fragments without
// shuffles. An N-major G (k rows, n contiguous) is loaded as 8 k rows x 8 n (16 bytes each)
// per thread and its (k, k+1) pairs are put together with byte permutes. A warp's chunk covers
// 64 rows of G (four 16-row mma tiles) and BM columns of S; the CTA's WARPS warps take its K
// chunks in turn, a cluster of CS CTAs splits K further, and the partial sums are added in a
// fixed order (deterministic) through shared memory and then distributed shared memory
// (sm_90 clusters) by the CTAs of the cluster, each finishing a slice of the 64 x BM tile.
//
// C's element (i, j) is at C + i * c_small + j * c_big (the host picks the strides: C
// row-major with S = A, or C^T when the big operand is A). Layouts and types: gemm_common.cu.
#include "gemm_common.cu"

namespace skinny {

constexpr int CHUNK = 32;  // k per warp step: two m16n8k16 steps
constexpr int BN = 64;     // rows of G per CTA
constexpr int RS = BN + 4; // floats per row of a partial-sum tile: conflict-free stores

// The 8 elements p[0..8) as 4 words (element 2i in the low half of word i), zero past `valid`.
// One 16-byte load when VEC (p is 16-byte aligned) and all 8 are there; STREAM: a read-once
// operand (no L1 allocation).
template <bool VEC, bool STREAM>
__device__ __forceinline__ void load8(u32 (&w)[4], const u16* p, int valid) {
    if (VEC && valid >= 8) {
        if (STREAM) {
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
        } else {
            asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 lo = 2 * i < valid ? p[2 * i] : 0u;
        const u32 hi = 2 * i + 1 < valid ? p[2 * i + 1] : 0u;
        w[i] = lo | (hi << 16);
    }
}

// 8 elements p[0], p[stride], ... (an operand whose k is not contiguous), zero past `valid`.
__device__ __forceinline__ void load8_strided(u32 (&w)[4], const u16* p, i64 stride, int valid) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 lo = 2 * i < valid ? p[2 * i * stride] : 0u;
        const u32 hi = 2 * i + 1 < valid ? p[(2 * i + 1) * stride] : 0u;
        w[i] = lo | (hi << 16);
    }
}

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

template <int DT>
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (DT == DT_BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Row r (0..63) of a warp's mma tiles (16 j + g + 8 h: tile j, fragment row g or g + 8) is
// this row of the CTA's 64 rows of G: itself when G is K-major; 8 g + 2 j + h when N-major.
template <bool G_K>
__device__ __forceinline__ int g_row(int r) {
    if (G_K) return r;
    const int j = r / 16, g = r % 8, h = (r % 16) / 8;
    return 8 * g + 2 * j + h;
}

// One warp's operands for one chunk: G as 8 x 4 words (K-major: rows 16 j + g + 8 h, index
// 2 j + h; N-major: k rows 8t + r, index r), S as MT x 4 words (rows 8 mt + g).
template <int MT>
struct Frags {
    u32 g[8][4];
    u32 s[MT][4];
};

template <int MT, bool G_K, bool S_K, bool VEC>
__device__ __forceinline__ void load_chunk(Frags<MT>& f, const u16* __restrict__ G,
                                           const u16* __restrict__ S, i64 ldg, i64 lds, int K,
                                           int n0, int n_big, int m0, int n_small, int chunk,
                                           int lane) {
    const int g = lane / 4, t = lane % 4;
    const int k = chunk * CHUNK + 8 * t;
    const int valid_k = min(8, K - k);  // may be <= 0 in the last chunk
    if (G_K) {  // rows n0 + g + 8i (= 16 j + g + 8 h for i = 2 j + h)
        const u16* row0 = G + (i64)(n0 + g) * ldg + k;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (n0 + g + 8 * i < n_big) {
                load8<VEC, true>(f.g[i], row0 + (i64)(8 * i) * ldg, valid_k);
            } else {
                f.g[i][0] = f.g[i][1] = f.g[i][2] = f.g[i][3] = 0u;
            }
        }
    } else {
        const int col = n0 + 8 * g;
        const int valid_n = min(8, n_big - col);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (i < valid_k) {
                load8<VEC, true>(f.g[i], G + (i64)(k + i) * ldg + col, valid_n);
            } else {
                f.g[i][0] = f.g[i][1] = f.g[i][2] = f.g[i][3] = 0u;
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int row = m0 + 8 * mt + g;
        if (row < n_small && valid_k > 0) {
            if (S_K) {
                load8<VEC, false>(f.s[mt], S + (i64)row * lds + k, valid_k);
            } else {
                load8_strided(f.s[mt], S + (i64)k * lds + row, lds, valid_k);
            }
        } else {
            f.s[mt][0] = f.s[mt][1] = f.s[mt][2] = f.s[mt][3] = 0u;
        }
    }
}

template <int DT, int MT, bool G_K>
__device__ __forceinline__ void multiply_chunk(float (&acc)[4][MT][4], const Frags<MT>& f) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 a[4];
            if (G_K) {
                a[0] = f.g[2 * j][2 * s];
                a[1] = f.g[2 * j + 1][2 * s];
                a[2] = f.g[2 * j][2 * s + 1];
                a[3] = f.g[2 * j + 1][2 * s + 1];
            } else {  // word j of k rows 4s..4s+3 holds columns 8g + 2j, +1
                const u32 x0 = f.g[4 * s][j], x1 = f.g[4 * s + 1][j];
                const u32 x2 = f.g[4 * s + 2][j], x3 = f.g[4 * s + 3][j];
                a[0] = prmt(x0, x1, 0x5410);
                a[1] = prmt(x0, x1, 0x7632);
                a[2] = prmt(x2, x3, 0x5410);
                a[3] = prmt(x2, x3, 0x7632);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                mma16816<DT>(acc[j][mt], a, f.s[mt][2 * s], f.s[mt][2 * s + 1]);
        }
    }
}

// The cluster's two barriers (gemm_common.cu), a CTA barrier before sm_90 (no clusters there).
__device__ __forceinline__ void partials_written() {
#if __CUDA_ARCH__ >= 900
    cluster_publish_shared();
#else
    __syncthreads();
#endif
}
__device__ __forceinline__ void partials_read() {
#if __CUDA_ARCH__ >= 900
    cluster_sync();
#else
    __syncthreads();
#endif
}

// The float4 at shared address `addr` of cluster CTA `rank` (this CTA's when CS == 1).
template <int CS>
__device__ __forceinline__ float4 load_partial(u32 addr, int rank) {
    float4 v;
#if __CUDA_ARCH__ >= 900
    if constexpr (CS > 1) {
        u32 remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                     : "=r"(remote) : "r"(addr), "r"(rank));
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
        return v;
    }
#endif
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
    return v;
}

}  // namespace skinny

// Grid: x = (row block of G * m_blocks + column block of S) * CS + cluster rank; clusters of
// CS along x. Dynamic shared memory: WARPS * BM * RS floats.
template <int DT, int BM, int WARPS, int CS, bool G_K, bool S_K, bool VEC>
__global__ void __launch_bounds__(WARPS * 32, (BM == 32 ? 8 : 12) / WARPS)
gemm_skinny(const u16* __restrict__ G, const u16* __restrict__ S, u16* C, const u16* Cin,
            int n_small, int n_big, int K, i64 ldg, i64 lds, i64 c_small, i64 c_big,
            i64 cin_small, i64 cin_big, float alpha, float beta) {
    using namespace skinny;
    static_assert(BM == 8 || BM == 16 || BM == 32, "BM: 8, 16 or 32 columns of S");
    static_assert(CS >= 1 && CS <= 8, "clusters of 1 to 8 CTAs");
    static_assert(DT == DT_F16 || DT == DT_BF16, "16-bit types only");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    static_assert(CS == 1, "clusters need sm_90");
#endif
    constexpr int MT = BM / 8, THREADS = WARPS * 32;
    extern __shared__ __align__(16) float partial[];  // [WARPS][BM][RS]

    const int m_blocks = (n_small + BM - 1) / BM;
    const int rank = (int)(blockIdx.x % CS), block = (int)(blockIdx.x / CS);
    const int n0 = (block / m_blocks) * BN, m0 = (block % m_blocks) * BM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // This CTA's chunks [begin, end); warp w takes begin + w, begin + w + WARPS, ...
    const int chunks = (K + CHUNK - 1) / CHUNK;
    const int per = (chunks + CS - 1) / CS;
    const int begin = min(chunks, rank * per), end = min(chunks, begin + per);

    float acc[4][MT][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][mt][e] = 0.f;

    // Two register buffers: the next chunk's loads are in flight while one is multiplied.
    Frags<MT> f0, f1;
    int c = begin + warp;
    if (c < end)
        load_chunk<MT, G_K, S_K, VEC>(f0, G, S, ldg, lds, K, n0, n_big, m0, n_small, c, lane);
    for (; c < end; c += 2 * WARPS) {
        if (c + WARPS < end)
            load_chunk<MT, G_K, S_K, VEC>(f1, G, S, ldg, lds, K, n0, n_big, m0, n_small,
                                          c + WARPS, lane);
        multiply_chunk<DT, MT, G_K>(acc, f0);
        if (c + WARPS >= end) break;
        if (c + 2 * WARPS < end)
            load_chunk<MT, G_K, S_K, VEC>(f0, G, S, ldg, lds, K, n0, n_big, m0, n_small,
                                          c + 2 * WARPS, lane);
        multiply_chunk<DT, MT, G_K>(acc, f1);
    }

    // Each warp's partial tile: acc[j][mt] = rows 16 j + g (+ 8), columns 8 mt + 2 t (+ 1).
    {
        const int g = lane / 4, t = lane % 4;
        float* mine = partial + warp * BM * RS;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    mine[(8 * mt + 2 * t + e % 2) * RS + 16 * j + g + 8 * (e / 2)] = acc[j][mt][e];
    }
    if (CS > 1) {
        partials_written();  // every CTA's partial tiles are written and visible cluster-wide
    } else {
        __syncthreads();
    }

    // Rank r finishes float4 groups r * THREADS + tid, + CS * THREADS, ... of the valid rows,
    // summing warps and ranks in a fixed order.
    const int rows = min(BM, n_small - m0);
    const u32 base = smem_addr(partial);
    for (int u = rank * THREADS + (int)threadIdx.x; u < rows * (BN / 4); u += CS * THREADS) {
        const int m = u / (BN / 4), q = u % (BN / 4);
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
        for (int from = 0; from < CS; ++from) {
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float4 v = load_partial<CS>(base + 4 * ((w * BM + m) * RS + 4 * q), from);
                sum[0] += v.x;
                sum[1] += v.y;
                sum[2] += v.z;
                sum[3] += v.w;
            }
        }
        const i64 i = m0 + m;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = n0 + g_row<G_K>(4 * q + e);
            if (j >= n_big) continue;
            float v = alpha * sum[e];
            if (beta != 0.f) v += beta * to_f32<DT>(Cin[i * cin_small + (i64)j * cin_big]);
            C[i * c_small + (i64)j * c_big] = from_f32<DT>(v);
        }
    }
    if (CS > 1) partials_read();  // no CTA leaves while others may read its partial tiles
}
