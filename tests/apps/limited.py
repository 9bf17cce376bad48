"""Tasks for the limits, fair-mode, queue-cap and retention tests (tests/worker/test_limits.py
etc.)."""

from __future__ import annotations

import asyncio
import os
import time

import redis

from dtq import App, Limit, current_task
from tests.apps._redis import shared_redis

app = App()


def _r() -> redis.Redis:
    return shared_redis(os.environ.get("DTQ_REDIS_URL", app.settings.redis_url))


def _span(tag: str, start: float) -> None:
    """RPUSH "<tag>|<start>|<end>|<task id>|<worker>" to <prefix>:test:spans."""
    ctx = current_task()
    _r().rpush(
        f"{app.settings.key_prefix}:test:spans",
        f"{tag}|{start:.6f}|{time.time():.6f}|{ctx.id}|{ctx.worker_id}",
    )


@app.task(name="tenant_job", limit=Limit(key=lambda tenant, **_: tenant, concurrency=2))
async def tenant_job(tenant: str, sleep: float = 0.0) -> str:
    start = time.time()
    await asyncio.sleep(sleep)
    _span(tenant, start)
    return tenant


@app.task(name="rated_job", limit=Limit(key=lambda tenant, **_: tenant, rate="4/s"))
async def rated_job(tenant: str) -> str:
    _span(tenant, time.time())
    return tenant


@app.task(name="free_job")
async def free_job(tag: str, sleep: float = 0.0) -> str:
    start = time.time()
    await asyncio.sleep(sleep)
    _span(tag, start)
    return tag


@app.task(name="slow_job", queue="slow")
async def slow_job(tag: str, sleep: float) -> str:
    start = time.time()
    await asyncio.sleep(sleep)
    _span(tag, start)
    return tag


@app.task(name="fast_job", queue="fast")
async def fast_job(tag: str) -> str:
    _span(tag, time.time())
    return tag


@app.task(name="nop")
async def nop() -> None:
    return None


@app.task(name="nop_fail", max_retries=0)
async def nop_fail() -> None:
    raise RuntimeError("fails on purpose")


@app.task(name="gated_job", limit=Limit(key=lambda tenant, **_: tenant, concurrency=1))
async def gated_job(tenant: str, gate: str = "") -> str:
    """Concurrency 1 per tenant; with a gate, runs until <prefix>:test:gate:<gate> exists
    (at most 60 s, then fails)."""
    if gate:
        key = f"{app.settings.key_prefix}:test:gate:{gate}"
        deadline = time.monotonic() + 60
        while not _r().exists(key):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {gate} never opened")
            await asyncio.sleep(0.02)
    return tenant
