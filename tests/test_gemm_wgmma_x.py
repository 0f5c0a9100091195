"""The wgmma variants of issue 17's irregular and short-K shapes (kernels/gemm_wgmma.cu,
gemm_wgmma_x): clusters along N that multicast A (``cluster_n=2``, alone or 2 x 2 with
``cluster_m=2``) and ping-pong consumers (``pingpong``: each consumer warpgroup takes whole
tiles in turn). CPU: configs, names, geometry, compiled without spills. GPU: every layout,
both 16-bit types, edge tiles, clusters whose second CTA has no tile, many tiles per CTA,
alpha/beta/Cin, 16-byte offset views and graph replay, against float64 on poisoned outputs."""

from __future__ import annotations

import dataclasses
import importlib
import re

import numpy as np
import pytest

import gpurt
from test_gemm import check_replays, device, poisoned, rand, reference, rel_err

gemm_mod = importlib.import_module("gpurt.kernels.gemm")
gemm_launch = importlib.import_module("gpurt.kernels._gemm_launch")
tune = importlib.import_module("gpurt.kernels._gemm_tune")
Config = tune.Config

WIDE = Config("wgmma", 128, 256, 64, stages=4, group_m=16, tma_store=True)
MID = Config("wgmma", 128, 128, 64, stages=6, group_m=8, tma_store=True)
NARROW = Config("wgmma", 128, 64, 64, stages=8, group_m=8, tma_store=True)
# ping-pong with the pipelined store: a whole tile of staging per consumer, so 5 stages fit
PP_PS = dataclasses.replace(MID, stages=5, pingpong=True, pipe_store=True)
VARIANTS = [
    dataclasses.replace(WIDE, cluster_n=2),
    dataclasses.replace(WIDE, cluster_m=2, cluster_n=2),
    dataclasses.replace(MID, cluster_n=2),
    dataclasses.replace(MID, pingpong=True),
    dataclasses.replace(MID, pingpong=True, cluster_n=2),
    dataclasses.replace(NARROW, pingpong=True),
    dataclasses.replace(MID, cluster_m=2),  # gemm_wgmma's own clusters, on 128 x 128 tiles
    dataclasses.replace(MID, pingpong=True, cluster_m=2),
    dataclasses.replace(WIDE, cluster_m=2, group_m=8),  # tune._WGMMA[6]
    dataclasses.replace(MID, cluster_m=2, cluster_n=2),
    dataclasses.replace(NARROW, cluster_n=2),
    dataclasses.replace(WIDE, pipe_store=True),
    dataclasses.replace(MID, pipe_store=True),
    PP_PS,
]


def _ids(config: Config) -> str:
    return config.label().replace(" ", "_")


def test_config_fields():
    pair = dataclasses.replace(WIDE, cluster_n=2)
    assert pair.cluster == 2 and "c1x2" in pair.label()
    assert pair.name_expression(2, True, False, True) == \
        "gemm_wgmma_x<2, 256, 4, true, false, 1, 2, false, true>"
    quad = dataclasses.replace(WIDE, cluster_m=2, cluster_n=2)
    assert quad.cluster == 4 and "c2x2" in quad.label()
    pp = dataclasses.replace(MID, pingpong=True)
    assert " pp" in pp.label() and pp.cluster == 1
    assert pp.name_expression(1, False, True, True) == \
        "gemm_wgmma_x<1, 128, 6, false, true, 1, 1, true, true>"
    assert pp.shared_mem(True, False) == MID.shared_mem(True, False)
    assert pp.source == pair.source == "gemm_wgmma_x.cu" and MID.source == "gemm_wgmma.cu"
    # the old configs keep their names (and, checked by hand, their PTX)
    assert MID.name_expression(2, True, False, True) == \
        "gemm_wgmma<2, 128, 6, true, false, 1, true>"
    assert Config.from_json(quad.to_json()) == quad
    assert Config.from_json(MID.to_json()) == MID


@pytest.mark.parametrize("bad", [
    dict(kernel="wgmma", bn=256, pingpong=True),        # 2 x 128 accumulators per thread
    dict(kernel="wgmma", bn=128, cluster_n=4),
    dict(kernel="wgmma", bn=128, cluster_n=2, split_k=2),
    dict(kernel="wgmma", bn=128, bk=32, pingpong=True),  # TF32
    dict(kernel="mma", bn=128, bk=32, cluster_n=2),
])
def test_config_rejects(bad):
    fields = dict(kernel="wgmma", bm=128, bn=128, bk=64, stages=4)
    fields.update(bad)
    if fields["kernel"] == "mma":
        fields.update(wm=64, wn=64)
    with pytest.raises(ValueError, match="cluster_n=2 and pingpong"):
        Config(**fields)


def test_pipe_store_config():
    ps = dataclasses.replace(WIDE, pipe_store=True)
    assert ps.source == "gemm_wgmma_x.cu" and ps.label().endswith("tmaC ps g16")
    assert ps.name_expression(2, True, False, True) == \
        "gemm_wgmma_x<2, 256, 4, true, false, 1, 1, false, true, true>"
    assert Config.from_json(ps.to_json()) == ps
    for bad in (dict(tma_store=False), dict(bn=64, stages=8), dict(split_k=2)):
        with pytest.raises(ValueError, match="pipe_store"):
            dataclasses.replace(ps, **bad)


def test_pingpong_pipe_store_config():
    """Ping-pong with pipe_store stages a whole 128 x 128 tile per consumer (32 KiB more than
    the plain ping-pong) and still fits an sm_90 CTA's 227 KiB at 5 stages."""
    assert PP_PS.name_expression(1, True, True, True) == \
        "gemm_wgmma_x<1, 128, 5, true, true, 1, 1, true, true, true>"
    plain = dataclasses.replace(PP_PS, pipe_store=False)
    assert PP_PS.shared_mem(True, True) == plain.shared_mem(True, True) + 2 * 64 * 128 * 2
    assert PP_PS.shared_mem(True, True) <= 227 * 1024
    assert PP_PS.label().endswith("pp tmaC ps g8")
    with pytest.raises(ValueError, match="pipe_store"):
        dataclasses.replace(PP_PS, bn=64, stages=8)


def test_variants_compile_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("GPURT_CACHE_DIR", str(tmp_path))
    names = sorted({c.name_expression(tune.DT_BF16, a_k, b_k, True) for c in VARIANTS[:2]
                    for a_k, b_k in ((True, False), (False, True))}
                   | {c.name_expression(tune.DT_F16, True, True, True) for c in VARIANTS[2:]})
    source = VARIANTS[0].source
    module = gpurt.compile(gemm_launch.text(source), options=["--ptxas-options=-v"],
                           name_expressions=names, arch="sm_90a", program_name=source,
                           headers=gemm_launch.headers(source))
    log = module.log
    assert "warning" not in log.lower(), log
    spills = re.findall(r"(\d+) bytes spill stores", log)
    assert len(spills) == len(names) and set(spills) == {"0"}, log
    assert re.findall(r"Used (\d+) registers", log) == ["168"] * len(names), log


def test_disable_switch_covers_clusters_along_n(monkeypatch):
    monkeypatch.setenv("GPURT_GEMM_DISABLE", "cluster")
    problem = tune.Problem(3000, 5000, 2000, tune.DT_BF16, True, False, True, True, (9, 0), 132)
    assert not tune.eligible(problem, VARIANTS[0])
    assert tune.eligible(problem, VARIANTS[3])


def test_split_rows_choose_clusters():
    """On rows that are not 128-byte multiples the 16-bit heuristic takes the cluster config
    that the wave model with the clusters' rates puts first: the configs that won each shape
    on an H100 (session 9); aligned rows keep the plain tiles; the tuner offers the clusters
    on split rows only, and pipe_store on short K. 128 x 192 tiles in 2 x 1 clusters where
    they make whole waves (s10-tile192: 2000x3000x1000 0.86 of cuBLAS against 0.81)."""
    def problem(m, n, k, pitch128=False, b_k=False):
        return tune.Problem(m, n, k, tune.DT_BF16, True, b_k, True, True, (9, 0), 132,
                            pitch128=pitch128)

    c2x2, c2, mid_c2x2 = tune._WGMMA_C2X2, tune._WGMMA[6], tune._WGMMA_MID_C2X2
    assert (c2x2, mid_c2x2) == (VARIANTS[1], VARIANTS[9])
    won = {(3000, 5000, 2000): c2x2, (2000, 3000, 1000): tune._WGMMA_192_C2,
           (2048, 11000, 4000): c2x2,
           (2000, 2000, 2000): c2, (4000, 4000, 4000): c2,  # 32 / 128 blocks of 4: 2 / 5 waves
           (1000, 5000, 2000): mid_c2x2,
           (3000, 3000, 3000): tune._WGMMA_T192_C2}  # 2 rounds of pairs (session 12)
    for dims, config in won.items():
        for b_k in (False, True):
            assert tune.heuristic(problem(*dims, b_k=b_k)) == config, dims
        assert tune.heuristic(problem(*dims, pitch128=True)).cluster == 1
        assert {c2, c2x2, mid_c2x2} <= set(tune.candidates(problem(*dims)))
        assert c2x2 not in tune.candidates(problem(*dims, pitch128=True))
    # 1000^3: 64 tiles of 128 x 128, half a wave: 128 of 64 x 128 instead (s11-tile64), in
    # 2-CTA clusters along M (s12-tile64n)
    assert tune.heuristic(problem(1000, 1000, 1000)) == tune._WGMMA_64_C2
    assert tune.heuristic(problem(8192, 8192, 512, pitch128=True)) == tune._PINGPONG
    # the ping-pong tiles: K <= 512, >= 8 of them per SM, rows of 128-byte multiples
    assert tune._PINGPONG == PP_PS
    for dims in ((4096, 4096, 1024), (4096, 4096, 512), (8192, 8192, 576)):
        assert tune.heuristic(problem(*dims, pitch128=True)) == \
            tune._PIPE_STORE[tune._WGMMA[4]], dims
    assert tune.heuristic(problem(8192, 8192, 512)) != tune._PINGPONG  # split rows
    assert tune._PINGPONG in tune.candidates(problem(8192, 8192, 512, pitch128=True))
    assert tune.heuristic(problem(8192, 8192, 8192, pitch128=True)) == tune._WGMMA[4]
    every = tune.all_configs(problem(4096, 4096, 4096, pitch128=True))  # forced, swept
    assert {c2x2, mid_c2x2, *tune._PIPE_STORE.values(), tune._PINGPONG} <= set(every)


# ---- GPU -----------------------------------------------------------------------------------------


def _hopper() -> None:
    if gpurt.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90")


def _case(rng, config, dtype, m, n, k, trans_a=False, trans_b=False, beta=0.0, offset=0,
          odd_out=False):
    """One call with alpha (and beta, Cin) against float64 on a poisoned output; ``offset``
    elements (a multiple of 8: TMA needs 16-byte bases) in front of A's and B's rows;
    ``odd_out``: C's rows 1 element apart from 16-byte multiples, so the epilogue stores
    without TMA (and must leave the extra column alone)."""
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    c = rand(rng, (m, n), dtype)
    da, db = device(np.pad(a, ((0, 0), (offset, 0)))), device(np.pad(b, ((0, 0), (offset, 0))))
    store = poisoned((m, n + 1 if odd_out else n), dtype)
    out = store[:, :n]
    gemm_mod.gemm(da[:, offset:], db[:, offset:], out=out, trans_a=trans_a, trans_b=trans_b,
                  alpha=0.75, beta=beta, c=device(c) if beta else None, config=config)
    want = reference(a, b, trans_a, trans_b, alpha=0.75, beta=beta, c=c)
    assert rel_err(store.numpy()[:, :n], want) < 1e-2, (config.label(), m, n, k, trans_a,
                                                        trans_b)
    if odd_out:
        assert np.isnan(np.asarray(store.numpy()[:, n], dtype=np.float32)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_variant_layouts_and_edges(gpu_state, config):
    """Every layout, both 16-bit types; edge tiles in M, N and K, and an odd number of tile
    rows and columns, so some clusters have CTAs without a tile."""
    _hopper()
    rng = np.random.default_rng(41)
    for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
        for dtype in (gpurt.bfloat16, np.float16):
            _case(rng, config, dtype, 3 * 128 - 8, 3 * config.bn + 8, 3 * 64 + 8, trans_a,
                  trans_b)
    _case(rng, config, gpurt.bfloat16, 200, 264, 72, beta=0.5)  # 2 K tiles, Cin
    _case(rng, config, np.float16, 136, 520, 1000, beta=-1.0, offset=8)  # K not a multiple
    _case(rng, config, gpurt.bfloat16, 264, 2 * config.bn + 24, 136, odd_out=True)


@pytest.mark.gpu
@pytest.mark.parametrize("config", VARIANTS, ids=_ids)
def test_variant_many_tiles_per_cta(gpu_state, config):
    """Far more tiles than CTAs (each CTA, and with ping-pong each consumer, walks several
    tiles through the ring; an odd count per CTA leaves one consumer a tile short), the
    split-row shapes of issue 17 (pitches of 2000 and 4000 bytes)."""
    _hopper()
    rng = np.random.default_rng(43)
    sms = gpurt.get_device_properties().multi_processor_count
    _case(rng, config, gpurt.bfloat16, 128 * (sms // 4 + 3), 1000, 520)
    _case(rng, config, gpurt.bfloat16, 1000, 1000, 1000, beta=0.25)
    _case(rng, config, gpurt.bfloat16, 3000, 2000, 520, trans_b=True)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [VARIANTS[1], VARIANTS[4], PP_PS], ids=_ids)
def test_variant_in_a_graph(gpu_state, config):
    """Captured once, replayed on new inputs: the tensor maps hold the captured pointers."""
    _graph_case(config, np.random.default_rng(47))


def _graph_case(config: Config, rng: np.random.Generator) -> None:
    """``config`` captured once and replayed on new inputs, checked against float64."""
    _hopper()
    m, n, k = 520, 1000, 264
    a, b = rand(rng, (m, k), gpurt.bfloat16), rand(rng, (k, n), gpurt.bfloat16)
    da, db, out = device(a), device(b), poisoned((m, n), gpurt.bfloat16)
    gemm_mod.gemm(da, db, out=out, config=config)  # planned before the capture
    graph = gpurt.CUDAGraph()
    with gpurt.graph(graph):
        gemm_mod.gemm(da, db, out=out, config=config)
    check_replays(graph, da, db, out, rng, config.label())
    del graph


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gpurt.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_split_rows_run_on_clusters_by_default(gpu_state, monkeypatch, dtype):
    """gemm's own choice (autotuner off) on split rows with two waves of wide tiles (3000 x
    5000, K = 136: rows of 272 bytes), in every layout, with beta: the 2 x 2 clusters, right
    against float64."""
    _hopper()
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    gemm_mod.clear_plans()  # plans remember the settings they were made under
    rng = np.random.default_rng(53)
    for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
        _case(rng, None, dtype, 3000, 5000, 136, trans_a, trans_b,
              beta=0.5 if trans_a else 0.0)
    chosen = {entry[0].config for entry in gemm_mod._calls.values()}
    gemm_mod.clear_plans()
    assert chosen == {tune._WGMMA_C2X2}, chosen


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gpurt.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_short_k_runs_pingpong_by_default(gpu_state, monkeypatch, dtype):
    """gemm's own choice (autotuner off) at short K with at least 8 tiles of 128 x 128 per SM
    (an edge tile row, K = 448: 7 K tiles), in every layout, with beta: the ping-pong tiles
    with the pipelined store (tune._PINGPONG), right against float64."""
    _hopper()
    monkeypatch.setenv("GPURT_GEMM_AUTOTUNE", "0")
    gemm_mod.clear_plans()
    rng = np.random.default_rng(59)
    sms = gpurt.get_device_properties().multi_processor_count
    m = 128 * -(-8 * sms // 16) - 64  # 16 tile columns of 2048; rows of 128-byte multiples
    for trans_a, trans_b in [(False, False), (True, False), (False, True), (True, True)]:
        _case(rng, None, dtype, m, 2048, 448, trans_a, trans_b, beta=0.5 if trans_b else 0.0)
    chosen = {entry[0].config for entry in gemm_mod._calls.values()}
    gemm_mod.clear_plans()
    assert chosen == {tune._PINGPONG}, chosen


# ---- the ping-pong consumers' synchronisation, modelled (CPU) ---------------------------------


def _pingpong_model(stages: int, k_tiles: int, items: int, ordered: bool, seed: int) -> str:
    """Runs kernels/gemm_wgmma.cu's ring protocol for one CTA under a random interleaving:
    the producer fills slot it % stages after waiting (parity) on its `empty` barrier, the
    consumer warpgroup of item j (j % 2) waits (parity) on `full` for slots j k_tiles + kt and
    releases them; with ``ordered``, a warpgroup starts item j only once the other has passed
    item j - 1's waits (named barriers 3 and 4). Returns "ok", or what went wrong: a parity
    wait passing on an older phase (a stage read before it was filled), or a deadlock."""
    rng = np.random.default_rng(seed)
    full, empty = [0] * stages, [0] * stages  # completed phases per barrier
    total = items * k_tiles
    produced, progress, passed = 0, [0, 0], [-1, -1]  # next iteration; last item waited through
    todo = [[j for j in range(items) if j % 2 == h] for h in (0, 1)]

    def consumer_step(h: int) -> str | None:
        """One wait (+ release) of warpgroup h, "blocked", or None when it has nothing left."""
        if not todo[h]:
            return None
        j, kt = todo[h][0], progress[h]
        if kt == 0 and ordered and j > 0 and passed[1 - h] < j - 1:
            return "blocked"
        it = j * k_tiles + kt
        s = it % stages
        if full[s] % 2 == (it // stages) % 2:  # try_wait.parity: that phase is not complete
            return "blocked"
        if full[s] != it // stages + 1:
            return f"stage {s} read for iteration {it} after {full[s]} fills"
        empty[s] += 1
        progress[h] += 1
        if progress[h] == k_tiles:
            progress[h], passed[h] = 0, j
            todo[h].pop(0)
        return "ok"

    while produced < total or todo[0] or todo[1]:
        moves = []
        if produced < total:
            s = produced % stages
            if empty[s] % 2 == (produced // stages) % 2:  # parity ^ 1: the release came
                moves.append("producer")
        moves += [h for h in (0, 1) if todo[h]]
        rng.shuffle(moves)
        for move in moves:
            if move == "producer":
                s = produced % stages
                if empty[s] != produced // stages:
                    return f"producer refilled stage {s} early"
                full[s] += 1
                produced += 1
                break
            outcome = consumer_step(move)
            if outcome == "ok":
                break
            if outcome not in ("blocked", None):
                return outcome
        else:
            return "deadlock"
    return "ok"


def test_pingpong_protocol_model():
    """The ordering of the ping-pong consumers is what keeps their parity waits exact: without
    it a warpgroup that skips the other's slots runs ahead and reads unfilled stages (what an
    H100 showed: hangs and launch failures wherever a CTA had more than one tile)."""
    cases = [(stages, k, items) for stages in (4, 6, 8) for k in (1, 2, 3, 8, 16)
             for items in (1, 2, 3, 5)]
    for stages, k, items in cases:
        for seed in range(20):
            assert _pingpong_model(stages, k, items, True, seed) == "ok", (stages, k, items)
    unordered = [_pingpong_model(6, 8, 3, False, seed) for seed in range(20)]
    assert any(outcome.startswith("stage") for outcome in unordered), unordered
