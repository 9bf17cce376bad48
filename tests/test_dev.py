"""`dtq dev` runs the whole system with no setup: private redis-server or fakeredis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def run_dev(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in env.items() if not k.startswith("DTQ_")}
    return subprocess.run(
        [sys.executable, "-m", "dtq.dev", "--timeout", "40"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def check(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "flaky: fails twice, retries  succeeded  3" in out
    assert "reject: dtq.Fail -> DLQ      failed" in out
    assert out.count("  succeeded  ") == 13
    assert "stopped the worker and Redis" in out
    assert "dashboard and API on http://127.0.0.1:" in out


def test_dev_with_private_redis_server() -> None:
    p = run_dev(dict(os.environ))
    assert "started a private redis-server" in p.stdout
    check(p)


def test_dev_falls_back_to_fakeredis(tmp_path: Path) -> None:
    # A PATH without redis-server: only the interpreter is reachable.
    (tmp_path / "python3").symlink_to(sys.executable)
    p = run_dev({**os.environ, "PATH": str(tmp_path)})
    assert "using an in-process fakeredis server instead" in p.stdout
    check(p)
