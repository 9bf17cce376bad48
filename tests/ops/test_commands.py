"""The command lines' day-one conventions: versions, the level flag, a global --json, errors
that name the flag, a busy API port, and the worker's start-up line."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, make_settings, wait_until, worker_env
from tests.redis_server import free_port

BIN = Path(sys.executable).parent


def _cmd(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env)  # fmt: skip


@pytest.mark.parametrize("exe", ["dtq", "dtq-worker", "dtq-api"])
def test_every_command_prints_its_version(exe: str) -> None:
    r = _cmd(str(BIN / exe), "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"{exe} 0.1.0", r


def test_json_before_the_command_is_the_same_as_after(redis_server: Any, prefix: str) -> None:
    env = worker_env(make_settings(redis_server.url, prefix))
    for argv in (["queues"], ["workers"], ["dlq", "list"]):
        before = _cmd(str(BIN / "dtq"), "--json", *argv, env=env)
        after = _cmd(str(BIN / "dtq"), *argv, "--json", env=env)
        assert before.returncode == after.returncode, (before, after)
        assert before.stdout == after.stdout and before.stdout.lstrip()[:1] in "[{", before


def test_a_bad_flag_value_names_the_flag(redis_server: Any, prefix: str) -> None:
    env = worker_env(make_settings(redis_server.url, prefix))
    r = _cmd(sys.executable, "-m", "dtq_worker", "tests.apps.basic:app", "--concurrency", "0",
             env=env)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "dtq-worker: invalid --concurrency: Input should be greater than 0"
    ], r.stderr
    env["DTQ_WORKER_CONCURRENCY"] = "0"
    r = _cmd(sys.executable, "-m", "dtq_worker", "tests.apps.basic:app", env=env)
    assert r.returncode == 2 and "DTQ_WORKER_CONCURRENCY" in r.stderr, r.stderr


def test_api_on_a_busy_port_is_one_line_and_exit_2() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = _cmd(str(BIN / "dtq-api"), "--port", str(port))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dtq-api: cannot listen on 127.0.0.1:{port}")
    assert "in use" in lines[0]
    h = _cmd(str(BIN / "dtq-api"), "--help")
    assert "Exit codes" in h.stdout and "port" in h.stdout.split("Exit codes", 1)[1]


def test_the_start_line_names_the_tasks_and_the_metrics_address(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    s = make_settings(redis_server.url, prefix)
    port = free_port()
    w = spawn_worker("tests.apps.logging_app:app", s, DTQ_METRICS_PORT=str(port))
    wait_until(lambda: " started: " in w.output(), timeout=30)
    line = next(x for x in w.output().splitlines() if " started: " in x)
    assert "tasks=boom,boom_once,chatty,sync_chatty" in line
    assert f"metrics=http://0.0.0.0:{port}/metrics" in line
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
