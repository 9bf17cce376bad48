from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dtq import App
from dtq.settings import Settings
from dtq.store.keys import GROUP, QueueKeys
from tests.apt_tools import ensure_apt
from tests.helpers.browser import CHROMIUM_ARGS
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server for the session; tests isolate themselves by key prefix."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that kill, pause or restart it."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def prefix() -> str:
    return "t" + secrets.token_hex(4)


@pytest.fixture
def r(backend: RedisServer | RedisClusterFixture) -> Iterator[redis.Redis]:
    c: Any = backend.client()
    yield c
    c.close()


@pytest.fixture
def run(r: redis.Redis) -> Any:
    """A blocking script runner on the session server (the scripts' direct tests)."""
    from dtq import scripts as sc

    return sc.SyncScripts(r).run


@pytest.fixture
def qk(prefix: str, request: pytest.FixtureRequest) -> QueueKeys:
    """The keys of the test module's queue ``Q`` under the test's own prefix."""
    return QueueKeys(prefix, request.module.Q)


def make_settings(url: str, prefix: str, **kw: Any) -> Settings:
    base: dict[str, Any] = {
        "redis_url": url,
        "key_prefix": prefix,
        "heartbeat_interval_s": 0.2,
        "visibility_timeout_s": 1.5,
        "drain_timeout_s": 5,
        "retry_backoff_s": 0.05,
        "retry_backoff_max_s": 0.2,
        "worker_concurrency": 8,
        "hard_exit_s": 5,
    }
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def settings(backend: RedisServer | RedisClusterFixture, prefix: str) -> Settings:
    return make_settings(backend.url, prefix)


@contextlib.asynccontextmanager
async def running_worker(app: App, settings: Settings, **caps: int) -> AsyncIterator[Any]:
    """An in-process worker for the duration of the block; stopped gracefully after."""
    from dtq_worker.worker import Worker

    app.configure(settings)
    w = Worker(app, settings, caps or None)
    task = asyncio.get_running_loop().create_task(w.run())
    for _ in range(200):
        if w.healthy.is_set():
            break
        await asyncio.sleep(0.01)
    try:
        yield w
    finally:
        w.initiate_shutdown()
        await asyncio.wait_for(task, 30)
    assert_no_leaked_run(w)


def assert_no_leaked_run(w: Any) -> None:
    """A run whose task has ended leaves ``inflight`` (and gives its slot back), unless it was
    stopped for shutdown and not handed back (Redis away): one left there holds a slot forever,
    and enough of them wedge the worker (slots counted busy, no body running)."""
    from dtq_worker.slots import StopReason

    leaked = [
        r.task_id
        for r in w.slots.inflight.values()
        if r.task is not None and r.task.done() and r.stop_reason is not StopReason.SHUTDOWN
    ]
    assert not leaked, f"runs ended but still held: {leaked}"


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DTQ_REDIS_URL": settings.redis_url,
            "DTQ_KEY_PREFIX": settings.key_prefix,
            "DTQ_HEARTBEAT_INTERVAL_S": str(settings.heartbeat_interval_s),
            "DTQ_VISIBILITY_TIMEOUT_S": str(settings.visibility_timeout_s),
            "DTQ_DRAIN_TIMEOUT_S": str(settings.drain_timeout_s),
            "DTQ_RETRY_BACKOFF_S": str(settings.retry_backoff_s),
            "DTQ_RETRY_BACKOFF_MAX_S": str(settings.retry_backoff_max_s),
            "DTQ_HARD_EXIT_S": str(settings.hard_exit_s),
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


class WorkerProc:
    """A dtq-worker subprocess."""

    def __init__(self, app: str, settings: Settings, *args: str, **env: str) -> None:
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"dtq-w-{secrets.token_hex(4)}.log"
        self._fh = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dtq_worker", app, *args],
            cwd=ROOT,
            env=worker_env(settings, **env),
            stdout=self._fh,
            stderr=subprocess.STDOUT,
        )

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._fh.close()


@pytest.fixture
def spawn_worker() -> Iterator[Any]:
    procs: list[WorkerProc] = []

    def spawn(app: str, settings: Settings, *args: str, **env: str) -> WorkerProc:
        p = WorkerProc(app, settings, *args, **env)
        procs.append(p)
        return p

    yield spawn
    for p in procs:
        p.close()


def body_starts(r: redis.Redis, prefix: str) -> list[tuple[str, int, str]]:
    """(task id, attempt, worker) of every task body that began, in order (the test apps'
    record_start appends them with RPUSH, which no fault can erase)."""
    out = []
    for line in r.lrange(f"{prefix}:test:starts", 0, -1):
        tid, attempt, worker, _ = line.split("|")
        out.append((tid, int(attempt), worker))
    return out


def reap(pid: int, timeout: float = 30.0) -> int:
    """The exit code of the forked child ``pid``, waited for up to ``timeout`` s; a child still
    running then is killed (SIGKILL, code -9), so no test leaves one behind."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.01)


def wait_until(pred: Any, timeout: float = 20.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


def create_groups(r: redis.Redis, qk: QueueKeys) -> None:
    """Create the consumer group on every priority stream of a queue (idempotent)."""
    for stream in qk.streams:
        try:
            r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            assert "BUSYGROUP" in str(exc)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterFixture]:
    """One private Redis Cluster (3 masters, one replica each) for the session."""
    cluster = RedisClusterFixture().start()
    yield cluster
    cluster.cleanup()


@pytest.fixture
def backend_kind(request: pytest.FixtureRequest) -> str:
    """ "single" unless the test is marked ``cluster`` (then "single" and "cluster")."""
    return str(getattr(request, "param", "single"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("cluster") and "backend_kind" in (
        metafunc.fixturenames
    ):
        metafunc.parametrize("backend_kind", ["single", "cluster"], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest, backend_kind: str) -> RedisServer | RedisClusterFixture:
    """The session's redis-server, or (a test marked ``cluster``, second run) its Redis
    Cluster: ``.url`` and ``.client()`` are what the two share. ``settings`` and ``r`` use it,
    so a test marked ``cluster`` that takes them runs the same body on both."""
    name = "redis_server" if backend_kind == "single" else "redis_cluster"
    found: RedisServer | RedisClusterFixture = request.getfixturevalue(name)
    return found


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's chromium, installed with apt-get when missing (or the test skips)."""
    path = ensure_apt("chromium", "chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright (Python) is not installed: pip install -e '.[dev]'")
    return path


@pytest.fixture
def browser_page(chromium: str) -> Iterator[Any]:
    """A page of Debian's chromium (tests/helpers/browser.py), closed after the test."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(20_000)
            yield page
        finally:
            browser.close()
