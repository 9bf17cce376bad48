"""Tasks for the lifecycle tests: progress, cancellation, expiry, unique tasks."""

from __future__ import annotations

import asyncio
import os
import time

import redis

from dtq import App, Fail, current_task
from tests.apps._redis import shared_redis

app = App()


def _r() -> redis.Redis:
    return shared_redis(os.environ.get("DTQ_REDIS_URL", app.settings.redis_url))


def note(tag: str) -> None:
    """RPUSH "<task id>|<attempt>|<tag>" to "<prefix>:test:notes"."""
    ctx = current_task()
    _r().rpush(f"{app.settings.key_prefix}:test:notes", f"{ctx.id}|{ctx.attempt}|{tag}")


@app.task(name="stepper")
async def stepper(n: int, pause: float) -> int:
    for i in range(1, n + 1):
        current_task().progress(i, n, f"step {i}")
        await asyncio.sleep(pause)
    return n


@app.task(name="sync_stepper")
def sync_stepper(n: int, pause: float) -> int:
    for i in range(1, n + 1):
        current_task().progress(i, n, f"step {i}")
        time.sleep(pause)
    return n


@app.task(name="async_block")
async def async_block(seconds: float) -> str:
    note("start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        note("cancelled")
        raise
    note("end")
    return "done"


@app.task(name="sync_block")
def sync_block(seconds: float) -> str:
    note("start")
    time.sleep(seconds)
    note("end")  # the thread runs on after a cancel; its result is discarded
    return "done"


@app.task(name="sync_polite")
def sync_polite(seconds: float) -> str:
    """A sync task that checks cancel_requested and stops early."""
    note("start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if current_task().cancel_requested:
            note("noticed")
            return "stopped early"
        time.sleep(0.02)
    return "done"


@app.task(name="echo")
async def echo(x: object = None) -> object:
    note("run")
    return x


@app.task(name="uniq", unique=True)
async def uniq(user: int, *, full: bool = False) -> int:
    note("run")
    return user


@app.task(name="sync_fail_on_cancel")
def sync_fail_on_cancel(seconds: float) -> str:
    """A sync task that notices the cancel and ends with dtq.Fail from its thread."""
    note("start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if current_task().cancel_requested:
            note("noticed")
            raise Fail("gave up after the cancel")
        time.sleep(0.02)
    return "done"
