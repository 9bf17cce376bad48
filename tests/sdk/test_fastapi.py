"""The FastAPI integration (dtq.contrib.fastapi) and its example app, over httpx's ASGI
transport, against a real redis-server and an in-process worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from dtq import AsyncClient, ConfigError, Settings
from dtq.contrib.fastapi import STATE_KEY, DtqClient, dtq_lifespan
from tests.conftest import running_worker


def http(api: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


async def test_example_app_enqueues_with_the_lifespan_client(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from docs.examples import fastapi_app as ex

    closed: list[AsyncClient] = []
    close = AsyncClient.close

    async def recording_close(self: AsyncClient) -> None:
        closed.append(self)
        await close(self)

    monkeypatch.setattr(AsyncClient, "close", recording_close)

    async with running_worker(ex.tasks, settings):
        async with ex.api.router.lifespan_context(ex.api), http(ex.api) as web:
            client = getattr(ex.api.state, STATE_KEY)
            r = await web.post("/reports/2026-11-30")
            assert r.status_code == 202
            task_id = r.json()["task_id"]
            deadline = time.monotonic() + 20
            while (body := (await web.get(f"/tasks/{task_id}")).json())["status"] != "succeeded":
                assert time.monotonic() < deadline, body
                await asyncio.sleep(0.02)
            assert body == {"status": "succeeded", "result": "report for 2026-11-30", "error": None}
            assert (await web.get("/tasks/default:" + "0" * 28)).status_code == 404
            bad = await web.get("/tasks/not-a-task-id")  # a malformed id: the client's mistake
            assert bad.status_code == 404, bad.text
            assert getattr(ex.api.state, STATE_KEY) is client  # one client for every request
        assert not hasattr(ex.api.state, STATE_KEY)  # closed and removed at shutdown
    assert closed == [client]


async def test_lifespan_from_a_url_runs_the_apps_own_lifespan_inside(settings: Settings) -> None:
    events: list[str] = []

    @asynccontextmanager
    async def own(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        assert isinstance(getattr(app.state, STATE_KEY), AsyncClient)  # ready before
        events.append("start")
        yield {"x": 1}
        events.append("stop")

    api = FastAPI(lifespan=dtq_lifespan(settings.redis_url, lifespan=own))

    @api.post("/ping")
    async def ping(dtq: DtqClient) -> dict[str, Any]:
        return {"prefix": dtq.settings.key_prefix, "pong": await dtq.redis.ping()}

    async with api.router.lifespan_context(api) as state, http(api) as web:
        assert state == {"x": 1}
        assert (await web.post("/ping")).json() == {"prefix": "dtq", "pong": True}
    assert events == ["start", "stop"]


async def test_the_dependency_without_the_lifespan_says_what_is_missing() -> None:
    api = FastAPI()

    @api.get("/")
    async def index(dtq: DtqClient) -> str:
        return "unreachable"

    async with http(api) as web:
        with pytest.raises(ConfigError, match="lifespan=dtq_lifespan"):
            await web.get("/")
