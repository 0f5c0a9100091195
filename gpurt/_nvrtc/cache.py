"""The kernel caches: cache keys, the per-process memory cache and the on-disk cache.

Disk entries live in ``$GPURT_CACHE_DIR`` or ``$XDG_CACHE_HOME/gpurt/kernels`` (default
``~/.cache/gpurt/kernels``), a 0700 folder created on first write. Each entry is one file,
``<key>.kernel``: a magic line, a JSON header (kind, lowered names, log, payload size and
digest) and the binary. Files are written to a temp file, fsynced and ``os.replace``d into
place, so concurrent processes only ever see whole entries; a file whose header or digest
does not check out is deleted and the kernel recompiled. An unusable folder degrades to the
memory cache with one warning; ``GPURT_CACHE_DISABLE=1`` turns the disk cache off.

The toolchain part of every key (NVRTC's version, CUDA's header folders) costs ~60 ms to
discover, so it is remembered in the cache folder too and re-validated by ``stat`` only:
a disk hit in a fresh process stays well under a millisecond.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading
import time
import warnings
from typing import Any

from cuda import pathfinder
from cuda.bindings import nvrtc as _nvrtc

from .._core.driver import bindings_version, check
from .._core.files import write_atomic

__all__ = ["Entry", "Toolchain", "cache_dir", "clear_cache"]

SCHEMA = 1
_MAGIC = b"GPURT-KERNEL-1\n"
_SUFFIX = ".kernel"
_RECHECK_S = 1.0  # include folders are re-fingerprinted at most this often
_SKIP_DIRS = {".git", "__pycache__", ".hg", ".svn"}


@dataclasses.dataclass(frozen=True)
class Entry:
    """A compiled program: the binary, its kind ('cubin' or 'ptx'), the lowered names of
    its name expressions and NVRTC's log (warnings)."""

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
_unusable: set[str] = set()
_warned = False
_made: set[str] = set()


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
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"no write permission on {directory}")
    _made.add(directory)


def usable(directory: str | None) -> bool:
    return directory is not None and directory not in _unusable


# ---- entries on disk -----------------------------------------------------------------------


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def encode(key: str, entry: Entry) -> bytes:
    header = {
        "schema": SCHEMA,
        "key": key,
        "kind": entry.kind,
        "lowered": entry.lowered,
        "log": entry.log,
        "size": len(entry.binary),
        "blake2b": _digest(entry.binary),
    }
    head = json.dumps(header, sort_keys=True).encode()
    return _MAGIC + len(head).to_bytes(4, "little") + head + entry.binary


def decode(key: str, data: bytes) -> Entry | None:
    """The entry in ``data`` if it is whole, for ``key`` and its digest matches; else None."""
    start = len(_MAGIC) + 4
    if not data.startswith(_MAGIC) or len(data) < start:
        return None
    head_len = int.from_bytes(data[len(_MAGIC): start], "little")
    try:
        header = json.loads(data[start: start + head_len])
        binary = data[start + head_len:]
        ok = (
            header["schema"] == SCHEMA
            and header["key"] == key
            and header["size"] == len(binary)
            and header["blake2b"] == _digest(binary)
            and header["kind"] in ("cubin", "ptx")
        )
        if not ok:
            return None
        return Entry(binary, header["kind"], dict(header["lowered"]), str(header["log"]))
    except (ValueError, KeyError, TypeError):
        return None


def entry_path(directory: str, key: str) -> str:
    return os.path.join(directory, key + _SUFFIX)


def load(directory: str, key: str) -> Entry | None:
    """The valid entry for ``key`` or None; a corrupt entry is deleted."""
    if directory in _unusable:
        return None
    path = entry_path(directory, key)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _degrade(directory, exc)
        return None
    entry = decode(key, data)
    if entry is None:
        discard(directory, key)
    return entry


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
    try:
        with open(path, "rb") as fh:
            record = json.loads(fh.read())
        stamps = record["stamps"]
        if any(_stamp(stamp[0]) != stamp for stamp in stamps):
            return None
        return record
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


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

