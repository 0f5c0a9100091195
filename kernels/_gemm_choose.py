"""Which config a gemm call runs: remembered by the tuner, timed now (each candidate on
operands rotating past the L2, torch.cuda.tunable's rotating buffer, behind a spin kernel, in
rounds over the candidates), or the heuristic's (kernels/_gemm_tune.py)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

import gpurt

from . import _gemm_plan as plans
from . import _gemm_tune as tune
from . import _gemm_tuner as tuning
from . import tunable
from ._gemm_launch import make_call, source_digest
from ._gemm_tune import Config, Problem

__all__ = ["choose", "timed_ms", "rotating_operands", "span_bytes"]

def _capturing(stream: Any, index: int) -> bool:
    """Whether ``stream`` is capturing a graph (then nothing may be timed or synchronized)."""
    handle = stream.cuda_stream
    status = gpurt.check(cu.cuStreamIsCapturing(cu.CUstream(handle)), "cuStreamIsCapturing")
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


_SPIN = r"""
extern "C" __global__ void gemm_tune_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


_MAX_ROTATING_COPIES = 32


def span_bytes(op: plans.Operand, rows: int, k: int, itemsize: int) -> int:
    """Bytes from ``op.ptr`` to one past the last element of its (rows x k) matrix."""
    inner, outer = (k, rows) if op.kmajor else (rows, k)
    return ((outer - 1) * op.ld + inner) * itemsize


def rotating_operands(plan: plans.Plan, stream: Any) -> tuple[list[tuple[int, int]], list[Any]]:
    """The (A, B) pointers the tuner's timed runs take in turn: the plan's own, then, where
    those are smaller than :func:`tunable.rotating_bytes` (torch.cuda.tunable's rotating
    buffer), copies at the same alignment (modulo 256 bytes) that hold that much more; and
    the arrays that hold the copies. Memory too short for a copy only means fewer copies."""
    itemsize = plan.itemsize
    spans = (span_bytes(plan.a, plan.m, plan.k, itemsize),
             span_bytes(plan.b, plan.n, plan.k, itemsize))
    want = tunable.rotating_bytes(gpurt.get_device_properties(plan.index).L2_cache_size)
    copies = min(_MAX_ROTATING_COPIES, -(-want // sum(spans))) if sum(spans) < want else 0
    pairs, held = [(plan.a.ptr, plan.b.ptr)], []
    try:
        for _ in range(copies):
            pair = []
            for op, span in zip((plan.a, plan.b), spans):
                room = gpurt.empty((span + 256,), dtype=np.uint8, device=plan.index,
                                   stream=stream)
                at = room.ptr + (op.ptr - room.ptr) % 256
                gpurt.check(cu.cuMemcpyDtoDAsync(at, op.ptr, span, stream.cuda_stream),
                            "cuMemcpyDtoDAsync")
                held.append(room)
                pair.append(at)
            pairs.append((pair[0], pair[1]))
    except gpurt.OutOfMemoryError:
        pass
    return pairs, held


class _Batches:
    """Times batches of one config's runs into a scratch output, the runs taking the
    ``operands`` pairs in turn, each batch queued behind a spin kernel so that host time never
    counts as device time. A config's first call loads and warms it up and sizes its
    batches; every call returns one batch's device time per run (ms)."""

    def __init__(self, plan: plans.Plan, problem: Problem, stream: Any,
                 operands: list[tuple[int, int]]) -> None:
        self.scratch = gpurt.empty((plan.m, plan.n), dtype=plan.out.dtype, device=plan.index,
                                   stream=stream)
        self.spin = gpurt.compile(_SPIN, arch=gpurt.get_arch(plan.index))["gemm_tune_spin"]
        self.plan = dataclasses.replace(plan, out=self.scratch, ldc=plan.n, cin=None, ldcin=0)
        self.problem, self.stream = problem, stream
        self.turn = itertools.cycle(operands)
        self.sized: dict[Config, tuple[Any, int]] = {}

    def _batch(self, call: Any, count: int) -> float:
        cycles = int(2e9 * (200e-6 + count * 150e-6))  # covers the host enqueueing `count`
        self.spin(1, 1, (cycles,), stream=self.stream)
        start, stop = gpurt.Event(enable_timing=True), gpurt.Event(enable_timing=True)
        start.record(self.stream)
        for _ in range(count):
            a_ptr, b_ptr = next(self.turn)
            call.launch(a_ptr, b_ptr, self.scratch.ptr, 0, 1.0, 0.0, self.stream)
        stop.record(self.stream)
        stop.synchronize()
        return start.elapsed_time(stop) / count

    def __call__(self, config: Config) -> float:
        try:
            if config not in self.sized:
                call = make_call(self.plan, self.problem, config, self.scratch.ptr)
                self._batch(call, 1)  # loads the kernel
                one = self._batch(call, 1)
                # batches of about 2 ms, within the tunable limits per candidate
                budget_ms = min(6.0, tunable.get_max_tuning_duration())
                runs = min(int(budget_ms / max(one, 1e-3)), tunable.get_max_tuning_iterations())
                self.sized[config] = (call, max(1, min(20, runs // tuning.ROUNDS)))
            return self._batch(*self.sized[config])
        finally:
            self.stream.synchronize()


def choose(plan: plans.Plan, problem: Problem, stream: Any,
            timing_plan: Callable[[], plans.Plan] | None = None) -> Config:
    """The config for ``problem``: remembered, timed, or the heuristic's. ``timing_plan``
    makes the plan to time with where ``plan``'s operands are placeholders (the packed route's
    copies)."""
    if not tunable.is_enabled() or problem.macs < tuning.TUNE_MIN_MACS:
        return tune.heuristic(problem)
    tuner = tunable.tuner()
    name = gpurt.get_device_name(plan.index)
    key = tuning.problem_key(problem, name, source_digest())
    known = tuner.lookup(key)
    if known is not None and tune.eligible(problem, known):
        return known
    if not tunable.tuning_is_enabled() or _capturing(stream, plan.index):
        return tune.heuristic(problem)
    if timing_plan is not None:
        plan = timing_plan()
    gpurt.synchronize(plan.index)  # the inputs may come from any stream
    with gpurt.device(plan.index):
        tuning_stream = gpurt.Stream()
    operands, _held = rotating_operands(plan, tuning_stream)  # the copies live until here
    return tuner.choose(key, tune.candidates(problem),
                        _Batches(plan, problem, tuning_stream, operands))


def timed_ms(index: int, problem: Problem) -> float | None:
    """The tuner's time (ms per call) of the config it chose for ``problem`` on device
    ``index``, where it has one: timed or remembered, the tuner enabled and the problem not
    below its size; else None (the heuristic's pick has no time)."""
    if not tunable.is_enabled() or problem.macs < tuning.TUNE_MIN_MACS:
        return None
    key = tuning.problem_key(problem, gpurt.get_device_name(index), source_digest())
    return tunable.tuner().lookup_ms(key)
