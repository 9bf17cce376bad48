"""The scripts' includes (lua/includes/<name>.lua, one helper per file): the loader
(dtq.scripts.runner.assemble) sends each include a script names, directly or through another
include, once and before its first use, and nothing else; it refuses a missing include and a
cycle. And the real files name exactly the includes their code uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dtq.scripts import runner
from tests.conftest import ROOT

LUA = ROOT / "lua"
INCLUDES = sorted((LUA / "includes").glob("*.lua"))
SCRIPTS = sorted(LUA.glob("*.lua"))
# A top-level definition: ``local function f(`` or ``local a, b = ...`` / ``local A`` (column 0).
DEFINES = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*(?:=|$))", re.M)


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


def _defined(text: str) -> set[str]:
    names: set[str] = set()
    for m in DEFINES.finditer(text):
        names |= {m.group(1)} if m.group(1) else {n.strip() for n in m.group(2).split(",")}
    return names


def _code_words(text: str) -> set[str]:
    return set(re.findall(r"\w+", "\n".join(line.split("--", 1)[0] for line in text.splitlines())))


def test_every_file_includes_exactly_what_its_code_uses() -> None:
    """A name an include defines, used without its include line, would be a nil global where it
    runs (on a rare path, maybe: the claim's expiry of a workflow step); an include named but
    not used is text sent for nothing and a closure made on every call."""
    defines = {p.stem: _defined(p.read_text()) for p in INCLUDES}
    wrong = {}
    for path in [*SCRIPTS, *INCLUDES]:
        text = path.read_text()
        own = _defined(text) if path.parent.name == "includes" else set()
        used = _code_words(text) - own
        needed = {inc for inc, names in defines.items() if names & used}
        named = set(runner.includes_of(text))
        if named != needed:
            wrong[path.relative_to(LUA).as_posix()] = (
                sorted(named - needed),
                sorted(needed - named),
            )
    assert wrong == {}, "(named but unused, used but not named)"


def test_each_include_is_one_helper_named_as_its_file_and_is_used() -> None:
    used = set()
    for p in [*SCRIPTS, *INCLUDES]:
        used |= set(runner.includes_of(p.read_text()))
    for p in INCLUDES:
        names = _defined(p.read_text())
        functions = set(re.findall(r"^local function (\w+)", p.read_text(), re.M))
        # One function, named as the file, with the constants or state it keeps; or constants.
        assert functions == {p.stem} or (not functions and all(n.isupper() for n in names)), p
        assert p.stem in used, f"{p.name}: no script includes it"


def test_the_real_scripts_carry_only_what_they_include() -> None:
    enqueue = runner.source("enqueue")
    assert "local function emit(" in enqueue and "local function finish(" not in enqueue
    complete = runner.source("complete")
    assert complete.startswith("-- complete.lua: ")
    assert complete.count("local function finish(") == 1  # (complete and claim_entries use it)
    assert complete.index("local function finish(") < complete.index(
        "local function claim_entries("
    )
    for p in SCRIPTS:
        assert "\n--" not in runner.source(p.stem), p.name  # comments stay in the files
