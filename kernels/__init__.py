"""Bundled kernels written against gpurt's public API (installed as ``gpurt.kernels``).

``from gpurt.kernels import softmax`` gives the function; the module behind it (variants,
``precompile``) is ``importlib.import_module("gpurt.kernels.softmax")``.
"""

from . import _prebuilt
from .gemm import gemm
from .softmax import log_softmax, log_softmax_backward, softmax, softmax_backward

_prebuilt.register()  # the prebuilt archive, if any (read at the first compile it serves)

__all__: list[str] = [
    "softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "gemm",
]
