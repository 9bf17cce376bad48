"""The wheel ships the Lua scripts and type markers, and dtq finds its scripts inside it; the
benchmark suite stays in the checkout, and `dtq bench` from the wheel says so."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_wheel_contains_lua_and_loads_it(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("dtq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    lua = sorted(p.relative_to(ROOT / "lua").as_posix() for p in (ROOT / "lua").rglob("*.lua"))
    assert any(n.startswith("includes/") for n in lua)
    assert {f"dtq/lua/{n}" for n in lua} <= names
    assert {"dtq/py.typed", "dtq_worker/py.typed", "dtq_worker/main.py"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c",
         "import dtq.scripts.runner as s; print(s._lua_dir()); s.source('claim')"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert out.strip() == str(site / "dtq" / "lua")

    # The benchmark (bench/dtq_bench) is not shipped: no module of it, under any package.
    assert not [n for n in names if "bench" in n.split("/")[0] or "/benchmark/" in n]
    proc = subprocess.run(
        [sys.executable, "-c", "from dtq.cli import main; main(['bench', '--quick'])"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "run it from a dtq checkout" in proc.stderr
