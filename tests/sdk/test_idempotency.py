"""Idempotency keys and unique tasks: same handle while the record lives; bulk honours them."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from dtq import AsyncClient, Client, InvalidRequest, Settings
from dtq.store.keys import Keys
from tests.apps.lifecycle import app, uniq
from tests.conftest import make_settings, running_worker


def runs_of(r: redis.Redis, settings: Settings, task_id: str) -> list[str]:
    notes: list[str] = r.lrange(f"{settings.key_prefix}:test:notes", 0, -1)  # type: ignore[assignment]
    return [n for n in notes if n.startswith(task_id + "|")]


async def test_same_key_same_task_through_its_whole_life(
    settings: Settings, r: redis.Redis
) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        h1 = await c.enqueue("echo", [1], idempotency_key="order-42")
        h2 = await c.enqueue("echo", [999], idempotency_key="order-42")  # args ignored
        assert h1.created and not h2.created and h2.id == h1.id and h2.status == "queued"
        other = await c.enqueue("echo", [1], idempotency_key="order-43")
        assert other.id != h1.id
        async with running_worker(app, settings):
            assert await c.result(h1.id, timeout=20) == 1
            h3 = await c.enqueue("echo", [1], idempotency_key="order-42")  # finished, kept
            assert h3.id == h1.id and not h3.created and h3.status == "succeeded"
            assert await c.result(h3.id, timeout=5) == 1
            await asyncio.sleep(0.3)
        assert len(runs_of(r, settings, h1.id)) == 1
        assert (await c.get(h1.id)).idempotency_key == "order-42"


def test_key_is_released_when_the_record_expires(redis_server: object, prefix: str) -> None:
    settings = make_settings(redis_server.url, prefix, result_ttl_s=1)  # type: ignore[attr-defined]
    with Client(settings=settings, app=app) as c:
        h1 = c.enqueue("echo", [1], idempotency_key="k")
        assert c.cancel(h1.id)  # ends it: record and key now live 1 s
        assert c.enqueue("echo", [1], idempotency_key="k").id == h1.id
        ttl = c.redis.ttl(Keys(prefix).queue("default").idem("k"))
        assert 0 < ttl <= 1  # type: ignore[operator]
        import time

        time.sleep(1.6)
        h2 = c.enqueue("echo", [1], idempotency_key="k")
        assert h2.created and h2.id != h1.id


def test_concurrent_enqueues_with_one_key_create_one_task(settings: Settings) -> None:
    ids: list[str] = []
    barrier = threading.Barrier(10)

    def one() -> None:
        with Client(settings=settings, app=app) as c:
            barrier.wait()
            ids.append(c.enqueue("echo", [1], idempotency_key="race").id)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 10 and len(set(ids)) == 1


def test_bulk_enqueue_honours_keys(settings: Settings) -> None:
    with Client(settings=settings, app=app) as c:
        first = c.enqueue("echo", [0], idempotency_key="a")
        hs = c.enqueue_many(
            [
                {"name": "echo", "args": [1], "idempotency_key": "a"},  # existing
                {"name": "echo", "args": [2], "idempotency_key": "b"},  # new
                {"name": "echo", "args": [3], "idempotency_key": "b"},  # same batch
                {"name": "echo", "args": [4]},
                {"name": "uniq", "args": [7]},
                {"name": "uniq", "args": [7], "queue": "default"},
                {"name": "echo", "args": [8], "unique": True},
                {"name": "echo", "args": [8], "unique": True},
            ]
        )
    assert hs[0].id == first.id and not hs[0].created
    assert hs[1].created and hs[2].id == hs[1].id and not hs[2].created
    assert hs[3].created
    assert hs[4].created and hs[5].id == hs[4].id and not hs[5].created
    assert hs[6].created and hs[7].id == hs[6].id


async def test_unique_task_dedupes_while_unfinished_then_releases(
    settings: Settings, r: redis.Redis
) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        h1 = await c.enqueue("uniq", [1], {"full": True})
        h2 = await c.enqueue("uniq", [1], {"full": True})
        h3 = await c.enqueue("uniq", [2], {"full": True})  # other arguments: another task
        h4 = await c.enqueue("uniq", [1], {"full": False})
        assert h2.id == h1.id and not h2.created
        assert len({h1.id, h3.id, h4.id}) == 3
        assert (await c.get(h1.id)).idempotency_key.startswith("~u:")  # type: ignore[union-attr]
        # kwargs order does not matter
        app2 = await c.enqueue("echo", [], {"a": 1, "b": 2}, unique=True)
        assert (await c.enqueue("echo", [], {"b": 2, "a": 1}, unique=True)).id == app2.id
        # unique=False on the call overrides the task's default
        assert (await c.enqueue("uniq", [1], {"full": True}, unique=False)).created
        async with running_worker(app, settings):
            assert await c.result(h1.id, timeout=20) == 1
        # Finished: the key is released at once, a new enqueue makes a new task.
        h5 = await c.enqueue("uniq", [1], {"full": True})
        assert h5.created and h5.id != h1.id
        # An explicit idempotency key wins over uniqueness.
        h6 = await c.enqueue("uniq", [1], {"full": True}, idempotency_key="mine")
        assert h6.id != h5.id


def test_typed_enqueue_with_options(settings: Settings) -> None:
    app.configure(settings)
    h1 = uniq.enqueue(5)
    h2 = uniq.enqueue(5)
    assert h1.id == h2.id
    keyed = uniq.options(idempotency_key="typed")
    assert keyed.enqueue(6).id == keyed.enqueue(7).id


def test_reserved_and_bad_keys_are_refused(settings: Settings) -> None:
    with Client(settings=settings, app=app) as c:
        for bad in ("", "x" * 257, "~u:forged"):
            with pytest.raises(InvalidRequest):
                c.enqueue("echo", idempotency_key=bad)
