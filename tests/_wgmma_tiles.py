"""Checks shared by the tests of the 16-bit wgmma kernel's tile variants
(tests/test_gemm_tile64.py, test_gemm_tile192.py, test_gemm_tile192r.py): a problem to choose
for, the no-spill compile, and the GPU cases scaled to a config's tile (edges inside its last
64-row slab and 64-column pass, many tiles per CTA) against float64 on poisoned outputs."""

from __future__ import annotations

import importlib
import re
from typing import Any

import numpy as np

import gpurt
import test_gemm
from test_gemm_wgmma_x import _case, _hopper

gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")


def problem(m: int, n: int, k: int, pitch128: bool = True, b_k: bool = False,
            dt: int = tune.DT_BF16) -> Any:
    """test_gemm's H100 problem (a row-major A), with these tests' argument order."""
    return test_gemm.problem(m, n, k, dt=dt, b_k=b_k, pitch128=pitch128)


def assert_compiles_without_spills(configs: list[Any], tmp_path: Any, monkeypatch: Any,
                                   registers: str | None = None) -> None:
    """The configs' kernels (bf16 K-major B, fp16 N-major A) compile for sm_90a without
    warnings or spills, each with ``registers`` registers where given."""
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    for source in sorted({config.source for config in configs}):
        names = sorted({config.name_expression(dt, a_k, b_k, True)
                        for config in configs if config.source == source
                        for dt, a_k, b_k in ((tune.DT_BF16, True, False),
                                             (tune.DT_F16, False, True))})
        log = gpurt.compile(gemm_launch.text(source), options=["--ptxas-options=-v"],
                            name_expressions=names, arch="sm_90a", program_name=source,
                            headers=gemm_launch.headers(source)).log
        assert "warning" not in log.lower(), log
        spills = re.findall(r"(\d+) bytes spill stores", log)
        assert len(spills) == len(names) and set(spills) == {"0"}, log
        if registers is not None:
            assert set(re.findall(r"Used (\d+) registers", log)) == {registers}, log


def layouts_and_edges(config: Any, seed: int) -> None:
    """Every layout, both 16-bit types; edge tiles in M (inside the last tile's last 64-row
    slab), N (inside the last 64-column pass) and K; Cin with beta, offset views, C rows the
    TMA store cannot write, one mostly empty tile."""
    _hopper()
    rng = np.random.default_rng(seed)
    bm, bn = (config.bn, config.bm) if config.swap else (config.bm, config.bn)  # C's tile
    for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
        for dtype in (gpurt.bfloat16, np.float16):
            _case(rng, config, dtype, 3 * bm - 8, 3 * bn + 8, 3 * 64 + 8, trans_a, trans_b)
    _case(rng, config, gpurt.bfloat16, bm + 72, 2 * bn + 136, 72, beta=0.5)  # 2 K tiles
    _case(rng, config, np.float16, bm + 8, 2 * bn + 72, 1000, beta=-1.0, offset=8)
    _case(rng, config, gpurt.bfloat16, 264, bn + 24, 136, trans_b=True, odd_out=True)
    _case(rng, config, gpurt.bfloat16, 24, 40, 200, trans_a=True)


def many_tiles_per_cta(config: Any, seed: int) -> None:
    """Far more tiles than CTAs (each CTA walks several, its stores overlapping the next
    tile's loads), and issue 17's shapes on split rows (pitches of 2000 bytes)."""
    _hopper()
    rng = np.random.default_rng(seed)
    sms = gpurt.get_device_properties().multi_processor_count
    _case(rng, config, gpurt.bfloat16, config.bm * (sms // 4 + 3), 1000, 520)
    _case(rng, config, gpurt.bfloat16, 1000, 1000, 1000, beta=0.25)
    _case(rng, config, np.float16, 2000, 3000, 264, trans_b=True)
