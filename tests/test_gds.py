"""gpurt.gds: argument checks (CPU, no cuFile needed) and reads/writes between files and
device memory through cuFile, compared with numpy and torch.cuda.gds (GPU)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import gpurt
from gpurt import gds


def test_without_cufile_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    if gds._cufile is not None:
        pytest.skip("cuFile is already open in this process")
    try:
        gds.is_compat_mode()
    except gpurt.CudaUnavailableError as exc:
        assert "cufile" in str(exc).lower()
    else:
        pytest.skip("cuFile opened here")


def _cufile_or_skip() -> None:
    try:
        gds.is_compat_mode()
    except gpurt.CudaUnavailableError as exc:
        pytest.skip(f"cuFile is not usable here: {exc}")


def _random(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng().standard_normal(shape).astype(dtype)


@pytest.mark.gpu
def test_save_then_load_round_trips_at_offsets(tmp_path: Path, gpu_state: None) -> None:
    _cufile_or_skip()
    first, second = _random((1000,)), _random((37, 129), np.float16)
    path = tmp_path / "data.bin"
    with gds.GdsFile(path, os.O_CREAT | os.O_RDWR) as f:
        f.save_array(gpurt.from_numpy(first), offset=0)
        f.save_storage(gpurt.from_numpy(second), offset=first.nbytes)
        out1 = gpurt.full(first.shape, np.nan, np.float32)  # poisoned before the read
        out2 = gpurt.full(second.shape, np.nan, np.float16)
        f.load_array(out1, offset=0)
        f.load_storage(out2, offset=first.nbytes)
    assert np.array_equal(out1.to_numpy(), first)
    assert np.array_equal(out2.to_numpy(), second)
    assert path.read_bytes() == first.tobytes() + second.tobytes()  # what was written
    print("GdsFile backend:", f.backend, "compat mode:", gds.is_compat_mode())
    assert f.backend in ("cufile", "posix") and f.handle is None
    f.close()  # idempotent


@pytest.mark.gpu
def test_reads_what_numpy_wrote_and_refuses_bad_requests(tmp_path: Path, gpu_state: None) -> None:
    _cufile_or_skip()
    host = _random((4096,))
    path = tmp_path / "numpy.bin"
    host.tofile(path)
    with gds.GdsFile(path, os.O_RDONLY) as f:
        out = gpurt.full((2048,), np.nan, np.float32)
        f.load_array(out, offset=4096 * 2)
        assert np.array_equal(out.to_numpy(), host[2048:])
        with pytest.raises(ValueError, match="has 8192 bytes from offset 8192"):
            f.load_array(gpurt.empty(4096), offset=8192)
        with pytest.raises(ValueError, match="contiguous"):
            f.load_array(gpurt.empty((8, 8))[:, ::2])
        with pytest.raises(ValueError, match="offset"):
            f.load_array(out, offset=-1)
        if f.backend == "cufile":
            f.deregister_handle()
            with pytest.raises(RuntimeError, match="not registered"):
                f.load_array(out)
            f.register_handle()
        out.fill_(np.nan)
        f.load_array(out)
        assert np.array_equal(out.to_numpy(), host[:2048])
    with pytest.raises(RuntimeError, match="closed"):
        f.load_array(out)


@pytest.mark.gpu
def test_registered_buffers_and_torch_tensors(tmp_path: Path, gpu_state: None) -> None:
    _cufile_or_skip()
    host = _random((256, 64))
    path = tmp_path / "reg.bin"
    host.tofile(path)
    out = gpurt.full(host.shape, np.nan, np.float32)
    gds.gds_register_buffer(out)
    with gds.GdsFile(path, os.O_RDONLY) as f:
        f.load_array(out)
    gds.gds_deregister_buffer(out)
    assert np.array_equal(out.to_numpy(), host)
    torch = pytest.importorskip("torch")
    tensor = torch.full(host.shape, float("nan"), device="cuda")
    with gds.GdsFile(path, os.O_RDONLY) as f:
        f.load_storage(tensor)  # zero-copy through __cuda_array_interface__
    assert np.array_equal(tensor.cpu().numpy(), host)


@pytest.mark.gpu
def test_torch_gds_reads_what_gpurt_wrote(tmp_path: Path, gpu_state: None) -> None:
    _cufile_or_skip()
    torch = pytest.importorskip("torch")
    if not hasattr(torch.cuda, "gds"):
        pytest.skip("this torch has no torch.cuda.gds")
    host = _random((300, 77))
    written = tmp_path / "gpurt.bin"
    with gds.GdsFile(written, os.O_CREAT | os.O_RDWR) as f:
        f.save_array(gpurt.from_numpy(host))
    theirs = torch.full(host.shape, float("nan"), device="cuda")
    try:
        torch_file = torch.cuda.gds.GdsFile(str(written), os.O_RDONLY)
        torch_file.load_storage(theirs.untyped_storage())
    except (RuntimeError, OSError) as exc:  # a torch without cuFile, or O_DIRECT refused
        pytest.skip(f"torch.cuda.gds is not usable here: {exc}")
    assert np.array_equal(theirs.cpu().numpy(), host)


class _HostArray:
    """Stands in for a contiguous device Array over host memory, for the host path."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.nbytes = data.nbytes

    def reshape(self, *shape: int) -> _HostArray:
        return _HostArray(self.data.reshape(*shape))

    def view(self, dtype: object) -> _HostArray:
        return _HostArray(self.data.view(dtype))

    def __getitem__(self, key: slice) -> _HostArray:
        return _HostArray(self.data[key])

    def to_numpy(self, out: np.ndarray) -> np.ndarray:
        out[...] = self.data
        return out

    def copy_(self, host: np.ndarray) -> None:
        self.data[...] = host


def test_the_host_path_moves_every_byte_in_chunks(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What GdsFile does where cuFile refuses a file: pread/pwrite through a bounce buffer,
    in chunks (here 1000 bytes, so requests straddle chunks at unaligned offsets)."""
    monkeypatch.setattr(gds, "_POSIX_CHUNK", 1000)
    monkeypatch.setattr(gds, "pinned_empty", lambda n, dtype: np.empty(n, dtype))
    values = _random((1234,))
    fd = os.open(tmp_path / "host.bin", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        gds._posix_io(fd, _HostArray(values.copy()), 777, write=True)  # type: ignore[arg-type]
        assert (tmp_path / "host.bin").read_bytes()[777:] == values.tobytes()
        out = np.full(values.shape, np.nan, np.float32)
        gds._posix_io(fd, _HostArray(out), 777, write=False)  # type: ignore[arg-type]
        assert np.array_equal(out, values)
        with pytest.raises(OSError, match="stopped after"):  # the file ends early
            gds._posix_io(fd, _HostArray(np.empty(2000, np.float32)), 777,  # type: ignore
                          write=False)
    finally:
        os.close(fd)
