"""The scripts' includes (lua/includes/<name>.lua, one helper per file): the loader
(dtq.scripts.runner.assemble) sends each include a script names, directly or through another
include, once and before its first use, and nothing else; it refuses a missing include and a
cycle."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtq.scripts import runner


def _write(d: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = d / f"{name}.lua"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return d


def test_each_include_once_after_what_it_includes_and_nothing_else(tmp_path: Path) -> None:
    d = _write(
        tmp_path,
        {
            "s": "-- s.lua: the script\n-- include: c\n-- include: b\n\n-- why\nreturn c() + b()\n",
            "includes/a": "-- a's header\n\nlocal function a()\n  -- inside\n  return 1\nend\n",
            "includes/b": "-- include: a\nlocal function b() return a() + 1 end\n",
            "includes/c": "-- include: b\n-- include: a\nlocal function c() return b() end\n",
            "includes/unused": "local function unused() return 0 end\n",
        },
    )
    assert runner.assemble(d, "s") == (
        "-- s.lua: the script\n"  # the script's first line names it; other comments go
        "local function a()\n  return 1\nend\n"
        "local function b() return a() + 1 end\n"
        "local function c() return b() end\n"
        "return c() + b()\n"
    )


def test_a_missing_include_is_refused_naming_who_asked(tmp_path: Path) -> None:
    d = _write(
        tmp_path,
        {
            "s": "-- s.lua\n-- include: a\nreturn a()\n",
            "t": "-- t.lua\n-- include: nothere\nreturn 1\n",
            "includes/a": "-- include: gone\nlocal function a() return 1 end\n",
        },
    )
    with pytest.raises(runner.IncludeError, match=r"^a includes gone: no .*includes/gone\.lua$"):
        runner.assemble(d, "s")
    with pytest.raises(runner.IncludeError, match=r"^t\.lua includes nothere"):
        runner.assemble(d, "t")


def test_a_cycle_is_refused(tmp_path: Path) -> None:
    d = _write(
        tmp_path,
        {
            "s": "-- s.lua\n-- include: a\nreturn a()\n",
            "self": "-- self.lua\n-- include: b\nreturn b()\n",
            "includes/a": "-- include: b\nlocal function a() return b() end\n",
            "includes/b": "-- include: c\nlocal function b() return c() end\n",
            "includes/c": "-- include: a\nlocal function c() return 1 end\n",
        },
    )
    with pytest.raises(runner.IncludeError, match=r"^includes form a cycle: a -> b -> c -> a$"):
        runner.assemble(d, "s")
    # A script may share its name with an include (flow_apply.lua includes flow_apply).
    _write(d, {"includes/self": "local function self_() return 1 end\n"})
    _write(d, {"b": "-- b.lua\n-- include: self\nreturn self_()\n"})
    assert runner.assemble(d, "b").endswith("local function self_() return 1 end\nreturn self_()\n")
