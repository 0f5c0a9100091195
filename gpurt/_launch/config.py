"""Launch configuration: grid, block, dynamic shared memory, clusters, cooperative launches
(:class:`LaunchConfig`), validated once, and the cuLaunchKernelEx attributes they need."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from cuda.bindings import driver as cu

__all__ = ["Dims", "LaunchConfig", "dims3", "launch_attributes", "triple"]

Dims = int | Sequence[int]
_DIM_LIMITS = {"grid": (2**31 - 1, 65535, 65535), "block": (1024, 1024, 64)}


def dims3(value: Any, what: str) -> tuple[int, int, int]:
    """``value`` (int or 1-3 ints) as a validated 3-tuple."""
    items = [value] if isinstance(value, (int, np.integer)) else value
    try:
        dims = [operator.index(v) for v in items]
    except TypeError:
        raise TypeError(f"{what} must be an int or a tuple of 1-3 ints, got {value!r}") from None
    if not 1 <= len(dims) <= 3 or any(isinstance(v, bool) for v in items):
        raise TypeError(f"{what} must be an int or a tuple of 1-3 ints, got {value!r}")
    dims += [1] * (3 - len(dims))
    if any(size < 1 for size in dims):
        raise ValueError(f"{what} dimensions must be >= 1, got {value!r}")
    if what == "block" and dims[0] * dims[1] * dims[2] > 1024:
        raise ValueError(f"a block holds at most 1024 threads, got {value!r}")
    limits = _DIM_LIMITS.get(what)
    for axis, size in enumerate(dims):
        if limits and size > limits[axis]:
            raise ValueError(f"{what} dimension {'xyz'[axis]} is at most {limits[axis]}, "
                             f"got {value!r}")
    return dims[0], dims[1], dims[2]


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """How to launch a kernel: grid and block (ints or tuples, stored as 3-tuples), dynamic
    shared memory in bytes, thread-block cluster dims (sm_90+) and cooperative launch (grid-wide
    sync). Validated on construction; clusters and cooperative launches use cuLaunchKernelEx."""

    grid: Dims
    block: Dims
    shared_mem: int = 0
    cluster: Dims | None = None
    cooperative: bool = False

    def __post_init__(self) -> None:
        grid = dims3(self.grid, "grid")
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "block", dims3(self.block, "block"))
        if isinstance(self.shared_mem, bool) or not isinstance(self.shared_mem, (int, np.integer)):
            raise TypeError(f"shared_mem must be an int (bytes), got {self.shared_mem!r}")
        if self.shared_mem < 0:
            raise ValueError(f"shared_mem must be >= 0 bytes, got {self.shared_mem}")
        object.__setattr__(self, "shared_mem", int(self.shared_mem))
        if self.cluster is not None:
            cluster = dims3(self.cluster, "cluster")
            if any(g % c for g, c in zip(grid, cluster)):
                raise ValueError(f"grid {grid} must be a multiple of the cluster dims {cluster}")
            object.__setattr__(self, "cluster", cluster)
        if not isinstance(self.cooperative, bool):
            raise TypeError(f"cooperative must be a bool, got {self.cooperative!r}")


def triple(dims: Dims | None) -> tuple[int, int, int]:
    """A LaunchConfig field, which __post_init__ made a 3-tuple (for the type checker)."""
    return cast("tuple[int, int, int]", dims)


_attributes_by_kind: dict[tuple[Any, bool], list[Any]] = {}


def launch_attributes(config: LaunchConfig) -> list[Any]:
    """The CUlaunchAttribute list of a cluster/cooperative config (built once per kind)."""
    key = (config.cluster, config.cooperative)
    attrs = _attributes_by_kind.get(key)
    if attrs is None:
        attrs = []
        if config.cluster is not None:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            dims = attr.value.clusterDim
            dims.x, dims.y, dims.z = triple(config.cluster)
            attrs.append(attr)
        if config.cooperative:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            attr.value.cooperative = 1
            attrs.append(attr)
        _attributes_by_kind[key] = attrs
    return attrs
