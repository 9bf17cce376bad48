"""No runtime import circle among the modules of ``libs/dtq`` and ``apps/*`` (issue 33).

The graph is read from the source with :mod:`ast`, not by importing it. Its rule:

* A node is one module file (a package is its ``__init__.py``).
* Every ``import``/``from ... import`` statement is an edge, wherever it stands: at module
  level, inside a function (it runs when the function is called: a deferred import is still a
  circle, only hidden) or inside ``try``. The one exception is a block under
  ``if TYPE_CHECKING:`` (never run); its ``else:`` branch counts.
* ``from pkg import name`` leads to ``pkg.name`` when that is a module, else to ``pkg`` itself;
  a name of ``dtq``'s lazy public surface (``dtq._HOMES``, loaded by its PEP 562
  ``__getattr__``) leads to the module that defines it.
* Importing ``a.b.c`` is an edge to ``a.b.c`` only, not to the packages ``a`` and ``a.b`` on
  its way: a package's ``__init__`` that re-exports its own submodules is not a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "libs", ROOT / "apps" / "api", ROOT / "apps" / "worker"]


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for src in SOURCES:
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under ``node`` that can run (those under TYPE_CHECKING left out)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]))
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _imports(child)


def _lazy_homes(init: Path) -> dict[str, str]:
    """dtq/__init__.py's ``_HOMES``: each lazy public name and its module (the dict's literal)."""
    tree = ast.parse(init.read_text())
    for stmt in tree.body:
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) == "_HOMES":
            value = stmt.value
            break
    else:
        raise AssertionError("dtq/__init__.py has no _HOMES")
    assert isinstance(value, ast.Dict)
    homes: dict[str, str] = {}
    for key, val in zip(value.keys, value.values, strict=True):
        if key is not None:  # "Name": "module"
            homes[ast.literal_eval(key)] = ast.literal_eval(val)
            continue
        # **dict.fromkeys((names...), "module")
        assert isinstance(val, ast.Call), ast.dump(val)
        names, module = (ast.literal_eval(a) for a in val.args)
        homes.update(dict.fromkeys(names, module))
    return homes


def import_graph() -> dict[str, set[str]]:
    """Each module of libs/ and apps/ and the modules of them it imports at run time."""
    modules = _modules()
    homes = _lazy_homes(modules["dtq"])
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        edges: set[str] = set()
        for stmt in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(stmt, ast.Import):
                edges.update(a.name for a in stmt.names if a.name in modules)
                continue
            base = here[: len(here) - stmt.level + 1] if stmt.level else []
            pkg = ".".join([*base, *(stmt.module.split(".") if stmt.module else [])])
            for alias in stmt.names:
                sub = f"{pkg}.{alias.name}"
                if sub in modules:
                    edges.add(sub)
                elif pkg == "dtq" and alias.name in homes:
                    edges.add(homes[alias.name])
                elif pkg in modules:
                    edges.add(pkg)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle for each strongly connected part with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    parts: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                parts.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, set(p)) for p in parts]


def _circle(graph: dict[str, set[str]], part: set[str]) -> list[str]:
    """A shortest circle through the first module of a strongly connected part (BFS)."""
    start = min(part)
    prev: dict[str, str] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & part):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    raise AssertionError(f"no circle in {sorted(part)}")


def test_the_graph_is_read() -> None:
    graph = import_graph()
    # The walker sees the edges it is meant to (else an empty graph would pass).
    assert "dtq.errors" in graph["dtq.app"]
    assert "dtq_worker.worker" in graph["dtq_worker.main"]
    assert {"dtq.schedules.model", "dtq.schedules.ops"} <= graph["dtq.schedules"]


def test_the_walker_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_type_checking_imports_are_left_out() -> None:
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
    names = [a.name for s in _imports(ast.parse(src)) for a in s.names]
    assert names == ["TYPE_CHECKING", "b"]


def test_no_runtime_import_circle() -> None:
    found = cycles(import_graph())
    assert not found, "runtime import circles:\n" + "\n".join(" -> ".join(c) for c in found)
