"""The package's shape (CONTRIBUTING.md, Layout): imports flow one way, bottom to top, with no
cycle -- also not through imports made only for type checking or inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpurt"

# Each module's layer, lowest first; a module may import its own layer and those below.
LAYERS = [
    ["gpurt._core", "gpurt._sanitizer"],
    ["gpurt.device"],
    ["gpurt._streams", "gpurt.streams"],
    ["gpurt._memory", "gpurt.memory"],
    ["gpurt._array", "gpurt.array", "gpurt._ipc", "gpurt.ipc", "gpurt.gds"],
    ["gpurt._nvrtc", "gpurt._launch", "gpurt.nvrtc"],
    ["gpurt._graphs", "gpurt.graphs", "gpurt._profiler", "gpurt.profiler", "gpurt.nvtx",
     "gpurt.memviz", "gpurt._random", "gpurt.random", "gpurt.sanitizer"],
    ["gpurt.comm", "gpurt.distributed"],
    ["gpurt", "gpurt._cli", "gpurt.__main__", "gpurt._elementwise", "gpurt.elementwise",
     "gpurt.jiterator", "gpurt.amp"],
]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every gpurt module ``name`` imports, anywhere in the file."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{module}.{alias.name}"
                out.add(full if full in known else module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in known and m != name}


def layer(name: str) -> int:
    best = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[1]


GRAPH = {name: imports(name, path, modules()) for name, path in modules().items()}


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_go_down_the_layers(name: str) -> None:
    upward = sorted(m for m in GRAPH[name] if layer(m) > layer(name))
    assert not upward, f"{name} (layer {layer(name)}) imports {upward} from a layer above"


def test_no_import_cycles() -> None:
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        for other in sorted(GRAPH[name]):
            visit(other, [*path, name])
        done.add(name)

    for name in sorted(GRAPH):
        visit(name, [])


def test_the_checker_sees_cycles_and_upward_imports() -> None:
    assert "gpurt._core.driver" in GRAPH["gpurt.device"]
    assert "gpurt._launch.kernel" in GRAPH["gpurt._graphs.nodes"]
    assert layer("gpurt._core.state") < layer("gpurt.streams") < layer("gpurt._launch.kernel")


def test_every_subpackage_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages (kernels/ is mapped to gpurt.kernels there): a new
    subpackage missing from the list would be absent from a non-editable install."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert found | {"gpurt.kernels"} == listed
    assert (PACKAGE / "py.typed").is_file()
