"""Matrix multiplication on gpurt: ``gemm(a, b)`` computes ``alpha * op(a) @ op(b) + beta * c``.

Inputs are 2-D gpurt Arrays or any device array gpurt views without a copy (torch tensors,
CuPy arrays) of float32, float16 or bfloat16; ``op(x)`` is ``x.T`` when ``trans_x`` is set.
Each operand may be row- or column-major (any row pitch): a transposed view costs nothing.
Accumulation is always fp32. Four kernel families (CUDA sources kernels/gemm_*.cu):

``simt``   exact fp32 on the CUDA cores (2-D block and warp tiling, a cp.async ring);
``mma``    fp16/bf16 (and TF32 with ``allow_tf32=True``) on the tensor cores with mma.sync,
           any sm_80+ GPU and any alignment, optionally splitting K over CTAs;
``wgmma``  fp16/bf16 on Hopper (sm_90a): TMA loads, wgmma, warp specialisation with
           setmaxnreg, an mbarrier ring, a persistent grid in grouped order, an epilogue
           through shared memory and TMA stores (optionally 2-CTA clusters sharing B by
           multicast); needs 16-byte aligned rows (TMA's rule), otherwise ``mma`` runs.
``skinny`` fp16/bf16 decode shapes (one side of C a few dozen at most): the big operand
           streamed once into mma.sync fragments, K split over a thread-block cluster
           (kernels/_gemm_skinny.py).

The variant and its tiles come from kernels/_gemm_tune.py: timed once per shape bucket and
remembered on disk when autotuning is on (``GPURT_GEMM_AUTOTUNE=0`` turns it off), chosen by
heuristics otherwise. Kernels compile through :func:`gpurt.compile` (cached on disk).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import pathlib
import threading
from typing import Any, Optional

import numpy as np
from cuda.bindings import driver as cu

import gpurt
import gpurt.nvrtc

from . import _gemm_skinny as skinny
from . import _gemm_tune as tune
from ._gemm_tune import DT_BF16, DT_F16, DT_F32, DT_TF32, Config, Problem

__all__ = ["gemm", "gemm_config", "gemm_tuning_results", "clear_gemm_tuning"]

_HERE = pathlib.Path(__file__).resolve().parent
_DTYPES = {np.dtype(np.float32): DT_F32, np.dtype(np.float16): DT_F16,
           np.dtype(gpurt.bfloat16): DT_BF16}
_TMA_TYPES = {DT_F16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
              DT_BF16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}

# ---- sources and compiled kernels ----------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _text(name: str) -> str:
    return (_HERE / name).read_text()


@functools.lru_cache(maxsize=None)
def _source_digest() -> str:
    """A digest of every GEMM source, so tuning results die with the kernels they timed."""
    digest = hashlib.sha256()
    for name in ("gemm_common.cu", "gemm_simt.cu", "gemm_mma.cu", "gemm_wgmma.cu",
                 "gemm_skinny.cu"):
        digest.update(_text(name).encode())
    return digest.hexdigest()[:12]


_kernels: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_kernels_lock = threading.Lock()


def _compile(source: str, names: tuple[str, ...], arch: str) -> tuple[Any, ...]:
    """The kernels ``names`` of ``source`` compiled for ``arch`` (one NVRTC program), with
    any extra NVRTC options from ``GPURT_GEMM_NVRTC_OPTIONS`` (e.g. -lineinfo, -D...)."""
    options = tuple(os.environ.get("GPURT_GEMM_NVRTC_OPTIONS", "").split())
    key = (source, arch, names, options)
    found = _kernels.get(key)
    if found is None:
        module = gpurt.compile(_text(source), options, name_expressions=names, arch=arch,
                               headers={"gemm_common.cu": _text("gemm_common.cu")},
                               program_name=source)
        with _kernels_lock:
            found = _kernels.setdefault(key, tuple(module[n] for n in names))
    return found


def _reduce_name(dt: int) -> str:
    return f"gemm_splitk_reduce<{DT_F32 if dt == DT_TF32 else dt}>"


def _kernel_names(config: Config, problem: Problem) -> tuple[str, ...]:
    """The main kernel and, for the split-K capable families, the reduce kernel: one program,
    so a config compiles once whatever its split."""
    if config.kernel == "skinny":
        return (skinny.kernel_name(config, problem),)
    main = config.name_expression(problem.dt, problem.a_kmajor, problem.b_kmajor, problem.vec)
    return (main,) if config.kernel == "wgmma" else (main, _reduce_name(problem.dt))


def _arch_for(config: Config, capability: tuple[int, int]) -> str:
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if config.kernel == "wgmma" else "")


# ---- operands ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Operand:
    """A logical (rows x k) matrix: element (i, j) at ptr + (i*ld + j if kmajor else j*ld + i)
    elements. ``array`` keeps the memory alive."""

    array: Any
    ptr: int
    ld: int
    kmajor: bool


def _as_array(obj: Any, what: str) -> Any:
    if isinstance(obj, gpurt.Array):
        return obj
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{what} is a numpy array in host memory; pass a device array "
                        "(gpurt.asarray(x) copies it to the device)")
    try:
        return gpurt.asarray(obj)
    except Exception as exc:
        raise TypeError(f"{what} must be a gpurt Array or a device array (torch, CuPy...), "
                        f"got {type(obj).__name__}: {exc}") from exc


def _element_strides(x: Any) -> tuple[int, int]:
    size = x.dtype.itemsize
    if any(s % size for s in x.strides):
        return (0, 0)  # strides that are not whole elements: copy
    return (x.strides[0] // size, x.strides[1] // size)


def _round_up(value: int, to: int) -> int:
    return -(-max(value, 1) // to) * to


def _layouts(rows: int, cols: int, s_rows: int, s_cols: int, align: int) -> list[tuple[int, bool]]:
    """(ld, cols-contiguous) layouts a (rows x cols) view with these element strides has,
    16-byte aligned pitches first. Size-1 dimensions take any stride (an aligned one is made up)."""
    found = []
    if s_cols == 1 or cols == 1:
        ld = s_rows if rows > 1 else _round_up(cols, align)
        if ld >= cols:
            found.append((ld, True))
    if s_rows == 1 or rows == 1:
        ld = s_cols if cols > 1 else _round_up(rows, align)
        if ld >= rows:
            found.append((ld, False))
    return sorted(found, key=lambda item: item[0] % align != 0)


def _operand(x: Any, trans: bool) -> tuple[_Operand, int, int]:
    """The operand for op(x) (x.T when ``trans``), its rows and its K."""
    s0, s1 = _element_strides(x)
    rows, k = (x.shape[1], x.shape[0]) if trans else x.shape
    s_rows, s_k = (s1, s0) if trans else (s0, s1)
    layouts = _layouts(rows, k, s_rows, s_k, 16 // x.dtype.itemsize)
    if not layouts:  # no unit stride (or a negative/broadcast one): a contiguous copy
        return _operand(x.clone(), trans)
    ld, kmajor = layouts[0]
    return _Operand(x, int(x.ptr), ld, kmajor), rows, k


def _extent(x: Any) -> tuple[int, int]:
    """[first byte, last byte + 1) that the view ``x`` touches."""
    lo = hi = int(x.ptr)
    for dim, stride in zip(x.shape, x.strides):
        if dim == 0:
            return (lo, lo)
        span = (dim - 1) * stride
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return (lo, hi + x.dtype.itemsize)



def _matching(x: Any, name: str, m: int, n: int, a: gpurt.Array) -> gpurt.Array:
    """``x`` as a gpurt Array, checked to be an m x n matrix of a's dtype on a's device."""
    x = _as_array(x, name)
    if tuple(x.shape) != (m, n) or np.dtype(x.dtype) != np.dtype(a.dtype):
        raise ValueError(f"{name} must be {m}x{n} {a.dtype}, got {tuple(x.shape)} {x.dtype}")
    if x.device != a.device:
        raise ValueError(f"{name} is on {x.device} but the inputs are on {a.device}")
    return x

def _overlaps(x: Any, y: Any) -> bool:
    (a0, a1), (b0, b1) = _extent(x), _extent(y)
    return a0 < b1 and b0 < a1


# ---- the problem and its plan -------------------------------------------------------------------


@dataclasses.dataclass
class _Plan:
    """Everything one launch needs: the (possibly swapped) operands, sizes and output."""

    a: _Operand
    b: _Operand
    m: int
    n: int
    k: int
    out: Any  # row-major (m x n) target, ldc
    ldc: int
    cin: Any  # None when beta == 0
    ldcin: int
    dt: int
    index: int


def _check_dtype(a: Any, b: Any) -> int:
    dt = _DTYPES.get(np.dtype(a.dtype))
    if dt is None:
        raise TypeError(f"gemm takes float32, float16 or bfloat16, not {a.dtype}")
    if np.dtype(b.dtype) != np.dtype(a.dtype):
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}; gemm does not mix dtypes")
    return dt


def _row_major_view(x: Any, rows: int, cols: int, copy: bool) -> tuple[Any, int, bool]:
    """(array, ld, swapped) with x (rows x cols) seen row-major (swapped: as x.T row-major).
    Without a unit stride: a contiguous copy when ``copy``, else (None, 0, False)."""
    s0, s1 = _element_strides(x)
    align = 16 // x.dtype.itemsize
    for ld, row_major in _layouts(rows, cols, s0, s1, align):
        return x, ld, not row_major
    if not copy:
        return None, 0, False
    return x.clone(), max(cols, 1), False


def _operands(a: Any, b: Any, trans_a: bool,
              trans_b: bool) -> tuple[Any, Any, _Operand, _Operand, int, int, int, int]:
    """(a and b as Arrays, A, B, M, N, K, dtype code) of op(a) @ op(b), validated. B (K x N)
    is described by its transpose (N x K), so K-major means the same for both operands."""
    a, b = _as_array(a, "a"), _as_array(b, "b")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm takes 2-D matrices, got shapes {a.shape} and {b.shape}")
    dt = _check_dtype(a, b)
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    op_a, m, k = _operand(a, trans_a)
    op_b, n, k_b = _operand(b, not trans_b)
    if k != k_b:
        raise ValueError(f"op(a) is {m}x{k} but op(b) is {k_b}x{n}: inner dimensions differ")
    return a, b, op_a, op_b, m, n, k, dt


def _plan(a: Any, b: Any, out: Any, beta: float, c: Any, trans_a: bool, trans_b: bool,
          stream: Any) -> tuple[_Plan, Any, Any]:
    """Validate everything; return (plan, object to return, array to copy the result into).
    ``stream`` is a gpurt Stream."""
    a, b, op_a, op_b, m, n, k, dt = _operands(a, b, trans_a, trans_b)
    given = out
    if out is None:
        out = returned = gpurt.empty((m, n), dtype=a.dtype, device=a.device, stream=stream)
    else:
        returned = out
        out = _matching(out, "out", m, n, a)
        if out.size and (_overlaps(out, a) or _overlaps(out, b)):
            raise ValueError("out overlaps a or b; gemm cannot write over its inputs")
    target, ldc, swapped = _row_major_view(out, m, n, copy=False)
    copy_back = None
    if target is None:  # no unit stride: compute into a contiguous array, then copy
        copy_back = out
        target = gpurt.empty((m, n), dtype=a.dtype, device=a.device, stream=stream)
        ldc, swapped = n, False
    cin, ldcin = None, 0
    if beta != 0.0:
        if c is None:
            if given is None:
                raise ValueError("beta != 0 needs c (or out, which then also serves as c)")
            c = out
        c = _matching(c, "c", m, n, a)
        cin, ldcin, c_swapped = _row_major_view(c, m, n, copy=True)
        if c_swapped != swapped:  # c's orientation must follow the output's
            cin = c.T.clone() if swapped else c.clone()
            ldcin = m if swapped else n
        elif _overlaps(cin, target) and (cin.ptr != target.ptr or ldcin != ldc):
            cin, ldcin = cin.clone(), (m if swapped else n)
    if swapped:  # C^T = op(b)^T op(a)^T, written row-major into out's memory
        op_a, op_b, m, n = op_b, op_a, n, m
    plan = _Plan(op_a, op_b, m, n, k, target, ldc, cin, ldcin, dt, a.device.index)
    return plan, returned, copy_back


def _problem(plan: _Plan, allow_tf32: bool) -> Problem:
    props = gpurt.get_device_properties(plan.index)
    dt = DT_TF32 if plan.dt == DT_F32 and allow_tf32 else plan.dt
    itemsize = 4 if plan.dt == DT_F32 else 2
    align = 16 // itemsize
    aligned = all(op.ptr % 16 == 0 and op.ld % align == 0 for op in (plan.a, plan.b))
    tma = aligned and plan.dt in (DT_F16, DT_BF16) and max(plan.a.ld, plan.b.ld) < (1 << 39)
    return Problem(plan.m, plan.n, plan.k, dt, plan.a.kmajor, plan.b.kmajor, aligned, tma,
                   (props.major, props.minor), props.multi_processor_count,
                   int(props.shared_memory_per_block_optin))


# ---- tensor maps (TMA descriptors) ---------------------------------------------------------------

_maps: dict[tuple[int, ...], bytes] = {}


def _encode_map(ptr: int, inner: int, outer: int, ld: int, dt: int, box: tuple[int, int]) -> bytes:
    """A 128-byte CUtensorMap of a 2-D 16-bit matrix (wraps cuTensorMapEncodeTiled): rows of
    ``inner`` elements, ``ld`` apart; ``box`` = (inner, outer) elements; 128-byte swizzle,
    zero fill outside. Cached by its arguments."""
    key = (ptr, inner, outer, ld, dt, *box)
    found = _maps.get(key)
    if found is None:
        u64, u32 = cu.cuuint64_t, cu.cuuint32_t
        tmap = gpurt.check(cu.cuTensorMapEncodeTiled(
            _TMA_TYPES[dt], 2, ptr, [u64(inner), u64(outer)], [u64(ld * 2)],
            [u32(box[0]), u32(box[1])], [u32(1), u32(1)],
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            "cuTensorMapEncodeTiled")
        found = ctypes.string_at(tmap.getPtr(), 128)
        if len(_maps) > 256:
            _maps.clear()
        _maps[key] = found
    return found


def _tensor_map(op: _Operand, rows: int, k: int, dt: int, box_rows: int) -> bytes:
    """The tensor map of one wgmma operand: K-major boxes are [box_rows][64 k], the others
    [64 k][64 rows]."""
    if op.kmajor:
        return _encode_map(op.ptr, k, rows, op.ld, dt, (64, box_rows))
    return _encode_map(op.ptr, rows, k, op.ld, dt, (64, 64))


_NO_MAP = bytes(128)


# ---- launching -----------------------------------------------------------------------------------


def _launch(plan: _Plan, problem: Problem, config: Config, alpha: float, beta: float,
            out: Any, cin: Any, stream: Any) -> None:
    """Run ``config`` on ``plan``, writing ``out`` (rows ldc apart) from ``cin``."""
    names = _kernel_names(config, problem)
    kernels = _compile(config.source, names, _arch_for(config, problem.capability))
    itemsize = 4 if plan.dt == DT_F32 else 2
    pair_ok = int(out.ptr % (2 * itemsize) == 0 and plan.ldc % 2 == 0)
    a, b = plan.a, plan.b
    m, n, k = np.int32(plan.m), np.int32(plan.n), np.int32(plan.k)
    ld = (np.int64(a.ld), np.int64(b.ld), np.int64(plan.ldc), np.int64(plan.ldcin))
    alpha32, beta32 = np.float32(alpha), np.float32(beta)
    cin_ptr = 0 if cin is None else cin.ptr
    smem = config.shared_mem(a.kmajor, b.kmajor, itemsize)
    tiles = config.tiles(plan.m, plan.n)
    if config.kernel == "skinny":
        skinny.launch(kernels[0], plan, config, alpha32, beta32, out, cin, stream)
        return
    if config.kernel == "wgmma":
        cm = config.cluster_m
        map_a = _tensor_map(a, plan.m, plan.k, plan.dt, 128)
        map_b = _tensor_map(b, plan.n, plan.k, plan.dt, config.bn // cm)
        store_ok = config.tma_store and out.ptr % 16 == 0 and plan.ldc % 8 == 0
        map_c = _encode_map(out.ptr, plan.n, plan.m, plan.ldc, plan.dt, (64, 64)) \
            if store_ok else _NO_MAP
        args = (map_a, map_b, map_c, out.ptr, cin_ptr, m, n, k, ld[2], ld[3], alpha32, beta32,
                np.int32(config.group_m), np.int32(pair_ok), np.int32(store_ok))
        if cm == 1:
            grid = min(tiles, problem.sm_count)
            kernels[0](grid, config.threads, args, shared_mem=smem, stream=stream)
        else:
            pairs = -(-plan.m // (128 * cm)) * -(-plan.n // config.bn)
            clusters = min(pairs, _max_clusters(kernels[0], config, smem, plan.index))
            launch = gpurt.LaunchConfig(cm * clusters, config.threads, smem, cluster=(cm, 1, 1))
            kernels[0].launch(launch, *args, stream=stream)
        return
    partial = None
    if config.split_k > 1:
        partial = gpurt.empty((config.split_k, plan.m, plan.n), dtype=np.float32,
                              device=plan.index, stream=stream)
    args = (a.ptr, b.ptr, out.ptr, cin_ptr, 0 if partial is None else partial.ptr, m, n, k,
            *ld, alpha32, beta32, np.int32(config.group_m), np.int32(pair_ok))
    kernels[0]((tiles, 1, config.split_k), config.threads, args, shared_mem=smem, stream=stream)
    if partial is not None:
        total = plan.m * plan.n
        blocks = max(1, min(-(-total // 256), problem.sm_count * 8))
        kernels[1](blocks, 256, (partial.ptr, out.ptr, cin_ptr, m, n, ld[2], ld[3],
                                 np.int32(config.split_k), alpha32, beta32), stream=stream)


_cluster_limits: dict[tuple[str, int, int, int], int] = {}


def _max_clusters(kernel: Any, config: Config, smem: int, index: int) -> int:
    """How many clusters of ``config`` run at once on device ``index`` (wraps
    cuOccupancyMaxActiveClusters): a persistent grid larger than that would leave a few
    clusters for a second wave and double the time of their tiles."""
    key = (kernel.symbol, smem, config.cluster_m, index)
    found = _cluster_limits.get(key)
    if found is None:
        kernel.num_regs  # loads the kernel and binds the device's context on this thread
        handle = gpurt.check(cu.cuLibraryGetKernel(kernel.module.library(), kernel.symbol.encode()),
                             "cuLibraryGetKernel")
        function = gpurt.check(cu.cuKernelGetFunction(handle), "cuKernelGetFunction")
        gpurt.check(cu.cuFuncSetAttribute(
            function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem), "cuFuncSetAttribute")
        launch = cu.CUlaunchConfig()
        launch.gridDimX, launch.gridDimY, launch.gridDimZ = config.cluster_m * 1024, 1, 1
        launch.blockDimX, launch.blockDimY, launch.blockDimZ = config.threads, 1, 1
        launch.sharedMemBytes = smem
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dims = attr.value.clusterDim
        dims.x, dims.y, dims.z = config.cluster_m, 1, 1
        launch.attrs = [attr]
        launch.numAttrs = 1
        found = int(gpurt.check(cu.cuOccupancyMaxActiveClusters(function, launch),
                                "cuOccupancyMaxActiveClusters"))
        _cluster_limits[key] = found = max(found, 1)
    return found


def _stream_object(stream: Any, index: int) -> Any:
    """``stream`` as a gpurt Stream: the current one for None, foreign streams (torch, CuPy,
    raw handles) wrapped in an ExternalStream."""
    if stream is None:
        return gpurt.current_stream(index)
    if isinstance(stream, gpurt.Stream):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None and hasattr(stream, "__cuda_stream__"):
        handle = stream.__cuda_stream__()[1]
    return gpurt.ExternalStream(int(handle if handle is not None else stream), device=index)


# ---- choosing a config ---------------------------------------------------------------------------

_tuners: dict[Optional[str], tune.Tuner] = {}


def _tuner() -> tune.Tuner:
    directory = gpurt.nvrtc.cache_dir()
    found = _tuners.get(directory)
    if found is None:
        found = _tuners.setdefault(directory, tune.Tuner(directory))
    return found


def _capturing(stream: Any, index: int) -> bool:
    """Whether ``stream`` is capturing a graph (then nothing may be timed or synchronized)."""
    handle = stream.cuda_stream
    status = gpurt.check(cu.cuStreamIsCapturing(cu.CUstream(handle)), "cuStreamIsCapturing")
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


_SPIN = r"""
extern "C" __global__ void gemm_tune_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _time_config(plan: _Plan, problem: Problem, config: Config, tuning_stream: Any) -> float:
    """Device time (ms) of one run of ``config`` into a scratch output: the median of three
    batches, each queued behind a spin kernel so that host time never counts as device time."""
    scratch = gpurt.empty((plan.m, plan.n), dtype=plan.out.dtype, device=plan.index,
                          stream=tuning_stream)
    spin = gpurt.compile(_SPIN, arch=gpurt.get_arch(plan.index))["gemm_tune_spin"]
    saved = plan.ldc
    plan.ldc = plan.n

    def batch(count: int) -> float:
        cycles = int(2e9 * (200e-6 + count * 150e-6))  # covers the host enqueueing `count`
        spin(1, 1, (np.int64(cycles),), stream=tuning_stream)
        start, stop = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
        start.record(tuning_stream)
        for _ in range(count):
            _launch(plan, problem, config, 1.0, 0.0, scratch, None, tuning_stream)
        stop.record(tuning_stream)
        stop.synchronize()
        return start.elapsed_time(stop) / count

    try:
        first = batch(1)  # compiles, loads and warms up
        count = max(1, min(20, int(2.0 / max(first, 1e-3))))  # about 2 ms per batch
        return sorted(batch(count) for _ in range(3))[1]
    finally:
        plan.ldc = saved
        tuning_stream.synchronize()


def _choose(plan: _Plan, problem: Problem, stream: Any) -> Config:
    if not tune.autotune_enabled() or problem.macs < tune.TUNE_MIN_MACS:
        return tune.heuristic(problem)
    tuner = _tuner()
    name = gpurt.get_device_name(plan.index)
    key = tune.problem_key(problem, name, _source_digest())
    known = tuner.lookup(key)
    if known is not None and tune.eligible(problem, known):
        return known
    if _capturing(stream, plan.index):
        return tune.heuristic(problem)
    gpurt.synchronize(plan.index)  # the inputs may come from any stream
    with gpurt.device(plan.index):
        tuning_stream = gpurt.Stream()
    return tuner.choose(key, tune.candidates(problem),
                        lambda config: _time_config(plan, problem, config, tuning_stream))


# ---- public API ------------------------------------------------------------------------------------


def gemm(a: Any, b: Any, out: Any = None, alpha: float = 1.0, beta: float = 0.0, c: Any = None,
         trans_a: bool = False, trans_b: bool = False, stream: Any = None, *,
         allow_tf32: bool = False, config: Optional[Config] = None) -> Any:
    """``alpha * op(a) @ op(b) + beta * c`` with ``op(x) = x.T`` when ``trans_x``.

    ``a``/``b``: 2-D float32/float16/bfloat16 device arrays of one dtype (gpurt, torch,
    CuPy), any unit-stride layout. ``out``: the (M x N) result to write (a new gpurt Array
    when None; it may be column-major or ``c`` itself); ``c`` defaults to ``out`` when
    ``beta != 0`` (and is not read when ``beta == 0``). float32 runs exactly on the CUDA cores
    unless ``allow_tf32`` lets it use TF32 tensor cores. ``config`` forces a kernel variant
    (see kernels/_gemm_tune.py). Runs on ``stream`` (default: gpurt's current stream) and
    returns ``out``."""
    first = _as_array(a, "a")
    stream = _stream_object(stream, first.device.index)
    plan, returned, copy_back = _plan(first, b, out, float(beta), c, trans_a, trans_b, stream)
    if plan.m == 0 or plan.n == 0:
        return returned
    index = plan.index
    if index != gpurt.current_device():
        with gpurt.device(index):
            _run(plan, alpha, beta, stream, allow_tf32, config)
    else:
        _run(plan, alpha, beta, stream, allow_tf32, config)
    if copy_back is not None:
        copy_back.copy_(plan.out)
    return returned


def _run(plan: _Plan, alpha: float, beta: float, stream: Any, allow_tf32: bool,
         config: Optional[Config]) -> None:
    problem = _problem(plan, allow_tf32)
    if plan.k == 0:  # nothing to multiply: out = beta * c through any kernel's epilogue
        problem = dataclasses.replace(problem, tma=False)
    if config is None:
        config = _choose(plan, problem, stream)
    if not tune.eligible(problem, config):
        raise ValueError(f"config {config.label()} cannot run this problem ({problem}); "
                         f"GPURT_GEMM_DISABLE={os.environ.get('GPURT_GEMM_DISABLE', '')!r}")
    _launch(plan, problem, config, alpha, beta, plan.out, plan.cin, stream)


def gemm_config(a: Any, b: Any, trans_a: bool = False, trans_b: bool = False, *,
                allow_tf32: bool = False) -> Config:
    """The config :func:`gemm` would use for these operands without tuning (heuristics)."""
    a, _, op_a, op_b, m, n, k, dt = _operands(a, b, trans_a, trans_b)
    plan = _Plan(op_a, op_b, m, n, k, None, n, None, 0, dt, a.device.index)
    return tune.heuristic(_problem(plan, allow_tf32))


def gemm_tuning_results() -> dict[str, dict[str, Any]]:
    """What the autotuner has measured and remembered (key -> config, time, candidates)."""
    return _tuner().results()


def clear_gemm_tuning() -> None:
    """Forget the autotuner's results, in memory and on disk."""
    _tuner().clear()
