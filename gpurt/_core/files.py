"""Files written so that a reader sees the old content or the new, never a part: shared by
the kernel cache (gpurt/_nvrtc/cache.py) and the FileStore (gpurt/distributed/_filestore.py)."""

from __future__ import annotations

import contextlib
import os
import tempfile

__all__: list[str] = []  # internal module


def write_atomic(path: str, data: bytes, prefix: str, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` through a temporary file named ``prefix...`` in the same
    folder (a fresh, unpredictable name: mkstemp, O_EXCL), with permissions ``mode`` less
    the process's umask (as open() would give; 0600 by default): fsync,
    then os.replace (which replaces a link at ``path``, never its target). The temporary
    file is removed on any failure."""
    fd, temp = tempfile.mkstemp(prefix=prefix, suffix=os.path.basename(path),
                                dir=os.path.dirname(path) or ".")
    try:
        if mode != 0o600:
            os.fchmod(fd, mode & ~_umask())
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
