"""gpurt._launch.kernel (Kernel, LaunchConfig, hooks) with its helpers gpurt._launch.params
(parameter types from declarations and mangled names) and gpurt._launch.args (argument
conversion and packing).

CPU tests compile real kernels with NVRTC (explicit arch) and check the parameter plans and
the packed parameter buffers byte for byte; GPU tests launch and compare with numpy."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
import sys
import threading
import uuid

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver as cu

import gpurt
from _driver_calls import CLaunchKernel
from gpurt import nvrtc
from gpurt._core import state
from gpurt._launch import args as _args
from gpurt._launch import kernel as glaunch
from gpurt._launch import params as _params
from gpurt._launch import path as _launchpath
from gpurt._nvrtc import cache as _kcache

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


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """Compile into a cache folder of this module's own, not the user's default one."""
    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get("GPURT_CACHE_DIR"):
            patch.setenv("GPURT_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        yield


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
    offsets = _layout_offsets(kernel)
    plan = _args.build_plan("all_kinds", kernel.params,
                            [(o, p.size or 16) for o, p in zip(offsets, kernel.params)])
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
    expected = np.array(1.5, ml_dtypes.bfloat16).tobytes()
    assert kernel.pack(ml_dtypes.bfloat16(1.5), 0, 0, 0, 0)[:2] == expected
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


def test_torch_tensors_by_data_ptr(decls):
    class Tensor:  # stands in for torch.Tensor, which gpurt recognises by name
        __module__ = "torch"

        def __init__(self, ptr, device):
            self.ptr, self.device = ptr, device

        def data_ptr(self):
            return self.ptr

        def get_device(self):
            return self.device

        @property
        def __cuda_array_interface__(self):
            raise AssertionError("the slow path was taken")

    class Parameter(Tensor):
        __module__ = "torch.nn.parameter"

    kernel = decls["tk<float, 4>"]
    data = kernel.pack(1.0, Tensor(0xA0, 0), Parameter(0xB0, 0), 0, 0, device=0)
    assert struct.unpack_from("<QQ", data, 8) == (0xA0, 0xB0)
    with pytest.raises(ValueError, match=r"argument 1 \(b: float\*\).*cuda:1"):
        kernel.pack(1.0, Tensor(0xA0, 1), 0, 0, 0, device=0)
    with pytest.raises(TypeError, match=r"argument 2 .*not on a CUDA device"):
        kernel.pack(1.0, 0, Tensor(0xA0, -1), 0, 0)


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
    buffer = ctypes.create_string_buffer(plan.size)
    plan.fill(buffer, [1.0, 0, 0, 0, 5], None)  # a list is fine
    with pytest.raises(TypeError, match="tuple"):  # an array must not unpack itself
        plan.fill(buffer, np.arange(5), None)
    python, compiled = plan.launch_source(False), plan.launch_source(True)
    assert "a0, a1, a2, a3, a4, = args" in python and "a0, a1, a2, a3, a4, = args" in compiled
    assert "launch_kernel(function, gx, gy, gz, bx, by, bz" in python
    assert "launch_kernel(grid, block, shared_mem, stream, params)" in compiled
    assert "gx, gy, gz" not in compiled  # the compiled Launcher takes grid and block as they are
    assert plan.layout == ((0, "f"), (8, "P"), (16, "P"), (24, "P"), (32, "i"))


def test_plan_layout_is_only_for_plain_parameters(decls):
    plain = _args.build_plan("tk", decls["tk<__half, 1>"].params, None)
    assert plain.layout == ((0, "e"), (8, "P"), (16, "P"), (24, "P"), (32, "i"))
    for needs_python in ("tk<__nv_bfloat16, 8>", "tk<float2, 3>"):
        assert _args.build_plan("k", decls[needs_python].params, None).layout is None


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
def test_generated_launcher_calls_the_driver_with_this_threads_buffer(decls, compiled):
    plan = _args.build_plan("tk", decls["tk<float, 4>"].params, None)
    calls, explained, refused = [], [], []

    def driver(function, gx, gy, gz, bx, by, bz, shared_mem, stream, params, extra):
        pointers = (ctypes.c_void_p * 5).from_address(params)
        values = [ctypes.string_at(p, n) for p, n in zip(pointers, (4, 8, 8, 8, 4))]
        calls.append((function, (gx, gy, gz), (bx, by, bz), shared_mem, stream, values))
        return 1 if gx == 99 else 0

    if compiled:
        if _launchpath.claunch is None:
            pytest.skip("the C extension gpurt._launch._claunch is not built")
        c_driver = CLaunchKernel(driver)
        function = 0x46
        launch_kernel = _launchpath.claunch.Launcher(c_driver.address, function, glaunch._dims3)
    else:
        launch_kernel, function = (lambda *args: (driver(*args),)), "F"
    hooks, hooked = [], []

    def run_hooked(driver_call, stream, *call_args):
        hooked.append(stream)
        return driver_call(*call_args)

    launch = plan.launcher(launch_kernel, compiled=compiled, function=function,
                           dims=glaunch._dims3, hooks=hooks, hooked=run_hooked,
                           explain=lambda *a: explained.append(a[0]),
                           refused=lambda *a: refused.append(a[1:]))
    launch(4, (32, 2), (0.5, 0x10, 0x20, 0x30, 7), 128, 0, 0)
    launch((2, 3, 4), 64, [1.0, 1, 2, 3, 4], 0, 0x55, 0)
    launch((np.int64(5), 1, 1), [8, 8], (1.0, 1, 2, 3, 4), 0, 0, 0)
    assert calls[0][:5] == (function, (4, 1, 1), (32, 2, 1), 128, None)
    assert calls[0][5] == [struct.pack("<f", 0.5), *(struct.pack("<Q", v) for v in (16, 32, 48)),
                           struct.pack("<i", 7)]
    assert calls[1][:5] == (function, (2, 3, 4), (64, 1, 1), 0, 0x55)
    assert calls[2][1:3] == ((5, 1, 1), (8, 8, 1)) and type(calls[2][1][0]) is int
    launch(99, 1, (0.5, 0, 0, 0, 1), 0, 0, 0)  # a result code other than success
    assert refused == [(99, 1, 0)]
    with pytest.raises(struct.error):  # explained (here: recorded), then raised as it was
        launch(1, 1, (0.5, 0, 0, 0, "7"), 0, 0, 0)
    with pytest.raises(TypeError):
        launch((4.0, 1, 1), 1, (0.5, 0, 0, 0, 7), 0, 0, 0)
    assert len(explained) == 2 and isinstance(explained[0], struct.error) and len(calls) == 4
    hooks.append(print)  # the launcher holds the list: registering a hook reaches it at once
    launch(1, 1, (0.5, 0, 0, 0, 7), 0, 0x66, 0)
    assert hooked == [0x66] and len(calls) == 5
    here = plan.thread_buffers()
    assert plan.thread_buffers() is here
    there = []
    worker = threading.Thread(target=lambda: there.append(plan.thread_buffers()))
    worker.start()
    worker.join()
    assert there[0][1] != here[1]  # another thread, another buffer
    assert not compiled or not c_driver.errors


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
        (dict(grid=1, block=2048), ValueError, "a block holds at most 1024 threads, got 2048"),
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


def test_hot_path_reads_the_state_the_accessors_read():
    """Kernel.__call__ reads the per-thread state (gpurt/_core/state.py) in place."""
    streams_module = sys.modules["gpurt.streams"]
    assert glaunch.THREAD is state.THREAD
    handles = glaunch.THREAD.streams.handles
    handles[7] = 0x99
    try:
        assert streams_module.current_stream_handle(7) == 0x99
    finally:
        del handles[7]
    assert streams_module.current_stream_handle(7) == 0


def test_kernel_repr_and_lookup_errors(decls):
    assert "tk<float, 4>(float a, float* b" in repr(decls["tk<float, 4>"])
    with pytest.raises(KeyError, match="name expressions"):
        decls["tk<int, 4>"]


@pytest.mark.skipif(gpurt.is_available(), reason="checks the no-GPU error")
def test_launch_without_gpu_raises_clearly(decls):
    with pytest.raises(gpurt.CudaUnavailableError):
        decls["noargs"](1, 1, ())


# ---- on the GPU --------------------------------------------------------------------------------

GPU_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
struct Pair { int a; double b; };

extern "C" __global__ void axpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}

extern "C" __global__ void echo(unsigned long long* out, const float* p, const float* maybe_null,
                                float f, double d, int i, unsigned long long u, short s,
                                bool flag, __half h, __nv_bfloat16 bf, float2 v, Pair pair) {
    out[0] = (unsigned long long)p;
    out[1] = maybe_null == nullptr;
    out[2] = __float_as_uint(f);
    out[3] = (unsigned long long)__double_as_longlong(d);
    out[4] = (unsigned long long)(long long)i;
    out[5] = u;
    out[6] = (unsigned long long)(long long)s;
    out[7] = flag;
    out[8] = __half_as_ushort(h);
    out[9] = __bfloat16_as_ushort(bf);
    out[10] = __float_as_uint(v.x);
    out[11] = __float_as_uint(v.y);
    out[12] = (unsigned long long)(long long)pair.a;
    out[13] = (unsigned long long)__double_as_longlong(pair.b);
}

extern "C" __global__ void rowsum_shared(const float* x, float* out, int n) {
    extern __shared__ float row[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = x[(size_t)blockIdx.x * n + i];
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int i = n - 1; i >= 0; --i) total += row[i];  // reads what other threads wrote
        out[blockIdx.x] = (float)total;
    }
}

extern "C" __global__ void grid_shift(const int* in, int* tmp, int* out) {
    cg::grid_group grid = cg::this_grid();
    unsigned long long i = grid.thread_rank(), total = grid.size();
    tmp[i] = in[i] * 2;
    grid.sync();  // every block's tmp is written before anyone reads a neighbour's
    out[i] = tmp[(i + 1) % total];
}

extern "C" __global__ void __launch_bounds__(128) bounded(int* out) {
    out[threadIdx.x] = threadIdx.x;
}

extern "C" __global__ void cluster_ids(unsigned* out) {
    unsigned rank, id;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(id));
    if (threadIdx.x == 0) { out[2 * blockIdx.x] = rank; out[2 * blockIdx.x + 1] = id; }
}

template <typename T> __global__ void scale(T* out, const T* x, T s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s;
}
"""
SCALES = ["scale<float>", "scale<double>"]


@pytest.fixture(scope="module")
def gpu_module():
    return gpurt.compile(GPU_SRC, name_expressions=SCALES)


def random(n, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def poisoned(n, dtype=np.float32):
    """A device array full of a value no kernel here writes (NaN / all ones)."""
    fill = np.nan if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max
    return gpurt.asarray(np.full(n, fill, dtype=dtype))


def blocks(n, threads=256):
    return (n + threads - 1) // threads


@pytest.mark.gpu
def test_axpy_against_numpy(gpu_module, gpu_state):
    n = 10007
    x, y = random(n, seed=1), random(n, seed=2)
    out = poisoned(n)
    gpu_module["axpy"](blocks(n), 256, (1.7, gpurt.asarray(x), gpurt.asarray(y), out, n))
    expected = np.float32(1.7).astype(np.float64) * x + y
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_every_argument_kind_arrives(gpu_module, gpu_state):
    x = gpurt.asarray(random(4))
    pair = struct.pack("<i4xd", -7, 2.5)
    out = poisoned(16, np.uint64)
    kernel = gpu_module["echo"]
    kernel(1, 1, (out, x, None, 0.1, 0.1, -5, 2**63 + 5, -3, True, 1.5, 3.0, (1.0, -2.0), pair))
    got = out.to_numpy()
    assert got[0] == x.ptr and got[1] == 1
    assert got[2] == np.float32(0.1).view(np.uint32)  # a Python float to float: float32
    assert got[3] == np.float64(0.1).view(np.uint64)
    assert got[4].view(np.int64) == -5 and got[5] == 2**63 + 5 and got[6].view(np.int64) == -3
    assert got[7] == 1 and got[8] == np.float16(1.5).view(np.uint16)
    assert got[9] == np.array(3.0, ml_dtypes.bfloat16).view(np.uint16)
    assert got[10] == np.float32(1.0).view(np.uint32)
    assert got[11] == np.float32(-2.0).view(np.uint32)
    assert got[12].view(np.int64) == -7 and got[13] == np.float64(2.5).view(np.uint64)
    # numpy scalars and a raw pointer
    kernel(1, 1, (out, x.ptr, x, np.float32(0.25), np.float64(-1.0), np.int32(9), np.uint64(1),
                  np.int16(2), np.bool_(False), np.float16(-0.5), 1.0, (0.0, 0.0), pair))
    got = out.to_numpy()
    assert got[0] == x.ptr and got[1] == 0 and got[2] == np.float32(0.25).view(np.uint32)
    assert got[4] == 9 and got[7] == 0 and got[8] == np.float16(-0.5).view(np.uint16)


@pytest.mark.gpu
def test_templates_against_numpy(gpu_module, gpu_state):
    n = 5000
    for expr, dtype in zip(SCALES, (np.float32, np.float64)):
        x = random(n, dtype, seed=3)
        out = poisoned(n, dtype)
        gpu_module[expr](blocks(n), 256, (out, gpurt.asarray(x), 0.3, n))
        np.testing.assert_allclose(out.to_numpy(), x * dtype(0.3), rtol=1e-6)


@pytest.mark.gpu
def test_torch_and_cupy_arrays(gpu_module, gpu_state):
    n = 4097
    x, y = random(n, seed=4), random(n, seed=5)
    expected = np.float32(0.5).astype(np.float64) * x + y
    ran = 0
    torch = _maybe("torch")
    if torch is not None:
        tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        tout = torch.full((n,), float("nan"), device="cuda")
        gpu_module["axpy"](blocks(n), 256, (0.5, tx, ty, tout, n))
        np.testing.assert_allclose(tout.cpu().numpy(), expected, rtol=1e-6, atol=1e-6)

        class OnlyDLPack:  # a producer with __dlpack__ but no __cuda_array_interface__
            def __init__(self, tensor):
                self.tensor = tensor

            def __dlpack__(self, **kwargs):
                return self.tensor.__dlpack__(**kwargs)

            def __dlpack_device__(self):
                return self.tensor.__dlpack_device__()

        tout.fill_(float("nan"))
        gpu_module["axpy"](blocks(n), 256, (0.5, OnlyDLPack(tx), ty, tout, n))
        np.testing.assert_allclose(tout.cpu().numpy(), expected, rtol=1e-6, atol=1e-6)
        ran += 1
    cupy = _maybe("cupy")
    if cupy is not None:
        cx, cy = cupy.asarray(x), cupy.asarray(y)
        cout = cupy.full(n, cupy.nan, dtype=cupy.float32)
        gpu_module["axpy"](blocks(n), 256, (0.5, cx, cy, cout, n))
        np.testing.assert_allclose(cupy.asnumpy(cout), expected, rtol=1e-6, atol=1e-6)
        ran += 1
    if not ran:
        pytest.skip("neither torch nor cupy is installed")


def _maybe(name):
    try:
        return __import__(name)
    except Exception:
        return None


@pytest.mark.gpu
def test_dynamic_shared_memory_above_48k(gpu_module, gpu_state):
    kernel = gpu_module["rowsum_shared"]
    optin = gpurt.get_device_properties().shared_memory_per_block_optin - kernel.shared_size_bytes
    n = min(24000, optin // 4)  # 96000 bytes where the device allows it
    assert n * 4 > 48 * 1024, "the device cannot test > 48 KiB of dynamic shared memory"
    rows = 6
    x = random(rows * n, seed=6)
    out = poisoned(rows)
    kernel(rows, 256, (gpurt.asarray(x), out, n), shared_mem=n * 4)
    expected = x.reshape(rows, n).astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-4, atol=1e-3)
    assert kernel.max_dynamic_shared_size_bytes >= n * 4
    small = 1000
    out2 = poisoned(rows)
    kernel(rows, 128, (gpurt.asarray(x[: rows * small]), out2, small), shared_mem=small * 4)
    assert kernel.max_dynamic_shared_size_bytes >= n * 4  # never lowered
    np.testing.assert_allclose(out2.to_numpy(),
                               x[: rows * small].reshape(rows, small).astype(np.float64).sum(1),
                               rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="dynamic shared memory"):
        kernel(1, 32, (gpurt.asarray(x), out, n), shared_mem=optin + 4096)


@pytest.mark.gpu
def test_shared_memory_limit_under_concurrent_launches(gpu_state):
    module = gpurt.compile(unique_rowsum())
    kernel = module["rowsum_shared"]
    optin = gpurt.get_device_properties().shared_memory_per_block_optin
    sizes = [n for n in (13000, 16000, 20000, 24000) if n * 4 <= optin]
    x = random(2 * max(sizes), seed=7)
    dx = gpurt.asarray(x)
    errors = []

    def run(n):
        try:
            gpurt.set_device(0)
            for _ in range(20):
                out = poisoned(2)
                kernel(2, 256, (dx, out, n), shared_mem=n * 4)
                expected = x[: 2 * n].reshape(2, n).astype(np.float64).sum(1)
                np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-4, atol=1e-3)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert kernel.max_dynamic_shared_size_bytes >= max(sizes) * 4


def unique_rowsum() -> str:
    """rowsum_shared in a program of its own, so its shared memory limit starts fresh."""
    start = GPU_SRC.index('extern "C" __global__ void rowsum_shared')
    end = GPU_SRC.index('extern "C" __global__ void grid_shift')
    return "// rowsum_shared alone\n" + GPU_SRC[start:end]


@pytest.mark.gpu
def test_cooperative_launch_syncs_the_grid(gpu_module, gpu_state):
    props = gpurt.get_device_properties()
    if not props.cooperative_launch:
        pytest.skip("the device has no cooperative launch")
    kernel = gpu_module["grid_shift"]
    per_sm = kernel.max_active_blocks_per_multiprocessor(256)
    assert per_sm >= 1
    grid = props.multi_processor_count * per_sm
    total = grid * 256
    data = np.random.default_rng(8).integers(-1000, 1000, total, dtype=np.int32)
    tmp, out = poisoned(total, np.int32), poisoned(total, np.int32)
    kernel.launch(gpurt.LaunchConfig(grid, 256, cooperative=True), gpurt.asarray(data), tmp, out)
    np.testing.assert_array_equal(out.to_numpy(), np.roll(data * 2, -1))
    with pytest.raises(gpurt.CudaError, match="COOPERATIVE"):
        kernel.launch(gpurt.LaunchConfig(grid * 4, 256, cooperative=True),
                      gpurt.asarray(np.zeros(total * 4, np.int32)), tmp, out)
    gpurt.synchronize()


@pytest.mark.gpu
def test_clusters_on_sm90(gpu_module, gpu_state):
    if gpurt.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90 or newer")
    kernel = gpu_module["cluster_ids"]
    for size in (2, 4):
        out = poisoned(16, np.uint32)
        kernel.launch(gpurt.LaunchConfig(8, 32, cluster=(size, 1, 1)), out)
        got = out.to_numpy().reshape(8, 2)
        np.testing.assert_array_equal(got[:, 0], np.arange(8) % size)  # %cluster_ctarank
        np.testing.assert_array_equal(got[:, 1], np.arange(8) // size)  # %clusterid.x
    out = poisoned(16, np.uint32)
    kernel(8, 32, (out,))  # without a cluster each block is its own cluster
    np.testing.assert_array_equal(out.to_numpy().reshape(8, 2)[:, 0], np.zeros(8))


@pytest.mark.gpu
def test_errors_are_raised_before_launch(gpu_module, gpu_state):
    kernel = gpu_module["axpy"]
    n = 256
    x = gpurt.asarray(random(n))
    out = poisoned(n)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        kernel(1, 256, (1.0, x, x, out))
    with pytest.raises(TypeError, match="args must be a tuple"):
        kernel(1, 256, x)
    with pytest.raises(TypeError, match=r"argument 4 \(n: int\)"):
        kernel(1, 256, (1.0, x, x, out, 256.0))
    with pytest.raises(TypeError, match=r"argument 1 \(x: const float\*\).*host"):
        kernel(1, 256, (1.0, np.zeros(n, np.float32), x, out, n))
    with pytest.raises(ValueError, match="1024 threads"):
        kernel(1, 2048, (1.0, x, x, out, n))
    with pytest.raises(ValueError, match="grid"):
        kernel(0, 256, (1.0, x, x, out, n))
    with pytest.raises(TypeError, match="grid"):
        kernel((1.0, 1, 1), 256, (1.0, x, x, out, n))
    with pytest.raises(ValueError, match="'bounded' runs at most 128 threads per block"):
        gpu_module["bounded"](1, 256, (out,))
    gpurt.synchronize()
    assert np.isnan(out.to_numpy()).all()  # nothing ran
    if gpurt.device_count() > 1:
        with gpurt.device(1):
            other = gpurt.asarray(random(n))
        with pytest.raises(ValueError, match=r"argument 1 \(x: const float\*\).*cuda:1"):
            kernel(1, 256, (1.0, other, x, out, n))


@pytest.mark.gpu
def test_default_stream_is_the_current_stream(gpu_module, gpu_state):
    kernel = gpu_module["scale<float>"]
    n = 1024
    x = gpurt.asarray(random(n, seed=9))
    seen = []

    def hook(k, handle, phase):
        seen.append((k, handle, phase))

    gpurt.add_launch_hook(hook)
    try:
        kernel(blocks(n), 256, (poisoned(n), x, 2.0, n))
        with gpurt.Stream() as side:
            out = poisoned(n)
            kernel(blocks(n), 256, (out, x, 2.0, n))
            side.synchronize()
            np.testing.assert_allclose(out.to_numpy(), x.to_numpy() * 2.0, rtol=1e-6)
        kernel(blocks(n), 256, (out, x, 3.0, n), stream=side)
        kernel(blocks(n), 256, (out, x, 4.0, n), stream=side.cuda_stream)
        side.synchronize()
    finally:
        gpurt.remove_launch_hook(hook)
    default = gpurt.current_stream().cuda_stream
    assert [(h, p) for _, h, p in seen] == [
        (default, "begin"), (default, "end"), (side.cuda_stream, "begin"),
        (side.cuda_stream, "end"), (side.cuda_stream, "begin"), (side.cuda_stream, "end"),
        (side.cuda_stream, "begin"), (side.cuda_stream, "end")]
    assert all(k is kernel for k, _, _ in seen)
    np.testing.assert_allclose(out.to_numpy(), x.to_numpy() * 4.0, rtol=1e-6)


@pytest.mark.gpu
def test_threads_launch_at_once(gpu_module, gpu_state):
    kernel = gpu_module["scale<float>"]
    n = 2048
    x = random(n, seed=10)
    dx = gpurt.asarray(x)
    errors = []

    def run(factor):
        try:
            outs = [poisoned(n) for _ in range(4)]
            for i in range(50):
                kernel(blocks(n), 256, (outs[i % 4], dx, float(factor), n))
            gpurt.synchronize()
            for out in outs:
                np.testing.assert_allclose(out.to_numpy(), x * np.float32(factor), rtol=1e-6)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f,)) for f in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.gpu
def test_attributes_and_occupancy(gpu_module, gpu_state):
    kernel = gpu_module["axpy"]
    attrs = kernel.attributes()
    assert set(attrs) >= {"num_regs", "shared_size_bytes", "const_size_bytes",
                          "local_size_bytes", "max_threads_per_block"}
    assert 0 < kernel.num_regs <= 255 and 0 < kernel.max_threads_per_block <= 1024
    major, minor = gpurt.get_device_capability()
    assert kernel.binary_version == major * 10 + minor
    assert 1 <= kernel.max_active_blocks_per_multiprocessor(256) <= 2048 // 256
    block = kernel.suggested_block_size()
    assert block % 32 == 0 and 0 < block <= 1024
    assert gpu_module["rowsum_shared"].max_active_blocks_per_multiprocessor(256, 64 * 1024) >= 1
    # set_attribute: a settable one takes; the dynamic shared memory limit is refused
    attr = cu.CUfunction_attribute
    kernel.set_attribute(attr.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50)
    assert kernel.attribute(attr.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT) == 50
    with pytest.raises(ValueError, match="shared_mem"):
        kernel.set_attribute(attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024)
    if major >= 9:  # clusters: pairs fit; a size past 8 once the kernel allows it
        assert kernel.max_active_clusters(gpurt.LaunchConfig(2, 256, cluster=2)) >= 1
        wide = gpurt.LaunchConfig(16, 128, cluster=16)
        kernel.set_attribute(attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        assert kernel.max_active_clusters(wide) >= 1


@pytest.mark.gpu
def test_occupancy_allows_the_shared_memory_it_is_asked_about(gpu_state):
    """A fresh kernel asked about 64 KiB of dynamic shared memory (past the 48 KiB default)
    answers as a launch with that much would run, not 0."""
    module = gpurt.compile(f"// {uuid.uuid4()}\n" + GPU_SRC)
    assert module["rowsum_shared"].max_active_blocks_per_multiprocessor(256, 64 * 1024) >= 1


@pytest.mark.gpu
def test_ptx_module_runs(gpu_state):
    major, minor = gpurt.get_device_capability()
    module = gpurt.compile(GPU_SRC, arch=f"compute_{major}{minor}")
    n = 300
    x, y = random(n, seed=11), random(n, seed=12)
    out = poisoned(n)
    try:
        module["axpy"](blocks(n), 256, (2.0, gpurt.asarray(x), gpurt.asarray(y), out, n))
    except gpurt.CudaError as err:
        if err.name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION":
            pytest.skip(f"NVRTC is newer than the driver: {err}")
        raise
    np.testing.assert_allclose(out.to_numpy(), 2.0 * x.astype(np.float64) + y, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_unloadable_cache_entry_is_recompiled(tmp_path, monkeypatch, gpu_state):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GPURT_CACHE_DISABLE", raising=False)
    source = f"// {tmp_path.name}\n" + GPU_SRC
    module = gpurt.compile(source)
    [entry] = tmp_path.glob("*.kernel")
    good = module.code
    bad = _kcache.Entry(b"\x7fELF" + b"\x00" * 256, "cubin", {}, "")  # whole, but unloadable
    entry.write_bytes(_kcache.encode(entry.stem, bad))
    nvrtc.clear_cache()
    try:
        module = gpurt.compile(source)
        assert module.code == bad.binary
        n = 64
        out = poisoned(n)
        x = random(n, seed=13)
        module["axpy"](1, 64, (1.0, gpurt.asarray(x), gpurt.asarray(x), out, n))
        np.testing.assert_allclose(out.to_numpy(), 2.0 * x, rtol=1e-6)
        assert module.code == good
        assert _kcache.decode(entry.stem, entry.read_bytes()).binary == good
    finally:
        nvrtc.clear_cache()


@pytest.mark.gpu
def test_each_device_loads_its_own_function(gpu_module, gpu_state):
    if gpurt.device_count() < 2:
        pytest.skip("needs two GPUs")
    kernel = gpu_module["scale<float>"]
    n = 512
    x = random(n, seed=14)
    for index in range(2):
        with gpurt.device(index):
            out = poisoned(n)
            kernel(blocks(n), 256, (out, gpurt.asarray(x), 5.0, n))
            np.testing.assert_allclose(out.to_numpy(), x * np.float32(5.0), rtol=1e-6)
