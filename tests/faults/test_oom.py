"""A Redis at maxmemory under noeviction refuses writes with OOM: the worker waits it out (the
outcome lands once memory is freed, no reclaim), and the SDK raises a DtqError having written
nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from dtq import AsyncClient, Client, DtqError, TaskStatus
from dtq.store.keys import Keys
from tests.apps import basic
from tests.conftest import make_settings, running_worker
from tests.redis_server import RedisServer


@pytest.fixture
def oom_server() -> Iterator[RedisServer]:
    server = RedisServer(extra_args=["--maxmemory-policy", "noeviction"]).start()
    yield server
    server.cleanup()


def fill_memory(r: redis.Redis) -> None:
    """Writes are refused from now on (any used memory exceeds 1 byte)."""
    r.config_set("maxmemory", 1)


def free_memory(r: redis.Redis) -> None:
    r.config_set("maxmemory", 0)


def outcome_errors(w: object) -> float:
    registry = w.metrics.registry  # type: ignore[attr-defined]
    value = registry.get_sample_value("dtq_worker_redis_errors_total", {"loop": "outcome"})
    return float(value or 0)


async def test_an_outcome_write_waits_out_oom_and_lands_without_a_reclaim(
    oom_server: RedisServer, prefix: str
) -> None:
    # Heartbeats fail under OOM too: a long heartbeat TTL and visibility timeout keep the worker
    # up and its run unreclaimed for the whole window.
    settings = make_settings(
        oom_server.url, prefix, heartbeat_interval_s=0.5, heartbeat_ttl_s=30.0,
        visibility_timeout_s=60.0,
    )  # fmt: skip
    r = oom_server.client()
    starts = f"{prefix}:test:starts"
    async with AsyncClient(settings=settings) as c:
        h = await c.enqueue("sleep", args=(0.3,))
        async with running_worker(basic.app, settings) as w:
            deadline = time.monotonic() + 20
            while not r.llen(starts):  # the body has started (its first write went through)
                assert time.monotonic() < deadline, "the task never started"
                await asyncio.sleep(0.02)
            fill_memory(r)
            # The body ends and its outcome write is refused (and retried) while memory is full.
            while outcome_errors(w) < 2:
                assert time.monotonic() < deadline + 20, "the outcome write never retried"
                await asyncio.sleep(0.02)
            assert r.hget(Keys(prefix).queue("default").task(h.id.split(":")[1]), "status") == (
                "running"
            )
            free_memory(r)
            assert await c.result(h.id, timeout=20) == 0.3
        info = await c.get(h.id)
    assert info.status == TaskStatus.SUCCEEDED and info.attempt == 1 and info.retries == 0
    kinds = [f["type"] for _, f in r.xrange(Keys(prefix).queue("default").events)]
    assert "reclaimed" not in kinds and "retried" not in kinds, kinds


def test_an_enqueue_refused_for_oom_raises_a_dtq_error_and_writes_nothing(
    oom_server: RedisServer, prefix: str
) -> None:
    settings = make_settings(oom_server.url, prefix)
    r = oom_server.client()
    with Client(settings=settings) as c:
        c.enqueue("noop")  # registers the queue, creates nothing else in the way
        keys_before = sorted(r.keys(f"{prefix}*"))
        fill_memory(r)
        with pytest.raises(DtqError, match="out of memory"):
            c.enqueue("noop", idempotency_key="k1")
        with pytest.raises(DtqError, match="out of memory"):
            c.enqueue_many([{"name": "noop"}, {"name": "add", "args": [1, 2]}])
        free_memory(r)
        assert sorted(r.keys(f"{prefix}*")) == keys_before, "a refused enqueue wrote something"
        h = c.enqueue("noop", idempotency_key="k1")
        assert c.get(h.id).status == TaskStatus.QUEUED
