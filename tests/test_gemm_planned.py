"""The mma and wgmma gemm families (with and without split-K) launch through planned launches
(kernels/_gemm_launch.py's planned_call): on the fake driver of test_launch_fake_driver.py, on
both launch paths, each repeated call must hand the driver exactly what Call.launch (the
Python launch of the same plan) hands it for the same pointers and scalars, a split's
partials and wgmma's ticket counters (from the stream's workspace) included; wgmma's tensor
maps follow the pointers. Kernels compile through NVRTC for sm_90a; the tensor maps are
faked (no driver to encode them here)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest
from cuda.bindings import driver as cu

import gpurt
from _elementwise_fakes import fake_array
from _fakes import fake_gpus_fixture  # noqa: F401
from gpurt._launch import path as _launchpath
from gpurt._launch import planned as gplanned
from gpurt._launch.args import build_plan
from test_launch_fake_driver import FakeDriver, fake  # noqa: F401

# the bundled kernels as installed (gpurt.kernels), as on the GPU machine
launch_mod = importlib.import_module("gpurt.kernels._gemm_launch")
_config = importlib.import_module("gpurt.kernels._gemm_config")
workspace_mod = importlib.import_module("gpurt.kernels._gemm_workspace")
Config, Problem = _config.Config, _config.Problem
DT_F16 = importlib.import_module("gpurt.kernels._gemm_tune").DT_F16

M, N, K = 256, 512, 1024
POINTERS = [(0x1000000, 0x2000000, 0x3000000, 0), (0x4000000, 0x5000000, 0x6000000, 0x6000000),
            (0x4000000, 0x5000000, 0x6000000, 0)]  # the last one repeats a call's maps


@dataclasses.dataclass
class _Op:
    ld: int
    kmajor: bool


@dataclasses.dataclass
class _Plan:  # what make_call reads of kernels/_gemm_plan.py's Plan
    a: _Op
    b: _Op
    m: int = M
    n: int = N
    k: int = K
    ldc: int = N
    ldcin: int = N
    dt: int = DT_F16
    index: int = 0
    itemsize: int = 2


@pytest.fixture
def driver(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:  # noqa: F811
    monkeypatch.setattr(gplanned, "current_device", lambda: 0)
    monkeypatch.setattr(fake, "cuLibraryGetKernel", lambda library, name: (0, ("kernel", name)))
    monkeypatch.setattr(launch_mod, "_kernels", {})  # kernels loaded by this fake driver only
    monkeypatch.setattr(launch_mod, "encode_map", lambda ptr, *rest: ptr.to_bytes(8, "little") +
                        repr(rest).encode().ljust(120)[:120])
    return fake


def _layouts(driver: FakeDriver, kernels: tuple[Any, ...]) -> None:
    """Give the fake driver the parameter layout of ``kernels`` as a real one reports it
    (cuKernelGetParamInfo): the wgmma kernels' tensor maps are 128-byte structs aligned to 64
    bytes, which gpurt cannot size from the source."""
    layouts: dict[bytes, list[tuple[int, int]]] = {}
    for kernel in kernels:
        params = [p if p.size else dataclasses.replace(p, kind="bytes", fmt="", size=128,
                                                       align=64) for p in kernel.params]
        plan = build_plan(kernel.name, params, None)
        layouts[kernel.symbol.encode()] = [(o, p.size) for o, p in zip(plan.offsets,
                                                                        plan.params)]
        driver.sizes[kernel.symbol.encode()] = [p.size for p in plan.params]

    def param_info(handle: Any, index: int) -> tuple[Any, int, int]:
        layout = layouts[handle[1]]
        if index >= len(layout):
            return (cu.CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0)
        return (cu.CUresult.CUDA_SUCCESS, *layout[index])

    driver.cuKernelGetParamInfo = param_info  # type: ignore[method-assign]


CONFIGS = [Config("mma", 128, 128, 32, 64, 64, 3), Config("mma", 128, 128, 32, 64, 64, 3,
                                                          split_k=3),
           Config("wgmma", 128, 128, 64, stages=4, tma_store=True),
           Config("wgmma", 128, 128, 64, stages=4, split_k=2)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.kernel}-split{c.split_k}")
def test_planned_gemm_launches_what_call_launch_does(driver: FakeDriver, config: Config,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    problem = Problem(M, N, K, DT_F16, True, False, True, True, (9, 0), 132)
    call = launch_mod.make_call(_Plan(_Op(K, True), _Op(N, False)), problem, config,
                                POINTERS[0][2])
    _layouts(driver, call.kernels)
    partials: list[int] = []
    counters = 0 if config.split_k == 1 else config.tiles(M, N) * (2 if config.kernel == "wgmma"
                                                                   else 1)

    def taken(index: int, handle: Any, count: int, tickets: int) -> Any:  # the stream's own
        assert (index, count, tickets) == (0, workspace_mod.partials_for(config.split_k, M, N),
                                          counters)
        partials.append(0x9000000 + 0x100000 * (len(partials) % len(POINTERS)))
        return workspace_mod.Workspace((fake_array((1,), ptr=partials[-1]),),
                                       partials[-1] + 0x80000, partials[-1], tickets, count)

    monkeypatch.setattr(workspace_mod, "take", taken)
    fallbacks: list[Any] = []
    python_launch = gplanned.python_launch

    def counted(*args: Any) -> Any:  # the Python launch, counting the calls it takes
        launch = python_launch(*args)
        return lambda *values: (fallbacks.append(values), launch(*values))

    monkeypatch.setattr(gplanned, "python_launch", counted)
    planned = launch_mod.planned_call(call, *POINTERS[0])
    for a, b, out, cin in POINTERS:
        planned(None, a, b, out, cin, 1.5, 0.0 if cin == 0 else -0.5)
    got = list(driver.launches)
    driver.launches.clear()
    for a, b, out, cin in POINTERS:
        call.launch(a, b, out, cin, 1.5, 0.0 if cin == 0 else -0.5, None)
    assert got == driver.launches
    assert len(got) == len(POINTERS)  # one launch each: a split kernel sums its own slices
    assert got[0][-1] != got[-1][-1]  # the pointers (and maps) did change
    assert bool(fallbacks) == _launchpath.pure_python  # the compiled path took every call


def test_planned_gemm_takes_a_stream_handle(driver: FakeDriver) -> None:
    problem = Problem(M, N, K, DT_F16, True, False, True, True, (9, 0), 132)
    call = launch_mod.make_call(_Plan(_Op(K, True), _Op(N, False)), problem, CONFIGS[2],
                                POINTERS[0][2])
    _layouts(driver, call.kernels)
    launch_mod.planned_call(call, *POINTERS[0])(0x55, *POINTERS[1], 2.0, 1.0)
    assert driver.launches[-1][4] == 0x55
