// bf16/fp16 GEMM for decode shapes on Hopper (sm_90a): one side of C small (a batch of 1..128
// tokens), the other and K large (a layer's weight), so the work is streaming the weight once.
//
// The kernel computes D (P x Q) = X (P x K) Y (Q x K)^T with X the big operand (the weight) on
// wgmma's 64-row side and Y (the activations) on its N side (m64nBNk16, BN = 16..128), so a
// batch of 16 costs a 16-wide MMA instead of a 128-row tile that is 7/8 padding. The host
// picks X and Y out of op(a) and op(b)^T and C's strides: C = D^T (X = op(b)^T) when C is
// wide, C = D when it is tall. A CTA of 1 or 2 consumer warpgroups and a producer warp: one
// thread of the producer warp issues TMA copies into a STAGES-deep ring (the pipeline that
// keeps enough bytes of X in flight to saturate memory), each consumer warpgroup multiplies
// 64 (BM = 64, 128) or 128 (BM = 256) rows of X by the BN columns of Y, or 3 consumer
// warpgroups 64 rows each (BM = 192: 4096 rows in 22 tiles, whose split-4 clusters fit one
// wave where 32 tiles of 128 do not); the taller tiles read Y from L2 fewer times.
// Layouts, swizzle, descriptors and the ring's barriers are those of gemm_wgmma.cu.
//
// TF32 (DT_TF32: fp32 data, K tiles of 32 fp32 = the same 128-byte rows): wgmma reads TF32
// from shared memory only K-major, so Y must be K-major; a K-major X is read by descriptor,
// a P-major one arrives in [32 k][32 p] boxes and is loaded into registers for the register-A
// form, with gemm_wgmma_tf32.cu's fragment layout (a thread's rows lo, lo + 1). BM <= 128.
//
// Without split-K (SPLIT == 1) the consumers write C straight from their accumulators.
// Split-K over the SPLIT CTAs of a thread-block cluster (grids of few tiles: 4096 rows of X
// make 32 tiles of 128 for 132 SMs): each CTA takes a contiguous slice of K tiles; every CTA
// writes its fp32 partial tile into its shared memory (over the ring, which is idle by then),
// and after a cluster barrier rank r sums rows [r BM / SPLIT, (r + 1) BM / SPLIT) of all the
// ranks' tiles in a fixed order through distributed shared memory and writes them to C with
// alpha and beta: one launch, no workspace, deterministic.
#include "gemm_wgmma_tf32.cu"

namespace dc {

// The float at shared address `addr` of cluster CTA `rank`.
__device__ __forceinline__ float load_partial(u32 addr, int rank) {
    float v;
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// Element (p, q) of C: alpha * sum (+ beta * Cin's element).
template <int DT, typename T>
__device__ __forceinline__ void store_c(T* C, const T* Cin, i64 p, i64 q, i64 c_p, i64 c_q,
                                        i64 cin_p, i64 cin_q, float alpha, float beta,
                                        float sum) {
    float v = alpha * sum;
    if (beta != 0.f) v += beta * to_f32<DT>(Cin[p * cin_p + q * cin_q]);
    C[p * c_p + q * c_q] = from_f32<DT>(v);
}

// TF32: one consumer's K loop over tiles [k_begin, k_end) of the ring (stage s at a_ring +
// s A_BYTES + a_half, b_ring + s B_BYTES), accumulating into d; X by descriptor when X_K,
// else from registers (two fragment buffers alternate, as in gemm_wgmma_tf32.cu).
template <int BN, int STAGES, bool X_K, u32 A_BYTES, u32 B_BYTES>
__device__ __forceinline__ void tf32_loop(float* d, u32 a_ring, u32 b_ring, u32 full_bar,
                                          u32 empty_bar, u32 a_half, int unit, int odd, int q,
                                          int lane, int k_begin, int k_end) {
    using namespace wgt;
    int prev = 0, it = 0;
    auto step = [&](u32(&frag)[16], int kt) {
        const int s = it % STAGES;
        mbar_wait(full_bar + 8 * s, (it / STAGES) & 1);
        const u32 a_tile = a_ring + s * A_BYTES + a_half, b_tile = b_ring + s * B_BYTES;
        if (!X_K) load_fragments(frag, a_tile, unit, odd, q);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const u64 db = make_desc(b_tile + kk * 32, 16, 1024);
            const int scale = (kt > k_begin || kk > 0) ? 1 : 0;
            if (X_K) {
                wgmma_ss<BN>(d, make_desc(a_tile + kk * 32, 16, 1024), db, scale);
            } else {
                wgmma_rs<BN>(d, frag + 4 * kk, db, scale);
            }
        }
        wgmma_commit();
        if (kt > k_begin) {
            wgmma_wait<1>();
            if (lane == 0) mbar_arrive(empty_bar + 8 * prev);
        }
        prev = s;
        ++it;
    };
    u32 frag_even[16], frag_odd[16];
    for (int kt = k_begin; kt < k_end; kt += 2) {
        step(frag_even, kt);
        if (kt + 1 < k_end) step(frag_odd, kt + 1);
    }
    wgmma_wait<0>();
}

}  // namespace dc

// Grid: x = (tile of P * q_tiles + tile of Q) * SPLIT + cluster rank; clusters of SPLIT along
// x. X_K / Y_K: X / Y K-major (else P- / Q-major: 64-wide boxes, BN a multiple of 64). Element
// (p, q) of C is at C + p * c_p + q * c_q (Cin likewise). Dynamic shared memory: see
// kernels/_gemm_decode.py (shared_mem). Threads: the consumer warpgroups first (wgmma wants
// each on a multiple of 4 warps), then one producer warp: 160, 288 or (BM = 192) 416 threads,
// so two CTAs of 128-row tiles fit an SM's registers where their shared memory allows it.
template <int DT, int BM, int BN, int STAGES, bool X_K, bool Y_K, int SPLIT>
__global__ void __launch_bounds__(BM == 64 ? 160 : BM == 192 ? 416 : 288, 1)
gemm_decode(const __grid_constant__ wg::TmaDesc tma_x, const __grid_constant__ wg::TmaDesc tma_y,
            u16* C_, const u16* Cin_, int P, int Q, int K, i64 c_p, i64 c_q, i64 cin_p,
            i64 cin_q, float alpha, float beta) {
    using namespace wg;
    // C and Cin hold fp32 for TF32 (typed u16* so the 16-bit kernels keep their symbols)
    auto* C = reinterpret_cast<typename Elem<DT>::T*>(C_);
    const auto* Cin = reinterpret_cast<const typename Elem<DT>::T*>(Cin_);
    constexpr bool TF32 = DT == DT_TF32;
    static_assert(!TF32 || (Y_K && BM <= 128), "TF32: a K-major Y, at most 128 rows of X");
    constexpr int BKE = TF32 ? 32 : BK;  // elements of a K tile's 128-byte rows
    static_assert(BM == 64 || BM == 128 || BM == 192 || BM == 256,
                  "BM: 64, 128, 192 or 256 rows of X");
    static_assert(Y_K || BN % 64 == 0, "a Q-major Y comes in 64-wide boxes");
    static_assert(SPLIT == 1 || SPLIT == 2 || SPLIT == 4 || SPLIT == 8, "clusters of 1..8");
    // MT 64-row blocks of X per consumer warpgroup: block b of the tile at b * CHUNK_BYTES
    // in both layouts (K-major: 64 rows of 128 bytes; P-major: one [64 k][64 p] box)
    constexpr int CONSUMERS = BM == 64 ? 1 : BM == 192 ? 3 : 2, MT = BM / 64 / CONSUMERS;
    constexpr int THREADS = 128 * CONSUMERS + 32;
    constexpr u32 A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
    constexpr int PITCH = BM + 4;  // floats per column of the partial tile: conflict-free
    constexpr u32 RING = STAGES * (A_BYTES + B_BYTES), PART = BN * PITCH * 4;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 a_ring = base, b_ring = base + STAGES * A_BYTES;
    const u32 full_bar = base + (RING > PART ? RING : PART);
    const u32 empty_bar = full_bar + STAGES * 8;

    const int q_tiles = (Q + BN - 1) / BN;
    const int block = blockIdx.x / SPLIT;
    const int rank = SPLIT == 1 ? 0 : (int)cluster_rank();
    const int tp = block / q_tiles, tq = block % q_tiles;
    const int k_tiles = (K + BKE - 1) / BKE, per = (k_tiles + SPLIT - 1) / SPLIT;
    const int k_begin = min(k_tiles, rank * per), k_end = min(k_tiles, k_begin + per);
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, CONSUMERS * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warpgroup == CONSUMERS) {  // the producer warp
        if (threadIdx.x == 128 * CONSUMERS) {
            for (int kt = k_begin, it = 0; kt < k_end; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(empty_bar + 8 * s, ((it / STAGES) & 1) ^ 1);
                const u32 full = full_bar + 8 * s;
                mbar_expect_tx(full, A_BYTES + B_BYTES);
                const u32 a_dst = a_ring + s * A_BYTES, b_dst = b_ring + s * B_BYTES;
                const int k0 = kt * BKE;
                if constexpr (TF32 && !X_K) {  // [32 k][32 p] boxes (gemm_wgmma_tf32.cu)
#pragma unroll
                    for (int j = 0; j < BM / 32; ++j)
                        tma_load(a_dst + j * wgt::BOX_BYTES, &tma_x, tp * BM + j * 32, k0, full);
                } else {
                    tma_load_tile<X_K, BM>(a_dst, &tma_x, k0, tp * BM, full);
                }
                tma_load_tile<Y_K, BN>(b_dst, &tma_y, k0, tq * BN, full);
            }
        }
    } else {
        const int half = warpgroup;  // row blocks [MT half, MT half + MT) of the tile
        const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
        float d[MT][BN / 2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) d[mt][i] = 0.f;
        // The register form of TF32 puts a thread's two accumulator rows side by side: lo_rs,
        // lo_rs + 1 in its 64-row block (see gemm_wgmma_tf32.cu), not 16 warp + lane / 4 + 8 h
        constexpr bool rs = TF32 && !X_K;
        const int g = lane / 4, unit = 2 * (warp % 2) + (g / 2) % 2 + 4 * (g / 4);
        const int lo_rs = 32 * (warp / 2) + 4 * unit + 2 * (g % 2);
        if constexpr (TF32) {
            const u32 a_half =
                X_K ? half * CHUNK_BYTES : (2 * half + warp / 2) * wgt::BOX_BYTES;
            dc::tf32_loop<BN, STAGES, X_K, A_BYTES, B_BYTES>(d[0], a_ring, b_ring, full_bar,
                                                             empty_bar, a_half, unit, g % 2,
                                                             lane % 4, lane, k_begin, k_end);
        } else {
            constexpr u32 A_STEP = X_K ? 32 : 2048, B_STEP = Y_K ? 32 : 2048;
            constexpr u32 A_LBO = X_K ? 16 : CHUNK_BYTES, B_LBO = Y_K ? 16 : CHUNK_BYTES;
            const u32 a_half = half * MT * CHUNK_BYTES;
            int prev = 0;
            for (int kt = k_begin, it = 0; kt < k_end; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(full_bar + 8 * s, (it / STAGES) & 1);
                const u32 a_tile = a_ring + s * A_BYTES + a_half, b_tile = b_ring + s * B_BYTES;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {
                    const u64 db = make_desc(b_tile + kk * B_STEP, B_LBO, 1024);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        const u64 da =
                            make_desc(a_tile + mt * CHUNK_BYTES + kk * A_STEP, A_LBO, 1024);
                        wgmma<BN, DT, X_K ? 0 : 1, Y_K ? 0 : 1>(
                            d[mt], da, db, (kt > k_begin || kk > 0) ? 1 : 0);
                    }
                }
                wgmma_commit();
                if (kt > k_begin) {
                    wgmma_wait<1>();
                    if (lane == 0) mbar_arrive(empty_bar + 8 * prev);
                }
                prev = s;
            }
            wgmma_wait<0>();
        }
        // d[mt][4j + 2h + e] is element (16 warp + lane/4 + 8h, 8j + 2(lane%4) + e) of row
        // block MT half + mt (register-form TF32: (lo_rs + h, ...)).
        if constexpr (SPLIT == 1) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int row = rs ? tp * BM + (half * MT + mt) * 64 + lo_rs
                                   : tp * BM + (half * MT + mt) * 64 + warp * 16 + lane / 4;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int p = row + (rs ? e / 2 : 8 * (e / 2));
                        const int q = tq * BN + 8 * j + 2 * (lane % 4) + e % 2;
                        if (p < P && q < Q)
                            dc::store_c<DT>(C, Cin, p, q, c_p, c_q, cin_p, cin_q, alpha, beta,
                                            d[mt][4 * j + e]);
                    }
            }
            return;
        }
        // Every TMA copy has landed (each was waited for) and every consumer's wgmmas have
        // read their operands: the ring is free for the partial tile (column q at q * PITCH).
        named_sync(1, 128 * CONSUMERS);
        float* part = reinterpret_cast<float*>(smem_raw + (base - smem_addr(smem_raw)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int row = rs ? (half * MT + mt) * 64 + lo_rs
                               : (half * MT + mt) * 64 + warp * 16 + lane / 4;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = 8 * j + 2 * (lane % 4) + e % 2;
                    part[col * PITCH + row + (rs ? e / 2 : 8 * (e / 2))] = d[mt][4 * j + e];
                }
        }
    }
    if constexpr (SPLIT == 1) return;
    cluster_publish_shared();  // every rank's partial tile is written and visible cluster-wide
    // Rank r finishes rows [r BM / SPLIT, (r + 1) BM / SPLIT), row fastest (C's contiguous
    // side when it is wide), summing the ranks in order. A thread's elements u = threadIdx.x
    // + i THREADS come CHUNK at a time, all their loads issued before the first sum, so the
    // distributed-shared-memory round trips overlap instead of forming one chain per thread.
    constexpr int ROWS = BM / SPLIT, CHUNK = 16 / SPLIT;
    const int p0 = tp * BM + rank * ROWS, q0 = tq * BN;
    const int rows = min(ROWS, P - p0), cols = min(BN, Q - q0);
    for (int u0 = threadIdx.x; u0 < ROWS * cols; u0 += CHUNK * THREADS) {
        float got[CHUNK][SPLIT];
#pragma unroll
        for (int i = 0; i < CHUNK; ++i) {
            const int u = u0 + i * THREADS, pr = u % ROWS, q = u / ROWS;
            if (u >= ROWS * cols || pr >= rows) continue;
            const u32 at = base + 4 * (q * PITCH + rank * ROWS + pr);
#pragma unroll
            for (int from = 0; from < SPLIT; ++from) got[i][from] = dc::load_partial(at, from);
        }
#pragma unroll
        for (int i = 0; i < CHUNK; ++i) {
            const int u = u0 + i * THREADS, pr = u % ROWS, q = u / ROWS;
            if (u >= ROWS * cols || pr >= rows) continue;
            float sum = 0.f;
#pragma unroll
            for (int from = 0; from < SPLIT; ++from) sum += got[i][from];
            dc::store_c<DT>(C, Cin, p0 + pr, q0 + q, c_p, c_q, cin_p, cin_q, alpha, beta, sum);
        }
    }
    cluster_sync();  // no CTA leaves while others may read its partial tile
}
