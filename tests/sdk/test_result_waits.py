"""An AsyncClient under many coroutines at once: every ``result()`` wait shares one subscribed
connection (dtq/sdk/donewait.py), and calls beyond the pool's connections wait for one instead of
failing. Before, about 50 waits or 100 calls at once raised RedisUnavailable ("Too many
connections", redis-py's pool of 100). Real redis-servers and an in-process worker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Settings
from tests.apps.basic import app
from tests.conftest import make_settings, running_worker
from tests.redis_server import RedisServer

N = 150


async def until(pred: Any, timeout: float = 10.0) -> None:
    """``wait_until`` that lets the event loop run (the waits being watched live on it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _subscribers(r: redis.Redis) -> list[int]:
    """The channel count of each connection subscribed to any (CLIENT LIST's sub=)."""
    return [int(c["sub"]) for c in r.client_list() if int(c["sub"]) > 0]


async def test_many_calls_at_once_wait_for_a_connection(
    redis_server: RedisServer, prefix: str
) -> None:
    s = make_settings(redis_server.url, prefix)
    async with AsyncClient(settings=s) as c:
        h = await c.enqueue("add", [1, 2])
        infos = await asyncio.gather(*(c.get(h.id) for _ in range(300)))
    assert {i.id for i in infos} == {h.id}


@pytest.mark.cluster
async def test_many_result_waits_share_one_subscription(settings: Settings, r: Any) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        hs = [await c.enqueue("add", [i, 1]) for i in range(N)]
        waits = [asyncio.create_task(c.result(h, timeout=60)) for h in hs]
        if isinstance(r, redis.Redis):  # (a cluster's subscription sits on one of its nodes)
            # One connection holds all N channels (no other of the session's has N of them).
            await until(lambda: N in _subscribers(r), timeout=10)
        async with running_worker(app, settings):
            results = await asyncio.wait_for(asyncio.gather(*waits), 60)
        assert results == [i + 1 for i in range(N)]
        if isinstance(r, redis.Redis):  # every wait ended: its channel is given up
            await until(lambda: r.pubsub_channels(f"{settings.key_prefix}*") == [], timeout=10)


async def test_result_waits_outlive_their_subscription_killed(
    fresh_redis: RedisServer, prefix: str
) -> None:
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    async with AsyncClient(settings=s, app=app) as c:
        hs = [await c.enqueue("add", [i, 1]) for i in range(20)]
        waits = [asyncio.create_task(c.result(h, timeout=60)) for h in hs]
        await until(lambda: _subscribers(r) == [20], timeout=10)
        assert r.client_kill_filter(_type="pubsub") == 1
        async with running_worker(app, s):
            results = await asyncio.wait_for(asyncio.gather(*waits), 60)
        assert results == [i + 1 for i in range(20)]
        # redis-py made the connection again and subscribed what was still waited on.
        h = await c.enqueue("add", [5, 5])
        async with running_worker(app, s):
            assert await c.result(h, timeout=30) == 10
    r.close()


async def test_a_result_wait_cancelled_gives_its_channel_up(
    redis_server: RedisServer, prefix: str
) -> None:
    s = make_settings(redis_server.url, prefix)
    r = redis_server.client()
    async with AsyncClient(settings=s) as c:
        h = await c.enqueue("add", [1, 1])
        w = asyncio.create_task(c.result(h.id, timeout=60))
        await until(lambda: len(r.pubsub_channels(f"{prefix}*")) == 1)
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        await until(lambda: r.pubsub_channels(f"{prefix}*") == [], timeout=10)
    r.close()
