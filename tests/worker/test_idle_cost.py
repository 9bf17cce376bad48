"""What an idle worker sends per queue (tools/idle_cost.py measures it; docs/performance.md,
"Idle workers and many queues"): its scheduler renews each queue's lock every 2.5 s, not
every tick, and sweeps owed limit releases and reads periodic schedules only when promote.lua
says there is something to do. Counted with INFO commandstats on a server of the test's own."""

from __future__ import annotations

import asyncio

import redis

from tests.apps.basic import app
from tests.conftest import make_settings, running_worker
from tests.redis_server import RedisServer

QUEUES = [f"q{i}" for i in range(20)]
WINDOW_S = 3.0


def _calls(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


async def test_an_idle_worker_sends_little_per_queue(fresh_redis: RedisServer, prefix: str) -> None:
    s = make_settings(fresh_redis.url, prefix, queues=QUEUES)
    with fresh_redis.client() as r:
        async with running_worker(app, s):
            await asyncio.sleep(1.0)  # every lock taken, the first promotes done
            r.config_resetstat()
            await asyncio.sleep(WINDOW_S)
            calls = _calls(r)
    per_queue = {k: v / len(QUEUES) for k, v in calls.items()}
    # The scheduler's ticks (about one a second): before, each sent lock.lua (a GET), promote
    # (two ZRANGEs), limit_sweep.lua (an SRANDMEMBER) and the periodic check (a TIME, two
    # ZRANGEs) for every queue; the workflow outboxes had one blocking read each.
    assert per_queue.get("srandmember", 0) == 0, calls  # nothing owed: no sweep
    assert per_queue.get("get", 0) <= WINDOW_S / 2.5 + 1, calls  # the lock, every 2.5 s
    assert per_queue.get("zrange", 0) <= 3 * (WINDOW_S + 1), calls  # promote's three reads
    assert calls.get("xreadgroup", 0) <= WINDOW_S + 1, calls  # one read over all outboxes
