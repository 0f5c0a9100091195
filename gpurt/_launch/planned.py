"""Planned launches: a launch checked and packed once, then repeated with a few new values.

The bundled kernels (gpurt.kernels) plan one launch per call signature with
:meth:`gpurt.Kernel.planned`: the device, grid, block, dynamic shared memory, cluster and every
argument are fixed and checked then, as a launch would check them; the arguments at the
``varying`` positions (pointers as ints, scalars, by-value structs as bytes) take new values at
each call, ``planned(stream, *values)``, with ``stream`` None for the current stream of the
planned device.

Where gpurt._launch._claunch is built, ``planned`` is its PlannedLaunch: it copies the packed
parameter buffer, writes the values into it and calls cuLaunchKernel (cuLaunchKernelEx for a
cluster) from C. Every call it does not take as it is -- launch hooks registered, another
device bound on the thread, a stream object, a value that does not pack -- goes to the Python
launch made here (:func:`python_launch`), which is ``Kernel.launch`` with the full arguments:
it runs the launch hooks and raises the same clear errors as any launch. Without the extension,
or for parameters the C side does not pack, that Python launch is all there is.

:data:`plan_key` (``gpurt.nvrtc.plan_key``) makes the keys under which callers keep their
planned launches: a call's arrays (shape, strides, dtype, alignment, device) and options.
:data:`dispatch` (``gpurt.nvrtc.dispatch``) runs a repeated call from C: the key of its items
(gpurt Arrays and plain CUDA torch tensors alike), the lookup in a table that
:func:`add_dispatch` filled, the allocation of its outputs and the planned launch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from cuda.bindings import driver as cu

from .._array import interop as _interop
from .._array import layout as _layout
from .._array.dtypes import as_dtype
from .._array.ownership import FINALIZERS
from .._core.state import THREAD
from .._streams import handles as _handles
from ..array import Array, empty
from ..device import current_device, device
from . import path as _launchpath
from .args import Plan, c_code
from .config import LaunchConfig, dims3

__all__ = ["add_dispatch", "check_varying", "dispatch", "plan_key", "plan_key_addresses",
           "planned_launch", "python_launch"]

_CLUSTER = int(cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
_COOPERATIVE = int(cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE)


class Launching(Protocol):
    """What a planned launch needs of its kernel (gpurt/_launch/kernel.py's Kernel)."""

    name: str

    def launch(self, config: LaunchConfig, *args: Any, stream: Any = None) -> None:
        """Launch with ``config`` (Kernel.launch)."""


def python_launch(kernel: Launching, config: LaunchConfig, args: tuple[Any, ...],
                  varying: tuple[int, ...], index: int) -> Callable[..., None]:
    """``launch(stream, *values)``: ``kernel.launch(config, *args, stream=stream)`` on device
    ``index`` with ``values`` at the ``varying`` positions of ``args``."""

    def launch(stream: Any, *values: Any) -> None:
        if len(values) != len(varying):
            raise TypeError(f"this planned launch of {kernel.name!r} takes (stream, "
                            f"{len(varying)} values), got {len(values)} values")
        full = list(args)
        for position, value in zip(varying, values):
            full[position] = value
        if current_device() == index:
            kernel.launch(config, *full, stream=stream)
        else:
            with device(index):
                kernel.launch(config, *full, stream=stream)

    return launch


def _slots(plan: Plan, varying: tuple[int, ...]) -> tuple[tuple[int, str, int], ...] | None:
    """(offset, code, size) of each varying parameter for PlannedLaunch, or None where one is a
    kind that only Python converts (bfloat16, vectors, bool)."""
    slots = []
    for position in varying:
        param = plan.params[position]
        code = "s" if param.kind in ("bytes", "opaque") else c_code(param)
        if code is None:
            return None
        slots.append((plan.offsets[position], code, param.size))
    return tuple(slots)


def planned_launch(kernel: Launching, config: LaunchConfig, args: tuple[Any, ...],
                   varying: tuple[int, ...], index: int, function: Any, plan: Plan,
                   template: bytes, hooks: list[Any],
                   refused: Callable[[Any], None]) -> Callable[..., None]:
    """The planned launch of ``kernel`` (loaded as ``function`` on device ``index``, its
    argument ``plan``, ``args`` packed as ``template``): a PlannedLaunch where the compiled
    path can take it, else :func:`python_launch`. ``refused(code)`` raises for a failed
    launch; ``hooks`` is the list of launch hooks (calls go to Python while it is not empty)."""
    fallback = python_launch(kernel, config, args, varying, index)
    address, _ = _launchpath.route()
    slots = _slots(plan, varying)
    if not address or slots is None or _launchpath.claunch is None:
        return fallback
    grid, block = dims3(config.grid, "grid"), dims3(config.block, "block")
    cluster = (1, 1, 1) if config.cluster is None else dims3(config.cluster, "cluster")
    launch_ex = 0
    if cluster != (1, 1, 1) or config.cooperative:
        launch_ex, _ = _launchpath.find_launch_kernel_ex()
        if not launch_ex:
            return fallback
    claunch = _launchpath.claunch
    launcher = claunch.Launcher(address, int(function), dims3)
    return claunch.PlannedLaunch(launcher, launch_ex, grid, block, config.shared_mem, cluster,
                                 _CLUSTER, template, plan.offsets, slots, THREAD, index, hooks,
                                 fallback, refused, _COOPERATIVE if config.cooperative else 0)


def check_varying(varying: Sequence[int], count: int) -> tuple[int, ...]:
    """``varying`` as a tuple of distinct argument positions below ``count``."""
    positions = tuple(varying)
    if any(type(p) is not int or not 0 <= p < count for p in positions) or \
            len(set(positions)) != len(positions):
        raise ValueError(f"varying must be distinct argument positions (0..{count - 1}), "
                         f"got {positions!r}")
    return positions


def _python_plan_key(*items: Any) -> Hashable | None:
    """:func:`plan_key` without the extension: the same numbers in a tuple."""
    key: list[Any] = []
    for item in items:
        if item is None or type(item) is int or type(item) is bool:
            key.append(item)
        elif type(item) is Array:
            key.append((item.shape, item.strides, item.dtype.num, item.ptr & 15,
                        item.device.index))
        else:
            return None
    return tuple(key)


# plan_key(*items): the key of a planned call whose items are ints (bools too), None and gpurt
# Arrays (each standing for its shape, strides, dtype, address modulo 16 and device), equal
# exactly when the items are; None when an item is anything else (the caller keys the call
# itself). Built in C where the extension is (gpurt/_launch/_claunch_signature.c): the plan
# caches of gpurt.kernels look a call up with it on every call.
plan_key: Callable[..., Hashable | None] = _python_plan_key
if _launchpath.claunch is not None:
    plan_key = functools.partial(_launchpath.claunch.signature, Array)


def _python_plan_key_addresses(*items: Any) -> tuple[Hashable, tuple[int, ...]] | None:
    """:data:`plan_key_addresses` without the extension: gpurt Arrays only."""
    key = _python_plan_key(*items)
    if key is None:
        return None
    return key, tuple(item.ptr if type(item) is Array else 0 for item in items)


def _no_dispatch(table: dict[Any, Any], *items: Any) -> tuple[Any, ...] | None:
    """:data:`dispatch` without the extension: every call goes the general way."""
    return None


# dispatch(table, *items): the outputs of a repeated call whose items (ints, None for an output
# to allocate, gpurt Arrays, plain CUDA torch tensors on torch's current stream, which must be
# gpurt's) have their plan_key in ``table`` (filled by add_dispatch), or None, with nothing done,
# for any other call (then the caller takes it the general way). Built in C
# (gpurt/_launch/_claunch_dispatch.c): the hot path of the bundled kernels' repeated calls.
dispatch: Callable[..., tuple[Any, ...] | None] = _no_dispatch
_dispatcher: Any = None
if _launchpath.claunch is not None:
    _dispatcher = dispatch = _launchpath.claunch.Dispatcher(Array, THREAD, empty, FINALIZERS)
    _interop.use_reader(_dispatcher)  # gpurt.asarray's torch tensors, read in C
    _handles.use_capture_status(_launchpath.capture_status)  # split-K's capture check, in C

# plan_key_addresses(*items): (plan_key of the items, each item's address, 0 for ints and None),
# or None where an item cannot be keyed; unlike plan_key it also takes plain CUDA torch tensors
# on torch's current stream, which must be gpurt's (keyed as gpurt.asarray's view of them, so
# the key is the same either way), reading them in C without making Arrays: the hot path of
# gemm's repeated calls.
plan_key_addresses: Callable[..., tuple[Hashable, tuple[int, ...]] | None] = \
    _python_plan_key_addresses if _dispatcher is None else _dispatcher.key
MAX_DISPATCH = 4096  # entries per table; past that, calls go the general way


def add_dispatch(table: dict[Any, Any], key: Any, launch: Callable[..., None],
                 order: Sequence[int], outputs: Sequence[int],
                 allocs: Sequence[tuple[Any, ...]]) -> None:
    """Let :data:`dispatch` run the calls whose items have ``key`` (a plan_key): allocate each
    output at the item positions ``outputs`` that is None as ``gpurt.empty(*allocs[i])`` would
    (from C where each alloc is ``(shape, dtype, device index)``: the same allocator call,
    Array and finalizer), then ``launch(None, *addresses of the items at the positions in
    order)``. Also lets dispatch read torch tensors once gpurt's torch intake has met torch."""
    if _dispatcher is None or type(key) is not bytes:
        return
    if _dispatcher.tensor_type is not _interop._tensor_type:  # the torch the intake reads
        _interop.tell_torch(_dispatcher)
    if key not in table and len(table) < MAX_DISPATCH:  # a key's entry never changes
        allocs = tuple(tuple(a) for a in allocs)
        table[key] = (launch, tuple(order), tuple(outputs), allocs,
                      tuple(_output_layout(*a) for a in allocs))


def _output_layout(*alloc: Any) -> tuple[Any, ...] | None:
    """(index, shape, strides, dtype, nbytes) of the Array ``gpurt.empty(*alloc)`` makes, for
    dispatch to make it from C; None where ``alloc`` is not (shape, dtype, device index)."""
    if len(alloc) != 3 or type(alloc[2]) is not int:
        return None
    shape, dtype, index = alloc
    try:
        dtype = as_dtype(dtype)
        dims, strides, nbytes = _layout.contiguous_layout(shape, dtype.itemsize)
    except (TypeError, ValueError):  # gpurt.empty says what is wrong, at the call
        return None
    return (index, dims, strides, dtype, nbytes)
