"""Running the peer task queues through ``bench/peers/run_peer.py`` in their own virtualenvs.

The peers are never dtq dependencies: ``bench/setup_peers.sh`` installs them into
``build/bench/peers-venv`` (and a second venv for the ones that pin an older redis-py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

LIBS = ("dramatiq", "taskiq", "arq", "saq", "streaq", "celery", "rq")
# Alternative settings worth knowing about (bench/peers/README.md, "Variants"), run with
# ``dtq bench --variants``: (library, variant, workload). Their rows read "lib:variant".
VARIANTS: tuple[tuple[str, str, str], ...] = (
    ("arq", "stock", "A"), ("arq", "stock", "C"),
    ("taskiq", "list", "A"), ("taskiq", "list", "C"),
    ("celery", "prefork", "A"),
    ("rq", "simple", "A"),
)  # fmt: skip


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


class Peers:
    def __init__(self, root: Path, log: Any) -> None:
        self.root = root
        self.runner = root / "bench" / "peers" / "run_peer.py"
        self.setup = root / "bench" / "setup_peers.sh"
        self.python = root / "build" / "bench" / "peers-venv" / "bin" / "python"
        self.log = log
        self.why_not = ""

    def available(self, setup: bool) -> bool:
        """True when run_peer.py and its venv are there (setting the venv up if allowed)."""
        if not self.runner.exists():
            self.why_not = f"{self.runner.relative_to(self.root)} not found"
            return False
        if not self.python.exists() and setup and self.setup.exists():
            self.log(f"setting up the peers' virtualenv: bash {self.setup.name} (one-off)")
            proc = subprocess.run(["bash", str(self.setup)], cwd=self.root, check=False)
            if proc.returncode != 0:
                self.why_not = f"bench/setup_peers.sh failed with exit code {proc.returncode}"
                return False
        if not self.python.exists():
            self.why_not = f"no peers virtualenv at {self.python.parent.parent}"
            return False
        return True

    def run(self, lib: str, workload: str, url: str, timeout: float, **opts: Any) -> dict[str, Any]:
        """One run of one workload; the runner prints one JSON object on its last line."""
        cmd = [
            str(self.python), str(self.runner), "--lib", lib, "--workload", workload,
            "--redis-url", url, "--timeout", str(timeout),
        ]  # fmt: skip
        for k, v in opts.items():
            if v is not None:
                cmd += [f"--{k.replace('_', '-')}", str(v)]
        proc = subprocess.Popen(
            cmd, cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = proc.communicate(timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return {"lib": lib, "workload": workload, "error": f"no answer in {timeout + 60:g}s"}
        except BaseException:
            # The suite was interrupted (Ctrl-C, SIGTERM): a SIGTERM lets the runner kill its
            # workers' process groups, where subprocess.run's SIGKILL would orphan them (and
            # they would load the machine for whatever runs next).
            _stop(proc)
            raise
        lines = [ln for ln in out.splitlines() if ln.strip().startswith("{")]
        if not lines:
            tail = (err or out)[-500:]
            return {"lib": lib, "workload": workload, "error": f"no JSON output: {tail}"}
        try:
            res: dict[str, Any] = json.loads(lines[-1])
        except ValueError as exc:
            return {"lib": lib, "workload": workload, "error": f"bad JSON output: {exc}"}
        res.pop("worker_log_tail", None) if "error" not in res else None
        return res


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the runner (it kills its workers on the way out), SIGKILL if it lingers."""
    proc.terminate()
    try:
        proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def python_version() -> str:
    return sys.version.split()[0]
