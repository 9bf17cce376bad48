"""docs/integrations stay true: one page per integration, linked from the README; their Python
compiles; the example modules they show are the ones make lint type-checks and tests run."""

from __future__ import annotations

import re

from tests.conftest import ROOT

PAGES = ("middleware", "opentelemetry", "sentry", "fastapi", "django")
DOCS = ROOT / "docs" / "integrations"


def blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_a_page_per_integration_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert (DOCS / f"{page}.md").is_file(), page
        assert f"(docs/integrations/{page}.md)" in readme, page


def test_every_python_block_compiles() -> None:
    n = 0
    for path in sorted(DOCS.glob("*.md")):
        for i, code in enumerate(blocks(path.read_text())):
            compile(code, f"{path.name}[{i}]", "exec")
            n += 1
    assert n >= 9  # every page has its examples


def test_the_pages_show_the_checked_examples_verbatim() -> None:
    for page, example in (("fastapi", "fastapi_app.py"), ("django", "django_dtq_worker.py")):
        code = (ROOT / "docs" / "examples" / example).read_text()
        assert code in blocks((DOCS / f"{page}.md").read_text()), (page, example)


def test_links_between_docs_resolve() -> None:
    for path in sorted(DOCS.glob("*.md")):
        for target in re.findall(r"\]\(([^)#:]+)\)", path.read_text()):
            assert (path.parent / target).exists(), (path.name, target)
