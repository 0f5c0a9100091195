"""The torch fast path of gpurt.asarray (gpurt/_array/interop.py's torch_fields) on the CPU: a
stand-in torch module whose tensors answer the accessors gpurt reads, over the pretend GPUs
of tests/_fakes.py. What it takes becomes an Array with torch's layout in bytes; what it leaves
(another current stream, a gradient, other layouts and dtypes, host tensors) returns None, for
the general path. test_torch_intake.py checks the same against real torch on the GPU."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

import gpurt
from _fakes import fake_driver_fixture, fake_gpus_fixture  # noqa: F401
from gpurt._array import interop
from gpurt._array import layout as _layout


class FakeTensor:
    """The accessors of a torch.Tensor that gpurt reads."""

    def __init__(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: str = "float32",
                 ptr: int = 0x7000_0000, **flags: Any) -> None:
        self.shape, self._stride, self._ptr = shape, stride, ptr
        self.dtype = getattr(fake_torch, dtype)
        self.is_cuda = flags.get("is_cuda", True)
        self.requires_grad = flags.get("requires_grad", False)
        self.layout = flags.get("layout", fake_torch.strided)
        self._device = flags.get("device", 0)
        self._conj, self._neg = flags.get("conj", False), flags.get("neg", False)
        self.conj_reads = 0

    def is_conj(self) -> bool:
        self.conj_reads += 1
        return self._conj

    def is_neg(self) -> bool:
        return self._neg

    def get_device(self) -> int:
        return self._device

    def stride(self) -> tuple[int, ...]:
        return self._stride

    def data_ptr(self) -> int:
        return self._ptr

    def is_contiguous(self) -> bool:
        return _layout.is_contiguous(self.shape, [s * 4 for s in self._stride], 4)


class FakeName:
    """A torch dtype or layout: an object that is itself and nothing else."""

    def __init__(self, name: str) -> None:
        self.name = name


fake_torch = types.ModuleType("torch")
fake_torch.Tensor = FakeTensor  # type: ignore[attr-defined]
for _name in ("float32", "float16", "bfloat16", "int32", "complex64", "strided", "sparse_coo",
              "float8"):
    setattr(fake_torch, _name, FakeName(_name))
RAW = {"stream": 0}
fake_torch._C = types.SimpleNamespace(  # type: ignore[attr-defined]
    _cuda_getCurrentRawStream=lambda index: RAW["stream"])


@pytest.fixture
def torch(fake_driver: Any, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stand-in torch, imported by the user as far as gpurt can tell."""
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    for name in ("_torch", "_tensor_type", "_strided", "_raw_stream"):
        monkeypatch.setattr(interop, name, None)
    monkeypatch.setattr(interop, "_torch_dtypes", {})
    monkeypatch.setattr(interop, "_complex_dtypes", set())
    monkeypatch.setattr(interop, "view", interop._no_view)  # told of this torch when met
    RAW["stream"] = gpurt.current_stream().cuda_stream
    return fake_torch


@pytest.mark.parametrize("shape, stride", [((37, 65), (65, 1)), ((65, 37), (1, 65)),
                                           ((4, 1, 3), (3, 7, 1)), ((0, 5), (5, 1))])
def test_a_plain_tensor_becomes_an_array_with_its_layout(torch: Any, shape: Any,
                                                         stride: Any) -> None:
    t = FakeTensor(shape, stride)
    a = gpurt.asarray(t)
    assert (a.shape, a.strides, a.dtype) == (shape, tuple(4 * s for s in stride),
                                             np.dtype(np.float32))
    assert a.ptr == (0 if 0 in shape else t.data_ptr())
    assert a.device.index == 0 and a.stream is gpurt.current_stream()
    assert a.is_contiguous() == _layout.is_contiguous(a.shape, a.strides, 4)
    assert interop._from_torch(t, None).ptr == a.ptr  # the Foreign view says the same


@pytest.mark.parametrize("change", [
    dict(requires_grad=True), dict(layout="sparse_coo"), dict(dtype="float8"),
    dict(is_cuda=False), dict(neg=True), dict(dtype="complex64", conj=True),
])
def test_what_the_fast_path_leaves_to_the_general_path(torch: Any, change: dict) -> None:
    if "layout" in change:
        change["layout"] = getattr(torch, change["layout"])
    assert interop.torch_fields(FakeTensor((4, 4), (4, 1), **change), None) is None


def test_another_current_torch_stream_needs_the_general_path(torch: Any) -> None:
    RAW["stream"] = 0x1234  # torch's current stream is not gpurt's: the data needs ordering
    assert interop.torch_fields(FakeTensor((4, 4), (4, 1)), None) is None


def test_other_objects_are_not_taken(torch: Any) -> None:
    assert interop.torch_fields(np.zeros(3), None) is None
    assert interop.torch_fields(object(), None) is None


def test_a_tensor_on_the_second_gpu_is_an_array_there(torch: Any) -> None:
    RAW["stream"] = gpurt.current_stream(1).cuda_stream
    a = gpurt.asarray(FakeTensor((8,), (1,), device=1))
    assert a.device.index == 1 and a.stream is gpurt.current_stream(1)
    assert gpurt.current_device() == 0  # taking it in changes nothing of the caller's


def test_byte_strides_are_remembered_per_layout_and_itemsize(torch: Any) -> None:
    first = gpurt.asarray(FakeTensor((4, 6), (6, 1)))
    again = gpurt.asarray(FakeTensor((4, 6), (6, 1), ptr=0x7100_0000))
    half = gpurt.asarray(FakeTensor((4, 6), (6, 1), dtype="float16"))
    listed = interop.torch_fields(FakeTensor((4, 6), [1, 4]), None)  # not a tuple: still read
    assert first.strides == again.strides == (24, 4) and half.strides == (12, 2)
    assert listed is not None and listed[2] == (4, 16)


def test_the_conjugate_bit_is_read_for_complex_tensors_only(torch: Any) -> None:
    real, complex_ = FakeTensor((4,), (1,)), FakeTensor((4,), (1,), dtype="complex64")
    assert interop.torch_fields(real, None) is not None and real.conj_reads == 0
    assert interop.torch_fields(complex_, None) is not None and complex_.conj_reads == 1
