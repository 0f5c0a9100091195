"""Property tests of the bundled kernels at any shape, layout, offset and alignment (GPU).

hypothesis (fixed seed, bounded example counts) draws shapes, layouts, transposes, element
offsets, leading dimensions, dtypes and alpha/beta; gemm is forced through every config
that can run the drawn problem, and run with its own choice; softmax and its relatives run
at any row length and offset. Every result is compared with a float64 reference, outputs
are poisoned first, and the memory around an output view must come back untouched
(tests/_kernel_cases.py; scripts/sanitize_sweep.py runs such cases under compute-sanitizer).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import gpurt
from _kernel_cases import (
    GEMM_DTYPES,
    OPS,
    SOFTMAX_DTYPES,
    GemmCase,
    SoftmaxCase,
    gemm_configs,
    run_gemm,
    run_softmax,
    stored,
)

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")

SETTINGS: dict[str, Any] = dict(
    deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def precompiled():
    """Every GEMM variant compiled once, in parallel processes, into the disk cache."""
    gemm_mod.precompile()


# ---- gemm --------------------------------------------------------------------------------------

_dim = st.one_of(st.integers(0, 4), st.integers(1, 160),
                 st.sampled_from([63, 64, 65, 127, 128, 129, 255, 256, 257, 300]))
_layout = st.tuples(st.booleans(), st.integers(0, 9), st.integers(0, 9))


@st.composite
def gemm_cases(draw: Any) -> GemmCase:
    beta = draw(st.sampled_from([0.0, 0.0, 0.5, -1.0]))
    out_layout = draw(_layout) if beta else draw(st.one_of(st.none(), _layout))
    return GemmCase(m=draw(_dim), n=draw(_dim), k=draw(_dim),
                    dtype=draw(st.sampled_from(list(GEMM_DTYPES))),
                    trans_a=draw(st.booleans()), trans_b=draw(st.booleans()),
                    a_layout=draw(_layout), b_layout=draw(_layout), out_layout=out_layout,
                    alpha=draw(st.sampled_from([1.0, -1.5, 0.25])), beta=beta,
                    c_is_out=draw(st.booleans()))


@pytest.mark.gpu
@seed(20261126)
@settings(max_examples=50, **SETTINGS)
@given(case=gemm_cases(), draw_seed=st.integers(0, 2**32 - 1))
def test_gemm_every_eligible_config_matches_float64(gpu_state, precompiled, monkeypatch,
                                                    case, draw_seed):
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    gemm_mod.clear_plans()
    rng = np.random.default_rng(draw_seed)
    configs = gemm_configs(case, rng)
    if case.m and case.n:
        assert configs, f"no config can run {case}"
    for config in [None, *configs]:
        run_gemm(case, config, rng)


def test_why_not_names_the_requirement():
    problem = tune.Problem(33, 129, 4099, tune.DT_BF16, True, False, False, False, (9, 0), 132)
    reason = tune.why_not(problem, tune._WGMMA[0])
    assert reason is not None and "16-byte aligned" in reason
    assert "float32" in tune.why_not(problem, tune._SIMT[0])
    assert "sm_80" in tune.why_not(dataclasses.replace(problem, capability=(7, 5)),
                                   tune._MMA[0])
    assert tune.why_not(problem, tune._MMA[0]) is None
    assert "2**31" in tune.why_not(dataclasses.replace(problem, k=2**31), tune._MMA[0])
    assert "split_k" in tune.why_not(problem, dataclasses.replace(tune._MMA[0], split_k=70000))
    every = tune.all_configs(problem)
    assert every and all(tune.eligible(problem, c) for c in every)
    assert any(c.split_k > 1 for c in every) and not any(c.kernel == "wgmma" for c in every)


def test_programs_cover_every_config_layout_and_alignment():
    programs = gemm_launch.programs("sm_90")
    assert len(programs) == len(set(programs))
    sources = {source for source, _, _ in programs}
    assert sources == {"gemm_simt.cu", "gemm_mma.cu", "gemm_wgmma.cu", "gemm_wgmma_tf32.cu",
                       "gemm_skinny.cu", "gemm_decode.cu", "gemm_pack.cu", "gemm_wgmma_x.cu",
                       "gemm_rowload.cu"}
    assert all(arch == ("sm_90a" if src.startswith(("gemm_wgmma", "gemm_decode")) else "sm_90")
               for src, _, arch in programs)
    assert {src for src, _, _ in gemm_launch.programs("sm_80")} == {"gemm_simt.cu", "gemm_mma.cu",
                                                                  "gemm_skinny.cu",
                                                                  "gemm_rowload.cu"}


@pytest.mark.gpu
def test_forced_config_that_cannot_run_raises_and_leaves_gpurt_usable(gpu_state, monkeypatch):
    rng = np.random.default_rng(5)
    a = stored(rng, 33, 67, gpurt.bfloat16, False, 1, 0)  # one element in: no TMA
    b = stored(rng, 67, 129, gpurt.bfloat16, False, 0, 0)
    # a TMA config runs on 128-byte-pitched copies of such rows (kernels/_gemm_pack.py) ...
    got = np.asarray(gemm_mod.gemm(a.view, b.view, config=tune._WGMMA[0]).to_numpy(), np.float64)
    want = a.logical().astype(np.float64) @ b.logical().astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "pack")  # ... and without them cannot run
    gemm_mod.clear_plans()
    with pytest.raises(ValueError, match="16-byte aligned"):
        gemm_mod.gemm(a.view, b.view, config=tune._WGMMA[0])
    with pytest.raises(ValueError, match="float32"):
        gemm_mod.gemm(a.view, b.view, config=tune._SIMT[0])
    run_gemm(GemmCase(17, 19, 5, "float32"), None, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("autotune", ["1", "0"])
def test_gemm_issue_shape_with_torch_tensors(gpu_state, monkeypatch, tmp_path, dtype, autotune):
    """a (33, 4099) @ b (4099, 129) as torch tensors once faulted the device: split-K stored
    8-byte pairs into a slice that starts at an odd element (issue #14)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", autotune)
    gemm_mod.clear_plans()
    tdtype = getattr(torch, dtype)
    a = torch.randn(33, 4099, device="cuda").to(tdtype)
    b = torch.randn(4099, 129, device="cuda").to(tdtype)
    got = gemm_mod.gemm(a, b)
    host = np.asarray(got.to_numpy(), dtype=np.float64)
    want = (a.double() @ b.double()).cpu().numpy()
    err = np.linalg.norm(host - want) / np.linalg.norm(want)
    assert err < (1e-5 if dtype == "float32" else 1e-2)
    torch.cuda.synchronize()  # the context is healthy for torch too


# ---- softmax and relatives ---------------------------------------------------------------------


@st.composite
def softmax_cases(draw: Any) -> SoftmaxCase:
    cols = draw(st.one_of(st.integers(1, 70), st.integers(71, 5000),
                          st.sampled_from([1000, 4099, 32001, 50257, 70001, 131072, 600001])))
    rows = draw(st.integers(0, max(1, min(40, 1_500_000 // cols))))
    return SoftmaxCase(op=draw(st.sampled_from(OPS)),
                       dtype=draw(st.sampled_from(list(SOFTMAX_DTYPES))), rows=rows, cols=cols,
                       offsets=draw(st.tuples(*[st.integers(0, 9)] * 3)),
                       given_out=draw(st.booleans()))


@pytest.mark.gpu
@seed(20261126)
@settings(max_examples=60, **SETTINGS)
@given(case=softmax_cases(), draw_seed=st.integers(0, 2**32 - 1))
def test_softmax_family_matches_float64(gpu_state, case, draw_seed):
    run_softmax(case, np.random.default_rng(draw_seed))
