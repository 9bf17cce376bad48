"""The client SDK: sync and async parity, validation, errors a caller can act on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from enum import IntEnum

import pytest

from dtq import (
    AsyncClient,
    Client,
    InvalidRequest,
    PayloadTooLarge,
    RedisUnavailable,
    SerializationError,
    Settings,
    TaskStatus,
    UnknownTask,
)
from dtq.errors import BadTaskId
from tests.apps.basic import add, app
from tests.conftest import make_settings, running_worker
from tests.helpers import needs_lane
from tests.redis_server import free_port


@pytest.mark.cluster
def test_sync_client_enqueue_get_result_cancel(settings: Settings) -> None:
    with Client(settings=settings) as c:
        h = c.enqueue("add", [1, 2], queue="other", priority=7, max_retries=1, timeout=5)
        assert h.id.startswith("other:") and h.status == TaskStatus.QUEUED and h.created
        info = c.get(h.id)
        assert (info.name, info.queue, info.priority, info.max_retries, info.timeout) == (
            "add", "other", 7, 1, 5.0,
        )  # fmt: skip
        assert info.args == [1, 2] and info.attempt == 0 and info.status == TaskStatus.QUEUED
        with pytest.raises(TimeoutError):
            c.result(h.id, timeout=0.2)
        assert c.cancel(h.id) is True
        assert c.get(h.id).status == TaskStatus.CANCELLED
        assert c.cancel(h.id) is False  # finished: said so, unchanged
        with pytest.raises(Exception, match="cancelled"):
            c.result(h.id, timeout=1)


@pytest.mark.cluster
async def test_async_client_matches_sync(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        h = await c.enqueue("add", [1, 2], kwargs=None, delay=timedelta(seconds=60))
        info = await c.get(h.id)
        assert info.status == TaskStatus.SCHEDULED and info.due_at is not None
        assert await c.cancel(h.id) is True
        assert (await c.get(h.id)).status == TaskStatus.CANCELLED


@pytest.mark.cluster
async def test_async_result_times_out_as_the_sync_one_does(settings: Settings) -> None:
    # Its deadline was read inside the wait's suppress(TimeoutError): the wait read the record
    # again and again, never timing out (now both clients share one wait: _result_steps).
    async with AsyncClient(settings=settings) as c:
        h = await c.enqueue("add", [1, 2])
        with pytest.raises(TimeoutError, match="still queued"):  # (the guard's has no text)
            await asyncio.wait_for(c.result(h.id, timeout=0.2), 30)


@needs_lane
def test_enqueue_many_is_one_round_trip_and_keeps_order(settings: Settings) -> None:
    with Client(settings=settings) as c:
        items = [{"name": "add", "args": [i, i], "queue": "a" if i % 2 else "b"} for i in range(50)]
        c.enqueue_many(items)  # registers both queues (one SADD, once per client)
        conn = c._scripts.lane.connection()
        order: list[str] = []
        send, read = conn.send_packed_command, conn.read_response

        def sending(*a, **k):  # type: ignore[no-untyped-def]
            order.append("send")
            return send(*a, **k)

        def reading(*a, **k):  # type: ignore[no-untyped-def]
            order.append("read")
            return read(*a, **k)

        conn.send_packed_command, conn.read_response = sending, reading
        hs = c.enqueue_many(items)
        # One script call per queue, both written before the first reply is read: pipelined.
        assert order == ["send", "send", "read", "read"]
        assert [h.queue for h in hs] == [("a" if i % 2 else "b") for i in range(50)]
        assert [c.get(h.id).args for h in hs] == [[i, i] for i in range(50)]


@pytest.mark.cluster
async def test_async_enqueue_many_streams_big_batches_in_order(settings: Settings) -> None:
    from dtq.sdk.client import BULK_PART

    n = BULK_PART * 3 + 5
    async with AsyncClient(settings=settings) as c:
        items = [{"name": "add", "args": [i, i], "queue": "a" if i % 3 else "b"} for i in range(n)]
        hs = await c.enqueue_many(items)
        assert len(hs) == n and len({h.id for h in hs}) == n
        assert [h.queue for h in hs] == [("a" if i % 3 else "b") for i in range(n)]
        for i in (0, 1, BULK_PART, n - 1):
            assert (await c.get(hs[i].id)).args == [i, i]
        qa, qb = c.keys.queue("a"), c.keys.queue("b")
        total = sum([await c.redis.xlen(st) for st in qa.streams + qb.streams])
        assert total == n
        assert {"a", "b"} <= set(await c.redis.smembers(c.keys.queues))
        # A Redis script flush: every part answers NOSCRIPT and is run the usual way.
        await c.redis.script_flush()
        hs = await c.enqueue_many(items)
        assert len(hs) == n and (await c.get(hs[-1].id)).args == [n - 1, n - 1]


def test_bad_input_is_refused_before_sending(settings: Settings) -> None:
    with Client(settings=settings) as c:
        with pytest.raises(SerializationError, match="args must be JSON"):
            c.enqueue("add", [object()])
        with pytest.raises(InvalidRequest, match="priority"):
            c.enqueue("add", [], priority=10)
        with pytest.raises(InvalidRequest, match="queue"):
            c.enqueue("add", [], queue="bad queue")
        with pytest.raises(InvalidRequest, match="delay or eta"):
            c.enqueue("add", [], delay=1, eta=datetime.now(UTC))
        with pytest.raises(InvalidRequest, match="unknown enqueue field"):
            c.enqueue_many([{"name": "add"}, {"name": "add", "bogus": 1}])
        with pytest.raises(BadTaskId):
            c.get("no-queue-part")
        with pytest.raises(UnknownTask):
            c.get("default:0000")
        with pytest.raises(InvalidRequest, match="priority"):
            c.enqueue("add", [], priority=True)  # a bool is not a priority
        with pytest.raises(InvalidRequest, match="max_retries"):
            c.enqueue("add", [], max_retries=False)
        with pytest.raises(InvalidRequest, match="each task needs a 'name'"):
            c.enqueue_many([{"name": "add"}, {"args": [1]}])
        with pytest.raises(SerializationError, match="args must be a list"):
            c.enqueue("add", "ab")
        with pytest.raises(InvalidRequest, match="bad queue name"):
            c.enqueue_many([{"name": "add", "queue": ["not", "hashable"]}])
        with pytest.raises(InvalidRequest, match="task name"):
            c.enqueue_many([{"name": ["add"]}])
        # Nothing of the refused calls reached Redis.
        assert sum(c.redis.xlen(st) for st in c.keys.queue("default").streams) == 0

        class Level(IntEnum):
            HIGH = 9

        assert c.get(c.enqueue("add", [], priority=Level.HIGH).id).priority == 9
    tiny = settings.model_copy(update={"max_payload_bytes": 20})
    with Client(settings=tiny) as c, pytest.raises(PayloadTooLarge, match="DTQ_MAX_PAYLOAD_BYTES"):
        c.enqueue("add", ["x" * 100])
    with Client(settings=tiny) as c:
        c.enqueue("add", ["é" * 8])  # 12 characters, 20 bytes of JSON: fits
        with pytest.raises(PayloadTooLarge):
            c.enqueue("add", ["é" * 9])  # 13 characters but 22 bytes: the limit is in bytes


def test_unreachable_redis_is_one_clear_error(prefix: str) -> None:
    s = make_settings(f"redis://127.0.0.1:{free_port()}/0", prefix)
    with Client(settings=s) as c, pytest.raises(RedisUnavailable, match="Redis unreachable"):
        c.enqueue("add", [1, 2])


async def test_idempotency_key_returns_same_task(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        h1 = await c.enqueue("add", [1, 2], idempotency_key="order-1")
        h2 = await c.enqueue("add", [9, 9], idempotency_key="order-1")
        assert h1.id == h2.id and h1.created and not h2.created
        many = await c.enqueue_many([{"name": "add", "idempotency_key": "order-1"}])
        assert many[0].id == h1.id


async def test_typed_shortcut_uses_task_defaults(settings: Settings) -> None:
    app.configure(settings)
    async with running_worker(app, settings):
        h = await add.aenqueue(2, b=5)
        assert await app.async_client().result(h.id, timeout=10) == 7
        info = await app.async_client().get(h.id)
        assert info.args == [2] and info.kwargs == {"b": 5} and info.name == "add"
    await app.async_client().close()


def test_sync_shortcut_and_result(settings: Settings) -> None:
    app.configure(settings)
    h = add.enqueue(3, 4)
    assert app.client().get(h.id).status == TaskStatus.QUEUED
    app.client().close()
