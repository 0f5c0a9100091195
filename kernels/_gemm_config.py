"""What a GEMM kernel variant is (:class:`Config`: family, tiles, stages, split, epilogue; its
threads, shared memory, template instantiation and source) and what a choice depends on
(:class:`Problem`: sizes, element type, layouts, alignment, device). Plain data, shared by
kernels/_gemm_tune.py (which variants may run, which to use) and kernels/_gemm_launch.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _gemm_decode as _decode
from . import _gemm_rowload as _rowload
from . import _gemm_skinny as _skinny
from ._gemm_types import DT_TF32

__all__ = ["Config", "Problem"]

# The dynamic shared memory per block of sm_90 (227 KiB; gemm_wgmma.cu's SMEM_MAX): the 16-bit
# wgmma kernel stages C through one box per consumer where two would not fit beside the ring.
_SMEM_SM90 = 227 * 1024


@dataclasses.dataclass(frozen=True)
class Config:
    """One kernel variant. ``kernel``: 'simt' (exact fp32), 'mma' (mma.sync, sm_80+), 'wgmma'
    (TMA + wgmma, sm_90a; bk = 64 for 16-bit types, bk = 32 for TF32, kernels/gemm_wgmma_tf32.cu)
    'skinny' (decode shapes: one side of C at most a few dozen, the
    big operand streamed once; kernels/_gemm_skinny.py says what its fields mean) or 'decode'
    (TMA + wgmma with the small side of C on wgmma's N, sm_90a; kernels/_gemm_decode.py) or
    'rowload' (a few rows of A times an N-major B streamed with aligned loads on rows of any
    pitch; kernels/_gemm_rowload.py). Tile
    ``bm x bn x bk``; ``wm x wn`` is a warp's tile (mma);
    ``stages`` the shared-memory ring depth; ``split_k`` > 1 splits K over CTAs (fp32
    partial sums; the last CTA of each tile sums them, in the same launch);
    ``group_m`` tile rows per group of the grid order;
    ``cluster_m`` = 2 pairs wgmma CTAs in clusters that share (multicast) their B tiles;
    ``tma_store``: the wgmma epilogue goes through shared memory and TMA stores (when the
    output's rows are 16-byte aligned; plain stores otherwise);
    ``cluster_n`` = 2 pairs 16-bit wgmma CTAs along N in clusters (of cluster_m x cluster_n)
    that share (multicast) their A tiles; ``pingpong``: each wgmma consumer warpgroup takes
    whole tiles in turn, so one's epilogue overlaps the other's main loop (bn <= 128);
    ``pipe_store``: the TMA-store epilogue writes 64 columns at a time into two staging boxes
    in turn, each written while the other's store is read (bn 128 or 256, with tma_store; with
    pingpong a ring of four, a whole tile per consumer; 128 x 192 with 5 stages: one box and
    the A half of the tile's last stage, held until the stores have read it).
    ``lean`` (unsplit 16-bit wgmma without cluster_n or pingpong; kernels/gemm_wgmma.cu's
    gemm_wgmma_bm): bits that cut the fixed cost of a CTA's tile, for grids of about one
    tile per CTA: 1 descriptors by offset (the K loop's address arithmetic), 2 the first
    stages' copies before the CTA barrier (tensor maps prefetched), 4 an epilogue without the
    per-element beta test when beta == 0; with ``cluster_m`` = 2: 16 no cluster barrier at
    the end at all: the producer waits until every stage's last use is released by both CTAs'
    consumers (a cluster-scope release-arrive costs ~0.7 us on an H100). Bit 8 is gone twice:
    session 12's stores straight from the registers and session 15's split end barrier each
    lost or tied wherever they were timed against what replaced them.
    The 16-bit wgmma kernel also takes 128 x 192 tiles (unsplit; 4 stages and two 64-wide
    staging boxes per consumer fill shared memory, or 5 stages, cuBLAS's depth, and one box),
    which make whole waves where 128 x 256 ones leave a last wave mostly idle, and 64-row
    tiles (``bm`` = 64: one consumer warpgroup, unsplit, clusters along M only, no ping-pong),
    which fill the SMs where 128-row ones leave half of them idle (1000^3), and
    192-row tiles (``bm`` = 192, bn 128 or 192: three consumer warpgroups, unsplit, clusters
    along M only), cuBLAS's tiles at 3000^3 and 2000x3000x1000.
    ``swap`` (16-bit wgmma, unsplit, bn 64, 80, 96 or 128, no cluster_n, pingpong or
    pipe_store; kernels/gemm_wgmma.cu's gemm_wgmma_t): the kernel computes C^T = B^T A^T, so
    ``bm`` runs along C's columns and ``bn`` along its rows (cuBLAS's naming: "192x96" is 96 of
    C's rows by 192 columns), and stores its tiles transposed into C; a row-major A and B are
    then read in 128-byte box rows whatever ``bn``."""

    kernel: str
    bm: int
    bn: int
    bk: int
    wm: int = 0
    wn: int = 0
    stages: int = 2
    split_k: int = 1
    group_m: int = 8
    cluster_m: int = 1
    tma_store: bool = False
    cluster_n: int = 1
    pingpong: bool = False
    pipe_store: bool = False
    lean: int = 0
    swap: bool = False

    def __post_init__(self) -> None:
        if self.kernel not in ("simt", "mma", "wgmma", "skinny", "decode", "rowload"):
            raise ValueError(f"unknown GEMM kernel {self.kernel!r}")
        if min(self.bm, self.bn, self.bk, self.stages, self.split_k, self.group_m) < 1:
            raise ValueError(f"invalid GEMM config {self}")
        if self.kernel == "wgmma" and (self.bm not in (64, 128, 192) or self.bk not in (32, 64)
                                       or self.bn not in (64, 80, 96, 128, 192, 256)):
            raise ValueError(f"the wgmma kernel takes (64|128) x (64|128|192|256) x 64 tiles "
                             f"(128 x 32 for TF32), 192 x (128|192) x 64 ones and "
                             f"(64|128|192) x 96 x 64 and (64|128) x 80 x 64 ones, not {self}")
        if self.narrow and (self.bk != 64 or self.split_k != 1 or self.cluster_n != 1
                            or self.pingpong or self.pipe_store
                            or self.shared_mem(False, False) > _SMEM_SM90):
            raise ValueError(f"96- and 80-wide wgmma tiles are for unsplit 16-bit GEMMs, clusters "
                             f"along M only, no pingpong or pipe_store, stages that fit "
                             f"227 KiB with C's staging: {self}")
        if self.swap and (self.kernel != "wgmma" or self.bk != 64 or self.split_k != 1
                          or self.bn not in (64, 80, 96, 128) or self.cluster_n != 1
                          or self.pingpong or self.pipe_store
                          or self.shared_mem(False, False) > _SMEM_SM90):
            raise ValueError(f"swap (C^T = B^T A^T) is for unsplit 16-bit wgmma tiles with bn 64, "
                             f"80, 96 or 128, clusters along M only, no pingpong or pipe_store, "
                             f"stages that fit 227 KiB with C's staging: {self}")
        if self.kernel == "wgmma" and self.bm == 64 and (
                self.bk != 64 or self.split_k != 1 or self.cluster_n != 1 or self.pingpong):
            raise ValueError(f"64-row wgmma tiles are for unsplit 16-bit GEMMs, clusters along M "
                             f"only, without ping-pong: {self}")
        if self.kernel == "wgmma" and self.bm == 192 and (
                self.bk != 64 or self.bn not in (96, 128, 192) or self.split_k != 1
                or self.cluster_n != 1 or self.pingpong or self.pipe_store):
            raise ValueError(f"192-row wgmma tiles are 192 x (96|128|192) x 64 for unsplit 16-bit "
                             f"GEMMs, clusters along M only, no pingpong or pipe_store: {self}")
        if self.kernel == "wgmma" and self.bn == 192 and (self.bk != 64 or self.split_k != 1):
            raise ValueError(f"128 x 192 wgmma tiles are for unsplit 16-bit GEMMs: {self}")
        if self.kernel == "wgmma" and self.bm == 128 and self.bn == 192 and self.stages > 5:
            raise ValueError(f"128 x 192 wgmma tiles take at most 5 stages of 40 KiB (with one "
                             f"staging box per consumer at 5): {self}")
        if self.kernel == "wgmma" and self.bn == 64 and self.cluster_m != 1:
            raise ValueError(f"wgmma clusters multicast 64-wide chunks of B: bn >= 128, not {self}")
        if self.kernel == "wgmma" and self.bk == 32 and self.cluster_m != 1:
            raise ValueError(f"the TF32 wgmma kernel has no clusters: {self}")
        if self.kernel == "wgmma" and self.split_k != 1 and (self.bk == 32 or self.cluster_m != 1):
            raise ValueError(f"the wgmma kernel splits K for 16-bit types without clusters: {self}")
        if self.cluster_m not in (1, 2) or (self.cluster_m == 2 and self.kernel != "wgmma"):
            raise ValueError(f"clusters of 2 CTAs are for the wgmma kernel only: {self}")
        if (self.cluster_n != 1 or self.pingpong) and (
                self.kernel != "wgmma" or self.bk != 64 or self.split_k != 1
                or self.cluster_n not in (1, 2) or (self.pingpong and self.bn > 128)):
            raise ValueError(f"cluster_n=2 and pingpong are for the unsplit 16-bit wgmma kernel "
                             f"(pingpong with bn <= 128): {self}")
        deep192 = self.bm == 128 and self.bn == 192 and self.stages == 5  # + the held stage
        if self.pipe_store and (self.kernel != "wgmma" or self.bk != 64 or self.split_k != 1
                                or not self.tma_store or (self.bn % 128 and not deep192)):
            raise ValueError(f"pipe_store is for the unsplit 16-bit wgmma kernel's TMA stores "
                             f"(bn 128 or 256, or 128 x 192 with 5 stages): {self}")
        if self.lean and (not 0 < self.lean < 32 or self.lean & 8 or self.kernel != "wgmma"
                          or self.bk != 64 or self.split_k != 1 or self.cluster_n != 1
                          or self.pingpong or (self.lean & 16 and self.cluster_m != 2)):
            raise ValueError(f"lean (bits 1, 2, 4; 16 with cluster_m=2) is for the "
                             f"unsplit 16-bit wgmma kernel without cluster_n or pingpong: {self}")
        if self.tma_store and self.kernel != "wgmma":
            raise ValueError(f"TMA stores are for the wgmma kernel only: {self}")
        if self.kernel == "simt" and (self.bk not in (8, 16) or self.bm % 32 or
                                      self.wn not in (0, 64, 128) or self.bn % (self.wn or 64)):
            raise ValueError(f"simt tiles are (32 i) x (64|128 j) x (8|16) with warp tiles "
                             f"32 x 64 or 32 x 128, not {self}")
        if self.kernel == "skinny":
            _skinny.validate(self)
        if self.kernel == "decode":
            _decode.validate(self)
        if self.kernel == "rowload":
            _rowload.validate(self)
        if self.kernel == "mma" and (self.bm % self.wm or self.bn % self.wn or self.wm % 16
                                     or self.wn % 16 or self.bk % 16):
            raise ValueError(f"mma warp tiles must divide the CTA tile in 16s: {self}")

    @property
    def narrow(self) -> bool:
        """A 16-bit wgmma tile whose width is not a multiple of 64 (96, 80): its N-major B and
        its staged C travel in boxes of :attr:`box_width` columns (kernels/gemm_wgmma.cu)."""
        return self.kernel == "wgmma" and self.bn % 64 != 0

    @property
    def box_width(self) -> int:
        """Columns of the wgmma kernel's N-major B boxes and C staging boxes: 64 with the
        128-byte swizzle, 32 (bn 96) with the 64-byte one, 16 (bn 80) with the 32-byte one."""
        return 64 if self.bn % 64 == 0 else 32 if self.bn % 32 == 0 else 16

    @property
    def threads(self) -> int:
        if self.kernel == "wgmma":  # a producer and bm / 64 consumer warpgroups
            return 128 + 2 * self.bm
        if self.kernel == "skinny":
            return _skinny.threads(self)
        if self.kernel == "decode":
            return _decode.threads(self)
        if self.kernel == "rowload":
            return 256
        if self.kernel == "simt":
            return (self.bm // 32) * (self.bn // (self.wn or 64)) * 32
        return (self.bm // self.wm) * (self.bn // self.wn) * 32

    def shared_mem(self, a_kmajor: bool, b_kmajor: bool, itemsize: int = 2) -> int:
        """Dynamic shared memory in bytes."""
        if self.kernel == "simt":  # a ring of fp32 [bk][bm + 4] and [bk][bn + 4] tiles
            return self.stages * self.bk * (self.bm + self.bn + 8) * 4
        if self.kernel == "skinny":
            return _skinny.shared_mem(self)
        if self.kernel == "decode":
            return _decode.shared_mem(self)
        if self.kernel == "rowload":
            return 0  # 32 KiB, static
        if self.kernel == "wgmma":  # 128-byte rows of K: bk 64 x 2 bytes or 32 x 4 (TF32)
            ring = self.stages * ((self.bm + self.bn) * 128 + 2 * 8) + 1024  # + barriers, slack
            staging = self.bm * 128 * 2 if self.tma_store else 0  # 16 KiB per consumer
            if (self.narrow or self.swap) and self.tma_store:
                staging = self.bm * self.bn * 2  # the consumer's whole 64 x bn half tile
            elif self.pingpong and self.pipe_store:
                staging *= 2  # a whole 128 x 128 tile per consumer
            elif not self.pingpong and self.bk == 64 and ring + staging > _SMEM_SM90:
                staging //= 2  # one 64-wide box per consumer (gemm_wgmma.cu's ONE_BOX)
            return ring + staging
        pad = 8 if itemsize == 2 else 4
        a = self.bm * (self.bk + pad) if a_kmajor else self.bk * (self.bm + pad)
        b = self.bn * (self.bk + pad) if b_kmajor else self.bk * (self.bn + pad)
        return self.stages * (a + b) * itemsize

    @property
    def source(self) -> str:
        """The CUDA file holding this kernel."""
        if self.kernel == "wgmma" and self.bm == 128 and not self.lean and (
                self.cluster_n > 1 or self.pingpong or self.pipe_store):
            return "gemm_wgmma_x.cu"
        return f"gemm_{self.kernel}.cu"

    def name_expression(self, dt: int, a_kmajor: bool, b_kmajor: bool, vec: bool) -> str:
        """The template instantiation for gpurt.compile(name_expressions=...)."""
        ak, bk_, v = (str(x).lower() for x in (a_kmajor, b_kmajor, vec))
        split = "_splitk" if self.split_k > 1 else ""  # the kernel that sums its slices
        if self.kernel == "simt":
            tn = (self.wn or 64) // 8
            return (f"gemm_simt{split}<{self.bm}, {self.bn}, {self.bk}, {tn}, {self.stages}, "
                    f"{ak}, {bk_}, {v}>")
        if self.kernel == "skinny":
            return _skinny.name_expression(self, dt, a_kmajor, b_kmajor, vec)
        if self.kernel == "decode":  # a_kmajor, b_kmajor: X's and Y's layouts
            return _decode.name_expression(self, dt, a_kmajor, b_kmajor)
        if self.kernel == "rowload":
            return _rowload.name_expression(self, dt, a_kmajor)
        if self.kernel == "wgmma" and dt == DT_TF32:
            # B must be K-major: without it the kernel computes C^T = B^T A^T (out_t), whose
            # A (the old B) is then not K-major
            out_t = str(not b_kmajor).lower()
            a_k = str(a_kmajor and b_kmajor).lower()
            return (f"gemm_wgmma_tf32<{self.bn}, {self.stages}, {a_k}, {out_t}, "
                    f"{str(self.tma_store).lower()}>")
        if self.source == "gemm_wgmma_x.cu":
            return (f"gemm_wgmma_x<{dt}, {self.bn}, {self.stages}, {ak}, {bk_}, "
                    f"{self.cluster_m}, {self.cluster_n}, {str(self.pingpong).lower()}, "
                    f"{str(self.tma_store).lower()}" + (", true>" if self.pipe_store else ">"))
        if self.swap:  # the kernel's A is B^T (K-major as B is), its B is A^T
            return (f"gemm_wgmma_t<{dt}, {self.bm}, {self.bn}, {self.stages}, {bk_}, {ak}, "
                    f"{self.cluster_m}, {str(self.tma_store).lower()}, {self.lean}>")
        if self.kernel == "wgmma" and (self.bm != 128 or self.lean):
            tail = f", {str(self.pipe_store).lower()}, {self.lean}>" if self.lean else (
                ", true>" if self.pipe_store else ">")
            return (f"gemm_wgmma_bm<{dt}, {self.bm}, {self.bn}, {self.stages}, {ak}, {bk_}, "
                    f"{self.cluster_m}, {str(self.tma_store).lower()}" + tail)
        if self.kernel == "wgmma":
            epi = str(self.tma_store).lower()
            return (f"gemm_wgmma{split}<{dt}, {self.bn}, {self.stages}, {ak}, {bk_}, "
                    f"{self.cluster_m}, {epi}>")
        return (f"gemm_mma{split}<{dt}, {self.bm}, {self.bn}, {self.bk}, {self.wm}, {self.wn}, "
                f"{self.stages}, {ak}, {bk_}, {v}>")

    def tiles(self, m: int, n: int) -> int:
        """Tiles that cover an m x n C (a swapped config's tiles cover C^T)."""
        if self.swap:
            m, n = n, m
        return -(-m // self.bm) * -(-n // self.bn)

    def blocks(self, m: int, n: int) -> int:
        """Clusters of tiles (cluster_m x cluster_n) that cover an m x n C; tiles alone."""
        if self.swap:
            m, n = n, m
        return -(-m // (self.bm * self.cluster_m)) * -(-n // (self.bn * self.cluster_n))

    @property
    def cluster(self) -> int:
        """CTAs per cluster (1: no clusters)."""
        return self.cluster_m * self.cluster_n

    def label(self) -> str:
        text = f"{self.kernel} {self.bm}x{self.bn}x{self.bk}"
        if self.kernel == "mma" or self.wn:
            text += f" w{self.wm}x{self.wn}"
        text += f" s{self.stages}"
        if self.split_k > 1:
            text += f" split{self.split_k}"
        if self.cluster_m > 1 or self.cluster_n > 1:
            text += f" c{self.cluster_m}" + (f"x{self.cluster_n}" if self.cluster_n > 1 else "")
        if self.pingpong:
            text += " pp"
        if self.tma_store:
            text += " tmaC"
        if self.pipe_store:
            text += " ps"
        if self.lean:
            text += f" lean{self.lean}"
        if self.swap:
            text += " T"
        return text + f" g{self.group_m}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Config:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class Problem:
    """What the choice depends on: sizes, element type, operand layouts (K-major or not),
    alignment (``vec``: 16-byte rows for vector loads; ``tma``: rows fit TMA's rules;
    ``pitch128``: A's and B's base addresses and row pitches are 128-byte multiples, so each
    128-byte row of a TMA box is one L2 line, not parts of two) and the device (compute
    capability, SM count, shared memory per block)."""

    m: int
    n: int
    k: int
    dt: int
    a_kmajor: bool
    b_kmajor: bool
    vec: bool
    tma: bool
    capability: tuple[int, int]
    sm_count: int
    max_shared: int = 227 * 1024
    pitch128: bool = True

    @property
    def macs(self) -> int:
        return self.m * self.n * self.k
