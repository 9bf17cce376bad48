"""What a worker says at start and stop when something around it is wrong (issue 18, item 6)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from dtq import Client
from dtq.settings import Settings
from tests.conftest import ROOT, wait_until, worker_env


def _notes(r: redis.Redis, settings: Settings, task_id: str) -> list[str]:
    rows = r.lrange(f"{settings.key_prefix}:test:notes", 0, -1)
    return [x.split("|")[2] for x in rows if x.startswith(task_id + "|")]


def test_sync_task_failing_after_a_cancel_logs_no_unretrieved_future(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    w = spawn_worker("tests.apps.lifecycle:app", settings)
    with Client(settings=settings) as c:
        h = c.enqueue("sync_fail_on_cancel", [30])
        wait_until(lambda: _notes(r, settings, h.id) == ["start"])
        assert c.cancel(h.id)
        wait_until(lambda: _notes(r, settings, h.id) == ["start", "noticed"])
        wait_until(lambda: c.get(h.id).status == "cancelled")
        # A second task after the first: the loop has run its callbacks (and collected) since.
        h2 = c.enqueue("echo", [1])
        assert c.result(h2.id, timeout=20) == 1
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    out = w.output()
    assert "was never retrieved" not in out, out
    assert "Traceback" not in out, out


def test_busy_metrics_port_is_a_configuration_error(settings: Settings, spawn_worker: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        w = spawn_worker("tests.apps.lifecycle:app", settings, DTQ_METRICS_PORT=str(port))
        code = w.wait(60)
    out = w.output()
    assert code == 2, out
    assert "DTQ_METRICS_PORT" in out and "Redis unreachable" not in out, out


def _worker_cli(tmp_path: Path, spec: str, settings: Settings) -> subprocess.CompletedProcess[str]:
    env = worker_env(settings, PYTHONPATH=f"{tmp_path}:{ROOT}")
    return subprocess.run(
        [sys.executable, "-m", "dtq_worker", spec], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=60,
    )  # fmt: skip


def test_import_error_in_the_users_module_names_file_and_line(
    tmp_path: Path, settings: Settings
) -> None:
    (tmp_path / "brokentasks.py").write_text("from dtq import App\n\napp = App()\nx = 1 / 0\n")
    p = _worker_cli(tmp_path, "brokentasks:app", settings)
    assert p.returncode == 2
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1, p.stderr
    assert "ZeroDivisionError" in line
    assert f"{tmp_path / 'brokentasks.py'}:4" in line, line


def test_missing_app_attribute_says_it_does_not_exist(tmp_path: Path, settings: Settings) -> None:
    (tmp_path / "fine_tasks.py").write_text("from dtq import App\n\napp = App()\n")
    p = _worker_cli(tmp_path, "fine_tasks:nope", settings)
    assert p.returncode == 2
    assert "has no attribute 'nope'" in p.stderr, p.stderr
    assert "app" in p.stderr.split("has no attribute")[1]  # names the App it did find
    assert "NoneType" not in p.stderr


def test_second_worker_with_a_live_workers_id_is_refused(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    first = spawn_worker("tests.apps.lifecycle:app", settings, "--worker-id", "twin")
    key = f"{settings.key_prefix}:worker:twin"
    wait_until(lambda: r.hget(key, "status") == "ready")
    second = spawn_worker("tests.apps.lifecycle:app", settings, "--worker-id", "twin")
    assert second.wait(60) == 2
    out = second.output()
    assert "worker id 'twin' is in use" in out and str(first.proc.pid) in out, out
    assert first.proc.poll() is None
    assert r.hget(key, "pid") == str(first.proc.pid)
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    # Once the first stopped, the id is free again.
    third = spawn_worker("tests.apps.lifecycle:app", settings, "--worker-id", "twin")
    wait_until(lambda: r.hget(key, "pid") == str(third.proc.pid))
    third.signal(signal.SIGTERM)
    assert third.wait(30) == 0


def test_worker_without_redis_exits_promptly_saying_where_it_looked(tmp_path: Path) -> None:
    """Nothing listens at DTQ_REDIS_URL (a first try without Redis): exit 1 with one line well
    before the heartbeat TTL (15 s with the defaults used here), not after it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    env.update(DTQ_REDIS_URL=f"redis://127.0.0.1:{port}/0", PYTHONPATH=str(ROOT))
    began = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "dtq_worker", "tests.apps.lifecycle:app"], capture_output=True,
        text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - began
    print(f"exit {p.returncode} after {took:.1f}s")
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "Redis unreachable" in last and str(port) in last and "DTQ_REDIS_URL" in last, last
    assert took < 12, took  # generous: the startup window is 2 s; the TTL alone was 15 s


async def test_owner_and_task_names_are_published_again_after_the_hash_expired(
    settings: Settings, r: redis.Redis
) -> None:
    from tests.apps.lifecycle import app
    from tests.conftest import running_worker

    async with running_worker(app, settings) as w:
        key = f"{settings.key_prefix}:worker:{w.worker_id}"
        await _until(lambda: r.hget(key, "tasks") is not None)
        r.delete(key)  # as if it expired while the process was frozen
        await _until(lambda: r.hget(key, "tasks") is not None and r.hget(key, "owner"))
        assert "echo" in json.loads(r.hget(key, "tasks") or "[]")


async def _until(pred: Any, timeout: float = 20.0) -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _stopping_holder(r: redis.Redis, settings: Settings, wid: str) -> str:
    """The heartbeat hash of a live worker of another host that is draining under ``wid``."""
    key = f"{settings.key_prefix}:worker:{wid}"
    r.hset(key, mapping={"owner": "elsewhere:4242", "status": "draining"})
    r.pexpire(key, 120_000)
    return key


def test_a_worker_id_held_by_a_stopping_worker_past_the_wait_exits_4(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    """Waited for (drain + hard exit + heartbeat TTL of this worker's settings), then a
    non-configuration exit: a restart may find the id free."""
    key = _stopping_holder(r, settings, "held")
    w = spawn_worker("tests.apps.lifecycle:app", settings, "--worker-id", "held",
                     DTQ_DRAIN_TIMEOUT_S="0.5", DTQ_HARD_EXIT_S="0.5")  # fmt: skip
    assert w.wait(60) == 4, w.output()
    out = w.output()
    assert "is held by pid 4242 on elsewhere (draining): waiting up to 2s" in out, out
    assert "worker id 'held' is still held by pid 4242 on elsewhere" in out, out
    assert r.hget(key, "owner") == "elsewhere:4242"


def test_a_worker_stopped_while_it_waits_for_its_id_exits_0_and_leaves_the_holder(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    key = _stopping_holder(r, settings, "held2")
    w = spawn_worker("tests.apps.lifecycle:app", settings, "--worker-id", "held2",
                     DTQ_DRAIN_TIMEOUT_S="60")  # fmt: skip
    wait_until(lambda: "waiting up to" in w.output(), timeout=60)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert r.hget(key, "owner") == "elsewhere:4242"  # its farewell did not delete the hash
    assert r.hget(key, "status") == "draining"


def test_a_worker_waiting_for_its_id_starts_once_the_holder_is_gone(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    key = _stopping_holder(r, settings, "held3")
    w = spawn_worker("tests.apps.lifecycle:app", settings, "--worker-id", "held3",
                     DTQ_DRAIN_TIMEOUT_S="60")  # fmt: skip
    wait_until(lambda: "waiting up to" in w.output(), timeout=60)
    r.delete(key)  # the holder's farewell
    wait_until(lambda: r.hget(key, "pid") == str(w.proc.pid), timeout=30)
    assert "worker id 'held3' is free now: starting" in w.output()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()


def test_app_forms_a_path_a_module_alone_and_what_they_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtq.app import App, load_app
    from dtq.errors import ConfigError

    (tmp_path / "one_app.py").write_text("from dtq import App\n\napp = App()\n")
    (tmp_path / "two_apps.py").write_text("from dtq import App\n\na = App()\nb = App()\n")
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("NAME = 'helped'\n")
    (pkg / "tasks.py").write_text(
        "from dtq import App\n\nfrom .helpers import NAME\n\napp = App()\napp.name = NAME\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert isinstance(load_app("one_app.py:app"), App)
    assert isinstance(load_app("one_app"), App)  # the module's only App
    assert isinstance(load_app("one_app.py"), App)
    assert getattr(load_app("proj/tasks.py:app"), "name", None) == "helped"  # relative import
    with pytest.raises(ConfigError, match=r"names no dtq.App.*it holds a, b"):
        load_app("two_apps")
    with pytest.raises(ConfigError, match=r"no file 'nope\.py'"):
        load_app("nope.py:app")


def test_a_worker_starts_from_a_files_path(tmp_path: Path, settings: Settings) -> None:
    (tmp_path / "pathtasks.py").write_text("from dtq import App\n\napp = App()\n")
    env = worker_env(settings, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(
        [sys.executable, "-m", "dtq_worker", "pathtasks.py:app"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if " started: " in line:
                break
        else:
            raise AssertionError("the worker ended without starting")
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
