"""The documentation names only things that exist: every ``gpurt.X`` in docs/ and README.md
resolves, every GPURT_* variable is read by the code, and relative links point at files."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import gpurt

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
MIGRATION = sorted((ROOT / "docs").glob("migration*.md"))
PAGES = [*DOCS, ROOT / "README.md"]
NAME = re.compile(r"\bgpurt(?:\.[A-Za-z_]\w*)+")
ENV = re.compile(r"\bGPURT_[A-Z_]+\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def resolve(dotted: str) -> Any:
    """The object ``gpurt.a.b.c`` names: attributes, or submodules imported on the way."""
    obj: Any = gpurt
    path = "gpurt"
    for part in dotted.split(".")[1:]:
        path = f"{path}.{part}"
        if hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            obj = importlib.import_module(path)  # e.g. gpurt.kernels (installed with gpurt)
    return obj


def names_in(page: Path) -> list[str]:
    names = set()
    for match in NAME.finditer(page.read_text()):
        name = match.group(0).rstrip(".")
        if name.endswith((".md", ".py", ".cu", ".json", ".png")) or name == "gpurt.X":
            continue  # a file name such as gpurt_demo.cu, or the placeholder gpurt.X
        names.add(name)
    return sorted(names)


def test_migration_guide_exists_and_names_plenty() -> None:
    assert MIGRATION, "docs/migration*.md is missing"
    assert sum(len(names_in(page)) for page in MIGRATION) > 100


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_gpurt_name_exists(page: Path) -> None:
    missing = []
    for name in names_in(page):
        if name.startswith("gpurt.kernels"):
            pytest.importorskip("gpurt.kernels")
        try:
            resolve(name)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name} ({exc})")
    assert not missing, f"{page.name} names what gpurt does not have: {missing}"


def test_every_environment_variable_is_read_by_the_code() -> None:
    code = "\n".join(p.read_text() for folder in ("gpurt", "kernels", "benchmarks", "scripts")
                     for p in (ROOT / folder).rglob("*.py"))
    for page in PAGES:
        for var in set(ENV.findall(page.read_text())):
            assert var in code, f"{page.name} documents {var}, which no code reads"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_at_files(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
