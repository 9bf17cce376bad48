"""SDK clients across a one-packet connection blip: calls that are safe to re-send are re-sent
(bounded, jittered), and the calls that change state give the first send's answer when re-sent
after a lost reply. A real redis-server behind a proxy that resets one link (tests.chaos.proxy).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
import redis

from dtq import AsyncClient, Client, Settings, TaskStatus
from dtq import scripts as sc
from dtq.admin import Admin
from dtq.store.keys import QueueKeys
from tests.chaos.proxy import Proxy
from tests.conftest import make_settings, wait_until
from tests.redis_server import RedisServer, free_port


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[Proxy]:
    # The scripts are loaded first: the first call of a script not yet loaded is answered
    # NOSCRIPT (it did not run), and dropping that reply would test nothing.
    r = redis_server.client()
    for name in ("enqueue", "cancel", "dlq_requeue"):
        r.script_load(sc.source(name))
    r.close()
    d = Proxy(free_port(), redis_server.port).start()
    yield d
    d.stop()


@pytest.fixture
def via(dropper: Proxy, prefix: str) -> Settings:
    """Settings whose Redis is reached through the dropper."""
    return make_settings(dropper.url, prefix)


def _tasks(r: redis.Redis, s: Settings, queue: str = "default") -> int:
    qk = QueueKeys(s.key_prefix, queue)
    return sum(r.xlen(k) for k in qk.streams) + r.zcard(qk.sched)


# --- reads and enqueue are re-sent ------------------------------------------------------------


def test_get_succeeds_after_one_connection_reset(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    with Client(settings=via) as c:
        h = c.enqueue("add", [1, 2])
        dropper.reset_request(b"HGETALL")
        assert c.get(h.id).status == TaskStatus.QUEUED
        assert dropper.fired == 1


async def test_async_get_succeeds_after_one_connection_reset(via: Settings, dropper: Proxy) -> None:
    async with AsyncClient(settings=via) as c:
        h = await c.enqueue("add", [1, 2])
        dropper.reset_request(b"HGETALL")
        assert (await c.get(h.id)).status == TaskStatus.QUEUED
        assert dropper.fired == 1


@pytest.mark.parametrize("registered", [False, True], ids=["first", "short path"])
def test_enqueue_succeeds_after_one_connection_reset(
    via: Settings, dropper: Proxy, r: redis.Redis, registered: bool
) -> None:
    with Client(settings=via) as c:
        if registered:
            c.enqueue("warmup")
        dropper.reset_request(b"blipped")
        h = c.enqueue("blipped", [1])
        assert dropper.fired == 1 and h.created
        assert c.get(h.id).name == "blipped"
    assert _tasks(r, via) == (2 if registered else 1)


@pytest.mark.parametrize("registered", [False, True], ids=["first", "short path"])
def test_enqueue_resent_after_a_lost_reply_makes_exactly_one_task(
    via: Settings, dropper: Proxy, r: redis.Redis, registered: bool
) -> None:
    with Client(settings=via) as c:
        if registered:
            c.enqueue("warmup")
        dropper.drop_reply(b"lostreply")
        h = c.enqueue("lostreply", [1])
        assert dropper.fired == 1
        assert c.get(h.id).status == TaskStatus.QUEUED
    assert _tasks(r, via) == (2 if registered else 1)


async def test_async_enqueue_resent_after_a_lost_reply_makes_exactly_one_task(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    async with AsyncClient(settings=via) as c:
        await c.enqueue("warmup")
        dropper.drop_reply(b"lostreply")
        h = await c.enqueue("lostreply", [1])
        assert dropper.fired == 1 and (await c.get(h.id)).name == "lostreply"
    assert _tasks(r, via) == 2


@pytest.mark.parametrize("n", [100, 1000], ids=["one call", "streamed parts"])
def test_enqueue_many_resent_after_a_lost_reply_makes_each_task_once(
    via: Settings, dropper: Proxy, r: redis.Redis, n: int
) -> None:
    items = [{"name": f"bulk{i:04d}", "args": [i]} for i in range(n)]
    with Client(settings=via) as c:
        c.enqueue("warmup")
        dropper.drop_reply(b"bulk0%03d" % (n - 1 - (n - 1) // 3))  # a part after the first
        handles = c.enqueue_many(items)
        assert dropper.fired == 1
        assert len(handles) == n and len({h.id for h in handles}) == n
        assert [c.get(h.id).name for h in handles[-3:]] == [i["name"] for i in items[-3:]]
    assert _tasks(r, via) == n + 1


async def test_async_enqueue_many_resent_after_a_lost_reply_makes_each_task_once(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    items = [{"name": f"bulk{i:04d}", "args": [i]} for i in range(1000)]
    async with AsyncClient(settings=via) as c:
        await c.enqueue("warmup")
        dropper.drop_reply(b"bulk0600")
        handles = await c.enqueue_many(items)
        assert dropper.fired == 1 and len({h.id for h in handles}) == 1000
    assert _tasks(r, via) == 1001


# --- state changes answer a re-send with the first send's outcome ------------------------------


def test_cancel_after_a_lost_reply_returns_true(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    with Client(settings=via) as c:
        h = c.enqueue("add", [1, 2])
        dropper.drop_reply(b"cancelled by request")
        assert c.cancel(h.id) is True
        assert dropper.fired == 1
        assert c.get(h.id).status == TaskStatus.CANCELLED
        assert c.cancel(h.id) is False  # a second cancel of its own still says "unchanged"


async def test_async_cancel_after_a_lost_reply_returns_true(via: Settings, dropper: Proxy) -> None:
    async with AsyncClient(settings=via) as c:
        h = await c.enqueue("add", [1, 2], delay=60)
        dropper.drop_reply(b"cancelled by request")
        assert await c.cancel(h.id) is True
        assert dropper.fired == 1


async def _failed_task(c: AsyncClient, r: redis.Redis, s: Settings) -> str:
    """A task ended failed in the dead-letter queue, made the way cancel.lua ends one (the
    record's status and the DLQ zset), without running a worker."""
    h = await c.enqueue("add", [1, 2], delay=60)
    qk = QueueKeys(s.key_prefix, "default")
    tid = h.id.split(":")[1]
    r.zrem(qk.sched, tid)
    r.hset(qk.task(tid), mapping={"status": "failed", "finished": "1", "error": "boom"})
    r.hdel(qk.task(tid), "due")
    r.zadd(qk.dlq, {tid: 1})
    return h.id


async def test_admin_retry_after_a_lost_reply_does_not_raise_conflict(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    async with Admin(via) as a:
        task_id = await _failed_task(a.client, r, via)
        dropper.drop_reply(b"failed,cancelled,expired")  # Admin.retry's allowed states
        assert await a.retry(task_id) == {"id": task_id, "status": "queued"}
        assert dropper.fired == 1
        assert (await a.client.get(task_id)).status == TaskStatus.QUEUED
    assert _tasks(r, via) == 1  # one stream entry, not two


async def test_dlq_requeue_after_a_lost_reply_counts_the_task(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    async with Admin(via) as a:
        task_id = await _failed_task(a.client, r, via)
        dropper.drop_reply(task_id.split(":")[1].encode())
        await a.dlq_requeue_one(task_id)  # raised Conflict("... is queued ...")
        assert dropper.fired == 1
    assert _tasks(r, via) == 1


# --- a flushed keyspace is registered again ----------------------------------------------------


def test_a_long_lived_client_registers_its_queue_again_after_flushall(
    fresh_redis: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dtq.sdk.client

    monkeypatch.setattr(dtq.sdk.client, "REGISTER_EVERY_S", 0.05)
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    try:
        with Client(settings=s) as c:
            c.enqueue("add", queue="reports")
            assert r.smembers(f"{prefix}:queues") == {"reports"}
            r.flushall()

            def registered() -> bool:
                c.enqueue("add", queue="reports")
                return r.smembers(f"{prefix}:queues") == {"reports"}

            wait_until(registered, timeout=20, interval=0.01)
    finally:
        r.close()


async def test_dlq_discard_after_a_lost_reply_counts_the_task(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    r.script_load(sc.source("dlq_discard"))
    async with Admin(via) as a:
        task_id = await _failed_task(a.client, r, via)
        dropper.drop_reply(task_id.split(":")[1].encode())
        await a.dlq_discard_one(task_id)  # raised UnknownTask: the re-send found it gone
        assert dropper.fired == 1
    assert r.exists(QueueKeys(via.key_prefix, "default").task(task_id.split(":")[1])) == 0


async def test_purge_after_a_lost_reply_counts_every_task_once(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    r.script_load(sc.source("purge"))
    async with Admin(via) as a:
        await a.client.enqueue_many([{"name": "add", "args": [i]} for i in range(30)])
        dropper.drop_reply(_sha(sc.source("purge")))  # the first batch's reply is lost
        res = await a.purge("default", batch=10)
        assert dropper.fired == 1
        assert res.done == 30  # said 20: the re-send purged the next batch and counted it alone
    assert _tasks(r, via) == 0


def _sha(text: str) -> bytes:
    return hashlib.sha1(text.encode()).hexdigest().encode()


async def test_pause_after_a_lost_reply_says_it_paused(
    via: Settings, dropper: Proxy, r: redis.Redis
) -> None:
    async with Admin(via) as a:
        await a.client.enqueue("add")
        dropper.drop_reply(b"NX")
        assert await a.pause("default") is True  # said False: "already paused"
        assert dropper.fired == 1
        assert await a.pause("default") is False  # a pause of its own still says "already"
    assert r.exists(QueueKeys(via.key_prefix, "default").paused) == 1


@pytest.mark.parametrize("call", ["enqueue", "cancel"])
def test_a_lane_call_whose_reply_times_out_is_resent(
    dropper: Proxy, prefix: str, r: redis.Redis, call: str
) -> None:
    # The fast lane (dtq.scripts.runner) raised a timeout as is; for a client whose calls are
    # all safe to re-send it is re-sent like a reset.
    s = make_settings(dropper.url + "?socket_timeout=0.5", prefix)
    with Client(settings=s) as c:
        h = c.enqueue("warmup", delay=60)
        if call == "enqueue":
            dropper.swallow_reply(b"timedout")
            assert c.get(c.enqueue("timedout").id).name == "timedout"
        else:
            dropper.swallow_reply(b"cancelled by request")
            assert c.cancel(h.id) is True
        assert dropper.fired == 1
    assert _tasks(r, s) == (2 if call == "enqueue" else 0)
