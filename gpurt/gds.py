"""GPUDirect Storage: reads and writes between files and device memory through NVIDIA's
cuFile (torch.cuda.gds's names, on cuda.bindings.cufile and the ``nvidia-cufile`` wheel:
``pip install "gpurt[gds]"``).

With the GDS kernel driver (nvidia-fs) present, cuFile moves data by DMA between storage
and the GPU; without it gpurt puts cuFile in its compatibility mode, where cuFile reads
through host bounce buffers with POSIX I/O: the same API, slower. ``GPURT_GDS_COMPAT=1``
forces compatibility mode. cuFile calls are synchronous for the host: gpurt synchronizes
the array's stream before each, so queued kernels finish writing (or reading) first.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import sys
import threading
import warnings
import weakref
from typing import Any

from ._core.driver import CudaUnavailableError
from ._core.fork import renew_after_fork
from ._memory.pinned import pinned_empty
from ._streams.handles import raw_call
from .array import Array, asarray, uint8

__all__ = ["GdsFile", "gds_register_buffer", "gds_deregister_buffer", "is_compat_mode"]

_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)
_cufile: Any = None
_compat = False
_NVIDIA_FS = ("/proc/driver/nvidia-fs/stats", "/dev/nvidia-fs0")


def _gds_driver_present() -> bool:
    return any(os.path.exists(path) for path in _NVIDIA_FS)


def _library() -> Any:
    """cuda.bindings.cufile with the cuFile driver opened once (compatibility mode where
    nvidia-fs is absent); a clear error where cuFile is missing."""
    global _cufile, _compat
    if _cufile is not None:
        return _cufile
    with _lock:
        if _cufile is not None:
            return _cufile
        if sys.platform != "linux":
            raise CudaUnavailableError("GPUDirect Storage (cuFile) exists only on Linux")
        try:
            from cuda.bindings import cufile
        except ImportError as exc:
            raise CudaUnavailableError(
                f"gpurt.gds needs cuda-bindings with cuda.bindings.cufile ({exc})") from None
        compat = os.environ.get("GPURT_GDS_COMPAT") == "1" or not _gds_driver_present()
        if compat:
            _force_compat_mode(cufile)
        try:
            cufile.driver_open()
        except Exception as exc:  # libcufile missing (pathfinder) or cuFileError
            raise CudaUnavailableError(
                f"cuFile could not be opened: {exc}. gpurt.gds needs NVIDIA's libcufile: "
                'pip install "gpurt[gds]" (the nvidia-cufile wheel)') from None
        atexit.register(_close_driver, cufile)
        _compat = compat
        _cufile = cufile
    return cufile


def _force_compat_mode(cufile: Any) -> None:
    """Ask cuFile for POSIX I/O through host buffers (before cuFileDriverOpen). An older
    libcufile without cuFileSetParameterBool falls back to compat mode on its own."""
    flags = cufile.BoolConfigParameter
    for flag in (flags.PROPERTIES_ALLOW_COMPAT_MODE, flags.FORCE_COMPAT_MODE):
        try:
            cufile.set_parameter_bool(flag, True)
        except Exception:  # noqa: BLE001 - older cuFile: its default config allows compat
            pass


def _close_driver(cufile: Any) -> None:
    try:
        cufile.driver_close()
    except Exception:  # at exit: nothing to tell anyone
        pass


def is_compat_mode() -> bool:
    """True when gpurt opened cuFile in compatibility mode (no nvidia-fs driver, or
    ``GPURT_GDS_COMPAT=1``): data goes through host bounce buffers."""
    _library()
    return _compat


def _device_array(obj: Any, what: str) -> Array:
    """``obj`` (an Array, or a torch/CuPy array, zero-copy) as a contiguous Array."""
    array = obj if isinstance(obj, Array) else asarray(obj, copy=False)
    if not array.is_contiguous():
        raise ValueError(f"{what} needs a contiguous array; this one has strides "
                         f"{array.strides} (use .contiguous())")
    return array


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    key = message.split(" of ")[0]
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _failed(call: str, exc: BaseException) -> RuntimeError:
    return RuntimeError(f"{call} failed: {exc}")


def gds_register_buffer(array: Any) -> None:
    """Register ``array``'s memory with cuFile for repeated I/O (wraps cuFileBufRegister);
    torch.cuda.gds.gds_register_buffer for Arrays and anything exporting device memory."""
    cufile = _library()
    target = _device_array(array, "gds_register_buffer")
    if not target.nbytes:
        raise ValueError("gds_register_buffer: the array is empty")
    try:
        raw_call(target.device.index, cufile.buf_register, target.ptr, target.nbytes, 0)
    except cufile.cuFileError as exc:
        raise _failed("cuFileBufRegister", exc) from None


def gds_deregister_buffer(array: Any) -> None:
    """Undo :func:`gds_register_buffer` (wraps cuFileBufDeregister)."""
    cufile = _library()
    target = _device_array(array, "gds_deregister_buffer")
    try:
        raw_call(target.device.index, cufile.buf_deregister, target.ptr)
    except cufile.cuFileError as exc:
        raise _failed("cuFileBufDeregister", exc) from None


class _Registration:
    """The open descriptor and cuFile handle of a GdsFile; released exactly once."""

    __slots__ = ("fd", "handle")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.handle: int | None = None


def _release(registration: _Registration) -> None:
    """Deregister (a cuFile bookkeeping call, not a CUDA driver call) and close the file."""
    handle, registration.handle = registration.handle, None
    if handle is not None and _cufile is not None:
        try:
            _cufile.handle_deregister(handle)
        except Exception:  # releasing: the descriptor is closed regardless
            pass
    fd, registration.fd = registration.fd, -1
    if fd >= 0:
        os.close(fd)


def _open_file(filename: str | os.PathLike[str], flags: int) -> tuple[int, bool]:
    """``os.open`` with O_DIRECT, which cuFile needs to register a file (in compatibility
    mode too); without it on filesystems that refuse O_DIRECT (tmpfs). Returns the
    descriptor and whether it is O_DIRECT."""
    try:
        return os.open(filename, flags | os.O_DIRECT, 0o644), True
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    return os.open(filename, flags, 0o644), False


_POSIX_CHUNK = 64 << 20  # the pinned bounce buffer of the host path


def _posix_io(fd: int, target: Array, offset: int, write: bool) -> None:
    """Move ``target``'s bytes through a pinned host buffer with pread/pwrite: what cuFile's
    compatibility mode does, for files cuFile refuses to register."""
    nbytes = target.nbytes
    flat = target.reshape(-1).view(uint8)
    bounce = pinned_empty(min(nbytes, _POSIX_CHUNK), uint8)
    for start in range(0, nbytes, _POSIX_CHUNK):
        count = min(_POSIX_CHUNK, nbytes - start)
        part, host = flat[start:start + count], bounce[:count]
        if write:
            part.to_numpy(out=host)
        done = 0
        while done < count:
            window = host.data[done:]
            moved = (os.pwrite(fd, window, offset + start + done) if write
                     else os.preadv(fd, [window], offset + start + done))
            if moved <= 0:
                raise OSError(errno.EIO, f"{'pwrite' if write else 'pread'} stopped after "
                              f"{start + done} of {nbytes} bytes")
            done += moved
        if not write:
            part.copy_(host)


class GdsFile:
    """A file opened for cuFile I/O (torch.cuda.gds.GdsFile): ``flags`` go to ``os.open``
    (O_DIRECT is added, as torch does). :meth:`load_array` / :meth:`save_array`
    move a contiguous device array's bytes from / to the file at ``offset``;
    ``load_storage`` and ``save_storage`` are torch's names. Close with :meth:`close` or
    ``with``. Where cuFile refuses to register the file (no O_DIRECT on its filesystem, or
    a cuFile error, said once in a RuntimeWarning) it is read and written through pinned
    host memory instead, as cuFile's compatibility mode would: :attr:`backend` says which."""

    def __init__(self, filename: str | os.PathLike[str], flags: int) -> None:
        _library()
        self.filename = os.fspath(filename)
        self.flags = int(flags)
        fd, direct = _open_file(filename, self.flags)
        self._reg = _Registration(fd)
        self._finalizer = weakref.finalize(self, _release, self._reg)
        self.backend = "posix"
        if direct:
            try:
                self.register_handle()
                self.backend = "cufile"
            except RuntimeError as exc:
                _warn_once(f"gpurt.gds: {exc}; reading and writing through host memory")
        if self.backend == "posix" and direct:  # pread/pwrite need no alignment without it
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)

    @property
    def handle(self) -> int | None:
        """The cuFile handle, None once deregistered."""
        return self._reg.handle

    def register_handle(self) -> None:
        """Register the file with cuFile (wraps cuFileHandleRegister)."""
        cufile = _library()
        if self._reg.handle is not None:
            raise RuntimeError("the file is registered already")
        if self._reg.fd < 0:
            raise RuntimeError(f"{self.filename} was closed")
        descr = cufile.Descr()
        descr.type = cufile.FileHandleType.OPAQUE_FD
        descr.handle.fd = self._reg.fd
        descr.fs_ops = 0
        try:
            self._reg.handle = int(cufile.handle_register(descr.ptr))
        except cufile.cuFileError as exc:
            raise _failed(f"cuFileHandleRegister of {self.filename}", exc) from None

    def deregister_handle(self) -> None:
        """Deregister the file from cuFile (wraps cuFileHandleDeregister); it stays open."""
        handle, self._reg.handle = self._reg.handle, None
        if handle is None:
            raise RuntimeError("the file is not registered")
        _library().handle_deregister(handle)

    def close(self) -> None:
        """Deregister and close the file; idempotent."""
        self._finalizer()

    def __enter__(self) -> GdsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _io(self, array: Any, offset: int, write: bool) -> Array:
        what = "save_array" if write else "load_array"
        target = _device_array(array, what)
        if type(offset) is not int or offset < 0:
            raise ValueError(f"{what}: offset must be an int >= 0, got {offset!r}")
        if self._reg.fd < 0:
            raise RuntimeError(f"{what}: {self.filename} was closed")
        handle = self._reg.handle
        if handle is None and self.backend == "cufile":
            raise RuntimeError(f"{what}: {self.filename} is not registered with cuFile")
        nbytes = target.nbytes
        if not nbytes:
            return target
        if not write:
            available = os.fstat(self._reg.fd).st_size - offset
            if available < nbytes:
                raise ValueError(f"load_array: {self.filename} has {max(available, 0)} bytes "
                                 f"from offset {offset}; the array needs {nbytes}")
        target.stream.synchronize()
        if handle is None:
            _posix_io(self._reg.fd, target, offset, write)
            return target
        cufile = _library()
        move = cufile.write if write else cufile.read
        try:
            done = raw_call(target.device.index, move, handle, target.ptr, nbytes, offset, 0)
        except cufile.cuFileError as exc:
            raise _failed("cuFileWrite" if write else "cuFileRead", exc) from None
        if done != nbytes:
            raise OSError(f"{'cuFileWrite' if write else 'cuFileRead'} moved {done} of "
                          f"{nbytes} bytes at offset {offset} of {self.filename}")
        return target

    def load_array(self, array: Any, offset: int = 0) -> None:
        """Fill ``array`` (contiguous, device memory) with its ``nbytes`` bytes of the file
        from ``offset`` (wraps cuFileRead)."""
        self._io(array, offset, write=False)

    def save_array(self, array: Any, offset: int = 0) -> None:
        """Write ``array``'s bytes into the file at ``offset`` (wraps cuFileWrite)."""
        self._io(array, offset, write=True)

    load_storage = load_array  # torch.cuda.gds's names
    save_storage = save_array
