"""The packed route: GEMM operands whose rows TMA cannot read, copied first.

TMA (and so the wgmma and decode kernels) needs every operand's base address and row pitch
to be 16-byte multiples. A 4099-wide 16-bit matrix has 8198-byte rows, so such problems ran
on the mma.sync kernel with narrow loads: 4099^3 bf16 at 114 TFLOP/s where aligned 4096^3
runs wgmma at 728 (an H100, benchmarks/notes_gemm.md). Here the offending operand(s) are
copied (one launch of kernels/gemm_pack.cu for both) into rows of a 128-byte-multiple pitch
in the stream's workspace (kernels/_gemm_workspace.py: kept per stream, fresh memory while
a stream captures a graph, shown in gpurt.memory_stats), and the normal TMA kernel runs on
the copies. C's rows need no copy to be written (the wgmma epilogue's plain stores take any
pitch, and so do its reads of Cin, beta != 0), but on rows that are not 16-byte multiples
it stores element by element: where :func:`c_pays` says so the wgmma kernel writes a
128-byte-pitched C in the scratch (TMA stores) instead and a second launch of the same copy
kernel moves it into the user's C (Cin is read from the user's C directly, so beta needs
nothing more): 4096x4099x4096 bf16 ran 294 us that way against 349 (an H100).

:func:`pays` is the cost model that picks the route: the copies' bytes over the copy
bandwidth against the time the TMA kernel saves, so small problems keep the path they had
(the copy launch would cost more), and so do shapes with no TMA kernel to gain (TF32 at
M <= 16) and decode shapes up to M = 16 with the big operand to copy (split-K mma reads its
rows as they are faster than copying them); from M = 64 the copies pay.
``GPURT_GEMM_DISABLE=pack`` turns the route off (C's copy-back too).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import gpurt

from . import _gemm_workspace as workspace
from ._gemm_config import Config, Problem
from ._gemm_launch import Call, compile_kernels, planned_call
from ._gemm_rows import PlannedRows, RowsCall
from ._gemm_tune import disabled_kernels
from ._gemm_types import DT_F32, DT_TF32

__all__ = ["PackCopy", "PackedCall", "PlannedPacked", "copies_for", "estimate_us", "pays",
           "make_packed", "planned_packed", "copy_arguments", "copy_kernel", "copy_grid",
           "scratch_bytes", "tma_ready", "packed_plan", "copied_plan", "copy_us", "PLACEHOLDER",
           "SOURCE", "c_copy_for", "c_pays", "c_copy_if_pays", "copy_back_arguments",
           "simt_pays"]

SOURCE = "gemm_pack.cu"
_THREADS = 256
_ROWS_PER_BLOCK = 8  # a warp per row (gemm_pack.cu: kWarps)
# Where plans made before the copies' place is known put them: 128-byte aligned, not null.
PLACEHOLDER = 1 << 20


@dataclasses.dataclass(frozen=True)
class PackCopy:
    """One operand's copy: ``rows`` rows of ``width`` elements, ``src_ld`` elements apart in
    the operand, go to byte ``offset`` of the scratch, ``pitch`` elements apart (a 128-byte
    multiple). ``which`` is 0 for A, 1 for B (the kernel's operands), 2 for C, which goes the
    other way: from the scratch into the user's C (``src_ld`` is then C's pitch)."""

    which: int
    offset: int
    width: int
    rows: int
    src_ld: int
    pitch: int


def tma_ready(ptr: int, ld: int, itemsize: int) -> bool:
    """Whether an operand at ``ptr`` with rows ``ld`` elements apart meets TMA's rules."""
    return ptr % 16 == 0 and ld * itemsize % 16 == 0


def copies_for(operands: list[tuple[int, int, bool, int, int]], itemsize: int,
               simt: bool = False) -> tuple[PackCopy, ...]:
    """The copies that make every operand TMA-ready: ``operands`` are (ptr, ld, kmajor,
    rows, k) of A and B (rows x k logical, as kernels/_gemm_plan.py's Operand); each one that is
    not TMA-ready is copied as stored (K-major: ``rows`` rows of ``k``; else ``k`` of
    ``rows``), the copies one after another from 128-byte boundaries. An operand whose base
    is not a whole element from 0 cannot be copied element-wise: then none is returned.
    ``simt``: only the operands the simt kernel loads 16 bytes at a time (not K-major: it
    copies K-major ones 4 bytes at a time, transposing, at any alignment)."""
    found: list[PackCopy] = []
    offset = 0
    for which, (ptr, ld, kmajor, rows, k) in enumerate(operands):
        if tma_ready(ptr, ld, itemsize) or (simt and kmajor):
            continue
        if ptr % itemsize:
            return ()
        width, count = (k, rows) if kmajor else (rows, k)
        pitch = -(-width * itemsize // 128) * 128 // itemsize
        found.append(PackCopy(which, offset, width, count, ld, pitch))
        offset += -(-pitch * itemsize * count // 128) * 128
    return tuple(found)


def c_copy_for(out_ptr: int, ldc: int, m: int, n: int, itemsize: int,
               offset: int) -> PackCopy | None:
    """C's copy-back where its rows are not TMA-ready (else None): the m x n C computed into
    the scratch from byte ``offset`` (rounded up to 128), rows of a 128-byte-multiple pitch."""
    if tma_ready(out_ptr, ldc, itemsize) or out_ptr % itemsize:
        return None
    pitch = -(-n * itemsize // 128) * 128 // itemsize
    return PackCopy(2, -(-offset // 128) * 128, n, m, ldc, pitch)


def packed_plan(plan: Any, copies: tuple[PackCopy, ...]) -> Any:
    """kernels/_gemm_plan.py's ``plan`` with each copied operand replaced by its copy: no array, a
    placeholder pointer (128-byte aligned, the copy's offset past :data:`PLACEHOLDER`), the
    copy's pitch."""
    ops = [plan.a, plan.b]
    for copy in copies:
        ops[copy.which] = dataclasses.replace(ops[copy.which], array=None,
                                              ptr=PLACEHOLDER + copy.offset, ld=copy.pitch)
    return dataclasses.replace(plan, a=ops[0], b=ops[1])


def copied_plan(plan: Any, packed: Any, copies: tuple[PackCopy, ...], stream: Any) -> Any:
    """``packed`` (:func:`packed_plan`) on real copies of ``plan``'s operands, made now on
    ``stream`` into new memory, for the tuner to time configs on."""
    itemsize = plan.itemsize
    room = gpurt.empty(scratch_bytes(copies, itemsize) // 4 + 32, dtype=np.float32,
                       device=plan.index, stream=stream)
    start = -(-room.ptr // 128) * 128
    args, a_ptr, b_ptr = copy_arguments(copies, plan.a.ptr, plan.b.ptr, start)
    sms = gpurt.get_device_properties(plan.index).multi_processor_count
    copy_kernel(plan.dt, plan.index)(copy_grid(copies, sms), _THREADS, args, stream=stream)
    a = dataclasses.replace(packed.a, array=room, ptr=a_ptr) if packed.a.array is None \
        else packed.a
    b = dataclasses.replace(packed.b, array=room, ptr=b_ptr) if packed.b.array is None \
        else packed.b
    return dataclasses.replace(packed, a=a, b=b)


def scratch_bytes(copies: tuple[PackCopy, ...], itemsize: int) -> int:
    return max((c.offset + c.pitch * itemsize * c.rows for c in copies), default=0)


def _pair_ok(ptr: int, ld: int, itemsize: int) -> bool:
    """Whether the epilogue may store C in pairs (kernels/_gemm_launch.py's ``pair_ok``)."""
    return ptr % (2 * itemsize) == 0 and ld % 2 == 0


# ---- the cost model ------------------------------------------------------------------------

# Rates of a whole H100/H200 (132 SMs), measured (notes_gemm.md, session 8 on an H100): 16-bit
# wgmma 728 TFLOP/s at 4096^3, the mma.sync path on rows TMA cannot read 114 at 4099^3 (TF32:
# wgmma ~0.98 of cuBLAS TF32, mma 70); on small grids the mma path runs far below that
# (128 x 4099^2 bf16: 130 CTAs of 64 x 64 at 17 TFLOP/s), charged here as the fraction of 4
# CTAs per SM its grid fills; wgmma grids are charged for their last wave's idle SMs. The
# skinny kernel streams the big operand once, on split rows at ~0.7 TB/s (46.7 us for a
# 4099^2 bf16 weight at M = 1, 51.1 at M = 16), near copy speed on 16-byte rows.
_WGMMA_FLOPS = {False: 700e12, True: 350e12}  # by TF32
_MMA_FLOPS = {False: 115e12, True: 70e12}
_MMA_CTAS_PER_SM = 4
_SM_REF = 132
_MEMORY_BW = 3.0e12  # bytes/s read + written, copy bandwidth (H100 ~3.0, H200 ~4.0)
_SKINNY_SPLIT_BW = 0.7e12  # the skinny kernel's bytes/s on rows that are not 16-byte multiples
# the mma kernels' on such rows, before their math: split-K 64 x 64 took 37.4, 42.6 and 65.7 us
# for M = 1, 16 and 64 x 4099 x 4099 bf16 (an H100, session 8 padc; TF32 M = 1: 60.5)
_MMA_SPLIT_BW = 0.9e12
# TF32's 16-row split-K tile (_gemm_tune._TF32_THIN, M <= 16) on such rows, streaming B with
# 4-byte cp.async: 1 x 4099^2 in 37.5 us = 1.8 TB/s (an H100, session 9 s9-tf32m), against
# 79.6 us for copies + TF32 decode tiles at 16 x 4099^2
_TF32_THIN_BW = 1.8e12
# the rowload kernel's (kernels/gemm_rowload.cu): aligned 16-byte loads on rows of any pitch;
# 1.24-2.36 TB/s of B at M <= 4 (an H100, session 9 s9-rowload: 18.0 us at 1 x 4099^2, 27.1 at
# 4 x 4099^2, 38.1 at 1 x 11003 x 4093)
_ROWLOAD_BW = 1.8e12
# gemm_pack's bytes read + written per second: 2.46-2.55 TB/s element by element (an H100,
# as fast as a device-to-device copy of the same bytes; cuMemcpy2DAsync took twice as long).
# With 16-byte chunks (session 19) about 3.0 (the packed route at 97x4093x4099 bf16 4.6 us
# faster, 68.7 MB moved), but the model keeps 2.5: at 3.0 it would copy for M = 8..16 x
# 4099^2, where split-K mma on the rows as they are runs 30 us against ~37 copied (its 0.9 TB/s
# below overstates that kernel now); with the tuner on, the times decide (_gemm_route.py).
_COPY_BW = 2.5e12
_LAUNCH_US = 3.0  # the copy launch's own cost: a launch and a tail wave
_MARGIN = 0.9  # the packed route must save 10% by the model before it is taken
_MIN_SAVING_US = 2.0  # and at least this much
# C elements per second the wgmma epilogue's plain stores cost on top of the kernel on rows
# that are not 16-byte multiples, by whether it may store pairs (an H100, session 8 padc: the
# time C's copy-back saved plus the copy's own, over C's elements: 1.6-2.9e11 element by
# element at 1031^2 to 4099^2, bf16 and TF32; 3.5e11 in pairs at 4096 x 4098 bf16)
_UNALIGNED_C_RATE = {False: 2.0e11, True: 3.5e11}


def _fill(config: Config, problem: Problem) -> float:
    """The share of the device a grid keeps busy: a persistent wgmma grid's tiles over the
    slots of its whole waves; an mma grid's CTAs over 4 per SM (at most 1)."""
    items = config.tiles(problem.m, problem.n) * config.split_k
    if config.kernel == "mma":
        return min(1.0, items / (_MMA_CTAS_PER_SM * problem.sm_count))
    if config.kernel != "wgmma":
        return 1.0
    waves = -(-items // problem.sm_count)
    return items / (waves * problem.sm_count)


def estimate_us(config: Config, problem: Problem) -> float | None:
    """A rough kernel time (us) of ``config`` on ``problem``: FLOPs over the family's rate
    (charged for the grid's fill), or the bytes each operand moves once over the memory
    bandwidth, whichever is longer; the skinny kernel by its bytes alone. None for simt (exact
    fp32: no TMA kernel to copy for)."""
    tf32 = problem.dt == DT_TF32
    itemsize = 4 if problem.dt in (DT_F32, DT_TF32) else 2
    moved = (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n) * itemsize
    if config.kernel == "skinny":
        return moved / (_MEMORY_BW if problem.vec else _SKINNY_SPLIT_BW) * 1e6
    if config.kernel == "rowload":  # aligned loads on rows of any pitch
        return moved / _ROWLOAD_BW * 1e6
    if config.kernel in ("wgmma", "decode"):
        rate = _WGMMA_FLOPS[tf32]
    elif config.kernel == "mma":
        rate = _MMA_FLOPS[tf32]
    else:
        return None
    rate *= _fill(config, problem) * problem.sm_count / _SM_REF
    if config.kernel == "mma" and tf32 and config.bm == 16 and not problem.vec:
        return moved / _TF32_THIN_BW * 1e6  # a batch of at most 16: streaming-bound
    if config.kernel == "mma" and not problem.vec:  # narrow loads: streaming, then the math
        return (moved / _MMA_SPLIT_BW + 2.0 * problem.macs / rate) * 1e6
    return max(2.0 * problem.macs / rate, moved / _MEMORY_BW) * 1e6


def copy_us(copies: tuple[PackCopy, ...], itemsize: int) -> float:
    """The copies' modelled time (us): bytes read and written over the copy bandwidth."""
    moved = sum(2 * c.width * c.rows * itemsize for c in copies)
    return _LAUNCH_US + moved / _COPY_BW * 1e6


def pays(today: Config, problem: Problem, packed: Config, packed_problem: Problem,
         copies: tuple[PackCopy, ...]) -> bool:
    """Whether copying (``copies``) and running ``packed`` on ``packed_problem`` should beat
    running ``today`` on ``problem`` by the model's margin."""
    if not copies or packed.kernel not in ("wgmma", "decode"):
        return False
    before = estimate_us(today, problem)
    after = estimate_us(packed, packed_problem)
    if before is None or after is None:
        return False
    itemsize = 4 if problem.dt in (DT_F32, DT_TF32) else 2
    packed_us = copy_us(copies, itemsize) + after
    return packed_us < _MARGIN * before and packed_us + _MIN_SAVING_US < before


# fp32 on the CUDA cores (kernels/gemm_simt.cu): rows that are not 16-byte multiples take
# 4-byte copies in the main loop. On an H100 (notes_gemm.md, s10-simt) 2053 x 3001 x 1999's
# 128 x 256 rows ran at 43 TFLOP/s where 3000^3's aligned ones ran at 49; the wave model
# (kernels/_gemm_rows.py's ``modelled``, _SIMT_UNIT_US a unit) charges them
# kernels/_gemm_simt_model.py's _RATE_UNALIGNED. The copies must model at least 3% faster (the
# cut's own margin).
_SIMT_UNIT_US = 2.6
_SIMT_MARGIN = 0.97


def simt_pays(before: float, after: float, copies: tuple[PackCopy, ...]) -> bool:
    """Whether copying (``copies``, fp32) and running a simt plan of modelled cost ``after``
    should beat ``before`` (both kernels/_gemm_rows.py's ``modelled`` units)."""
    if not copies:
        return False
    packed_us = copy_us(copies, 4) + after * _SIMT_UNIT_US
    before_us = before * _SIMT_UNIT_US
    return packed_us < _SIMT_MARGIN * before_us and packed_us + _MIN_SAVING_US < before_us


def c_pays(config: Config, c_copy: PackCopy | None, out_ptr: int, itemsize: int) -> bool:
    """Whether ``config`` writing C into the scratch and copying it back (``c_copy``, of C at
    ``out_ptr``) should beat its epilogue storing into C's unaligned rows directly; only for
    the wgmma kernels, whose epilogue is made for aligned rows (TMA or paired stores)."""
    if c_copy is None or config.kernel != "wgmma":
        return False
    pair_ok = _pair_ok(out_ptr, c_copy.src_ld, itemsize)
    penalty = c_copy.rows * c_copy.width / _UNALIGNED_C_RATE[pair_ok] * 1e6
    cost = copy_us((c_copy,), itemsize)
    return cost < _MARGIN * penalty and cost + _MIN_SAVING_US < penalty


def c_copy_if_pays(plan: Any, problem: Problem, config: Config,
                   copies: tuple[PackCopy, ...]) -> PackCopy | None:
    """C's copy-back for kernels/_gemm_plan.py's ``plan`` (behind ``copies``) where ``config``
    writing C's rows directly would cost more (:func:`c_pays`), else None. Off with
    ``GPURT_GEMM_DISABLE=pack``, and off GPUs without the TMA kernels."""
    if problem.capability != (9, 0) or "pack" in disabled_kernels():
        return None
    itemsize = plan.itemsize
    c_copy = c_copy_for(plan.out.ptr, plan.ldc, plan.m, plan.n, itemsize,
                        scratch_bytes(copies, itemsize))
    return c_copy if c_pays(config, c_copy, plan.out.ptr, itemsize) else None


# ---- launching -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PackedCall:
    """A :class:`Call` (``inner``, planned on the copies' pitches; for fp32 on the CUDA
    cores also a cut along M, :class:`RowsCall`) behind the copies of ``copies``
    (kernels/gemm_pack.cu's ``kernel``, ``grid``; none where only C is copied) and, with
    ``c_copy``, writing C into the scratch, copied back by a second launch of the kernel
    (``c_grid``). ``m``, ``n``: C's shape as the plan had it (the inner call may be turned
    around: TF32's C^T = B^T A^T)."""

    inner: Call | RowsCall
    copies: tuple[PackCopy, ...]
    kernel: Any
    grid: tuple[int, int, int]
    scratch: int  # bytes
    m: int
    n: int
    swap: bool = False  # always: m and n are C's own (an inner Call's may be turned around)
    c_copy: PackCopy | None = None
    c_grid: tuple[int, int, int] = (1, 1, 1)

    @property
    def index(self) -> int:
        return self.inner.index

    @property
    def config(self) -> Config:
        return self.inner.config

    def label(self) -> str:
        copied = "".join("AB"[c.which] for c in self.copies) + ("C" if self.c_copy else "")
        inner = self.inner
        return (inner.label() if isinstance(inner, RowsCall) else inner.config.label()) + \
            " pack" + copied

    def _room(self, handle: int | None) -> workspace.Workspace:
        """The stream's workspace with the scratch and the room each split part needs (a
        cut's parts take theirs from the same workspace: asked for here, they find it)."""
        inner = self.inner
        parts = (inner.head, inner.tail) if isinstance(inner, RowsCall) else (inner,)
        partials = counters = 0
        for part in parts:
            config = part.config
            if config.split_k > 1 and config.kernel in ("mma", "simt", "wgmma"):
                partials = max(partials, part.partials)
                counters = max(counters, part.counters)
        return workspace.take(inner.index, handle, partials, counters, self.scratch)

    def arguments(self, a_ptr: int, b_ptr: int,
                  scratch: int) -> tuple[tuple[Any, ...], int, int]:
        """(the copy kernel's arguments, A's and B's pointers for the GEMM kernel)."""
        return copy_arguments(self.copies, a_ptr, b_ptr, scratch)

    def c_target(self, out_ptr: int, scratch: int) -> int:
        """Where the GEMM kernel writes C: the scratch's C, or ``out_ptr``."""
        return out_ptr if self.c_copy is None else scratch + self.c_copy.offset

    def launch(self, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int, alpha: float,
               beta: float, stream: Any) -> None:
        """The copies, the GEMM on them, C's copy back, on ``stream`` (None: current)."""
        inner = self.inner
        with workspace.LOCK:
            handle = None if stream is None else gpurt.as_stream_handle(stream, inner.index)
            room = self._room(handle)
            args, a_ptr, b_ptr = self.arguments(a_ptr, b_ptr, room.scratch)
            if self.copies:
                self.kernel(self.grid, _THREADS, args, stream=stream)
            target = self.c_target(out_ptr, room.scratch)
            if isinstance(inner, RowsCall) or inner.config.kernel in ("skinny", "decode") \
                    or inner.config.split_k == 1:
                inner.launch(a_ptr, b_ptr, target, cin_ptr, alpha, beta, stream)
            else:
                inner._launch_main(a_ptr, b_ptr, target, cin_ptr, room.partials,
                                   room.counters, alpha, beta, stream)
            if self.c_copy is not None:
                self.kernel(self.c_grid, _THREADS, copy_back_arguments(self.c_copy, target,
                                                                        out_ptr), stream=stream)


class PlannedPacked:
    """``planned(stream_handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)`` of a
    :class:`PackedCall`: the copy launches and the inner call's planned launch, each checked
    and packed once; per call it takes the scratch (and split-K's room) from the stream's
    workspace."""

    __slots__ = ("call", "pack", "inner", "back")

    def __init__(self, call: PackedCall, pack: Any, inner: Any, back: Any) -> None:
        self.call, self.pack, self.inner, self.back = call, pack, inner, back

    def __call__(self, handle: Any, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int,
                 alpha: float, beta: float) -> None:
        call = self.call
        with workspace.LOCK:
            room = call._room(handle)
            args, a_ptr, b_ptr = call.arguments(a_ptr, b_ptr, room.scratch)
            if self.pack is not None:
                self.pack(handle, args[0], args[2], args[6], args[8])
            target = call.c_target(out_ptr, room.scratch)
            config = call.inner.config
            if isinstance(self.inner, PlannedRows) or config.kernel in ("skinny", "decode") \
                    or config.split_k == 1:
                self.inner(handle, a_ptr, b_ptr, target, cin_ptr, alpha, beta)
            else:  # the room taken above holds the partials and counters too
                self.inner._main(handle, a_ptr, b_ptr, target, cin_ptr, alpha, beta,
                                 (room.partials, room.counters))
            if self.back is not None:
                self.back(handle, target, out_ptr)


def copy_arguments(copies: tuple[PackCopy, ...], a_ptr: int, b_ptr: int,
                   scratch: int) -> tuple[tuple[Any, ...], int, int]:
    """(gemm_pack's arguments copying ``copies`` of A at ``a_ptr`` and B at ``b_ptr`` into
    ``scratch``, the pointers the GEMM kernel then reads A and B at)."""
    args: list[Any] = []
    pointers = [a_ptr, b_ptr]
    for copy in copies:
        src, dst = pointers[copy.which], scratch + copy.offset
        args += [src, copy.src_ld, dst, copy.pitch, copy.width, copy.rows]
        pointers[copy.which] = dst
    args += [0, 0, 0, 0, 0, 0] * (2 - len(copies))
    return tuple(args), pointers[0], pointers[1]


def copy_back_arguments(c_copy: PackCopy, src: int, out_ptr: int) -> tuple[Any, ...]:
    """gemm_pack's arguments copying C from the scratch (at ``src``) into C at ``out_ptr``."""
    return (src, c_copy.pitch, out_ptr, c_copy.src_ld, c_copy.width, c_copy.rows,
            0, 0, 0, 0, 0, 0)


def copy_kernel(dt: int, index: int) -> Any:
    """gemm_pack for element type ``dt``, compiled for device ``index``'s architecture."""
    element = "unsigned int" if dt in (DT_F32, DT_TF32) else "unsigned short"
    major, minor = gpurt.get_device_capability(index)
    return compile_kernels(SOURCE, (f"gemm_pack<{element}>",), f"sm_{major}{minor}")[0]


def copy_grid(copies: tuple[PackCopy, ...], sm_count: int) -> tuple[int, int, int]:
    """A block per 8 rows (a warp per row), at most 8 blocks per SM; y: the operand."""
    rows = max((c.rows for c in copies), default=0)
    return (max(1, min(-(-rows // _ROWS_PER_BLOCK), 8 * sm_count)), max(len(copies), 1), 1)


def make_packed(inner: Call | RowsCall, copies: tuple[PackCopy, ...], c_copy: PackCopy | None,
                m: int, n: int, sm_count: int) -> PackedCall:
    """The :class:`PackedCall` running ``inner`` behind ``copies`` (and C's ``c_copy``)."""
    dt = inner.head.dt if isinstance(inner, RowsCall) else inner.dt
    itemsize = 4 if dt in (DT_F32, DT_TF32) else 2
    everything = copies + ((c_copy,) if c_copy is not None else ())
    c_grid = copy_grid((c_copy,), sm_count) if c_copy is not None else (1, 1, 1)
    return PackedCall(inner, copies, copy_kernel(dt, inner.index),
                      copy_grid(copies, sm_count), scratch_bytes(everything, itemsize), m, n,
                      c_copy=c_copy, c_grid=c_grid)


def planned_packed(call: PackedCall, a_ptr: int, b_ptr: int, out_ptr: int,
                   cin_ptr: int) -> PlannedPacked:
    """The planned launches of ``call`` (planned on the call's device; the copies' targets
    and the pointers the GEMM kernel reads vary per call, placeholders here)."""
    args, a_in, b_in = call.arguments(a_ptr, b_ptr, PLACEHOLDER)
    pack = back = None
    if call.copies:
        launch = gpurt.LaunchConfig(call.grid, _THREADS)
        pack = call.kernel.planned(launch, *args, varying=(0, 2, 6, 8), device=call.index)
    target = call.c_target(out_ptr, PLACEHOLDER)
    if call.c_copy is not None:
        back = call.kernel.planned(gpurt.LaunchConfig(call.c_grid, _THREADS),
                                   *copy_back_arguments(call.c_copy, target, out_ptr),
                                   varying=(0, 2), device=call.index)
    inner = (PlannedRows(call.inner, a_in, b_in, target, cin_ptr)
             if isinstance(call.inner, RowsCall) else
             planned_call(call.inner, a_in, b_in, target, cin_ptr))
    return PlannedPacked(call, pack, inner, back)
