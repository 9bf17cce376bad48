"""Cancellation: queued, scheduled and running tasks; first cancel wins; bulk cancel."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, InvalidRequest, Settings, TaskFailed, UnknownTask
from dtq.store.keys import Keys
from tests.apps.lifecycle import app
from tests.conftest import running_worker, wait_until


def notes(r: redis.Redis, settings: Settings) -> list[str]:
    return r.lrange(f"{settings.key_prefix}:test:notes", 0, -1)  # type: ignore[return-value]


def tags_of(r: redis.Redis, settings: Settings, task_id: str) -> list[str]:
    return [n.split("|")[2] for n in notes(r, settings) if n.startswith(task_id + "|")]


async def wait_for(pred: Any, timeout: float = 20) -> None:
    await asyncio.to_thread(wait_until, pred, timeout)


@pytest.mark.cluster
async def test_running_async_task_is_cancelled_promptly(settings: Settings, r: redis.Redis) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("async_block", [30])
        await wait_for(lambda: tags_of(r, settings, h.id) == ["start"])
        t0 = time.monotonic()
        assert await c.cancel(h.id, reason="user pressed stop") is True
        while (await c.get(h.id)).status != "cancelled":
            assert time.monotonic() - t0 < 10, "cancel did not reach the worker"
            await asyncio.sleep(0.01)
        latency = time.monotonic() - t0
        info = await c.get(h.id)
        with pytest.raises(TaskFailed) as exc:
            await c.result(h.id, timeout=5)
    print(f"cancel latency (async task, pub/sub hint): {latency * 1000:.0f} ms")
    assert info.status == "cancelled" and info.result is None
    assert info.error == "user pressed stop" and info.cancel_requested
    assert exc.value.status == "cancelled"
    assert tags_of(r, settings, h.id) == ["start", "cancelled"]  # the coroutine was cancelled


async def test_running_sync_task_result_is_discarded(settings: Settings, r: redis.Redis) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("sync_block", [1.0])
        await wait_for(lambda: tags_of(r, settings, h.id) == ["start"])
        assert await c.cancel(h.id)
        await wait_for(lambda: tags_of(r, settings, h.id) == ["start", "end"])  # thread ran on
        await asyncio.sleep(0.3)
        info = await c.get(h.id)
    assert info.status == "cancelled"
    assert info.result is None


async def test_sync_task_can_notice_the_cancel(settings: Settings, r: redis.Redis) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("sync_polite", [20])
        await wait_for(lambda: tags_of(r, settings, h.id) == ["start"])
        assert await c.cancel(h.id)
        await wait_for(lambda: tags_of(r, settings, h.id) == ["start", "noticed"])
        assert (await c.get(h.id)).status == "cancelled"


async def test_durable_flag_alone_reaches_the_worker(settings: Settings, r: redis.Redis) -> None:
    """Without the pub/sub hint (e.g. the worker was disconnected), the heartbeat finds it."""
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("async_block", [30])
        await wait_for(lambda: tags_of(r, settings, h.id) == ["start"])
        tid = h.id.split(":")[1]
        r.hset(Keys(settings.key_prefix).queue("default").task(tid), "cancel", "flag only")
        await wait_for(lambda: r.hget(Keys(settings.key_prefix).queue("default").task(tid),
                                      "status") == "cancelled", 10)  # fmt: skip
        assert (await c.get(h.id)).error == "flag only"


async def test_first_cancel_wins_under_a_race(settings: Settings, r: redis.Redis) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("async_block", [30])
        await wait_for(lambda: tags_of(r, settings, h.id) == ["start"])
        results: list[bool] = []
        barrier = threading.Barrier(8)

        def one(i: int) -> None:
            with Client(settings=settings) as sc_:
                barrier.wait()
                results.append(sc_.cancel(h.id, reason=f"reason {i}"))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        await wait_for(lambda: r.hget(Keys(settings.key_prefix).queue("default").task(
            h.id.split(":")[1]), "status") == "cancelled")  # fmt: skip
        info = await c.get(h.id)
    assert results == [True] * 8
    events = r.xrange(Keys(settings.key_prefix).queue("default").events)
    tid = h.id.split(":")[1]
    requested = [f for _, f in events if f["tid"] == tid and f["type"] == "cancel_requested"]  # type: ignore[index]
    assert len(requested) == 1
    assert info.error == requested[0]["detail"]  # the first reason is the one recorded


async def test_cancel_finished_task_says_so_and_changes_nothing(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("echo", ["hi"])
        assert await c.result(h.id, timeout=20) == "hi"
        before = await c.get(h.id)
        assert await c.cancel(h.id) is False
        after = await c.get(h.id)
    assert after == before
    async with AsyncClient(settings=settings) as c2:
        with pytest.raises(UnknownTask):
            await c2.cancel("default:nosuchtask")


@pytest.mark.cluster
async def test_cancel_queued_and_scheduled_never_run(settings: Settings, r: redis.Redis) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        h1 = await c.enqueue("echo", [1])
        h2 = await c.enqueue("echo", [2], delay=0.2)
        assert await c.cancel(h1.id) and await c.cancel(h2.id)
        assert (await c.get(h1.id)).status == "cancelled"
        assert (await c.get(h2.id)).status == "cancelled"
        assert await c.cancel(h1.id) is False  # already cancelled: unchanged
        async with running_worker(app, settings):
            h3 = await c.enqueue("echo", [3])
            assert await c.result(h3.id, timeout=20) == 3
            await asyncio.sleep(0.5)  # h2's due time passed while a worker ran
    assert tags_of(r, settings, h1.id) == [] and tags_of(r, settings, h2.id) == []


@pytest.mark.cluster
async def test_bulk_cancel_by_queue_and_by_name(settings: Settings, r: redis.Redis) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        a = [await c.enqueue("echo", [i]) for i in range(5)]
        b = [await c.enqueue("async_block", [30], delay=60) for _ in range(3)]
        other = await c.enqueue("echo", [9], queue="other")
        with pytest.raises(InvalidRequest):
            await c.cancel_many()
        s = await c.cancel_many(name="async_block")
        assert (s.cancelled, s.requested) == (3, 0)
        assert [(await c.get(h.id)).status for h in a] == ["queued"] * 5
        assert [(await c.get(h.id)).status for h in b] == ["cancelled"] * 3
        s = await c.cancel_many(queue="default")
        assert s.to_dict() == {"cancelled": 5, "requested": 0}
        assert (await c.get(other.id)).status == "queued"
        assert (await c.cancel_many(queue="default")).total == 0  # nothing left to cancel
    with Client(settings=settings) as sc_:
        h = sc_.enqueue("async_block", [30])
        async with running_worker(app, settings):
            await wait_for(lambda: tags_of(r, settings, h.id) == ["start"])
            s2 = sc_.cancel_many(queue="default", name="async_block")
            assert (s2.cancelled, s2.requested) == (0, 1)
            await wait_for(lambda: sc_.get(h.id).status == "cancelled")
        assert sc_.cancel_many(queue="other").cancelled == 1


@pytest.mark.slow
def test_cancel_reaches_a_worker_process(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    w = spawn_worker("tests.apps.lifecycle:app", settings)
    with Client(settings=settings) as c:
        h = c.enqueue("async_block", [60])
        wait_until(lambda: tags_of(r, settings, h.id) == ["start"], 30)
        assert c.cancel(h.id)
        wait_until(lambda: c.get(h.id).status == "cancelled", 20)
    assert tags_of(r, settings, h.id) == ["start", "cancelled"]
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
