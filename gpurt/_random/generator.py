"""``gpurt.Generator`` and the per-device default generators (torch.cuda's names).

A Generator is a handle on a :class:`~gpurt._random.state.GeneratorState` (a seed and an
offset); ``graphsafe_get_state``/``graphsafe_set_state`` share states between generators
as torch does. Nothing here touches the GPU: a state's device buffer (where captured
kernels read seed and offset) is made on its first draw on the GPU.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from .._core.fork import renew_after_fork
from ..device import _index
from ..streams import Stream, as_stream_handle, current_stream_handle
from .state import (
    DEFAULT_SEED,
    GeneratorState,
    PhiloxCudaState,
    decode_state,
    encode_state,
    seed_value,
    stream_is_capturing,
)

__all__ = ["Generator", "default_generator", "stream_handle"]


def _device_index(device: Any) -> int:
    """A device ordinal; a plain int is taken as it is, so generators can be made and
    seeded without a GPU (it is checked when the generator is used on one)."""
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"invalid device ordinal {device}")
        return device
    return _index(device)


def stream_handle(stream: Any, device: int) -> Any:
    """The handle of ``stream`` (gpurt, torch, CuPy, cuda.core or an int; default: the
    current stream of ``device``); a gpurt Stream must be on ``device``."""
    if stream is None:
        return current_stream_handle(device)
    if isinstance(stream, Stream) and stream.device_index != device:
        raise ValueError(f"the stream is on cuda:{stream.device_index}, the work on cuda:{device}")
    return as_stream_handle(stream)


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


class Generator:
    """A Philox4x32-10 generator for one device (like ``torch.Generator(device='cuda')``).

    Its state is a seed and an offset; every draw takes the offset and advances it
    (docs/random.md says by how much), so draws never overlap and a state restored with
    ``set_state`` repeats them exactly."""

    def __init__(self, device: Any = None, *, _state: GeneratorState | None = None) -> None:
        self._state = _state if _state is not None else GeneratorState(_device_index(device))

    @property
    def device(self) -> int:
        """The device ordinal this generator draws for."""
        return self._state.device

    def __repr__(self) -> str:
        state = self._state
        return f"gpurt.Generator(cuda:{state.device}, seed={state.seed}, offset={state.offset})"

    def manual_seed(self, seed: int) -> Generator:
        """Seed it (negative seeds wrap to uint64, as in torch) and reset the offset."""
        self._state.set(seed_value(seed))
        return self

    def seed(self) -> int:
        """Seed it from the OS's random source and return that seed."""
        seed = _fresh_seed()
        self._state.set(seed)
        return seed

    def initial_seed(self) -> int:
        """The seed it was last seeded with."""
        return self._state.seed

    def get_offset(self) -> int:
        """The current Philox offset (advanced by every draw)."""
        return self._state.offset

    def get_state(self) -> np.ndarray:
        """The state as 24 bytes in a uint8 array: version, seed, offset (uint64 LE)."""
        state = self._state
        with state.lock:
            return encode_state(state.seed, state.offset)

    def set_state(self, new_state: Any) -> Generator:
        """Restore a state from get_state (bytes-like or a uint8 array); ValueError for a
        wrong length, version or an offset that is not a multiple of 4."""
        seed, offset = decode_state(new_state)
        self._state.set(seed, offset)
        return self

    def clone_state(self) -> Generator:
        """A new Generator with a copy of this one's state."""
        return Generator(_state=self._state.copy())

    def graphsafe_get_state(self) -> Generator:
        """A Generator sharing this one's state (not a copy), for graphsafe_set_state."""
        return Generator(_state=self._state)

    def graphsafe_set_state(self, state: Generator) -> Generator:
        """Make this generator use ``state``'s state object from now on (shared, not
        copied), so graphs captured with either draw from one stream."""
        if not isinstance(state, Generator):
            raise TypeError(f"graphsafe_set_state takes a gpurt.Generator, got "
                            f"{type(state).__name__}")
        if state._state.device != self._state.device:
            raise ValueError(f"a state of cuda:{state._state.device} cannot be given to a "
                             f"generator of cuda:{self._state.device}")
        self._state = state._state
        return self

    def philox_engine_inputs(self, increment: int) -> tuple[int, int]:
        """(seed, offset) for a kernel that uses ``increment`` 32-bit values per Philox
        subsequence; the offset advances by ``increment`` rounded up to a multiple of 4.
        Eager only: during graph capture use :meth:`philox_cuda_state`."""
        return self._state.engine_inputs(increment)

    def philox_cuda_state(self, increment: int, stream: Any = None) -> PhiloxCudaState:
        """What a kernel needs to draw like a built-in op, graph-safe: the
        ``gpurt::PhiloxCudaState`` struct (pass it as the kernel's argument; read it with
        ``gpurt::philox_unpack``). On a capturing ``stream`` (default: the current stream
        of this generator's device) it points at device memory that each replay updates."""
        handle = stream_handle(stream, self._state.device)
        return self.draw(increment, handle)

    def draw(self, increment: int, handle: Any) -> PhiloxCudaState:
        """philox_cuda_state for a stream handle already resolved (gpurt's own fills)."""
        capturing = stream_is_capturing(self._state.device, handle)
        return self._state.cuda_state(increment, capturing, handle)


_defaults: dict[int, Generator] = {}
_defaults_lock = threading.Lock()
renew_after_fork(globals(), _defaults_lock=threading.Lock)


def default_generator(device: Any = None) -> Generator:
    """The default generator of ``device`` (default: the current device), made on first
    use with torch's default seed."""
    index = _device_index(device)
    found = _defaults.get(index)
    if found is None:
        with _defaults_lock:
            found = _defaults.setdefault(index, Generator(_state=GeneratorState(index,
                                                                                 DEFAULT_SEED)))
    return found
