"""Docs stay true: the README's settings table and design.md's key table match the code; every
script has its header."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tools import key_table
from tools.settings_table import PAGE, START, rewrite


def test_configuration_settings_table_is_current() -> None:
    text = PAGE.read_text()
    assert START in text
    assert rewrite(text) == text, "run: .venv/bin/python tools/settings_table.py"


def test_design_key_table_is_the_one_keys_py_builds() -> None:
    text = key_table.DESIGN.read_text()
    assert key_table.START in text
    assert key_table.rewrite(text) == text, "run: .venv/bin/python -m tools.key_table"


def test_every_lua_script_has_a_header() -> None:
    for path in sorted(Path(ROOT, "lua").glob("*.lua")):
        head = path.read_text().splitlines()[:3]
        assert head[0].startswith(f"-- {path.name}"), f"{path.name} lacks its header"
        text = path.read_text()
        assert "Returns" in text or "returns" in text.split("\n\n")[0], path.name


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def test_every_docs_page_is_in_the_site_nav() -> None:
    """A page added to docs/ and forgotten in mkdocs.yml's nav would be built but unreachable."""
    import yaml

    config = yaml.safe_load(Path(ROOT, "mkdocs.yml").read_text())
    in_nav = _nav_pages(config["nav"])
    docs = Path(ROOT, "docs")
    pages = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
    assert pages, "no pages found"
    missing = [p for p in pages if p not in in_nav]
    assert not missing, f"add to mkdocs.yml's nav: {missing}"
    # index.md is the README (docs/hooks/dtq_docs.py); every other nav entry is a file.
    assert [p for p in in_nav if p not in pages] == ["index.md"]


@pytest.mark.slow
def test_the_site_builds_strict_with_the_generated_pages(tmp_path: Path) -> None:
    """`make docs`: mkdocs build --strict (a broken link or reference fails it), offline."""
    pytest.importorskip("mkdocs", reason="the `docs` extra: make docs installs it")
    from dtq.settings import Settings

    site = tmp_path / "site"
    p = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr

    def page(name: str) -> str:
        return (
            (site / name / "index.html").read_text() if name else (site / "index.html").read_text()
        )

    assert "Quick start" in page("")  # the README
    config = page("configuration")
    assert all(f"DTQ_{name.upper()}" in config for name in Settings.model_fields)
    assert "/api/v1/tasks/{task_id}" in page("reference/http-api")
    assert (site / "reference" / "openapi.json").is_file()
    assert "--concurrency" in page("reference/cli") and "--api-port" in page("reference/cli")
    assert 'id="dtq.Client.enqueue"' in page("reference/sdk")
    pages = [f.read_text() for f in site.rglob("*.html")]
    assert not [t for t in pages if "fonts.googleapis.com" in t or "cdn.jsdelivr" in t]
