"""What a new user hits first: installs, command-line errors, the first worker (issue 18)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A sitecustomize that makes `import fastapi` / `import uvicorn` fail, as in an install without
# the `api` extra (simulated: uninstalling would break the shared venv).
BLOCKER = """
import sys

class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Block())
"""


def _without_api_extra(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "dtq_api", *argv],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("argv", [(), ("--help",), ("--port", "0")])
def test_api_without_its_extra_says_what_to_install(tmp_path: Path, argv: tuple[str, ...]) -> None:
    p = _without_api_extra(tmp_path, *argv)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "pip install 'dtq[api]'" in lines[0]


def test_api_help_works_with_its_extra() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "dtq_api", "--help"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert "dtq-api" in p.stdout
