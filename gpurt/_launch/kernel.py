"""Kernels and launches: launch configuration, argument packing by declared type, hooks.

Launching is the hot path. Each kernel keeps a plan built on its first load (per parameter:
its ABI offset, a ``struct`` code and, where needed, a converter) and, per device, a launcher
generated from it (see ``gpurt/_launch/args.py``): it packs the arguments into the calling thread's
preallocated parameter buffer with one ``struct.pack_into`` and calls ``cuLaunchKernel``.
Errors in the arguments (count, types, ranges, arrays on another device) and in the launch
configuration are raised before anything runs, naming the parameter or the limit.

Where the C extension ``gpurt._launch._claunch`` is built, that runs in C: ``Kernel.__call__``, the
packing of plain arguments (ints, floats, None, gpurt Arrays) and the call of the driver's
cuLaunchKernel, whose result code goes to :func:`_driver.check` as every other call's does;
the generated launcher takes every argument it leaves to Python. Without the extension, or
with ``GPURT_PURE_PYTHON_LAUNCH=1``, launches go through cuda.bindings' cuLaunchKernel
(``gpurt/_launch/path.py`` decides; :func:`launch_path` says which is in use).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cuda.bindings import driver as cu

from .._core.driver import CudaError, check
from .._core.fork import renew_after_fork
from .._core.state import THREAD
from ..array import Array
from ..device import _index, bind_context, current_device
from ..streams import as_stream_handle, current_stream_handle
from . import path as _launchpath
from .args import Plan, build_plan
from .config import Dims, LaunchConfig
from .config import dims3 as _dims3
from .config import launch_attributes as _launch_attributes
from .config import triple as _triple
from .params import Param, kernel_params
from .path import claunch as _claunch
from .path import launch_path
from .planned import check_varying, planned_launch

__all__ = ["Kernel", "LaunchConfig", "add_launch_hook", "launch_path", "remove_launch_hook"]

LaunchHook = Callable[["Kernel", int, str], None]

_A = cu.CUfunction_attribute
_MAX_DYNAMIC_SHARED = _A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_cuLaunchKernel = cu.cuLaunchKernel  # looked up once: it is on the hot path
# what cuLaunchKernel says to a block larger than the kernel allows
_BLOCK_TOO_BIG = (cu.CUresult.CUDA_ERROR_INVALID_VALUE,
                  cu.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)

# ---- this thread's device and stream, read in place --------------------------------------
# Kernel.__call__ reads the per-thread state (gpurt/_core/state.py: the current device, the
# device whose context is bound, the current stream of each device) without calling the
# accessors of device.py and streams.py, which would cost as much again as the reads. In a
# child forked after CUDA started that state is empty, so launches there take the accessors,
# which raise the fork error.


def _bound_current_device() -> int:
    """This thread's current device, its context made current (the slow way)."""
    index = current_device()
    bind_context(index)
    return index


# ---- launch hooks ----------------------------------------------------------------------------

_hooks: list[LaunchHook] = []  # changed in place: the generated launchers hold this list
_hooks_lock = threading.Lock()
renew_after_fork(globals(), _hooks_lock=threading.Lock)


def add_launch_hook(fn: LaunchHook) -> None:
    """Call ``fn(kernel, stream_handle, phase)`` around every launch, with phase "begin"
    right before the driver call and "end" right after it (also when it fails)."""
    with _hooks_lock:
        _hooks[:] = [*_hooks, fn]


def remove_launch_hook(fn: LaunchHook) -> None:
    """Stop calling ``fn``; a hook that is not registered is ignored."""
    with _hooks_lock:
        hooks = list(_hooks)
        if fn in hooks:  # by equality: a bound method is a new object at every access
            hooks.remove(fn)
            _hooks[:] = hooks


def _driver_layout(handle: Any, expected: int | None) -> list[tuple[int, int]] | None:
    """(offset, size) of every parameter from cuKernelGetParamInfo, or None where the driver
    or bindings predate it. The result code is read directly: CUDA_ERROR_INVALID_VALUE past
    the last parameter is how the driver says there are no more."""
    get_info = getattr(cu, "cuKernelGetParamInfo", None)
    if get_info is None:
        return None
    layout: list[tuple[int, int]] = []
    while expected is None or len(layout) <= expected:
        err, offset, size = get_info(handle, len(layout))
        if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return layout
        if err != cu.CUresult.CUDA_SUCCESS:
            return None  # not supported by this driver: fall back to the computed layout
        layout.append((int(offset), int(size)))
    return layout  # more parameters than declared: keep the driver's view


def explain_load_error(err: CudaError, arch: str) -> CudaError:
    """``err`` of loading code compiled for ``arch``, with a hint where one helps."""
    if err.name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION":
        hint = ("this PTX comes from an NVRTC newer than the driver; compile a cubin "
                "(the default, ptx=False) or use an NVRTC no newer than the driver")
    elif err.name in ("CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_IMAGE"):
        hint = f"the code was compiled for {arch}, which this device cannot run"
    else:
        return err
    return CudaError(err.code, err.name, f"{err.description}: {hint}", err.call)


# ---- kernels ----------------------------------------------------------------------------------


class _Loaded:
    """A kernel's function on one device, the dynamic shared memory it may use there, its
    generated launcher (see :meth:`gpurt._launch.args.Plan.launcher`) and whether that calls the
    driver through gpurt._launch._claunch."""

    __slots__ = ("function", "max_dynamic_shared", "launch", "compiled")

    def __init__(self, function: Any, max_dynamic_shared: int, launch: Callable[..., None],
                 compiled: bool) -> None:
        self.function = function
        self.max_dynamic_shared = max_dynamic_shared
        self.launch = launch
        self.compiled = compiled


class _FuncAttribute:
    """A read-only kernel attribute on the current device (wraps cuFuncGetAttribute)."""

    def __init__(self, attr: Any, doc: str) -> None:
        self.attr = attr
        self.__doc__ = f"{doc} ({attr.name})"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, kernel: Kernel | None, owner: type | None = None) -> Any:
        if kernel is None:
            return self
        return kernel.attribute(self.attr)


class CodeSource(Protocol):
    """What a Kernel needs of its module (gpurt/_launch/module.py's Module)."""

    arch: str
    source: str | None

    def library(self) -> Any:
        """The loaded CUlibrary."""

    def replace_refused(self, library: Any, err: CudaError) -> bool:
        """True when the module now loads other code than ``library``, refused with ``err``."""


class Kernel:
    """A ``__global__`` function of a compiled :class:`~gpurt.Module`, launched with
    ``kernel(grid, block, args, shared_mem=0, stream=None)`` or
    ``kernel.launch(LaunchConfig(...), *args)``. Loaded lazily on each device it runs on.

    Arguments are converted by the kernel's declared parameter types (``params``). Foreign
    arrays (torch, CuPy, ...) are passed as they are: as with CuPy's RawKernel, work pending on
    their producer's stream must be ordered before the launch stream by the caller."""

    num_regs = _FuncAttribute(_A.CU_FUNC_ATTRIBUTE_NUM_REGS, "registers per thread")
    shared_size_bytes = _FuncAttribute(_A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                       "static shared memory per block")
    const_size_bytes = _FuncAttribute(_A.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, "constant memory")
    local_size_bytes = _FuncAttribute(_A.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                      "local memory per thread")
    max_threads_per_block = _FuncAttribute(_A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                           "largest block this kernel can be launched with")
    max_dynamic_shared_size_bytes = _FuncAttribute(_MAX_DYNAMIC_SHARED,
                                                   "dynamic shared memory allowed now")
    ptx_version = _FuncAttribute(_A.CU_FUNC_ATTRIBUTE_PTX_VERSION, "PTX version, e.g. 90")
    binary_version = _FuncAttribute(_A.CU_FUNC_ATTRIBUTE_BINARY_VERSION, "SASS version, e.g. 90")

    def __init__(self, module: CodeSource, name: str, symbol: str) -> None:
        self.module = module
        self.name = name
        self.symbol = symbol
        self.params: list[Param] | None = kernel_params(symbol, module.source, name)
        self._lock = threading.Lock()
        self._loaded: dict[int, _Loaded] = {}
        self._library: Any = None  # the CUlibrary that _handle is from
        self._handle: Any = None
        self._plan: Plan | None = None

    def __repr__(self) -> str:
        if self.params is None:
            return f"<gpurt.Kernel {self.name!r}>"
        sig = ", ".join(f"{p.type} {p.name}".strip() for p in self.params)
        return f"<gpurt.Kernel {self.name}({sig})>"

    # -- loading ---------------------------------------------------------------------------------

    def _load(self, index: int) -> _Loaded:
        """Load the kernel on device ``index`` (cuLibraryGetKernel, cuKernelGetFunction).

        With lazy loading (CUDA's default) the driver reports a bad image here rather than at
        cuLibraryLoadData: code from the disk cache that it refuses is recompiled once (the
        module replaces the cache entry) and loaded again."""
        with self._lock:
            loaded = self._loaded.get(index)
            if loaded is not None:
                return loaded
            bind_context(index)
            while True:
                library = self.module.library()
                try:
                    loaded = self._load_from(library)
                    break
                except CudaError as err:
                    if not self.module.replace_refused(library, err):  # True once at most
                        raise self._load_error(err) from None
            self._loaded = {**self._loaded, index: loaded}  # readers never take the lock
            return loaded

    def _load_from(self, library: Any) -> _Loaded:
        """The function of this kernel in ``library`` on the current context, with its plan
        (made on first load) and launcher."""
        if self._library is not library:
            handle = check(cu.cuLibraryGetKernel(library, self.symbol.encode()),
                           "cuLibraryGetKernel")
            if self._plan is None:
                expected = None if self.params is None else len(self.params)
                self._plan = build_plan(self.name, self.params, _driver_layout(handle, expected))
            self._handle, self._library = handle, library
        function = check(cu.cuKernelGetFunction(self._handle), "cuKernelGetFunction")
        limit = check(cu.cuFuncGetAttribute(_MAX_DYNAMIC_SHARED, function), "cuFuncGetAttribute")
        address, _ = _launchpath.route()
        return _Loaded(function, int(limit), self._launcher(function, address), bool(address))

    def _launcher(self, function: Any, address: int) -> Callable[..., None]:
        """The launcher of ``function``: through gpurt._launch._claunch with cuLaunchKernel at
        ``address`` (a PackingLauncher where the plan allows, with the generated launcher for
        the arguments it leaves to Python), or, with ``address`` 0, through cuda.bindings."""
        plan: Plan = self._plan  # type: ignore[assignment]  # set by _load_from
        common: dict[str, Any] = dict(dims=_dims3, hooks=_hooks, hooked=self._hooked,
                                      explain=self._explain_launch_error,
                                      refused=self._launch_refused)
        if not address:
            return plan.launcher(_cuLaunchKernel, compiled=False, function=function, **common)
        launcher = _claunch.Launcher(address, int(function), _dims3)
        launch = plan.launcher(launcher, compiled=True, **common)
        layout = plan.layout
        if (layout is None or plan.size > _claunch.MAX_PARAM_BYTES
                or len(layout) > _claunch.MAX_PARAMS):
            return launch
        return _claunch.PackingLauncher(launcher, plan.size, layout, Array, _hooks, launch,
                                        self._launch_refused)

    def _load_error(self, err: CudaError) -> CudaError:
        """``err`` of a failed load, with what to do about it where that is known."""
        if err.name == "CUDA_ERROR_NOT_FOUND":
            return CudaError(err.code, err.name, f"no kernel {self.symbol!r} in the module: C++ "
                             "kernels (not extern \"C\") need their name in "
                             "compile(..., name_expressions=[...])", err.call)
        return explain_load_error(err, self.module.arch)

    def _raise_shared_limit(self, loaded: _Loaded, nbytes: int) -> None:
        """Allow ``nbytes`` of dynamic shared memory; the limit only ever grows, under a lock,
        so a concurrent launch that needs more is never undercut."""
        with self._lock:
            if nbytes <= loaded.max_dynamic_shared:
                return
            try:
                check(cu.cuFuncSetAttribute(loaded.function, _MAX_DYNAMIC_SHARED, nbytes),
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
            except CudaError as err:
                static = check(cu.cuFuncGetAttribute(_A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                                     loaded.function), "cuFuncGetAttribute")
                raise ValueError(f"kernel {self.name!r}: {nbytes} bytes of dynamic shared memory "
                                 f"are more than the device allows (this kernel already uses "
                                 f"{static} bytes of static shared memory): {err}") from err
            loaded.max_dynamic_shared = nbytes

    def _function(self, device: Any = None) -> Any:
        """The CUfunction on ``device`` (default: the current one), made current there."""
        index = _index(device)
        loaded = self._loaded.get(index) or self._load(index)
        bind_context(index)
        return loaded.function

    # -- arguments -------------------------------------------------------------------------------

    def _fill(self, args: Sequence[Any], index: int) -> int:
        """Pack ``args`` into this thread's buffer (the kernel is loaded); return kernelParams."""
        plan: Plan = self._plan  # type: ignore[assignment]  # set by _load
        buffer, params = plan.thread_buffers()
        self._pack_into(plan, buffer, args, index)
        return params

    def _pack_into(self, plan: Plan, buffer: Any, args: Sequence[Any], index: int | None) -> None:
        try:
            plan.fill(buffer, args, index)
        except (TypeError, ValueError, OverflowError, struct.error) as exc:
            error = self._argument_error(plan, args, index)
            if error is None:
                raise
            raise error from exc

    def _argument_error(self, plan: Plan, args: Sequence[Any],
                        index: int | None) -> Exception | None:
        """The error for the first argument that does not convert, naming its parameter;
        None when every argument converts."""
        if not isinstance(args, (tuple, list)):
            return TypeError(f"kernel {self.name!r}: args must be a tuple of arguments, "
                             f"got {type(args).__name__}")
        if len(args) != len(plan.params):
            sig = ", ".join(f"{p.type} {p.name}".strip() for p in plan.params)
            return TypeError(f"kernel {self.name!r} takes {len(plan.params)} arguments ({sig}), "
                             f"got {len(args)}")
        found = plan.diagnose(args, index)
        if found is None:
            return None
        param, value, exc = found
        text = str(exc)
        if isinstance(exc, OverflowError) or "<=" in text or "range" in text:
            kind: type[Exception] = OverflowError  # struct's range errors say "<=" / "range"
        elif isinstance(exc, ValueError):
            kind = ValueError
        else:
            kind = TypeError
        got = f"{type(value).__name__} {value!r}"[:80]
        return kind(f"kernel {self.name!r}: {param.describe()} cannot take {got}: {text}")

    def pack(self, *args: Any, device: int | None = None) -> bytes:
        """The parameter buffer a launch with ``args`` would pass (each parameter at its ABI
        offset), with the launch's conversions and errors; arrays are checked against
        ``device`` when given. Needs no GPU. For tests, debugging and graph builders."""
        plan = self._plan or build_plan(self.name, self.params, None)
        buffer = ctypes.create_string_buffer(max(plan.size, 1))
        self._pack_into(plan, buffer, args, device)
        return bytes(buffer.raw[: plan.size])

    # -- launching -------------------------------------------------------------------------------

    def __call__(self, grid: Dims, block: Dims, args: Sequence[Any], shared_mem: int = 0,
                 stream: Any = None) -> None:
        """Launch on ``stream`` (default: the current stream of the current device) with
        ``args`` converted by the declared parameter types (wraps cuLaunchKernel)."""
        # The hot path: a first launch on a device, more dynamic shared memory than allowed so
        # far and a shared_mem that is not an int take _launch_slowly; everything else is a
        # few reads and this kernel's generated launcher.
        try:
            index = THREAD.index
            bound = THREAD.bound
        except AttributeError:  # no device chosen or no context bound on this thread yet
            index, bound = 0, None
        if bound != index:
            index = _bound_current_device()
        loaded = self._loaded.get(index)
        if loaded is None or shared_mem and (
                type(shared_mem) is not int or shared_mem > loaded.max_dynamic_shared):
            self._launch_slowly(grid, block, args, shared_mem, stream, index)
            return
        if stream is None:
            stream = THREAD.streams.handles.get(index, 0)  # current_stream_handle(index)
        elif type(stream) is not int:
            stream = as_stream_handle(stream)
        loaded.launch(grid, block, args, shared_mem, stream, index)

    if _claunch is not None and not _launchpath.pure_python:
        # The fast path above, in C: gpurt/_launch/_claunch.c reads THREAD as
        # gpurt/_core/state.py documents; every call it does not take goes to the function above.
        __call__ = _claunch.KernelCall(__call__, THREAD, as_stream_handle)  # type: ignore[assignment]

    def _launch_slowly(self, grid: Dims, block: Dims, args: Sequence[Any], shared_mem: int,
                       stream: Any, index: int) -> None:
        """__call__ when the kernel is not loaded on the device yet or needs more dynamic
        shared memory than allowed so far."""
        if type(shared_mem) is not int or shared_mem < 0:
            shared_mem = LaunchConfig(1, 1, shared_mem).shared_mem  # raises for what is wrong
        loaded = self._on_device(index, shared_mem)
        handle = current_stream_handle(index) if stream is None else as_stream_handle(stream)
        loaded.launch(grid, block, args, shared_mem, handle, index)

    def _prepare(self, shared_mem: int, stream: Any) -> tuple[int, _Loaded, Any]:
        """(device index, loaded kernel, stream handle) of a launch on this thread."""
        index = current_device()
        loaded = self._on_device(index, shared_mem)
        handle = current_stream_handle(index) if stream is None else as_stream_handle(stream)
        return index, loaded, handle

    def _on_device(self, index: int, shared_mem: int) -> _Loaded:
        """The kernel loaded on device ``index`` (made current on this thread), allowed
        ``shared_mem`` bytes of dynamic shared memory."""
        loaded = self._loaded.get(index)
        if loaded is None:
            loaded = self._load(index)
        bind_context(index)
        if shared_mem > loaded.max_dynamic_shared:
            self._raise_shared_limit(loaded, shared_mem)
        return loaded

    def _explain_launch_error(self, exc: Exception, grid: Any, block: Any, args: Any,
                              shared_mem: Any, index: int) -> None:
        """Raise the clear error for ``exc`` from a launcher: a bad grid, block or shared
        memory size, or the argument that does not convert (naming its parameter). Returns
        when neither explains it."""
        try:
            LaunchConfig(grid, block, shared_mem)
        except (TypeError, ValueError) as invalid:  # the binding's own error says less
            raise invalid from None
        error = self._argument_error(self._plan, args, index)  # type: ignore[arg-type]
        if error is not None:
            raise error from exc

    def _launch_refused(self, code: Any, grid: Any, block: Any, shared_mem: int) -> None:
        """Raise for a launch the driver refused with result ``code`` (nothing ran): a
        configuration that no kernel or not this one can run as ValueError naming the limit,
        else the CudaError."""
        config = LaunchConfig(grid, block, shared_mem)  # raises for an invalid configuration
        result = (_launchpath.result_code(code),)
        if result[0] in _BLOCK_TOO_BIG:
            bx, by, bz = _triple(config.block)
            limit = self.max_threads_per_block
            if bx * by * bz > limit:
                raise ValueError(f"kernel {self.name!r} runs at most {limit} threads per block "
                                 f"(its registers or __launch_bounds__), got a block of "
                                 f"{bx * by * bz}")
        check(result, f"cuLaunchKernel({self.name})")

    def launch(self, config: LaunchConfig, *args: Any, stream: Any = None) -> None:
        """Launch with a :class:`LaunchConfig`; clusters and cooperative launches go through
        cuLaunchKernelEx, plain ones through cuLaunchKernel."""
        if config.cluster is None and not config.cooperative:
            self(config.grid, config.block, args, config.shared_mem, stream)
            return
        index, loaded, handle = self._prepare(config.shared_mem, stream)
        params = self._fill(args, index)
        ex = cu.CUlaunchConfig()
        ex.gridDimX, ex.gridDimY, ex.gridDimZ = _triple(config.grid)
        ex.blockDimX, ex.blockDimY, ex.blockDimZ = _triple(config.block)
        ex.sharedMemBytes = config.shared_mem
        ex.hStream = cu.CUstream(int(handle))
        attrs = _launch_attributes(config)
        ex.attrs = attrs
        ex.numAttrs = len(attrs)
        if _hooks:
            result = self._hooked(cu.cuLaunchKernelEx, handle, ex, loaded.function, params, 0)
        else:
            result = cu.cuLaunchKernelEx(ex, loaded.function, params, 0)
        check(result, f"cuLaunchKernelEx({self.name})")

    def planned(self, config: LaunchConfig, *args: Any, varying: Sequence[int] = (),
                device: int | None = None) -> Callable[..., None]:
        """This launch checked and packed now, to be repeated as ``planned(stream, *values)``
        with new values for the arguments at the ``varying`` positions (pointers as ints,
        scalars, by-value structs as bytes) on ``device`` (default: the current one);
        ``stream`` None means that device's current stream. Errors in ``args`` or ``config``
        raise here; see gpurt/_launch/planned.py."""
        index = current_device() if device is None else _index(device)
        positions = check_varying(varying, len(args))
        loaded = self._on_device(index, config.shared_mem)
        template = self.pack(*args, device=index)
        grid, block, shared_mem = config.grid, config.block, config.shared_mem

        def refused(code: Any) -> None:
            self._launch_refused(code, grid, block, shared_mem)

        return planned_launch(self, config, tuple(args), positions, index, loaded.function,
                              self._plan, template, _hooks, refused)  # type: ignore[arg-type]

    def _hooked(self, driver_call: Callable[..., tuple], stream: Any, *call_args: Any) -> tuple:
        """``driver_call(*call_args)`` between the hooks' "begin" and "end" calls, which get
        the stream's handle as an int."""
        hooks = tuple(_hooks)
        handle = int(stream or 0)
        for hook in hooks:
            hook(self, handle, "begin")
        try:
            return driver_call(*call_args)
        finally:
            for hook in hooks:
                hook(self, handle, "end")

    # -- attributes and occupancy ------------------------------------------------------------------

    def attribute(self, attr: Any, device: int | None = None) -> int:
        """A CUfunction_attribute of this kernel on ``device`` (wraps cuFuncGetAttribute)."""
        return int(check(cu.cuFuncGetAttribute(attr, self._function(device)), "cuFuncGetAttribute"))

    def set_attribute(self, attr: Any, value: int, device: int | None = None) -> None:
        """Set a CUfunction_attribute of this kernel on ``device`` (wraps cuFuncSetAttribute),
        e.g. CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED before a launch in clusters
        of more than 8 CTAs. The dynamic shared memory limit follows each launch's
        ``shared_mem`` instead (ValueError here)."""
        if attr == _MAX_DYNAMIC_SHARED:
            raise ValueError("the dynamic shared memory limit is raised by each launch's "
                             "shared_mem; it is not set directly")
        check(cu.cuFuncSetAttribute(self._function(device), attr, int(value)),
              "cuFuncSetAttribute")

    def attributes(self, device: int | None = None) -> dict[str, int]:
        """Every attribute above (num_regs, shared_size_bytes, ...) as a dict."""
        table = {name: value for name, value in vars(Kernel).items()
                 if isinstance(value, _FuncAttribute)}
        return {name: self.attribute(value.attr, device) for name, value in table.items()}

    def max_active_blocks_per_multiprocessor(self, block: Dims, shared_mem: int = 0) -> int:
        """Blocks of ``block`` threads that fit on one SM at once, on the current device
        (wraps cuOccupancyMaxActiveBlocksPerMultiprocessor). The kernel is allowed
        ``shared_mem`` bytes first, as a launch would be (the driver counts 0 blocks above
        48 KiB otherwise)."""
        bx, by, bz = _dims3(block, "block")
        loaded = self._on_device(current_device(), shared_mem)
        result = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(loaded.function, bx * by * bz,
                                                                shared_mem)
        return int(check(result, "cuOccupancyMaxActiveBlocksPerMultiprocessor"))

    def max_active_clusters(self, config: LaunchConfig, device: int | None = None) -> int:
        """How many clusters of ``config`` can run at once on ``device`` (wraps
        cuOccupancyMaxActiveClusters): 0 where not even one fits, e.g. a non-portable cluster
        of 16 CTAs on a part whose GPCs have fewer SMs. The cluster is ``config.cluster`` or
        the kernel's compiled ``__cluster_dims__``; a size above 8 needs
        CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED set first."""
        index = current_device() if device is None else _index(device)
        loaded = self._on_device(index, config.shared_mem)
        launch = cu.CUlaunchConfig()
        launch.gridDimX, launch.gridDimY, launch.gridDimZ = _triple(config.grid)
        launch.blockDimX, launch.blockDimY, launch.blockDimZ = _triple(config.block)
        launch.sharedMemBytes = config.shared_mem
        attrs = _launch_attributes(config)
        launch.attrs = attrs
        launch.numAttrs = len(attrs)
        return int(check(cu.cuOccupancyMaxActiveClusters(loaded.function, launch),
                         "cuOccupancyMaxActiveClusters"))

    def suggested_block_size(self, shared_mem: int = 0, max_block_size: int = 0) -> int:
        """The block size that maximises occupancy on the current device (wraps
        cuOccupancyMaxPotentialBlockSize with a fixed dynamic shared memory size)."""
        _, block = check(cu.cuOccupancyMaxPotentialBlockSize(
            self._function(), None, shared_mem, max_block_size), "cuOccupancyMaxPotentialBlockSize")
        return int(block)
