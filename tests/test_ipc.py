"""gpurt.ipc: the handle's wire format and its validation (CPU), the importers' counter
files (CPU), and two processes sharing Arrays on one GPU (GPU)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpurt
from gpurt._array.layout import byte_extent
from gpurt._ipc import counter
from gpurt._ipc.handle import _FIXED, IpcHandle

WORKER = Path(__file__).with_name("_ipc_worker.py")


def make_handle(**changes: object) -> IpcHandle:
    fields: dict[str, object] = dict(
        device_uuid=bytes(range(16)), mem_handle=b"\x01" * 64, event_handle=b"\x02" * 64,
        offset=1024, segment_size=2 << 20, shape=(3, 4), strides=(32, 4),
        dtype=np.dtype(np.float32), pid=4242, token=b"\x07" * 16)
    fields.update(changes)
    return IpcHandle(**fields)  # type: ignore[arg-type]


# ---- the wire format (CPU) -------------------------------------------------------------


def test_round_trip_through_bytes_and_pickle() -> None:
    handle = make_handle(dtype=np.dtype(ml_dtypes.bfloat16), strides=(-16, 2), offset=64)
    data = handle.to_bytes()
    assert len(data) == _FIXED.size + 16 * 2
    assert IpcHandle.from_bytes(data) == handle
    assert IpcHandle.from_bytes(bytearray(data)) == handle
    assert pickle.loads(pickle.dumps(handle)) == handle  # by value, through from_bytes
    assert handle.nbytes == 3 * 4 * 2


@pytest.mark.parametrize("changes, message", [
    ({"shape": (3, -1)}, "dimension"),
    ({"strides": (32, 3)}, "multiple of the item size"),
    ({"strides": (32,)}, "do not match"),
    ({"offset": 1026}, "multiple of the item size"),
    ({"offset": (2 << 20) - 8}, "outside its allocation"),
    ({"strides": (-32, 4), "offset": 0}, "outside its allocation"),
    ({"shape": (0, 4)}, "no elements"),
    ({"token": b"\0" * 16}, "all zeros"),
    ({"token": b"\1" * 15}, "token must be 16 bytes"),
    ({"pid": 0}, "pid"),
    ({"segment_size": 0}, "segment_size"),
    ({"mem_handle": b"\1" * 63}, "mem_handle"),
    ({"dtype": np.dtype("U4")}, "unsupported dtype"),
    ({"offset": True}, "offset"),
])
def test_construction_validates_every_field(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_handle(**changes)


def _patched(offset: int, fmt: str, value: object) -> bytes:
    data = bytearray(make_handle().to_bytes())
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize("data, message", [
    (b"", "shorter than"),
    (make_handle().to_bytes()[:-1], "bytes; a 2-d handle has"),
    (make_handle().to_bytes() + b"\0", "bytes; a 2-d handle has"),
    (_patched(0, "8s", b"NOTGPURT"), "bad magic"),
    (_patched(8, "<H", 2), "version 2"),
    (_patched(10, "<H", 33), "at most 32"),
    (_patched(10, "<H", 1), "bytes; a 1-d handle has"),
    (_patched(192, "16s", b"float128"), "unsupported dtype"),
    (_patched(192, "16s", b"\xff\xfe"), "unsupported dtype"),
    (_patched(_FIXED.size, "<q", -5), "dimension"),
    (_patched(_FIXED.size + 8, "<q", 1 << 60), "dimension"),
])
def test_parsing_refuses_malformed_bytes(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IpcHandle.from_bytes(data)


def test_parsing_needs_bytes() -> None:
    with pytest.raises(TypeError, match="bytes"):
        IpcHandle.from_bytes("GPURTIPC")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_corrupted_handles_raise_value_error_or_parse_within_bounds(data: st.DataObject) -> None:
    raw = bytearray(make_handle().to_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        handle = IpcHandle.from_bytes(bytes(raw))
    except ValueError:
        return
    lo, hi = byte_extent(handle.shape, handle.strides, handle.dtype.itemsize)
    assert 0 <= handle.offset + lo < handle.offset + hi <= handle.segment_size


def test_a_handle_from_this_process_is_refused_before_any_driver_call() -> None:
    handle = make_handle(pid=os.getpid())
    with pytest.raises(ValueError, match="exported the handle itself"):
        gpurt.ipc.open_array(handle)
    with pytest.raises(ValueError, match="exported the handle itself"):
        gpurt.ipc.open_array(handle.to_bytes())


def test_export_needs_an_array() -> None:
    with pytest.raises(TypeError, match="gpurt.Array"):
        gpurt.ipc.export_array(np.zeros(3))  # type: ignore[arg-type]


def test_the_handle_is_frozen_data() -> None:
    handle = make_handle()
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.offset = 0  # type: ignore[misc]


# ---- the importers' counter (CPU) ------------------------------------------------------


def test_counter_counts_importers_down_to_zero_and_no_further() -> None:
    token = os.urandom(16)
    fd = counter.create(os.getpid(), token, 2)
    try:
        assert counter.read(fd) == 2
        counter.decrement(counter.open_existing(os.getpid(), token))
        assert counter.read(fd) == 1
        for _ in range(2):
            counter.decrement(counter.open_existing(os.getpid(), token))
        assert counter.read(fd) == 0
    finally:
        os.close(fd)
        counter.remove(os.getpid(), token)
    with pytest.raises(ValueError, match="cannot be opened"):
        counter.open_existing(os.getpid(), token)


def test_counter_refuses_links_and_foreign_files(tmp_path: Path) -> None:
    token = os.urandom(16)
    path = counter.path_of(os.getpid(), token)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0" * 8)
    os.symlink(target, path)
    try:
        with pytest.raises(ValueError, match="cannot be opened"):
            counter.open_existing(os.getpid(), token)
    finally:
        os.unlink(path)
    Path(path).write_bytes(b"\0" * 9)  # not the 8 bytes gpurt writes
    try:
        with pytest.raises(ValueError, match="not a counter"):
            counter.open_existing(os.getpid(), token)
    finally:
        os.unlink(path)


# ---- two processes on one GPU ----------------------------------------------------------


def _run_importer(folder: Path, count: int) -> str:
    result = subprocess.run([sys.executable, str(WORKER), str(folder), str(count)],
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and output.rstrip().endswith("OK"), output
    return output


@pytest.mark.gpu
def test_two_processes_share_arrays_and_the_exporter_keeps_blocks_until_importers_close(
        tmp_path: Path, gpu_state: None) -> None:
    rng = np.random.default_rng()
    base = rng.standard_normal((6, 10)).astype(np.float32)
    x = gpurt.from_numpy(base)
    gpurt.ipc_collect()
    view = x[1:5, ::3]  # strided, at an offset inside the block
    y_host = rng.standard_normal((33, 7)).astype(ml_dtypes.bfloat16)
    y = gpurt.from_numpy(y_host)
    handles = [gpurt.ipc.export_array(view), gpurt.ipc.export_array(y)]
    assert handles[0].strides == view.strides and handles[0].offset % 4 == 0
    for i, (handle, expected) in enumerate(zip(handles, [base[1:5, ::3], y_host])):
        (tmp_path / f"handle{i}.bin").write_bytes(handle.to_bytes())
        # numpy saves ml_dtypes' bfloat16 as raw void: send the bits and the dtype's name
        bits = np.ascontiguousarray(expected).view(f"u{expected.dtype.itemsize}")
        np.save(tmp_path / f"expected{i}.npy", bits)
        (tmp_path / f"dtype{i}.txt").write_text(expected.dtype.name)

    allocated = gpurt.memory_allocated()
    del y, view  # the exports keep y's block (and x's) allocated
    gpurt.ipc_collect()  # no importer has closed yet: nothing is released
    assert gpurt.memory_allocated() == allocated
    with pytest.raises(ValueError, match="exported the handle itself"):
        gpurt.ipc.open_array(handles[1])

    _run_importer(tmp_path, 2)

    got = x.to_numpy()
    want = base.copy()
    want[1:5, ::3] = base[1:5, ::3] * 2 + 1
    assert np.array_equal(got, want)  # the importer's writes, and nothing outside the view
    assert gpurt.memory_allocated() == allocated  # until ipc_collect runs here
    gpurt.ipc_collect()
    assert gpurt.memory_allocated() == allocated - y_host.nbytes - (-y_host.nbytes % 512)
    for handle in handles:  # collected: the counter files are gone
        assert not os.path.exists(counter.path_of(os.getpid(), handle.token))


@pytest.mark.gpu
def test_an_export_no_importer_opened_stays_until_exit(gpu_state: None) -> None:
    array = gpurt.from_numpy(np.random.default_rng().standard_normal(100).astype(np.float32))
    handle = gpurt.ipc.export_array(array, importers=2)
    path = Path(counter.path_of(os.getpid(), handle.token))
    assert path.read_bytes() == (2).to_bytes(8, "little")
    gpurt.ipc_collect()
    assert path.exists()
    with pytest.raises(ValueError, match="importers"):
        gpurt.ipc.export_array(array, importers=0)
    with pytest.raises(ValueError, match="empty array"):
        gpurt.ipc.export_array(gpurt.empty(0))
    held = gpurt.memory_allocated()
    del array
    assert gpurt.memory_allocated() == held  # the export still holds the block
    for _ in range(2):  # the two importers it was made for close
        counter.decrement(counter.open_existing(os.getpid(), handle.token))
    gpurt.ipc_collect()
    assert not path.exists() and gpurt.memory_allocated() < held


# ---- the importer's bookkeeping, with the driver calls stubbed out (CPU) ----------------


class _FakeDriver:
    """Stands in for the driver calls of gpurt.ipc's importing side and records them."""

    def __init__(self) -> None:
        self.opened: list[bytes] = []
        self.closed: list[int] = []

    def call(self, index: int, name: str, fn: object, *args: object) -> object:
        if name == "cuIpcOpenMemHandle":
            self.opened.append(bytes(64))
            return 0x7000_0000 + len(self.opened) * (1 << 24)
        if name == "cuMemGetAddressRange":
            return (args[0], 2 << 20)
        assert name == "cuIpcCloseMemHandle", name
        self.closed.append(int(args[0]))  # type: ignore[call-overload]
        return None


def test_imports_count_once_per_process_and_unmap_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeDriver()
    monkeypatch.setattr(gpurt.ipc, "call", fake.call)
    monkeypatch.setattr(gpurt.ipc, "_device_with_uuid", lambda uuid: 0)
    monkeypatch.setattr(gpurt.ipc, "synchronize", lambda index: None)
    monkeypatch.setattr(gpurt.ipc.Event, "from_ipc_handle", staticmethod(lambda i, h: None))
    monkeypatch.setattr(gpurt.ipc, "current_stream",
                        lambda index: type("S", (), {"wait_event": lambda self, e: None})())
    monkeypatch.setattr(gpurt.ipc, "_wrap", lambda foreign: [foreign.keep, foreign.ptr])
    exporter = os.getpid() + 100000  # another process's export, as far as the names go
    tokens = [os.urandom(16), os.urandom(16)]
    fds = [counter.create(exporter, token, 1) for token in tokens]
    try:
        first = [make_handle(pid=exporter, token=t) for t in tokens]  # one allocation
        a = gpurt.ipc.open_array(first[0])
        b = gpurt.ipc.open_array(first[0])  # the same export again
        c = gpurt.ipc.open_array(first[1])  # another export of the same allocation
        assert len(fake.opened) == 1 and a[1] == b[1] == c[1]  # one mapping, shared
        del a
        gpurt.ipc_collect()
        assert [counter.read(fd) for fd in fds] == [1, 1] and not fake.closed
        del b
        gpurt.ipc_collect()
        assert [counter.read(fd) for fd in fds] == [0, 1] and not fake.closed
        del c
        gpurt.ipc_collect()
        assert [counter.read(fd) for fd in fds] == [0, 0] and len(fake.closed) == 1
    finally:
        for fd, token in zip(fds, tokens):
            os.close(fd)
            counter.remove(exporter, token)
