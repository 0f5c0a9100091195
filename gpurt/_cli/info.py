"""The report behind ``gpurt info``: versions, the driver, NVRTC and every device.

:func:`collect` gathers everything into one JSON-ready dict and never raises for a missing
GPU, driver or NVML (the reason is recorded instead); :func:`render` prints it with rich.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

from cuda.bindings import nvrtc as _nvrtc
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from .. import __version__ as _gpurt_version
from .._core.driver import CudaError, bindings_version, check, driver_version
from .._launch.path import launch_path
from .._nvrtc import cache as _kcache
from ..device import (
    clock_rate,
    device_count,
    get_arch,
    get_device_properties,
    init,
    mem_get_info,
    memory_usage,
    power_draw,
    temperature,
    utilization,
)
from ..distributed._nccl import describe as _nccl_describe

__all__ = ["collect", "render"]

# distribution name -> label in the report
_PACKAGES = {
    "cuda-bindings": "cuda-bindings",
    "cuda-pathfinder": "cuda-pathfinder",
    "nvidia-cuda-nvrtc": "NVRTC wheel",
    "nvidia-nvjitlink": "nvJitLink wheel",
    "nvidia-nvfatbin": "nvFatbin wheel",
    "numpy": "numpy",
    "ml_dtypes": "ml_dtypes",
    "rich": "rich",
    "nvtx": "nvtx",
}

# reading -> (function, unit)
_NVML_READINGS: dict[str, tuple[Callable[[int], int], str]] = {
    "utilization": (utilization, "%"),
    "memory_usage": (memory_usage, "%"),
    "temperature": (temperature, "C"),
    "power_draw": (power_draw, "mW"),
    "clock_rate": (clock_rate, "MHz"),
}

_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "GPURT_CACHE_DIR", "GPURT_CACHE_DISABLE",
             "GPURT_CACHE_MAX_BYTES", "XDG_CACHE_HOME", "GPURT_ALLOC_CONF", "NCCL_NVLS_ENABLE",
             "NCCL_DEBUG")

# what still works without a GPU: (needs NVRTC, text)
_WORKS_WITHOUT_GPU = [
    (True, ("compiling kernels ahead of time with NVRTC: gpurt compile FILE.cu --arch sm_90 "
            "(or gpurt.compile(source, arch='sm_90') from Python)")),
    (True, "the kernel cache: compiled kernels are kept on disk ({where}), so each is "
           "compiled once"),
    (False, "import gpurt and the test suite (the GPU tests are skipped with the reason)"),
]



def _package_dir() -> str:
    """The folder gpurt is imported from (this file is in gpurt/_cli/)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _cuda_version_text(version: int | None) -> str | None:
    """13000 -> '13.0' (the driver's and runtime's integer encoding)."""
    if version is None:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for dist in _PACKAGES:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    versions["cuda-bindings"] = bindings_version()
    return versions


def _nvrtc_info() -> dict[str, Any]:
    """NVRTC's version and the architectures it can compile for (wraps nvrtcVersion)."""
    try:
        major, minor = check(_nvrtc.nvrtcVersion(), "nvrtcVersion")
        archs = check(_nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")
    except Exception as exc:  # a diagnostic must report a broken NVRTC, whatever it raises
        return {"version": None, "supported_archs": [], "error": str(exc)}
    return {
        "version": f"{major}.{minor}",
        "supported_archs": [f"sm_{arch}" for arch in archs],
        "error": None,
    }


def _driver_info() -> dict[str, Any]:
    try:
        init()
    except CudaError as exc:
        return {"available": False, "cuda_version": None, "device_count": 0, "error": str(exc)}
    count = device_count()
    return {
        "available": count > 0,
        "cuda_version": _cuda_version_text(driver_version()),
        "device_count": count,
        "error": None if count else "the driver found no CUDA device",
    }


def _device_info(index: int) -> dict[str, Any]:
    props = get_device_properties(index)
    info: dict[str, Any] = {
        "index": index,
        "name": props.name,
        "arch": get_arch(index),
        "properties": dataclasses.asdict(props),
    }
    try:
        free, total = mem_get_info(index)
        info["memory"] = {"free": free, "total": total}
    except CudaError as exc:
        info["memory"] = {"error": str(exc)}
    nvml: dict[str, Any] = {}
    for name, (read, unit) in _NVML_READINGS.items():
        try:
            nvml[name] = {"value": read(index), "unit": unit}
        except Exception as exc:  # NVML may fail in many ways; the report says how
            nvml[name] = {"error": str(exc) or exc.__class__.__name__}
    info["nvml"] = nvml
    return info


def _cache_info() -> dict[str, Any]:
    """The disk kernel cache: its folder (None when off), its size and its size limit."""
    directory = _kcache.cache_dir()
    return {"dir": directory, "bytes": _kcache.disk_usage(directory),
            "limit": _kcache.max_bytes()}


def _prebuilt_info(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The bundled kernels' prebuilt archive: its file, its architectures, and per device
    how many programs it holds for that device's architecture and tuned GEMM problems.
    gpurt.kernels sits above this module: imported by name, as the demo does."""
    try:
        prebuilt = importlib.import_module("gpurt.kernels._prebuilt")
    except ImportError as exc:
        return {"archive": None, "error": f"gpurt.kernels is not importable: {exc}"}
    found = prebuilt.report()
    found["devices"] = {str(dev["index"]): prebuilt.report(dev["arch"], dev["name"])
                        for dev in devices if dev.get("arch")}
    return found


def collect() -> dict[str, Any]:
    """Everything ``gpurt info`` reports, as one JSON-ready dict."""
    driver = _driver_info()
    nvrtc = _nvrtc_info()
    devices = [_device_info(i) for i in range(driver["device_count"])]
    missing: list[str] = []
    if not driver["available"]:
        missing.append(f"no usable GPU: {driver['error']}")
    if nvrtc["error"]:
        missing.append(f"NVRTC cannot be used: {nvrtc['error']}")
    cache = _cache_info()
    where = cache["dir"] or "off: GPURT_CACHE_DISABLE=1"
    works = [] if driver["available"] else [
        text.format(where=where) for needs_nvrtc, text in _WORKS_WITHOUT_GPU
        if not (needs_nvrtc and nvrtc["error"])
    ]
    return {
        "gpurt": {"version": _gpurt_version, "path": _package_dir()},
        "python": {
            "version": platform.python_version(),
            "executable": sys.executable,
            "platform": platform.platform(),
        },
        "packages": _package_versions(),
        "driver": driver,
        "nvrtc": nvrtc,
        "launch": launch_path(),
        "collectives": _nccl_describe(),
        "kernel_cache": cache,
        "prebuilt": _prebuilt_info(devices),
        "devices": devices,
        "environment": {k: os.environ[k] for k in _ENV_VARS if k in os.environ},
        "missing": missing,
        "works_without_gpu": works,
    }


# ---- rendering ---------------------------------------------------------------------------


def _bytes_text(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _property_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name in ("total_memory", "L2_cache_size", "persisting_l2_cache_max_size") or (
        name.startswith("shared_memory")
    ):
        return _bytes_text(int(value))
    if name in ("clock_rate", "memory_clock_rate"):
        return f"{value / 1000:.0f} MHz"
    if name == "memory_bus_width":
        return f"{value} bit"
    return str(value)


def _software_table(report: dict[str, Any]) -> Table:
    table = Table(title="Software", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("gpurt", escape(f"{report['gpurt']['version']}  ({report['gpurt']['path']})"))
    py = report["python"]
    table.add_row("Python", escape(f"{py['version']}  ({py['executable']})"))
    driver = report["driver"]
    if driver["cuda_version"]:
        table.add_row("NVIDIA driver", f"CUDA {driver['cuda_version']}, "
                      f"{driver['device_count']} device(s)")
    else:
        table.add_row("NVIDIA driver", "[red]not usable[/red]")
    nvrtc = report["nvrtc"]
    if nvrtc["version"]:
        archs = ", ".join(nvrtc["supported_archs"])
        table.add_row("NVRTC", f"{nvrtc['version']}  (targets: {archs})")
    else:
        table.add_row("NVRTC", f"[red]n/a[/red]: {escape(nvrtc['error'])}")
    launch = report["launch"]
    table.add_row("kernel launches", escape(f"{launch['path']}: {launch['why']}"))
    cache = report["kernel_cache"]
    table.add_row("kernel cache", escape(
        f"{cache['dir']}  ({_bytes_text(cache['bytes'])} of {_bytes_text(cache['limit'])}, "
        "GPURT_CACHE_MAX_BYTES)" if cache["dir"] else "off (GPURT_CACHE_DISABLE=1)"))
    table.add_row("prebuilt kernels", escape(_prebuilt_text(report["prebuilt"])))
    nccl = report["collectives"]
    table.add_row("collectives", escape(nccl["why"]) if nccl["available"] else
                  "[yellow]not available[/yellow]: " + escape(nccl["why"]))
    for dist, version in report["packages"].items():
        text = escape(version) if version else "[yellow]not installed[/yellow]"
        table.add_row(_PACKAGES[dist], text)
    for key, value in report["environment"].items():
        table.add_row(f"${key}", escape(value))
    return table


def _prebuilt_text(prebuilt: dict[str, Any]) -> str:
    if prebuilt.get("error") or not prebuilt.get("archive"):
        return prebuilt.get("error") or ("none: the bundled kernels compile at first use "
                                         "(gpurt build-kernels makes an archive)")
    lines = [f"{prebuilt['archive']}  (for {', '.join(prebuilt.get('archs', []))})"]
    for index, found in prebuilt.get("devices", {}).items():
        programs = ", ".join(f"{n} {name}" for name, n in sorted(found["programs"].items()))
        stale = "" if found.get("source_current") else "; built from other kernel sources"
        lines.append(f"cuda:{index}: {programs or 'nothing for this architecture'}; "
                     f"{found['tuned_problems']} tuned GEMM problems{stale}")
    return "\n".join(lines)


def _device_table(dev: dict[str, Any]) -> Table:
    table = Table(
        title=escape(f"cuda:{dev['index']}  {dev['name']}  ({dev['arch']})"),
        show_header=False,
        title_justify="left",
    )
    for _ in range(2):
        table.add_column(style="bold")
        table.add_column()
    cells: list[tuple[str, str]] = []
    memory = dev["memory"]
    if "error" in memory:
        cells.append(("memory free/total", f"n/a: {memory['error']}"))
    else:
        cells.append(("memory free/total",
                      f"{_bytes_text(memory['free'])} / {_bytes_text(memory['total'])}"))
    for name, reading in dev["nvml"].items():
        text = f"{reading['value']} {reading['unit']}" if "error" not in reading else (
            f"n/a ({reading['error']})")
        cells.append((name, text))
    for name, value in dev["properties"].items():
        if name not in ("index", "name"):
            cells.append((name, _property_text(name, value)))
    half = (len(cells) + 1) // 2
    for left, right in zip(cells[:half], cells[half:] + [("", "")]):
        table.add_row(*(escape(cell) for cell in (*left, *right)))
    return table


def render(report: dict[str, Any], console: Console) -> None:
    """Print ``report`` (from :func:`collect`) for a person."""
    console.print(f"[bold]gpurt {report['gpurt']['version']}[/bold]: "
                  "torch.cuda's runtime layer without torch")
    console.print(_software_table(report))
    for dev in report["devices"]:
        console.print(_device_table(dev))
    if report["missing"]:
        lines = [f"[red]missing:[/red] {escape(item)}" for item in report["missing"]]
        if report["works_without_gpu"]:
            lines.append("[green]still works here:[/green]")
            lines += [f"  - {escape(item)}" for item in report["works_without_gpu"]]
        console.print(Panel("\n".join(lines), title="No GPU here", title_align="left"))
