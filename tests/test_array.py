"""Tests for gpurt.array, gpurt._array.layout and gpurt._array.dlpack.

CPU: dtype tables, shape/stride arithmetic and the copy planner against numpy, the DLPack
structs and capsule protocol against numpy's own DLPack, errors without a driver, and
the Array's metadata, views and lifetimes over a fake allocator (no driver calls).
GPU (``@pytest.mark.gpu``): values against numpy float64 references, copies in every
direction, asynchronous pinned copies, stream fields honoured, and zero-copy interop with
torch, CuPy and JAX where they are installed.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import sys
import threading
import time
import types
import weakref

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver as cu
from hypothesis import given, settings
from hypothesis import strategies as st

import gpurt
from _fakes import device_module, fake_driver_fixture, fake_gpus_fixture  # noqa: F401
from _threads import in_thread
from gpurt import array as garray
from gpurt import memory, streams
from gpurt._array import arraycopy as _arraycopy
from gpurt._array import dlpack as _dlpack
from gpurt._array import layout as _layout
from gpurt._array import ownership as _ownership
from gpurt._core import state
from gpurt.device import Device, bind_context
from test_driver import FORK_MESSAGE, describe, run_in_fork

# ======================================================================================
# CPU: dtypes
# ======================================================================================

ALL_DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64,
    np.complex128,
]
DL_CODES = {"b": 6, "i": 0, "u": 1, "f": 2, "c": 5}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dlpack_dtype_round_trip(dtype):
    dt = np.dtype(dtype)
    code, bits = _dlpack.to_dl_dtype(dt)
    expected_code = 4 if dt == np.dtype(ml_dtypes.bfloat16) else DL_CODES[dt.kind]
    assert (code, bits) == (expected_code, dt.itemsize * 8)
    assert _dlpack.from_dl_dtype(code, bits, 1) == dt


def test_dlpack_dtype_errors():
    with pytest.raises(TypeError, match="lanes"):
        _dlpack.from_dl_dtype(2, 32, 4)
    with pytest.raises(TypeError, match="code=2, bits=8"):
        _dlpack.from_dl_dtype(2, 8, 1)
    with pytest.raises(TypeError, match="DLPack"):
        _dlpack.to_dl_dtype(np.dtype("U3"))


def test_dtype_spellings():
    f32 = np.dtype(np.float32)
    for spelling in ("float32", np.float32, f32, "<f4", "f4"):
        assert garray._as_dtype(spelling) == f32
    assert garray._as_dtype(float) == np.float64
    assert garray._as_dtype(bool) == np.bool_
    assert garray._as_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert garray._as_dtype(ml_dtypes.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert garray._as_dtype("<V2") == np.dtype(ml_dtypes.bfloat16)  # torch's CAI typestr

    class TorchLike:  # torch dtypes print as "torch.<name>"
        def __str__(self):
            return "torch.bfloat16"

    assert garray._as_dtype(TorchLike()) == np.dtype(ml_dtypes.bfloat16)
    for bad in ("U3", object, ">f4", np.longdouble, "no-such-type", [1]):
        with pytest.raises(TypeError, match="unsupported dtype"):
            garray._as_dtype(bad)


def test_exported_dtype_names():
    assert gpurt.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    assert gpurt.float32 == np.dtype(np.float32)
    assert gpurt.bool_ == np.dtype(np.bool_)
    assert gpurt.complex128 == np.dtype(np.complex128)
    for name in garray.__all__:
        assert getattr(gpurt, name) is getattr(garray, name)


# ======================================================================================
# CPU: shape and stride arithmetic against numpy
# ======================================================================================


def _np_view_layout(base: np.ndarray, view: np.ndarray) -> tuple[int, tuple, tuple]:
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return offset, view.shape, view.strides


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def _index_item(draw, dim):
    kind = draw(st.sampled_from(["int", "slice", "full"] if dim else ["slice", "full"]))
    if kind == "int":
        return draw(st.integers(-dim, dim - 1))
    if kind == "full":
        return slice(None)
    bound = st.one_of(st.none(), st.integers(-dim - 2, dim + 2))
    step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0)))
    return slice(draw(bound), draw(bound), step)


@st.composite
def shape_and_key(draw):
    shape = draw(shapes)
    n_index = draw(st.integers(0, len(shape)))
    items = [_index_item(draw, shape[axis]) for axis in range(n_index)]
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    key = tuple(items) if len(items) != 1 or draw(st.booleans()) else items[0]
    return shape, key


@settings(max_examples=400, deadline=None)
@given(shape_and_key(), st.sampled_from([1, 2, 4, 8]))
def test_basic_index_matches_numpy(case, itemsize):
    shape, key = case
    base = np.zeros(shape, dtype=f"u{itemsize}")
    try:
        view = base[key]
    except IndexError:  # ours must refuse the same keys
        with pytest.raises(IndexError):
            _layout.basic_index(shape, base.strides, key)
        return
    if not isinstance(view, np.ndarray):  # numpy gives a scalar where we give a 0-d view
        view = base[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
    offset, new_shape, new_strides = _layout.basic_index(shape, base.strides, key)
    assert (new_shape, new_strides) == (view.shape, view.strides)
    if view.size:
        assert offset == _np_view_layout(base, view)[0]
    assert _layout.is_contiguous(new_shape, new_strides, itemsize) == view.flags.c_contiguous


def test_basic_index_errors():
    shape, strides = (3, 4), (16, 4)
    with pytest.raises(IndexError, match="out of bounds"):
        _layout.basic_index(shape, strides, 3)
    with pytest.raises(IndexError, match="too many indices"):
        _layout.basic_index(shape, strides, (0, 0, 0))
    with pytest.raises(IndexError, match="single ellipsis"):
        _layout.basic_index(shape, strides, (Ellipsis, Ellipsis))
    with pytest.raises(TypeError, match="basic indexing"):
        _layout.basic_index(shape, strides, [0, 1])
    with pytest.raises(TypeError, match="boolean"):
        _layout.basic_index(shape, strides, True)


@settings(max_examples=200, deadline=None)
@given(shapes, st.sampled_from([1, 2, 4, 8, 16]))
def test_contiguous_strides_match_numpy(shape, itemsize):
    strides = _layout.contiguous_strides(shape, itemsize)
    dtype = {1: "u1", 2: "u2", 4: "u4", 8: "u8", 16: "c16"}[itemsize]
    if all(shape):  # numpy 2 zeroes the strides of empty arrays; torch and gpurt do not
        assert strides == np.empty(shape, dtype=dtype).strides
    assert _layout.is_contiguous(shape, strides, itemsize)


@settings(max_examples=200, deadline=None)
@given(shapes, st.sampled_from([1, 2, 4, 8, 16]),
       st.sampled_from(["tuple", "list", "numpy ints"]))
def test_contiguous_layout_every_spelling(shape, itemsize, spelling):
    spelled = {"tuple": shape, "list": list(shape),
               "numpy ints": tuple(np.int64(d) for d in shape)}[spelling]
    dims, strides, nbytes = _layout.contiguous_layout(spelled, itemsize)
    assert dims == shape and all(type(d) is int for d in dims)
    assert strides == _layout.contiguous_strides(shape, itemsize)
    assert nbytes == _layout.prod(shape) * itemsize


def test_contiguous_layout_refuses_what_only_looks_like_ints():
    for bad in [(2.0, 3), (2, 3.0, 4), (True, 2), (2, 3, False)]:  # hash and compare like ints
        with pytest.raises(TypeError, match="ints"):
            _layout.contiguous_layout(bad, 4)
    with pytest.raises(ValueError, match="negative"):
        _layout.contiguous_layout((2, 3, -4), 4)
    assert _layout.contiguous_layout(7, 2) == ((7,), (2,), 14)


def test_normalize_shape():
    assert _layout.normalize_shape(3) == (3,)
    assert _layout.normalize_shape([2, np.int64(3)]) == (2, 3)
    assert _layout.normalize_shape(()) == ()
    assert type(_layout.normalize_shape((np.int32(2),))[0]) is int
    with pytest.raises(ValueError, match="negative dimension"):
        _layout.normalize_shape((2, -1))
    with pytest.raises(TypeError, match="ints"):
        _layout.normalize_shape((2.0,))
    with pytest.raises(TypeError, match="ints"):
        _layout.normalize_shape((True, 2))
    with pytest.raises(TypeError, match="shape"):
        _layout.normalize_shape(2.5)


@pytest.mark.parametrize("size,newshape,expected", [
    (12, ((3, 4),), (3, 4)), (12, (3, 4), (3, 4)), (12, (-1,), (12,)), (12, (2, -1, 3), (2, 2, 3)),
    (0, (0, 5), (0, 5)), (1, ((),), ()), (12, (12,), (12,)),
])
def test_infer_reshape(size, newshape, expected):
    assert _layout.infer_reshape(size, newshape) == expected
    assert np.empty(size).reshape(*newshape).shape == expected


@pytest.mark.parametrize("size,newshape", [(12, (5,)), (12, (-1, -1)), (12, (5, -1)), (0, (-1, 0))])
def test_infer_reshape_errors(size, newshape):
    with pytest.raises(ValueError):
        _layout.infer_reshape(size, newshape)


def test_transpose_axes():
    assert _layout.transpose_axes(3, ()) == (2, 1, 0)
    assert _layout.transpose_axes(3, ((1, 0, 2),)) == (1, 0, 2)
    assert _layout.transpose_axes(3, (-1, 0, 1)) == (2, 0, 1)
    with pytest.raises(ValueError, match="permutation"):
        _layout.transpose_axes(3, (0, 0, 1))


def test_byte_extent():
    base = np.zeros((4, 5), np.float32)
    view = base[::-2, 1::2]
    key = (slice(None, None, -2), slice(1, None, 2))
    offset, shape, strides = _layout.basic_index(base.shape, base.strides, key)
    lo, hi = _layout.byte_extent(shape, strides, 4)
    touched = {offset + i * strides[0] + j * strides[1]
               for i in range(shape[0]) for j in range(shape[1])}
    assert (offset + lo, offset + hi) == (min(touched), max(touched) + 4)
    assert view.shape == shape


# ---- the copy planner, replayed on host bytes -----------------------------------------


def _replay(copies, dst: np.ndarray, dst0: int, src: np.ndarray, src0: int) -> None:
    """Execute a plan like the driver would (1-D and pitched 2-D memcpy) on byte buffers."""
    for c in copies:
        assert c.width > 0 and c.height > 0
        if c.height > 1:
            assert c.dst_pitch >= c.width and c.src_pitch >= c.width
        for row in range(c.height):
            d = dst0 + c.dst_offset + row * c.dst_pitch
            s = src0 + c.src_offset + row * c.src_pitch
            dst[d:d + c.width] = src[s:s + c.width]


def _strided_view(draw, shape, itemsize):
    """A view of ``shape`` into a larger buffer: random steps, signs and axis order."""
    perm = draw(st.permutations(range(len(shape))))  # view axis i is base axis perm[i]
    steps = [draw(st.sampled_from([1, 1, 2, 3, -1, -2])) for _ in shape]
    big_shape = [0] * len(shape)
    stepped = [slice(None)] * len(shape)
    trimmed = [slice(None)] * len(shape)
    for axis, p in enumerate(perm):
        big_shape[p] = shape[axis] * abs(steps[axis]) + draw(st.integers(0, 1))
        stepped[p] = slice(None, None, steps[axis])
        trimmed[p] = slice(None, shape[axis])
    base = np.zeros(big_shape, dtype=f"V{itemsize}")
    view = base[(*stepped, Ellipsis)][(*trimmed, Ellipsis)].transpose(perm)
    assert view.shape == shape, (view.shape, shape)
    return base, view


@st.composite
def copy_case(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    dst = _strided_view(draw, shape, itemsize)
    return shape, itemsize, dst, _strided_view(draw, shape, itemsize)


@settings(max_examples=300, deadline=None)
@given(copy_case())
def test_plan_copy_moves_every_element(case):
    shape, itemsize, (dst_base, dst_view), (src_base, src_view) = case
    src_bytes = src_base.reshape(-1).view(np.uint8)
    src_bytes[...] = np.random.default_rng(0).integers(0, 256, src_bytes.size, dtype=np.uint8)
    dst_bytes = dst_base.reshape(-1).view(np.uint8)
    dst_bytes[...] = 0xAB
    reference = dst_base.copy()
    dst0 = _np_view_layout(dst_base, dst_view)[0]
    src0 = _np_view_layout(src_base, src_view)[0]
    copies = _layout.plan_copy(shape, dst_view.strides, src_view.strides, itemsize)
    _replay(copies, dst_bytes, dst0, src_bytes, src0)
    np.ndarray(shape, dst_view.dtype, buffer=reference, offset=dst0,
               strides=dst_view.strides)[...] = src_view
    assert dst_base.tobytes() == reference.tobytes()


def test_plan_copy_merges_contiguous_layouts():
    assert _layout.plan_copy((4, 5, 6), (120, 24, 4), (120, 24, 4), 4) == [
        _layout.Copy(0, 0, 480, 1, 480, 480)]
    # rows of a wider array: one pitched 2-D copy
    assert _layout.plan_copy((4, 5), (40, 4), (20, 4), 4) == [_layout.Copy(0, 0, 20, 4, 40, 20)]
    # both reversed: flipped into one forward copy
    assert _layout.plan_copy((6,), (-4,), (-4,), 4) == [_layout.Copy(-20, -20, 24, 1, 24, 24)]
    assert _layout.plan_copy((0, 3), (12, 4), (12, 4), 4) == []


def test_plan_copy_refuses_call_storms():
    with pytest.raises(ValueError, match="copy calls"):
        _layout.plan_copy((_layout.MAX_COPY_CALLS + 1,), (4,), (-4,), 4)


# ======================================================================================
# CPU: DLPack structs and capsules, against numpy's own DLPack
# ======================================================================================


def test_dlpack_struct_layout():
    assert ctypes.sizeof(_dlpack.DLDevice) == 8
    assert ctypes.sizeof(_dlpack.DLDataType) == 4
    assert ctypes.sizeof(_dlpack.DLTensor) == 48
    assert _dlpack.DLTensor.byte_offset.offset == 40
    assert ctypes.sizeof(_dlpack.DLManagedTensor) == 64
    assert _dlpack.DLManagedTensor.deleter.offset == 56
    assert ctypes.sizeof(_dlpack.DLManagedTensorVersioned) == 80
    assert _dlpack.DLManagedTensorVersioned.deleter.offset == 16
    assert _dlpack.DLManagedTensorVersioned.flags.offset == 24
    assert _dlpack.DLManagedTensorVersioned.dl_tensor.offset == 32


@pytest.mark.parametrize("versioned", [False, True])
def test_consume_numpy_capsule(versioned):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    watch = weakref.ref(x.base)
    capsule = x.__dlpack__(max_version=(1, 0) if versioned else None)
    imported = _dlpack.consume_capsule(capsule)
    assert (imported.data, imported.shape, imported.strides) == (x.ctypes.data, x.shape, x.strides)
    assert imported.dtype == np.float32
    assert (imported.device_type, imported.device_id) == (_dlpack.DLDeviceType.kDLCPU, 0)
    assert not imported.read_only
    with pytest.raises(ValueError, match="already consumed"):
        _dlpack.consume_capsule(capsule)
    del x, capsule
    gc.collect()
    assert watch() is not None  # numpy's managed tensor still holds it
    imported.release()
    imported.release()  # idempotent
    gc.collect()
    assert watch() is None


def test_consume_read_only_numpy_capsule():
    x = np.arange(4.0)
    x.flags.writeable = False
    imported = _dlpack.consume_capsule(x.__dlpack__(max_version=(1, 0)))
    assert imported.read_only
    imported.release()


class _Producer:
    """A host DLPack producer built on gpurt's export path."""

    def __init__(self, x: np.ndarray, keep: object) -> None:
        self.x, self.keep = x, keep

    def __dlpack_device__(self):
        return (_dlpack.DLDeviceType.kDLCPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        versioned = max_version is not None and max_version[0] >= 1
        return _dlpack.export_capsule(self.x.ctypes.data, self.x.shape, self.x.strides,
                                      self.x.dtype, (1, 0), self.keep, versioned)


class _Keep:
    pass


def test_export_consumed_by_numpy():
    before = _dlpack.live_exports()
    base = np.arange(60, dtype=np.int64).reshape(5, 12)
    x = base[1:, ::3]
    keep = _Keep()
    watch = weakref.ref(keep)
    y = np.from_dlpack(_Producer(x, keep))
    assert y.ctypes.data == x.ctypes.data and y.strides == x.strides
    np.testing.assert_array_equal(y, x)
    del keep
    gc.collect()
    assert watch() is not None and _dlpack.live_exports() == before + 1
    del y
    gc.collect()
    assert watch() is None and _dlpack.live_exports() == before


@pytest.mark.parametrize("versioned", [False, True])
def test_unconsumed_capsule_frees_export(versioned):
    before = _dlpack.live_exports()
    keep = _Keep()
    watch = weakref.ref(keep)
    x = np.zeros(3)
    capsule = _Producer(x, keep).__dlpack__(max_version=(1, 0) if versioned else None)
    del keep
    assert watch() is not None and _dlpack.live_exports() == before + 1
    del capsule
    assert watch() is None and _dlpack.live_exports() == before


def test_capsule_destructor_keeps_pending_exception():
    def raise_with_capsule():
        capsule = _Producer(np.zeros(2), _Keep()).__dlpack__()
        assert capsule is not None
        raise KeyError("original")

    before = _dlpack.live_exports()
    with pytest.raises(KeyError, match="original"):
        raise_with_capsule()
    assert _dlpack.live_exports() == before


@pytest.mark.parametrize("versioned", [False, True])
def test_consume_own_export(versioned):
    x = np.arange(12, dtype=np.complex64).reshape(3, 4).T
    keep = _Keep()
    watch = weakref.ref(keep)
    capsule = _Producer(x, keep).__dlpack__(max_version=(1, 0) if versioned else None)
    del keep
    imported = _dlpack.consume_capsule(capsule)
    assert (imported.data, imported.shape, imported.strides) == (x.ctypes.data, x.shape, x.strides)
    assert imported.dtype == np.complex64
    del capsule
    assert watch() is not None  # consumed: the capsule's death no longer frees it
    imported.release()
    assert watch() is None


def test_rejected_capsule_is_not_consumed():
    before = _dlpack.live_exports()
    capsule = _Producer(np.zeros(3), _Keep()).__dlpack__(max_version=(1, 0))
    address = _dlpack._capsule_get_pointer(id(capsule), _dlpack.NAME_VERSIONED)
    assert address in _dlpack._exports
    managed = _dlpack.DLManagedTensorVersioned.from_address(address)
    assert (managed.version.major, managed.dl_tensor.ndim) == (1, 1)
    managed.version.major = 2
    with pytest.raises(BufferError, match="DLPack 2.0"):
        _dlpack.consume_capsule(capsule)
    del capsule  # still named "dltensor_versioned": its destructor frees the export
    assert _dlpack.live_exports() == before


def test_capsule_type_errors():
    with pytest.raises(TypeError, match="capsule"):
        _dlpack.consume_capsule(object())
    with pytest.raises(TypeError, match="not a DLPack"):
        _dlpack.consume_capsule(_foreign_capsule())


def _foreign_capsule():
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi))
    return new(8, b"something_else", None)


def test_export_rejects_odd_strides():
    with pytest.raises(BufferError, match="multiple of the item size"):
        _dlpack.export_capsule(8, (2,), (6,), np.dtype(np.float32), (1, 0), None, False)


def test_export_fields_as_the_structs_read_them():
    keep = _Keep()
    for versioned, copied in [(False, False), (True, False), (True, True)]:
        capsule = _dlpack.export_capsule(0x1000, (3, 5), (40, 8), np.dtype(np.float64),
                                         (2, 1), keep, versioned, copied)
        name = _dlpack.NAME_VERSIONED if versioned else _dlpack.NAME
        address = _dlpack._capsule_get_pointer(id(capsule), name)
        kind = _dlpack.DLManagedTensorVersioned if versioned else _dlpack.DLManagedTensor
        managed = kind.from_address(address)
        tensor = managed.dl_tensor
        assert tensor.data == 0x1000 and tensor.byte_offset == 0
        assert (tensor.device.device_type, tensor.device.device_id) == (2, 1)
        assert (tensor.ndim, tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes) == (
            2, 2, 64, 1)
        assert [tensor.shape[i] for i in range(2)] == [3, 5]
        assert [tensor.strides[i] for i in range(2)] == [5, 1]
        assert managed.deleter == _dlpack._DELETER_ADDRESS
        if versioned:
            assert (managed.version.major, managed.version.minor) == _dlpack.VERSION
            assert managed.flags == (_dlpack.FLAG_IS_COPIED if copied else 0)
    scalar = _dlpack.consume_capsule(_dlpack.export_capsule(
        0x2000, (), (), np.dtype(np.int8), (2, 0), keep, True))
    assert (scalar.data, scalar.shape, scalar.strides, scalar.dtype) == (0x2000, (), (), np.int8)
    scalar.release()


def test_host_address_is_the_data_pointer():
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    read_only = np.arange(4.0)
    read_only.flags.writeable = False
    for host in [base, base[2:], base[1:, 3:], base[::-1], np.ones(3, ml_dtypes.bfloat16),
                 np.zeros(0), np.array(2.0), read_only, np.ones(5).view(np.int8)]:
        assert garray._copy.host_address(host) == host.ctypes.data


# ======================================================================================
# CPU: no driver here
# ======================================================================================

NO_GPU = not gpurt.is_available()
needs_streams = pytest.mark.skipif(not hasattr(streams, "current_stream"),
                                   reason="gpurt.streams is not written yet")


@pytest.mark.skipif(not NO_GPU, reason="checks the behaviour without a driver")
@needs_streams
def test_factories_without_driver():
    for make in (lambda: gpurt.empty(4), lambda: gpurt.zeros((2, 2)),
                 lambda: gpurt.full(3, 1.0), lambda: gpurt.asarray(np.ones(3)),
                 lambda: gpurt.from_numpy(np.ones(2))):
        with pytest.raises(gpurt.CudaUnavailableError, match="driver"):
            make()


def test_errors_that_need_no_driver():
    with pytest.raises(TypeError, match="not built directly"):
        gpurt.Array()
    with pytest.raises(TypeError, match="CUDA device array.*kDLCPU"):
        gpurt.from_dlpack(np.ones(3))
    with pytest.raises(TypeError, match="DLPack"):
        gpurt.from_dlpack([1, 2])
    with pytest.raises(ValueError, match="host data"):
        gpurt.asarray(np.ones(3), copy=False)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        gpurt.from_numpy([1.0])
    with pytest.raises(TypeError, match="unsupported dtype"):
        gpurt.empty(3, dtype=object)


# ======================================================================================
# CPU: Array metadata, views and lifetimes over a fake allocator and stream
# ======================================================================================


class FakeStream:
    def __init__(self, handle: int = 0, device_index: int = 0) -> None:
        self.cuda_stream = handle
        self.device_index = device_index


class DirectEntry:
    """What memory.allocator_for returns, over a fake's ``alloc``/``delete`` (looked up at
    each call, so a test may replace them)."""

    def allocator_for(self, index):
        return types.SimpleNamespace(
            malloc=lambda size, stream: self.alloc(size, index, stream),
            free=lambda ptr: self.delete(ptr))


def use_allocator(monkeypatch, fake):
    """Route gpurt.array's allocations (and the public functions) to ``fake``."""
    monkeypatch.setattr(memory, "allocator_for", fake.allocator_for)
    monkeypatch.setattr(_ownership, "_allocators", {})
    monkeypatch.setattr(memory, "caching_allocator_alloc", fake.alloc, raising=False)
    monkeypatch.setattr(memory, "caching_allocator_delete", fake.delete, raising=False)


class FakeAllocator(DirectEntry):
    bases = iter(range(1 << 32, 1 << 48, 1 << 32))  # disjoint per test: stale frees miss

    def __init__(self) -> None:
        self.next = next(self.bases)
        self.live: dict[int, int] = {}
        self.freed: list[int] = []
        self.calls: list[tuple] = []

    def alloc(self, size, device=None, stream=None):
        self.calls.append((size, device, stream))
        ptr = self.next
        self.next += (size + 511) // 512 * 512
        self.live[ptr] = size
        return ptr

    def delete(self, ptr):
        del self.live[ptr]
        self.freed.append(ptr)


@pytest.fixture
def fake_gpu(fake_gpus, monkeypatch):
    """Arrays without a driver: a pretend initialised CUDA (tests/_fakes.py), a fake
    current stream, allocator and device 0 (only code paths that make no driver call may
    be exercised)."""
    allocator = FakeAllocator()
    stream = FakeStream()
    monkeypatch.setattr(streams, "current_stream", lambda device=None: stream, raising=False)
    monkeypatch.setattr(streams, "default_stream", lambda device=None: stream, raising=False)
    use_allocator(monkeypatch, allocator)
    device = object.__new__(Device)
    device.index = 0
    monkeypatch.setitem(_ownership._devices, 0, device)
    allocator.stream = stream
    return allocator


def test_empty_metadata(fake_gpu):
    a = gpurt.empty((3, 4), gpurt.float16)
    assert a.shape == (3, 4) and a.strides == (8, 2) and a.dtype == np.float16
    assert (a.ndim, a.size, a.itemsize, a.nbytes) == (2, 12, 2, 24)
    assert a.ptr == a.data_ptr() and a.ptr % 512 == 0 and a.is_contiguous()
    assert a.device.index == 0 and a.stream is fake_gpu.stream
    assert fake_gpu.calls == [(24, 0, 0)]  # size, device, stream handle
    assert len(a) == 3
    assert "shape=(3, 4)" in repr(a) and "float16" in repr(a) and "cuda:0" in repr(a)
    for shape, expected in [(5, (5,)), ((), ()), ([2, 3], (2, 3)), ((2, 3, 4), (2, 3, 4)),
                            (np.int64(7), (7,))]:
        b = gpurt.empty(shape)
        assert b.shape == expected and b.strides == np.empty(expected, np.float32).strides
    with pytest.raises(ValueError, match="negative"):
        gpurt.empty((2, -3))
    with pytest.raises(TypeError, match="0-d"):
        len(gpurt.empty(()))


@pytest.fixture
def fake_streams(fake_driver, monkeypatch):
    """Real gpurt Streams over the fake two-GPU driver of tests/_fakes.py, a fake
    allocator, and an empty cache of devices in gpurt._array.ownership."""
    allocator = FakeAllocator()
    use_allocator(monkeypatch, allocator)
    monkeypatch.setattr(_ownership, "_devices", {})
    return allocator


def test_new_arrays_take_the_current_stream(fake_streams):
    default = gpurt.default_stream()
    a = gpurt.empty(4)
    assert a.stream == default and a.device.index == 0
    assert fake_streams.calls[-1] == (16, 0, 0)
    with gpurt.Stream() as s:
        for spelling in ({}, {"device": "cuda"}, {"device": 0}, {"device": "cuda:0"},
                         {"device": gpurt.Device(0)}):
            b = gpurt.empty(4, **spelling)
            assert b.stream is s and b.device.index == 0, spelling
            assert fake_streams.calls[-1] == (16, 0, s.cuda_stream)
        c = gpurt.empty(4, device=1)  # another device: its own current stream, the default
        assert c.device.index == 1 and c.stream == gpurt.default_stream(1)
        assert fake_streams.calls[-1] == (16, 1, 0)
    assert gpurt.empty(4).stream == default  # the default stream again after the block
    gpurt.set_stream(default)  # chosen explicitly: the same stream
    assert gpurt.empty(4).stream == default
    s1 = gpurt.Stream(device=1)
    d = gpurt.empty(4, stream=s1)
    assert d.device.index == 1 and d.stream is s1
    assert fake_streams.calls[-1] == (16, 1, s1.cuda_stream)
    with pytest.raises(ValueError, match="belongs to cuda:1"):
        gpurt.empty(4, device=0, stream=s1)
    with gpurt.device(1), gpurt.Stream() as s2:
        e = gpurt.empty(4)
        assert e.device.index == 1 and e.stream is s2
        assert gpurt.empty(4, device=0).stream == default


def test_new_arrays_take_each_threads_stream(fake_streams):
    main = gpurt.Stream()
    seen = {}

    def worker() -> None:
        with gpurt.Stream() as mine:
            seen["worker"] = (gpurt.empty(2).stream is mine, mine)

    with main:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert gpurt.empty(2).stream is main
    assert seen["worker"][0] and seen["worker"][1] is not main


def test_new_arrays_reuse_the_threads_place_until_it_changes(fake_streams):
    """gpurt.empty finds the current device, its current stream and allocator in one
    per-thread record (gpurt/_array/ownership.py's place), made once and dropped on a change."""
    a = gpurt.empty(4)
    place = state.current_place()
    assert place[:4] == (0, 0, a.stream, a.device)
    for spelling in ({}, {"device": "cuda"}, {"device": 0}):
        assert gpurt.empty(4, **spelling).stream is a.stream
        assert state.current_place() is place, spelling  # the same record
    assert gpurt.empty(4, device=1).device.index == 1  # another device's place is not kept
    assert state.current_place() is place
    with gpurt.Stream() as s:
        assert state.current_place() is None
        assert gpurt.empty(4).stream is s and state.current_place()[2] is s
    assert gpurt.empty(4).stream is a.stream
    with gpurt.device(1):
        assert gpurt.empty(4).device.index == 1 and state.current_place()[0] == 1
    assert in_thread(state.current_place) is None  # other threads make their own
    assert in_thread(lambda: gpurt.empty(4).stream) is a.stream


def test_a_forked_child_gets_the_fork_error_from_empty(fake_gpu):
    """The parent's place (and cached allocator entries) do not reach a forked child: its
    first array raises the clear fork error."""
    gpurt.empty(4)
    assert state.current_place() is not None

    def child() -> str:
        return describe(lambda: gpurt.empty(4))

    assert FORK_MESSAGE in run_in_fork(child)
    assert gpurt.empty(4).ptr  # the parent is untouched


def test_empty_zero_size_allocates_nothing(fake_gpu):
    a = gpurt.empty((0, 5))
    assert a.ptr == 0 and a.size == 0 and fake_gpu.calls == []
    del a
    assert fake_gpu.freed == []


def test_free_on_last_reference(fake_gpu):
    registered = len(garray._finalizers)
    a = gpurt.empty(100)
    ptr = a.ptr
    assert len(garray._finalizers) == registered + 1
    del a
    assert fake_gpu.freed == [ptr] and not fake_gpu.live
    assert len(garray._finalizers) == registered  # the finalizer went with the array


def test_views_keep_memory_alive(fake_gpu):
    a = gpurt.empty((4, 6), gpurt.int32)
    ptr = a.ptr
    b = a[1:, ::2]
    c = b.T[0]
    d = a.reshape(24).view(gpurt.float32)
    del a, b
    gc.collect()
    assert fake_gpu.freed == []
    assert c.ptr == ptr + 24 and d.ptr == ptr
    del c
    assert fake_gpu.freed == []
    del d
    assert fake_gpu.freed == [ptr]


def test_cycles_are_collected(fake_gpu):
    a = gpurt.empty(10)
    ptr = a.ptr
    cycle: list = [a[2:]]
    cycle.append(cycle)
    del a, cycle
    gc.collect()
    assert fake_gpu.freed == [ptr]


def test_finalizer_never_raises(fake_gpu, monkeypatch):
    def broken(ptr):
        raise RuntimeError("allocator exploded")

    monkeypatch.setattr(fake_gpu, "delete", broken)
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    a = gpurt.empty(10)
    del a
    gc.collect()
    assert seen == []
    assert not garray._finalizers or all(r() is not None for r in garray._finalizers)


def test_views_match_numpy(fake_gpu):
    a = gpurt.empty((4, 5, 6), gpurt.float64)
    host = np.empty((4, 5, 6), np.float64)
    for key in [1, -1, slice(1, 3), slice(-2, None), slice(3, 1), slice(None), slice(0, 4, 2),
                (slice(None), 2), (Ellipsis, 3), (1, slice(None, None, -2), None),
                (slice(1, 3), slice(None), slice(5, 0, -3)), (None, Ellipsis, 0)]:
        view, expected = a[key], host[key]
        assert view.shape == expected.shape and view.strides == expected.strides
        assert view.ptr - a.ptr == _np_view_layout(host, expected)[0]
        assert view.is_contiguous() == expected.flags.c_contiguous
    t = a.transpose(2, 0, 1)
    assert t.shape == (6, 4, 5) and t.strides == host.transpose(2, 0, 1).strides
    assert a.T.strides == host.T.strides and not a.T.is_contiguous()
    assert [v.ptr for v in a] == [a.ptr + i * 240 for i in range(4)]
    with pytest.raises(TypeError, match="basic indexing"):
        a[[0, 1]]
    with pytest.raises(IndexError, match="out of bounds"):
        a[4]
    row = a[:, :, 1:3][2]  # the short paths only serve contiguous arrays
    assert row.strides == host[:, :, 1:3][2].strides and not row.is_contiguous()


def test_reshape_and_view(fake_gpu):
    a = gpurt.empty((4, 6), gpurt.float32)
    r = a.reshape(2, -1)
    assert r.shape == (2, 12) and r.ptr == a.ptr and r.is_contiguous()
    assert a.view(3, 8).shape == (3, 8)
    assert a.view((24,)).shape == (24,)
    with pytest.raises(ValueError, match="contiguous"):
        a.T.view(24)
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5, 5)
    as_int = a.view(gpurt.int32)
    assert as_int.dtype == np.int32 and as_int.shape == (4, 6) and as_int.ptr == a.ptr
    halves = a.view(gpurt.bfloat16)
    assert halves.shape == (4, 12) and halves.strides == (24, 2)
    assert a.view("complex64").shape == (4, 3)
    with pytest.raises(ValueError, match="cannot view"):
        a[:, :5].view(gpurt.float64)
    assert a.contiguous() is a


def test_cuda_array_interface_export(fake_gpu):
    a = gpurt.empty((3, 4), gpurt.bfloat16)
    cai = a.__cuda_array_interface__
    assert cai == {"shape": (3, 4), "typestr": "<V2", "data": (a.ptr, False), "strides": None,
                   "version": 3, "stream": 1}
    fake_gpu.stream.cuda_stream = 0xBEEF
    view = a[:, 1:3]
    cai = view.__cuda_array_interface__
    assert cai["strides"] == (8, 2) and cai["data"][0] == a.ptr + 2 and cai["stream"] == 0xBEEF


def test_cuda_array_interface_import_checks(fake_gpu):
    class Masked:
        __cuda_array_interface__ = {"shape": (0,), "typestr": "<f4", "data": (0, False),
                                    "version": 3, "mask": object()}

    class StreamZero:
        __cuda_array_interface__ = {"shape": (0,), "typestr": "<f4", "data": (0, False),
                                    "version": 3, "stream": 0}

    class Empty:
        __cuda_array_interface__ = {"shape": (0, 3), "typestr": "<i8", "data": (0, False),
                                    "version": 2}

    with pytest.raises(ValueError, match="mask"):
        gpurt.asarray(Masked())
    with pytest.raises(ValueError, match="stream 0"):
        gpurt.asarray(StreamZero())
    producer = Empty()
    view = gpurt.asarray(producer)
    assert view.shape == (0, 3) and view.dtype == np.int64 and view._owner is producer


@pytest.mark.parametrize("versioned", [False, True])
def test_dlpack_export_keeps_array_alive(fake_gpu, versioned):
    a = gpurt.empty((2, 3), gpurt.complex128)
    ptr = a.ptr
    assert a.__dlpack_device__() == (2, 0)
    capsule = a[:, 1:].__dlpack__(stream=-1, max_version=(1, 0) if versioned else None)
    del a
    gc.collect()
    assert fake_gpu.freed == []
    imported = _dlpack.consume_capsule(capsule)
    assert (imported.device_type, imported.device_id) == (2, 0)
    assert (imported.data, imported.shape, imported.strides) == (ptr + 16, (2, 2), (48, 16))
    assert imported.dtype == np.complex128
    del capsule
    assert fake_gpu.freed == []
    imported.release()
    gc.collect()
    assert fake_gpu.freed == [ptr]


def test_unconsumed_dlpack_export_frees(fake_gpu):
    a = gpurt.empty(8)
    ptr = a.ptr
    capsule = a.__dlpack__(stream=-1)
    del a
    assert fake_gpu.freed == []
    del capsule
    gc.collect()
    assert fake_gpu.freed == [ptr]


def test_dlpack_export_errors(fake_gpu):
    a = gpurt.empty(4)
    with pytest.raises(BufferError, match="kDLCPU"):
        a.__dlpack__(stream=-1, dl_device=(1, 0))
    with pytest.raises(ValueError, match="stream 0"):
        a.__dlpack__(stream=0)
    with pytest.raises(TypeError, match="stream"):
        a.__dlpack__(stream="1")
    assert a.__dlpack__(stream=-1, dl_device=(2, 0)) is not None


def test_from_dlpack_of_own_capsule(fake_gpu):
    a = gpurt.empty((5, 2), gpurt.uint16)
    ptr = a.ptr
    b = gpurt.from_dlpack(a.__dlpack__(stream=-1, max_version=(1, 0)))
    assert (b.ptr, b.shape, b.strides, b.dtype) == (ptr, (5, 2), (4, 2), np.uint16)
    del a
    assert fake_gpu.freed == []
    c = b[1:]
    del b
    assert fake_gpu.freed == []
    del c
    gc.collect()
    assert fake_gpu.freed == [ptr]


def test_array_refuses_implicit_host_conversion(fake_gpu):
    a = gpurt.empty(3)
    with pytest.raises(TypeError, match=r"\.numpy\(\)"):
        np.asarray(a)
    with pytest.raises(TypeError, match="pickle"):
        pickle.dumps(a)


def test_copy_argument_checks(fake_gpu):
    a = gpurt.empty((2, 3), gpurt.float32)
    with pytest.raises(TypeError, match="dtype mismatch"):
        a.copy_(np.zeros((2, 3), np.float64))
    with pytest.raises(ValueError, match="shape mismatch"):
        a.copy_(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="shape mismatch"):
        a.copy_([1.0, 2.0])
    with pytest.raises(TypeError, match="dtype mismatch"):
        a.to_numpy(out=np.empty((2, 3), np.int32))
    with pytest.raises(TypeError, match="dtype mismatch"):
        a.copy_(gpurt.empty((2, 3), gpurt.float16))
    with pytest.raises(ValueError, match="shape mismatch"):
        a.copy_(gpurt.empty((6,), gpurt.float32))
    with pytest.raises(TypeError, match="not convert dtypes"):
        gpurt.asarray(a, dtype=gpurt.float64)
    assert gpurt.asarray(a) is a


# ---- copies over host memory: a fake driver that really moves the bytes -------------


class HostMemoryDriver(DirectEntry):
    """The driver calls gpurt/_array/copies.py makes, over host memory: "device" blocks are host
    buffers, so copies and fills can be checked by value; every call is recorded."""

    OK = (cu.CUresult.CUDA_SUCCESS,)
    CUmemorytype = cu.CUmemorytype
    CUDA_MEMCPY2D = cu.CUDA_MEMCPY2D
    CUresult = cu.CUresult

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.buffers: dict[int, np.ndarray] = {}

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]

    # -- the allocator's side --
    def alloc(self, size, device=None, stream=None):
        buffer = np.empty(size, np.uint8)
        buffer[...] = 0x5A
        self.buffers[buffer.ctypes.data] = buffer
        return buffer.ctypes.data

    def delete(self, ptr):
        del self.buffers[ptr]

    # -- the driver's --
    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        self.calls.append(("cuMemcpyHtoDAsync", dst, src, nbytes, stream))
        ctypes.memmove(dst, src, nbytes)
        return self.OK

    def cuMemcpyDtoH(self, dst, src, nbytes):
        self.calls.append(("cuMemcpyDtoH", dst, src, nbytes))
        ctypes.memmove(dst, src, nbytes)
        return self.OK

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        self.calls.append(("cuMemcpyDtoHAsync", dst, src, nbytes, stream))
        ctypes.memmove(dst, src, nbytes)
        return self.OK

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        self.calls.append(("cuMemcpyDtoDAsync", dst, src, nbytes, stream))
        ctypes.memmove(dst, src, nbytes)
        return self.OK

    def cuMemcpy2DAsync(self, params, stream):
        self.calls.append(("cuMemcpy2DAsync", stream))
        host = cu.CUmemorytype.CU_MEMORYTYPE_HOST
        src = params.srcHost if params.srcMemoryType == host else int(params.srcDevice)
        dst = params.dstHost if params.dstMemoryType == host else int(params.dstDevice)
        for row in range(params.Height):
            ctypes.memmove(dst + row * params.dstPitch, src + row * params.srcPitch,
                           params.WidthInBytes)
        return self.OK

    def cuMemsetD8Async(self, ptr, value, count, stream):
        self.calls.append(("cuMemsetD8Async", ptr, value, count, stream))
        ctypes.memset(ptr, value, count)
        return self.OK

    def _words(self, ptr, count, dtype):
        return np.ctypeslib.as_array((ctypes.c_char * (count * np.dtype(dtype).itemsize))
                                     .from_address(ptr)).view(dtype)

    def cuMemsetD16Async(self, ptr, value, count, stream):
        self.calls.append(("cuMemsetD16Async", ptr, value, count, stream))
        self._words(ptr, count, np.uint16)[...] = value
        return self.OK

    def cuMemsetD32Async(self, ptr, value, count, stream):
        self.calls.append(("cuMemsetD32Async", ptr, value, count, stream))
        self._words(ptr, count, np.uint32)[...] = value
        return self.OK

    def cuMemsetD2D32Async(self, ptr, pitch, value, width, height, stream):
        self.calls.append(("cuMemsetD2D32Async", stream))
        for row in range(height):
            self._words(ptr + row * pitch, width, np.uint32)[...] = value
        return self.OK

    def cuStreamSynchronize(self, stream):
        self.calls.append(("cuStreamSynchronize", stream))
        return self.OK

    def cuEventCreate(self, flags):
        self.calls.append(("cuEventCreate",))
        return (cu.CUresult.CUDA_SUCCESS, object())

    def cuEventRecord(self, event, stream):
        self.calls.append(("cuEventRecord", event, stream))
        return self.OK

    def cuStreamWaitEvent(self, stream, event, flags):
        self.calls.append(("cuStreamWaitEvent", stream, event))
        return self.OK


@pytest.fixture
def host_gpu(fake_gpu, monkeypatch):
    """fake_gpu whose "device" memory is host memory, moved by :class:`HostMemoryDriver`."""
    driver = HostMemoryDriver()
    use_allocator(monkeypatch, driver)
    monkeypatch.setattr(garray._copy, "cu", driver)
    monkeypatch.setattr(garray._copy, "_idle_events", {})
    monkeypatch.setattr(garray, "bind_context", lambda index: None)
    monkeypatch.setattr(_arraycopy, "bind_context", lambda index: None)
    driver.stream = fake_gpu.stream
    return driver


def test_contiguous_copies_are_one_driver_call(host_gpu):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    a = gpurt.empty((8, 16), gpurt.float32)
    host_gpu.calls.clear()
    a.copy_(x)
    assert host_gpu.calls == [("cuMemcpyHtoDAsync", a.ptr, x.ctypes.data, x.nbytes, 0),
                              ("cuStreamSynchronize", 0)]
    out = np.full_like(x, np.nan)
    host_gpu.calls.clear()
    assert a.to_numpy(out=out) is out  # the default stream: one synchronous copy
    assert host_gpu.calls == [("cuMemcpyDtoH", out.ctypes.data, a.ptr, x.nbytes)]
    np.testing.assert_array_equal(out, x)
    other = FakeStream(0xBEE)
    c = gpurt.empty((8, 16), gpurt.float32, stream=other).copy_(x)
    host_gpu.calls.clear()
    out[...] = np.nan
    c.to_numpy(out=out)  # another stream: an asynchronous copy, then that stream waited for
    assert host_gpu.calls == [("cuMemcpyDtoHAsync", out.ctypes.data, c.ptr, x.nbytes, 0xBEE),
                              ("cuStreamSynchronize", 0xBEE)]
    np.testing.assert_array_equal(out, x)
    host_gpu.calls.clear()
    a.to_numpy(out=out, non_blocking=True)
    assert host_gpu.names() == ["cuMemcpyDtoHAsync"]
    host_gpu.calls.clear()
    a.copy_(x[::-1].copy(), non_blocking=True)  # no synchronisation asked for
    assert host_gpu.names() == ["cuMemcpyHtoDAsync"]
    b = gpurt.empty((8, 16), gpurt.float32)
    host_gpu.calls.clear()
    b.copy_(a)  # same stream: no event, no synchronisation
    assert host_gpu.calls == [("cuMemcpyDtoDAsync", b.ptr, a.ptr, x.nbytes, 0)]
    np.testing.assert_array_equal(b.numpy(), x[::-1])


def test_copies_by_value_over_host_memory(host_gpu):
    rng = np.random.default_rng(8)
    x = rng.integers(-1000, 1000, (6, 7, 5)).astype(np.int32)
    a = gpurt.from_numpy(x)
    np.testing.assert_array_equal(a.numpy(), x)
    a[1:, ::2, 1:4] = x[:5, :4, :3] * 3  # strided device destination, host source
    expected = x.copy()
    expected[1:, ::2, 1:4] = x[:5, :4, :3] * 3
    np.testing.assert_array_equal(a.numpy(), expected)
    read_only = x[::-1].copy()
    read_only.flags.writeable = False
    b = gpurt.empty_like(a).copy_(read_only)
    np.testing.assert_array_equal(b.numpy(), x[::-1])
    out = np.zeros((7, 6, 5), np.int32)  # a non-contiguous out gets a temporary first
    a.transpose(1, 0, 2).to_numpy(out=out)
    np.testing.assert_array_equal(out, expected.transpose(1, 0, 2))
    b[2].copy_(a[3])  # device to device, contiguous
    b[:, 1].copy_(a[:, 2, ::-1])  # device to device, strided both sides
    mirror = x[::-1].copy()
    mirror[2] = expected[3]
    mirror[:, 1] = expected[:, 2, ::-1]
    np.testing.assert_array_equal(b.numpy(), mirror)
    for value, dtype in [(7, np.int8), (-3, np.int16), (2.5, np.float32), (1 + 2j, np.complex128),
                         (np.pi, np.float64)]:
        np.testing.assert_array_equal(gpurt.full((3, 4), value, dtype).numpy(),
                                      np.full((3, 4), value, dtype))
    np.testing.assert_array_equal(gpurt.zeros(9, gpurt.uint8).numpy(), np.zeros(9, np.uint8))


def test_cross_stream_copies_reuse_one_event(host_gpu):
    other = FakeStream(0xCAFE)
    src = gpurt.from_numpy(np.arange(32, dtype=np.float64))
    dst = gpurt.empty(32, gpurt.float64, stream=other)
    host_gpu.calls.clear()
    dst.copy_(src)
    dst.copy_(src)
    names = host_gpu.names()
    assert names.count("cuEventCreate") == 1  # the second copy reuses the idle event
    assert names == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuMemcpyDtoDAsync",
                     "cuEventRecord", "cuStreamWaitEvent", "cuMemcpyDtoDAsync"]
    record, wait = host_gpu.calls[1], host_gpu.calls[2]
    assert record[2] == 0 and wait[1] == 0xCAFE and record[1] is wait[2]
    np.testing.assert_array_equal(dst.numpy(), np.arange(32, dtype=np.float64))


# ======================================================================================
# GPU
# ======================================================================================

gpu = pytest.mark.gpu
RNG_SEED = 1234


def _random(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Fresh non-zero random data of any supported dtype (float64 reference first)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        low, high = max(info.min, -1000), min(info.max, 1000)
        return rng.integers(low, high, shape, endpoint=True).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return (rng.standard_normal(shape) * 10).astype(dt)


def _poison(shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = 0xA5
    return out


def _equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes() or np.array_equal(a, b)


@pytest.fixture
def rng():
    return np.random.default_rng(RNG_SEED)


@pytest.fixture
def pinned():
    """Factory of page-locked numpy arrays (cuMemHostAlloc), freed after the test."""
    from cuda.bindings import driver as cu

    bind_context(gpurt.current_device())
    buffers = []

    def make(shape, dtype):
        dt = np.dtype(dtype)
        nbytes = max(int(np.prod(shape)) * dt.itemsize, 1)
        ptr = gpurt.check(cu.cuMemHostAlloc(nbytes, 0))
        buffers.append(ptr)
        raw = (ctypes.c_uint8 * nbytes).from_address(int(ptr))
        count = int(np.prod(shape)) * dt.itemsize
        return np.frombuffer(raw, np.uint8, count).view(dt).reshape(shape)

    yield make
    gc.collect()
    for ptr in buffers:
        gpurt.check(cu.cuMemFreeHost(ptr))


class HeldStream:
    """A gpurt Stream that ``hold()`` blocks with cuStreamWaitValue32 on a pinned flag
    until ``release()``. Allocate everything before holding: nothing that might
    synchronize may run while a stream is held."""

    def __init__(self, pinned) -> None:
        self.stream = gpurt.Stream()
        self.flag = pinned((1,), np.uint32)
        self.flag[0] = 0

    def hold(self) -> None:
        from cuda.bindings import driver as cu

        geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        res = cu.cuStreamWaitValue32(self.stream.cuda_stream, self.flag.ctypes.data, 1, geq)
        if int(res[0]) != 0:
            pytest.skip(f"cuStreamWaitValue32 unavailable here: {res[0]!r}")

    def release(self) -> None:
        self.flag[0] = 1

    def __enter__(self) -> HeldStream:
        self.hold()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        self.stream.synchronize()


def _not_done(stream_handle: int) -> bool:
    from cuda.bindings import driver as cu

    time.sleep(0.05)
    res = cu.cuStreamQuery(stream_handle)
    return int(res[0]) == int(cu.CUresult.CUDA_ERROR_NOT_READY)


@gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_gpu_round_trip_every_dtype(gpu_state, rng, dtype):
    x = _random(rng, (37, 19), dtype)
    a = gpurt.from_numpy(x)
    assert a.dtype == x.dtype and a.shape == x.shape
    out = _poison(x.shape, x.dtype)
    assert a.to_numpy(out=out) is out
    _equal(out, x)
    _equal(gpurt.asarray(x).numpy(), x)


@gpu
def test_gpu_factories(gpu_state, rng):
    z = gpurt.empty((1000,), gpurt.float32)
    z.copy_(_random(rng, 1000, np.float32))  # dirty memory that zeros() may reuse
    del z
    _equal(gpurt.zeros((10, 100)).numpy(), np.zeros((10, 100), np.float32))
    for value, dtype in [(3.5, np.float32), (-2, np.int8), (1234, np.int16), (np.pi, np.float64),
                         (1 + 2j, np.complex64), (-0.5 - 3j, np.complex128), (2**40 + 3, np.int64),
                         (True, np.bool_), (1.25, ml_dtypes.bfloat16), (0.1, np.float16),
                         (2**63 + 5, np.uint64)]:
        got = gpurt.full((7, 33), value, dtype=dtype).numpy()
        _equal(got, np.full((7, 33), value, dtype=dtype))
    assert gpurt.full(3, 2.0).dtype == np.float32 and gpurt.full(3, 2).dtype == np.int64
    x = _random(rng, (4, 5), np.float16)
    like = gpurt.empty_like(x)
    assert like.shape == (4, 5) and like.dtype == np.float16
    _equal(gpurt.zeros_like(like).numpy(), np.zeros((4, 5), np.float16))
    _equal(gpurt.full_like(like, 7).numpy(), np.full((4, 5), 7, np.float16))
    assert gpurt.empty(0).numpy().shape == (0,)


@gpu
def test_gpu_slicing_views(gpu_state, rng):
    x = _random(rng, (6, 7, 8), np.float64)
    a = gpurt.from_numpy(x)
    for key in [2, -1, (slice(None), 3), (Ellipsis, slice(1, None, 3)), (slice(None, None, -1),),
                (1, slice(6, 0, -2), slice(None, None, 3)), (None, 0, Ellipsis, -1),
                (slice(2, 5), slice(None), 4)]:
        out = _poison(x[key].shape, x.dtype)
        _equal(a[key].to_numpy(out=out), x[key])
    _equal(a.transpose(1, 2, 0).numpy(), x.transpose(1, 2, 0))
    _equal(a.T.reshape(-1).numpy(), x.T.reshape(-1))  # reshape of a transposed view copies
    _equal(a[2, 3, 4:5].item() * np.ones(1), np.array([x[2, 3, 4]]))
    bits = gpurt.from_numpy(x.astype(np.float32)).view(gpurt.int32).numpy()
    _equal(bits, x.astype(np.float32).view(np.int32))


@gpu
def test_gpu_strided_writes(gpu_state, rng):
    x = _random(rng, (5, 9, 4), np.float32)
    mirror = x.copy()
    a = gpurt.from_numpy(x)
    block = _random(rng, (5, 3, 4), np.float32)
    a[:, 2:5] = block
    mirror[:, 2:5] = block
    a[1, ::2, ::-1] = 3.0
    mirror[1, ::2, ::-1] = 3.0
    other = _random(rng, (4, 5), np.float32)
    a[:, 6, :] = gpurt.from_numpy(other).T  # device -> device, strided both sides
    mirror[:, 6, :] = other.T
    a[2:, ::3, 1].fill_(-1.0)
    mirror[2:, ::3, 1] = -1.0
    _equal(a.numpy(), mirror)
    # device -> host into a non-contiguous out
    out = np.full((9, 10), 99.0, np.float32)
    a[0].to_numpy(out=out[:, ::-1][:, :4])
    expected = np.full((9, 10), 99.0, np.float32)
    expected[:, ::-1][:, :4] = mirror[0]
    _equal(out, expected)


@gpu
def test_gpu_overlapping_copy(gpu_state, rng):
    x = _random(rng, 1000, np.int32)
    a = gpurt.from_numpy(x)
    a[1:].copy_(a[:-1])
    y = x.copy()
    y[1:] = x[:-1]
    _equal(a.numpy(), y)


@gpu
def test_gpu_device_to_device(gpu_state, rng):
    x = _random(rng, (64, 48), np.complex128)
    a = gpurt.from_numpy(x)
    b = gpurt.empty_like(a)
    b.copy_(a)
    _equal(b.numpy(), x)
    c = a.clone()
    assert c.ptr != a.ptr
    _equal(c.numpy(), x)
    s = gpurt.Stream()
    d = gpurt.empty((64, 48), gpurt.complex128, stream=s)
    d.copy_(a)  # d's stream waits for a's
    s.synchronize()
    _equal(d.numpy(), x)


class CountingDriver:
    """Forwards to the real driver bindings, recording the names of the calls."""

    def __init__(self, real) -> None:
        self.real, self.names = real, []

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        if not name.startswith("cu"):
            return attr

        def call(*args):
            self.names.append(name)
            return attr(*args)

        return call


@gpu
def test_gpu_fast_paths(gpu_state, rng, monkeypatch):
    x = _random(rng, (128, 33), np.float32)
    s = gpurt.Stream()
    with s:
        a = gpurt.empty(x.shape, gpurt.float32)
        b = gpurt.empty(x.shape, "float32", device="cuda")
        assert a.stream is s and b.stream is s
    assert gpurt.empty(4).stream == gpurt.default_stream()
    driver = CountingDriver(garray._copy.cu)
    monkeypatch.setattr(garray._copy, "cu", driver)
    read_only = x.copy()
    read_only.flags.writeable = False
    a.copy_(read_only)  # one copy, then the stream is synchronized
    assert driver.names == ["cuMemcpyHtoDAsync", "cuStreamSynchronize"]
    driver.names.clear()
    b.copy_(a)  # same stream: a single device-to-device copy
    assert driver.names == ["cuMemcpyDtoDAsync"]
    c = gpurt.empty(x.shape, gpurt.float32)  # the default stream: ordered after s
    for _ in range(3):
        driver.names.clear()
        c.copy_(b)
        assert driver.names[-3:] == ["cuEventRecord", "cuStreamWaitEvent", "cuMemcpyDtoDAsync"]
        assert "cuEventDestroy" not in driver.names
    out = _poison(x.shape, x.dtype)
    driver.names.clear()
    c.to_numpy(out=out)  # the default stream: one synchronous copy
    assert driver.names == ["cuMemcpyDtoH"]
    _equal(out, x)
    out = _poison(x.shape, x.dtype)
    driver.names.clear()
    b.to_numpy(out=out)  # stream s: an asynchronous copy, then s is synchronized
    assert driver.names == ["cuMemcpyDtoHAsync", "cuStreamSynchronize"]
    _equal(out, x)


@gpu
def test_gpu_async_copies_from_pinned(gpu_state, rng, pinned):
    x = _random(rng, (256, 256), np.float32)
    src = pinned(x.shape, x.dtype)
    src[...] = x
    dst = pinned(x.shape, x.dtype)
    dst.view(np.uint8)[...] = 0xA5
    held = HeldStream(pinned)
    a = gpurt.empty(x.shape, gpurt.float32, stream=held.stream)
    with held:
        t0 = time.perf_counter()
        a.copy_(src, non_blocking=True)
        a.to_numpy(out=dst, non_blocking=True)
        assert time.perf_counter() - t0 < 1.0  # returned while the stream is held
        assert _not_done(held.stream.cuda_stream)
        assert dst.view(np.uint32)[0, 0] == 0xA5A5A5A5  # nothing copied yet
        held.release()
        held.stream.synchronize()
    _equal(dst.copy(), x)
    # synchronous by default: the data is there when copy_/to_numpy return
    b = gpurt.empty(x.shape, gpurt.float32)
    b.copy_(src)
    _equal(b.to_numpy(), x)


@gpu
def test_gpu_memory_returns_to_allocator(gpu_state, rng):
    gc.collect()
    start = gpurt.memory_allocated()
    a = gpurt.from_numpy(_random(rng, (1024, 1024), np.float32))
    assert gpurt.memory_allocated() >= start + a.nbytes
    view = a[::2]
    capsule = a.__dlpack__()
    del a
    gc.collect()
    assert gpurt.memory_allocated() > start
    del view, capsule
    gc.collect()
    assert gpurt.memory_allocated() == start


@gpu
def test_gpu_errors(gpu_state, rng, pinned):
    a = gpurt.zeros((4, 4))
    with pytest.raises(TypeError, match="dtype mismatch"):
        a.copy_(gpurt.zeros((4, 4), gpurt.float64))
    with pytest.raises(ValueError, match="shape mismatch"):
        a.copy_(gpurt.zeros((2, 8)))
    host = pinned((4,), np.float32)

    class HostCAI:  # claims device memory but points at pinned host memory
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4",
                                    "data": (host.ctypes.data, False), "version": 3}

    with pytest.raises(TypeError, match="host memory"):
        gpurt.asarray(HostCAI())
    pageable = np.ones(4, np.float32)

    class PageableCAI:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4",
                                    "data": (pageable.ctypes.data, False), "version": 3}

    with pytest.raises(TypeError, match="device array is needed"):
        gpurt.asarray(PageableCAI())
    if gpurt.device_count() > 1:
        other = gpurt.zeros((4, 4), device=1)
        with pytest.raises(ValueError, match="a copy is needed"):
            gpurt.asarray(other, device=0, copy=False)
        moved = gpurt.asarray(other, device=0)  # copied across, as torch.as_tensor does
        assert moved.device.index == 0 and not moved.numpy().any()


@gpu
def test_gpu_cai_stream_field_honoured(gpu_state, pinned):
    held = HeldStream(pinned)
    producer = gpurt.empty(1024, gpurt.int32, stream=held.stream)
    consumer_stream = gpurt.Stream()
    out = pinned((1024,), np.int32)
    out[...] = -1
    with held:
        producer.fill_(7)  # queued behind the held wait

        class Foreign:
            __cuda_array_interface__ = producer.__cuda_array_interface__  # noqa: RUF012

        assert Foreign.__cuda_array_interface__["stream"] == held.stream.cuda_stream
        view = gpurt.asarray(Foreign(), stream=consumer_stream)
        assert view.ptr == producer.ptr and view.stream is consumer_stream
        view.to_numpy(out=out, non_blocking=True)
        assert _not_done(consumer_stream.cuda_stream)  # waits for the producer's stream
        held.release()
        consumer_stream.synchronize()
    _equal(out.copy(), np.full(1024, 7, np.int32))


@gpu
def test_gpu_dlpack_stream_handshake(gpu_state, pinned):
    held = HeldStream(pinned)
    producer = gpurt.empty(256, gpurt.float32, stream=held.stream)
    consumer_stream = gpurt.Stream()
    out = pinned((256,), np.float32)
    out[...] = 0
    with held:
        producer.fill_(1.5)
        view = gpurt.from_dlpack(producer, stream=consumer_stream)
        assert view.ptr == producer.ptr and view.stream is consumer_stream
        view.to_numpy(out=out, non_blocking=True)
        assert _not_done(consumer_stream.cuda_stream)  # the producer ordered its stream first
        held.release()
        consumer_stream.synchronize()
    _equal(out.copy(), np.full(256, 1.5, np.float32))


# ---- peers ---------------------------------------------------------------------------


@gpu
def test_gpu_torch_interop(gpu_state, rng):
    torch = pytest.importorskip("torch")
    x = _random(rng, (33, 17), np.float32)
    t = torch.from_numpy(x).cuda()
    via_cai = gpurt.asarray(t)
    via_dlpack = gpurt.from_dlpack(t)
    assert via_cai.ptr == via_dlpack.ptr == t.data_ptr()
    _equal(via_cai.numpy(), x)
    _equal(via_dlpack.numpy(), x)
    via_dlpack.fill_(2.5)  # gpurt writes, torch reads
    gpurt.synchronize()
    assert torch.all(t == 2.5).item()
    # gpurt -> torch, both protocols
    a = gpurt.from_numpy(x)
    t1 = torch.from_dlpack(a)
    t2 = torch.as_tensor(a, device="cuda")
    assert t1.data_ptr() == t2.data_ptr() == a.ptr
    np.testing.assert_array_equal(t1.cpu().numpy(), x)
    t1.mul_(2)  # torch writes, gpurt reads
    torch.cuda.synchronize()
    _equal(a.numpy(), x * 2)
    # strided views both ways
    view = a[::2, 3:9]
    tv = torch.from_dlpack(view)
    assert tv.stride() == (34, 1) and tv.data_ptr() == view.ptr
    np.testing.assert_array_equal(tv.cpu().numpy(), (x * 2)[::2, 3:9])
    back = gpurt.from_dlpack(t.t())
    assert back.strides == (4, 68)


@gpu
def test_gpu_torch_lifetimes(gpu_state, rng):
    torch = pytest.importorskip("torch")
    x = _random(rng, 4096, np.float32)
    t = torch.from_numpy(x).cuda()
    a = gpurt.from_dlpack(t)
    del t  # the consumer keeps torch's memory alive
    gc.collect()
    torch.cuda.empty_cache()
    filler = torch.full((4096,), 9.0, device="cuda")  # would reuse freed memory
    _equal(a.numpy(), x)
    del a, filler
    gc.collect()
    start = gpurt.memory_allocated()
    b = gpurt.from_numpy(x)
    tb = torch.from_dlpack(b)
    del b  # torch keeps gpurt's memory alive
    gc.collect()
    assert gpurt.memory_allocated() > start
    np.testing.assert_array_equal(tb.cpu().numpy(), x)
    del tb
    gc.collect()
    assert gpurt.memory_allocated() == start


@gpu
def test_gpu_torch_bfloat16(gpu_state, rng):
    torch = pytest.importorskip("torch")
    t = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    a = gpurt.from_dlpack(t)
    assert a.dtype == gpurt.bfloat16 and a.ptr == t.data_ptr()
    np.testing.assert_array_equal(a.numpy().astype(np.float32), t.float().cpu().numpy())
    x = _random(rng, (8, 16), ml_dtypes.bfloat16)
    back = torch.from_dlpack(gpurt.from_numpy(x))
    assert back.dtype == torch.bfloat16
    np.testing.assert_array_equal(back.float().cpu().numpy(), x.astype(np.float32))
    via_cai = gpurt.asarray(t)  # torch's CAI typestr for bf16 is '<V2'
    assert via_cai.dtype == gpurt.bfloat16 and via_cai.ptr == t.data_ptr()


@gpu
def test_gpu_cupy_interop(gpu_state, rng):
    cupy = pytest.importorskip("cupy")
    x = _random(rng, (50, 20), np.float64)
    c = cupy.asarray(x)
    a = gpurt.asarray(c)
    b = gpurt.from_dlpack(c)
    assert a.ptr == b.ptr == c.data.ptr
    _equal(a.numpy(), x)
    b.fill_(-4.0)
    gpurt.synchronize()
    assert bool((c == -4.0).all())
    g = gpurt.from_numpy(x)
    c1 = cupy.asarray(g)
    c2 = cupy.from_dlpack(g)
    assert c1.data.ptr == c2.data.ptr == g.ptr
    np.testing.assert_array_equal(cupy.asnumpy(c2), x)
    c1 *= 3
    cupy.cuda.get_current_stream().synchronize()
    _equal(g.numpy(), x * 3)
    strided = g[1::3, ::-2]
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(strided)), (x * 3)[1::3, ::-2])
    del c
    gc.collect()
    _equal(a.numpy(), np.full((50, 20), -4.0))  # the view keeps CuPy's memory


@gpu
def test_gpu_jax_interop(gpu_state, rng):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    x = _random(rng, (16, 8), np.float32)
    j = jax.device_put(x, device)
    j.block_until_ready()
    a = gpurt.from_dlpack(j)
    _equal(a.numpy(), x)
    g = gpurt.from_numpy(x * 2)
    jg = jax.dlpack.from_dlpack(g)
    np.testing.assert_array_equal(np.asarray(jg), x * 2)
