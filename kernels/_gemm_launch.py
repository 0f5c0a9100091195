"""Compiling and launching the GEMM kernels (kernels/gemm_*.cu): their sources and NVRTC
programs, the tensor maps (TMA descriptors) of the wgmma kernel, and :class:`Call`, one
planned launch of a config for operands of one signature. kernels/gemm.py validates the
operands, chooses the config and keeps the plans; this module runs them.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import hashlib
import itertools
import multiprocessing
import os
import pathlib
import threading
from collections.abc import Sequence
from typing import Any

from cuda.bindings import driver as cu

import gpurt

from . import _gemm_decode as decode
from . import _gemm_skinny as skinny
from . import _gemm_tune as tune
from . import _gemm_workspace as workspace
from ._gemm_tune import DT_BF16, DT_F16, DT_F32, DT_TF32, Config, Problem

__all__ = ["Call", "PlannedGemm", "PlannedDecode", "make_call", "planned_call", "precompile",
           "programs", "program", "compile_program", "compile_programs", "kernel_names", "headers",
           "arch_for", "source_of", "text", "source_digest", "tensor_map",
           "encode_map"]

_HERE = pathlib.Path(__file__).resolve().parent
_TMA_TYPES = {DT_F16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              DT_BF16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
              DT_F32: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}
_TF32_SOURCE = "gemm_wgmma_tf32.cu"
_SWIZZLES = {128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
             64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
             32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B}

# ---- sources and compiled kernels ----------------------------------------------------------


@functools.cache
def text(name: str) -> str:
    return (_HERE / name).read_text()


@functools.cache
def source_digest() -> str:
    """A digest of every GEMM source, so tuning results die with the kernels they timed."""
    digest = hashlib.sha256()
    for name in ("gemm_common.cu", "gemm_simt.cu", "gemm_mma.cu", "gemm_wgmma.cu",
                 _TF32_SOURCE, "gemm_skinny.cu", "gemm_decode.cu", "gemm_wgmma_x.cu",
                 "gemm_rowload.cu"):
        digest.update(text(name).encode())
    return digest.hexdigest()[:12]


_kernels: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_kernels_lock = threading.Lock()
# a forked child gets a fresh lock (a parent thread may have held this one at the fork)
os.register_at_fork(after_in_child=lambda: globals().update(_kernels_lock=threading.Lock()))


def headers(source: str) -> dict[str, str]:
    """The files GEMM source ``source`` includes, for gpurt.compile's ``headers=``."""
    found = {"gemm_common.cu": text("gemm_common.cu")}
    if source in (_TF32_SOURCE, "gemm_decode.cu", "gemm_wgmma_x.cu"):  # the 16-bit one's parts
        found["gemm_wgmma.cu"] = text("gemm_wgmma.cu")
    if source == "gemm_decode.cu":  # and the TF32 one's (TF32 decode tiles)
        found[_TF32_SOURCE] = text(_TF32_SOURCE)
    if source in ("gemm_mma.cu", "gemm_simt.cu"):  # once per kernel (gemm_mma.cu says why)
        found["./" + source] = text(source)
    return found


def compile_kernels(source: str, names: tuple[str, ...], arch: str) -> tuple[Any, ...]:
    """The kernels ``names`` of ``source`` compiled for ``arch`` (one NVRTC program), with
    any extra NVRTC options from ``GPURT_GEMM_NVRTC_OPTIONS`` (e.g. -lineinfo, -D...)."""
    options = tuple(os.environ.get("GPURT_GEMM_NVRTC_OPTIONS", "").split())
    key = (source, arch, names, options)
    found = _kernels.get(key)
    if found is None:
        module = gpurt.compile(text(source), options, name_expressions=names, arch=arch,
                               headers=headers(source), program_name=source)
        with _kernels_lock:
            found = _kernels.setdefault(key, tuple(module[n] for n in names))
    return found


def source_of(config: Config, dt: int) -> str:
    """The CUDA file holding ``config``'s kernel for element type ``dt``."""
    return _TF32_SOURCE if config.kernel == "wgmma" and dt == DT_TF32 else config.source


def kernel_names(config: Config, problem: Problem) -> tuple[str, ...]:
    """The kernel of ``config`` for ``problem`` (one: a split-K kernel sums its own slices)."""
    if config.kernel == "skinny":
        return (skinny.kernel_name(config, problem),)
    if config.kernel == "decode":
        return (decode.kernel_name(config, problem),)
    return (config.name_expression(problem.dt, problem.a_kmajor, problem.b_kmajor,
                                   problem.vec),)


def arch_for(config: Config, capability: tuple[int, int]) -> str:
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if config.kernel in ("wgmma", "decode") else "")


# ---- tensor maps (TMA descriptors) ---------------------------------------------------------------

_maps: dict[tuple[int, ...], bytes] = {}


def encode_map(ptr: int, inner: int, outer: int, ld: int, dt: int, box: tuple[int, int],
               swizzle: int = 128) -> bytes:
    """A 128-byte CUtensorMap of a 2-D 16-bit or fp32 (DT_F32) matrix (wraps
    cuTensorMapEncodeTiled): rows of ``inner`` elements, ``ld`` apart; ``box`` = (inner, outer)
    elements; 128-byte swizzle (``swizzle`` = 64 or 32: that one, for boxes of rows that
    long), zero fill outside. Rows at 128-byte multiples promote L2
    fills to 256 bytes; others not at all: a 128-byte box row then spans two L2 lines, and the
    promoted fills cost 3000x5000x2000 bf16 15% and 1000^3 10% (an H100, notes_gemm.md).
    Cached by its arguments."""
    key = (ptr, inner, outer, ld, dt, *box, swizzle)
    found = _maps.get(key)
    if found is None:
        u64, u32 = cu.cuuint64_t, cu.cuuint32_t
        promotion = cu.CUtensorMapL2promotion
        aligned = ptr % 128 == 0 and ld * _itemsize(dt) % 128 == 0
        tmap = gpurt.check(cu.cuTensorMapEncodeTiled(
            _TMA_TYPES[dt], 2, ptr, [u64(inner), u64(outer)], [u64(ld * _itemsize(dt))],
            [u32(box[0]), u32(box[1])], [u32(1), u32(1)],
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            _SWIZZLES[swizzle],
            promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B if aligned
            else promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            "cuTensorMapEncodeTiled")
        found = ctypes.string_at(tmap.getPtr(), 128)
        if len(_maps) > 256:
            _maps.clear()
        _maps[key] = found
    return found


def _itemsize(dt: int) -> int:
    return 4 if dt in (DT_F32, DT_TF32) else 2


def tensor_map(ptr: int, kmajor: bool, rows: int, k: int, ld: int, dt: int,
                box_rows: int, mn_width: int = 0) -> bytes:
    """The tensor map of one wgmma operand, in boxes of 128-byte rows (w = 64 16-bit or 32
    fp32 elements): K-major boxes are [box_rows][w k], the others [w k][w rows] ([w k]
    [mn_width rows] with the swizzle of their row length where ``mn_width`` is given and
    narrower: a 96- or 80-wide tile's B, Config.box_width)."""
    width = 128 // _itemsize(dt)
    if kmajor:
        return encode_map(ptr, k, rows, ld, dt, (width, box_rows))
    if 0 < mn_width < width:
        return encode_map(ptr, rows, k, ld, dt, (mn_width, width), mn_width * _itemsize(dt))
    return encode_map(ptr, rows, k, ld, dt, (width, width))


_NO_MAP = bytes(128)


# ---- launching -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """One planned launch of ``config``: the compiled kernels, the geometry and every scalar
    argument for operands of one signature (shapes, strides, dtype, device, alignment).
    Between calls of a signature only the pointers, alpha and beta change."""

    config: Config
    kernels: tuple[Any, ...]
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    ldcin: int
    a_kmajor: bool
    b_kmajor: bool
    dt: int
    index: int
    swap: bool  # wgmma computes C^T = B^T A^T (TF32 with an N-major B, Config.swap; m, n,
    # a, b are its own)
    pair_ok: int  # C's base and pitch allow paired stores (bit 0), 4-element ones (bit 1)
    store_ok: bool  # the wgmma epilogue may store C with TMA
    smem: int
    grid: Any  # int (wgmma) or (tiles, 1, split)
    clusters: int  # wgmma with clusters: how many
    counters: int  # split-K: ticket counters (one per tile, wgmma one per half tile), else 0
    partials: int  # split-K: float32 partial sums (_gemm_workspace.partials_for), else 0
    spread: bool = False  # simt split-K: a cooperative launch whose CTAs share the sums

    def launch(self, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int, alpha: float,
               beta: float, stream: Any) -> None:
        """Run it: C (at ``out_ptr``) = alpha A B + beta Cin, on ``stream`` (None: current)."""
        config, kernels = self.config, self.kernels
        if config.kernel == "skinny":
            skinny.launch(self, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta, stream)
            return
        if config.kernel == "decode":
            launch, args, _ = decode.arguments(self, _decode_maps(self, a_ptr, b_ptr), out_ptr,
                                               cin_ptr, alpha, beta)
            kernels[0].launch(launch, *args, stream=stream)
            return
        if config.split_k == 1:
            self._launch_main(a_ptr, b_ptr, out_ptr, cin_ptr, 0, 0, alpha, beta, stream)
            return
        with workspace.LOCK:
            handle = None if stream is None else gpurt.as_stream_handle(stream, self.index)
            room = workspace.take(self.index, handle, self.partials, self.counters)
            self._launch_main(a_ptr, b_ptr, out_ptr, cin_ptr, room.partials, room.counters,
                              alpha, beta, stream)

    def _launch_main(self, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int,
                     partial_ptr: int, counters_ptr: int, alpha: float, beta: float,
                     stream: Any) -> None:
        config = self.config
        args, _ = _main_arguments(self, a_ptr, b_ptr, out_ptr, cin_ptr, partial_ptr,
                                  counters_ptr, alpha, beta)
        if self.spread or (config.kernel == "wgmma" and config.cluster > 1):
            self.kernels[0].launch(_main_config(self), *args, stream=stream)
        else:  # the plain launch, without building a LaunchConfig
            self.kernels[0](self.grid, config.threads, args, shared_mem=self.smem,
                            stream=stream)


class PlannedGemm:
    """``planned(stream_handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)``: a :class:`Call`
    of the mma or wgmma family through planned launches (Kernel.planned), checked and packed
    once. Per call it only takes split-K's partials (and wgmma's ticket counters) from the
    stream's workspace (kernels/_gemm_workspace.py), and, for wgmma, looks up the tensor maps
    of pointers that changed since the last call (the maps are by-value arguments that hold
    the pointers); ``stream_handle`` None is the current stream of the call's device."""

    __slots__ = ("call", "main", "maps")

    def __init__(self, call: Call, main: Any) -> None:
        self.call, self.main = call, main
        # (a_ptr, b_ptr, out_ptr, (map_a, map_b, map_c)) of the last wgmma call
        self.maps: tuple[int, int, int, tuple[bytes, ...]] | None = None

    def __call__(self, handle: Any, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int,
                 alpha: float, beta: float) -> None:
        call = self.call
        if call.config.split_k == 1:
            # the kernel's partials pointer (unused without a split), where it takes one
            extra = (0,) if call.config.kernel != "wgmma" or call.dt != DT_F32 else ()
            self._main(handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta, extra)
            return
        with workspace.LOCK:  # one launch: the last CTA of each tile sums the slices
            room = workspace.take(call.index, handle, call.partials, call.counters)
            self._main(handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta,
                       (room.partials, room.counters))

    def _main(self, handle: Any, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int,
              alpha: float, beta: float, extra: tuple[int, ...]) -> None:
        if self.call.config.kernel == "wgmma":
            self.main(handle, *self._maps(a_ptr, b_ptr, out_ptr), out_ptr, cin_ptr, alpha,
                      beta, *extra)
        else:
            self.main(handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta, *extra)

    def _maps(self, a_ptr: int, b_ptr: int, out_ptr: int) -> tuple[bytes, ...]:
        last = self.maps
        if last is not None and last[0] == a_ptr and last[1] == b_ptr and last[2] == out_ptr:
            return last[3]
        maps = _wgmma_maps(self.call, a_ptr, b_ptr, out_ptr)
        self.maps = (a_ptr, b_ptr, out_ptr, maps)
        return maps


class PlannedDecode:
    """``planned(stream_handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)``: a decode
    :class:`Call` through a planned launch, re-encoding the tensor maps of X and Y only when
    the operands' pointers changed since the last call."""

    __slots__ = ("call", "main", "maps")

    def __init__(self, call: Call, main: Any) -> None:
        self.call, self.main = call, main
        self.maps: tuple[int, int, tuple[bytes, bytes]] | None = None

    def __call__(self, handle: Any, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int,
                 alpha: float, beta: float) -> None:
        last = self.maps
        if last is None or last[0] != a_ptr or last[1] != b_ptr:
            last = self.maps = (a_ptr, b_ptr, _decode_maps(self.call, a_ptr, b_ptr))
        self.main(handle, *last[2], out_ptr, cin_ptr, alpha, beta)


def _decode_maps(call: Call, a_ptr: int, b_ptr: int) -> tuple[bytes, bytes]:
    """The tensor maps of a decode call's X (bm-row boxes) and Y (bn-row boxes)."""
    config = call.config
    side = decode.sides(call.m, call.n, call.a_kmajor, call.b_kmajor)
    x_ptr, y_ptr, ld_x, ld_y = ((a_ptr, b_ptr, call.lda, call.ldb) if side.tall
                                else (b_ptr, a_ptr, call.ldb, call.lda))
    return (tensor_map(x_ptr, side.x_kmajor, side.p, call.k, ld_x, call.dt, config.bm),
            tensor_map(y_ptr, side.y_kmajor, side.q, call.k, ld_y, call.dt, config.bn))


def _wgmma_maps(call: Call, a_ptr: int, b_ptr: int, out_ptr: int) -> tuple[bytes, ...]:
    """The tensor maps of A, B and C (C's only where the epilogue stores with TMA) of a
    wgmma call, with A and B swapped for the transposed product (TF32's, Config.swap)."""
    config = call.config
    if call.swap:
        a_ptr, b_ptr = b_ptr, a_ptr
    map_a = tensor_map(a_ptr, call.a_kmajor, call.m, call.k, call.lda, call.dt,
                       config.bm // config.cluster_n)
    narrow = config.narrow  # 96- and 80-wide tiles: narrower boxes of N-major B and of C
    map_b = tensor_map(b_ptr, call.b_kmajor, call.n, call.k, call.ldb, call.dt,
                       config.bn // config.cluster_m, config.box_width if narrow else 0)
    rows, cols = (call.n, call.m) if call.swap else (call.m, call.n)  # C in memory
    box_c = (config.box_width if narrow else 128 // _itemsize(call.dt), 64)
    swizzle = (2 * config.box_width,) if narrow else ()  # (else encode_map's 128-byte one)
    if config.swap:  # a [bn rows][64 columns] box of C (the kernel's 64 x bn C^T slab)
        box_c, swizzle = (64, config.bn), ()
    map_c = encode_map(out_ptr, cols, rows, call.ldc, call.dt, box_c,
                       *swizzle) if call.store_ok else _NO_MAP
    return map_a, map_b, map_c


def _main_arguments(call: Call, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int,
                    partial_ptr: int, counters_ptr: int, alpha: float,
                    beta: float) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """(arguments of the main kernel of an mma or wgmma call, positions of what varies per
    call among them: A, B (their tensor maps for wgmma), [wgmma: C's map], out, cin, alpha,
    beta, then the partials pointer where the kernel takes one, then split-K's
    counters pointer)."""
    config = call.config
    if config.kernel == "wgmma":
        args: tuple[Any, ...] = (
            *_wgmma_maps(call, a_ptr, b_ptr, out_ptr), out_ptr, cin_ptr, call.m, call.n,
            call.k, call.ldc, call.ldcin, alpha, beta, config.group_m, call.pair_ok,
            int(call.store_ok))
        if call.dt != DT_F32 and config.split_k > 1:  # gemm_wgmma_splitk
            return (args + (partial_ptr, config.split_k, counters_ptr),
                    (0, 1, 2, 3, 4, 10, 11, 15, 17))
        if call.dt != DT_F32:  # the 16-bit kernel's partials pointer, unused
            return args + (partial_ptr, config.split_k), (0, 1, 2, 3, 4, 10, 11, 15)
        return args, (0, 1, 2, 3, 4, 10, 11)
    args = (a_ptr, b_ptr, out_ptr, cin_ptr, partial_ptr, call.m, call.n, call.k, call.lda,
            call.ldb, call.ldc, call.ldcin, alpha, beta, config.group_m, call.pair_ok)
    if config.split_k > 1 and config.kernel == "simt":  # its ending spread or not
        return args + (counters_ptr, int(call.spread)), (0, 1, 2, 3, 12, 13, 4, 16)
    if config.split_k > 1:  # gemm_mma_splitk
        return args + (counters_ptr,), (0, 1, 2, 3, 12, 13, 4, 16)
    return args, (0, 1, 2, 3, 12, 13, 4)


def _main_config(call: Call) -> gpurt.LaunchConfig:
    config = call.config
    cluster = (config.cluster, 1, 1) if config.kernel == "wgmma" and config.cluster > 1 \
        else None
    return gpurt.LaunchConfig(call.grid, config.threads, call.smem, cluster=cluster,
                              cooperative=call.spread)


def planned_call(call: Call, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int) -> Any:
    """``planned(stream_handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)`` running ``call``
    like :meth:`Call.launch`, checked and packed now with these pointers (planned on the
    call's device): Kernel.planned itself for the skinny family, else a :class:`PlannedGemm`."""
    kernels, index = call.kernels, call.index
    if call.config.kernel == "skinny":
        config, args, varying = skinny.arguments(call, a_ptr, b_ptr, out_ptr, cin_ptr, 1.0, 0.0)
        return kernels[0].planned(config, *args, varying=varying, device=index)
    if call.config.kernel == "decode":
        config, args, varying = decode.arguments(call, _decode_maps(call, a_ptr, b_ptr), out_ptr,
                                                 cin_ptr, 1.0, 0.0)
        return PlannedDecode(call, kernels[0].planned(config, *args, varying=varying,
                                                      device=index))
    args, varying = _main_arguments(call, a_ptr, b_ptr, out_ptr, cin_ptr, 0, 0, 1.0, 0.0)
    main = kernels[0].planned(_main_config(call), *args, varying=varying, device=index)
    return PlannedGemm(call, main)


def make_call(plan: Any, problem: Problem, config: Config, out_ptr: int) -> Call:
    """Compile ``config`` for ``problem`` and fix its launch for ``plan``'s operands, with
    C at an address aligned like ``out_ptr``."""
    names = kernel_names(config, problem)
    kernels = compile_kernels(source_of(config, problem.dt), names,
                              arch_for(config, problem.capability))
    itemsize = plan.itemsize
    pair_ok = int(out_ptr % (2 * itemsize) == 0 and plan.ldc % 2 == 0)
    if pair_ok and out_ptr % (4 * itemsize) == 0 and plan.ldc % 4 == 0:
        pair_ok |= 2  # 4-element stores too (wgmma split-K's coalesced sum)
    smem = config.shared_mem(plan.a.kmajor, plan.b.kmajor, itemsize)
    a, b, m, n = plan.a, plan.b, plan.m, plan.n
    # wgmma's TF32 B must be K-major: C^T = B^T A^T, stored transposed; Config.swap asks for it
    swap = config.kernel == "wgmma" and (config.swap or (problem.dt == DT_TF32
                                                         and not b.kmajor))
    # tiles of the kernel's C (C^T when swapped: a swapped Config counts those itself)
    tiles = config.tiles(n, m) if swap and not config.swap else config.tiles(m, n)
    if swap:
        a, b, m, n = b, a, n, m
    store_ok = config.tma_store and out_ptr % 16 == 0 and plan.ldc * itemsize % 16 == 0
    grid: int | tuple[int, int, int] = (tiles, 1, config.split_k)
    clusters = 0
    if config.kernel == "wgmma":
        grid = min(tiles * config.split_k, problem.sm_count)
        if config.cluster > 1:
            clusters = min(config.blocks(plan.m, plan.n),
                           max_clusters(kernels[0], config, smem, plan.index))
            grid = config.cluster * clusters
    counters = partials = 0
    if config.split_k > 1:  # one per tile; wgmma: one per consumer's half tile
        counters = 2 * tiles if config.kernel == "wgmma" else tiles
        partials = workspace.partials_for(config.split_k, m, n)
    spread = (config.kernel == "simt" and config.split_k > 1 and SPREAD_SPLIT_K
              and tiles * config.split_k <= problem.sm_count
              * resident_per_sm(kernels[0], config, smem, plan.index))
    return Call(config, kernels, m, n, plan.k, a.ld, b.ld, plan.ldc, plan.ldcin, a.kmajor,
                b.kmajor, plan.dt, plan.index, swap, pair_ok, store_ok, smem, grid, clusters,
                counters, partials, spread)


# simt split-K grids that fit the GPU at once end spread over their CTAs (a cooperative
# launch, kernels/gemm_simt.cu's splitk_spread); False: the tile's last CTA sums the slices
SPREAD_SPLIT_K = True
_resident: dict[tuple[str, int, int], int] = {}
def resident_per_sm(kernel: Any, config: Config, smem: int, index: int) -> int:
    """CTAs of ``kernel`` (``config``'s threads, ``smem`` bytes) one SM of device ``index``
    runs at once (cuOccupancyMaxActiveBlocksPerMultiprocessor): x SMs, the most CTAs a
    cooperative launch may have."""
    key = (kernel.symbol, smem, index)
    found = _resident.get(key)
    if found is None:
        with gpurt.device(index):
            found = kernel.max_active_blocks_per_multiprocessor(config.threads, smem)
        _resident[key] = found
    return found


_cluster_limits: dict[tuple[str, int, int, int], int] = {}


def max_clusters(kernel: Any, config: Config, smem: int, index: int) -> int:
    """How many clusters of ``config`` run at once on device ``index`` (wraps
    cuOccupancyMaxActiveClusters): a persistent grid larger than that would leave a few
    clusters for a second wave and double the time of their tiles."""
    key = (kernel.symbol, smem, config.cluster, index)
    found = _cluster_limits.get(key)
    if found is None:
        launch = gpurt.LaunchConfig(config.cluster * 1024, config.threads, smem,
                                    cluster=config.cluster)
        found = kernel.max_active_clusters(launch, device=index)
        _cluster_limits[key] = found = max(found, 1)
    return found


# M x N of the problems (K 4096) whose configs precompile() and the kernel archive build: big
# ones, decode shapes with the small side on either side of C (the skinny family's
# instantiations depend on which), and M = 1-4 for the rowload tiles (bm is M there).
_PRECOMPILE_SHAPES = ((4096, 4096), (1, 4096), (2, 4096), (3, 4096), (4, 4096), (8, 4096),
                      (16, 4096), (32, 4096), (64, 4096), (4096, 8), (4096, 16), (4096, 32),
                      (4096, 64))


def programs(arch: str) -> list[tuple[str, tuple[str, ...], str]]:
    """(source, name expressions, arch) of every GEMM program gemm may compile for ``arch``:
    each config of each family, in each operand layout, with and without vector loads, and
    on sm_90+ the packed route's copy kernels."""
    major = int(arch[3:].rstrip("a")) // 10
    minor = int(arch[3:].rstrip("a")) % 10
    found: dict[tuple[str, tuple[str, ...], str], None] = {}
    for dt in (DT_F32, DT_TF32, DT_F16, DT_BF16):
        for a_k in (True, False):
            for b_k in (True, False):
                for vec, (m, n) in itertools.product((True, False), _PRECOMPILE_SHAPES):
                    problem = Problem(m, n, 4096, dt, a_k, b_k, vec, vec, (major, minor), 132)
                    for config in tune.all_configs(problem):
                        found[program(config, problem)] = None
    if major >= 9:  # the packed route's copies (kernels/_gemm_pack.py), 16-bit and fp32
        for element in ("unsigned short", "unsigned int"):
            found[("gemm_pack.cu", (f"gemm_pack<{element}>",), f"sm_{major}{minor}")] = None
    return list(found)


def program(config: Config, problem: Problem) -> tuple[str, tuple[str, ...], str]:
    """(source, name expressions, arch) of the program that runs ``config`` on ``problem``."""
    return (source_of(config, problem.dt), kernel_names(config, problem),
            arch_for(config, problem.capability))


def compile_program(program: tuple[str, tuple[str, ...], str]) -> None:
    compile_kernels(*program)


def precompile(arch: str | None = None, workers: int | None = None) -> int:
    """Compile every GEMM kernel variant for ``arch`` (default: the current device's) into
    gpurt's disk kernel cache, spread over ``workers`` processes (default: one per CPU), so
    that no later gemm call compiles; returns the number of programs. Needs no GPU when
    ``arch`` is given."""
    return compile_programs(programs(arch or gpurt.get_arch()), workers)


def compile_programs(todo: Sequence[tuple[str, tuple[str, ...], str]],
                     workers: int | None = None) -> int:
    """Compile ``todo`` (:func:`program`'s triples) into the disk kernel cache, spread over
    ``workers`` processes (default: one per CPU); returns how many."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    if workers == 1:
        for program in todo:
            compile_program(program)
        return len(todo)
    context = multiprocessing.get_context("spawn")  # a fork would copy a CUDA context
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for _ in pool.map(compile_program, todo):
            pass
    return len(todo)


