"""The kernel cache against a hostile or damaged folder (issue #18): folder ownership and
mode, entries that are links, FIFOs, devices or too big, bad toolchain records, deep JSON,
the size limit and its LRU trimming, and `compile -o`'s output. CPU only (NVRTC runs here)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

from gpurt import nvrtc as gnvrtc
from gpurt._cli import info as _info
from gpurt._nvrtc import cache as _kcache

SOURCE = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder and empty in-process caches for one test."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("GPURT_CACHE_DIR", str(folder))
    monkeypatch.delenv("GPURT_CACHE_DISABLE", raising=False)
    monkeypatch.delenv("GPURT_CACHE_MAX_BYTES", raising=False)
    for name in ("_unusable", "_made", "_checked"):
        monkeypatch.setattr(_kcache, name, set())
    monkeypatch.setattr(_kcache, "_warned", False)
    gnvrtc.clear_cache()
    yield folder
    gnvrtc.clear_cache()


def unique() -> str:
    return f"// {uuid.uuid4().hex}\n{SOURCE}"


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.kernel"))


def compile_fresh(source: str) -> None:
    """Compile ``source`` as a fresh process would: the memory caches forgotten first."""
    gnvrtc.clear_cache()
    gnvrtc.compile(source, arch="sm_90")


def in_time(fn, limit: float = 60.0) -> None:
    """Run ``fn`` in a thread; fail (rather than hang the suite) when it does not return."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), "hung"
    if errors:
        raise errors[0]


# ---- the folder -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_loose_folder_is_refused_with_one_warning(cache: Path, mode: int) -> None:
    cache.mkdir()
    cache.chmod(mode)
    with pytest.warns(RuntimeWarning, match="writable by group or others") as caught:
        compile_fresh(unique())
        compile_fresh(unique())
    assert len([w for w in caught if "kernel cache" in str(w.message)]) == 1
    assert entries(cache) == []  # memory only


def test_a_folder_of_another_user_is_refused(cache: Path, monkeypatch) -> None:
    cache.mkdir(mode=0o700)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)
    with pytest.warns(RuntimeWarning, match="belongs to uid"):
        compile_fresh(unique())
    monkeypatch.setattr(os, "geteuid", lambda: real)
    assert entries(cache) == []


def test_a_forged_entry_in_a_loose_folder_is_never_loaded(cache: Path) -> None:
    source = unique()
    compile_fresh(source)
    (entry,) = entries(cache)
    entry.write_bytes(_kcache.encode(entry.stem, _kcache.Entry(b"forged", "ptx", {}, "")))
    cache.chmod(0o777)
    _kcache._checked.clear()
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        compile_fresh(source)  # compiled afresh: the forged entry would fail to load
    assert entry.read_bytes().endswith(b"forged")  # not read, not replaced


# ---- entries ----------------------------------------------------------------------------------


def replace_entry(cache: Path, source: str, make) -> Path:
    compile_fresh(source)
    (entry,) = entries(cache)
    entry.unlink()
    make(entry)
    return entry


def test_an_entry_linked_to_a_fifo_does_not_hang(cache: Path, tmp_path: Path) -> None:
    source = unique()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    entry = replace_entry(cache, source, lambda p: p.symlink_to(fifo))
    in_time(lambda: compile_fresh(source))
    assert stat.S_ISREG(os.lstat(entry).st_mode)  # the link was deleted, the entry rewritten


def test_an_entry_that_is_a_fifo_does_not_hang(cache: Path) -> None:
    source = unique()
    entry = replace_entry(cache, source, lambda p: os.mkfifo(p))
    in_time(lambda: compile_fresh(source))
    assert stat.S_ISREG(os.lstat(entry).st_mode)


def test_an_entry_linked_to_dev_zero_is_not_read(cache: Path) -> None:
    source = unique()
    entry = replace_entry(cache, source, lambda p: p.symlink_to("/dev/zero"))
    in_time(lambda: compile_fresh(source), 30.0)
    assert stat.S_ISREG(os.lstat(entry).st_mode)


def test_an_oversized_entry_is_deleted_and_recompiled(cache: Path, monkeypatch) -> None:
    source = unique()
    compile_fresh(source)
    (entry,) = entries(cache)
    size = entry.stat().st_size
    monkeypatch.setattr(_kcache, "_MAX_ENTRY", size - 1)
    assert _kcache.load(str(cache), entry.stem) is None
    assert not entry.exists()


def test_read_private_refuses_another_users_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert _kcache.read_private(str(path), 10) == b"x"
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    with pytest.raises(ValueError, match="regular file of this user"):
        _kcache.read_private(str(path), 10)


def test_a_deeply_nested_header_is_deleted_and_recompiled(cache: Path) -> None:
    source = unique()
    compile_fresh(source)
    (entry,) = entries(cache)
    head = b"[" * 200_000
    entry.write_bytes(_kcache._MAGIC + len(head).to_bytes(4, "little") + head)
    compile_fresh(source)
    assert _kcache.decode(entry.stem, entry.read_bytes()) is not None


@pytest.mark.parametrize("header", [
    [], {"lowered": []}, {"lowered": {"a": 1}}, {"lowered": {}, "log": 5}, "x", None,
])
def test_wrong_shaped_headers_decode_to_none(header) -> None:
    head = json.dumps(header).encode()
    assert _kcache.decode("k", _kcache._MAGIC + len(head).to_bytes(4, "little") + head) is None


# ---- the toolchain record ---------------------------------------------------------------------


@pytest.mark.parametrize("record", [
    {"stamps": []},
    {"nvrtc_version": [13, 0], "include_dirs": "/usr", "stamps": []},
    {"nvrtc_version": [13], "include_dirs": [], "stamps": []},
    {"nvrtc_version": [13, 0], "include_dirs": ["relative"], "stamps": []},
    {"nvrtc_version": [13, 0], "include_dirs": [], "stamps": [["/x", "1", None]]},
    {"nvrtc_version": [13, 0], "include_dirs": [], "stamps": [5]},
    [1, 2],
    "[" * 100_000,
])
def test_a_bad_toolchain_record_is_rebuilt(cache: Path, record) -> None:
    compile_fresh(unique())
    (path,) = cache.glob("toolchain-*.json")
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    compile_fresh(unique())  # no KeyError, no RecursionError
    assert _kcache._record_ok(json.loads(path.read_text()))


# ---- the size limit ---------------------------------------------------------------------------


def fake_entry(size: int) -> _kcache.Entry:
    return _kcache.Entry(os.urandom(size), "cubin", {}, "")


def test_least_recently_used_entries_go_past_the_limit(cache: Path, monkeypatch) -> None:
    folder = str(cache)
    monkeypatch.setenv("GPURT_CACHE_MAX_BYTES", "2600")
    for age, key in ((300, "a"), (200, "b")):
        _kcache.store(folder, key, fake_entry(1000))
        past = time.time() - age
        os.utime(_kcache.entry_path(folder, key), (past, past))
    assert _kcache.load(folder, "a") is not None  # a is now the most recently used
    _kcache.store(folder, "c", fake_entry(1000))
    assert sorted(p.stem for p in entries(cache)) == ["a", "c"]
    assert _kcache.disk_usage(folder) <= 2600


def test_trim_cleans_stale_temp_files_and_old_records(cache: Path) -> None:
    cache.mkdir(mode=0o700)
    stale, fresh = cache / ".tmp-stale", cache / ".tmp-fresh"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    for i in range(12):
        record = cache / f"toolchain-{i}.json"
        record.write_text("{}")
        os.utime(record, (1000 + i, 1000 + i))
    _kcache.trim(str(cache))
    assert not stale.exists() and fresh.exists()
    assert {p.name for p in cache.glob("toolchain-*")} == {
        f"toolchain-{i}.json" for i in range(4, 12)
    }


def test_the_limit_has_a_default_and_an_override(monkeypatch) -> None:
    monkeypatch.delenv("GPURT_CACHE_MAX_BYTES", raising=False)
    assert _kcache.max_bytes() == _kcache.DEFAULT_MAX_BYTES == 1 << 30
    monkeypatch.setenv("GPURT_CACHE_MAX_BYTES", "12345")
    assert _kcache.max_bytes() == 12345
    monkeypatch.setenv("GPURT_CACHE_MAX_BYTES", "lots")
    with pytest.warns(RuntimeWarning, match="GPURT_CACHE_MAX_BYTES"):
        assert _kcache.max_bytes() == 1 << 30


def test_info_shows_the_real_cache_folder_its_size_and_limit(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPURT_CACHE")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), GPURT_CACHE_MAX_BYTES="5000000",
               COLUMNS="200")
    out = subprocess.run([sys.executable, "-m", "gpurt", "info", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert report["kernel_cache"] == {"dir": str(tmp_path / "xdg" / "gpurt" / "kernels"),
                                      "bytes": 0, "limit": 5000000}
    text = subprocess.run([sys.executable, "-m", "gpurt", "info"], env=env,
                          capture_output=True, text=True, timeout=120).stdout
    assert "~/.cache/gpurt" not in text
    assert str(tmp_path / "xdg") in text and "4.8 MiB" in text


# ---- compile -o -------------------------------------------------------------------------------


def test_compile_output_never_follows_a_planted_link(cache: Path, tmp_path: Path) -> None:
    source = tmp_path / "k.cu"
    source.write_text(SOURCE)
    output = tmp_path / "k.cubin"
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / f"k.cubin.tmp-{os.getpid()}").symlink_to(victim)
    old = os.umask(0o022)
    try:
        assert gnvrtc.compile_file(str(source), "sm_90", output=str(output)) == str(output)
    finally:
        os.umask(old)
    assert victim.read_bytes() == b"precious"
    assert output.read_bytes()[:4] == b"\x7fELF"
    assert stat.S_IMODE(output.stat().st_mode) == 0o644
    assert not [p for p in tmp_path.iterdir() if ".gpurt-tmp-" in p.name]


def test_compile_output_replaces_a_link_not_its_target(cache: Path, tmp_path: Path) -> None:
    source = tmp_path / "k.cu"
    source.write_text(SOURCE)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    output = tmp_path / "out.cubin"
    output.symlink_to(victim)
    gnvrtc.compile_file(str(source), "sm_90", output=str(output))
    assert victim.read_bytes() == b"precious" and not output.is_symlink()


def test_info_collect_has_the_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _info._cache_info()["dir"] == str(tmp_path)
