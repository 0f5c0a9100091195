"""torch.cuda's capability helpers: get_arch_list / get_gencode_flags (CPU: NVRTC), and
is_bf16_supported, is_tf32_supported, device_memory_used, list_gpu_processes compared with
torch in the same process (GPU)."""

from __future__ import annotations

import re

import pytest

import gpurt


def test_arch_list_is_what_nvrtc_targets() -> None:
    archs = gpurt.get_arch_list()
    assert archs and all(re.fullmatch(r"sm_\d+", a) for a in archs)
    assert "sm_90" in archs
    flags = gpurt.get_gencode_flags().split(" ")
    assert flags[0::2] == ["-gencode"] * len(archs)
    assert flags[1::2] == [f"compute=compute_{a[3:]},code={a}" for a in archs]


def test_without_a_gpu_nothing_is_supported() -> None:
    if gpurt.is_available():
        pytest.skip("a GPU is present")
    assert gpurt.is_bf16_supported() is False
    assert gpurt.is_tf32_supported() is False


@pytest.mark.gpu
def test_bf16_tf32_and_arch_match_torch(gpu_state: None) -> None:
    torch = pytest.importorskip("torch")
    for emulation in (True, False):
        assert gpurt.is_bf16_supported(emulation) == torch.cuda.is_bf16_supported(emulation)
    if hasattr(torch.cuda, "is_tf32_supported"):
        assert gpurt.is_tf32_supported() == torch.cuda.is_tf32_supported()
    assert gpurt.get_arch() in gpurt.get_arch_list()
    major = gpurt.get_device_capability()[0]  # torch was built for this device too
    assert any(a.startswith(f"sm_{major}") for a in torch.cuda.get_arch_list())


@pytest.mark.gpu
def test_memory_used_and_processes_match_torch(gpu_state: None) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    if not hasattr(torch.cuda, "device_memory_used"):
        pytest.skip("this torch has no device_memory_used")
    torch.zeros(1 << 20, device="cuda")  # both runtimes hold a context now
    gpurt.empty(1 << 20)
    torch.cuda.synchronize()
    ours, theirs = gpurt.device_memory_used(), torch.cuda.device_memory_used()
    print("device_memory_used gpurt", ours, "torch", theirs)
    assert abs(ours - theirs) <= 4 << 20  # other processes may allocate in between
    assert ours >= gpurt.mem_get_info()[1] - gpurt.mem_get_info()[0] - (64 << 20)
    our_text, their_text = gpurt.list_gpu_processes(), torch.cuda.list_gpu_processes()
    print(our_text, their_text, sep="\n")
    assert our_text.splitlines()[0] == their_text.splitlines()[0] == "GPU:0"
    pids = [line.split()[1] for line in our_text.splitlines()[1:] if line.startswith("process")]
    assert pids == [line.split()[1] for line in their_text.splitlines()[1:]
                    if line.startswith("process")]
