"""The prebuilt-kernel archive: one file of compiled programs and tables, versioned and hashed.

Layout (all integers little-endian)::

    0   8 bytes   magic b"GPURTKA\\0"
    8   u32       format version (1)
    12  u32       index length in bytes
    16  32 bytes  BLAKE2b-256 digest of the index
    48  index     UTF-8 JSON: {"format": 1, "meta": {...}, "tables": {name: JSON},
                  "programs": [{"key", "arch", "program", "lowered": {expr: symbol},
                                "offset", "stored", "size", "blake2b"}]}
    ...           the programs' cubins, zlib-compressed (cubins shrink about 5x), ``stored``
                  bytes each at ``offset`` bytes after the index

No pickle, nothing executed: the index is JSON of a checked shape, every size is bounded (a
cubin is inflated to at most its recorded ``size``), and each cubin is checked against its
BLAKE2b digest (of the inflated bytes) when it is read. Readers refuse other versions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import threading
import zlib
from collections.abc import Iterable
from typing import Any

from .._core.files import write_atomic
from .images import MAX_IMAGE_BYTES

__all__ = ["Archive", "Program", "write_archive", "FORMAT"]

FORMAT = 1
_MAGIC = b"GPURTKA\0"
_HEAD = 48
MAX_ARCHIVE_BYTES = 4 << 30
MAX_INDEX_BYTES = 64 << 20
MAX_PROGRAMS = 1 << 16


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program: ``key`` (see gpurt._nvrtc.prebuilt.program_key), its arch,
    program name and the lowered names of its name expressions."""

    key: str
    arch: str
    program: str
    lowered: dict[str, str]
    offset: int = 0
    stored: int = 0
    size: int = 0
    blake2b: str = ""


def write_archive(path: str, programs: Iterable[tuple[Program, bytes]],
                  tables: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> int:
    """Write an archive of ``programs`` ((Program, cubin) pairs) and JSON ``tables`` to
    ``path`` atomically; returns its size in bytes."""
    rows, blobs, offset = [], [], 0
    for program, binary in programs:
        stored = zlib.compress(binary, 6)
        rows.append({"key": program.key, "arch": program.arch, "program": program.program,
                     "lowered": program.lowered, "offset": offset, "stored": len(stored),
                     "size": len(binary), "blake2b": _digest(binary)})
        blobs.append(stored)
        offset += len(stored)
    index = json.dumps({"format": FORMAT, "meta": meta or {}, "tables": tables or {},
                        "programs": rows}, sort_keys=True).encode()
    head = _MAGIC + FORMAT.to_bytes(4, "little") + len(index).to_bytes(4, "little")
    data = b"".join([head, bytes.fromhex(_digest(index)), index, *blobs])
    write_atomic(path, data, ".gpurt-tmp-", 0o644)
    return len(data)


def _program(row: Any) -> Program | None:
    """A Program from an index row of the right shape, else None."""
    if not isinstance(row, dict):
        return None
    key, arch, name, digest = (row.get(k) for k in ("key", "arch", "program", "blake2b"))
    offset, stored, size = row.get("offset"), row.get("stored"), row.get("size")
    lowered = row.get("lowered")
    if not (isinstance(key, str) and isinstance(arch, str) and isinstance(name, str)
            and isinstance(digest, str) and isinstance(lowered, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items())
            and type(offset) is int and type(stored) is int and type(size) is int
            and offset >= 0 and 0 <= stored <= MAX_IMAGE_BYTES
            and 0 <= size <= MAX_IMAGE_BYTES):
        return None
    return Program(key, arch, name, dict(lowered), offset, stored, size, digest)


class Archive:
    """A prebuilt archive, read lazily: the index at the first :meth:`find`, a program's
    cubin at :meth:`read`. A file that is missing, not a regular file, too large, of another
    format or whose index digest does not match raises ValueError (OSError when unreadable)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._programs: dict[str, list[Program]] = {}
        self._tables: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}
        self._data_start = 0
        self._size = 0

    def _open(self) -> None:
        if self._fd is not None:
            return
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(self.path, flags)
        try:
            self._read_index(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _read_index(self, fd: int) -> None:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ARCHIVE_BYTES:
            raise ValueError(f"{self.path} is not a regular file of at most "
                             f"{MAX_ARCHIVE_BYTES} bytes")
        head = os.pread(fd, _HEAD, 0)
        if len(head) < _HEAD or head[:8] != _MAGIC:
            raise ValueError(f"{self.path} is not a gpurt prebuilt archive")
        version = int.from_bytes(head[8:12], "little")
        length = int.from_bytes(head[12:16], "little")
        if version != FORMAT:
            raise ValueError(f"{self.path} is a prebuilt archive of format {version}; this "
                             f"gpurt reads format {FORMAT}")
        if length > min(MAX_INDEX_BYTES, info.st_size - _HEAD):
            raise ValueError(f"{self.path}: index of {length} bytes does not fit the file")
        index = os.pread(fd, length, _HEAD)
        if len(index) != length or _digest(index) != head[16:48].hex():
            raise ValueError(f"{self.path}: the index does not match its digest (damaged)")
        try:
            doc = json.loads(index)
        except (ValueError, RecursionError):
            raise ValueError(f"{self.path}: the index is not JSON") from None
        rows = doc.get("programs") if isinstance(doc, dict) else None
        if not isinstance(rows, list) or len(rows) > MAX_PROGRAMS:
            raise ValueError(f"{self.path}: the index has no list of programs")
        self._data_start, self._size = _HEAD + length, info.st_size
        for row in rows:
            program = _program(row)
            if program is not None and self._data_start + program.offset + program.stored \
                    <= info.st_size:
                self._programs.setdefault(program.key, []).append(program)
        tables, meta = doc.get("tables"), doc.get("meta")
        self._tables = tables if isinstance(tables, dict) else {}
        self._meta = meta if isinstance(meta, dict) else {}

    def find(self, key: str, exprs: Iterable[str] = ()) -> Program | None:
        """The program stored under ``key`` whose name expressions include ``exprs``."""
        with self._lock:
            self._open()
        wanted = set(exprs)
        for program in self._programs.get(key, ()):
            if wanted <= program.lowered.keys():
                return program
        return None

    def read(self, program: Program) -> bytes | None:
        """``program``'s cubin, or None when it does not inflate to its size and digest."""
        with self._lock:
            self._open()
            assert self._fd is not None
            stored = os.pread(self._fd, program.stored, self._data_start + program.offset)
        inflate = zlib.decompressobj()
        try:
            data = inflate.decompress(stored, program.size + 1)  # never more than promised
        except zlib.error:
            return None
        ok = len(data) == program.size and inflate.eof and _digest(data) == program.blake2b
        return data if ok else None

    def programs(self) -> list[Program]:
        """Every program in the archive."""
        with self._lock:
            self._open()
        return [p for found in self._programs.values() for p in found]

    def table(self, name: str) -> Any:
        """The JSON table ``name`` (None when absent; the caller checks its shape)."""
        with self._lock:
            self._open()
        return self._tables.get(name)

    def meta(self) -> dict[str, Any]:
        with self._lock:
            self._open()
        return dict(self._meta)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
