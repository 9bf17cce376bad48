"""MkDocs hooks of the documentation site (mkdocs.yml): the parts generated from the code.

- The home page is the README, its links into docs/ made relative to the site.
- The settings table (between ``<!-- settings-table:start -->`` and its end marker) is rendered
  from ``dtq.settings.Settings`` by tools/settings_table.py, so the site shows the code's
  settings even where the committed page is behind (tests/ops/test_docs.py checks it is not).
- The HTTP API page's endpoint table (between ``<!-- openapi:start -->`` and its end marker) is
  rendered from ``dtq_api.app.create_app().openapi()``, and the schema itself is published as
  ``reference/openapi.json``.
- A link from a page to a file of the repository outside docs/ (a test, a Lua script, a module)
  is checked to exist and shown as its path: the site holds docs/ only. A missing target fails
  the build.
"""

from __future__ import annotations

import importlib.util
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]

OPENAPI_START, OPENAPI_END = "<!-- openapi:start -->", "<!-- openapi:end -->"
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#:]+)(#[^)]*)?\)")


@cache
def settings_table() -> Any:
    """tools/settings_table.py, loaded from its file (MkDocs restores sys.path after hooks load)."""
    spec = importlib.util.spec_from_file_location(
        "dtq_settings_table", ROOT / "tools" / "settings_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def openapi() -> dict[str, Any]:
    from dtq.settings import Settings
    from dtq_api.app import create_app

    schema: dict[str, Any] = create_app(Settings()).openapi()
    return schema


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def endpoint_table(schema: dict[str, Any]) -> str:
    """One row per operation: method, path, summary, parameters and the answers it documents."""
    rows = ["| method | path | what it does | parameters | answers |", "|---|---|---|---|---|"]
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            params = ", ".join(
                f"`{p['name']}` ({p['in']})" for p in op.get("parameters", []) if "name" in p
            )
            if "requestBody" in op:
                params = ", ".join(filter(None, [params, "JSON body"]))
            answers = ", ".join(f"`{code}`" for code in op.get("responses", {}))
            what = op.get("summary") or op.get("description", "").split("\n\n")[0]
            rows.append(
                f"| `{method.upper()}` | `{path}` | {_cell(what)} | {params or '-'} | {answers} |"
            )
    return "\n".join(rows)


def home_page() -> str:
    """The README as the site's home: its links to ``docs/x.md`` point at the page ``x.md``."""
    return (ROOT / "README.md").read_text().replace("](docs/", "](")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "index.md", content=home_page()))
    content = json.dumps(openapi(), indent=2, sort_keys=True)
    files.append(File.generated(config, "reference/openapi.json", content=content))
    return files


def _outside_links(markdown: str, page: Page, docs_dir: Path) -> str:
    source = Path(page.file.abs_src_path or docs_dir / page.file.src_uri)

    def repl(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        resolved = (source.parent / target).resolve()
        if resolved.is_relative_to(docs_dir):
            return m.group(0)
        if not resolved.exists():
            raise ValueError(f"{page.file.src_uri}: link to {target}, which does not exist")
        shown = resolved.relative_to(ROOT).as_posix()
        if text.strip("`").rstrip("/") in shown:
            return f"`{shown}`"
        return f"{text} (`{shown}`)"

    return LINK.sub(repl, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    table = settings_table()
    if table.START in markdown:
        markdown = table.replace_between(markdown, table.START, table.END, table.render())
    if OPENAPI_START in markdown:
        body = endpoint_table(openapi())
        markdown = table.replace_between(markdown, OPENAPI_START, OPENAPI_END, body)
    return _outside_links(markdown, page, Path(config.docs_dir).resolve())
