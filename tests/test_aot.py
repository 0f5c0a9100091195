"""Ahead-of-time code: load_module (cubin, PTX, fatbin, LTO-IR), fatbins from compile(arch=[...]),
Linker/link over nvJitLink, the prebuilt archive and its use by compile(). The CPU tests need
NVRTC, nvJitLink and nvFatbin only; the GPU tests launch what they load or link."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

import gpurt
from gpurt import nvrtc as gnvrtc
from gpurt._nvrtc import archive as _archive
from gpurt._nvrtc import cache as _kcache
from gpurt._nvrtc import images as _images
from gpurt._nvrtc import prebuilt as _registry

INC = r"""
extern "C" __global__ void inc(float* x, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += by;
}
"""
CALLER = r"""
extern __device__ float twice(float v);
extern "C" __global__ void apply(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = twice(x[i]) + 1.0f;
}
"""
CALLEE = "__device__ float twice(float v) { return 2.0f * v; }\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private kernel cache folder, empty in-process caches, no registered archives."""
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("GPURT_CACHE_DISABLE", raising=False)
    gnvrtc.clear_cache()
    saved = _registry.archives()
    _registry.clear()
    yield tmp_path
    _registry.clear()
    for archive in saved:
        _registry.add_archive(archive.path)
    gnvrtc.clear_cache()


# ---- describing and loading ----------------------------------------------------------------


def test_describe_tells_each_kind_and_its_arch(cache):
    cubin = gpurt.compile(INC, arch="sm_86").code
    assert _images.describe(cubin) == _images.Image("cubin", ("sm_86",))
    ptx = gpurt.compile(INC, arch="compute_80").code
    assert _images.describe(ptx).kind == "ptx" and _images.describe(ptx).archs == ("compute_80",)
    fat = gpurt.compile(INC, arch=["sm_80", "sm_90a"], ptx=True)
    image = _images.describe(fat.code)
    assert image.kind == "fatbin" and image.archs == ("sm_80", "sm_90a", "compute_90")
    assert len(image.members) == 2


@pytest.mark.parametrize("data, match", [
    (b"", "not device code"),
    (b"hello world, not code", "not device code"),
    (b"\x7fELF\x01\x01" + bytes(70), "64-bit"),
    (b"\x7fELF\x02\x01" + bytes(10) + struct.pack("<HH", 2, 62) + bytes(60), "another machine"),
])
def test_load_module_refuses_what_is_not_device_code(cache, data, match):
    with pytest.raises(ValueError, match=match):
        gpurt.load_module(data, arch="sm_90")


def test_truncated_cubin_and_fatbin_are_refused(cache):
    cubin = gpurt.compile(INC, arch="sm_90").code
    with pytest.raises(ValueError, match="cut short"):
        gpurt.load_module(cubin[:100], arch="sm_90")
    fat = gpurt.compile(INC, arch=["sm_80", "sm_90"]).code
    with pytest.raises(ValueError, match="cut short|past"):
        gpurt.load_module(fat[:len(fat) // 2], arch="sm_90")


def test_code_for_another_arch_names_both(cache):
    cubin = gpurt.compile(INC, arch="sm_90").code
    with pytest.raises(ValueError, match=r"sm_90, none of which runs on this device \(sm_80\)"):
        gpurt.load_module(cubin, arch="sm_80")
    with pytest.raises(ValueError, match="sm_86"):  # a newer minor than the device's
        gpurt.load_module(gpurt.compile(INC, arch="sm_86").code, arch="sm_80")
    fat = gpurt.compile(INC, arch=["sm_80", "sm_86"]).code
    with pytest.raises(ValueError, match=r"sm_80, sm_86, none of which runs .*\(sm_90\)"):
        gpurt.load_module(fat, arch="sm_90")
    assert gpurt.load_module(cubin, arch="sm_90").kind == "cubin"  # the same family
    with pytest.raises(ValueError, match="sm_90a"):  # arch-specific code: that arch only
        gpurt.load_module(gpurt.compile(INC, arch=["sm_90a"]).code, arch="sm_100")


def test_ptx_and_fatbin_with_ptx_run_forward(cache):
    ptx = gpurt.compile(INC, arch="compute_80").code
    assert gpurt.load_module(ptx, arch="sm_90").kind == "ptx"
    with pytest.raises(ValueError, match="compute_80"):
        gpurt.load_module(ptx, arch="sm_75")
    fat = gpurt.compile(INC, arch=["sm_80", "sm_90"], ptx=True).code
    assert gpurt.load_module(fat, arch="sm_120").kind == "fatbin"


def test_load_module_from_a_file_finds_kernels_by_name(cache):
    path = cache / "inc.cubin"
    path.write_bytes(gpurt.compile(INC, arch="sm_90").code)
    module = gpurt.load_module(path, arch="sm_90")
    assert module["inc"].name == "inc" and module.program_name == "inc.cubin"
    with pytest.raises(KeyError, match="no kernel .*missing.* its kernels are: .*inc"):
        module["missing"]
    fat = gpurt.load_module(gpurt.compile(INC, arch=["sm_80", "sm_90"]).code, arch="sm_90")
    with pytest.raises(KeyError, match="its kernels are: .*inc"):
        fat["missing"]


def test_load_module_refuses_links_fifos_and_huge_files(cache, monkeypatch):
    target = cache / "inc.cubin"
    target.write_bytes(gpurt.compile(INC, arch="sm_90").code)
    os.symlink(target, cache / "link.cubin")
    with pytest.raises(ValueError, match="symbolic link"):
        gpurt.load_module(cache / "link.cubin", arch="sm_90")
    os.mkfifo(cache / "fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        gpurt.load_module(cache / "fifo", arch="sm_90")
    monkeypatch.setattr(_images, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(ValueError, match="over the limit"):
        gpurt.load_module(str(target), arch="sm_90")
    with pytest.raises(TypeError, match="bytes or a path"):
        gpurt.load_module(12345, arch="sm_90")


# ---- fatbins --------------------------------------------------------------------------------


def test_fatbin_is_cached_and_its_parts_too(cache):
    first = gpurt.compile(INC, arch=["sm_80", "sm_90a"])
    assert first.kind == "fatbin" and first.arch == "sm_80,sm_90a"
    assert gpurt.compile(INC, arch=["sm_80", "sm_90a"]) is first
    gnvrtc.clear_cache()
    stored = len(list((cache / "kernels").glob("*.kernel")))
    again = gpurt.compile(INC, arch=["sm_80", "sm_90a"])
    assert again.code == first.code and stored == 2
    assert len(list((cache / "kernels").glob("*.kernel"))) == 2  # no new compile
    with pytest.raises(ValueError, match="names no architecture"):
        gpurt.compile(INC, arch=[])


def test_cli_compile_writes_a_fatbin(cache, capsys):
    from gpurt.__main__ import main
    source = cache / "inc.cu"
    source.write_text(INC)
    assert main(["compile", str(source), "--arch", "sm_80,sm_90a,sm_100", "--ptx"]) == 0
    image = _images.describe((cache / "inc.fatbin").read_bytes())
    assert image.archs == ("sm_80", "sm_90a", "sm_100", "compute_100")
    assert main(["compile", str(source), "--arch", "sm_80,bogus"]) == 2


# ---- linking -------------------------------------------------------------------------------


@pytest.mark.parametrize("lto", [False, True])
def test_link_sources_with_an_extern_device_function(cache, lto):
    module = gpurt.link([CALLER, CALLEE], arch="sm_90", lto=lto)
    assert module.kind == "cubin" and module["apply"].name == "apply"
    assert _images.describe(module.code) == _images.Image("cubin", ("sm_90",))
    assert gpurt.link([CALLER, CALLEE], arch="sm_90", lto=lto) is module  # memory cache


def test_linker_takes_files_of_every_kind(cache):
    callee = gpurt.Linker("sm_90", lto=True)
    callee.add_source(CALLEE)
    (cache / "callee.ltoir").write_bytes(callee._inputs[0][1])
    linker = gpurt.Linker("sm_90")
    linker.add_source(CALLER, program_name="caller.cu")
    linker.add_file(cache / "callee.ltoir")
    relocatable = gpurt.Linker("sm_90")
    relocatable.add_source(INC)
    linker.add_data(relocatable._inputs[0][1], "inc.cubin")
    module = linker.link()
    assert {"apply", "inc"} <= set(module._entries or ())
    with pytest.raises(ValueError, match="executable cubin"):
        linker.add_data(gpurt.compile(INC, arch="sm_90").code)


def test_link_errors_carry_the_log(cache):
    with pytest.raises(gnvrtc.LinkError, match="twice") as info:
        gpurt.link([CALLER], arch="sm_90")
    assert "twice" in info.value.log
    with pytest.raises(ValueError, match="nothing to link"):
        gpurt.Linker("sm_90").link()
    with pytest.raises(ValueError, match="not device code"):
        gpurt.Linker("sm_90").add_data(b"junk")


def test_load_module_links_ltoir_and_relocatable_code(cache):
    linker = gpurt.Linker("sm_90", lto=True)
    linker.add_source(INC)
    module = gpurt.load_module(linker._inputs[0][1], arch="sm_90")
    assert module.kind == "cubin" and module["inc"]
    rdc = gpurt.Linker("sm_90")
    rdc.add_source(INC)
    assert _images.describe(rdc._inputs[0][1]).relocatable
    assert gpurt.load_module(rdc._inputs[0][1], arch="sm_90")["inc"]


# ---- the prebuilt archive ------------------------------------------------------------------


def _archive_of(path, cache_programs):
    rows = []
    for source, exprs, arch in cache_programs:
        key, entry = gnvrtc.prebuild(source, (), exprs, arch=arch)
        rows.append((_archive.Program(key, arch, "kernel.cu", dict(entry.lowered)), entry.binary))
    _archive.write_archive(str(path), rows, {"table": {"x": 1}}, {"archs": ["sm_90"]})


def test_compile_takes_a_program_from_a_registered_archive(cache, monkeypatch):
    path = cache / "p.gpak"
    _archive_of(path, [(INC, (), "sm_90")])
    gnvrtc.clear_cache()
    gnvrtc.add_prebuilt(path)
    calls = []
    monkeypatch.setattr(gnvrtc, "_build", lambda *a: calls.append(a))
    module = gpurt.compile(INC, arch="sm_90")
    assert calls == [] and module["inc"] and module.kind == "cubin"
    assert _registry.table("table") == {"x": 1}


def test_archive_misses_compile_as_usual(cache):
    path = cache / "p.gpak"
    _archive_of(path, [(INC, (), "sm_90")])
    gnvrtc.add_prebuilt(path)
    assert gpurt.compile(INC, arch="sm_80")["inc"]  # another arch: not in the archive
    assert gpurt.compile(INC + "// changed\n", arch="sm_90")["inc"]  # another source


def test_archive_with_a_bad_digest_is_not_used(cache):
    path = cache / "p.gpak"
    _archive_of(path, [(INC, (), "sm_90")])
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # inside the compressed cubin: it no longer inflates to its digest
    path.write_bytes(bytes(data))
    gnvrtc.clear_cache()
    gnvrtc.add_prebuilt(path)
    with pytest.warns(RuntimeWarning, match="does not match its digest"):
        module = gpurt.compile(INC, arch="sm_90")
    assert module["inc"]  # compiled instead


@pytest.mark.parametrize("damage", ["magic", "version", "index", "length"])
def test_damaged_archives_are_refused(cache, damage):
    path = cache / "p.gpak"
    _archive_of(path, [(INC, (), "sm_90")])
    data = bytearray(path.read_bytes())
    if damage == "magic":
        data[0] ^= 1
    elif damage == "version":
        data[8] = 9
    elif damage == "index":
        data[60] ^= 1
    else:
        data[12:16] = (1 << 31).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        _archive.Archive(str(path)).programs()
    gnvrtc.add_prebuilt(path)
    with pytest.warns(RuntimeWarning, match="not usable"):
        assert gpurt.compile(INC, arch="sm_90")["inc"]


def test_a_cubin_that_inflates_past_its_size_is_refused(cache):
    """A compressed cubin is inflated to at most its recorded size (no zip bomb)."""
    path = cache / "p.gpak"
    big = b"\0" * (1 << 20)
    _archive.write_archive(str(path), [(_archive.Program("k", "sm_90", "p", {}), big)])
    archive = _archive.Archive(str(path))
    program = archive.programs()[0]
    assert program.stored < 10_000 and archive.read(program) == big
    import dataclasses
    assert archive.read(dataclasses.replace(program, size=1000)) is None


def test_index_rows_of_the_wrong_shape_are_skipped(cache):
    path = cache / "p.gpak"
    index = json.dumps({"format": 1, "programs": [{"key": 1}, "x", {"key": "k", "arch": "a",
                        "program": "p", "lowered": {}, "offset": 0, "stored": 10,
                        "size": 10 ** 12, "blake2b": ""}]}).encode()
    digest = __import__("hashlib").blake2b(index, digest_size=32).digest()
    path.write_bytes(b"GPURTKA\0" + (1).to_bytes(4, "little") + len(index).to_bytes(4, "little")
                     + digest + index)
    assert _archive.Archive(str(path)).programs() == []


def test_build_kernels_subset_and_the_tuning_table(cache, tmp_path):
    from gpurt.kernels import _gemm_tune as tune
    from gpurt.kernels import _gemm_tuner as tuning
    from gpurt.kernels import _prebuilt
    table = tmp_path / "tuned.json"
    config = tune.Config("simt", 64, 64, 8, stages=4)
    table.write_text(json.dumps({"schema": 1, "results": {
        "NVIDIA X|abc|fp32|KN|tma|64x64x64": {"config": config.to_json(), "ms": 0.5},
        "bad": {"config": {"kernel": "nope"}, "ms": 1}}}))
    out = tmp_path / "k.gpak"
    summary = _prebuilt.build(["sm_90a"], str(out), jobs=1, tuning=[str(table)], limit=1,
                              say=lambda line: None)
    assert summary["programs"] == 1 and summary["failed"] == 0
    programs = _archive.Archive(str(out)).programs()
    assert programs[0].program == "softmax.cu" and programs[0].arch == "sm_90"
    gnvrtc.add_prebuilt(out)
    defaults = _prebuilt.tuning_defaults()
    assert list(defaults) == ["NVIDIA X|abc|fp32|KN|tma|64x64x64"]
    tuner = tuning.Tuner(None)
    tuner.defaults = defaults
    assert tuner.lookup("NVIDIA X|abc|fp32|KN|tma|64x64x64") == config


def test_archive_path_follows_gpurt_prebuilt(monkeypatch, tmp_path):
    from gpurt.kernels import _prebuilt
    monkeypatch.setenv("GPURT_PREBUILT", "0")
    assert _prebuilt.archive_path() is None
    monkeypatch.setenv("GPURT_PREBUILT", str(tmp_path / "x.gpak"))
    assert _prebuilt.archive_path() == str(tmp_path / "x.gpak")
    monkeypatch.delenv("GPURT_PREBUILT")
    package = os.path.join(os.path.dirname(_prebuilt.__file__), _prebuilt.ARCHIVE_NAME)
    assert _prebuilt.archive_path() == (package if os.path.isfile(package) else None)


def test_cli_build_kernels_and_info_report(cache, monkeypatch, capsys):
    from gpurt.__main__ import main
    from gpurt._cli import info
    out = cache / "k.gpak"
    assert main(["build-kernels", "--arch", "sm_90a", "-j", "1", "--limit", "1", "-o",
                 str(out), "--tuning", str(cache / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err and not out.exists()
    assert main(["build-kernels", "--arch", "sm_90a", "-j", "1", "--limit", "1", "-o",
                 str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["programs"] == 1 and summary["output"] == str(out)
    with pytest.raises(SystemExit):
        main(["build-kernels", "--arch", "compute_90"])
    monkeypatch.setenv("GPURT_PREBUILT", str(out))
    report = info._prebuilt_info([{"index": 0, "arch": "sm_90", "name": "NVIDIA X"}])
    assert report["archive"] == str(out) and report["archs"] == ["sm_90a"]
    assert report["devices"]["0"]["programs"] == {"softmax.cu": 1}
    assert "cuda:0: 1 softmax.cu" in info._prebuilt_text(report)
    monkeypatch.setenv("GPURT_PREBUILT", "0")
    assert "none" in info._prebuilt_text(info._prebuilt_info([]))


def test_build_enumerates_variants_from_the_code():
    from gpurt.kernels import _gemm_launch, _prebuilt
    requests = _prebuilt.requests("sm_90a")
    assert set(_gemm_launch.programs("sm_90a")) <= set(requests)
    assert {arch for _, _, arch in requests} == {"sm_90", "sm_90a"}
    assert not any("wgmma" in name for name, _, _ in _prebuilt.requests("sm_80"))


# ---- on the GPU ----------------------------------------------------------------------------


def _run_inc(module):
    n = 1000
    host = np.random.default_rng().standard_normal(n).astype(np.float32)
    x = gpurt.asarray(host)
    # code loaded without its source has no parameter types: scalars as numpy scalars
    module["inc"]((n + 255) // 256, 256, (x, np.float32(1.5), n))
    np.testing.assert_allclose(x.to_numpy(), host.astype(np.float64) + 1.5, rtol=1e-6)


@pytest.mark.gpu
def test_loaded_cubin_ptx_and_fatbin_run(cache, gpu_state):
    arch = gpurt.get_arch()
    _run_inc(gpurt.load_module(gpurt.compile(INC, arch=arch).code))
    _run_inc(gpurt.load_module(gpurt.compile(INC, arch=["sm_80", arch]).code))
    fat = gpurt.compile(INC, arch=["sm_80", arch])
    path = cache / "inc.fatbin"
    path.write_bytes(fat.code)
    _run_inc(gpurt.load_module(path))


@pytest.mark.gpu
@pytest.mark.parametrize("lto", [False, True])
def test_linked_kernel_runs(cache, gpu_state, lto):
    module = gpurt.link([CALLER, CALLEE], lto=lto)
    n = 777
    host = np.random.default_rng().standard_normal(n).astype(np.float32)
    x = gpurt.asarray(host)
    module["apply"]((n + 127) // 128, 128, (x, n))
    np.testing.assert_allclose(x.to_numpy(), host.astype(np.float64) * 2 + 1, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(96, 80, 72), (256, 512, 384)])
def test_prebuilt_gemm_runs_without_nvrtc(cache, gpu_state, monkeypatch, tmp_path, shape):
    """gemm with its programs from an archive: the right answer, and NVRTC never runs."""
    import ml_dtypes

    from gpurt.kernels import _gemm_launch
    from gpurt.kernels.gemm import clear_plans, gemm
    m, k, n = shape
    rng = np.random.default_rng()

    def run() -> None:
        ha = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        hb = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
        c = gpurt.full((m, n), 7.0, dtype=ml_dtypes.bfloat16)  # poisoned
        gemm(gpurt.asarray(ha), gpurt.asarray(hb), out=c)
        want = ha.astype(np.float64) @ hb.astype(np.float64)
        np.testing.assert_allclose(c.to_numpy().astype(np.float64), want, rtol=2e-2,
                                   atol=1e-1 * np.sqrt(k) / 8)

    asked = []
    real_compile = gpurt.compile

    def spy(source, options=(), name_expressions=(), headers=None, *args, **kwargs):
        asked.append((source, tuple(options), tuple(name_expressions), headers, kwargs))
        return real_compile(source, options, name_expressions, headers, *args, **kwargs)

    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    monkeypatch.setattr(_gemm_launch, "_kernels", {})
    monkeypatch.setattr(gpurt, "compile", spy)
    clear_plans()
    run()  # JIT, recording the programs gemm compiles
    assert asked
    rows = []
    for source, options, names, headers, kwargs in asked:
        key, entry = gnvrtc.prebuild(source, options, names, headers, arch=kwargs["arch"],
                                     program_name=kwargs["program_name"])
        rows.append((_archive.Program(key, kwargs["arch"], kwargs["program_name"],
                                      dict(entry.lowered)), entry.binary))
    _archive.write_archive(str(tmp_path / "k.gpak"), rows)
    gnvrtc.clear_cache()
    gnvrtc.add_prebuilt(tmp_path / "k.gpak")
    monkeypatch.setattr(_gemm_launch, "_kernels", {})
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path / "empty"))

    def no_nvrtc(*args):
        raise AssertionError("NVRTC ran for a prebuilt program")

    monkeypatch.setattr(gnvrtc, "_build", no_nvrtc)
    clear_plans()
    run()
    clear_plans()
