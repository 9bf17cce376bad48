"""Redis must not evict dtq's keys: a worker refuses an allkeys-* maxmemory-policy (exit 2, one
line), warns under volatile-*, and reads the policy from INFO where CONFIG is disabled."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from dtq.settings import Settings
from tests.apps.limited import app
from tests.conftest import make_settings, running_worker
from tests.redis_server import RedisServer

APP = "tests.apps.limited:app"


@pytest.fixture
def server_with(request: pytest.FixtureRequest) -> Iterator[Any]:
    servers: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        s = RedisServer(extra_args=args).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.cleanup()


def refused(spawn_worker: Any, server: RedisServer, prefix: str) -> str:
    w = spawn_worker(APP, make_settings(server.url, prefix))
    code = w.wait(60)
    out = w.output().strip()
    assert code == 2, f"exit {code}: {out}"
    assert len(out.splitlines()) == 1 and "maxmemory-policy" in out, out
    assert "allkeys-lru" in out
    return out


def test_worker_refuses_to_start_under_allkeys_eviction(
    server_with: Any, spawn_worker: Any, prefix: str
) -> None:
    server = server_with("--maxmemory-policy", "allkeys-lru")
    refused(spawn_worker, server, prefix)
    # Nothing was started: no consumer group, no registered queue.
    assert server.client().scard(f"{prefix}:queues") == 0


def test_worker_reads_the_policy_from_info_where_config_is_disabled(
    server_with: Any, spawn_worker: Any, prefix: str
) -> None:
    server = server_with("--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "")
    refused(spawn_worker, server, prefix)


async def test_worker_warns_under_volatile_eviction(
    server_with: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = server_with("--maxmemory-policy", "volatile-lru")
    settings: Settings = make_settings(server.url, prefix)
    with caplog.at_level(logging.WARNING, logger="dtq"):
        async with running_worker(app, settings) as w:
            assert w.healthy.is_set()
    warned = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warned) == 1 and "volatile-lru" in warned[0]


async def test_worker_is_quiet_under_noeviction(
    server_with: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = server_with("--maxmemory-policy", "noeviction")
    with caplog.at_level(logging.WARNING, logger="dtq"):
        async with running_worker(app, make_settings(server.url, prefix)):
            pass
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]


async def test_api_warns_at_start_under_an_evicting_policy(
    server_with: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    from dtq_api.app import create_app

    for policy, expect in (("allkeys-lru", True), ("noeviction", False)):
        caplog.clear()
        server = server_with("--maxmemory-policy", policy)
        api = create_app(make_settings(server.url, prefix))
        with caplog.at_level(logging.WARNING):
            async with api.router.lifespan_context(api):
                pass
        warned = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
        assert bool(warned) == expect, (policy, warned)
