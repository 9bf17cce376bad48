"""A ``dtq-api`` subprocess for tests that need a real HTTP server (SSE, Prometheus, browser)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from dtq.settings import Settings
from tests.conftest import ROOT, worker_env
from tests.redis_server import free_port


class ApiProc:
    def __init__(self, settings: Settings, args: Sequence[str] = (), **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"dtq-api-{secrets.token_hex(4)}.log"
        self._fh = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dtq_api", "--port", str(self.port), *args],
            cwd=ROOT,
            env=worker_env(settings, **env),
            stdout=self._fh,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dtq-api did not start:\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._fh.close()
