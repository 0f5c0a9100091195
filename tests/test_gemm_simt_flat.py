"""The fp32 SIMT GEMM's session-13 variants (kernels/gemm_simt.cu's FLAGS): branch-free copies
of the next K tile (``Config.flat``) and warps of 64 x 32 (simt ``wm x wn`` = 64 x 32,
cuBLAS's layout at 64 x 128). Config and names (CPU), every variant compiled without spills
(CPU, NVRTC), and on a GPU the same bits as the kernel they vary (each output's sum runs over
K in the same order) and right against float64, in every layout, on odd sizes, offset views,
K shorter than the ring, split K and in a CUDA graph."""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest

import gpurt
from test_gemm import check_replays, device, poisoned, rand, reference, rel_err
from test_gemm_simt import LAYOUTS, _operands, _run

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

S3 = Config("simt", 64, 128, 8, stages=3)  # cuBLAS's 1000^3 tile and ring depth
TALL = dataclasses.replace(S3, wm=64, wn=32)
# (the kernel varied, its variants): 64 x 128 in all three; the tuned 64 x 128 x 8 and wide
# 8 x 16 tiles flat, and a tile of 3 warp rows (copies that do not divide evenly)
PAIRS = [(S3, [dataclasses.replace(S3, flat=True), TALL, dataclasses.replace(TALL, flat=True)]),
         (tune._SIMT[3], [dataclasses.replace(tune._SIMT[3], flat=True)]),
         (tune._SIMT[0], [dataclasses.replace(tune._SIMT[0], flat=True)]),
         (tune._SIMT[8], [dataclasses.replace(tune._SIMT[8], flat=True)])]


def cases(config: Config) -> list[tuple[bool, bool, bool, int, int, int, int]]:
    """(trans_a, trans_b, offset, m, n, k, split) for ``config``: every layout with 16-byte
    rows and edges in M, N and K, then K below one tile (the ring's later stages zero-filled),
    split K in two layouts and rows of odd pitch on offset views (4-byte copies) in one; few
    layout/alignment/split combinations, so few programs to compile
    (benchmarks/simt_s13_dev.py precompiles them)."""
    bm, bn = config.bm, config.bn
    out = [(ta, tb, False, 2 * bm + 36, bn + 68, 203, 1) for ta, tb in LAYOUTS]
    out += [(ta, tb, False, bm - 4, 2 * bn + 4, 7, 1) for ta, tb in LAYOUTS]
    out += [(ta, tb, False, bm + 4, bn + 4, 1000, 3) for ta, tb in (LAYOUTS[0], LAYOUTS[3])]
    out.append((True, False, True, bm + 1, bn + 3, 203, 1))
    return out


def test_flat_and_tall_configs():
    flat_tall = dataclasses.replace(TALL, flat=True)
    assert TALL.threads == S3.threads == 128
    assert S3.name_expression(tune.DT_F32, True, False, True) == \
        "gemm_simt<64, 128, 8, 8, 3, true, false, true>"  # the tuned names keep their PTX
    assert dataclasses.replace(S3, flat=True).name_expression(tune.DT_F32, True, False, True) \
        == "gemm_simt<64, 128, 8, 8, 3, true, false, true, 1>"
    assert TALL.name_expression(tune.DT_F32, False, True, False) == \
        "gemm_simt<64, 128, 8, 8, 3, false, true, false, 2>"
    split = dataclasses.replace(flat_tall, split_k=3)
    assert split.name_expression(tune.DT_F32, True, False, True) == \
        "gemm_simt_splitk<64, 128, 8, 8, 3, true, false, true, 3>"
    assert flat_tall.label() == "simt 64x128x8 w64x32 s3 flat g8"
    assert Config.from_json(flat_tall.to_json()) == flat_tall
    for bad in [dict(wm=64, wn=64), dict(wm=32, wn=32), dict(bm=32, wm=64, wn=32)]:
        with pytest.raises(ValueError, match="simt tiles"):
            dataclasses.replace(S3, **bad)
    with pytest.raises(ValueError, match="flat"):
        Config("mma", 128, 128, 32, 64, 64, flat=True)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_flat_and_tall_compile_without_spills(arch, tmp_path, monkeypatch):
    """(sm_80's ptxas spills 16 bytes in 128 x 128 x 16 w32x128 flat: left out there.)"""
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    configs = [dataclasses.replace(c, flat=True) for c in tune._SIMT
               if arch != "sm_80" or c != tune._SIMT[1]] + [TALL]
    names = {c.name_expression(tune.DT_F32, True, False, True) for c in configs}
    for variant in (TALL, dataclasses.replace(TALL, flat=True)):
        names |= {variant.name_expression(tune.DT_F32, a_k, b_k, vec)
                  for a_k, b_k in LAYOUTS for vec in (True, False)}
    names |= {dataclasses.replace(c, split_k=3, flat=True).name_expression(
        tune.DT_F32, True, False, True) for c in (S3, TALL, tune._SIMT[0])}
    names = sorted(names)
    module = gpurt.compile(gemm_launch.text("gemm_simt.cu"), options=["--ptxas-options=-v"],
                           name_expressions=names, arch=arch, program_name="gemm_simt.cu",
                           headers=gemm_launch.headers("gemm_simt.cu"))
    assert set(module.lowered_names) == set(names)
    entries = re.findall(r"Function properties for (\S+)\n[^\n]*?(\d+) bytes spill stores",
                         module.log)
    assert len(entries) == len(names), module.log
    assert all(int(spill) == 0 for _, spill in entries), module.log


@pytest.mark.gpu
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p[0].label().replace(" ", "_"))
def test_variants_give_the_bits_of_the_kernel_they_vary(gpu_state, pair):
    """cases(): bit-identical to the unvaried kernel and within float64's tolerance (checked
    by _run into poisoned outputs, alpha/beta/Cin)."""
    base, variants = pair
    rng = np.random.default_rng(53)
    for trans_a, trans_b, offset, m, n, k, split in cases(base):
        dev, host = _operands(rng, m, n, k, trans_a, trans_b, offset=offset)
        want = _run(dataclasses.replace(base, split_k=split), dev, host, m, n, trans_a, trans_b)
        for variant in variants:
            got = _run(dataclasses.replace(variant, split_k=split), dev, host, m, n, trans_a,
                       trans_b)
            assert got.tobytes() == want.tobytes(), (variant.label(), m, n, k, trans_a,
                                                     trans_b)


@pytest.mark.gpu
def test_flat_tall_in_a_graph(gpu_state):
    """Captured once, replayed on fresh inputs (the copies' held addresses are the
    operands', not the capture's)."""
    rng = np.random.default_rng(59)
    config = dataclasses.replace(TALL, flat=True)
    m, n, k = 300, 260, 520
    da, db = device(rand(rng, (m, k), np.float32)), device(rand(rng, (k, n), np.float32))
    out = poisoned((m, n), np.float32)
    gemm_mod.gemm(da, db, out=out, config=config)
    assert rel_err(out.numpy(), reference(da.numpy(), db.numpy())) < 1e-5
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm_mod.gemm(da, db, out=out, config=config)
    check_replays(graph, da, db, out, rng, config.label(), np.float32, 1e-5)
