"""Docs stay true: the README's settings table and design.md's key table match the code; every
script has its header."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT
from tools import key_table
from tools.settings_table import README, rewrite


def test_readme_settings_table_is_current() -> None:
    text = README.read_text()
    assert rewrite(text) == text, "run: .venv/bin/python tools/settings_table.py"


def test_design_key_table_is_the_one_keys_py_builds() -> None:
    text = key_table.DESIGN.read_text()
    assert key_table.START in text
    assert key_table.rewrite(text) == text, "run: .venv/bin/python -m tools.key_table"


def test_every_lua_script_has_a_header() -> None:
    for path in sorted(Path(ROOT, "lua").glob("*.lua")):
        head = path.read_text().splitlines()[:3]
        assert head[0].startswith(f"-- {path.name}"), f"{path.name} lacks its header"
        if path.name != "_common.lua":
            text = path.read_text()
            assert "Returns" in text or "returns" in text.split("\n\n")[0], path.name
