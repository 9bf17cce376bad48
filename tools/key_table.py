"""Render docs/design.md's key table from dtq.keys.layout (the keys as dtq.keys builds them).

`python tools/key_table.py` rewrites the table between the markers in docs/design.md;
tests/test_docs.py fails when the page is out of date.
"""

from __future__ import annotations

import re
from pathlib import Path

from dtq.keys import layout

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
START, END = "<!-- key-table:start -->", "<!-- key-table:end -->"


def render() -> str:
    rows = ["| key | type | what |", "|---|---|---|"]
    rows += [f"| `{d.key}` | {d.type} | {d.what} |" for d in layout()]
    return "\n".join(rows)


def rewrite(text: str) -> str:
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    return pattern.sub(lambda _m: f"{START}\n{render()}\n{END}", text)


if __name__ == "__main__":
    DESIGN.write_text(rewrite(DESIGN.read_text()))
