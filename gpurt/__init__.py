"""gpurt: torch.cuda's runtime layer without torch.

Devices, a caching allocator with real statistics, streams and events, CUDA graphs, NVRTC
compilation with a disk cache, NVTX ranges and profiling, on NVIDIA's cuda-python bindings.
``import gpurt`` never touches the GPU; CUDA initialises on first use.
"""

from . import (  # noqa: F401  (submodules; NCCL itself loads on first use)
    amp,
    comm,
    distributed,
    gds,
    ipc,
    jiterator,
    profiler,
    random,
    sanitizer,
)
from ._core.driver import *  # noqa: F401,F403
from ._core.driver import __all__ as _driver_all
from ._core.syncdebug import get_sync_debug_mode, set_sync_debug_mode  # noqa: F401
from .array import *  # noqa: F401,F403
from .array import __all__ as _array_all
from .device import *  # noqa: F401,F403
from .device import __all__ as _device_all
from .elementwise import *  # noqa: F401,F403
from .elementwise import __all__ as _elementwise_all
from .graphs import *  # noqa: F401,F403
from .graphs import __all__ as _graphs_all
from .ipc import ipc_collect  # noqa: F401  (torch.cuda.ipc_collect; the rest is gpurt.ipc)
from .memory import *  # noqa: F401,F403
from .memory import __all__ as _memory_all
from .nvrtc import *  # noqa: F401,F403
from .nvrtc import __all__ as _nvrtc_all
from .profiler import nvtx  # noqa: F401
from .random import RNG_STATE_API as _random_all
from .random import (  # noqa: F401  (torch.cuda's RNG names, flat)
    Generator,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import *  # noqa: F401,F403
from .streams import __all__ as _streams_all

__version__ = "0.1.0"

__all__ = [
    *_driver_all,
    *_device_all,
    *_streams_all,
    *_memory_all,
    *_array_all,
    *_nvrtc_all,
    *_graphs_all,
    *_random_all,
    "random",
    "ipc",
    "ipc_collect",
    "gds",
    *_elementwise_all,
    "profiler",
    "jiterator",
    "amp",
    "nvtx",
    "sanitizer",
    "get_sync_debug_mode",
    "set_sync_debug_mode",
    "__version__",
]
