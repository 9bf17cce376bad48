"""Redis must not evict dtq's keys: a worker refuses an allkeys-* maxmemory-policy (exit 2, one
line), warns under volatile-*, and reads the policy from INFO where CONFIG is disabled; the SDK
refuses to write into such a Redis (checked once per connection); a running worker stops
claiming while Redis evicts and resumes once the policy is fixed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from dtq import App, AsyncClient, Client, DtqError, EvictingRedis
from dtq.errors import ConfigError
from dtq.settings import Settings
from dtq.store.connection import async_redis
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


async def _enqueue(kind: str, settings: Settings) -> str:
    if kind == "sync":
        with Client(settings=settings) as c:
            return c.enqueue("add", [1, 2]).id
    async with AsyncClient(settings=settings) as ac:
        return (await ac.enqueue("add", [1, 2])).id


def _refusal(exc: BaseException, policy: str) -> str:
    assert isinstance(exc, EvictingRedis) and isinstance(exc, ConfigError | DtqError)
    msg = str(exc)
    assert len(msg.splitlines()) == 1, msg
    assert f"maxmemory-policy is {policy}" in msg and "noeviction" in msg, msg
    return msg


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_sdk_refuses_to_enqueue_into_an_evicting_redis(
    server_with: Any, prefix: str, kind: str
) -> None:
    """It enqueued without a word (the tasks would vanish when Redis evicts them)."""
    server = server_with("--maxmemory-policy", "allkeys-lru")
    with pytest.raises(EvictingRedis) as info:
        await _enqueue(kind, make_settings(server.url, prefix))
    _refusal(info.value, "allkeys-lru")
    assert server.client().dbsize() == 0  # nothing was written


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_sdk_reads_the_policy_from_info_where_config_is_disabled(
    server_with: Any, prefix: str, kind: str
) -> None:
    server = server_with("--maxmemory-policy", "allkeys-lfu", "--rename-command", "CONFIG", "")
    with pytest.raises(EvictingRedis) as info:
        await _enqueue(kind, make_settings(server.url, prefix))
    _refusal(info.value, "allkeys-lfu")


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_sdk_does_not_refuse_when_no_command_tells_the_policy(
    server_with: Any, prefix: str, kind: str
) -> None:
    server = server_with("--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "",
                         "--rename-command", "INFO", "")  # fmt: skip
    assert await _enqueue(kind, make_settings(server.url, prefix))


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_sdk_writes_under_noeviction_and_volatile(
    server_with: Any, prefix: str, kind: str
) -> None:
    for policy in ("noeviction", "volatile-lru"):
        server = server_with("--maxmemory-policy", policy)
        assert await _enqueue(kind, make_settings(server.url, prefix))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_sdk_refuses_an_evicting_cluster_node(
    redis_cluster: Any, prefix: str, kind: str
) -> None:
    nodes = redis_cluster.live_nodes()
    try:
        for n in nodes:
            n.client().config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(EvictingRedis) as info:
            await _enqueue(kind, make_settings(redis_cluster.url, prefix))
        _refusal(info.value, "allkeys-lru")
    finally:
        for n in nodes:
            n.client().config_set("maxmemory-policy", "noeviction")


# --- a running worker while Redis evicts -----------------------------------------------------

gated = App()
_gate: list[asyncio.Event] = []


@gated.task(name="evict.hold")
async def hold() -> str:
    await _gate[0].wait()
    return "held"


@gated.task(name="evict.echo")
async def echo(x: int) -> int:
    return x


async def _until(pred: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_running_worker_stops_claiming_while_redis_evicts_and_resumes(
    server_with: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It kept claiming after CONFIG SET maxmemory-policy allkeys-lru (the tasks Redis then
    evicted vanished). The heartbeat re-reads the policy: claiming stops, /readyz fails, one
    ERROR line; with noeviction back, it claims again."""
    server = server_with("--maxmemory-policy", "noeviction")
    settings = make_settings(server.url, prefix, worker_concurrency=1, worker_prefetch=0)
    rc: redis.Redis = server.client()
    _gate[:] = [asyncio.Event()]
    with caplog.at_level(logging.INFO, logger="dtq"):
        # A client given its own connection (not checked: it reads on while Redis evicts).
        own = async_redis(server.url, decode_responses=True)
        async with (
            running_worker(gated, settings) as w,
            AsyncClient(settings=settings, redis_client=own) as c,
        ):
            first = await c.enqueue("evict.hold")
            await _until(lambda: w.slots.inflight)
            waiting = await c.enqueue("evict.echo", [7])  # no free slot: it waits
            rc.config_set("maxmemory-policy", "allkeys-lru")
            await _until(lambda: "maxmemory-policy" in w.readiness())
            assert "allkeys-lru" in w.readiness()
            _gate[0].set()  # the slot frees: neither the outcome's refill nor a poll claims
            assert await c.result(first.id, timeout=20) == "held"
            key = f"{prefix}:worker:{w.worker_id}"
            beats: set[str | None] = set()

            def three_more_beats() -> bool:  # ample time for a claim, were one to be made
                beats.add(rc.hget(key, "last_heartbeat"))
                return len(beats) >= 4

            await _until(three_more_beats)
            assert (await c.get(waiting.id)).status == "queued"
            rc.config_set("maxmemory-policy", "noeviction")
            assert await c.result(waiting.id, timeout=20) == 7
            await _until(lambda: w.readiness() == "ok")
    loud = [r for r in caplog.records if "maxmemory-policy is allkeys-lru" in r.getMessage()]
    assert [r.levelname for r in loud] == ["ERROR"], [r.getMessage() for r in loud]
    assert "stopped claiming" in loud[0].getMessage()
    assert any("claiming again" in r.getMessage() for r in caplog.records)
