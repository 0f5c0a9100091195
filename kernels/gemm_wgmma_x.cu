// gemm_wgmma_x: the 16-bit wgmma kernel's variants for issue 17's irregular and short-K shapes
// (Config.cluster_n, Config.pingpong, Config.pipe_store), on gemm_wgmma.cu's body: clusters
// along N that multicast A, ping-pong consumers (wg::consume_pingpong below), a pipelined
// TMA-store epilogue (64- and 192-row tiles: gemm_wgmma.cu's gemm_wgmma_bm). Kept apart so
// that gemm_wgmma.cu's own kernels compile as before (their PTX is unchanged by the CN/PP
// switches).
#include "gemm_wgmma.cu"

namespace wg {

// Arrive on named barrier `id` without waiting (its other `count` - 32 k threads bar.sync).
__device__ __forceinline__ void named_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Ping-pong consumer (gemm_wgmma_x with PP): consumer warpgroup `half` takes every other work
// item of its CTA (the CTA's items are first, first + step, ... below `items`), a whole
// 128 x BN tile each (two m64 wgmma per k step), so the two warpgroups' tiles alternate in the
// ring and one's epilogue overlaps the other's main loop (short K: 8192 x 8192 x 512 has 8 K
// tiles per tile). The CTA's j-th item uses ring slots j k_tiles .. (j + 1) k_tiles - 1 (the
// producer loads whole tiles in item order). A warpgroup starts item j only after the other
// one has waited on all of item j - 1's slots (named barriers 3 and 4): every slot's `full`
// barrier is then at most one phase behind, so a parity wait cannot pass on an older phase
// (without it, a warpgroup skipping the other's slots ran ahead and read unfilled stages: an
// H100 hung or faulted wherever a CTA had more than one tile). tile_of(item, tm, tn): the
// item's tile; release(s): frees slot s. PS: the tile's 4 passes of 64 x 64 go through a ring
// of 4 staging boxes (store_half_tma's PIPE), each waiting only for its box's store of the
// warpgroup's previous tile, which had the other warpgroup's whole tile to drain (the plain
// store waits for each pass's store before the next: 4 waits per tile on a single buffer).
template <int DT, int BN, int STAGES, bool A_K, bool B_K, bool PS, class Release, class TileOf>
__device__ __forceinline__ void consume_pingpong(
    u32 a_ring, u32 b_ring, u32 full_bar, Release release, const TmaDesc& tma_c,
    u16* __restrict__ C, const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin,
    float alpha, float beta, int pair_ok, bool use_tma_store, u32 out_buffer, int half,
    int first, int step, int items, u32 a_lbo, u32 a_sbo, u32 b_lbo, u32 b_sbo,
    TileOf tile_of) {
    constexpr u32 A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
    constexpr u32 A_STEP = A_K ? 32 : 2048, B_STEP = B_K ? 32 : 2048;
    constexpr u32 A_ROWS64 = A_K ? 64 * 128 : CHUNK_BYTES;  // A's rows 64..127 in a stage
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int k_tiles = (K + BK - 1) / BK;
    for (int j = half, item = first + half * step; item < items; j += 2, item += 2 * step) {
        if (j > 0) named_sync(3 + half, 256);  // the other warpgroup is past item j - 1's waits
        int tm, tn;
        tile_of(item, tm, tn);
        float d[2][BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) d[0][i] = d[1][i] = 0.f;
        int prev = 0;
        for (int kt = 0; kt < k_tiles; ++kt) {
            const int it = j * k_tiles + kt, s = it % STAGES;
            mbar_wait(full_bar + 8 * s, (it / STAGES) & 1);
            const u32 a_tile = a_ring + s * A_BYTES, b_tile = b_ring + s * B_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) {
                const u64 db = make_desc(b_tile + kk * B_STEP, b_lbo, b_sbo);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u64 da = make_desc(a_tile + h * A_ROWS64 + kk * A_STEP, a_lbo, a_sbo);
                    wgmma<BN, DT, A_K ? 0 : 1, B_K ? 0 : 1>(d[h], da, db,
                                                          (kt > 0 || kk > 0) ? 1 : 0);
                }
            }
            wgmma_commit();
            if (kt > 0) {
                wgmma_wait<1>();
                release(prev);
            }
            prev = s;
        }
        if (item + step < items) named_arrive(3 + (half ^ 1), 256);  // item j + 1 may start
        wgmma_wait<0>();
        release(prev);  // K >= 1: at least one K tile
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = tm * BM + h * 64 + warp * 16 + lane / 4;
            const int c = tn * BN + (lane % 4) * 2;
            if (use_tma_store) {
                store_half_tma<DT, BN, PS, 4>(d[h], &tma_c, Cin, M, N, ldcin, alpha, beta, r,
                                              c, out_buffer, half, t, tn * BN, tm * BM + h * 64,
                                              2 * h);
                continue;
            }
#pragma unroll
            for (int jj = 0; jj < BN / 8; ++jj) {
                store_pair<DT>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r, c + 8 * jj,
                               d[h][4 * jj], d[h][4 * jj + 1], pair_ok != 0);
                store_pair<DT>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r + 8,
                               c + 8 * jj, d[h][4 * jj + 2], d[h][4 * jj + 3], pair_ok != 0);
            }
        }
    }
    if (use_tma_store && t == 0) bulk_wait_all();  // the stores are done before the CTA ends
}

}  // namespace wg

// The variants measured for irregular and short-K shapes (issue 17), unsplit: CN = 2 pairs CTAs
// along N in clusters (of CM x CN) that multicast their common A tile (each loads 64 of its
// 128 rows), which halves A's L2 requests per CTA, the cost of rows that are not 128-byte
// multiples; PP gives each consumer warpgroup whole tiles in turn (wg::consume_pingpong), so
// one's epilogue overlaps the other's main loop; PS pipelines the TMA-store epilogue of each
// half tile (wg::store_half_tma). The arguments are gemm_wgmma's (partial and splits unused).
template <int DT, int BN, int STAGES, bool A_K, bool B_K, int CM, int CN, bool PP, bool EPI_TMA,
          bool PS = false>
__global__ void __launch_bounds__(wg::THREADS, 1)
gemm_wgmma_x(const __grid_constant__ wg::TmaDesc tma_a, const __grid_constant__ wg::TmaDesc tma_b,
             const __grid_constant__ wg::TmaDesc tma_c, u16* __restrict__ C,
             const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin, float alpha,
             float beta, int group_m, int pair_ok, int tma_store_ok, float* __restrict__ partial,
             int splits) {
    // clusters end without a cluster barrier (the producer's tail, wg::LEAN_TAIL); ping-pong
    // consumers keep it
    constexpr int LEAN = CM * CN > 1 && !PP ? wg::LEAN_TAIL : 0;
    gemm_wgmma_body<DT, BN, STAGES, A_K, B_K, CM, EPI_TMA, false, CN, PP, PS, wg::BM, LEAN>(
        tma_a, tma_b, tma_c, C, Cin, M, N, K, ldc, ldcin, alpha, beta, group_m, pair_ok,
        tma_store_ok, nullptr, 1, nullptr);
}
