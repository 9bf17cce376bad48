"""Render docs/design.md's key table from dtq.store.keys.layout (the keys as dtq.store.keys builds
them).

`python -m tools.key_table` rewrites the table between the markers in docs/design.md;
tests/ops/test_docs.py fails when the page is out of date.
"""

from __future__ import annotations

from pathlib import Path

from dtq.store.keys import layout
from tools.settings_table import replace_between

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
START, END = "<!-- key-table:start -->", "<!-- key-table:end -->"


def render() -> str:
    rows = ["| key | type | what |", "|---|---|---|"]
    rows += [f"| `{d.key}` | {d.type} | {d.what} |" for d in layout()]
    return "\n".join(rows)


def rewrite(text: str) -> str:
    return replace_between(text, START, END, render())


if __name__ == "__main__":
    DESIGN.write_text(rewrite(DESIGN.read_text()))
