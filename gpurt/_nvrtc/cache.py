"""The kernel caches: cache keys, the per-process memory cache and the on-disk cache.

Disk entries live in ``$GPURT_CACHE_DIR`` or ``$XDG_CACHE_HOME/gpurt/kernels`` (default
``~/.cache/gpurt/kernels``), a 0700 folder created on first write. Each entry is one file,
``<key>.kernel``: a magic line, a JSON header (kind, lowered names, log, payload size and
digest) and the binary. Files are written to a temp file, fsynced and ``os.replace``d into
place, so concurrent processes only ever see whole entries; a file whose header or digest
does not check out is deleted and the kernel recompiled. An unusable folder degrades to the
memory cache with one warning; ``GPURT_CACHE_DISABLE=1`` turns the disk cache off.

Files in the folder are untrusted (docs/kernel-cache.md): a folder owned by another user or
writable by group or others is not used at all (as ssh refuses loose permissions); an entry
must be a regular file of this user, opened without following links, at most _MAX_ENTRY
bytes. The folder is kept under ``GPURT_CACHE_MAX_BYTES`` (default 1 GiB) by deleting the
least recently used entries after each write; temp files left by crashed writers go then too.

The toolchain part of every key (NVRTC's version, CUDA's header folders) costs ~60 ms to
discover, so it is remembered in the cache folder too and re-validated by ``stat`` only:
a disk hit in a fresh process stays well under a millisecond.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import sys
import threading
import time
import warnings
from typing import Any

from cuda import pathfinder
from cuda.bindings import nvrtc as _nvrtc

from .._core.driver import bindings_version, check
from .._core.files import write_atomic
from .._core.fork import renew_after_fork

__all__ = ["Entry", "Toolchain", "cache_dir", "clear_cache"]

SCHEMA = 1
_MAGIC = b"GPURT-KERNEL-1\n"
_SUFFIX = ".kernel"
_RECHECK_S = 1.0  # include folders are re-fingerprinted at most this often
_SKIP_DIRS = {".git", "__pycache__", ".hg", ".svn"}
_MAX_ENTRY = 1 << 28  # bytes of one entry (a cubin of the largest kernels is a few MB)
_MAX_RECORD = 1 << 20  # bytes of a toolchain record
DEFAULT_MAX_BYTES = 1 << 30  # the folder's size limit unless GPURT_CACHE_MAX_BYTES says
_STALE_TEMP_S = 3600.0  # a temp file this old belongs to a writer that died
_KEEP_RECORDS = 8  # toolchain records kept (a new one comes with each environment change)


@dataclasses.dataclass(frozen=True)
class Entry:
    """A compiled program: the binary, its kind ('cubin', 'ptx', 'ltoir' or 'fatbin'), the
    lowered names of its name expressions and NVRTC's log (warnings)."""

    binary: bytes
    kind: str
    lowered: dict[str, str]
    log: str


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """What besides the inputs decides NVRTC's output: its version and CUDA's headers."""

    nvrtc_version: tuple[int, int]
    include_dirs: tuple[str, ...]
    digest: str


# ---- where ---------------------------------------------------------------------------------


def cache_dir() -> str | None:
    """The disk cache folder in use, or None when ``GPURT_CACHE_DISABLE=1``."""
    if os.environ.get("GPURT_CACHE_DISABLE", "").strip() not in ("", "0"):
        return None
    path = os.environ.get("GPURT_CACHE_DIR")
    if path:
        return os.path.abspath(os.path.expanduser(path))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpurt", "kernels")


_state_lock = threading.Lock()
renew_after_fork(globals(), _state_lock=threading.Lock)
_unusable: set[str] = set()
_warned = False
_made: set[str] = set()
_checked: set[str] = set()  # folders whose owner and mode were checked


def _degrade(directory: str, exc: BaseException) -> None:
    """Stop using ``directory`` for this process; warn the first time only."""
    global _warned
    with _state_lock:
        _unusable.add(directory)
        first = not _warned
        _warned = True
    if first:
        warnings.warn(
            f"gpurt kernel cache folder {directory!r} is not usable ({exc}); compiled kernels "
            "are cached in memory only for this process (set GPURT_CACHE_DIR to a writable "
            "folder or GPURT_CACHE_DISABLE=1 to silence this)",
            RuntimeWarning,
            stacklevel=4,
        )


def _ensure_dir(directory: str) -> None:
    if directory in _made:
        return
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)  # makedirs' mode is filtered by the umask
    _check_owner(directory)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"no write permission on {directory}")
    _made.add(directory)


def _check_owner(directory: str) -> None:
    """Raise PermissionError unless ``directory`` is this user's and only this user's to
    write: anyone else who can write there could plant kernels that this process runs."""
    info = os.stat(directory)
    if info.st_uid != os.geteuid():
        raise PermissionError(f"the folder belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"the folder is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}; "
            "chmod 700 it)")


def usable(directory: str | None) -> bool:
    """True when ``directory`` may be used; checks its owner and mode once per process."""
    if directory is None or directory in _unusable:
        return False
    if directory not in _checked:
        try:
            _check_owner(directory)
        except FileNotFoundError:
            return True  # made (0700) on the first write
        except OSError as exc:
            _degrade(directory, exc)
            return False
        _checked.add(directory)
    return True


# ---- entries on disk -----------------------------------------------------------------------


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def _entry_digest(key: str, kind: str, lowered: dict[str, str], log: str,
                  binary: bytes) -> str:
    """The digest of everything an entry says, its header fields as well as its binary."""
    head = json.dumps([key, kind, lowered, log], sort_keys=True).encode()
    return _digest(len(head).to_bytes(8, "little") + head + binary)


def encode(key: str, entry: Entry) -> bytes:
    header = {
        "schema": SCHEMA,
        "key": key,
        "kind": entry.kind,
        "lowered": entry.lowered,
        "log": entry.log,
        "size": len(entry.binary),
        "blake2b": _entry_digest(key, entry.kind, entry.lowered, entry.log, entry.binary),
    }
    head = json.dumps(header, sort_keys=True).encode()
    return _MAGIC + len(head).to_bytes(4, "little") + head + entry.binary


def decode(key: str, data: bytes) -> Entry | None:
    """The entry in ``data`` if it is whole, for ``key``, of the expected shape and its digest
    matches; else None (never an exception: the file may hold anything)."""
    start = len(_MAGIC) + 4
    if not data.startswith(_MAGIC) or len(data) < start:
        return None
    head_len = int.from_bytes(data[len(_MAGIC): start], "little")
    if start + head_len > len(data):
        return None
    try:
        header = json.loads(data[start: start + head_len])
    except (ValueError, RecursionError):  # also bad UTF-8, and nesting deeper than json can go
        return None
    binary = data[start + head_len:]
    lowered = header.get("lowered") if isinstance(header, dict) else None
    ok = (
        isinstance(lowered, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items())
        and isinstance(header.get("log"), str)
        and header.get("schema") == SCHEMA
        and header.get("key") == key
        and header.get("size") == len(binary)
        and header.get("kind") in ("cubin", "ptx", "ltoir", "fatbin")
        and header.get("blake2b") == _entry_digest(key, header["kind"], lowered, header["log"],
                                                   binary)
    )
    if not ok or not isinstance(lowered, dict):
        return None
    return Entry(binary, header["kind"], dict(lowered), header["log"])


def read_private(path: str, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of this user of at most ``limit`` bytes:
    opened without following a link and without blocking (a FIFO), checked with fstat.
    Raises FileNotFoundError when absent, ValueError when it is not such a file."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"{path}: {exc}") from exc  # ELOOP: a symbolic link
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError(f"{path} is not a regular file of this user")
        if info.st_size > limit:
            raise ValueError(f"{path} has {info.st_size} bytes, over the limit of {limit}")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} grew over the limit of {limit} bytes")
    return data


def entry_path(directory: str, key: str) -> str:
    return os.path.join(directory, key + _SUFFIX)


def load(directory: str, key: str) -> Entry | None:
    """The valid entry for ``key`` or None; a corrupt entry is deleted."""
    if directory in _unusable:
        return None
    path = entry_path(directory, key)
    try:
        data = read_private(path, _MAX_ENTRY)
    except FileNotFoundError:
        return None
    except ValueError:  # a link, a FIFO, a device, another user's file, too big
        discard(directory, key)
        return None
    except OSError as exc:
        _degrade(directory, exc)
        return None
    entry = decode(key, data)
    if entry is None:
        discard(directory, key)
    else:
        _touch(path)
    return entry


def _touch(path: str) -> None:
    """Mark an entry used now: trimming deletes the least recently used first."""
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        pass


def discard(directory: str, key: str) -> None:
    """Delete the entry for ``key`` (another process may have done it already)."""
    try:
        os.unlink(entry_path(directory, key))
    except OSError:
        pass


def _write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary files start with ``.tmp-``)."""
    write_atomic(path, data, ".tmp-")


def store(directory: str, key: str, entry: Entry) -> None:
    """Write ``entry`` for ``key``; on an unusable folder, warn once and carry on."""
    if directory in _unusable:
        return
    data = encode(key, entry)
    try:
        try:
            _ensure_dir(directory)
            _write_atomic(entry_path(directory, key), data)
        except FileNotFoundError:  # the folder was removed while we ran: make it again
            _made.discard(directory)
            _ensure_dir(directory)
            _write_atomic(entry_path(directory, key), data)
    except OSError as exc:
        _degrade(directory, exc)
        return
    trim(directory)


def max_bytes() -> int:
    """The disk cache's size limit: ``GPURT_CACHE_MAX_BYTES``, else DEFAULT_MAX_BYTES."""
    raw = os.environ.get("GPURT_CACHE_MAX_BYTES", "").strip()
    try:
        return max(int(raw), 0) if raw else DEFAULT_MAX_BYTES
    except ValueError:
        warnings.warn(f"GPURT_CACHE_MAX_BYTES={raw!r} is not a number of bytes; using "
                      f"{DEFAULT_MAX_BYTES}", RuntimeWarning, stacklevel=2)
        return DEFAULT_MAX_BYTES


def _listing(directory: str) -> list[tuple[float, int, str]]:
    """(mtime, size, name) of the cache's own regular files in ``directory``."""
    rows: list[tuple[float, int, str]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return rows
    for name in names:
        if not name.endswith(_SUFFIX) and not name.startswith((".tmp-", "toolchain-")):
            continue
        try:
            info = os.lstat(os.path.join(directory, name))
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            rows.append((info.st_mtime, info.st_size, name))
    return rows


def disk_usage(directory: str | None) -> int:
    """Bytes of the cache's files in ``directory`` (0 when there is none)."""
    return sum(size for _, size, _ in _listing(directory)) if directory else 0


def trim(directory: str, limit: int | None = None) -> None:
    """Delete stale temp files, toolchain records beyond the newest few, then the least
    recently used entries until the folder's files fit in ``limit`` bytes (max_bytes())."""
    limit = max_bytes() if limit is None else limit
    now = time.time()
    rows = sorted(_listing(directory), reverse=True)  # the newest first
    kept, total, records = [], 0, 0
    for mtime, size, name in rows:
        stale_temp = name.startswith(".tmp-") and now - mtime > _STALE_TEMP_S
        if name.startswith("toolchain-"):
            records += 1
        if stale_temp or records > _KEEP_RECORDS and name.startswith("toolchain-"):
            _remove(directory, name)
        else:
            kept.append((size, name))
            total += size
    for size, name in reversed(kept):  # the oldest first
        if total <= limit:
            break
        if name.endswith(_SUFFIX):
            _remove(directory, name)
            total -= size


def _remove(directory: str, name: str) -> None:
    try:
        os.unlink(os.path.join(directory, name))
    except OSError:
        pass


# ---- the memory cache ----------------------------------------------------------------------

_memory: dict[Any, Any] = {}


def memory_get(key: Any) -> Any:
    return _memory.get(key)


def memory_put(key: Any, value: Any) -> None:
    _memory[key] = value


def clear_cache(disk: bool = False) -> None:
    """Forget compiled modules and include-folder fingerprints of this process; with
    ``disk=True`` also delete every entry of the disk cache folder."""
    _memory.clear()
    _dir_digests.clear()
    _toolchains.clear()
    directory = cache_dir()
    if disk and directory and os.path.isdir(directory):
        for name in os.listdir(directory):
            if name.endswith(_SUFFIX) or name.startswith(".tmp-") or name.startswith("toolchain-"):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass


# ---- fingerprints of include folders -------------------------------------------------------

_dir_digests: dict[str, tuple[float, str]] = {}
_file_digests: dict[str, tuple[int, int, str]] = {}


def _file_digest(path: str, st: os.stat_result) -> str:
    known = _file_digests.get(path)
    if known is not None and known[0] == st.st_mtime_ns and known[1] == st.st_size:
        return known[2]
    try:
        with open(path, "rb") as fh:
            digest = _digest(fh.read())
    except OSError:
        digest = "unreadable"
    _file_digests[path] = (st.st_mtime_ns, st.st_size, digest)
    return digest


def include_digest(path: str) -> str:
    """A digest of every file under include folder ``path`` (content hashes, cached by
    (path, mtime, size); the folder is re-walked at most once a second)."""
    now = time.monotonic()
    known = _dir_digests.get(path)
    if known is not None and now - known[0] < _RECHECK_S:
        return known[1]
    rows: list[str] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            rows.append(f"{os.path.relpath(full, path)}\0{_file_digest(full, st)}")
    if not rows and not os.path.isdir(path):
        rows.append("<missing>")
    digest = _digest("\n".join(rows).encode())
    _dir_digests[path] = (now, digest)
    return digest


# ---- the toolchain, remembered on disk -----------------------------------------------------

_toolchains: dict[str, Toolchain] = {}
_HEADER_LIBS = ("cudart", "cccl")  # cuda_fp16.h/cuda_bf16.h/cuda_runtime.h, then CCCL


def _find_header_dir(lib: str) -> str | None:
    """CUDA header folder ``lib`` from the NVIDIA wheels (or a CUDA toolkit) via
    cuda.pathfinder; None when absent or when cuda.pathfinder is too old to say."""
    find = getattr(pathfinder, "find_nvidia_header_directory", None)
    if find is None:
        return None
    try:
        found = find(lib)
    except Exception:  # unknown name on older cuda.pathfinder, or a broken install
        return None
    return str(found) if found else None


def _stamp(path: str) -> list[Any]:
    try:
        st = os.stat(path)
        return [path, st.st_mtime_ns, st.st_size]
    except OSError:
        return [path, None, None]


def _sentinels(include_dirs: tuple[str, ...]) -> list[str]:
    """Files whose stat changes when the toolchain changes: NVRTC's library and one
    version header per CUDA header folder."""
    paths = []
    for name in ("cuda_runtime_api.h", os.path.join("cuda", "std", "version")):
        for directory in include_dirs:
            candidate = os.path.join(directory, name)
            if os.path.exists(candidate):
                paths.append(candidate)
    try:
        paths.append(str(pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path))
    except Exception:  # the stamp is an extra guard only
        pass
    return paths


def _environment_fingerprint() -> str:
    """Cheap facts that decide where the toolchain is found (no file is read)."""
    site_dirs = [p for p in sys.path if "-packages" in p and os.path.isdir(p)]
    facts = [
        sys.executable, sys.prefix, bindings_version(),
        [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CONDA_PREFIX")],
        [_stamp(p) for p in site_dirs],
    ]
    return _digest(json.dumps(facts).encode())


def _discover() -> tuple[tuple[int, int], tuple[str, ...], list[str]]:
    major, minor = check(_nvrtc.nvrtcVersion(), "nvrtcVersion")
    dirs = tuple(d for d in (_find_header_dir(lib) for lib in _HEADER_LIBS) if d)
    return (int(major), int(minor)), dirs, _sentinels(dirs)


def toolchain(directory: str | None) -> Toolchain:
    """NVRTC's version and CUDA's header folders, from memory, from the record in the cache
    folder (checked by stat), or discovered (and recorded)."""
    fingerprint = _environment_fingerprint()
    known = _toolchains.get(fingerprint)
    if known is not None:
        return known
    record_path = None
    if usable(directory):
        assert directory is not None
        record_path = os.path.join(directory, f"toolchain-{fingerprint}.json")
        record = _read_record(record_path)
        if record is not None:
            return _remember(fingerprint, record)
    version, dirs, sentinels = _discover()
    record = {
        "nvrtc_version": list(version),
        "include_dirs": list(dirs),
        "stamps": [_stamp(p) for p in sentinels],
    }
    if record_path is not None and directory is not None:
        try:
            _ensure_dir(directory)
            _write_atomic(record_path, json.dumps(record).encode())
        except OSError as exc:
            _degrade(directory, exc)
    return _remember(fingerprint, record)


def _read_record(path: str) -> dict[str, Any] | None:
    """The record at ``path`` if it is of the right shape and its stamps still hold; else
    None (and a record that is not of the right shape is deleted, to be written again)."""
    try:
        record = json.loads(read_private(path, _MAX_RECORD))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        record = None
    if not _record_ok(record):
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    assert isinstance(record, dict)
    if any(_stamp(stamp[0]) != stamp for stamp in record["stamps"]):
        return None
    return record


def _record_ok(record: Any) -> bool:
    """True for {"nvrtc_version": [int, int], "include_dirs": [absolute path, ...],
    "stamps": [[path, int|None, int|None], ...]}."""
    if not isinstance(record, dict) or set(record) != {"nvrtc_version", "include_dirs", "stamps"}:
        return False
    version, dirs, stamps = record["nvrtc_version"], record["include_dirs"], record["stamps"]
    return (
        isinstance(version, list) and len(version) == 2
        and all(type(v) is int for v in version)
        and isinstance(dirs, list) and all(isinstance(d, str) and os.path.isabs(d) for d in dirs)
        and isinstance(stamps, list)
        and all(isinstance(st, list) and len(st) == 3 and isinstance(st[0], str)
                and all(v is None or type(v) is int for v in st[1:]) for st in stamps)
    )


def _remember(fingerprint: str, record: dict[str, Any]) -> Toolchain:
    version = tuple(record["nvrtc_version"])
    dirs = tuple(record["include_dirs"])
    digest = _digest(json.dumps([version, dirs, record["stamps"]]).encode())
    found = Toolchain((int(version[0]), int(version[1])), dirs, digest)
    _toolchains[fingerprint] = found
    return found


def make_key(parts: dict[str, Any]) -> str:
    """The hex digest naming a compiled program (see DESIGN.md's key recipe)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()

