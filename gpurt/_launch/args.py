"""Kernel arguments: converting Python values by the declared parameter types, and the
per-kernel plan that packs them into one parameter buffer with a single ``struct.pack_into``.

Scalars need no converter: ``struct`` converts Python ints and floats (and numpy scalars)
to the declared C type and range-checks them (a Python float sent to a ``float`` parameter
is packed as a float32). Pointers, bfloat16, vector types and by-value structs convert here.
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import textwrap
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._array.copies import pointer_device
from ..array import Array, from_dlpack
from .params import Param

__all__ = ["Plan", "build_plan", "c_code", "pointer"]

_KDL_CUDA_TYPES = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def _check_device(what: str, on: int, index: int | None) -> None:
    if index is not None and on != index:
        raise ValueError(f"{what} is on cuda:{on} but the kernel is launched on cuda:{index}")


def pointer(value: Any, index: int | None) -> int:
    """A device address from an Array, a foreign device array, a raw int pointer or None."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError("a bool is not a pointer")
    if isinstance(value, int):
        return value
    if isinstance(value, Array):
        _check_device("the array", value.device.index, index)
        return int(value.ptr)
    if isinstance(value, np.ndarray):
        raise TypeError("a numpy array lives on the host; pass a device array "
                        "(gpurt.asarray(x)) or a device pointer")
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, ctypes.c_void_p):
        return int(value.value or 0)
    if _is_torch_tensor(type(value)):  # a few times faster than its __cuda_array_interface__
        on = value.get_device()
        if on < 0:
            raise TypeError("the tensor is not on a CUDA device; pass a CUDA tensor")
        _check_device("the tensor", on, index)
        return int(value.data_ptr())
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is not None:
        ptr = int(interface["data"][0] or 0)
        _check_foreign_device(value, ptr, index)
        return ptr
    if hasattr(value, "__dlpack__"):
        kind, on = value.__dlpack_device__()
        if int(kind) not in _KDL_CUDA_TYPES:
            raise TypeError(f"{type(value).__name__} is not in device memory (DLPack device "
                            f"type {int(kind)}); pass a device array")
        _check_device(f"the {type(value).__name__}", int(on), index)
        return int(from_dlpack(value).ptr)
    raise TypeError(f"expected a device array, a pointer (int) or None, got {type(value).__name__}")


_torch_types: dict[type, bool] = {}


def _is_torch_tensor(cls: type) -> bool:
    """Whether ``cls`` is torch.Tensor or a subclass of it (known without importing torch)."""
    known = _torch_types.get(cls)
    if known is None:
        known = any(c.__module__ == "torch" and c.__name__ == "Tensor" for c in cls.__mro__)
        _torch_types[cls] = known
    return known


def _check_foreign_device(value: Any, ptr: int, index: int | None) -> None:
    """Device check for a ``__cuda_array_interface__`` object (by DLPack device or by asking
    the driver where the pointer lives)."""
    if index is None or ptr == 0:
        return
    where = getattr(value, "__dlpack_device__", None)
    if where is not None:
        on = int(where()[1])
    else:
        on = pointer_device(ptr)
    _check_device(f"the {type(value).__name__}", on, index)


def _float_to_bfloat16_bits(value: Any) -> int:
    """The bfloat16 bit pattern nearest to ``value`` (round to nearest even)."""
    if isinstance(value, (np.generic, np.ndarray)) and value.dtype.name == "bfloat16":
        return int(np.asarray(value).view(np.uint16))
    bits = struct.unpack("<I", struct.pack("<f", value))[0]  # numbers only, as a float param
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
        return (bits >> 16) | 0x40  # NaN stays NaN
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _as_bytes(value: Any, size: int) -> bytes:
    try:
        data = bytes(memoryview(value).cast("B"))
    except TypeError:
        raise TypeError(f"expected {size} bytes (bytes, a buffer or a ctypes struct), "
                        f"got {type(value).__name__}") from None
    if len(data) != size:
        raise ValueError(f"expected exactly {size} bytes, got {len(data)}")
    return data


def _vector_converter(param: Param) -> Callable[[Any], bytes]:
    vector = struct.Struct("<" + param.fmt)
    count = len(param.fmt)

    def convert(value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return _as_bytes(value, vector.size)
        items = tuple(value)
        if len(items) != count:
            raise ValueError(f"expected {count} components, got {len(items)}")
        return vector.pack(*items)

    return convert


def _bytes_converter(param: Param, size: int) -> Callable[[Any], bytes]:
    """By-value structs take bytes of their exact size; parameters known only by their size
    (no declaration found) also take ints and, at 8 bytes, anything a pointer takes."""

    def convert(value: Any) -> bytes:
        if param.kind == "opaque" and not isinstance(value, (bytes, bytearray, memoryview)):
            if isinstance(value, int) and not isinstance(value, bool) and size in (1, 2, 4, 8):
                return value.to_bytes(size, "little", signed=value < 0)
            if size == 8:
                return pointer(value, None).to_bytes(8, "little")
        return _as_bytes(value, size)

    return convert


def _bool(value: Any) -> bool:
    if isinstance(value, (bool, int, np.bool_, np.integer)):
        return bool(value)
    raise TypeError(f"expected a bool, got {type(value).__name__}")


# ---- the plan ----------------------------------------------------------------------------------


def _field(param: Param) -> str:
    """The struct code of one parameter in the buffer."""
    return param.fmt if param.kind in ("pointer", "scalar", "bfloat16") else f"{param.size}s"


_C_CODES = frozenset("bBhHiIqQefd")  # scalar struct codes that gpurt._launch._claunch packs itself


def c_code(param: Param) -> str | None:
    """How gpurt._launch._claunch packs ``param`` ("P" a pointer, else its struct code), or
    None for a parameter that needs a converter of this module."""
    if param.kind == "pointer":
        return "P"
    if param.kind == "scalar" and param.fmt in _C_CODES:
        return param.fmt
    return None


def _converter(param: Param) -> Callable[[Any], Any] | None:
    """The converter of a non-pointer parameter; None where ``struct`` converts alone."""
    if param.kind == "bfloat16":
        return _float_to_bfloat16_bits
    if param.kind == "vector":
        return _vector_converter(param)
    if param.kind in ("bytes", "opaque"):
        return _bytes_converter(param, param.size)
    if param.fmt == "?":
        return _bool
    return None


# The generated code. ``fill`` and ``launch`` share the statements that turn ``args`` into the
# parameter buffer ({pack}); ``launch`` adds this thread's buffer, the driver call (between the
# launch hooks, when there are any) and the hand-over of errors to the kernel that explains
# them, so a launch runs one short Python function of its own. The driver call comes in two
# kinds (_DRIVER_CALLS): a compiled Launcher (gpurt/_launch/_claunch_launcher.c) takes grid and
# block as they are and returns the CUresult as an int; cuda.bindings' cuLaunchKernel takes them
# as six ints ({dims}) and returns a tuple.
_PACK = """\
    if type(args) is not tuple and type(args) is not list:
        raise TypeError('args must be a tuple')
{unpack}
    pack_into(buffer, 0{values})
"""

_FILL = """\
def fill(buffer, args, index):
{pack}"""

_LAUNCH = """\
def launch(grid, block, args, shared_mem, stream, index):
    try:
{dims}        try:
            buffer, params = local.buffers
        except AttributeError:
            buffer, params = thread_buffers()
{pack}
        if hooks:
            result = hooked(launch_kernel, stream, {call_args}){result}
        else:
            result = launch_kernel({call_args}){result}
    except (TypeError, ValueError, OverflowError, StructError) as exc:
        explain(exc, grid, block, args, shared_mem, index)
        raise
    if result:
        refused(result, grid, block, shared_mem)
"""

_DIMS = """\
        if type(grid) is int:
            gx, gy, gz = grid, 1, 1
        elif type(grid) is tuple and len(grid) == 3:
            gx, gy, gz = grid
            if type(gx) is not int or type(gy) is not int or type(gz) is not int:
                gx, gy, gz = dims(grid, 'grid')
        else:
            gx, gy, gz = dims(grid, 'grid')
        if type(block) is int:
            bx, by, bz = block, 1, 1
        elif type(block) is tuple and len(block) == 3:
            bx, by, bz = block
            if type(bx) is not int or type(by) is not int or type(bz) is not int:
                bx, by, bz = dims(block, 'block')
        else:
            bx, by, bz = dims(block, 'block')
"""

_DRIVER_CALLS = {  # compiled: {dims}, {call_args}, {result}
    True: ("", "grid, block, shared_mem, stream, params", ""),
    False: (_DIMS, "function, gx, gy, gz, bx, by, bz, shared_mem, stream or None, params, 0",
            "[0]"),
}


class Plan:
    """How to turn a kernel's arguments into its parameter buffer, and launch with them.

    Functions compiled from a few lines of Python specialised to the signature (see ``source``
    and :meth:`launch_source`) do the work. ``fill(buffer, args, index)`` unpacks
    ``args`` (wrong counts raise ValueError), turns pointer arguments into addresses (a gpurt
    Array on device ``index`` inline, anything else through :func:`pointer`), runs the
    converters and packs everything with one ``struct.pack_into``. :meth:`launcher` makes the
    function that does the same into this thread's buffer and calls the driver: launch
    overhead is dominated by these steps, and specialised code takes a fraction of the time
    of a generic loop. Each thread packs into a buffer of its own (:meth:`thread_buffers`),
    whose void* array the driver gets as ``kernelParams``. Where every parameter is a pointer or
    a plain scalar, ``layout`` lets the compiled launch path pack plain arguments itself."""

    __slots__ = ("params", "offsets", "size", "converters", "layout", "source", "fill", "_pack",
                 "_fmt", "_namespace", "_launch_codes", "_local")

    def __init__(self, params: list[Param], offsets: list[int], size: int) -> None:
        self.params = tuple(params)
        self.offsets = tuple(offsets)
        self.size = size
        fmt, at = "<", 0
        names, values = [], []
        self.converters: dict[int, Callable[[Any], Any]] = {}
        for param, offset in zip(params, offsets):
            fmt += "x" * (offset - at) + _field(param)
            at = offset + param.size
            arg = f"a{param.index}"
            names.append(arg)
            convert = _converter(param)
            if param.kind == "pointer":
                values.append(f"{arg}.ptr if type({arg}) is Array and {arg}.device.index == index "
                              f"else {arg} if type({arg}) is int else pointer({arg}, index)")
            elif convert is not None:
                self.converters[param.index] = convert
                values.append(f"convert{param.index}({arg})")
            else:
                values.append(arg)
        codes = [c_code(param) for param in params]
        # (offset, code) of every parameter, for gpurt._launch._claunch.PackingLauncher
        self.layout: tuple[tuple[int, str], ...] | None = None
        if None not in codes:
            self.layout = tuple(zip(offsets, codes))  # type: ignore[arg-type]
        if names:
            unpack = f"    {', '.join(names)}, = args"
        else:
            unpack = "    if len(args):\n        raise ValueError('too many arguments')"
        pack = _PACK.format(unpack=unpack, values="".join(f",\n        {v}" for v in values))
        self.source = _FILL.format(pack=pack)
        self._pack = textwrap.indent(pack, "    ").rstrip("\n")
        self._fmt = fmt
        self._local = threading.local()
        self._namespace: dict[str, Any] = {
            "Array": Array, "pointer": pointer, "pack_into": struct.Struct(fmt).pack_into,
            "StructError": struct.error, "local": self._local,
            "thread_buffers": self.thread_buffers,
            **{f"convert{i}": fn for i, fn in self.converters.items()},
        }
        self._launch_codes: dict[bool, Any] = {}
        namespace = dict(self._namespace)
        exec(compile(self.source, f"<gpurt argument plan {fmt}>", "exec"), namespace)
        self.fill: Callable[[Any, Sequence[Any], int | None], None] = namespace["fill"]

    def thread_buffers(self) -> tuple[Any, int]:
        """This thread's parameter buffer and the address of its void* array, which points
        at each parameter's offset in the buffer (made on a thread's first call)."""
        try:
            return self._local.buffers
        except AttributeError:
            pass
        buffer = ctypes.create_string_buffer(max(self.size, 1))
        base = ctypes.addressof(buffer)
        pointers = (ctypes.c_void_p * max(len(self.offsets), 1))(*[base + o for o in self.offsets])
        self._local.pointers = pointers  # kept alive with the buffer
        self._local.buffers = (buffer, ctypes.addressof(pointers))
        return self._local.buffers

    def launch_source(self, compiled: bool) -> str:
        """The source of the launchers :meth:`launcher` makes."""
        dims, call_args, result = _DRIVER_CALLS[compiled]
        return _LAUNCH.format(dims=dims, pack=self._pack, call_args=call_args, result=result)

    def launcher(self, launch_kernel: Callable[..., Any], *, compiled: bool, function: Any = None,
                 dims: Callable[[Any, str], tuple[int, int, int]], hooks: Sequence[Any],
                 hooked: Callable[..., Any], explain: Callable[..., None],
                 refused: Callable[..., None]) -> Callable[..., None]:
        """``launch(grid, block, args, shared_mem, stream, index)`` of one loaded function:
        the arguments packed into this thread's buffer, then the driver call, through
        ``hooked(launch_kernel, stream, ...)`` while the list ``hooks`` is not empty.

        ``compiled``: ``launch_kernel`` is a :class:`gpurt._launch._claunch.Launcher` bound to its
        function, called as ``launch_kernel(grid, block, shared_mem, stream, params)``, which
        returns the CUresult as an int. Otherwise it is cuda.bindings' cuLaunchKernel, called
        with ``function`` and grid and block as ints. Both take grid and block as ints or
        3-tuples of ints and hand anything else to ``dims``, which validates and completes it.
        A conversion error goes to ``explain(exc, grid, block, args, shared_mem, index)``,
        which raises a clearer one or returns to let it propagate; a failed result code to
        ``refused(code, grid, block, shared_mem)``."""
        code = self._launch_codes.get(compiled)
        if code is None:
            kind = "compiled" if compiled else "cuda.bindings"
            code = compile(self.launch_source(compiled), f"<gpurt {kind} launcher {self._fmt}>",
                           "exec")
            self._launch_codes[compiled] = code
        namespace = dict(self._namespace, function=function, launch_kernel=launch_kernel,
                         dims=dims, hooks=hooks, hooked=hooked, explain=explain,
                         refused=refused)
        exec(code, namespace)
        return namespace["launch"]

    def diagnose(self, args: Sequence[Any],
                 index: int | None) -> tuple[Param, Any, Exception] | None:
        """The first (parameter, value, error) whose argument does not convert or pack."""
        for param, value in zip(self.params, args):
            try:
                if param.kind == "pointer":
                    value = pointer(value, index)
                elif param.index in self.converters:
                    value = self.converters[param.index](value)
                struct.pack("<" + _field(param), value)
            except (TypeError, ValueError, OverflowError, struct.error) as exc:
                return param, value, exc
        return None


def _computed_offsets(params: list[Param]) -> tuple[list[int], int]:
    offsets, at = [], 0
    for param in params:
        at = (at + param.align - 1) // param.align * param.align
        offsets.append(at)
        at += param.size
    return offsets, at


def build_plan(kernel: str, params: list[Param] | None,
               layout: list[tuple[int, int]] | None) -> Plan:
    """The plan from the declared parameters, laid out by the driver's parameter info
    (offset, size) where available, else by the C ABI."""
    if layout is not None:
        if params is None or len(params) != len(layout):
            params = [Param(i, "", f"<{size}-byte parameter>", "opaque", "", size, 1)
                      for i, (_, size) in enumerate(layout)]
        fixed = []
        for param, (_, size) in zip(params, layout):
            if param.size != size:  # an unknown struct, or a type we mis-sized: trust the driver
                param = dataclasses.replace(param, kind="bytes", fmt="", size=size, align=1)
            fixed.append(param)
        offsets = [offset for offset, _ in layout]
        end = max((o + s for o, s in layout), default=0)
        return Plan(fixed, offsets, end)
    if params is None:
        raise TypeError(f"cannot tell the parameters of kernel {kernel!r}: declare it in the "
                        "source (extern \"C\" __global__ ...) or get it through name_expressions")
    unsized = [p for p in params if p.size == 0]
    if unsized:
        raise TypeError(f"kernel {kernel!r}: {unsized[0].describe()} has a type gpurt cannot size "
                        "without the driver's parameter info (CUDA 12.4+)")
    offsets, end = _computed_offsets(params)
    return Plan(params, offsets, end)
