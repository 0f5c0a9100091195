"""C^T = B^T A^T on the 16-bit wgmma kernel (Config.swap, kernels/gemm_wgmma.cu's gemm_wgmma_t):
the host swaps the operands, the kernel's tiles run bm along C's columns and bn along its
rows, and its epilogue writes each consumer's 64 x bn slab transposed (stmatrix .trans into
a [bn][64] box, one TMA store; element stores where C's rows are not 16-byte aligned). CPU:
configs, names, shared memory, what they reject, compiled without spills, the tuner's and
the sweep's lists, the heuristic's picks. GPU: every layout, both 16-bit types, edge tiles,
2-CTA clusters, many tiles per CTA, alpha/beta/Cin (lean 5 too), offset views, plain
stores, graph replay, against float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib
import types

import numpy as np
import pytest

import _wgmma_tiles as tiles
import gpurt
from test_gemm_wgmma_x import _case, _graph_case, _hopper, _ids

tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

T192, T192_C2, T64N96, T64N80 = tune._SWAPPED
VARIANTS = [
    T192,
    T192_C2,  # 2-CTA clusters along the kernel's M (C's columns): A^T multicast
    T64N96,
    T64N80,
    dataclasses.replace(T64N80, lean=0),
    dataclasses.replace(T192, tma_store=False),  # element stores
    Config("wgmma", 128, 128, 64, stages=6, group_m=8, tma_store=True, swap=True),
    Config("wgmma", 64, 64, 64, stages=12, group_m=8, tma_store=True, lean=3, swap=True),
    # session 15: the 64-row tiles of C^T in 2-CTA clusters (cuBLAS's 768^3 / 1000^3 tilings)
    dataclasses.replace(T64N80, cluster_m=2, lean=7),
    dataclasses.replace(T64N96, cluster_m=2, lean=7),
    dataclasses.replace(tune._WGMMA_64, swap=True, cluster_m=2, lean=7),
    dataclasses.replace(T64N80, cluster_m=2, lean=23),  # no end barrier: the producer's tail
]

_problem = tiles.problem


def test_config_fields():
    assert T192.label() == "wgmma 192x96x64 s5 tmaC T g8" and T192.swap and T192.threads == 512
    assert T64N80.label() == "wgmma 64x80x64 s11 tmaC lean5 T g8"
    # the kernel's A is B^T (K-major as B is), its B is A^T
    assert T192.name_expression(2, True, False, True) == \
        "gemm_wgmma_t<2, 192, 96, 5, false, true, 1, true, 0>"
    assert T192_C2.name_expression(1, False, True, True) == \
        "gemm_wgmma_t<1, 192, 96, 5, true, false, 2, true, 16>"
    assert T64N80.name_expression(2, True, True, True) == \
        "gemm_wgmma_t<2, 64, 80, 11, true, true, 1, true, 5>"
    assert {c.source for c in VARIANTS} == {"gemm_wgmma.cu"}
    # the ring, 1 KiB of slack, C's bn x 64 box per consumer
    assert T192.shared_mem(True, False) == 5 * (288 * 128 + 16) + 1024 + 192 * 96 * 2
    assert VARIANTS[5].shared_mem(True, False) == 5 * (288 * 128 + 16) + 1024
    assert VARIANTS[6].shared_mem(True, False) == 6 * (256 * 128 + 16) + 1024 + 128 * 128 * 2
    for config in VARIANTS:
        assert config.shared_mem(True, True) <= 227 * 1024
        assert Config.from_json(config.to_json()) == config
    assert not Config.from_json(tune._WGMMA_64.to_json()).swap
    # tiles of C^T: 1536^3 128 of 96 C rows x 192 columns; 768^3 120 of 80 x 64; 1000 x 768
    assert T192.tiles(1536, 1536) == 128 and T64N80.tiles(768, 768) == 120
    assert T64N80.tiles(1000, 768) == 13 * 12 and T192_C2.blocks(1000, 768) == 11 * 2


@pytest.mark.parametrize("base, bad", [
    (T192, dict(split_k=2)), (T192, dict(pipe_store=True)), (T64N96, dict(cluster_n=2)),
    (VARIANTS[6], dict(pingpong=True)), (T192, dict(stages=6)), (T64N80, dict(stages=12)),
    (VARIANTS[6], dict(bn=192)), (VARIANTS[6], dict(bn=256)), (VARIANTS[6], dict(stages=7)),
])
def test_config_rejects(base, bad):
    with pytest.raises(ValueError, match="swap|80-wide|pingpong"):
        dataclasses.replace(base, **bad)
    with pytest.raises(ValueError, match="swap"):
        Config("mma", 64, 64, 32, 32, 32, swap=True)
    with pytest.raises(ValueError, match="swap|TF32"):
        dataclasses.replace(VARIANTS[6], bk=32)


def test_compiles_without_spills(tmp_path, monkeypatch):
    tiles.assert_compiles_without_spills(VARIANTS, tmp_path, monkeypatch)


def test_tuner_and_sweep_offer_them(monkeypatch):
    """With SWAPPED_CANDIDATES (on since their H100 run), candidates where 128 x 128 tiles
    make under two waves, as the narrow tiles (the clusters on split rows only, 64 x 80
    with a K-major A only: an M-major A^T is the kernel's N-major B, in boxes of 32-byte
    rows); the sweep (all_configs) runs them everywhere, never for TF32."""
    assert tune.SWAPPED_CANDIDATES
    for dims in ((1536, 1536, 1536), (768, 768, 768), (1280, 1280, 1280), (640, 640, 640)):
        found = set(tune.candidates(_problem(*dims)))
        assert {T192, T64N96, T64N80} <= found and T192_C2 not in found, dims
        assert T192_C2 in tune.candidates(_problem(*dims, pitch128=False)), dims
        rows = tune.Problem(*dims, tune.DT_BF16, False, False, True, True, (9, 0), 132)
        assert T64N80 not in tune.candidates(rows) and T64N96 in tune.candidates(rows), dims
    monkeypatch.setattr(tune, "SWAPPED_CANDIDATES", False)
    assert not set(tune._SWAPPED) & set(tune.candidates(_problem(1280, 1280, 1280)))
    assert not set(tune._SWAPPED) & set(tune.candidates(_problem(4096, 4096, 4096)))
    assert set(tune._SWAPPED) <= set(tune.all_configs(_problem(4096, 4096, 4096)))
    assert not set(tune._SWAPPED) & set(tune.all_configs(_problem(1000, 1000, 1000,
                                                                   dt=tune.DT_TF32)))


def test_call_swaps_operands_and_maps(monkeypatch):
    """The launch of a swapped config (CPU: no kernel, maps recorded): the kernel's M is C's
    N, its A is B (M-major here, [64 k][64 n] boxes), its B is A (K-major, [96 rows][64 k]
    boxes); C's map is C itself in [96 rows][64 columns] boxes with the 128-byte swizzle."""
    launch = importlib.import_module("gpurt.kernels._gemm_launch")
    monkeypatch.setattr(launch, "compile_kernels", lambda *args: (None,))
    ns = types.SimpleNamespace
    plan = ns(itemsize=2, a=ns(kmajor=True, ld=1000), b=ns(kmajor=False, ld=1504), m=1000,
              n=1500, k=1000, ldc=1512, ldcin=1500, dt=tune.DT_BF16, index=0)
    call = launch.make_call(plan, _problem(1000, 1500, 1000), T192, 4096)
    assert (call.swap, call.m, call.n, call.lda, call.ldb) == (True, 1500, 1000, 1504, 1000)
    assert (call.a_kmajor, call.b_kmajor, call.grid, call.store_ok) == (False, True, 88, True)
    seen = []
    monkeypatch.setattr(launch, "encode_map", lambda *args: seen.append(args) or bytes(128))
    launch._wgmma_maps(call, 111, 222, 333)
    assert seen == [(222, 1500, 1000, 1504, tune.DT_BF16, (64, 64)),
                    (111, 1000, 1000, 1000, tune.DT_BF16, (64, 96)),
                    (333, 1500, 1000, 1512, tune.DT_BF16, (64, 96))]


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_layouts_and_edges(gpu_state, config):
    tiles.layouts_and_edges(config, 111)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS[:4], ids=_ids)
def test_many_tiles_per_cta(gpu_state, config):
    tiles.many_tiles_per_cta(config, 113)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [T192, T64N80], ids=_ids)
def test_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs."""
    _graph_case(config, np.random.default_rng(117))


@pytest.mark.gpu
def test_lean_beta_and_square_shapes(gpu_state):
    """Lean 5's epilogue takes the beta path when beta != 0; issue 17's squares (one tile per
    CTA, the tiles cuBLAS runs there) against float64."""
    _hopper()
    rng = np.random.default_rng(119)
    _case(rng, T64N80, gpurt.bfloat16, 768, 768, 768, beta=0.5)
    _case(rng, T64N96, np.float16, 640, 640, 640, trans_a=True, trans_b=True, beta=-0.25)
    _case(rng, T192, gpurt.bfloat16, 1536, 1536, 1536)
    _case(rng, T192_C2, np.float16, 1536, 1536, 1536, trans_b=True, beta=1.0)


def test_heuristic_takes_192_by_96_swapped_where_it_fills_the_wave():
    """_swapped_for: 192 x 96 tiles of C^T instead of 192 x 128 where both make one wave on
    128-byte rows of a row-major A and B and the swapped grid has >= 5/4 the tiles (H100,
    session 13: 1536^3 x0.94 of cuBLAS against x0.79; 1536x1536x4096, 1152x2048x2048,
    2000x1152x1536, 3000x768x4096 likewise); not at 1280^3, 768^3, 1000^3, other layouts or
    split rows, where it lost, tied or was not timed."""
    for dims in ((1536, 1536, 1536), (1536, 1536, 4096), (1152, 2048, 2048), (2000, 1152, 1536),
                 (3000, 768, 4096)):
        assert tune.heuristic(_problem(*dims)) == T192, dims
        assert tune._tall_for(_problem(*dims), tune._WGMMA_192) == tune._WGMMA_T192N128, dims
    for dims in ((1280, 1280, 1280), (1000, 1000, 1000), (4096, 4096, 4096),
                 (1536, 1536, 1024)):
        assert not tune.heuristic(_problem(*dims)).swap, dims
    assert tune.heuristic(_problem(768, 768, 768)) == T64N96  # (the 64-row rule)
    assert not tune.heuristic(_problem(1536, 1536, 1536, pitch128=False)).swap
    assert not tune.heuristic(_problem(1536, 1536, 1536, b_k=True)).swap
    column_a = tune.Problem(1536, 1536, 1536, tune.DT_BF16, False, False, True, True, (9, 0), 132)
    assert not tune.heuristic(column_a).swap


def test_heuristic_takes_64_by_96_swapped_where_64_by_80_fills_too_much():
    """Where 64 x 80 tiles of C^T would fill more than 4/5 of the SMs, 64 x 96 ones on the
    same terms where M is a multiple of 96 (H100, session 20, against 64 x 128 lean5: 768^3
    5.43-5.52 us against 5.64, 576x1024x2048 8.1 against 8.65, 1152x512x1024 5.94 against
    6.34); not with a partial last tile row (512x1024x1024, 704x832x4096, 896x640x2048 lost)
    nor where both grids are too full (896^3: 168 / 140 tiles)."""
    assert tune._WGMMA_64N96_T == T64N96
    for dims in ((768, 768, 768), (768, 768, 2048), (576, 1024, 2048), (1152, 512, 1024)):
        assert tune.heuristic(_problem(*dims)) == T64N96, dims
        assert tune.heuristic(_problem(*dims, b_k=True)) == T64N96, dims
    for dims in ((512, 1024, 1024), (704, 832, 4096), (896, 640, 2048), (448, 1280, 4096),
                 (896, 896, 896)):
        assert tune.heuristic(_problem(*dims)) == tune._WGMMA_64, dims
    assert tune.heuristic(_problem(640, 640, 640)) == T64N80  # 64 x 80 first
    assert not tune.heuristic(_problem(768, 768, 768, pitch128=False)).swap
    column_a = tune.Problem(768, 768, 768, tune.DT_BF16, False, False, True, True, (9, 0), 132)
    assert not tune.heuristic(column_a).swap


def test_heuristic_takes_64_by_80_swapped_on_small_grids():
    """_swapped64_for: 64 x 80 tiles of C^T instead of 64 x 128 lean5 on 128-byte rows of a
    row-major A (either B) where the swapped grid has >= 5/4 the tiles and fills <= 4/5 of the
    SMs (H100, session 14: 640^3 x1.01-1.03 of cuBLAS against x0.93-0.94, 576^3 x0.96-0.97
    against x0.86-0.88, 704^3, 640x768x1024, 768x640x2048, 384x384x2048, K-major B at 640^3
    and 704^3 likewise); not at 768^3 or 896^3 (fuller grids: a tie, a loss), on split rows
    or with a column-major A (untimed)."""
    for dims in ((512, 512, 512), (576, 576, 576), (640, 640, 640), (704, 704, 704),
                 (640, 768, 1024), (768, 640, 2048), (384, 384, 2048), (384, 1024, 4096)):
        assert tune.heuristic(_problem(*dims)) == T64N80, dims
    for dims in ((640, 640, 640), (704, 704, 704)):
        assert tune.heuristic(_problem(*dims, b_k=True)) == T64N80, dims
    for dims in ((896, 896, 896), (1000, 1000, 1000), (256, 4096, 4096)):
        assert tune.heuristic(_problem(*dims)) == tune._WGMMA_64, dims
    assert not tune.heuristic(_problem(600, 600, 600, pitch128=False)).swap
    column_a = tune.Problem(640, 640, 640, tune.DT_BF16, False, False, True, True, (9, 0), 132)
    assert not tune.heuristic(column_a).swap
    assert tune._swapped64_for(_problem(640, 640, 640), tune._WGMMA_T192N128) == \
        tune._WGMMA_T192N128
