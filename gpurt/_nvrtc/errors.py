"""CompileError: NVRTC's failure to compile a program, with its log and the source lines the
log points at (raised by gpurt.nvrtc)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from .._core.driver import CudaError

__all__ = ["CompileError"]

_LOG_LINE = re.compile(r"^(?P<file>[^\n()]+)\((?P<line>\d+)\): (?P<what>error|warning|remark)",
                       re.M)
_MISSING_HEADER = re.compile(r'could not open source file "(?P<name>[^"]+)"')


class CompileError(CudaError):
    """NVRTC could not compile a program. ``log`` holds NVRTC's messages, ``options`` the
    options used and ``source`` the program; ``str()`` shows the log and, with line numbers,
    the source lines the log points at."""

    def __init__(self, error: CudaError, log: str, source: str, options: Sequence[str],
                 program_name: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(error.code, error.name, error.description, "nvrtcCompileProgram")
        self.log = log
        self.source = source
        self.options = tuple(options)
        self.program_name = program_name
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        parts = [f"{self.name}: NVRTC could not compile {self.program_name!r} "
                 f"(options: {' '.join(self.options)})", self.log.rstrip()]
        excerpt = self.excerpt()
        if excerpt:
            parts += ["", "source lines the log points at:", excerpt]
        missing = _MISSING_HEADER.search(self.log)
        if missing and missing["name"].startswith(("cuda", "cub/", "thrust/", "nv/", "crt/")):
            parts += ["", f"hint: CUDA's header {missing['name']!r} was not found; install the "
                      "NVIDIA wheels that ship them (nvidia-cuda-runtime for cuda_fp16.h/"
                      "cuda_bf16.h, nvidia-cuda-cccl for cuda/std and CUB) or set CUDA_HOME"]
        return "\n".join(parts)

    def excerpt(self, context: int = 1, limit: int = 8) -> str:
        """The source lines named in the log (``context`` lines around each), numbered."""
        files = {self.program_name: self.source, **self.headers}
        shown: list[str] = []
        seen: set[tuple[str, int]] = set()
        for match in _LOG_LINE.finditer(self.log):
            name, line = match["file"].strip(), int(match["line"])
            text = files.get(name) or files.get(os.path.basename(name))
            if text is None or (name, line) in seen or len(seen) >= limit:
                continue
            seen.add((name, line))
            lines = text.splitlines()
            first, last = max(1, line - context), min(len(lines), line + context)
            shown.append(f"--- {name}:{line} ({match['what']})")
            for number in range(first, last + 1):
                mark = ">" if number == line else " "
                shown.append(f"{mark}{number:5d} | {lines[number - 1]}")
        return "\n".join(shown)
