"""fakeredis is the ``testing`` extra, not a dependency of every user: where dtq needs it
(``dtq dev`` without redis-server, ``dtq.testing``) and it is missing, one line says what to
install."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

HINT = "pip install 'dtq[testing]'"
# Runs Python with fakeredis made unimportable (a None entry in sys.modules).
NO_FAKEREDIS = "import sys; sys.modules['fakeredis'] = None; "


def test_fakeredis_is_the_testing_extra_and_in_dev() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("fakeredis") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(d.startswith("fakeredis[lua]") for d in extras["testing"])
    assert "dtq[testing]" in extras["dev"]


def test_dtq_testing_says_what_to_install() -> None:
    p = subprocess.run(
        [sys.executable, "-c", NO_FAKEREDIS + "import dtq.testing"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode != 0
    assert HINT in p.stderr.splitlines()[-1]


def test_dtq_dev_without_redis_server_or_fakeredis_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "python3").symlink_to(sys.executable)  # a PATH without redis-server
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    p = subprocess.run(
        [sys.executable, "-c",
         NO_FAKEREDIS + "from dtq.cli.dev import main; main(['--timeout', '5'])"],
        cwd=ROOT, env={**env, "PATH": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr
    assert HINT in p.stdout + p.stderr
    assert "Traceback" not in p.stderr
