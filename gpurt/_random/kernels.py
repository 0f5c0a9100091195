"""gpurt.random's kernels: compiled per (distribution, dtype) from random.cu on first use,
launched over an array described by a :func:`layout` (element strides after merging).

Launches are grid-stride loops over element blocks; since each block's value depends only on
(seed, offset, block index), the grid size is a free choice: enough blocks to fill the
device, capped so each thread handles a few blocks.
"""

from __future__ import annotations

import functools
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import nvrtc
from .._core.fork import renew_after_fork
from ..device import device as _device_ctx
from ..device import get_arch, get_device_properties

__all__ = [
    "HERE",
    "INCLUDE_DIR",
    "MAX_DIMS",
    "TYPE_NAMES",
    "grid_for",
    "kernel",
    "layout",
    "per_store",
    "set_state_kernel",
]

HERE = Path(__file__).resolve().parent
INCLUDE_DIR = HERE / "include"
SOURCE_PATH = HERE / "random.cu"
MAX_DIMS = 8
THREADS = 256
_LAYOUT = struct.Struct(f"<qq{MAX_DIMS}q{MAX_DIMS}q")

# numpy dtype name -> the C++ type the kernels are instantiated with
TYPE_NAMES: dict[str, str] = {
    "float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
    "bool": "bool", "int8": "signed char", "uint8": "unsigned char", "int16": "short",
    "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int",
    "int64": "long long", "uint64": "unsigned long long",
}

_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)
_kernels: dict[tuple[str, str], Any] = {}
_resident: dict[tuple[int, Any], int] = {}  # (device, kernel) -> CTAs resident at once


@functools.lru_cache(maxsize=1)
def source() -> str:
    return SOURCE_PATH.read_text()


def kernel(template: str, dtype: np.dtype, device: int) -> Any:
    """The Kernel ``template<T>`` for ``dtype`` on ``device``'s architecture."""
    arch = get_arch(device)
    expression = f"{template}<{TYPE_NAMES[dtype.name]}>"
    key = (arch, expression)
    found = _kernels.get(key)
    if found is None:
        module = nvrtc.compile(source(), name_expressions=(expression,),
                               include_paths=(str(INCLUDE_DIR),), arch=arch,
                               program_name="random.cu")
        with _lock:
            found = _kernels.setdefault(key, module[expression])
    return found


def set_state_kernel(device: int) -> Any:
    """philox_set_state (the replay-time write of a generator's device state)."""
    arch = get_arch(device)
    key = (arch, "philox_set_state")
    found = _kernels.get(key)
    if found is None:
        module = nvrtc.compile(source(), include_paths=(str(INCLUDE_DIR),), arch=arch,
                               program_name="random.cu")
        with _lock:
            found = _kernels.setdefault(key, module["philox_set_state"])
    return found


def _merge(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Drop size-1 dimensions and merge neighbours that are contiguous with each other
    (C order kept, so element i is still the i-th in C order)."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    merged: list[list[int]] = []
    for n, s in dims:
        if merged and merged[-1][1] == n * s:
            merged[-1] = [merged[-1][0] * n, s]
        else:
            merged.append([n, s])
    return [n for n, _ in merged], [s for _, s in merged]


def check_no_overlap(shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """ValueError when two elements may share memory (a written array must not)."""
    dims = sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1)
    reach = 0  # elements spanned by the smaller dimensions, minus one
    for stride, n in dims:
        if stride <= reach:
            raise ValueError(
                f"an output with shape {shape} and element strides {strides} has elements "
                "that share memory (e.g. a broadcast view); random fills write every element")
        reach += stride * (n - 1)


def per_store(itemsize: int, block: int) -> int:
    """Elements a thread stores at once: whole Philox blocks of ``block`` elements filling
    16 bytes (random.cu's calls_per_store), or one block when it is wider."""
    return max(block, 16 // itemsize)


def layout(shape: tuple[int, ...], strides_bytes: tuple[int, ...], itemsize: int, ptr: int,
           block: int, written: bool = True) -> bytes:
    """The kernels' Layout struct for an array (``block``: elements per vector store, aligned
    to their size up to 16 bytes); an array that is ``written`` must not have elements that
    share memory."""
    strides = tuple(s // itemsize if n != 1 else 0 for n, s in zip(shape, strides_bytes))
    if any(n != 1 and s * itemsize != b for n, s, b in zip(shape, strides, strides_bytes)):
        raise ValueError(f"strides {strides_bytes} are not multiples of the item size {itemsize}")
    if written:
        check_no_overlap(shape, strides)
    dims, steps = _merge(shape, strides)
    if not dims or (len(dims) == 1 and steps[0] == 1):
        mode = 0 if ptr % min(itemsize * block, 16) == 0 else 1
        dims, steps = [1], [1]
    else:
        mode = 2
    if len(dims) > MAX_DIMS:
        raise ValueError(f"an array whose strides leave {len(dims)} dimensions after merging "
                         f"contiguous ones; gpurt.random handles up to {MAX_DIMS}")
    pad = MAX_DIMS - len(dims)
    return _LAYOUT.pack(len(dims), mode, *dims, *([1] * pad), *steps, *([0] * pad))


def grid_for(kernel: Any, device: int, chunks: int) -> int:
    """CTAs for ``chunks`` stores (one thread each, grid-stride beyond): at most as many as
    are resident at once on ``device``. Every CTA of the grid-stride loop has the same work,
    so a grid past one full wave would run a partial second wave on idle SMs (8 CTAs per SM
    where registers allow 6 cost a third of the bandwidth)."""
    key = (device, kernel)
    most = _resident.get(key)
    if most is None:
        with _device_ctx(device):
            per_sm = kernel.max_active_blocks_per_multiprocessor(THREADS)
        sms = int(get_device_properties(device).multi_processor_count)
        most = _resident.setdefault(key, max(1, per_sm) * sms)
    return max(1, min((chunks + THREADS - 1) // THREADS, most))
