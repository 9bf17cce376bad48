"""A ``result()`` wait rides out a Redis outage until its own deadline, as the worker does.

Redis (AOF) is stopped for 8 s while a worker process runs a task that outlives the outage (its
heartbeat TTL is longer): ``result(h, timeout=40)`` returns the result, sync and asyncio. A wait
whose deadline falls inside an outage raises :class:`dtq.RedisUnavailable` at its deadline, not
when the first read fails.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dtq import AsyncClient, Client, RedisUnavailable
from dtq.settings import Settings
from dtq.store.keys import Keys, split_task_id
from tests.conftest import make_settings, wait_until
from tests.redis_server import RedisServer

OUTAGE_S = 8.0


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    server = RedisServer(aof=True).start()
    yield server
    server.cleanup()


def _settings(server: RedisServer, prefix: str) -> Settings:
    # Heartbeat TTL 3 x 6 s: the worker rides out the outage with its run.
    return make_settings(server.url, prefix, heartbeat_interval_s=6.0, visibility_timeout_s=60)


def _subscribed(server: RedisServer, prefix: str, tid: str) -> bool:
    """Whether a result() wait listens for ``tid``'s announcement (it has read the record)."""
    queue, t = split_task_id(tid)
    r = server.client()
    try:
        return bool(r.pubsub_numsub(Keys(prefix).queue(queue).done_channel(t))[0][1])
    finally:
        r.close()


def _running_task(c: Client, release: Path) -> str:
    h = c.enqueue("until_file", kwargs={"path": str(release)})
    wait_until(lambda: c.get(h.id).status == "running", 20)
    return h.id


def test_result_waits_through_a_redis_outage(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, tmp_path: Path
) -> None:
    settings = _settings(aof_redis, prefix)
    release = tmp_path / "release"
    spawn_worker("tests.apps.faulty:app", settings)
    with Client(settings=settings) as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        tid = _running_task(c, release)
        waiting = pool.submit(c.result, tid, 40)
        wait_until(lambda: _subscribed(aof_redis, prefix, tid), 20)
        aof_redis.stop()
        time.sleep(OUTAGE_S)  # the outage
        assert not waiting.done(), waiting.exception()  # still waiting, Redis away for 8 s
        aof_redis.start()
        release.touch()
        assert waiting.result(40) == 1


async def test_async_result_waits_through_a_redis_outage(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, tmp_path: Path
) -> None:
    settings = _settings(aof_redis, prefix)
    release = tmp_path / "release"
    spawn_worker("tests.apps.faulty:app", settings)
    with Client(settings=settings) as c:
        tid = _running_task(c, release)
    async with AsyncClient(settings=settings) as ac:
        waiting = asyncio.ensure_future(ac.result(tid, timeout=40))
        for _ in range(2000):
            if _subscribed(aof_redis, prefix, tid):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the wait never subscribed")
        aof_redis.stop()
        await asyncio.sleep(OUTAGE_S)  # the outage
        assert not waiting.done(), waiting.exception()
        aof_redis.start()
        release.touch()
        assert await asyncio.wait_for(waiting, 40) == 1


def test_a_deadline_inside_an_outage_raises_at_the_deadline(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, tmp_path: Path
) -> None:
    settings = _settings(aof_redis, prefix)
    spawn_worker("tests.apps.faulty:app", settings)
    with Client(settings=settings) as c:
        tid = _running_task(c, tmp_path / "release")
        aof_redis.stop()
        start = time.monotonic()
        with pytest.raises(RedisUnavailable):
            c.result(tid, timeout=4)
        assert time.monotonic() - start >= 4  # not before its deadline


async def test_async_deadline_inside_an_outage_raises_at_the_deadline(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, tmp_path: Path
) -> None:
    settings = _settings(aof_redis, prefix)
    spawn_worker("tests.apps.faulty:app", settings)
    with Client(settings=settings) as c:
        tid = _running_task(c, tmp_path / "release")
    async with AsyncClient(settings=settings) as ac:
        aof_redis.stop()
        start = time.monotonic()
        with pytest.raises(RedisUnavailable):
            await asyncio.wait_for(ac.result(tid, timeout=4), 30)
        assert time.monotonic() - start >= 4
