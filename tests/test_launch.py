"""gpurt.launch (Kernel, LaunchConfig, hooks) with its helpers gpurt._params (parameter types
from declarations and mangled names) and gpurt._args (argument conversion and packing).

CPU tests compile real kernels with NVRTC (explicit arch) and check the parameter plans and
the packed parameter buffers byte for byte; GPU tests launch and compare with numpy."""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import threading

import ml_dtypes
import numpy as np
import pytest

import gpurt
from gpurt import _args, _params
from gpurt import launch as glaunch

# ---- parameter types -----------------------------------------------------------------------

DECLS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
struct Pair { int a; double b; };
namespace ns { struct P { float x; }; template <class T> __global__ void tfill(T* out, T v) {} }
// a commented-out decoy: __global__ void all_kinds(int nope)
extern "C" __global__ void __launch_bounds__(256) all_kinds(
    const float* __restrict__ x, /* x */ float f, double d, int i, unsigned int u,
    long long ll, unsigned long long ull, short s, unsigned short us, char c, signed char sc,
    unsigned char uc, bool flag, __half h, __nv_bfloat16 bf, float2 v2, double4 v4, int3 v3,
    Pair pair, size_t n, void* raw, const double d_arr[]) {}
template <typename T, int N> __global__ void tk(T a, T* b, const T* c, const T* const* d, int n) {}
extern "C" __global__ void noargs() {}
"""
EXPRS = ["tk<float, 4>", "tk<__half, 1>", "tk<ns::P, 2>", "ns::tfill<double>", "tk<float2, 3>",
         "tk<__nv_bfloat16, 8>"]


@pytest.fixture(scope="module")
def decls():
    return gpurt.compile(DECLS, name_expressions=EXPRS, arch="sm_90")


def test_declared_parameters(decls):
    params = decls["all_kinds"].params
    got = [(p.name, p.type, p.kind, p.fmt, p.size) for p in params]
    assert got == [
        ("x", "const float* __restrict__", "pointer", "Q", 8), ("f", "float", "scalar", "f", 4),
        ("d", "double", "scalar", "d", 8), ("i", "int", "scalar", "i", 4),
        ("u", "unsigned int", "scalar", "I", 4), ("ll", "long long", "scalar", "q", 8),
        ("ull", "unsigned long long", "scalar", "Q", 8), ("s", "short", "scalar", "h", 2),
        ("us", "unsigned short", "scalar", "H", 2), ("c", "char", "scalar", "b", 1),
        ("sc", "signed char", "scalar", "b", 1), ("uc", "unsigned char", "scalar", "B", 1),
        ("flag", "bool", "scalar", "?", 1), ("h", "__half", "scalar", "e", 2),
        ("bf", "__nv_bfloat16", "bfloat16", "H", 2), ("v2", "float2", "vector", "ff", 8),
        ("v4", "double4", "vector", "dddd", 32), ("v3", "int3", "vector", "iii", 12),
        ("pair", "Pair", "bytes", "", 0), ("n", "size_t", "scalar", "Q", 8),
        ("raw", "void*", "pointer", "Q", 8), ("d_arr", "const double*", "pointer", "Q", 8),
    ]
    assert decls["noargs"].params == []


def test_mangled_parameters(decls):
    def kinds(expr):
        return [(p.name, p.type, p.kind) for p in decls[expr].params]

    assert kinds("tk<float, 4>") == [
        ("a", "float", "scalar"), ("b", "float*", "pointer"), ("c", "const float*", "pointer"),
        ("d", "const float* const*", "pointer"), ("n", "int", "scalar")]
    assert [p.fmt for p in decls["tk<__half, 1>"].params] == ["e", "Q", "Q", "Q", "i"]
    assert [p.kind for p in decls["tk<__nv_bfloat16, 8>"].params][0] == "bfloat16"
    assert kinds("tk<ns::P, 2>")[0] == ("a", "ns::P", "bytes")
    assert [p.fmt for p in decls["tk<float2, 3>"].params] == ["ff", "Q", "Q", "Q", "i"]
    assert kinds("ns::tfill<double>") == [("out", "double*", "pointer"), ("v", "double", "scalar")]


@pytest.mark.parametrize("mangled, expected", [
    ("_Z3fooPfS_i", ["float*", "float*", "int"]),
    ("_Z3barv", []),
    ("_ZN2ns3bazEPKdRi", ["const double*", "int&"]),
    ("_Z1fIiJfdEEvT_DpT0_", ["int", "float", "double"]),
    ("_Z1gPFviEy", ["<function>*", "unsigned long long"]),
    ("_Z1hIN2ns1QIiEEEvPT_S4_", ["ns::Q<...>*", "ns::Q<...>*"]),
    ("_Z1kDF16_Dh", ["_Float16", "half"]),
])
def test_demangler_table(mangled, expected):
    types = _params.mangled_params(mangled)
    assert types is not None and [t.spelling for t in types] == expected


def test_unreadable_names_give_none():
    assert _params.mangled_params("_Z1fQQ") is None
    assert _params.mangled_params("not_mangled") is None
    assert _params.kernel_params("missing", "extern \"C\" __global__ void other(int x) {}") is None


def test_declaration_parsing_edge_cases():
    source = """
    extern "C" {
    __global__ void k(float *a, int n = 4, const unsigned long long * __restrict__ p,
                      volatile int * v, int (*fn)(int), float arr[16]) { }
    }
    void k(int not_a_kernel);
    """
    decl = _params.declared_params(source, "k")
    assert decl == [("float*", "a"), ("int", "n"), ("const unsigned long long* __restrict__", "p"),
                    ("volatile int*", "v"), ("int (*)(int)", "fn"), ("float*", "arr")]


# ---- plans and packing -----------------------------------------------------------------------


def bf16_bits(value: float) -> int:
    return int(np.array(value, dtype=ml_dtypes.bfloat16).view(np.uint16))


def test_pack_converts_by_declared_type(decls):
    kernel = decls["all_kinds"]
    layout = [
        ("<Q", 0x1234), ("<f", 0.1), ("<d", 0.1), ("<i", -7), ("<I", 2**32 - 1), ("<q", -2**40),
        ("<Q", 2**64 - 1), ("<h", -3), ("<H", 65535), ("<b", -1), ("<b", -128), ("<B", 255),
        ("<?", True), ("<e", 1.5), ("<H", bf16_bits(3.140625)), ("<ff", (1.0, 2.0)),
        ("<dddd", (1.0, 2.0, 3.0, 4.0)), ("<iii", (1, 2, 3)), (None, b"P" * 16), ("<Q", 99),
        ("<Q", 0), ("<Q", 0xDEAD),
    ]
    args = [0x1234, 0.1, 0.1, -7, 2**32 - 1, -2**40, 2**64 - 1, -3, 65535, -1, -128, 255, True,
            1.5, 3.140625, (1.0, 2.0), (1.0, 2.0, 3.0, 4.0), [1, 2, 3], b"P" * 16, 99, None,
            0xDEAD]
    plan = _args.build_plan("all_kinds", kernel.params,
                            [(o, p.size or 16) for o, p in zip(_layout_offsets(kernel), kernel.params)])
    buffer = ctypes.create_string_buffer(plan.size)
    plan.fill(buffer, args, None)
    data = buffer.raw
    for (fmt, value), offset, param in zip(layout, plan.offsets, plan.params):
        if fmt is None:
            assert data[offset: offset + 16] == value
            continue
        values = value if isinstance(value, tuple) else (value,)
        expected = struct.pack(fmt, *values)
        assert data[offset: offset + len(expected)] == expected, param


def _layout_offsets(kernel) -> list[int]:
    """C ABI offsets of all_kinds's parameters, with Pair (16 bytes, align 8) filled in."""
    params = [dataclasses.replace(p, size=16, align=8, kind="bytes") if p.size == 0 else p
              for p in kernel.params]
    return _args._computed_offsets(params)[0]


def test_python_float_to_float_param_is_float32(decls):
    kernel = decls["tk<float, 4>"]
    data = kernel.pack(0.1, 0, 0, 0, 3)
    assert data[:4] == np.float32(0.1).tobytes()
    assert decls["ns::tfill<double>"].pack(0, 0.1)[8:16] == np.float64(0.1).tobytes()


def test_abi_offsets_and_padding():
    source = 'extern "C" __global__ void k(char c, double d, short s, float2 v, bool b, int i) {}'
    kernel = gpurt.compile(source, arch="sm_90")["k"]
    data = kernel.pack(1, 2.0, 3, (4.0, 5.0), True, 6)
    assert len(data) == 40  # c@0 d@8 s@16 v@24 (8-aligned) b@32 i@36
    assert data[0] == 1 and data[8:16] == struct.pack("<d", 2.0)
    assert data[16:18] == struct.pack("<h", 3) and data[24:32] == struct.pack("<ff", 4.0, 5.0)
    assert data[32] == 1 and data[36:40] == struct.pack("<i", 6)


SCALARS = r"""extern "C" __global__ void scalars(float* p, float f, double d, int i, unsigned u,
                                            long long ll, unsigned long long ull) {}"""


def test_numpy_scalars():
    kernel = gpurt.compile(SCALARS, arch="sm_90")["scalars"]
    data = kernel.pack(np.uint64(5), np.float32(1.25), np.float64(0.5), np.int64(-3),
                       np.uint32(7), np.int16(-9), np.uint64(2**63))
    assert struct.unpack("<Qf4xdiIqQ", data) == (5, 1.25, 0.5, -3, 7, -9, 2**63)
    with pytest.raises(OverflowError, match=r"argument 3 \(i: int\)"):
        kernel.pack(0, 0.0, 0.0, np.int64(2**40), 0, 0, 0)
    with pytest.raises(OverflowError, match=r"argument 4 \(u: unsigned\)"):
        kernel.pack(0, 0.0, 0.0, 0, -1, 0, 0)
    with pytest.raises(TypeError, match=r"argument 3 \(i: int\)"):
        kernel.pack(0, 0.0, 0.0, np.float32(1.0), 0, 0, 0)
    with pytest.raises(OverflowError, match=r"argument 1 \(f: float\)"):
        kernel.pack(0, 1e300, 0.0, 0, 0, 0, 0)


def test_half_and_bfloat16_values(decls):
    kernel = decls["tk<__half, 1>"]
    assert kernel.pack(0.333, 0, 0, 0, 0)[:2] == np.float16(0.333).tobytes()
    kernel = decls["tk<__nv_bfloat16, 8>"]
    for value in (1.0, -2.5, 0.1, 3.3e38, 1e-40, float("inf")):
        assert kernel.pack(value, 0, 0, 0, 0)[:2] == np.array(value, ml_dtypes.bfloat16).tobytes()
    nan = struct.unpack("<H", kernel.pack(float("nan"), 0, 0, 0, 0)[:2])[0]
    assert nan & 0x7F80 == 0x7F80 and nan & 0x7F
    assert kernel.pack(ml_dtypes.bfloat16(1.5), 0, 0, 0, 0)[:2] == np.array(1.5, ml_dtypes.bfloat16).tobytes()
    with pytest.raises(OverflowError, match="argument 0"):
        decls["tk<__half, 1>"].pack(1e6, 0, 0, 0, 0)


def test_pointer_arguments(decls):
    kernel = decls["tk<float, 4>"]

    class DeviceBuffer:  # a foreign array: anything with __cuda_array_interface__
        def __init__(self, ptr, device=0):
            self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (4,),
                                             "typestr": "<f4", "version": 3}
            self.device = device

        def __dlpack_device__(self):
            return (2, self.device)

    data = kernel.pack(1.0, DeviceBuffer(0xABC), ctypes.c_void_p(0x10), np.uint64(0x20), 0,
                       device=0)
    assert struct.unpack_from("<QQQ", data, 8) == (0xABC, 0x10, 0x20)
    assert struct.unpack_from("<Q", kernel.pack(1.0, None, 0, 0, 0), 8) == (0,)
    with pytest.raises(ValueError, match=r"argument 1 \(b: float\*\).*cuda:1.*cuda:0"):
        kernel.pack(1.0, DeviceBuffer(0xABC, device=1), 0, 0, 0, device=0)
    with pytest.raises(TypeError, match=r"argument 2 \(c: const float\*\).*host"):
        kernel.pack(1.0, 0, np.zeros(3, np.float32), 0, 0)
    with pytest.raises(TypeError, match="argument 1"):
        kernel.pack(1.0, 2.5, 0, 0, 0)
    with pytest.raises(TypeError, match="argument 1"):
        kernel.pack(1.0, True, 0, 0, 0)


def test_argument_errors_name_the_parameter(decls):
    kernel = decls["tk<float, 4>"]
    with pytest.raises(TypeError, match=r"takes 5 arguments \(float a, float\* b"):
        kernel.pack(1.0, 0, 0)
    with pytest.raises(TypeError, match=r"argument 4 \(n: int\) cannot take float 2.5"):
        kernel.pack(1.0, 0, 0, 0, 2.5)
    with pytest.raises(OverflowError, match=r"argument 4 \(n: int\)"):
        kernel.pack(1.0, 0, 0, 0, 2**31)
    with pytest.raises(TypeError, match=r"argument 0 \(a: float\) cannot take str"):
        kernel.pack("1.0", 0, 0, 0, 0)
    with pytest.raises(TypeError, match="takes 0 arguments"):
        decls["noargs"].pack(1)
    assert decls["noargs"].pack() == b""


def test_vectors_structs_and_bools(decls):
    kernel = decls["tk<float2, 3>"]
    assert kernel.pack((1.0, 2.0), 0, 0, 0, 0)[:8] == struct.pack("<ff", 1.0, 2.0)
    assert kernel.pack(struct.pack("<ff", 3.0, 4.0), 0, 0, 0, 0)[:8] == struct.pack("<ff", 3.0, 4.0)
    with pytest.raises(ValueError, match="argument 0.*2 components"):
        kernel.pack((1.0,), 0, 0, 0, 0)
    with pytest.raises(TypeError, match="cannot size"):  # a struct needs the driver's layout
        decls["tk<ns::P, 2>"].pack(b"1234", 0, 0, 0, 0)
    struct_kernel = decls["tk<ns::P, 2>"]
    plan = _args.build_plan("tk", struct_kernel.params, [(0, 4), (8, 8), (16, 8), (24, 8), (32, 4)])

    class P(ctypes.Structure):
        _fields_ = [("x", ctypes.c_float)]

    buffer = ctypes.create_string_buffer(plan.size)
    plan.fill(buffer, [P(2.5), 0, 0, 0, 1], None)
    assert buffer.raw[:4] == struct.pack("<f", 2.5)
    with pytest.raises(ValueError):
        plan.fill(buffer, [b"12345", 0, 0, 0, 1], None)
    bool_kernel = gpurt.compile('extern "C" __global__ void b(bool x) {}', arch="sm_90")["b"]
    assert bool_kernel.pack(np.bool_(True)) == b"\x01"
    with pytest.raises(TypeError, match="argument 0"):
        bool_kernel.pack("yes")


def test_driver_layout_wins_over_the_computed_one():
    params = [_params.make_param(0, "x", _params.ctype_from_text("float*")),
              _params.make_param(1, "n", _params.ctype_from_text("int"))]
    plan = _args.build_plan("k", params, [(0, 8), (16, 4)])  # the driver says n is at 16
    assert plan.offsets == (0, 16) and plan.size == 20
    unknown = _args.build_plan("k", None, [(0, 8), (8, 4), (16, 16)])
    assert [p.kind for p in unknown.params] == ["opaque"] * 3
    buffer = ctypes.create_string_buffer(unknown.size)
    unknown.fill(buffer, [0x55, -2, b"z" * 16], None)
    assert struct.unpack_from("<Qi", buffer.raw) == (0x55, -2) and buffer.raw[16:] == b"z" * 16
    with pytest.raises(TypeError, match="cannot tell the parameters"):
        _args.build_plan("k", None, None)


def test_plan_source_is_specialised(decls):
    plan = _args.build_plan("tk", decls["tk<float, 4>"].params, None)
    assert "a0, a1, a2, a3, a4, = args" in plan.source
    assert "a1.ptr if type(a1) is Array" in plan.source
    assert "a0.ptr" not in plan.source  # scalars go straight to struct


# ---- launch configuration and hooks ------------------------------------------------------------


def test_launch_config_normalises_and_validates():
    config = gpurt.LaunchConfig(4, (32, 2), shared_mem=np.int64(1024), cluster=2)
    assert config.grid == (4, 1, 1) and config.block == (32, 2, 1)
    assert config.cluster == (2, 1, 1) and config.shared_mem == 1024
    assert hash(config) == hash(gpurt.LaunchConfig((4, 1, 1), [32, 2, 1], 1024, (2, 1, 1)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.grid = (1, 1, 1)  # type: ignore[misc]
    bad = [
        (dict(grid=0, block=1), ValueError, "grid dimensions must be >= 1, got 0"),
        (dict(grid=(1, 2, 3, 4), block=1), TypeError, r"1-3 ints, got \(1, 2, 3, 4\)"),
        (dict(grid=1.5, block=1), TypeError, "got 1.5"),
        (dict(grid=1, block=(32, 32, 2)), ValueError, "at most 1024 threads"),
        (dict(grid=1, block=(1, 1, 65)), ValueError, "dimension z is at most 64"),
        (dict(grid=(1, 70000), block=1), ValueError, "dimension y is at most 65535"),
        (dict(grid=1, block=1, shared_mem=-1), ValueError, "shared_mem must be >= 0"),
        (dict(grid=1, block=1, shared_mem=1.0), TypeError, "shared_mem must be an int"),
        (dict(grid=3, block=1, cluster=2), ValueError, "multiple of the cluster dims"),
        (dict(grid=1, block=1, cooperative=1), TypeError, "cooperative must be a bool"),
        (dict(grid=True, block=1), TypeError, "got True"),
    ]
    for kwargs, kind, message in bad:
        with pytest.raises(kind, match=message):
            gpurt.LaunchConfig(**kwargs)


def test_hook_registry():
    def hook(kernel, handle, phase):
        pass

    gpurt.add_launch_hook(hook)
    try:
        assert hook in glaunch._hooks
    finally:
        gpurt.remove_launch_hook(hook)
    assert hook not in glaunch._hooks
    gpurt.remove_launch_hook(hook)  # ignored


def test_kernel_repr_and_lookup_errors(decls):
    assert "tk<float, 4>(float a, float* b" in repr(decls["tk<float, 4>"])
    with pytest.raises(KeyError, match="name expressions"):
        decls["tk<int, 4>"]


@pytest.mark.skipif(gpurt.is_available(), reason="checks the no-GPU error")
def test_launch_without_gpu_raises_clearly(decls):
    with pytest.raises(gpurt.CudaUnavailableError):
        decls["noargs"](1, 1, ())
