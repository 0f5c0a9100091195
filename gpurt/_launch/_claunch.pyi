"""Type stub of the C extension gpurt._launch._claunch (gpurt/_launch/_claunch*.c)."""

from collections.abc import Callable
from typing import Any

class Launcher:
    """Calls cuLaunchKernel at ``address`` for the CUfunction ``function``."""

    address: int
    function: int

    def __init__(self, address: int, function: int,
                 dims: Callable[[Any, str], tuple[int, int, int]]) -> None: ...
    def __call__(self, grid: Any, block: Any, shared_mem: int, stream: Any,
                 params: int) -> int: ...

MAX_PARAM_BYTES: int
MAX_PARAMS: int

class PackingLauncher:
    """Packs plain arguments and launches with ``launcher``; hands the rest to ``fallback``."""

    launcher: Launcher
    fallback: Callable[..., None]

    def __init__(self, launcher: Launcher, size: int, layout: tuple[tuple[int, str], ...],
                 array_type: type, hooks: list[Any], fallback: Callable[..., None],
                 refused: Callable[..., None]) -> None: ...
    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int, stream: Any,
                 index: int) -> None: ...

class KernelCall:
    """Kernel.__call__ in C, taking the calls that ``function`` (the Python one) does not."""

    __wrapped__: Callable[..., None]

    def __init__(self, function: Callable[..., None], thread: Any,
                 convert: Callable[[Any], int]) -> None: ...
    def __call__(self, kernel: Any, *args: Any, **kwargs: Any) -> None: ...

class PlannedLaunch:
    """A launch packed once (``template``), repeated with new values at ``slots``; every call
    it does not take goes to ``fallback(stream, *values)``."""

    launcher: Launcher
    fallback: Callable[..., None]
    template: bytes

    def __init__(self, launcher: Launcher, launch_ex: int, grid: tuple[int, int, int],
                 block: tuple[int, int, int], shared_mem: int, cluster: tuple[int, int, int],
                 attribute: int, template: bytes, offsets: tuple[int, ...],
                 slots: tuple[tuple[int, str, int], ...], thread: Any, index: int,
                 hooks: list[Any], fallback: Callable[..., None],
                 refused: Callable[[Any], None], cooperative: int = 0) -> None: ...
    def __call__(self, stream: Any, *values: Any) -> None: ...

def capture_status(address: int, handle: int) -> tuple[int, int]:
    """cuStreamIsCapturing at ``address`` for stream ``handle``: (CUresult, status) as ints."""

def signature(array_type: type, *items: Any) -> bytes | None:
    """The key of a planned call of ints, None and arrays of exactly ``array_type``."""

class Dispatcher:
    """dispatcher(table, *items): a repeated call's key, lookup, outputs and launch in C."""

    tensor_type: type | None

    def __init__(self, array_type: type, thread: Any, alloc: Callable[..., Any],
                 finalizers: dict[Any, Any] | None = None) -> None: ...
    def __call__(self, table: dict[Any, Any], *items: Any) -> tuple[Any, ...] | None: ...
    def key(self, *items: Any) -> tuple[bytes, tuple[int, ...]] | None: ...
    def view(self, obj: Any) -> Any: ...
    def set_torch(self, tensor_type: type, dtypes: dict[Any, tuple[Any, ...]], strided: Any,
                  raw_stream: Callable[[int], int]) -> None: ...
