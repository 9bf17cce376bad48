"""Render the configuration table from dtq.settings.Settings (its fields and docstrings).

`python tools/settings_table.py` rewrites the table between the markers in
docs/configuration.md; tests/ops/test_docs.py fails when that page is out of date, and the
documentation site renders the table from the code when it is built (docs/hooks/dtq_docs.py).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from dtq.settings import Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"


def _docs() -> dict[str, str]:
    tree = ast.parse(inspect.getsource(Settings))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    docs: dict[str, str] = {}
    prev: str | None = None
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            prev = node.target.id
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and prev:
            docs[prev] = " ".join(str(node.value.value).split()).replace("``", "`")
            prev = None
    return docs


def _default(name: str) -> str:
    field = Settings.model_fields[name]
    if field.default_factory is not None:
        return "generated" if name == "worker_id" else "empty"
    d = field.default
    if d is None:
        return "unset"
    if isinstance(d, tuple):
        return ",".join(map(str, d))
    if isinstance(d, float) and d.is_integer():
        return str(int(d))
    return str(d)


def render() -> str:
    docs = _docs()
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for name in Settings.model_fields:
        rows.append(f"| `DTQ_{name.upper()}` | `{_default(name)}` | {docs.get(name, '')} |")
    return "\n".join(rows)


def replace_between(text: str, start: str, end: str, body: str) -> str:
    """``text`` with what lies between the markers ``start`` and ``end`` replaced by ``body``."""
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    return pattern.sub(lambda _m: f"{start}\n{body}\n{end}", text)


def rewrite(text: str) -> str:
    return replace_between(text, START, END, render())


if __name__ == "__main__":
    PAGE.write_text(rewrite(PAGE.read_text()))
