"""Files written so that a reader sees the old content or the new, never a part: shared by
the kernel cache (gpurt/_nvrtc/cache.py) and the FileStore (gpurt/distributed/_store.py)."""

from __future__ import annotations

import contextlib
import os
import tempfile

__all__: list[str] = []  # internal module


def write_atomic(path: str, data: bytes, prefix: str) -> None:
    """Write ``data`` to ``path`` through a temporary file named ``prefix...`` in the same
    folder: fsync, then os.replace. The temporary file is removed on any failure."""
    fd, temp = tempfile.mkstemp(prefix=prefix, suffix=os.path.basename(path),
                                dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
