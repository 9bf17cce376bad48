"""G: the ceiling. Raw redis-py (hiredis parser) loops doing only the stream operations a task
needs: XADD to enqueue; XREADGROUP to take; XACK + XDEL + one status write (HSET) to finish.

Nothing built on Redis from Python can do less per task, so these figures bound every queue on
the same machine. Three loops:

* ``xadd_single``: one XADD per round trip (the bound for one-by-one enqueue, workload B);
* ``asyncio``: an asyncio loop reading batches of 32 with XREADGROUP and acknowledging each
  task with its own XACK, XDEL and HSET, the batch's commands sent in one pipeline (the bound
  for workload A from one asyncio worker at concurrency 32);
* ``sync_batched``: XREADGROUP of 100 entries, then one pipeline with every XACK, XDEL and HSET of
  the batch (the bound for any batching worker).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
import redis.asyncio as aredis

STREAM = "ceiling:s"
GROUP = "g"
STATUS = "ceiling:t:"


def _prepare(url: str, n: int) -> None:
    with redis.Redis.from_url(url) as r:
        r.delete(STREAM)
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        for start in range(0, n, 1000):
            with r.pipeline(transaction=False) as pipe:
                for i in range(start, min(n, start + 1000)):
                    pipe.xadd(STREAM, {"t": str(i)})
                pipe.execute()


def _cleanup(url: str) -> None:
    with redis.Redis.from_url(url) as r:
        r.delete(STREAM)
        for batch in r.scan_iter(f"{STATUS}*", count=1000):
            r.delete(batch)


def xadd_single(url: str, n: int) -> float:
    """Unpipelined XADD loop: tasks/s."""
    with redis.Redis.from_url(url) as r:
        r.delete(STREAM)
        r.xadd(STREAM, {"t": "warm"})
        t0 = time.perf_counter()
        for i in range(n):
            r.xadd(STREAM, {"t": str(i)})
        secs = time.perf_counter() - t0
        r.delete(STREAM)
    return n / secs


def asyncio_per_task(url: str, n: int, batch: int = 32) -> float:
    """asyncio: XREADGROUP of ``batch`` entries, then per task its own XACK, XDEL and HSET,
    all of the batch sent in one pipeline: tasks/s."""
    _prepare(url, n)

    async def go() -> float:
        r = aredis.Redis.from_url(url)
        done = 0
        t0 = time.perf_counter()
        while done < n:
            res: Any = await r.xreadgroup(GROUP, "c", {STREAM: ">"}, count=batch, block=100)
            got: Any = res[0][1] if res else []
            async with r.pipeline(transaction=False) as pipe:
                for eid, fields in got:
                    pipe.xack(STREAM, GROUP, eid)
                    pipe.xdel(STREAM, eid)
                    pipe.hset(STATUS + fields[b"t"].decode(), "status", "succeeded")
                await pipe.execute()
            done += len(got)
        secs = time.perf_counter() - t0
        await r.aclose()
        return n / secs

    try:
        try:
            import uvloop

            return float(uvloop.run(go()))
        except ImportError:  # pragma: no cover
            return asyncio.run(go())
    finally:
        _cleanup(url)


def sync_batched(url: str, n: int, batch: int = 100) -> float:
    """XREADGROUP of ``batch`` entries, then one pipeline acking the whole batch: tasks/s."""
    _prepare(url, n)
    try:
        with redis.Redis.from_url(url) as r:
            done = 0
            t0 = time.perf_counter()
            while done < n:
                res: Any = r.xreadgroup(GROUP, "c", {STREAM: ">"}, count=batch, block=100)
                got: Any = res[0][1] if res else []
                if not got:
                    continue
                ids = [eid for eid, _ in got]
                with r.pipeline(transaction=False) as pipe:
                    pipe.xack(STREAM, GROUP, *ids)
                    pipe.xdel(STREAM, *ids)
                    for _, fields in got:
                        pipe.hset(STATUS + fields[b"t"].decode(), "status", "succeeded")
                    pipe.execute()
                done += len(got)
            secs = time.perf_counter() - t0
        return n / secs
    finally:
        _cleanup(url)
