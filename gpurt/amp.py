"""torch.amp's runtime pieces that make sense without autograd: :class:`autocast` (a
per-thread mixed-precision state that the bundled kernels follow, torch's casting rules:
docs/elementwise.md) and :class:`GradScaler` (loss scaling with a fused non-finite check and
unscale over a list of arrays in one launch, and the scale update on the device, without a
host synchronization).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ._core.fork import renew_after_fork
from ._elementwise import api as gpurt
from ._elementwise.plan import as_array
from ._elementwise.types import STORAGE
from .elementwise import ElementwiseKernel

__all__ = ["GradScaler", "autocast", "get_autocast_dtype",
           "is_autocast_cache_enabled", "is_autocast_enabled", "set_autocast_cache_enabled"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F16 = np.dtype(np.float16)
_FLOATS = ("float16", "bfloat16", "float32", "float64")
MAX_ARRAYS_PER_LAUNCH = 64  # kernel parameters: 3 per array, well under the 4 KiB limit
_ELEMENTS_PER_BLOCK = 1024
_THREADS = 256

# True while some thread is inside an enabled autocast: the one thing the bundled kernels
# read on their hot path (a module attribute), before asking this thread's state.
ANY_ENABLED = False
_enabled_regions = 0  # enabled autocasts entered and not yet left, on all threads
_regions_lock = threading.Lock()
renew_after_fork(globals(), _regions_lock=threading.Lock)


class _State(threading.local):
    """One thread's autocast state, torch's thread-local one: enabled, dtype (float16 by
    default, as torch's for CUDA), cache_enabled and the states saved by entered autocasts."""

    def __init__(self) -> None:
        self.enabled = False
        self.dtype = _F16
        self.cache_enabled = True
        self.saved: list[tuple[bool, np.dtype, bool]] = []  # per entered autocast


_state = _State()


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """True inside an enabled :class:`autocast` on this thread (torch.is_autocast_enabled)."""
    return _state.enabled and device_type == "cuda"


def get_autocast_dtype(device_type: str = "cuda") -> np.dtype:
    """This thread's autocast dtype: the innermost autocast's, float16 outside any (torch's
    default for CUDA)."""
    return _state.dtype


def is_autocast_cache_enabled() -> bool:
    """This thread's cache_enabled setting (default True; torch.is_autocast_cache_enabled).
    torch caches casts only of leaf tensors that require grad, which gpurt cannot take
    (torch refuses to export them), so gpurt never has a cast to cache: the setting is
    kept, saved and restored as torch's, and changes nothing."""
    return _state.cache_enabled


def set_autocast_cache_enabled(enabled: bool) -> None:
    """Set this thread's cache_enabled (torch.set_autocast_cache_enabled)."""
    _state.cache_enabled = bool(enabled)


def _count_region(step: int) -> None:
    global ANY_ENABLED, _enabled_regions
    with _regions_lock:
        _enabled_regions += step
        ANY_ENABLED = _enabled_regions > 0


class autocast(contextlib.ContextDecorator):
    """``with gpurt.amp.autocast(gpurt.bfloat16):`` (torch.autocast("cuda", dtype)): inside,
    on this thread, the bundled kernels run gemm in ``dtype`` (fp32 accumulation) and
    softmax in float32, as torch's autocast does (docs/elementwise.md has the rules).
    ``dtype``: float16 or bfloat16 (None: the current autocast dtype, as torch);
    ``enabled=False`` turns autocast off inside an enabled region; ``cache_enabled``
    (None: the current setting) is kept as torch's (see :func:`is_autocast_cache_enabled`).
    Entering saves this thread's state and exiting restores it, also on errors; one
    instance may be entered again while inside (a recursive decorated function); also a
    decorator."""

    def __init__(self, dtype: Any = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast's enabled must be a bool, got {type(enabled).__name__}")
        dt = _state.dtype if dtype is None else np.dtype(dtype)
        if dt.name not in ("float16", "bfloat16"):
            raise ValueError(f"autocast dtype must be float16 or bfloat16, got {dt.name}")
        self.dtype = dt
        self.enabled = enabled
        self.cache_enabled = _state.cache_enabled if cache_enabled is None else bool(cache_enabled)

    def __enter__(self) -> autocast:  # noqa: PYI034 (Self needs Python 3.11)
        state = _state
        state.saved.append((state.enabled, state.dtype, state.cache_enabled))
        state.enabled, state.dtype = self.enabled, self.dtype
        state.cache_enabled = self.cache_enabled
        if self.enabled:
            _count_region(1)
        return self

    def __exit__(self, *exc: object) -> None:
        state = _state
        state.enabled, state.dtype, state.cache_enabled = state.saved.pop()
        if self.enabled:
            _count_region(-1)


# ---- GradScaler kernels ------------------------------------------------------------------------

_FINITE = r"""
__device__ __forceinline__ bool _finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u; }
__device__ __forceinline__ bool _finite(double v) {
    return (__double_as_longlong(v) & 0x7ff0000000000000ll) != 0x7ff0000000000000ll; }
"""

UPDATE_SOURCE = _FINITE + r"""
extern "C" __global__ void gpurt_amp_update_scale(float* scale, int* growth_tracker,
        float* found_inf, double growth_factor, double backoff_factor, int growth_interval) {
    if (*found_inf) {
        *scale = static_cast<float>((*scale) * backoff_factor);
        *growth_tracker = 0;
    } else {
        const int successful = *growth_tracker + 1;
        if (successful == growth_interval) {
            const float grown = static_cast<float>((*scale) * growth_factor);
            if (_finite(grown)) *scale = grown;
            *growth_tracker = 0;
        } else {
            *growth_tracker = successful;
        }
    }
    *found_inf = 0.f;
}
"""


def unscale_source(dtypes: Sequence[np.dtype]) -> str:
    """The kernel that multiplies every element of ``len(dtypes)`` arrays by 1/scale and
    sets found_inf to 1 where an element is not finite (torch's
    _amp_foreach_non_finite_check_and_unscale_). Block b works on the array whose block
    range holds it."""
    params = ["const float* scale", "float* found_inf"]
    branches = []
    for k, dt in enumerate(dtypes):
        params += [f"{STORAGE[dt]}* p{k}", f"long long n{k}", f"long long b{k}"]
        check = f"if (blockIdx.x >= b{k}) " if k else ""
        branches.append(f"    {check}{{ _unscale(p{k}, n{k}, (long long)blockIdx.x - b{k}, "
                        "inv, found); }\n")
    dispatch = "    else ".join(reversed(branches)).replace("    else     ", "    else ")
    return (f"#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n{_FINITE}"
            "__device__ __forceinline__ float _f(__half v) { return __half2float(v); }\n"
            "__device__ __forceinline__ float _f(__nv_bfloat16 v) { return __bfloat162float(v); }\n"
            "__device__ __forceinline__ float _f(float v) { return v; }\n"
            "__device__ __forceinline__ double _f(double v) { return v; }\n"
            "__device__ __forceinline__ void _put(__half* p, float v) {\n"
            "    *p = __float2half_rn(v);\n}\n"
            "__device__ __forceinline__ void _put(__nv_bfloat16* p, float v) "
            "{ *p = __float2bfloat16_rn(v); }\n"
            "__device__ __forceinline__ void _put(float* p, float v) { *p = v; }\n"
            "__device__ __forceinline__ void _put(double* p, double v) { *p = v; }\n"
            "template <typename T> __device__ __forceinline__ void _unscale(T* p, long long n, "
            "long long block, float inv, bool& found) {\n"
            f"    for (long long i = block * {_ELEMENTS_PER_BLOCK} + threadIdx.x; "
            f"i < n && i < (block + 1) * {_ELEMENTS_PER_BLOCK}; i += {_THREADS}) {{\n"
            "        const auto v = _f(p[i]);\n"
            "        if (!_finite(v)) found = true;\n"
            "        _put(p + i, inv == 1.f ? v : v * inv);\n    }\n}\n"
            'extern "C" __global__ void gpurt_amp_unscale(' + ", ".join(params) + ") {\n"
            "    const float inv = static_cast<float>(1.0 / static_cast<double>(*scale));\n"
            "    bool found = false;\n" + dispatch +
            "    if (found) *found_inf = 1.f;\n}\n")


class GradScaler:
    """torch.amp.GradScaler's loss scaling without autograd: ``scale(arrays)`` multiplies
    by the current scale; ``unscale_(grads)`` divides a list of gradient arrays by it in
    place, in one launch per 64 arrays, recording non-finite values in ``found_inf`` (a
    one-element float32 device array); ``update()`` grows or backs off the scale on the
    device (torch's rule) and clears ``found_inf``. Nothing synchronizes with the host
    except :meth:`get_scale` and :meth:`found_inf_value`."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        if growth_factor <= 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError("growth_factor must be > 1, backoff_factor in (0, 1) and "
                             "growth_interval >= 1")
        self.init_scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.enabled = bool(enabled)
        self._scale: Any = None
        self._growth_tracker: Any = None
        self.found_inf: Any = None
        self._scaler = ElementwiseKernel("T x, raw float32 s", "T y", "y = x * s[0]",
                                         "gpurt_amp_scale")
        self._kernels: dict[tuple[Any, ...], Any] = {}

    def _lazy_init(self, device: int) -> None:
        if self._scale is None:
            self._scale = gpurt.full((1,), self.init_scale, dtype=np.float32, device=device)
            self._growth_tracker = gpurt.zeros((1,), dtype=np.int32, device=device)
            self.found_inf = gpurt.zeros((1,), dtype=np.float32, device=device)

    def scale(self, outputs: Any) -> Any:
        """``outputs * scale`` for an array or a list/tuple of arrays (new gpurt Arrays)."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        array = as_array(outputs, "outputs")
        self._lazy_init(array.device.index)
        return self._scaler(array, self._scale)

    def unscale_(self, grads: Iterable[Any]) -> Any:
        """Divide every gradient array (float16/bfloat16/float32/float64, C-contiguous) by
        the scale in place and set ``found_inf`` to 1 if any element is inf or NaN; returns
        ``found_inf``."""
        arrays = [as_array(g, "gradient") for g in grads]
        if not self.enabled or not arrays:
            return self.found_inf
        self._lazy_init(arrays[0].device.index)
        for a in arrays:
            if a.dtype.name not in _FLOATS:
                raise TypeError(f"gradients must be floating point, got {a.dtype.name}")
            if not a.is_contiguous():
                raise ValueError(f"gradients must be C-contiguous (strides {a.strides})")
            if a.device.index != self._scale.device.index:
                raise ValueError(f"a gradient is on {a.device}, the scale on "
                                 f"{self._scale.device}")
        arrays = [a for a in arrays if a.size]
        for start in range(0, len(arrays), MAX_ARRAYS_PER_LAUNCH):
            self._unscale_group(arrays[start:start + MAX_ARRAYS_PER_LAUNCH])
        return self.found_inf

    def _unscale_group(self, arrays: list[Any]) -> None:
        index = self._scale.device.index
        key = (index, *(a.dtype for a in arrays))
        kernel = self._kernels.get(key)
        if kernel is None:
            source = unscale_source([a.dtype for a in arrays])
            kernel = gpurt.compile(source, arch=gpurt.get_arch(index),
                                   program_name="gpurt_amp_unscale.cu")["gpurt_amp_unscale"]
            self._kernels[key] = kernel
        args: list[Any] = [self._scale.ptr, self.found_inf.ptr]
        blocks = 0
        for a in arrays:
            args += [a.ptr, a.size, blocks]
            blocks += -(-a.size // _ELEMENTS_PER_BLOCK)
        with gpurt.device(index):
            kernel(blocks, _THREADS, tuple(args))

    def update(self, new_scale: float | None = None) -> None:
        """Back off the scale if ``found_inf`` is set, else grow it every
        ``growth_interval`` successful steps (on the device); clear ``found_inf``.
        ``new_scale``: set the scale to this value instead."""
        if not self.enabled or self._scale is None:
            return
        index = self._scale.device.index
        if new_scale is not None:
            self._scale.copy_(np.array([new_scale], dtype=np.float32))
            self.found_inf.zero_()
            return
        key = (index, "update")
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = gpurt.compile(UPDATE_SOURCE, arch=gpurt.get_arch(index),
                                   program_name="gpurt_amp_update.cu")["gpurt_amp_update_scale"]
            self._kernels[key] = kernel
        with gpurt.device(index):
            kernel(1, 1, (self._scale.ptr, self._growth_tracker.ptr, self.found_inf.ptr,
                          self.growth_factor, self.backoff_factor, self.growth_interval))

    def get_scale(self) -> float:
        """The current scale (a host synchronization), 1.0 when disabled."""
        if not self.enabled:
            return 1.0
        return self.init_scale if self._scale is None else float(self._scale.numpy()[0])

    def found_inf_value(self) -> float:
        """``found_inf`` on the host (a synchronization)."""
        return 0.0 if self.found_inf is None else float(self.found_inf.numpy()[0])

    def get_growth_tracker(self) -> int:
        """Successful steps since the last growth or backoff (a host synchronization)."""
        return 0 if self._growth_tracker is None else int(self._growth_tracker.numpy()[0])
