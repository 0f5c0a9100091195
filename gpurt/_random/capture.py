"""The generators of one CUDA graph: torch's CUDAGraph generator bookkeeping, for gpurt.

A :class:`GraphGenerators` lives in each ``gpurt.CUDAGraph`` (the only hook in
gpurt/graphs.py). At capture begin the capture device's default generator and every
registered one enter capture mode (kernels then read seed and offset from the generator's
device buffer, plus an offset inside the graph); at capture end each records the graph's
total increment; before every replay each writes its current seed and offset into its
buffer on the replay stream and advances its offset by that total, so every replay draws
fresh numbers and eager draws after it continue the sequence.
"""

from __future__ import annotations

from typing import Any

from ..device import current_device, device
from . import kernels
from .generator import default_generator
from .state import GeneratorState

__all__ = ["GraphGenerators"]


def _write_state(buffer: Any, seed: int, offset: int, stream_handle: Any) -> None:
    index = buffer.device.index
    kernel = kernels.set_state_kernel(index)
    if current_device() == index:
        kernel(1, 1, (buffer, seed, offset), stream=stream_handle)
    else:  # launches go to the current device
        with device(index):
            kernel(1, 1, (buffer, seed, offset), stream=stream_handle)


class GraphGenerators:
    """Registered generator states of one graph and their captured increments."""

    def __init__(self) -> None:
        self.registered: list[GeneratorState] = []
        self.increments: dict[GeneratorState, int] = {}
        self._capturing: list[GeneratorState] = []

    def register(self, generator: Any) -> None:
        """CUDAGraph.register_generator_state: a gpurt.Generator (its current state)."""
        state = getattr(generator, "_state", None)
        if not isinstance(state, GeneratorState):
            raise TypeError(f"register_generator_state takes a gpurt.Generator, got "
                            f"{type(generator).__name__}")
        if self._capturing:
            raise RuntimeError("register generators before capture_begin(), not during capture")
        if state not in self.registered:
            self.registered.append(state)

    def begin(self, device: int) -> None:
        """Capture begins on ``device``: its default generator and the registered ones
        draw into the graph (raises, changing nothing, if one cannot)."""
        states = [default_generator(device)._state]
        states += [s for s in self.registered if s is not states[0]]
        for state in states:
            if state.device != device:
                raise ValueError(f"a generator of cuda:{state.device} is registered with a "
                                 f"graph captured on cuda:{device}")
        started: list[GeneratorState] = []
        try:
            for state in states:
                state.capture_prologue()
                started.append(state)
        except BaseException:
            for state in started:
                state.capture_epilogue()
            raise
        self._capturing = started

    def end(self) -> None:
        """Capture ended: remember each generator's total increment in the graph."""
        self.increments = {state: state.capture_epilogue() for state in self._capturing}
        self._capturing = []

    def abort(self) -> None:
        """Capture failed: generators leave capture mode, nothing is remembered."""
        for state in self._capturing:
            state.capture_epilogue()
        self._capturing = []
        self.increments = {}

    def replay(self, stream_handle: Any) -> None:
        """Before a replay: write each generator's seed and offset, advance its offset."""
        for state, increment in self.increments.items():
            if increment:
                state.replay_prologue(increment, stream_handle, _write_state)
