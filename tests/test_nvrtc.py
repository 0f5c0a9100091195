"""gpurt.nvrtc: compiling with NVRTC (real, on the CPU) and every path of the kernel caches.

Everything here runs without a GPU: an explicit ``arch`` makes NVRTC compile ahead of time.
Launch tests live in test_launch.py."""

from __future__ import annotations

import collections
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import uuid
import warnings

import pytest

import gpurt
from gpurt import nvrtc as gnvrtc
from gpurt._nvrtc import cache as _kcache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpurt.__file__)))

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

TEMPLATES = r"""
template <typename T, int N>
__global__ void scale(T* x, const T* __restrict__ y, T s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = y[i] * s * N;
}
namespace ns { template <class T> __global__ void fill(T* out, T value) { out[0] = value; } }
"""


def unique(source: str) -> str:
    """The same program with a comment that no earlier run has cached."""
    return f"// {uuid.uuid4().hex}\n{source}"


def sm_of(cubin: bytes) -> int:
    """The SM number a cubin's ELF header was built for: e_flags bits 8..15 in CUDA 13's
    ELF ABI (version byte 8), bits 0..7 in CUDA 12's (version 7)."""
    assert cubin[:4] == b"\x7fELF"
    flags = struct.unpack_from("<I", cubin, 48)[0]
    return flags & 0xFF if cubin[8] < 8 else (flags >> 8) & 0xFF


class NvrtcSpy:
    """Wraps cuda.bindings.nvrtc and counts the calls gpurt makes (the real calls run)."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> object:
        fn = getattr(self.real, name)
        if not name.startswith("nvrtc") or not callable(fn):
            return fn

        def counted(*args: object) -> object:
            self.calls[name] += 1
            return fn(*args)

        return counted


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder and empty in-process caches for one test."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("GPURT_CACHE_DIR", str(folder))
    monkeypatch.delenv("GPURT_CACHE_DISABLE", raising=False)
    monkeypatch.setattr(_kcache, "_unusable", set())
    monkeypatch.setattr(_kcache, "_warned", False)
    gnvrtc.clear_cache()
    yield folder
    gnvrtc.clear_cache()


@pytest.fixture
def spy(monkeypatch):
    recorder = NvrtcSpy(gnvrtc._nvrtc)
    monkeypatch.setattr(gnvrtc, "_nvrtc", recorder)
    return recorder


def entries(folder) -> list:
    return sorted(p for p in folder.iterdir() if p.suffix == ".kernel") if folder.exists() else []


# ---- compiling ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch, sm", [("sm_80", 80), ("sm_90", 90), ("sm_90a", 90), ("sm_86", 86)])
def test_cubin_for_each_arch(cache, arch, sm):
    module = gpurt.compile(SAXPY, arch=arch)
    assert module.kind == "cubin" and module.arch == arch
    assert sm_of(module.code) == sm


def test_sm_90a_unlocks_hopper_instructions(cache):
    source = 'extern "C" __global__ void f() { asm volatile("wgmma.fence.sync.aligned;"); }'
    assert gpurt.compile(source, arch="sm_90a").kind == "cubin"
    with pytest.raises(gpurt.CompileError):
        gpurt.compile(source, arch="sm_90")


@pytest.mark.parametrize("call", [dict(arch="compute_90"), dict(arch="sm_90", ptx=True)])
def test_ptx(cache, call):
    module = gpurt.compile(SAXPY, **call)
    assert module.kind == "ptx" and module.arch == "compute_90"
    text = module.code.rstrip(b"\0").decode()
    assert ".target sm_90" in text and ".entry saxpy" in text


def test_arch_forms_and_errors(cache):
    by_option = gpurt.compile(SAXPY, options=["-arch=sm_80"])
    assert by_option is gpurt.compile(SAXPY, arch="sm_80")
    assert gpurt.compile(SAXPY, options=("--gpu-architecture", "sm_80")) is by_option
    assert gpurt.compile(SAXPY, arch="80") is by_option
    with pytest.raises(ValueError, match="sm_9"):
        gpurt.compile(SAXPY, arch="hopper")
    with pytest.raises(ValueError, match="conflicts"):
        gpurt.compile(SAXPY, options=["-arch=sm_80"], arch="sm_90")


@pytest.mark.skipif(gpurt.is_available(), reason="checks the no-GPU error")
def test_default_arch_needs_a_gpu(cache):
    with pytest.raises(gpurt.CudaUnavailableError, match="arch="):
        gpurt.compile(SAXPY)


def test_cpp17_is_default_and_overridable(cache):
    source = 'extern "C" __global__ void f(int* x) { if constexpr (sizeof(int) == 4) x[0] = 1; }'
    assert gpurt.compile(source, arch="sm_90").kind == "cubin"
    with pytest.raises(gpurt.CompileError):
        gpurt.compile(source, options=["-std=c++11"], arch="sm_90")


def test_templates_and_name_expressions(cache):
    exprs = ["scale<float, 128>", "scale<double, 2>", "ns::fill<int>"]
    module = gpurt.compile(TEMPLATES, name_expressions=exprs, arch="sm_90")
    assert set(module.lowered_names) == set(exprs)
    assert module.lowered_names["scale<float, 128>"] == "_Z5scaleIfLi128EEvPT_PKS0_S0_i"
    kernel = module["scale<float, 128>"]
    assert kernel is module.get_function("scale<float, 128>")
    assert [(p.name, p.type, p.kind) for p in kernel.params] == [
        ("x", "float*", "pointer"), ("y", "const float*", "pointer"),
        ("s", "float", "scalar"), ("n", "int", "scalar")]
    assert [p.fmt for p in module["scale<double, 2>"].params] == ["Q", "Q", "d", "i"]
    assert [p.fmt for p in module["ns::fill<int>"].params] == ["Q", "i"]
    with pytest.raises(KeyError, match="name_expressions"):
        module["scale<int, 1>"]


@pytest.mark.parametrize("source", [b'extern "C" __global__ void f() {}', None, 3,
                                    ['extern "C" __global__ void f() {}']])
def test_a_source_that_is_not_a_str_is_a_type_error(cache, source):
    with pytest.raises(TypeError, match="source as a str"):
        gpurt.compile(source, arch="sm_90")
    assert entries(cache) == []  # refused before NVRTC ran


def test_bytes_are_told_to_be_decoded(cache):
    with pytest.raises(TypeError, match="decode the bytes first"):
        gpurt.compile(SAXPY.encode(), arch="sm_90")


@pytest.mark.parametrize("arch", ["sm_90", "compute_90"])
def test_a_missing_kernel_is_a_key_error_naming_the_kernels(cache, arch):
    """Known at the lookup, without a GPU: the cubin's symbol table (PTX: its .entry lines)
    lists the module's kernels."""
    source = SAXPY + 'extern "C" __global__ void other(int* x) { x[0] = helper(x[0]); }\n'
    source = "__device__ __noinline__ int helper(int v) { return v * 3; }\n" + source
    module = gpurt.compile(source, arch=arch)
    assert module["saxpy"] is module["saxpy"] and module["other"].name == "other"
    for missing in ("no_such_kernel", "helper", "saxp"):
        with pytest.raises(KeyError) as caught:
            module[missing]
        assert caught.value.args[0].startswith(
            f"no kernel '{missing}' in this module; its kernels are: 'other', 'saxpy' (C++")


def test_kernels_by_mangled_name_and_unparsable_code(cache):
    from gpurt._launch.module import entry_names
    module = gpurt.compile(TEMPLATES, name_expressions=["scale<float, 128>"], arch="sm_90")
    assert module["_Z5scaleIfLi128EEvPT_PKS0_S0_i"].symbol == "_Z5scaleIfLi128EEvPT_PKS0_S0_i"
    with pytest.raises(KeyError) as caught:
        module["scale"]  # a C++ kernel: its plain name is not its symbol
    assert "its kernels are: '_Z5scaleIfLi128EEvPT_PKS0_S0_i'" in caught.value.args[0]
    assert entry_names(module.code[:100], "cubin") is None  # cut short: the driver will tell
    assert entry_names(b"not an ELF at all", "cubin") is None
    assert entry_names(b"", "ptx") == frozenset()


@pytest.mark.parametrize("option", [
    "-dlto", "--dlink-time-opt", "-rdc=true", "--relocatable-device-code=true", "-rdc", "-dc",
    "--device-c"])
def test_options_that_need_linking_are_refused_before_compiling(cache, option):
    with pytest.raises(ValueError, match="must be linked .* gpurt.Linker"):
        gpurt.compile(SAXPY, options=[option], arch="sm_90")
    assert entries(cache) == []


@pytest.mark.parametrize("option", ["--ptx", "-fatbin", "--fdevice-syntax-only"])
def test_options_that_change_the_output_kind_are_refused(cache, option):
    with pytest.raises(ValueError, match="kind of output"):
        gpurt.compile(SAXPY, options=[option], arch="sm_90")


def test_relocatable_code_off_is_fine(cache):
    module = gpurt.compile(SAXPY, options=["-rdc=false"], arch="sm_90")
    assert module.kind == "cubin" and len(module.code) > 0 and module["saxpy"]


def test_in_memory_headers(cache):
    source = '#include "params.h"\nextern "C" __global__ void f(float* x) { x[0] = SCALE; }'
    module = gpurt.compile(source, headers={"params.h": "#define SCALE 2.0f"}, arch="sm_90")
    assert module.kind == "cubin"
    with pytest.raises(gpurt.CompileError) as info:
        gpurt.compile(source, headers=[("params.h", "#define SCALE oops")], arch="sm_90")
    assert "params.h" in str(info.value) and "oops" in str(info.value)


def test_include_paths_and_header_changes(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(_kcache, "_RECHECK_S", 0.0)
    include = tmp_path / "inc"
    (include / "sub").mkdir(parents=True)
    header = include / "sub" / "value.h"
    header.write_text("#define VALUE 1\n")
    source = '#include "sub/value.h"\nextern "C" __global__ void f(int* x) { x[0] = VALUE; }'
    first = gpurt.compile(source, include_paths=[include], arch="sm_90")
    assert gpurt.compile(source, include_paths=[str(include)], arch="sm_90") is first
    header.write_text("#define VALUE 2\n")
    second = gpurt.compile(source, include_paths=[include], arch="sm_90")
    assert second is not first and second.code != first.code
    assert len(entries(cache)) == 2
    by_option = gpurt.compile(source, options=[f"-I{include}"], arch="sm_90")
    assert by_option is second  # an -I option is an include path too, fingerprinted alike
    assert gpurt.compile(source, options=["-I", str(include)], arch="sm_90") is second


def test_cuda_headers_from_the_wheels(cache):
    source = r"""
    #include <cuda_fp16.h>
    #include <cuda_bf16.h>
    #include <cuda/std/cstdint>
    extern "C" __global__ void f(__half* a, __nv_bfloat16 b, cuda::std::int64_t n) {
        a[0] = __float2half(__bfloat162float(b) + float(n));
    }"""
    kernel = gpurt.compile(source, arch="sm_90")["f"]
    assert [p.type for p in kernel.params] == ["__half*", "__nv_bfloat16", "cuda::std::int64_t"]
    assert [p.fmt for p in kernel.params] == ["Q", "H", "q"]


def test_an_empty_log_leaves_python_intact(cache):
    module = gpurt.compile(unique(SAXPY), arch="sm_90")  # NVRTC writes a 1-byte empty log
    assert module.log == ""
    assert bytes([32]) == b"\x20" and chr(32).encode() == b"\x20"  # CPython's shared b" "


def test_warnings_are_kept_in_the_log(cache):
    source = 'extern "C" __global__ void f(int* x) { int unused; x[0] = 1; }'
    module = gpurt.compile(source, arch="sm_90")
    assert "warning" in module.log and "unused" in module.log


# ---- errors --------------------------------------------------------------------------------


BROKEN = 'extern "C" __global__ void f(float* x) {\n    float y = 1.0f;\n    x[0] = z;\n}\n'


def test_compile_error_contents(cache):
    with pytest.raises(gpurt.CompileError) as info:
        gpurt.compile(BROKEN, options=["-DFOO=1"], arch="sm_90", program_name="broken.cu")
    err = info.value
    assert isinstance(err, gpurt.CudaError) and isinstance(err.__cause__, gpurt.CudaError)
    assert err.name == "NVRTC_ERROR_COMPILATION"
    assert 'identifier "z" is undefined' in err.log
    assert "-DFOO=1" in err.options and "-arch=sm_90" in err.options
    assert err.source == BROKEN
    text = str(err)
    assert "broken.cu(3)" in text
    assert ">    3 |     x[0] = z;" in text  # the offending line, numbered and marked
    assert "     2 |     float y = 1.0f;" in text  # with its context


def test_invalid_option_is_a_compile_error(cache):
    with pytest.raises(gpurt.CompileError) as info:
        gpurt.compile(SAXPY, options=["--no-such-option"], arch="sm_90")
    assert info.value.name == "NVRTC_ERROR_INVALID_OPTION"
    assert "no-such-option" in info.value.log


def test_missing_cuda_header_hint(cache):
    err = gnvrtc.CompileError(gpurt.CudaError(6, "NVRTC_ERROR_COMPILATION", "x"),
                              'k.cu(1): catastrophic error: could not open source file '
                              '"cuda_fp16.h"', "#include <cuda_fp16.h>\n", ["-arch=sm_90"], "k.cu")
    assert "nvidia-cuda-runtime" in str(err)


def test_programs_are_destroyed_on_every_path(cache, spy):
    for _ in range(5):
        with pytest.raises(gpurt.CompileError):
            gpurt.compile(unique(BROKEN), arch="sm_90")
        with pytest.raises(gpurt.CompileError):
            gpurt.compile(unique(SAXPY), options=["--bogus"], arch="sm_90")
        with pytest.raises(gpurt.CompileError):
            gpurt.compile(unique(TEMPLATES), name_expressions=["nothere<int>"], arch="sm_90")
    gpurt.compile(unique(SAXPY), arch="sm_90")
    assert spy.calls["nvrtcCreateProgram"] == 16
    assert spy.calls["nvrtcDestroyProgram"] == 16


def test_many_failing_compiles_do_not_leak(cache):
    def rss_mb() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    padding = "// padding so that a leaked program would show\n" * 4000
    for _ in range(3):
        with pytest.raises(gpurt.CompileError):
            gpurt.compile(unique(BROKEN + padding), arch="sm_90")
    before = rss_mb()
    for _ in range(60):
        with pytest.raises(gpurt.CompileError):
            gpurt.compile(unique(BROKEN + padding), arch="sm_90")
    assert rss_mb() - before < 8.0


# ---- the caches ------------------------------------------------------------------------------


def test_memory_hit_returns_the_same_module(cache, spy):
    first = gpurt.compile(SAXPY, arch="sm_90")
    assert gpurt.compile(SAXPY, arch="sm_90") is first
    assert spy.calls["nvrtcCompileProgram"] == 1
    assert gpurt.compile(SAXPY, arch="sm_80") is not first
    assert gpurt.compile(SAXPY, options=["-DX=1"], arch="sm_90") is not first
    assert spy.calls["nvrtcCompileProgram"] == 3


def test_disk_miss_then_hit(cache, spy):
    assert not cache.exists()  # created lazily
    module = gpurt.compile(SAXPY, name_expressions=["saxpy"], arch="sm_90")
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o700
    [entry] = entries(cache)
    assert (entry.stat().st_mode & 0o777) == 0o600
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    gnvrtc.clear_cache()  # forget the memory cache only
    again = gpurt.compile(SAXPY, name_expressions=["saxpy"], arch="sm_90")
    assert again is not module and again.code == module.code
    assert again.lowered_names == {"saxpy": "saxpy"}
    assert spy.calls["nvrtcCompileProgram"] == 1


def test_entry_format_is_header_plus_binary(cache):
    module = gpurt.compile(SAXPY, arch="sm_90")
    [entry] = entries(cache)
    data = entry.read_bytes()
    magic = b"GPURT-KERNEL-1\n"
    assert data.startswith(magic)
    size = int.from_bytes(data[len(magic): len(magic) + 4], "little")
    header = json.loads(data[len(magic) + 4: len(magic) + 4 + size])
    assert header["key"] == entry.stem and header["kind"] == "cubin"
    assert header["size"] == len(module.code)
    assert data.endswith(module.code)


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "other-key"])
def test_corrupt_entry_is_deleted_and_recompiled(cache, spy, damage):
    module = gpurt.compile(SAXPY, arch="sm_90")
    [entry] = entries(cache)
    data = entry.read_bytes()
    if damage == "flip":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = os.urandom(len(data))
    elif damage == "empty":
        data = b""
    else:  # a whole, valid entry, but stored under the wrong name
        data = data.replace(entry.stem.encode(), b"0" * len(entry.stem))
    entry.write_bytes(data)
    gnvrtc.clear_cache()
    again = gpurt.compile(SAXPY, arch="sm_90")
    assert again.code == module.code
    assert spy.calls["nvrtcCompileProgram"] == 2
    [rewritten] = entries(cache)
    assert _kcache.decode(rewritten.stem, rewritten.read_bytes()) is not None


def test_unwritable_dir_warns_once_and_uses_memory(cache, tmp_path, monkeypatch, spy):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GPURT_CACHE_DIR", str(blocker / "kernels"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = gpurt.compile(unique(SAXPY), arch="sm_90")
        second = gpurt.compile(unique(SAXPY), arch="sm_90")
        assert gpurt.compile(SAXPY, arch="sm_90") is gpurt.compile(SAXPY, arch="sm_90")
    relevant = [w for w in caught if "kernel cache" in str(w.message)]
    assert len(relevant) == 1 and issubclass(relevant[0].category, RuntimeWarning)
    assert str(blocker / "kernels") in str(relevant[0].message)
    assert first.kind == second.kind == "cubin"
    assert spy.calls["nvrtcCompileProgram"] == 3


def test_cache_disabled(cache, monkeypatch, spy):
    monkeypatch.setenv("GPURT_CACHE_DISABLE", "1")
    assert gnvrtc.cache_dir() is None
    gpurt.compile(SAXPY, arch="sm_90")
    gnvrtc.clear_cache()
    gpurt.compile(SAXPY, arch="sm_90")
    assert not cache.exists()
    assert spy.calls["nvrtcCompileProgram"] == 2


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("GPURT_CACHE_DIR", raising=False)
    monkeypatch.delenv("GPURT_CACHE_DISABLE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert gnvrtc.cache_dir() == str(tmp_path / "gpurt" / "kernels")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert gnvrtc.cache_dir() == os.path.expanduser("~/.cache/gpurt/kernels")


def test_toolchain_record_is_reused_and_revalidated(cache, monkeypatch):
    kspy = NvrtcSpy(_kcache._nvrtc)
    monkeypatch.setattr(_kcache, "_nvrtc", kspy)
    gpurt.compile(SAXPY, arch="sm_90")
    assert kspy.calls["nvrtcVersion"] == 1  # discovered, and recorded in the cache folder
    [record] = list(cache.glob("toolchain-*.json"))
    gnvrtc.clear_cache()  # forgets the in-process toolchain too
    gpurt.compile(unique(SAXPY), arch="sm_90")
    assert kspy.calls["nvrtcVersion"] == 1  # the record answered
    data = json.loads(record.read_text())
    data["stamps"].append(["/nonexistent/stamp", 1, 2])
    record.write_text(json.dumps(data))
    gnvrtc.clear_cache()
    gpurt.compile(unique(SAXPY), arch="sm_90")
    assert kspy.calls["nvrtcVersion"] == 2  # a stale record: discovered again
    assert json.loads(record.read_text())["stamps"] != data["stamps"]


CHILD_COMPILE = """
import json, sys
import cuda.bindings.nvrtc as real
import gpurt
from gpurt import nvrtc

class NoCompile:  # the second process must be served from disk without compiling
    def __getattr__(self, name):
        if name == "nvrtcCompileProgram":
            raise AssertionError("compiled on a disk hit")
        return getattr(real, name)

if sys.argv[1] == "hit":
    nvrtc._nvrtc = NoCompile()
m = gpurt.compile(sys.argv[2], name_expressions=["scale<float, 128>"], arch="sm_90")
k = m["scale<float, 128>"]
print(json.dumps([m.lowered_names, [p.type for p in k.params], len(m.code)]))
"""


def test_disk_hit_in_a_fresh_process_resolves_lowered_names(cache):
    env = {**os.environ, "GPURT_CACHE_DIR": str(cache), "PYTHONPATH": ROOT}
    outputs = []
    for mode in ("miss", "hit"):
        done = subprocess.run([sys.executable, "-c", CHILD_COMPILE, mode, TEMPLATES], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1]
    assert outputs[1][0] == {"scale<float, 128>": "_Z5scaleIfLi128EEvPT_PKS0_S0_i"}
    assert outputs[1][1] == ["float*", "const float*", "float", "int"]


def test_concurrent_processes_share_one_entry(cache):
    env = {"GPURT_CACHE_DIR": str(cache)}
    source = unique(TEMPLATES)
    code = f"""
        import hashlib, gpurt
        from gpurt import nvrtc
        for _ in range(4):
            nvrtc.clear_cache()  # re-read the disk entry while the others write it
            m = gpurt.compile({source!r}, name_expressions=["scale<float, 128>"], arch="sm_90")
        print(hashlib.sha256(m.code).hexdigest(), m.lowered_names["scale<float, 128>"])
    """
    full_env = {**os.environ, **env, "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        assert "Warning" not in err, err
        outputs.append(out.strip())
    assert len(set(outputs)) == 1
    [entry] = entries(cache)
    assert _kcache.decode(entry.stem, entry.read_bytes()) is not None
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


def test_cache_folder_removed_while_running(cache, spy):
    gpurt.compile(unique(SAXPY), arch="sm_90")
    shutil.rmtree(cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not usable" warning: the folder is made again
        gpurt.compile(unique(SAXPY), arch="sm_90")
    assert len(entries(cache)) == 1


def test_clear_cache_on_disk(cache):
    gpurt.compile(SAXPY, arch="sm_90")
    assert entries(cache)
    gnvrtc.clear_cache(disk=True)
    assert not entries(cache)


# ---- compile_file and RawKernel ------------------------------------------------------------


def test_compile_file_cubin_and_ptx(cache, tmp_path):
    (tmp_path / "local.h").write_text("#define TWO 2\n")
    source = tmp_path / "k.cu"
    source.write_text('#include "local.h"\nextern "C" __global__ void k(int* x) { x[0] = TWO; }\n')
    cubin = gnvrtc.compile_file(str(source), "sm_90")
    assert cubin == str(tmp_path / "k.cubin") and sm_of(open(cubin, "rb").read()) == 90
    ptx = gnvrtc.compile_file(str(source), "compute_80", ["-lineinfo"], str(tmp_path / "out.ptx"))
    text = open(ptx, "rb").read()
    assert ptx == str(tmp_path / "out.ptx") and b"\0" not in text and b".target sm_80" in text
    source.write_text("this is not CUDA\n")
    with pytest.raises(gpurt.CompileError, match="k.cu"):
        gnvrtc.compile_file(str(source), "sm_90")


def test_raw_kernel_compiles_lazily(cache, spy):
    kernel = gpurt.RawKernel(TEMPLATES, "scale<float, 4>", arch="sm_90")
    assert spy.calls["nvrtcCompileProgram"] == 0
    assert kernel.kernel.symbol == "_Z5scaleIfLi4EEvPT_PKS0_S0_i"
    assert kernel.kernel is kernel.kernel and spy.calls["nvrtcCompileProgram"] == 1
    plain = gpurt.RawKernel(SAXPY, "saxpy", arch="sm_90")
    assert plain.kernel.symbol == "saxpy"
    assert [p.name for p in plain.kernel.params] == ["a", "x", "y", "n"]
