"""gpurt: torch.cuda's runtime layer without torch.

Devices, a caching allocator with real statistics, streams and events, CUDA graphs, NVRTC
compilation with a disk cache, NVTX ranges and profiling, on NVIDIA's cuda-python bindings.
``import gpurt`` never touches the GPU; CUDA initialises on first use.
"""

from ._driver import *  # noqa: F401,F403
from ._driver import __all__ as _driver_all
from .device import *  # noqa: F401,F403
from .device import __all__ as _device_all
from .streams import *  # noqa: F401,F403
from .streams import __all__ as _streams_all
from .memory import *  # noqa: F401,F403
from .memory import __all__ as _memory_all
from .array import *  # noqa: F401,F403
from .array import __all__ as _array_all
from .nvrtc import *  # noqa: F401,F403
from .nvrtc import __all__ as _nvrtc_all
from .graphs import *  # noqa: F401,F403
from .graphs import __all__ as _graphs_all
from . import profiler  # noqa: F401
from .profiler import nvtx  # noqa: F401
from . import comm, distributed  # noqa: F401  (NCCL itself loads on first use)
from .elementwise import *  # noqa: F401,F403
from .elementwise import __all__ as _elementwise_all
from . import amp, jiterator  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    *_driver_all,
    *_device_all,
    *_streams_all,
    *_memory_all,
    *_array_all,
    *_nvrtc_all,
    *_graphs_all,
    *_elementwise_all,
    "profiler",
    "jiterator",
    "amp",
    "nvtx",
    "__version__",
]
