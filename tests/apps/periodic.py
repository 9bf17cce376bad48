"""Tasks with periodic schedules (tests/worker/test_schedules.py)."""

from __future__ import annotations

import os

from dtq import App, current_task
from tests.apps._redis import shared_redis

app = App()


@app.periodic(every=1, name="tick-every-second")
@app.task(name="tick")
async def tick() -> None:
    url = os.environ.get("DTQ_REDIS_URL", app.settings.redis_url)
    shared_redis(url).rpush(f"{app.settings.key_prefix}:test:ticks", current_task().id)
