"""`dtq dev` runs the whole system with no setup: private redis-server or fakeredis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def run_dev(env: dict[str, str], *args: str, **dtq: str) -> subprocess.CompletedProcess[str]:
    """``dtq dev`` with no DTQ_ setting but those given in ``dtq``."""
    env = {**{k: v for k, v in env.items() if not k.startswith("DTQ_")}, **dtq}
    return subprocess.run(
        [sys.executable, "-m", "dtq.cli.dev", "--timeout", "40", *args],
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


def _users_data(url: str) -> dict[str, bytes | None]:
    """Every key of the user's Redis with its DUMP: a queued task and a code schedule of theirs
    on ``default``, as the quick start leaves them."""
    import redis

    r = redis.Redis.from_url(url)
    try:
        return {k.decode(): r.dump(k) for k in r.scan_iter("*") if not k.startswith(b"dtq-dev")}
    finally:
        r.close()


def _seed_user(url: str) -> str:
    import redis

    from dtq import Client
    from dtq import scripts as sc
    from dtq.schedules import Schedule, add_schedule
    from dtq.schedules.ops import put_call
    from dtq.settings import load_settings

    with Client(settings=load_settings(redis_url=url, key_prefix="dtq")) as c:
        h = c.enqueue("payments.charge", args=["order-1"])
        add_schedule(c, Schedule(name="nightly-report", task="reports.build", every=86400))
        code = Schedule(name="charge-sweep", task="payments.charge", every=3600, source="code")
        r = redis.Redis.from_url(url, decode_responses=True)
        sc.SyncScripts(r).run(put_call(c.keys.queue("default"), code, 2**50))
        r.close()
        return h.id


def test_dev_leaves_the_users_redis_alone(fresh_redis: Any) -> None:
    """DTQ_REDIS_URL exported (the quick start does so just before suggesting `dtq dev`): the
    demo runs on a private Redis; the user's queued task and schedules are untouched."""
    _seed_user(fresh_redis.url)
    before = _users_data(fresh_redis.url)
    p = run_dev({**os.environ}, DTQ_REDIS_URL=fresh_redis.url)
    assert _users_data(fresh_redis.url) == before, p.stdout
    assert "payments.charge" not in p.stdout
    check(p)


def test_dev_on_a_given_redis_touches_only_what_it_made(fresh_redis: Any) -> None:
    _seed_user(fresh_redis.url)
    before = _users_data(fresh_redis.url)
    p = run_dev({**os.environ}, "--redis-url", fresh_redis.url)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "flaky: fails twice, retries  succeeded  3" in p.stdout
    assert p.stdout.count("  succeeded  ") == 13
    assert _users_data(fresh_redis.url) == before, p.stdout


def test_make_demo_says_how_to_reach_it_and_ends_on_ctrl_c() -> None:
    """`make demo API_PORT=N`: the dashboard on N, the line that points `dtq` at the demo's Redis
    and each task's id printed, and Ctrl-C (SIGINT to the terminal's process group) ends it
    with no make error."""
    import contextlib
    import queue
    import re
    import signal
    import threading
    import time
    import urllib.request

    from tests.redis_server import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTQ_")}
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "demo", f"API_PORT={port}"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True)
    reader.start()
    seen: list[str] = []
    deadline = time.monotonic() + 240
    try:
        while not any("Ctrl-C to stop" in x for x in seen):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
        out = "".join(seen)
        assert f"dashboard and API on http://127.0.0.1:{port}/" in out, out
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).close()
        [url] = re.findall(r"^\s*export DTQ_REDIS_URL=(\S+)$", out, re.M)
        assert f"dtq --redis-url {url} queues" in out, out
        ids = re.findall(r"\b(default:[0-9a-f]{28})\b", out)
        assert len(set(ids)) == 14, out
        dtq = str(Path(sys.executable).parent / "dtq")
        for argv in (["queues"], ["task", ids[-1]]):
            p = subprocess.run([dtq, "--redis-url", url, *argv], capture_output=True, text=True,
                               env=env, timeout=60)  # fmt: skip
            assert p.returncode == 0, p.stdout + p.stderr
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    reader.join(30)  # the pipe's end: every line is in the queue
    assert not reader.is_alive()
    while not lines.empty():
        seen.append(lines.get())
    out = "".join(seen)
    assert "stopped the worker and Redis" in out, out
    assert "make: ***" not in out and "KeyboardInterrupt" not in out, out
