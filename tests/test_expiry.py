"""Expiry: a task not started by its expiry time ends "expired" and never runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import redis

from dtq import AsyncClient, InvalidRequest, Settings, TaskFailed
from dtq.keys import Keys
from tests.apps.lifecycle import app
from tests.conftest import running_worker


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
