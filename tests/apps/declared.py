"""Tasks whose ``@app.task`` declarations must govern them however they are enqueued."""

from __future__ import annotations

import asyncio
import os

from dtq import App, current_task
from dtq.store.connection import sync_redis

app = App()


def record_start() -> None:
    """RPUSH "<task id>|<attempt>" to "<prefix>:test:starts" (no fault can erase it)."""
    ctx = current_task()
    r = sync_redis(os.environ.get("DTQ_REDIS_URL", app.settings.redis_url))
    try:
        r.rpush(f"{app.settings.key_prefix}:test:starts", f"{ctx.id}|{ctx.attempt}")
    finally:
        r.close()


@app.task(name="declared.always_fails", max_retries=1)
async def always_fails() -> None:
    record_start()
    raise ValueError("always")


@app.task(name="declared.sleepy", timeout=0.3, max_retries=0)
async def sleepy(seconds: float) -> str:
    record_start()
    await asyncio.sleep(seconds)
    return "woke"


@app.task(name="declared.perishable", expires=0.4)
async def perishable() -> str:
    record_start()
    return "ran"
