"""One Philox stream's state: a seed and an offset, and what CUDA graph capture needs.

A :class:`GeneratorState` is what a ``gpurt.Generator`` points at (several generators may
share one: ``graphsafe_set_state``). Eagerly, a draw of ``n`` values per element block takes
the current offset and advances it by ``n`` rounded up to a multiple of 4 (torch's
``philox_engine_inputs``). During capture into a CUDA graph the kernels read seed and offset
from a small device buffer instead, plus an offset inside the graph that advances here;
each replay writes the generator's seed and offset into that buffer first and advances the
offset by the graph's total (gpurt/_random/capture.py), as torch's CUDAGeneratorState does.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

import numpy as np

from .. import array as _array
from .._streams.handles import stream_is_capturing
from ..streams import ExternalStream, current_stream

__all__ = [
    "DEFAULT_SEED",
    "STATE_VERSION",
    "GeneratorState",
    "PhiloxCudaState",
    "decode_state",
    "encode_state",
    "stream_is_capturing",
]

DEFAULT_SEED = 67280421310721  # torch's default CUDA seed (default_rng_seed_val)
STATE_VERSION = 1
_STATE = struct.Struct("<QQQ")  # version, seed, offset: little-endian uint64 each
STATE_SIZE = _STATE.size
_U64 = (1 << 64) - 1


class PhiloxCudaState(ctypes.Structure):
    """What a kernel needs to draw from a generator (``gpurt::PhiloxCudaState`` in
    <gpurt/random.cuh>, 48 bytes): pass it as the kernel's by-value struct argument and read
    it with ``gpurt::philox_unpack``."""

    _fields_ = [
        ("seed", ctypes.c_uint64),
        ("offset", ctypes.c_uint64),
        ("seed_ptr", ctypes.c_uint64),
        ("offset_ptr", ctypes.c_uint64),
        ("intragraph_offset", ctypes.c_uint64),
        ("captured", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]

    def __repr__(self) -> str:
        if self.captured:
            return (f"PhiloxCudaState(captured, seed_ptr=0x{self.seed_ptr:x}, "
                    f"offset_ptr=0x{self.offset_ptr:x}, "
                    f"intragraph_offset={self.intragraph_offset})")
        return f"PhiloxCudaState(seed={self.seed}, offset={self.offset})"


def seed_value(seed: Any) -> int:
    """A seed as torch takes it: any int, negative ones wrapped to uint64."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"a seed must be an int, got {type(seed).__name__}")
    return int(seed) & _U64


def round4(increment: int) -> int:
    if isinstance(increment, bool) or not isinstance(increment, (int, np.integer)):
        raise TypeError(f"the increment must be an int, got {type(increment).__name__}")
    if increment < 0:
        raise ValueError(f"the increment must be >= 0, got {increment}")
    return (int(increment) + 3) // 4 * 4


def encode_state(seed: int, offset: int) -> np.ndarray:
    """A state as a uint8 array: version, seed, offset as little-endian uint64s."""
    return np.frombuffer(_STATE.pack(STATE_VERSION, seed, offset), dtype=np.uint8).copy()


def decode_state(state: Any) -> tuple[int, int]:
    """(seed, offset) of a state made by encode_state (bytes-like or a uint8 array);
    ValueError for a wrong length, version or offset."""
    if isinstance(state, np.ndarray):
        if state.dtype != np.uint8 or state.ndim != 1:
            raise ValueError(f"a generator state is a 1-D uint8 array, got {state.dtype} with "
                             f"shape {state.shape}")
        data = state.tobytes()
    elif isinstance(state, (bytes, bytearray, memoryview)):
        data = bytes(state)
    else:
        raise TypeError(f"a generator state is bytes or a uint8 numpy array, got "
                        f"{type(state).__name__}")
    if len(data) != STATE_SIZE:
        raise ValueError(f"a generator state has {STATE_SIZE} bytes, got {len(data)}")
    version, seed, offset = _STATE.unpack(data)
    if version != STATE_VERSION:
        raise ValueError(f"unknown generator state version {version} (this gpurt writes "
                         f"{STATE_VERSION})")
    if offset % 4:
        raise ValueError(f"a generator state's offset must be a multiple of 4, got {offset}")
    return seed, offset



class GeneratorState:
    """Seed and offset of one Philox stream on one device, and its capture bookkeeping."""

    def __init__(self, device: int, seed: int = DEFAULT_SEED) -> None:
        self.device = device
        self.seed = seed
        self.offset = 0
        self.lock = threading.Lock()
        self.capturing = False
        self.intragraph = 0  # offset inside the graph being captured
        self.buffer: Any = None  # 2 uint64 on the device: seed, offset (made on first draw)

    def __repr__(self) -> str:
        return f"GeneratorState(cuda:{self.device}, seed={self.seed}, offset={self.offset})"

    def copy(self) -> GeneratorState:
        with self.lock:
            twin = GeneratorState(self.device, self.seed)
            twin.offset = self.offset
        return twin

    def set(self, seed: int, offset: int = 0) -> None:
        with self.lock:
            self._not_capturing("set the seed or state of")
            self.seed, self.offset = seed, offset

    def _not_capturing(self, what: str) -> None:
        if self.capturing:
            raise RuntimeError(f"cannot {what} a generator while a CUDA graph captures it")

    def engine_inputs(self, increment: int) -> tuple[int, int]:
        """(seed, offset) for an eager draw; the offset advances by the rounded increment."""
        step = round4(increment)
        with self.lock:
            self._not_capturing("take eager (seed, offset) from")
            seed, offset = self.seed, self.offset
            self.offset = (offset + step) & _U64
        return seed, offset

    def cuda_state(self, increment: int, capturing: bool, handle: Any) -> PhiloxCudaState:
        """The inputs of a draw on the stream ``handle``, which is (``capturing``) or is not
        capturing a CUDA graph. The first draw makes the state's device buffer."""
        if not capturing:
            if self.buffer is None:
                self._make_buffer(handle)
            seed, offset = self.engine_inputs(increment)
            return PhiloxCudaState(seed=seed, offset=offset)
        step = round4(increment)
        if not self.capturing:
            raise RuntimeError(
                "this stream is capturing a CUDA graph that this generator is not "
                "registered with: capture with gpurt.CUDAGraph (it registers the capture "
                "device's default generator) and register other generators with "
                "CUDAGraph.register_generator_state(generator) before capture_begin()")
        if self.buffer is None:
            self._make_buffer(handle)
        with self.lock:
            intragraph = self.intragraph
            self.intragraph += step
        ptr = int(self.buffer.ptr)
        return PhiloxCudaState(seed_ptr=ptr, offset_ptr=ptr + 8,
                               intragraph_offset=intragraph, captured=1)

    def _make_buffer(self, handle: Any) -> None:
        """The 2 uint64 (seed, offset) that captured kernels read, allocated on the drawing
        stream: from the regular pool when it is not capturing, from the graph's private
        pool when it is (the caching allocator makes that legal during capture). Nothing
        initialises it: every replay writes it before its kernels run."""
        stream = current_stream(self.device)
        if int(stream.cuda_stream) != int(handle):
            stream = ExternalStream(int(handle), self.device)
        with self.lock:
            if self.buffer is None:
                self.buffer = _array.empty((2,), np.uint64, stream=stream)

    # -- capture (called by gpurt/_random/capture.py) -----------------------------------

    def capture_prologue(self) -> None:
        """Before a capture begins: draws go to the graph from now on."""
        with self.lock:
            self._not_capturing("begin a second capture with")
            self.capturing, self.intragraph = True, 0

    def capture_epilogue(self) -> int:
        """After the capture: the graph's total offset increment."""
        with self.lock:
            self.capturing = False
            return self.intragraph

    def replay_prologue(self, increment: int, stream_handle: Any, set_state: Any) -> None:
        """Before a replay on the stream: write seed and offset where the graph reads them
        (``set_state``, a kernel), then advance the offset by the graph's total."""
        with self.lock:
            self._not_capturing("replay a graph with")
            seed, offset = self.seed, self.offset
            self.offset = (offset + increment) & _U64
        set_state(self.buffer, seed, offset, stream_handle)
