// bf16/fp16 GEMM for Hopper (sm_90a): TMA loads, wgmma, warp specialisation, persistent grid.
//
// A CTA of 3 warpgroups: warpgroup 0 produces (one thread issues the TMA copies of each K tile
// into a STAGES-deep ring of shared memory and gives its other registers away with setmaxnreg),
// warpgroups 1 and 2 consume (each multiplies a 64 x BN half of the 128 x BN tile with
// m64nBNk16 wgmma, accumulating in registers, then writes its half out). gemm_wgmma_bm's
// 64- and 192-row tiles have 1 and 3 consumers (2 and 4 warpgroups), each on a 64-row slab.
// The ring is guarded by two mbarriers per stage: `full` completes when the TMA bytes have
// landed (expect_tx), `empty` when all consumer warps (8; 4 with 64-row tiles, 12 with 192-row
// ones; times the CTAs a stage is multicast to) have finished reading the stage; both are
// waited on by phase parity. The consumers keep one wgmma group in flight and release the
// previous stage when it retires.
//
// The grid is persistent (one CTA per SM): CTA b takes tiles b, b + gridDim.x, ... in grouped
// order (group_m tile rows swept column by column, see grouped_tile) so concurrently running
// tiles share their A rows and B columns in L2; the producer runs ahead into the next tile
// while the consumers write the last one out. With CM = 2, clusters of two CTAs take pairs of
// vertically adjacent tiles: each CTA loads its A tile and half of the common B tile with a
// TMA multicast into both, which halves B's traffic from L2; a stage is then released to the
// producers only when the consumers of both CTAs are done with it (remote mbarrier arrives).
//
// Tiles are 128 x BN x 64 of 16-bit elements (BN = 64, 96, 128, 192 or 256) with 128-byte
// swizzle: TMA writes them swizzled and the wgmma descriptors read them back with the same
// swizzle. K-major operands come as one box [rows][64 k] per stage; M/N-major ones as boxes
// [64 k][64 mn] side by side (wgmma transpose bit set). Narrow tiles (BN = 96 or 80, not a
// multiple of 64) take N-major B as boxes [64 k][W n] (W = box_width(BN): 32 with the 64-byte
// swizzle, wgmma layout type 2; 16 with the 32-byte one, type 3), and stage C in [64][W]
// boxes with the same swizzle, so one m64nBNk16 per k16 step reads B. TMA zero-fills outside the matrix,
// so edge tiles need no special code; the epilogue masks its stores. The host (kernels/gemm.py) encodes the tensor maps and only
// sends problems whose rows are 16-byte aligned (a TMA requirement).
//
// Split-K (splits > 1, for grids of few tiles such as decode shapes): the work items are
// (tile, K slice) pairs, slice-major, so the CTAs running at once share their A slice in L2;
// each consumer warpgroup writes its raw fp32 sums to partial[slice][M][N], then takes a ticket
// on its half tile's counter (last_of_tile); the one that takes the last ticket sums the
// half tile's slices in slice order (the same bits every run), resets the counter and stores
// C with alpha/beta/Cin like an unsplit tile: one launch, no second pass.
#include "gemm_common.cu"

namespace wg {

constexpr int BM = 128;
constexpr int BK = 64;
constexpr int THREADS = 384;
constexpr int CONSUMER_WARPS = 8;
constexpr int CHUNK_BYTES = 64 * 128;  // one [64][64] box of 16-bit elements
// N-major box width (in elements) of a BN-wide tile: 64 (128-byte swizzle) or, for narrow
// tiles, 32 (BN = 96: 64-byte swizzle) or 16 (BN = 80: 32-byte swizzle); a [64][W] box of
// rows of 2W bytes is W * 128 bytes.
__host__ __device__ constexpr int box_width(int bn) {
    return bn % 64 == 0 ? 64 : bn % 32 == 0 ? 32 : 16;
}
// The wgmma descriptor's layout type of boxes W wide: 1, 2, 3 = 128-, 64-, 32-byte swizzle.
__host__ __device__ constexpr unsigned long long swizzle_layout(int w) {
    return w == 64 ? 1 : w == 32 ? 2 : 3;
}
constexpr int STAGE_OUT_BYTES = 2 * CHUNK_BYTES;  // per consumer: 64 rows x 128 columns of C
// The dynamic shared memory a CTA may take on sm_90 (227 KiB). A ring too deep to leave two
// staging boxes per consumer beside it (128 x 192 with 5 stages, cuBLAS's depth) stages C
// through one box per consumer, 64 columns a pass (Config.shared_mem keeps the same rule).
constexpr int SMEM_MAX = 227 * 1024;
// gemm_wgmma_bm's LEAN bits, for grids of about one tile per CTA (kernels/_gemm_config.py's
// Config.lean): K-loop descriptors as a base plus constant offsets (no per-wgmma descriptor
// arithmetic); the first stages' copies issued before the CTA barrier, tensor maps prefetched;
// an epilogue without the per-element beta test when beta == 0. With 2-CTA clusters,
// LEAN_TAIL: no cluster barrier at the end at all; each CTA's producer instead waits until
// every use of its ring's stages is released, by its own consumers and its peer's, so nothing
// of the peer's can still reach the CTA when it exits (the peer's copies into it completed on
// its full barriers, which its consumers waited for). A release-arrive at cluster scope costs
// ~0.7 us on an H100 (benchmarks/cluster_cost_dev.py), the producer's waits nothing measurable.
constexpr int LEAN_DESC = 1, LEAN_EARLY = 2, LEAN_EPI = 4, LEAN_TAIL = 16;

// A CUtensorMap passed by value (__grid_constant__): 128 opaque bytes, 64-byte aligned.
struct __align__(64) TmaDesc {
    u64 opaque[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// 2-D TMA load of the box at (inner, outer) element coordinates into dst, completing on bar.
__device__ __forceinline__ void tma_load(u32 dst, const TmaDesc* map, int inner, int outer,
                                         u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(inner), "r"(outer), "r"(bar)
        : "memory");
}

// The ROWS x BK tile at rows [row0, row0 + ROWS), columns [k0, k0 + BK) of a 16-bit matrix:
// one box when it is K-major, else ROWS / W boxes of [64 k][W rows], W * 128 bytes apart.
template <bool K_MAJOR, int ROWS, int W = 64>
__device__ __forceinline__ void tma_load_tile(u32 dst, const TmaDesc* map, int k0, int row0,
                                              u32 bar) {
    if constexpr (K_MAJOR) {
        tma_load(dst, map, k0, row0, bar);
    } else {
#pragma unroll
        for (int j = 0; j < ROWS / W; ++j)
            tma_load(dst + j * (W * 128), map, row0 + j * W, k0, bar);
    }
}

// Fetch a tensor map into the TMA unit's descriptor cache ahead of its first copy.
__device__ __forceinline__ void prefetch_tensormap(const TmaDesc* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// 2-D TMA store of the box at (inner, outer) from src (bulk-group completion; clipped at the
// matrix edge).
__device__ __forceinline__ void tma_store(const TmaDesc* map, u32 src, int inner, int outer) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
            reinterpret_cast<u64>(map)),
        "r"(inner), "r"(outer), "r"(src)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int PENDING = 0>  // bulk groups that may still be reading
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// A barrier among the `count` threads using named barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void named_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 value) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}

// The same copy into the same shared-memory offset of every CTA in ``mask`` (cluster ranks),
// completing on the barrier at ``bar``'s offset in each of them.
__device__ __forceinline__ void tma_load_multicast(u32 dst, const TmaDesc* map, int inner,
                                                   int outer, u32 bar, unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(inner), "r"(outer), "r"(bar), "h"(mask)
        : "memory");
}

__device__ __forceinline__ u32 cluster_rank() {
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// Arrive on the barrier at the same offset as ``bar`` in cluster CTA ``rank``. Release at CTA
// scope (the default), as CUTLASS does: `.release.cluster` put MEMBAR.ALL.GPU in front of
// every arrive (SASS), a wait on every stage of every consumer warp, which made every cluster
// config 1.2-2.9x slower (H100, 3000x5000x2000: 2-CTA clusters 173 us with it, 102 without;
// notes_gemm.md, session 9).
__device__ __forceinline__ void mbar_arrive_remote(u32 bar, u32 rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// The halves of gemm_common.cu's cluster_sync (LEAN_TAIL's start): the arrive relaxed
// (nothing of this thread's to publish: the barriers' init fence orders them for the peer)
// and the wait.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// Shared-memory matrix descriptor with 128-byte swizzle (layout type 1; 2: 64-byte swizzle).
// Offsets in bytes (stored >> 4).
__device__ __forceinline__ u64 make_desc(u32 addr, u32 lbo, u32 sbo, u64 layout = 1) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo >> 4) & 0x3FFF) << 16) |
           ((u64)((sbo >> 4) & 0x3FFF) << 32) | (layout << 62);
}

// Accumulator operand lists of the m64n16 .. m64n256 wgmma (generated, 8 per line).
#define WG_OUT_0_8 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define WG_OUT_0_16 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WG_OUT_0_32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_OUT_32_64 \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_OUT_0_64 WG_OUT_0_32, WG_OUT_32_64
#define WG_OUT_32_40 \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#define WG_OUT_32_48 \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define WG_OUT_64_128 \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define WG_OUT_64_96 \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define WG_REG_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define WG_REG_16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_REG_32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REG_40 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39"
#define WG_REG_48 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define WG_REG_64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REG_96 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63," \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_REG_128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63," \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95," \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

#define WG_ASM(SHAPE, TY, SETP, REGS, TAIL, ...)                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SETP ", 0;\n"                             \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" REGS "}, " TAIL \
                 : __VA_ARGS__                                                                 \
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))

// d (+)= A(64 x 16) * B(16 x N); scale_d = 0 ignores d's old value. TA/TB: M/N-major operand.
// N = 16 and 32 are the decode family's (gemm_decode.cu).
template <int N, int DT, int TA, int TB>
__device__ __forceinline__ void wgmma(float* d, u64 da, u64 db, int scale_d) {
    static_assert(N == 16 || N == 32 || N == 64 || N == 80 || N == 96 || N == 128 || N == 192 ||
                  N == 256, "BN is 16, 32, 64, 80, 96, 128, 192 or 256");
    if constexpr (N == 16 && DT == DT_BF16) {
        WG_ASM("m64n16k16", "bf16", "%10", WG_REG_8, "%8, %9, p, 1, 1, %11, %12;\n}\n",
               WG_OUT_0_8);
    } else if constexpr (N == 16) {
        WG_ASM("m64n16k16", "f16", "%10", WG_REG_8, "%8, %9, p, 1, 1, %11, %12;\n}\n",
               WG_OUT_0_8);
    } else if constexpr (N == 32 && DT == DT_BF16) {
        WG_ASM("m64n32k16", "bf16", "%18", WG_REG_16, "%16, %17, p, 1, 1, %19, %20;\n}\n",
               WG_OUT_0_16);
    } else if constexpr (N == 32) {
        WG_ASM("m64n32k16", "f16", "%18", WG_REG_16, "%16, %17, p, 1, 1, %19, %20;\n}\n",
               WG_OUT_0_16);
    } else if constexpr (N == 64 && DT == DT_BF16) {
        WG_ASM("m64n64k16", "bf16", "%34", WG_REG_32, "%32, %33, p, 1, 1, %35, %36;\n}\n",
               WG_OUT_0_32);
    } else if constexpr (N == 64) {
        WG_ASM("m64n64k16", "f16", "%34", WG_REG_32, "%32, %33, p, 1, 1, %35, %36;\n}\n",
               WG_OUT_0_32);
    } else if constexpr (N == 80 && DT == DT_BF16) {
        WG_ASM("m64n80k16", "bf16", "%42", WG_REG_40, "%40, %41, p, 1, 1, %43, %44;\n}\n",
               WG_OUT_0_32, WG_OUT_32_40);
    } else if constexpr (N == 80) {
        WG_ASM("m64n80k16", "f16", "%42", WG_REG_40, "%40, %41, p, 1, 1, %43, %44;\n}\n",
               WG_OUT_0_32, WG_OUT_32_40);
    } else if constexpr (N == 96 && DT == DT_BF16) {
        WG_ASM("m64n96k16", "bf16", "%50", WG_REG_48, "%48, %49, p, 1, 1, %51, %52;\n}\n",
               WG_OUT_0_32, WG_OUT_32_48);
    } else if constexpr (N == 96) {
        WG_ASM("m64n96k16", "f16", "%50", WG_REG_48, "%48, %49, p, 1, 1, %51, %52;\n}\n",
               WG_OUT_0_32, WG_OUT_32_48);
    } else if constexpr (N == 128 && DT == DT_BF16) {
        WG_ASM("m64n128k16", "bf16", "%66", WG_REG_64, "%64, %65, p, 1, 1, %67, %68;\n}\n",
               WG_OUT_0_64);
    } else if constexpr (N == 128) {
        WG_ASM("m64n128k16", "f16", "%66", WG_REG_64, "%64, %65, p, 1, 1, %67, %68;\n}\n",
               WG_OUT_0_64);
    } else if constexpr (N == 192 && DT == DT_BF16) {
        WG_ASM("m64n192k16", "bf16", "%98", WG_REG_96, "%96, %97, p, 1, 1, %99, %100;\n}\n",
               WG_OUT_0_64, WG_OUT_64_96);
    } else if constexpr (N == 192) {
        WG_ASM("m64n192k16", "f16", "%98", WG_REG_96, "%96, %97, p, 1, 1, %99, %100;\n}\n",
               WG_OUT_0_64, WG_OUT_64_96);
    } else if constexpr (DT == DT_BF16) {
        WG_ASM("m64n256k16", "bf16", "%130", WG_REG_128, "%128, %129, p, 1, 1, %131, %132;\n}\n",
               WG_OUT_0_64, WG_OUT_64_128);
    } else {
        WG_ASM("m64n256k16", "f16", "%130", WG_REG_128, "%128, %129, p, 1, 1, %131, %132;\n}\n",
               WG_OUT_0_64, WG_OUT_64_128);
    }
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Epilogue through shared memory and TMA for one consumer's 64 x BN half tile, 128 columns at
// a time (BN = 64: one pass of 64; BN = 192: 128, then 64): wait until the previous store has read the staging buffer, write alpha*acc (+ beta*Cin)
// as 16-bit pairs into two [64][64] boxes with the 128-byte swizzle (16-byte unit u of row r at
// u ^ (r % 8): conflict-free for this fragment layout), make the writes visible to the async
// proxy, and let thread 0 of the warpgroup issue the two TMA stores without waiting for them.
// r, c: this thread's first row and column in C; col0/row0: the half tile's origin.
// PIPE (gemm_wgmma_x's pipe_store, BN >= 128): 64 columns per pass into a ring of NBOX boxes
// at buffer (pass p in box (first_box + p) % NBOX), waiting only until the box's previous
// store (NBOX stores back) has been read, so writing one box overlaps the TMA reading the
// others (the plain form waits for every pass's store before the next pass). NBOX = 4: the
// ping-pong consumers' ring of a whole 128 x 128 tile (first_box 0 and 2 for its halves);
// NBOX = 1: the one box of a ring too deep for two (SMEM_MAX), each pass waiting for the last;
// with ALT the odd passes go to `alt` instead (the A half of the consumer's last stage, held
// until these stores have read it), so a pass waits only for the store two passes back.
// NOBETA: the caller knows beta == 0 (no per-element test of beta: LEAN_EPI).
// Narrow tiles (BN = 96, 80; box_width W = 32, 16): one pass into BN / W boxes of [64][W] with
// the 2W-byte swizzle (unit u of row r at u ^ ((r W / 64) % (W / 8)): conflict-free too), C's
// tensor map to match.
template <int DT, int BN, bool PIPE = false, int NBOX = 2, bool ALT = false, bool NOBETA = false>
__device__ __forceinline__ void store_half_tma(const float* d, const TmaDesc* map,
                                               const u16* __restrict__ Cin, int M, int N,
                                               i64 ldcin, float alpha, float beta, int r, int c,
                                               u32 buffer, int half, int t, int col0, int row0,
                                               int first_box = 0, u32 alt = 0) {
    const int row = r - row0;  // 0..63 (and row + 8)
    static_assert(!PIPE || NBOX == 1 || BN % 128 == 0,
                  "an even number of 64-wide passes per half tile (but in one box)");
    static_assert(!ALT || (PIPE && NBOX == 1), "ALT: 64-wide passes, one box and `alt`");
    constexpr int WIDTH = PIPE ? 64 : BN < 128 ? BN : 128;  // columns per pass (but the last)
    constexpr int CW = box_width(BN);  // columns per staging box (of CW * 128 bytes)
    static_assert(CW == 64 || (!PIPE && !ALT && NBOX == 2), "narrow tiles: one plain pass");
#pragma unroll
    for (int pass = 0; pass < (BN + WIDTH - 1) / WIDTH; ++pass) {
        if constexpr (ALT) {  // `alt` is fresh each tile; the box's last store: 2 passes back
            if (pass % 2 == 0) {  // (pass 0: the previous tile's last)
                if (t == 0 && pass == 0) bulk_wait_read<0>();
                if (t == 0 && pass > 0) bulk_wait_read<1>();
                named_sync(1 + half, 128);
            }
        } else {
            if (t == 0) bulk_wait_read<PIPE ? NBOX - 1 : 0>();
            named_sync(1 + half, 128);
        }
#pragma unroll
        for (int jj = 0; jj < WIDTH / 8; ++jj) {
            const int j = pass * (WIDTH / 8) + jj;
            if constexpr (BN % 128 != 0) {  // BN = 192's last pass: 64 columns
                if (j >= BN / 8) break;
            }
            const int cc = jj * 8 + (c - col0) % 8;  // column inside this 128-wide piece
            const u32 chunk = ALT && pass % 2 != 0
                ? alt : buffer + (PIPE ? (first_box + pass) % NBOX : cc / CW) * (CW * 128);
            const int byte = (cc % CW) * 2;
            // the row's 16-byte units XORed with its row bits 7-9 (128-byte swizzle: rows of
            // 128 bytes) or 7-8 (64-byte swizzle: rows of 64 bytes)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int rr = row + 8 * h;
                float v0 = alpha * d[4 * j + 2 * h], v1 = alpha * d[4 * j + 2 * h + 1];
                if (!NOBETA && beta != 0.f) {
                    const int gr = r + 8 * h, gc = c + 8 * j;
                    if (gr < M && gc < N) {
                        const u16* src = Cin + (i64)gr * ldcin + gc;
                        v0 += beta * to_f32<DT>(src[0]);
                        if (gc + 1 < N) v1 += beta * to_f32<DT>(src[1]);
                    }
                }
                const int units = CW == 64 ? rr & 7 : (rr * CW / 64) & (CW / 8 - 1);
                const u32 addr = chunk + rr * (2 * CW) + ((((byte >> 4) ^ units) << 4) | (byte & 15));
                st_shared_u32(addr, pack2<DT>(v0, v1));
            }
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_sync(1 + half, 128);
        if (t == 0) {
#pragma unroll
            for (int box = 0; box < WIDTH / CW; ++box) {
                if constexpr (BN % 128 != 0) {  // BN = 192's last pass: one box
                    if (pass * WIDTH + box * CW >= BN) continue;
                }
                const u32 src = ALT && pass % 2 != 0
                    ? alt : buffer + (PIPE ? (first_box + pass) % NBOX : box) * (CW * 128);
                tma_store(map, src, col0 + pass * WIDTH + box * CW, row0);
            }
            bulk_commit();
        }
    }
}

// The transposed product's value (OUT_T: the kernel computes C^T = B^T A^T) at its element
// (r, c) = C's (c, r): alpha * acc (+ beta * Cin[c][r]); M, N: C^T's rows and columns.
template <int DT, bool NOBETA>
__device__ __forceinline__ float value_t(float acc, const u16* __restrict__ Cin, int M, int N,
                                         i64 ldcin, float alpha, float beta, int r, int c) {
    float v = alpha * acc;
    if (!NOBETA && beta != 0.f && r < M && c < N)
        v += beta * to_f32<DT>(Cin[(i64)c * ldcin + r]);
    return v;
}

// OUT_T's epilogue for one consumer's 64 x BN slab of C^T, which is BN rows x 64 columns of C:
// stmatrix .trans writes each 8 x 8 block of the accumulator fragments transposed, 8 C rows of
// 16 bytes (8 columns), into one [BN][64] box with the 128-byte swizzle (unit u of row q at
// u ^ (q % 8): the 8 rows of a block on 8 different bank groups), which thread 0 stores with
// C's tensor map (box 64 columns x BN rows) at C's (col0, row0) = C^T's (row0, col0).
template <int DT, int BN, bool NOBETA>
__device__ __forceinline__ void store_half_tma_t(const float* d, const TmaDesc* map,
                                                 const u16* __restrict__ Cin, int M, int N,
                                                 i64 ldcin, float alpha, float beta, int r,
                                                 int c, u32 buffer, int half, int t, int col0,
                                                 int row0) {
    static_assert(BN % 16 == 0, "stmatrix x4: two 8-column groups of C^T at a time");
    // quad: the block (of the 4 an stmatrix x4 stores) one of whose rows this lane addresses
    const int warp = t / 32, lane = t % 32, quad = lane / 8;
    if (t == 0) bulk_wait_read<0>();  // the previous tile's store has read the box
    named_sync(1 + half, 128);
#pragma unroll
    for (int j = 0; j < BN / 8; j += 2) {
        u32 v[4];  // block q: columns 8 (j + q / 2) of C^T, rows + 8 (q % 2) of the warp's 16
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int jj = j + q / 2, h = q % 2;
            v[q] = pack2<DT>(
                value_t<DT, NOBETA>(d[4 * jj + 2 * h], Cin, M, N, ldcin, alpha, beta, r + 8 * h,
                                    c + 8 * jj),
                value_t<DT, NOBETA>(d[4 * jj + 2 * h + 1], Cin, M, N, ldcin, alpha, beta,
                                    r + 8 * h, c + 8 * jj + 1));
        }
        // this lane's row of block `quad` in the box: C row 8 (j + quad / 2) + lane % 8 of the
        // slab, its 16-byte unit 2 warp + quad % 2 (C columns 16 warp + 8 (quad % 2) + 0..7)
        const int row = 8 * (j + quad / 2) + lane % 8, unit = 2 * warp + quad % 2;
        const u32 addr = buffer + row * 128 + ((unit ^ (row & 7)) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                     ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                     : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_sync(1 + half, 128);
    if (t == 0) {
        tma_store(map, buffer, row0, col0);
        bulk_commit();
    }
}

// OUT_T's plain stores (C's rows not 16-byte aligned): one element at a time, C = (C^T)^T.
template <int DT, int BN>
__device__ __forceinline__ void store_half_t(const float* d, u16* __restrict__ C,
                                             const u16* __restrict__ Cin, int M, int N, i64 ldc,
                                             i64 ldcin, float alpha, float beta, int r, int c) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
        const int rr = r + 8 * ((i / 2) % 2), cc = c + 8 * (i / 4) + i % 2;
        if (rr < M && cc < N)
            C[(i64)cc * ldc + rr] = from_f32<DT>(
                value_t<DT, false>(d[i], Cin, M, N, ldcin, alpha, beta, rr, cc));
    }
}

// Split-K's ticket, taken by the 128 threads of consumer warpgroup `half` after each wrote its
// part of a slice: true (in all of them) when this is the last of the `splits` slices of the
// half tile to arrive. Then the counter is reset to 0 for the next launch, and the other
// slices, written by other CTAs before their tickets (__threadfence), are visible to loads
// that bypass L1 (__ldcg: sum_partial_pairs).
__device__ __forceinline__ bool last_of_tile(unsigned* counter, int splits, int half, int t) {
    __threadfence();  // this thread's slice stores, before the ticket
    named_sync(1 + half, 128);
    u32 last = 0;
    if (t == 0) {
        last = atomicAdd(counter, 1u) == (unsigned)splits - 1;
        if (last) {
            *counter = 0;  // every slice has arrived: nothing else touches it in this launch
            __threadfence();
        }
    }
    u32 any;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, 128, p;\n"
        "selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(any)
        : "r"(last), "r"(1 + half)
        : "memory");
    return any != 0;
}

// Ping-pong consumers (gemm_wgmma_x with PP): defined in kernels/gemm_wgmma_x.cu.
template <int DT, int BN, int STAGES, bool A_K, bool B_K, bool PS, class Release, class TileOf>
__device__ __forceinline__ void consume_pingpong(
    u32 a_ring, u32 b_ring, u32 full_bar, Release release, const TmaDesc& tma_c,
    u16* __restrict__ C, const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin,
    float alpha, float beta, int pair_ok, bool use_tma_store, u32 out_buffer, int half,
    int first, int step, int items, u32 a_lbo, u32 a_sbo, u32 b_lbo, u32 b_sbo,
    TileOf tile_of);

// Split-K's sum of consumer warpgroup `t`'s 64 x BN half tile at (row0, col0), for a half
// tile inside C with 16-byte rows in every slice (N and M x N multiples of 4), C taking 8-byte
// stores of 4 elements and beta = 0: consecutive threads on consecutive 16-byte column groups
// (a warp reads 512 contiguous bytes), the BN / 8 16-byte loads of SB slices in flight per
// thread (one L2 round trip per SB slices), slices added in order 0..splits-1 (the bits of
// sum_partial_pairs), then alpha, 4 elements stored at a time. SB: 32 loads of 16 bytes in
// flight per thread (4 slices at BN = 64, 2 at 128); GEMM_WG_SUM_SLICES overrides it (a
// timing aid).
#ifndef GEMM_WG_SUM_SLICES
#define GEMM_WG_SUM_SLICES (256 / BN)
#endif
template <int DT, int BN>
__device__ __forceinline__ void sum_half_tile_quads(u16* __restrict__ C,
                                                    const float* __restrict__ partial, i64 total,
                                                    int splits, int N, i64 ldc, float alpha,
                                                    int row0, int col0, int t) {
    constexpr int QUADS = BN / 4, PER = 64 * QUADS / 128, SB = GEMM_WG_SUM_SLICES;
    const float4* base = reinterpret_cast<const float4*>(partial + (i64)row0 * N + col0);
    const i64 step = total / 4, pitch = N / 4;  // one slice, one row, in 16-byte units
    float4 acc[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
    for (int first = 0; first < splits; first += SB, base += SB * step) {
        float4 got[SB][PER];
#pragma unroll
        for (int b = 0; b < SB; ++b) {
#pragma unroll
            for (int i = 0; i < PER; ++i) {
                const int q = t + 128 * i;
                got[b][i] = first + b < splits
                                ? __ldcg(base + b * step + (q / QUADS) * pitch + q % QUADS)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int b = 0; b < SB; ++b) {
            if (first + b >= splits) break;  // no "+ 0": it would turn a -0 sum into +0
#pragma unroll
            for (int i = 0; i < PER; ++i) {
                acc[i].x += got[b][i].x;
                acc[i].y += got[b][i].y;
                acc[i].z += got[b][i].z;
                acc[i].w += got[b][i].w;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int q = t + 128 * i;
        u16* dst = C + (i64)(row0 + q / QUADS) * ldc + col0 + 4 * (q % QUADS);
        *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<DT>(alpha * acc[i].x, alpha * acc[i].y),
                                                    pack2<DT>(alpha * acc[i].z, alpha * acc[i].w));
    }
}

}  // namespace wg

// The kernel body; SPLIT: the fused split-K kernel (gemm_wgmma_splitk), whose CTAs take
// tickets on `counters` after writing their slices (see the file comment). CN = 2, PP and PS:
// gemm_wgmma_x's variants (see there). BM = 64 and 192: gemm_wgmma_bm's tiles, one and three
// consumer warpgroups (256 and 512 threads), unsplit, clusters along M only, no ping-pong.
// OUT_T: gemm_wgmma_t's transposed output (the kernel's C is C^T; store_half_tma_t).
template <int DT, int BN, int STAGES, bool A_K, bool B_K, int CM, bool EPI_TMA, bool SPLIT,
          int CN = 1, bool PP = false, bool PS = false, int BM = wg::BM, int LEAN = 0,
          bool OUT_T = false>
__device__ __forceinline__ void gemm_wgmma_body(
    const wg::TmaDesc& tma_a, const wg::TmaDesc& tma_b, const wg::TmaDesc& tma_c,
    u16* __restrict__ C, const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin,
    float alpha, float beta, int group_m, int pair_ok, int tma_store_ok,
    float* __restrict__ partial, int splits, unsigned* __restrict__ counters) {
    using namespace wg;
    static_assert(CM == 1 || CM == 2, "clusters of 1 or 2 CTAs along M");
    static_assert(CM == 1 || BN >= 80, "a cluster multicasts chunks of B: BN >= 80");
    // narrow tiles (BN = 96): N-major B and staged C in 32-wide boxes, 64-byte swizzle
    constexpr bool NARROW = BN % 64 != 0;
    constexpr int BW = box_width(BN);  // N-major B's box width
    static_assert(!NARROW || ((BN == 96 || BN == 80) && !PP && !PS && !SPLIT && CN == 1),
                  "narrow tiles: BN = 96 or 80, unsplit, no ping-pong, pipe_store or cluster_n");
    static_assert(!OUT_T || (BN % 16 == 0 && BN <= 128 && !PP && !PS && !SPLIT && CN == 1),
                  "transposed output: BN = 64, 80, 96 or 128, unsplit, no ping-pong, "
                  "pipe_store or cluster_n");
    static_assert(CN == 1 || CN == 2, "clusters of 1 or 2 CTAs along N");
    static_assert(!PP || (BN <= 128 && !SPLIT), "ping-pong: one 128 x BN tile (BN <= 128) per "
                  "consumer, unsplit");
    static_assert(!(PP && PS) || BN == 128, "ping-pong's pipelined store: 128 x 128 tiles");
    static_assert(BM == 128 || ((BM == 64 || BM == 192) && CN == 1 && !PP && !SPLIT),
                  "64- and 192-row tiles: unsplit, clusters along M only, no ping-pong");
    constexpr int CONSUMERS = BM / 64;  // consumer warpgroups, one 64 x BN slab of the tile each
    constexpr int CS = CM * CN;  // CTAs per cluster: rank = rm + CM rn
    constexpr bool TAIL = (LEAN & LEAN_TAIL) != 0 && CS > 1;
    static_assert(!TAIL || !PP, "LEAN_TAIL: no ping-pong");
    // consumer warps reading one stage, in each CTA that one producer's copies land in (its
    // tile row's CN CTAs share A, its tile column's CM share B)
    constexpr int STAGE_READERS =
        (PP ? CONSUMER_WARPS / 2 : CONSUMER_WARPS * BM / 128) * (CM + CN - 1);
    constexpr u32 A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // 128-byte swizzle atoms must start at 1024-byte boundaries; the host adds 1 KiB of slack.
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const u32 a_ring = base, b_ring = base + STAGES * A_BYTES;
    // EPI_TMA: each consumer stages 64 x 128 pieces of its C half here (two 128-byte-swizzled
    // [64][64] boxes) and one of its threads stores them with TMA while the next tile starts.
    // (PP with PS: a whole 128 x 128 tile per consumer, the 4-box ring of store_half_tma;
    // ONE_BOX: one [64][64] box per consumer where two would not fit beside the ring)
    // (NARROW: the consumer's whole 64 x BN half tile, BN / BW boxes of [64][BW]; OUT_T: the
    // same bytes as one [BN][64] box of C)
    constexpr u32 HALF_OUT_BYTES = NARROW || OUT_T ? 64 * BN * 2 : STAGE_OUT_BYTES;
    constexpr bool ONE_BOX = EPI_TMA && !PP &&
        STAGES * (A_BYTES + B_BYTES + 16) + 1024 + CONSUMERS * HALF_OUT_BYTES > SMEM_MAX;
    static_assert(!(NARROW || OUT_T) || !ONE_BOX,
                  "narrow tiles, transposed output: stages that leave room to stage C");
    constexpr u32 OUT_BYTES =
        PP && PS ? 2 * STAGE_OUT_BYTES : ONE_BOX ? CHUNK_BYTES : HALF_OUT_BYTES;
    // ONE_BOX with PS (128 x 192, 5 stages, pipe_store): a consumer holds its tile's last stage
    // and stages every other 64-column pass in that stage's A half, which only its own wgmmas
    // read; the stage is released once those stores have read it.
    constexpr bool HOLD = ONE_BOX && PS;
    static_assert(!HOLD || (BN == 192 && !SPLIT), "HOLD: 3 passes of 64 columns, unsplit");
    const u32 out_stage = b_ring + STAGES * B_BYTES;
    const u32 full_bar = out_stage + (EPI_TMA ? CONSUMERS * OUT_BYTES : 0);
    const u32 empty_bar = full_bar + STAGES * 8;
    const bool use_tma_store = EPI_TMA && tma_store_ok != 0 && partial == nullptr;

    // With CM = 2 the two CTAs of a cluster take tile rows 2p and 2p + 1 of the same tile
    // column: each loads its own A and half of the shared B tile, multicast into both.
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int rows = (tiles_m + CM - 1) / CM;  // tile rows of clusters
    const int cols = CN == 1 ? tiles_n : (tiles_n + CN - 1) / CN;  // tile columns of clusters
    const int tiles = rows * cols, k_tiles = (K + BK - 1) / BK;
    const int items = tiles * splits, per_split = (k_tiles + splits - 1) / splits;
    const int rank = CS == 1 ? 0 : (int)cluster_rank();
    const int rm = CN == 1 ? rank : rank % CM, rn = CN == 1 ? 0 : rank / CM;
    const int first = blockIdx.x / CS, step = gridDim.x / CS;
    const int warpgroup = threadIdx.x / 128;

    // The producer's copies of K tile kt of tile (tm, tn) into ring slot it % STAGES, once
    // the consumers have released the slot's previous use.
    auto load_stage = [&](int it, int kt, int tm, int tn) {
        const int s = it % STAGES;
        mbar_wait(empty_bar + 8 * s, ((it / STAGES) & 1) ^ 1);
        const u32 full = full_bar + 8 * s;
        mbar_expect_tx(full, A_BYTES + B_BYTES);
        const u32 a_dst = a_ring + s * A_BYTES, b_dst = b_ring + s * B_BYTES;
        const int k0 = kt * BK;
        if constexpr (CN == 1) {
            tma_load_tile<A_K, BM>(a_dst, &tma_a, k0, tm * BM, full);
        } else {  // rows [64 rn, 64 rn + 64) of the A tile, into its tile row
            const auto a_mask = (unsigned short)((1 << rm) | (1 << (rm + CM)));
            const int part = rn * 64;
            if (A_K)
                tma_load_multicast(a_dst + part * 128, &tma_a, k0, tm * BM + part,
                                   full, a_mask);
            else
                tma_load_multicast(a_dst + rn * CHUNK_BYTES, &tma_a, tm * BM + part,
                                   k0, full, a_mask);
        }
        // with CM = 2: B's half, into the CTAs of its tile column
        const auto b_mask = (unsigned short)(CN == 1 ? 0x3 : 0x3 << (CM * rn));
        if (CM == 1) {
            tma_load_tile<B_K, BN, BW>(b_dst, &tma_b, k0, tn * BN, full);
        } else if (B_K) {  // rows [rm BN/2, (rm + 1) BN/2) of the B tile
            const int part = rm * (BN / 2);
            tma_load_multicast(b_dst + part * 128, &tma_b, k0, tn * BN + part, full,
                               b_mask);
        } else if constexpr (BN % 128 != 0) {  // BN = 192 (96, 80): BW-wide chunks 0, 2, .. | 1, ..
#pragma unroll
            for (int chunk = rm; chunk < BN / BW; chunk += 2)
                tma_load_multicast(b_dst + chunk * (BW * 128), &tma_b,
                                   tn * BN + chunk * BW, k0, full, b_mask);
        } else {  // 64-wide chunks [rm BN/128, (rm + 1) BN/128)
#pragma unroll
            for (int j = 0; j < BN / 128; ++j) {
                const int chunk = rm * (BN / 128) + j;
                tma_load_multicast(b_dst + chunk * CHUNK_BYTES, &tma_b,
                                   tn * BN + chunk * 64, k0, full, b_mask);
            }
        }
    };
    // LEAN_EARLY (one CTA, no cluster): the producer thread issues its first tile's first
    // STAGES K tiles right after initialising the barriers, before the CTA barrier, the
    // setmaxnreg and the tile arithmetic of the loop below; `early` of them.
    constexpr bool EARLY = (LEAN & LEAN_EARLY) != 0 && CS == 1 && !SPLIT;
    int early = 0;
    if (threadIdx.x == 0) {
        if constexpr ((LEAN & LEAN_EARLY) != 0) {
            prefetch_tensormap(&tma_a);
            prefetch_tensormap(&tma_b);
            if (use_tma_store) prefetch_tensormap(&tma_c);
        }
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, STAGE_READERS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        if constexpr (EARLY) {
            if (first < items) {
                int tm, tn;
                grouped_tile(first % tiles, rows, cols, max(group_m, 1), tm, tn);
                early = min(STAGES, k_tiles);
                for (int kt = 0; kt < early; ++kt) load_stage(kt, kt, tm, tn);
            }
        }
    }
    if constexpr (TAIL) {
        cluster_arrive_relaxed();
        cluster_wait();
    } else if (CS > 1) {
        cluster_sync();  // the peer's barriers exist before anything reaches them
    } else {
        __syncthreads();
    }

    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int it = 0;
            for (int item = first; item < items; item += step) {
                int tp, tn;
                grouped_tile(item % tiles, rows, cols, max(group_m / CM, 1), tp, tn);
                const int tm = tp * CM + rm;
                if constexpr (CN > 1) tn = tn * CN + rn;
                const int k_begin = item / tiles * per_split;
                const int k_end = min(k_tiles, k_begin + per_split);
                for (int kt = k_begin; kt < k_end; ++kt, ++it) {
                    if constexpr (EARLY) {
                        if (it < early) continue;  // issued before the CTA barrier
                    }
                    load_stage(it, kt, tm, tn);
                }
            }
            if constexpr (TAIL) {  // every stage's last use released, here and in the peer
                for (int j = 0; j < STAGES; ++j, ++it)
                    mbar_wait(empty_bar + 8 * (it % STAGES), ((it / STAGES) & 1) ^ 1);
            }
        }
    } else {
        // the producer's 40 and the consumers' registers within the 64 Ki of the SM
        constexpr int CONSUMER_REGS = BM == 192 ? 152 : 232;
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
        const int half = warpgroup - 1;  // rows [64 * half, 64 * half + 64) of the tile
        const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
        // Descriptor constants: K-major tiles step 32 bytes per 16 k inside the swizzle atom;
        // M/N-major tiles step 16 rows of 128 bytes, and their 64-wide chunks are CHUNK_BYTES apart.
        // (NARROW N-major B: 16 rows of 2 BW bytes, BW-wide chunks BW * 128 bytes apart, 8 rows
        // of 2 BW bytes from one 8-k group to the next, the 2 BW-byte swizzle)
        constexpr bool B_NARROW = NARROW && !B_K;
        constexpr u32 A_STEP = A_K ? 32 : 2048, B_STEP = B_K ? 32 : 32 * BW;
        constexpr u64 B_LAYOUT = B_K ? 1 : swizzle_layout(BW);
#if GEMM_MN_DESC_SWAP  // debugging aid: the other reading of LBO/SBO for M/N-major operands
        constexpr u32 A_LBO = A_K ? 16 : 1024, B_LBO = B_K ? 16 : 1024;
        constexpr u32 A_SBO = A_K ? 1024 : CHUNK_BYTES, B_SBO = B_K ? 1024 : CHUNK_BYTES;
#else
        constexpr u32 A_LBO = A_K ? 16 : CHUNK_BYTES, B_LBO = B_K ? 16 : BW * 128;
        constexpr u32 A_SBO = 1024, B_SBO = B_NARROW ? 16 * BW : 1024;
#endif
        const u32 a_half = A_K ? half * 64 * 128 : half * CHUNK_BYTES;
        // LEAN_DESC: slot 0's descriptors; a slot's and a k step's differ in the address field
        // alone (bits 0-13, address / 16, which stays below 2^14 inside shared memory)
        const u64 a_desc0 = make_desc(a_ring + a_half, A_LBO, A_SBO);
        const u64 b_desc0 = make_desc(b_ring, B_LBO, B_SBO, B_LAYOUT);
        // a descriptor whose low word (the address field) is moved by `units` of 16 bytes
        auto moved = [](u64 desc, u32 units) {
            return (desc & ~0xFFFFFFFFull) | (u32)((u32)desc + units);
        };
        // A stage is free once every consumer warp of every CTA it was multicast to is done.
        auto release = [&](int s) {
            if (lane == 0) {
                mbar_arrive(empty_bar + 8 * s);
                if constexpr (CN == 1) {
                    if (CM > 1) mbar_arrive_remote(empty_bar + 8 * s, rank ^ 1);
                } else {  // the peer sharing A, and with CM = 2 the one sharing B
                    mbar_arrive_remote(empty_bar + 8 * s, rm + CM * (rn ^ 1));
                    if (CM > 1) mbar_arrive_remote(empty_bar + 8 * s, (rm ^ 1) + CM * rn);
                }
            }
        };
        if constexpr (PP) {
            consume_pingpong<DT, BN, STAGES, A_K, B_K, PS>(
                a_ring, b_ring, full_bar, release, tma_c, C, Cin, M, N, K, ldc, ldcin, alpha,
                beta, pair_ok, use_tma_store, out_stage + half * OUT_BYTES, half,
                first, step, items, A_LBO, A_SBO, B_LBO, B_SBO,
                [&](int item, int& tm, int& tn) {
                    grouped_tile(item % tiles, rows, cols, max(group_m / CM, 1), tm, tn);
                    tm = tm * CM + rm;
                    tn = tn * CN + rn;
                });
        }
        int it = 0;
        // (with PP the ping-pong consumers above took every item: this loop runs none)
        for (int item = PP ? items : first; item < items; item += step) {
            int tp, tn;
            grouped_tile(item % tiles, rows, cols, max(group_m / CM, 1), tp, tn);
            const int tm = tp * CM + rm;
            if constexpr (CN > 1) tn = tn * CN + rn;
            const int split = item / tiles, k_begin = split * per_split;
            const int k_end = min(k_tiles, k_begin + per_split);
            float d[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
            int prev = 0;
            for (int kt = k_begin; kt < k_end; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(full_bar + 8 * s, (it / STAGES) & 1);
                const u32 a_tile = a_ring + s * A_BYTES + a_half, b_tile = b_ring + s * B_BYTES;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {
                    u64 da, db;
                    if constexpr ((LEAN & LEAN_DESC) != 0) {
                        da = moved(a_desc0, (u32)s * (A_BYTES / 16) + kk * (A_STEP / 16));
                        db = moved(b_desc0, (u32)s * (B_BYTES / 16) + kk * (B_STEP / 16));
                    } else {
                        da = make_desc(a_tile + kk * A_STEP, A_LBO, A_SBO);
                        db = make_desc(b_tile + kk * B_STEP, B_LBO, B_SBO, B_LAYOUT);
                    }
                    wgmma<BN, DT, A_K ? 0 : 1, B_K ? 0 : 1>(d, da, db,
                                                          (kt > k_begin || kk > 0) ? 1 : 0);
                }
                wgmma_commit();
                if (kt > k_begin) {
                    wgmma_wait<1>();
                    release(prev);
                }
                prev = s;
            }
            wgmma_wait<0>();
            if (k_end > k_begin && !(HOLD && use_tma_store)) release(prev);

            // d[4j + 2h + e] is element (16 warp + lane/4 + 8h, 8j + 2(lane%4) + e) of the half.
            const int r = tm * BM + half * 64 + warp * 16 + lane / 4;
            const int c = tn * BN + (lane % 4) * 2;
            if (partial != nullptr) {  // split-K: raw sums (zeros for an empty K slice)
                float* slice = partial + (i64)split * M * N;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int rr = r + 8 * h, cc = c + 8 * j;
                        if (rr >= M || cc >= N) continue;
                        const i64 at = (i64)rr * N + cc;
                        if (cc + 1 < N && (((i64)split * M * N + at) & 1) == 0) {
                            *reinterpret_cast<float2*>(slice + at) =
                                make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
                        } else {
                            slice[at] = d[4 * j + 2 * h];
                            if (cc + 1 < N) slice[at + 1] = d[4 * j + 2 * h + 1];
                        }
                    }
                }
                if constexpr (!SPLIT) {
                    continue;
                } else {
                    if (!last_of_tile(counters + (item % tiles) * 2 + half, splits, half, t))
                        continue;
                    if constexpr (BN <= 128) {  // BN = 256 would spill: the loop below
                        const int row0 = tm * BM + half * 64, col0 = tn * BN;
                        // pair_ok bit 1: C's base and pitch take 4-element stores (the host)
                        if (beta == 0.f && (pair_ok & 2) != 0 && row0 + 64 <= M &&
                            col0 + BN <= N && (N & 3) == 0 && (((i64)M * N) & 3) == 0) {
                            sum_half_tile_quads<DT, BN>(C, partial, (i64)M * N, splits, N, ldc,
                                                        alpha, row0, col0, t);
                            continue;
                        }
                    }
                    // the last CTA of the half tile: sum the slices in order 0..splits-1 and
                    // store, 8 of the thread's pairs at a time (a loop, not unrolled: BN = 256
                    // would spill)
                    constexpr int NP = 8;
#pragma unroll 1
                    for (int q0 = 0; q0 < BN / 4; q0 += NP) {
                        int rr[NP], cc[NP], count[NP];
                        i64 at[NP];
                        float v0[NP], v1[NP];
#pragma unroll
                        for (int p = 0; p < NP; ++p) {
                            rr[p] = r + 8 * ((q0 + p) & 1);
                            cc[p] = c + 8 * ((q0 + p) >> 1);
                            at[p] = (i64)rr[p] * N + cc[p];
                            count[p] = rr[p] >= M || cc[p] >= N ? 0 : (cc[p] + 1 < N ? 2 : 1);
                        }
                        sum_partial_pairs<NP, 4>(partial, (i64)M * N, splits, at, count, v0, v1);
#pragma unroll
                        for (int p = 0; p < NP; ++p)
                            store_pair<DT>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, rr[p],
                                           cc[p], v0[p], v1[p], pair_ok != 0);
                    }
                    continue;
                }
            }
            if constexpr (OUT_T) {  // C^T's slab, transposed into C
                constexpr bool NOBETA = (LEAN & LEAN_EPI) != 0;
                const int col0 = tn * BN, row0 = tm * BM + half * 64;
                const u32 buffer = out_stage + half * OUT_BYTES;
                if (!use_tma_store)
                    store_half_t<DT, BN>(d, C, Cin, M, N, ldc, ldcin, alpha, beta, r, c);
                else if (NOBETA && beta == 0.f)
                    store_half_tma_t<DT, BN, NOBETA>(d, &tma_c, Cin, M, N, ldcin, alpha, beta,
                                                     r, c, buffer, half, t, col0, row0);
                else
                    store_half_tma_t<DT, BN, false>(d, &tma_c, Cin, M, N, ldcin, alpha, beta,
                                                    r, c, buffer, half, t, col0, row0);
                continue;
            }
            if (use_tma_store) {
                if constexpr (HOLD) {  // passes 0, 2 in the own box, 1 in the held stage
                    store_half_tma<DT, BN, true, 1, true>(
                        d, &tma_c, Cin, M, N, ldcin, alpha, beta, r, c,
                        out_stage + half * CHUNK_BYTES, half, t, tn * BN, tm * BM + half * 64, 0,
                        a_ring + prev * A_BYTES + a_half);
                    if (t == 0) bulk_wait_read<1>();  // pass 1's store has read the stage
                    named_sync(1 + half, 128);
                    release(prev);
                } else {
                    // (two calls, not a generic lambda: NVRTC 13 takes those for host code)
                    constexpr bool NOBETA = (LEAN & LEAN_EPI) != 0;
                    constexpr int NBOX = ONE_BOX ? 1 : 2;
                    const u32 buffer =
                        out_stage + half * (ONE_BOX ? CHUNK_BYTES : HALF_OUT_BYTES);
                    if (NOBETA && beta == 0.f)
                        store_half_tma<DT, BN, PS || ONE_BOX, NBOX, false, NOBETA>(
                            d, &tma_c, Cin, M, N, ldcin, alpha, beta, r, c, buffer, half, t,
                            tn * BN, tm * BM + half * 64);
                    else
                        store_half_tma<DT, BN, PS || ONE_BOX, NBOX>(
                            d, &tma_c, Cin, M, N, ldcin, alpha, beta, r, c, buffer, half, t,
                            tn * BN, tm * BM + half * 64);
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                store_pair<DT>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r, c + 8 * j,
                               d[4 * j], d[4 * j + 1], pair_ok != 0);
                store_pair<DT>(C, Cin, nullptr, M, N, ldc, ldcin, alpha, beta, r + 8, c + 8 * j,
                               d[4 * j + 2], d[4 * j + 3], pair_ok != 0);
            }
        }
        if (use_tma_store && t == 0) bulk_wait_all();  // the stores are done before the CTA ends
    }
    // no CTA leaves while its peer may still write into it or arrive on it
    if constexpr (CS > 1 && !TAIL) cluster_sync();
}

template <int DT, int BN, int STAGES, bool A_K, bool B_K, int CM, bool EPI_TMA>
__global__ void __launch_bounds__(wg::THREADS, 1)
gemm_wgmma(const __grid_constant__ wg::TmaDesc tma_a, const __grid_constant__ wg::TmaDesc tma_b,
           const __grid_constant__ wg::TmaDesc tma_c, u16* __restrict__ C,
           const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin, float alpha,
           float beta, int group_m, int pair_ok, int tma_store_ok, float* __restrict__ partial,
           int splits) {
    gemm_wgmma_body<DT, BN, STAGES, A_K, B_K, CM, EPI_TMA, false>(
        tma_a, tma_b, tma_c, C, Cin, M, N, K, ldc, ldcin, alpha, beta, group_m, pair_ok,
        tma_store_ok, partial, splits, nullptr);
}

// BM != 128: 64- and 192-row tiles (Config.bm), BM / 64 consumer warpgroups (128 + 2 BM
// threads), each taking a 64-row slab of the tile with the same m64nBNk16 wgmma and epilogue.
// BM = 64: one consumer (256 threads), twice as many tiles as 128-row ones, for grids those
// leave half idle (1000^3, 1024^3: cuBLAS's 64 x 128); PS: the pipelined TMA-store epilogue.
// BM = 192 (BN = 128 or 192): three consumers (512 threads), cuBLAS's tile shapes at grids
// that 128-row tiles fill badly (3000^3: 256 tiles of 192 x 192 make 1.94 waves, 576 of
// 128 x 128 4.4). Unsplit, no ping-pong, clusters along M only (B multicast as gemm_wgmma's).
// LEAN (any BM, 128 too): the wg::LEAN_* bits for grids of about one tile per CTA, where the
// per-tile fixed cost is not spread over several tiles.
template <int DT, int BM, int BN, int STAGES, bool A_K, bool B_K, int CM, bool EPI_TMA,
          bool PS = false, int LEAN = 0>
__global__ void __launch_bounds__(128 + 2 * BM, 1)
gemm_wgmma_bm(const __grid_constant__ wg::TmaDesc tma_a, const __grid_constant__ wg::TmaDesc tma_b,
              const __grid_constant__ wg::TmaDesc tma_c, u16* __restrict__ C,
              const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin, float alpha,
              float beta, int group_m, int pair_ok, int tma_store_ok, float* __restrict__ partial,
              int splits) {
    gemm_wgmma_body<DT, BN, STAGES, A_K, B_K, CM, EPI_TMA, false, 1, false, PS, BM, LEAN>(
        tma_a, tma_b, tma_c, C, Cin, M, N, K, ldc, ldcin, alpha, beta, group_m, pair_ok,
        tma_store_ok, nullptr, 1, nullptr);
}

// C^T = B^T A^T (Config.swap): gemm_wgmma_bm's kernel on the transposed problem (the host swaps
// A and B, M and N: this kernel's M runs along C's columns), storing its C^T tiles transposed
// into C (store_half_tma_t), so a tile narrow in C's rows (cuBLAS's 192 x 96, 64 x 80) reads
// its operands in 128-byte box rows: A^T's rows K-major, B^T's M-major. Unsplit, BN <= 128.
template <int DT, int BM, int BN, int STAGES, bool A_K, bool B_K, int CM, bool EPI_TMA,
          int LEAN = 0>
__global__ void __launch_bounds__(128 + 2 * BM, 1)
gemm_wgmma_t(const __grid_constant__ wg::TmaDesc tma_a, const __grid_constant__ wg::TmaDesc tma_b,
             const __grid_constant__ wg::TmaDesc tma_c, u16* __restrict__ C,
             const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin, float alpha,
             float beta, int group_m, int pair_ok, int tma_store_ok, float* __restrict__ partial,
             int splits) {
    gemm_wgmma_body<DT, BN, STAGES, A_K, B_K, CM, EPI_TMA, false, 1, false, false, BM, LEAN,
                    true>(tma_a, tma_b, tma_c, C, Cin, M, N, K, ldc, ldcin, alpha, beta, group_m,
                          pair_ok, tma_store_ok, nullptr, 1, nullptr);
}

// Split-K in one launch: `partial` holds splits x M x N fp32 slices, `counters` one zeroed
// ticket counter per half tile (2 x tiles; the kernel leaves them zero).
template <int DT, int BN, int STAGES, bool A_K, bool B_K, int CM, bool EPI_TMA>
__global__ void __launch_bounds__(wg::THREADS, 1)
gemm_wgmma_splitk(const __grid_constant__ wg::TmaDesc tma_a,
                  const __grid_constant__ wg::TmaDesc tma_b,
                  const __grid_constant__ wg::TmaDesc tma_c, u16* __restrict__ C,
                  const u16* __restrict__ Cin, int M, int N, int K, i64 ldc, i64 ldcin,
                  float alpha, float beta, int group_m, int pair_ok, int tma_store_ok,
                  float* __restrict__ partial, int splits, unsigned* __restrict__ counters) {
    static_assert(CM == 1, "split-K runs without clusters");
    gemm_wgmma_body<DT, BN, STAGES, A_K, B_K, CM, EPI_TMA, true>(
        tma_a, tma_b, tma_c, C, Cin, M, N, K, ldc, ldcin, alpha, beta, group_m, pair_ok,
        tma_store_ok, partial, splits, counters);
}
