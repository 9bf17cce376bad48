from __future__ import annotations

from dtq import AsyncClient, Settings
from tests.apps.basic import app
from tests.conftest import running_worker


async def test_async_and_sync_tasks_run(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h1 = await c.enqueue("add", [2, 3])
        h2 = await c.enqueue("sync_mul", [4, 5])
        assert await c.result(h1.id, timeout=10) == 5
        assert await c.result(h2.id, timeout=10) == 20
