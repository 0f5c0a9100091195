"""Random numbers: torch.cuda.random's API on counter-based Philox4x32-10 generators.

``manual_seed``, ``seed``, ``initial_seed``, ``get_rng_state``, ``set_rng_state`` (and their
``_all`` forms) act on each device's default generator, made on first use (``import gpurt``
touches no GPU). :class:`Generator` is torch.Generator for one device. The fills
``uniform_``, ``normal_``, ``randint_``, ``bernoulli_`` and ``dropout`` write gpurt Arrays or
torch/CuPy arrays in place, contiguous or strided; the value of each element depends only on
(seed, offset, its C-order index), never on the launch or the device; under CUDA graph
capture they read seed and offset from device memory, so each replay draws fresh numbers.
Users' kernels draw the same way with ``#include <gpurt/random.cuh>`` (:func:`include_dir`,
:func:`headers`) and ``Generator.philox_cuda_state``. docs/random.md has the details.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np

from ._random import kernels as _kernels
from ._random.fill import bernoulli_, dropout, normal_, randint_, uniform_
from ._random.generator import Generator, default_generator
from ._random.state import PhiloxCudaState, seed_value
from .device import current_device, device_count, is_available

__all__ = [
    "Generator",
    "PhiloxCudaState",
    "bernoulli_",
    "default_generator",
    "dropout",
    "get_rng_state",
    "get_rng_state_all",
    "headers",
    "include_dir",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "normal_",
    "randint_",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
    "uniform_",
]

# The functions below are the ones gpurt re-exports at top level (torch.cuda's names).
RNG_STATE_API = [
    "Generator", "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
]


def _current() -> int | None:
    """The current device, or None where there is no GPU (torch then ignores seeding)."""
    return current_device() if is_available() else None


def _all_devices() -> Iterable[int]:
    return range(device_count())


def manual_seed(seed: int) -> None:
    """Seed the current device's default generator (offset back to 0). Without a GPU it
    does nothing, as in torch."""
    value = seed_value(seed)  # a bad seed raises with or without a GPU
    index = _current()
    if index is not None:
        default_generator(index).manual_seed(value)


def manual_seed_all(seed: int) -> None:
    """Seed the default generator of every device."""
    value = seed_value(seed)
    for index in _all_devices():
        default_generator(index).manual_seed(value)


def seed() -> None:
    """Seed the current device's default generator from the OS's random source."""
    index = _current()
    if index is not None:
        default_generator(index).seed()


def seed_all() -> None:
    """Seed every device's default generator with one seed from the OS's random source."""
    devices = list(_all_devices())
    if devices:
        value = default_generator(devices[0]).seed()
        for index in devices[1:]:
            default_generator(index).manual_seed(value)


def initial_seed() -> int:
    """The seed of the current device's default generator."""
    return default_generator(current_device()).initial_seed()


def get_rng_state(device: Any = "cuda") -> np.ndarray:
    """The state of ``device``'s default generator: a uint8 array of 24 bytes (version,
    seed, offset as little-endian uint64s; docs/random.md)."""
    return default_generator(None if device == "cuda" else device).get_state()


def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
    """Restore ``device``'s default generator from get_rng_state (bytes or uint8 array)."""
    default_generator(None if device == "cuda" else device).set_state(new_state)


def get_rng_state_all() -> list[np.ndarray]:
    """The states of every device's default generator."""
    return [default_generator(i).get_state() for i in _all_devices()]


def set_rng_state_all(new_states: Iterable[Any]) -> None:
    """Restore every device's default generator, one state per device in order."""
    states = list(new_states)
    count = device_count()
    if len(states) != count:
        raise ValueError(f"set_rng_state_all needs one state per device ({count}), "
                         f"got {len(states)}")
    for index, state in enumerate(states):
        default_generator(index).set_state(state)


def include_dir() -> str:
    """The folder to add to gpurt.compile's ``include_paths`` for
    ``#include <gpurt/random.cuh>``."""
    return str(_kernels.INCLUDE_DIR)


@functools.lru_cache(maxsize=1)
def _header_text() -> str:
    return (_kernels.INCLUDE_DIR / "gpurt" / "random.cuh").read_text()


def headers() -> dict[str, str]:
    """``{"gpurt/random.cuh": its source}`` for gpurt.compile's ``headers=``."""
    return {"gpurt/random.cuh": _header_text()}
