"""What a new user hits first: installs, command-line errors, the first worker (issue 18)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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


def test_worker_warns_when_redis_url_is_left_at_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dtq.settings import Settings
    from dtq.store.connection import default_url_warning, display_url

    monkeypatch.delenv("DTQ_REDIS_URL", raising=False)
    warning = default_url_warning(Settings())
    assert warning is not None
    assert "DTQ_REDIS_URL is not set" in warning and "localhost:6379" in warning
    assert "dtq dev" in warning
    monkeypatch.setenv("DTQ_REDIS_URL", "redis://elsewhere:6390/0")
    assert default_url_warning(Settings()) is None
    assert default_url_warning(Settings(redis_url="redis://x:1/0")) is None
    assert display_url("redis://user:s3cret@h:1/0") == "redis://user:***@h:1/0"
    assert "s3cret" not in display_url("rediss://:s3cret@h:1/0")


def test_readme_quick_start_says_to_start_redis_first() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```python", 1)[0]
    assert "DTQ_REDIS_URL" in quick and "redis-server" in quick and "dtq dev" in quick
    assert "pip install 'dtq[api]'" in readme


def test_make_install_says_how_to_activate_the_venv() -> None:
    p = subprocess.run(["make", "-s", "install"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "source .venv/bin/activate" in p.stdout


def test_make_demo_installs_only_the_api_and_testing_extras_and_keeps_running() -> None:
    # testing: fakeredis, the demo's Redis where no redis-server is installed (dtq dev)
    makefile = (ROOT / "Makefile").read_text()
    demo_stamp = makefile.split("$(DEMO_STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert '".[api,testing]"' in demo_stamp and "dev" not in demo_stamp.replace("DEMO_VENV", "")
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "dtq.cli.dev --keep" in demo
