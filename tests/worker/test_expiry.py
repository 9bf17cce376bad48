"""Expiry: a task not started by its expiry time ends "expired" and never runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import redis

from dtq import AsyncClient, InvalidRequest, Settings, TaskFailed
from dtq.admin import Admin
from dtq.store.keys import Keys
from tests.apps.basic import app as basic_app
from tests.apps.declared import app as declared_app
from tests.apps.lifecycle import app
from tests.conftest import running_worker
from tests.helpers import until


def runs_of(r: redis.Redis, settings: Settings, task_id: str) -> list[str]:
    notes: list[str] = r.lrange(f"{settings.key_prefix}:test:notes", 0, -1)  # type: ignore[assignment]
    return [n for n in notes if n.startswith(task_id + "|")]


async def test_task_not_started_in_time_expires_and_never_runs(
    settings: Settings, r: redis.Redis
) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        late = await c.enqueue("echo", [1], expires=0.3)
        late_dt = await c.enqueue("echo", [2], expires=datetime.now(UTC) + timedelta(seconds=0.3))
        fine = await c.enqueue("echo", [3], expires=timedelta(minutes=5))
        info = await c.get(late.id)
        assert info.expires_at is not None and info.status == "queued"
        await asyncio.sleep(0.6)  # no worker yet: both deadlines pass
        async with running_worker(app, settings):
            assert await c.result(fine.id, timeout=20) == 3
            for h in (late, late_dt):
                with pytest.raises(TaskFailed) as exc:
                    await c.result(h.id, timeout=20)
                assert exc.value.status == "expired"
        for h in (late, late_dt):
            info = await c.get(h.id)
            assert info.status == "expired" and info.attempt == 0 and info.started_at is None
            assert runs_of(r, settings, h.id) == []
    events = r.xrange(Keys(settings.key_prefix).queue("default").events)
    assert sum(f["type"] == "expired" for _, f in events) == 2  # type: ignore[index]


async def test_delay_past_expiry_expires(settings: Settings, r: redis.Redis) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("echo", [1], delay=0.5, expires=0.2)
        with pytest.raises(TaskFailed) as exc:
            await c.result(h.id, timeout=20)
    assert exc.value.status == "expired"
    assert runs_of(r, settings, h.id) == []


async def test_task_started_in_time_runs(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("echo", ["ok"], expires=30)
        assert await c.result(h.id, timeout=20) == "ok"


async def test_bad_expiry_is_refused(settings: Settings) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        with pytest.raises(InvalidRequest):
            await c.enqueue("echo", expires=-1)
        with pytest.raises(InvalidRequest):
            await c.enqueue("echo", expires=datetime.now(UTC) - timedelta(seconds=1))
        with pytest.raises(InvalidRequest):
            await c.enqueue("echo", expires=datetime.now() + timedelta(hours=1))  # naive
        with pytest.raises(InvalidRequest):
            await c.enqueue_many([{"name": "echo", "expires": "soon"}])


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()  # type: ignore[misc]
    return int(sec) * 1000 + int(usec) // 1000


@pytest.mark.parametrize("route", ["retry", "dlq_requeue"])
async def test_an_operator_retry_runs_a_failed_task_whose_expiry_passed(
    settings: Settings, r: redis.Redis, route: str
) -> None:
    """A task enqueued with expires= fails (no retries left) and its deadline passes in the
    dead-letter queue; `dtq retry` / `POST /tasks/{id}/retry` (Admin.retry) and
    `POST /dlq/{id}/requeue` (Admin.dlq_requeue_one) run it: it succeeds, not ends expired."""
    async with (
        AsyncClient(settings=settings, app=basic_app) as c,
        Admin(settings) as adm,
        running_worker(basic_app, settings),
    ):
        h = await c.enqueue("flaky", [1], max_retries=0, expires=60)
        with pytest.raises(TaskFailed) as exc:
            await c.result(h.id, timeout=20)
        assert exc.value.status == "failed"
        rk = Keys(settings.key_prefix).queue("default").task(h.id.split(":", 1)[1])
        assert r.hget(rk, "exp") is not None
        r.hset(rk, "exp", str(redis_ms(r) - 1))  # its deadline passes while it waits in the DLQ
        if route == "retry":
            await adm.retry(h.id)
        else:
            await adm.dlq_requeue_one(h.id)
        assert await c.result(h.id, timeout=20) == 2, "the retried task did not run"
        info = await c.get(h.id)
        assert info.status == "succeeded" and info.attempt == 2 and info.expires_at is None


async def test_a_retried_task_gets_no_deadline_from_its_declaration(
    settings: Settings, r: redis.Redis
) -> None:
    """A by-name enqueue leaves expires to the declaration, fixed at the first claim; cancelled
    before any claim and retried after the declared deadline, the task runs."""
    async with running_worker(declared_app, settings):
        pass  # the worker published its declarations; now none runs
    async with AsyncClient(settings=settings) as c, Admin(settings) as adm:
        h = await c.enqueue("declared.perishable")
        assert await c.cancel(h.id)
        enq = (await c.get(h.id)).enqueued_at
        assert enq is not None
        deadline_ms = int(enq.timestamp() * 1000) + 400

        async def declared_deadline_passed() -> bool:
            return redis_ms(r) > deadline_ms

        await until(declared_deadline_passed)
        await adm.retry(h.id)
        async with running_worker(declared_app, settings):
            assert await c.result(h.id, timeout=20) == "ran", "the retried task did not run"
