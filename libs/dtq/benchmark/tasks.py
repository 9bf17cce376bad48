"""The benchmark's task functions, run by a real ``python -m dtq_worker dtq.benchmark.tasks:app``.

The bodies match the peers' (bench/peers/common.py) so every queue does the same work per task:
``noop`` INCRs a done counter, ``stamp`` RPUSHes its pickup latency in ms, ``sleep`` awaits then
INCRs. ``bare`` does nothing at all: completion is then read from the queue itself (used where
the benchmark wants only dtq's own Redis traffic, e.g. commands per task).
"""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aredis

from dtq.app import App

DONE_KEY = "bench:done"
LAT_KEY = "bench:lat"

app = App()
_clients: dict[int, aredis.Redis] = {}


def _client() -> aredis.Redis:
    loop = asyncio.get_running_loop()
    c = _clients.get(id(loop))
    if c is None:
        url = os.environ.get("BENCH_REDIS_URL") or app.settings.redis_url
        c = _clients[id(loop)] = aredis.Redis.from_url(url)
    return c


@app.task(name="noop")
async def noop() -> None:
    await _client().incr(DONE_KEY)


@app.task(name="bare")
async def bare() -> None:
    return None


@app.task(name="stamp")
async def stamp(enqueued_at: float) -> None:
    started = time.time()
    await _client().rpush(LAT_KEY, (started - enqueued_at) * 1000.0)


@app.task(name="sleep")
async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
    await _client().incr(DONE_KEY)
