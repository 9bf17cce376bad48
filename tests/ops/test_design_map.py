"""docs/design.md's module map stays true: every module file of the SDK, the worker, the API and
every Lua script is named in its package's table, and every file a table names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {  # the map's subsection (by the path in its heading) -> the files it must name
    "libs/dtq": "*.py",
    "apps/worker/dtq_worker": "*.py",
    "apps/api/dtq_api": "*.py",
    "lua/": "*.lua",
}


def map_section() -> str:
    text = (ROOT / "docs/design.md").read_text()
    start = text.index("\n## Module map\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def subsection(section: str, package: str) -> str:
    """The part of the map under the ``###`` heading that names ``package`` in backticks."""
    parts = re.split(r"\n(?=### )", section)
    found = [p for p in parts if p.startswith("### ") and f"`{package}`" in p.splitlines()[0]]
    assert len(found) == 1, f"one '### ... `{package}`' heading in the module map"
    return found[0]


def named_in_tables(text: str) -> set[str]:
    """The file names in the first column of the tables of ``text``."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names.update(re.findall(r"`([\w/]+\.(?:py|lua))`", first))
    return names


def files(package: str, pattern: str) -> set[str]:
    base = ROOT / package
    return {
        p.relative_to(base).as_posix()
        for p in base.rglob(pattern)
        if "__pycache__" not in p.parts and "static" not in p.parts
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_in_the_map_and_every_row_names_a_module(package: str) -> None:
    named = named_in_tables(subsection(map_section(), package))
    present = files(package, PACKAGES[package])
    assert sorted(present - named) == [], f"modules of {package} missing from the module map"
    assert sorted(named - present) == [], f"the module map names files {package} does not have"


def test_the_check_reads_the_first_column_only() -> None:
    table = "| `a.py`, `b/c.py` | owns `d.py` | `e.py` |\n| module | owns |\n"
    assert named_in_tables(table) == {"a.py", "b/c.py"}
