"""The benchmark's task functions, run by a real ``python -m dtq_worker dtq_bench.tasks:app``.

The bodies match the peers' (bench/peers/common.py) so every queue does the same work per task:
``noop`` only counts itself done, ``stamp`` RPUSHes its pickup latency in ms, ``sleep`` awaits
then counts itself done (``fair``, dtq's only, workload T: RPUSHes its group and times).
Counting is :class:`dtq_bench.shared.DoneCounter`, the one the peers use too, so a no-op costs no
Redis round trip of its own. ``bare`` does nothing at all:
completion is then read from the queue itself (used where the benchmark wants only dtq's own
Redis traffic, e.g. commands per task).

``BENCH_REDIS_URL`` names the server that holds the counters: the suite's plain redis-server,
also when the queue itself is on a cluster (workload S), whose shards then count only dtq.
"""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aredis

from dtq.app import App
from dtq_bench.shared import FAIR_KEY, LAT_KEY, DoneCounter

app = App()
_clients: dict[int, aredis.Redis] = {}


def _url() -> str:
    return os.environ.get("BENCH_REDIS_URL") or app.settings.redis_url


def _client() -> aredis.Redis:
    loop = asyncio.get_running_loop()
    c = _clients.get(id(loop))
    if c is None:
        c = _clients[id(loop)] = aredis.Redis.from_url(_url())
    return c


done = DoneCounter(_url).add


@app.task(name="noop")
async def noop() -> None:
    done()


@app.task(name="bare")
async def bare() -> None:
    return None


@app.task(name="stamp")
async def stamp(enqueued_at: float) -> None:
    started = time.time()
    await _client().rpush(LAT_KEY, (started - enqueued_at) * 1000.0)


@app.task(name="fair")
async def fair(group: str, enqueued_at: float) -> None:
    """Workload T's task of a new group: its group, enqueue and start time (epoch seconds)."""
    await _client().rpush(FAIR_KEY, f"{group} {enqueued_at!r} {time.time()!r}")


@app.task(name="sleep")
async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
    done()
