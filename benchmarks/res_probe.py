"""Probe (issue 17, session 19): can TMA read a 16-bit matrix whose row pitch is not a 16-byte
multiple, through 8 tensor maps, one per residue class of the row index mod 8?

Rows r, r + 8, r + 16, ... of such a matrix are 16 * ld bytes apart (a 16-byte multiple), so
map r has base = row r's start rounded down to 16 bytes (s_r elements before it), inner extent
width + s_r, row pitch 8 * ld, and box (64 elements, 8 rows) starting at inner coordinate
col + s_r. This checks (1) that such boxes arrive intact (TMA taking inner coordinates that are
not 16-byte multiples, the zero fill past the width and past the last row), and (2) how fast
a ring of such boxes streams a 90 MB matrix against one map over the same matrix padded to an
aligned pitch. Prints PASS/FAIL lines and the times; ``--json PATH`` writes them.

Answer (session 19, an H100 80GB HBM3): no. probe_one's aligned 64 x 64 box passes; every
residue box whose start is not a 16-byte multiple (any s_r > 0) stops the kernel with
CUDA_ERROR_ILLEGAL_INSTRUCTION at the cp.async.bulk.tensor: a TMA box must start at a
16-byte aligned address, whatever its map's base and strides, so rows of an odd pitch cannot
reach the wgmma kernels without being copied or loaded by threads.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

import gpurt
from gpurt.kernels import _gemm_launch as launch
from gpurt.kernels._gemm_types import DT_BF16

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
struct __align__(64) Desc { u64 opaque[16]; };
struct Maps { Desc m[8]; };

__device__ __forceinline__ u32 saddr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void bar_init(u32 bar, u32 n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(n));
}
__device__ __forceinline__ void bar_wait(u32 bar, u32 parity) {
    asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra W;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bar_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void load(u32 dst, const Desc* map, int inner, int outer, u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst), "l"((u64)map), "r"(inner),
                 "r"(outer), "r"(bar) : "memory");
}

// One box of map `which` at (inner, outer) into a 1024-aligned tile, copied out raw.
extern "C" __global__ void probe_box(const __grid_constant__ Maps maps, unsigned short* out,
                                     int inner, int outer, int which) {
    extern __shared__ __align__(1024) unsigned char raw[];
    const u32 at = (saddr(raw) + 1023) & ~1023u, b = at + 1024;
    const unsigned short* tile = reinterpret_cast<const unsigned short*>(raw + (at - saddr(raw)));
    if (threadIdx.x == 0) {
        bar_init(b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        bar_tx(b, 1024);
        load(at, &maps.m[which], inner, outer, b);
    }
    bar_wait(b, 0);
    for (int i = threadIdx.x; i < 8 * 64; i += blockDim.x) out[i] = tile[i];
}

// probe_box with one map passed alone (is a struct of 8 the trouble?)
extern "C" __global__ void probe_one(const __grid_constant__ Desc map, unsigned short* out,
                                     int inner, int outer, int box_bytes) {
    extern __shared__ __align__(1024) unsigned char raw[];
    const u32 at = (saddr(raw) + 1023) & ~1023u, b = at + 8192;
    if (threadIdx.x == 0) {
        bar_init(b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        bar_tx(b, box_bytes);
        load(at, &map, inner, outer, b);
    }
    bar_wait(b, 0);
    const unsigned short* tile = reinterpret_cast<const unsigned short*>(raw + (at - saddr(raw)));
    for (int i = threadIdx.x; i < box_bytes / 2; i += blockDim.x) out[i] = tile[i];
}

// Stream [rows][width] in tiles of 64 columns x 64 rows through a ring: RES, 8 boxes of 8
// rows of residue r each (map r); else one [64][64] box of map 0. One producer thread, one
// consumer warp that only releases stages (and sums a word so the loads are used).
template <bool RES>
__global__ void __launch_bounds__(64) stream(const __grid_constant__ Maps maps, int width,
                                             int rows, const int* shift, unsigned* sink) {
    constexpr int STAGES = 12;
    extern __shared__ __align__(1024) unsigned char raw[];
    const u32 base = (saddr(raw) + 1023) & ~1023u;
    const u32 full = base + STAGES * 8192, empty = full + STAGES * 8;
    const int col_tiles = (width + 63) / 64, row_tiles = (rows + 63) / 64;
    const int tiles = col_tiles * row_tiles;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            bar_init(full + 8 * s, 1);
            bar_init(empty + 8 * s, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 32) {
        int it = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++it) {
            const int s = it % STAGES;
            bar_wait(empty + 8 * s, ((it / STAGES) & 1) ^ 1);
            bar_tx(full + 8 * s, 8192);
            const int c0 = (t % col_tiles) * 64, r0 = (t / col_tiles) * 64;
            const u32 dst = base + s * 8192;
            if (RES) {
#pragma unroll
                for (int r = 0; r < 8; ++r)
                    load(dst + r * 1024, &maps.m[r], c0 + shift[r], r0 / 8, full + 8 * s);
            } else {
                load(dst, &maps.m[0], c0, r0, full + 8 * s);
            }
        }
    } else if (threadIdx.x < 32) {
        unsigned acc = 0;
        int it = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++it) {
            const int s = it % STAGES;
            bar_wait(full + 8 * s, (it / STAGES) & 1);
            acc += *reinterpret_cast<const unsigned*>(raw + (base - saddr(raw)) + s * 8192 +
                                                      4 * threadIdx.x);
            __syncwarp();
            if (threadIdx.x == 0) bar_arrive(empty + 8 * s);
        }
        if (acc == 0x12345678u) sink[0] = acc;
    }
}
"""


def residue_maps(ptr: int, width: int, rows: int, ld: int) -> tuple[bytes, list[int]]:
    """The 8 residue maps of a bf16 [rows][width] matrix at ``ptr`` (rows ``ld`` apart) and
    each one's shift s_r (elements its base lies before row r's start)."""
    maps, shifts = [], []
    for r in range(8):
        start = ptr + 2 * r * ld
        s = (start % 16) // 2
        outer = max(1, -(-(rows - r) // 8))
        maps.append(launch.encode_map(start - 2 * s, width + s, outer, 8 * ld, DT_BF16,
                                      (64, 8)))
        shifts.append(s)
    return b"".join(maps), shifts


def unswizzle(tile: np.ndarray) -> np.ndarray:
    """A [8][64] 16-bit box written with the 128-byte swizzle, back in row order."""
    rows = tile.reshape(8, 8, 8)  # row, 16-byte chunk, element
    return np.stack([rows[i][[c ^ i for c in range(8)]] for i in range(8)]).reshape(8, 64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--phase", choices=("box", "stream", "one", "one-res"),
                        default="box")
    args = parser.parse_args()
    module = gpurt.compile(SOURCE, ("-std=c++17",), name_expressions=[
        "probe_box", "probe_one", "stream<true>", "stream<false>"], arch="sm_90a")
    results: dict = {"device": gpurt.get_device_name(0), "checks": [], "times": {}}
    failed = 0
    if args.phase == "stream":
        _stream(module, results)
    if args.phase in ("one", "one-res"):
        _one(module, args.phase == "one-res")
    rng = np.random.default_rng(1)
    for rows, width, ld, offset in ((4099, 11003, 11003, 0), (4099, 4093, 4093, 0),
                                    (37, 301, 305, 3), (100, 4099, 4101, 1)):
        host = rng.integers(1, 60000, size=rows * ld + offset + 8, dtype=np.uint16)
        dev = gpurt.asarray(host)
        ptr = dev.ptr + 2 * offset
        maps, shifts = residue_maps(ptr, width, rows, ld)
        out = gpurt.empty(8 * 64, dtype=np.uint16)
        mat = host[offset:offset + rows * ld].reshape(rows, ld)
        for col in sorted({0, 64 * ((width - 1) // 64), 64 * (width // 128)}):
            for row0 in sorted({0, 64 * ((rows - 1) // 64)}):
                for r in range(8):
                    probe = module["probe_box"]
                    probe(1, 128, (maps, out.ptr, col + shifts[r], row0 // 8, r), shared_mem=4096)
                    gpurt.synchronize()
                    got = unswizzle(out.numpy())
                    want = np.zeros((8, 64), np.uint16)
                    for i in range(8):
                        k = row0 + r + 8 * i
                        if k < rows:
                            part = mat[k, col:min(col + 64, width)]
                            want[i, :len(part)] = part
                    ok = bool((got == want).all())
                    failed += not ok
                    name = f"{rows}x{width} ld{ld} +{offset} col{col} row{row0} r{r}"
                    results["checks"].append([name, ok])
                    if not ok:
                        print("FAIL", name, np.argwhere(got != want)[:4].tolist())
        print("PASS" if not failed else "FAIL", f"box checks {rows}x{width} ld{ld} +{offset}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    sys.exit(1 if failed else 0)


def _one(module: Any, res: bool) -> None:
    """One box through probe_one: an aligned 64 x 64 map (the gemm's kind), or residue map 1
    of an unaligned matrix; prints whether it matched, then exits."""
    rows, width = 300, 301
    ld = 304 if not res else 301
    host = np.random.default_rng(2).integers(1, 60000, size=rows * ld + 8, dtype=np.uint16)
    dev = gpurt.asarray(host)
    mat = host[:rows * ld].reshape(rows, ld)
    out = gpurt.empty(64 * 64, dtype=np.uint16)
    if res:
        maps, shifts = residue_maps(dev.ptr, width, rows, ld)
        tmap, inner, outer, box = maps[128:256], 64 + shifts[1], 1, 1024
        want = np.stack([mat[1 + 8 + 8 * i, 64:128] for i in range(8)])
    else:
        tmap = launch.encode_map(dev.ptr, width, rows, ld, DT_BF16, (64, 64))
        inner, outer, box = 64, 64, 8192
        want = mat[64:128, 64:128]
    module["probe_one"](1, 128, (tmap, out.ptr, inner, outer, box), shared_mem=9216 + 1024)
    gpurt.synchronize()
    got = out.numpy()[:box // 2]
    got = np.concatenate([unswizzle(part) for part in got.reshape(-1, 8, 64)])
    print("PASS" if (got == want).all() else "FAIL", "one box", "residue" if res else "aligned")
    sys.exit(0)


def _stream(module: Any, results: dict) -> None:
    """4099 x 11003 bf16 (90 MB) streamed through residue maps and through one map of an
    aligned copy: the times, printed; then exits."""
    rows, width = 4099, 11003
    big = gpurt.empty(rows * width + 64, dtype=np.uint16)
    aligned = gpurt.empty(rows * 11008, dtype=np.uint16)
    maps, shifts = residue_maps(big.ptr + 2, width, rows, width)
    plain = launch.encode_map(aligned.ptr, width, rows, 11008, DT_BF16, (64, 64)) + \
        bytes(7 * 128)
    shift = gpurt.asarray(np.array(shifts, np.int32))
    sink = gpurt.empty(4, dtype=np.uint32)
    sms = gpurt.get_device_properties(0).multi_processor_count
    smem = 12 * 8192 + 12 * 16 + 1024
    start, end = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
    for res, margs in ((True, maps), (False, plain)):
        kern = module[f"stream<{str(res).lower()}>"]
        times = []
        for rep in range(30):
            for grid in (sms, 2 * sms):
                if rep == 0 or grid == sms:
                    start.record()
                    kern(grid, 64, (margs, width, rows, shift.ptr, sink.ptr), shared_mem=smem)
                    end.record()
                    end.synchronize()
                    if grid == sms:
                        times.append(start.elapsed_time(end) * 1e3)
        us = float(np.median(times[5:]))
        results["times"]["residue" if res else "aligned"] = us
        print(f"stream {'residue' if res else 'aligned'}: {us:.1f} us = "
              f"{rows * width * 2 / us / 1e6:.2f} TB/s")
    print(json.dumps(results["times"]))
    sys.exit(0)


if __name__ == "__main__":
    main()
