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
        [sys.executable, "-m", "dtq.dev", "--timeout", "40", *args],
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
