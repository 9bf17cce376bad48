"""The docs' examples run as a user runs them: each fenced ```python block whose first line names
a file (``# tasks.py``) is written to that file in an empty folder; a real ``dtq-worker``
process imports the tasks module from there, and the client script runs as ``python
script.py`` against a private redis-server. The README's Quick start also passes
``mypy --strict``."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.redis_server import RedisServer, free_port

BIN = Path(sys.executable).parent
FILE_BLOCK = re.compile(r"```python\n# ([\w.]+\.py)\n(.*?)```", re.S)


def file_blocks(page: str) -> dict[str, str]:
    """The blocks of ``page`` (a path under the checkout) that name their file, by file name."""
    found: dict[str, str] = {}
    for name, code in FILE_BLOCK.findall((ROOT / page).read_text()):
        assert name not in found, f"{page}: two blocks named {name}"
        found[name] = f"# {name}\n{code}"
    return found


@dataclass
class Example:
    folder: Path
    env: dict[str, str]

    def write(self, page: str, *names: str) -> None:
        blocks = file_blocks(page)
        for name in names:
            assert name in blocks, f"{page} has no ```python block starting '# {name}'"
            (self.folder / name).write_text(blocks[name])

    @contextlib.contextmanager
    def process(
        self, *argv: str, cwd: Path | None = None, codes: tuple[int, ...] = (0,)
    ) -> Iterator[subprocess.Popen[bytes]]:
        """``argv`` running in the folder (or ``cwd``) while the block runs, then stopped with
        SIGTERM (a graceful drain for a worker); it must exit with one of ``codes``. Its output
        goes to a log."""
        log = self.folder / f"{Path(argv[0]).name}-{secrets.token_hex(3)}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                argv, cwd=cwd or self.folder, env=self.env, stdout=fh, stderr=subprocess.STDOUT
            )
            try:
                yield proc
            except BaseException:
                proc.kill()
                proc.wait(10)
                print(log.read_text(errors="replace"))
                raise
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                code = proc.wait(60)
        assert code in codes, f"{argv} exited {code}:\n{log.read_text(errors='replace')}"

    def run(self, worker_app: str, script: str, timeout: float = 60) -> str:
        """``python script`` in the folder while ``dtq-worker worker_app`` runs there; the
        script's stdout. Fails on any non-zero exit."""
        with self.process(str(BIN / "dtq-worker"), worker_app, "--concurrency", "4"):
            p = subprocess.run(
                [sys.executable, script], cwd=self.folder, env=self.env,
                capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
            assert p.returncode == 0, f"{script}: {p.stderr}"
        return p.stdout


@pytest.fixture
def example(tmp_path: Path, redis_server: RedisServer, prefix: str) -> Iterator[Example]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_") and k != "PYTHONPATH"}
    env.update(DTQ_REDIS_URL=redis_server.url, DTQ_KEY_PREFIX=prefix, DTQ_DRAIN_TIMEOUT_S="10")
    yield Example(tmp_path, env)


def test_readme_quick_start_runs(example: Example) -> None:
    example.write("README.md", "tasks.py", "client.py")
    out = example.run("tasks:app", "client.py").splitlines()
    assert out == ["report for 2026-11-30", "a@b.c", "succeeded"], out


def test_readme_quick_start_passes_mypy_strict(tmp_path: Path) -> None:
    for name, code in file_blocks("README.md").items():
        (tmp_path / name).write_text(code)
    p = subprocess.run(
        [str(BIN / "mypy"), "--strict", "--no-incremental", "tasks.py", "client.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_arguments_example_runs(example: Example) -> None:
    """docs/arguments.md: the worker imports the tasks module alone (no client code in it)."""
    example.write("docs/arguments.md", "invoices.py", "bill.py")
    out = example.run("invoices:app", "bill.py").splitlines()
    assert out == ["Invoice A-1: 19.90 due 2026-03-01 09:30:00+01:00"], out


def test_lifecycle_progress_example_shows_progress_while_running(example: Example) -> None:
    """docs/lifecycle.md: the progress of a running task is visible before it ends."""
    example.write("docs/lifecycle.md", "imports.py", "watch_import.py")
    (example.folder / "rows.txt").write_text("".join(f"row {i}\n" for i in range(200)))
    out = example.run("imports:app", "watch_import.py").splitlines()
    assert len(out) == 2, out
    status, current, total = out[0].split()
    assert status == "running" and total == "200" and 1 <= int(current) <= 200, out
    assert out[1] == "imported 200 rows", out


def test_fastapi_example_served_by_uvicorn(example: Example) -> None:
    """docs/integrations/fastapi.md, run as it says: a worker, uvicorn, HTTP requests."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    app = "docs.examples.fastapi_app"
    with (
        example.process(str(BIN / "dtq-worker"), f"{app}:tasks", cwd=ROOT),
        # uvicorn ends its graceful shutdown by re-raising the SIGTERM it caught
        example.process(
            str(BIN / "uvicorn"),
            f"{app}:api",
            "--port",
            str(port),
            cwd=ROOT,
            codes=(0, -signal.SIGTERM),
        ) as web,  # fmt: skip
    ):
        deadline = time.monotonic() + 30
        while True:
            assert web.poll() is None and time.monotonic() < deadline, "uvicorn did not start"
            try:
                started = httpx.post(f"{base}/reports/2026-11-30", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert started.status_code == 202, started.text
        task_id = started.json()["task_id"]
        while (body := httpx.get(f"{base}/tasks/{task_id}", timeout=5).json())["status"] != (
            "succeeded"
        ):
            assert time.monotonic() < deadline, body
            time.sleep(0.05)
        assert body == {"status": "succeeded", "result": "report for 2026-11-30", "error": None}
        for unknown in ("default:" + "0" * 28, "not-a-task-id"):
            r = httpx.get(f"{base}/tasks/{unknown}", timeout=5)
            assert (r.status_code, r.json()) == (404, {"detail": "no such task"}), unknown
