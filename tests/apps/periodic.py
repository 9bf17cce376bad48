"""Tasks with periodic schedules (tests/test_schedules.py)."""

from __future__ import annotations

import os

import redis

from dtq import App, current_task

app = App()


@app.periodic(every=1, name="tick-every-second")
@app.task(name="tick")
async def tick() -> None:
    url = os.environ.get("DTQ_REDIS_URL", app.settings.redis_url)
    r = redis.Redis.from_url(url)
    try:
        r.rpush(f"{app.settings.key_prefix}:test:ticks", current_task().id)
    finally:
        r.close()
