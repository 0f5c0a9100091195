"""torch tensors taken in from their own accessors (gpurt/_array/interop.py's fast path):
the same Array as through __cuda_array_interface__/DLPack, for every dtype, layout and
empty tensors; the general path (and its ordering) whenever torch's current stream is not
the one that will use the data, or the tensor needs a gradient (GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import gpurt
from gpurt._array import interop
from gpurt._array import layout as _layout

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def general(t):
    cai = t.__cuda_array_interface__ if t.dtype != torch.bfloat16 else None
    return interop.from_cuda_array_interface(t, cai, None) if cai is not None else \
        interop.from_dlpack(t, None)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32",
                                   "int64", "uint8", "bool"])
def test_the_fast_path_describes_what_the_interfaces_do(gpu_state, dtype):
    base = (torch.rand(37, 65, device="cuda") * 100).to(getattr(torch, dtype))
    for t in (base, base.T, base[3:, 1:40:3], base[:0], base[:1], base[:, :1]):
        fast = interop._from_torch(t, None) if interop._torch_tensor_type() is not None else None
        assert fast is not None, (dtype, t.shape)
        slow = general(t)
        assert (fast.ptr, fast.shape, fast.strides, fast.dtype, fast.device_index) == \
            (slow.ptr, slow.shape, slow.strides, slow.dtype, slow.device_index)
        a = gpurt.asarray(t)
        assert (a.ptr, a.shape, a.strides, a.dtype, a.device.index) == \
            (slow.ptr, slow.shape, slow.strides, slow.dtype, slow.device_index)
        assert a.is_contiguous() == _layout.is_contiguous(slow.shape, slow.strides,
                                                          slow.dtype.itemsize)
        got = a.to_numpy()
        want = t.cpu().float().numpy() if dtype == "bfloat16" else t.cpu().numpy()
        np.testing.assert_array_equal(np.asarray(got, dtype=want.dtype), want)


def test_another_torch_stream_takes_the_general_path(gpu_state):
    t = torch.rand(16, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert interop._from_torch(t, None) is None  # ordering needed: not the fast path
        np.testing.assert_array_equal(gpurt.asarray(t).to_numpy(), t.cpu().numpy())


def test_what_the_fast_path_leaves_alone_fails_as_before(gpu_state):
    needs_grad = torch.rand(4, device="cuda", requires_grad=True)
    assert interop._from_torch(needs_grad, None) is None
    with pytest.raises(Exception, match="grad"):
        gpurt.asarray(needs_grad)
    assert interop._from_torch(torch.rand(4, device="cuda").to_sparse(), None) is None
