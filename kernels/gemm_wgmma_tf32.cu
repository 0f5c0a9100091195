// TF32 GEMM for Hopper (sm_90a): fp32 data on the TF32 tensor cores with the pipeline of
// gemm_wgmma.cu (one TMA producer warpgroup, two consumer warpgroups of 64 x BN each, an
// mbarrier ring, a persistent grid in grouped order, an epilogue through shared memory and TMA
// stores). Tiles are 128 x BN x 32 fp32: the same 128-byte swizzled rows as the 16-bit kernel's
// 64-element ones, so descriptors and TMA boxes keep their byte geometry.
//
// wgmma reads TF32 operands from shared memory only K-major (no transpose bits), hence:
// - B (the descriptor operand, the N side) must be K-major. When only A is, the host computes
//   C^T = B^T A^T instead: OUT_T says the kernel's C (M x N) is stored transposed, element
//   (r, c) at C + c * ldc + r (C is then the row-major N x M output).
// - A (the M side) is read by descriptor when K-major (A_K). Otherwise its tile arrives M-major
//   ([32 k][32 m] boxes) and each consumer loads it into registers for the register-A ("RS")
//   form of wgmma. A thread's two fragment rows are made adjacent (rows r0, r0 + 1 instead of
//   g, g + 8: any row permutation is fine as long as the epilogue applies it), so one 8-byte
//   load fetches both, and the 16 rows of a warp sit in 16-byte units {b, b+1, b+4, b+5} of a
//   128-byte row, which keeps the loads of the four k rows a warp reads conflict-free after the
//   swizzle. Two fragment buffers alternate, so the next stage loads while wgmma reads the last.
#include "gemm_wgmma.cu"

namespace wgt {

using namespace wg;
constexpr int BK32 = 32;
constexpr int BOX_BYTES = 32 * 128;  // one [32 k][32 m] box of an M-major A tile
constexpr int OUT_BOX_BYTES = 64 * 128;  // one [64 rows][32 columns] box of C
constexpr int OUT_BUFFER_BYTES = 2 * OUT_BOX_BYTES;  // per consumer: 64 x 64 of C

// d (+)= A(64 x 8) * B(8 x N), both operands in shared memory (K-major descriptors).
template <int N>
__device__ __forceinline__ void wgmma_ss(float* d, u64 da, u64 db, int scale_d) {
    static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256,
                  "BN is 16, 32, 64, 128 or 256");
    if constexpr (N == 16) {  // the decode family's narrow tiles (gemm_decode.cu)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {" WG_REG_8 "}, "
                     "%8, %9, p, 1, 1;\n}\n"
                     : WG_OUT_0_8
                     : "l"(da), "l"(db), "r"(scale_d));
    } else if constexpr (N == 32) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {" WG_REG_16 "}, "
                     "%16, %17, p, 1, 1;\n}\n"
                     : WG_OUT_0_16
                     : "l"(da), "l"(db), "r"(scale_d));
    } else if constexpr (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" WG_REG_32 "}, "
                     "%32, %33, p, 1, 1;\n}\n"
                     : WG_OUT_0_32
                     : "l"(da), "l"(db), "r"(scale_d));
    } else if constexpr (N == 128) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WG_REG_64 "}, "
                     "%64, %65, p, 1, 1;\n}\n"
                     : WG_OUT_0_64
                     : "l"(da), "l"(db), "r"(scale_d));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {" WG_REG_128 "}, "
                     "%128, %129, p, 1, 1;\n}\n"
                     : WG_OUT_0_64, WG_OUT_64_128
                     : "l"(da), "l"(db), "r"(scale_d));
    }
}

// The same with A from registers: a[0..3] = A(row lo, k), A(row hi, k), A(lo, k+4), A(hi, k+4).
template <int N>
__device__ __forceinline__ void wgmma_rs(float* d, const u32* a, u64 db, int scale_d) {
    static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256,
                  "BN is 16, 32, 64, 128 or 256");
    if constexpr (N == 16) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {" WG_REG_8 "}, "
                     "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
                     : WG_OUT_0_8
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    } else if constexpr (N == 32) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {" WG_REG_16 "}, "
                     "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
                     : WG_OUT_0_16
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    } else if constexpr (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {" WG_REG_32 "}, "
                     "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                     : WG_OUT_0_32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    } else if constexpr (N == 128) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {" WG_REG_64 "}, "
                     "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                     : WG_OUT_0_64
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {" WG_REG_128 "}, "
                     "{%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
                     : WG_OUT_0_64, WG_OUT_64_128
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
    }
}

__device__ __forceinline__ void ld_shared_v2(u32 addr, u32& x, u32& y) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(x), "=r"(y) : "r"(addr));
}
__device__ __forceinline__ void st_shared_v2(u32 addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// The fragments of one stage (4 k8 steps) of this thread's rows r0, r0 + 1 from an M-major
// [32 k][32 m] box: `unit` is the rows' 16-byte unit in a 128-byte k row, `odd` which half of it.
__device__ __forceinline__ void load_fragments(u32 (&f)[16], u32 box, int unit, int odd, int q) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int k = 8 * kk + q + 4 * h;
            ld_shared_v2(box + k * 128 + (((unit ^ (k & 7)) << 4) | (odd * 8)), f[4 * kk + 2 * h],
                         f[4 * kk + 2 * h + 1]);
        }
    }
}

// alpha * acc + beta * Cin for the pair at kernel coordinates (r, c), (r + dr, c + dc)
// (OUT_T: C and Cin are stored transposed). Cin is read only inside the matrix.
template <bool OUT_T>
__device__ __forceinline__ float2 blend(float v0, float v1, const float* __restrict__ Cin, int M,
                                        int N, i64 ldcin, float alpha, float beta, int r, int c,
                                        int dr, int dc) {
    v0 *= alpha;
    v1 *= alpha;
    if (beta != 0.f) {
        if (r < M && c < N) v0 += beta * Cin[OUT_T ? (i64)c * ldcin + r : (i64)r * ldcin + c];
        if (r + dr < M && c + dc < N)
            v1 += beta * Cin[OUT_T ? (i64)(c + dc) * ldcin + r + dr : (i64)(r + dr) * ldcin + c + dc];
    }
    return make_float2(v0, v1);
}

// A pair of fp32 values at (row, col), (row, col + 1) of a consumer's 64 x 64 staging block
// (two [64][32] boxes with the 128-byte swizzle).
__device__ __forceinline__ void stage_pair(u32 buffer, int row, int col, float2 v) {
    const int byte = (col % 32) * 4;
    st_shared_v2(buffer + (col / 32) * OUT_BOX_BYTES + row * 128 +
                     ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15)),
                 v.x, v.y);
}

}  // namespace wgt

template <int BN, int STAGES, bool A_K, bool OUT_T, bool EPI_TMA>
__global__ void __launch_bounds__(wg::THREADS, 1)
gemm_wgmma_tf32(const __grid_constant__ wg::TmaDesc tma_a,
                const __grid_constant__ wg::TmaDesc tma_b,
                const __grid_constant__ wg::TmaDesc tma_c, float* __restrict__ C,
                const float* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin,
                float alpha, float beta, int group_m, int pair_ok, int tma_store_ok) {
    using namespace wgt;
    static_assert(!(OUT_T && A_K), "a transposed output comes with the register-A form");
    constexpr u32 A_BYTES = BM * BK32 * 4, B_BYTES = BN * BK32 * 4;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 a_ring = base, b_ring = base + STAGES * A_BYTES;
    const u32 out_stage = b_ring + STAGES * B_BYTES;
    const u32 full_bar = out_stage + (EPI_TMA ? 2 * OUT_BUFFER_BYTES : 0);
    const u32 empty_bar = full_bar + STAGES * 8;
    const bool use_tma_store = EPI_TMA && tma_store_ok != 0;

    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int tiles = tiles_m * tiles_n, k_tiles = (K + BK32 - 1) / BK32;
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                int tm, tn;
                grouped_tile(tile, tiles_m, tiles_n, group_m, tm, tn);
                for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                    const int s = it % STAGES;
                    mbar_wait(empty_bar + 8 * s, ((it / STAGES) & 1) ^ 1);
                    const u32 full = full_bar + 8 * s;
                    mbar_expect_tx(full, A_BYTES + B_BYTES);
                    const u32 a_dst = a_ring + s * A_BYTES;
                    const int k0 = kt * BK32;
                    if (A_K) {
                        tma_load(a_dst, &tma_a, k0, tm * BM, full);
                    } else {
#pragma unroll
                        for (int j = 0; j < BM / 32; ++j)
                            tma_load(a_dst + j * BOX_BYTES, &tma_a, tm * BM + j * 32, k0, full);
                    }
                    tma_load(b_ring + s * B_BYTES, &tma_b, k0, tn * BN, full);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int half = warpgroup - 1;  // rows [64 * half, 64 * half + 64) of the tile
        const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
        // Register-A rows: 16-byte unit {b, b+1, b+4, b+5}[g / 2] of box 2 half + warp / 2, and
        // the half `g % 2` of it: rows r0, r0 + 1 of the half tile (see the file comment).
        const int unit = 2 * (warp % 2) + (g / 2) % 2 + 4 * (g / 4);
        const int lo = A_K ? 16 * warp + g : 32 * (warp / 2) + 4 * unit + 2 * (g % 2);
        const int dr = A_K ? 8 : 1;  // the thread's second row is lo + dr
        const u32 a_half = A_K ? half * 64 * 128 : (2 * half + warp / 2) * BOX_BYTES;
        auto release = [&](int s) {
            if (lane == 0) mbar_arrive(empty_bar + 8 * s);
        };
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int tm, tn;
            grouped_tile(tile, tiles_m, tiles_n, group_m, tm, tn);
            float d[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
            int prev = 0;
            // One K tile: wait for its stage, (load A's fragments,) issue its 4 wgmma, and
            // release the stage before it once its group has retired.
            auto step = [&](u32(&frag)[16], int kt) {
                const int s = it % STAGES;
                mbar_wait(full_bar + 8 * s, (it / STAGES) & 1);
                const u32 a_tile = a_ring + s * A_BYTES + a_half, b_tile = b_ring + s * B_BYTES;
                if (!A_K) load_fragments(frag, a_tile, unit, g % 2, q);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK32 / 8; ++kk) {
                    const u64 db = make_desc(b_tile + kk * 32, 16, 1024);
                    const int scale = (kt > 0 || kk > 0) ? 1 : 0;
                    if (A_K) {
                        wgmma_ss<BN>(d, make_desc(a_tile + kk * 32, 16, 1024), db, scale);
                    } else {
                        wgmma_rs<BN>(d, frag + 4 * kk, db, scale);
                    }
                }
                wgmma_commit();
                if (kt > 0) {
                    wgmma_wait<1>();
                    release(prev);
                }
                prev = s;
                ++it;
            };
            u32 frag_even[16], frag_odd[16];
            for (int kt = 0; kt < k_tiles; kt += 2) {
                step(frag_even, kt);
                if (kt + 1 < k_tiles) step(frag_odd, kt + 1);
            }
            wgmma_wait<0>();
            if (k_tiles > 0) release(prev);

            // d[4j + 2h + e] is element (lo + dr h, 8j + 2q + e) of this half tile.
            const int row0 = tm * BM + half * 64, col0 = tn * BN;
            const int r = row0 + lo, c = col0 + 2 * q;
            if (use_tma_store) {
                const u32 buffer = out_stage + half * OUT_BUFFER_BYTES;
#pragma unroll
                for (int pass = 0; pass < BN / 64; ++pass) {
                    if (t == 0) bulk_wait_read();
                    named_sync(1 + half, 128);
#pragma unroll
                    for (int jj = 0; jj < 8; ++jj) {
                        const int j = pass * 8 + jj, cc = 8 * jj + 2 * q;
                        if (OUT_T) {  // staging rows are C's rows = kernel columns
#pragma unroll
                            for (int e = 0; e < 2; ++e)
                                stage_pair(buffer, cc + e, lo,
                                           blend<true>(d[4 * j + e], d[4 * j + 2 + e], Cin, M, N,
                                                       ldcin, alpha, beta, r, c + 8 * j + e, 1, 0));
                        } else {
#pragma unroll
                            for (int h = 0; h < 2; ++h)
                                stage_pair(buffer, lo + dr * h, cc,
                                           blend<false>(d[4 * j + 2 * h], d[4 * j + 2 * h + 1],
                                                        Cin, M, N, ldcin, alpha, beta,
                                                        r + dr * h, c + 8 * j, 0, 1));
                        }
                    }
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    named_sync(1 + half, 128);
                    if (t == 0) {
                        // boxes of [64][32]: C's columns are the kernel's rows when OUT_T
                        const int inner = OUT_T ? row0 : col0 + pass * 64;
                        const int outer = OUT_T ? col0 + pass * 64 : row0;
                        tma_store(&tma_c, buffer, inner, outer);
                        tma_store(&tma_c, buffer + OUT_BOX_BYTES, inner + 32, outer);
                        bulk_commit();
                    }
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int cj = c + 8 * j;
                if (OUT_T) {  // C's row cj + e holds kernel rows r, r + 1 side by side
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        store_pair<DT_F32>(C, Cin, nullptr, N, M, ldc, ldcin, alpha, beta, cj + e,
                                           r, d[4 * j + e], d[4 * j + 2 + e], pair_ok != 0);
                } else {
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        store_pair<DT_F32>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta,
                                           r + dr * h, cj, d[4 * j + 2 * h],
                                           d[4 * j + 2 * h + 1], pair_ok != 0);
                }
            }
        }
        if (use_tma_store && t == 0) bulk_wait_all();
    }
}
