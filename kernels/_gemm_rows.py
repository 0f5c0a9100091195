"""fp32 GEMMs cut in two along M: whole waves of the wide simt tile, then the rest.

A simt grid whose tiles fill the GPU 2.2 times runs three waves, the last one a fifth full
(3000^3 on 128 x 256 tiles: 288 tiles on 132 SMs). Cut along M, the first rows are whole
waves of that tile, unsplit (its best rate), and the remaining rows are a second, small GEMM
with its own choice (a K split that fills the GPU once: 184 x 3000 x 3000 on 64 x 128 tiles,
split 7). Both are plain launches of the simt kernel on the same stream, on offset pointers,
so the result is the same as one launch (each output element is summed by one kernel in the
same order). The wave model of kernels/_gemm_simt_model.py decides where the cut pays.
``GPURT_GEMM_DISABLE=rows`` turns it off.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _gemm_simt_model as simt_model
from . import _gemm_tune as tune
from ._gemm_config import Config, Problem
from ._gemm_launch import Call, planned_call

# The tiles the first rows may take (those of the best rate with whole waves), and what the
# cut costs beyond the two grids' modelled times: the second launch's start and its pipeline
# fill, in the simt wave model's units (~2.6 us each on an H100).
_HEADS = (tune._SIMT[0], tune._SIMT[1])
_CUT_COST = 1.0
_PAYS = 0.97  # the cut must model at least 3% faster than one grid


def cut(problem: Problem) -> tuple[int, Config] | None:
    """(rows, head config) where ``problem`` (fp32, on the CUDA cores) runs faster as whole
    waves of ``head`` over its first ``rows`` rows and a second GEMM over the rest; None
    where one grid is as fast, the problem is not fp32, its heuristic is not the simt kernel
    (a few rows on the rowload kernel) or GPURT_GEMM_DISABLE names rows."""
    if problem.dt != tune.DT_F32 or tune.heuristic(problem).kernel != "simt":
        return None
    return _search(problem)[0]


def modelled(problem: Problem) -> float:
    """The wave model's cost (kernels/_gemm_simt_model.py's ``grid_cost`` units) of what fp32
    ``problem`` (exact, on the CUDA cores) runs: the cut where it pays (:func:`cut`), else
    one grid of the heuristic's choice."""
    return _search(problem)[1]


def _search(problem: Problem) -> tuple[tuple[int, Config] | None, float]:
    """(the cut that models at least 3% faster than one grid, or None; the cost of the one
    that runs)."""
    whole = tune.heuristic(problem)
    whole_cost = simt_model.grid_cost(problem, whole, whole.split_k)
    if "rows" in tune.disabled_kernels():
        return None, whole_cost
    best, best_cost = None, whole_cost * _PAYS
    for head in _HEADS:
        if not tune.eligible(problem, head):
            continue
        slots = problem.sm_count * simt_model.resident_ctas(problem, head)
        columns = -(-problem.n // head.bn)
        for waves in range(1, problem.m // head.bm + 1):
            rows = waves * slots // columns * head.bm  # the tile rows of whole waves
            if rows >= problem.m:
                break
            cost = _cut_cost(problem, head, rows) if rows else best_cost
            if cost < best_cost:
                best, best_cost = (rows, head), cost
    return best, whole_cost if best is None else best_cost


def _cut_cost(problem: Problem, head: Config, rows: int) -> float:
    """Modelled time of ``head`` over the first ``rows`` rows, then the rest's own choice."""
    first = dataclasses.replace(problem, m=rows)
    rest = dataclasses.replace(problem, m=problem.m - rows)
    tail = tune.heuristic(rest)
    return (simt_model.grid_cost(first, head, 1) + simt_model.grid_cost(rest, tail, tail.split_k)
            + _CUT_COST)


@dataclasses.dataclass(frozen=True)
class RowsCall:
    """Two :class:`Call` s over one C: ``head`` on the first ``rows`` rows, ``tail`` on the
    rest, its A, C and Cin pointers moved by the byte steps given."""

    head: Call
    tail: Call
    rows: int
    a_step: int
    out_step: int
    cin_step: int
    m: int
    n: int
    swap: bool = False

    @property
    def index(self) -> int:
        return self.head.index

    @property
    def config(self) -> Config:
        return self.head.config

    def label(self) -> str:
        return (f"{self.head.config.label()} rows {self.rows} + "
                f"{self.tail.config.label()} rows {self.m - self.rows}")

    def launch(self, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int, alpha: float,
               beta: float, stream: Any) -> None:
        """Run both parts on ``stream`` (None: current), the head first."""
        self.head.launch(a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta, stream)
        tail_cin = cin_ptr + self.cin_step if cin_ptr else 0
        self.tail.launch(a_ptr + self.a_step, b_ptr, out_ptr + self.out_step, tail_cin,
                         alpha, beta, stream)


class PlannedRows:
    """``planned(stream_handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)`` of a
    :class:`RowsCall`: the planned launches of both parts."""

    def __init__(self, call: RowsCall, a_ptr: int, b_ptr: int, out_ptr: int,
                 cin_ptr: int) -> None:
        self._call = call
        self._head = planned_call(call.head, a_ptr, b_ptr, out_ptr, cin_ptr)
        tail_cin = cin_ptr + call.cin_step if cin_ptr else 0
        self._tail = planned_call(call.tail, a_ptr + call.a_step, b_ptr,
                                  out_ptr + call.out_step, tail_cin)

    def __call__(self, handle: Any, a_ptr: int, b_ptr: int, out_ptr: int, cin_ptr: int,
                 alpha: float, beta: float) -> None:
        call = self._call
        self._head(handle, a_ptr, b_ptr, out_ptr, cin_ptr, alpha, beta)
        tail_cin = cin_ptr + call.cin_step if cin_ptr else 0
        self._tail(handle, a_ptr + call.a_step, b_ptr, out_ptr + call.out_step, tail_cin,
                   alpha, beta)
