"""Tasks used by the tests (imported by in-process and subprocess workers)."""

from __future__ import annotations

import asyncio
import contextvars
import os
import time

import redis

from dtq import App, Fail, Retry, TaskContext, current_task
from tests.apps._redis import shared_redis

app = App()


def _r() -> redis.Redis:
    return shared_redis(os.environ.get("DTQ_REDIS_URL", app.settings.redis_url))


def record_start(tag: str = "") -> None:
    """Append (task id, attempt, worker) to a list the faults cannot erase (RPUSH)."""
    ctx = current_task()
    _r().rpush(
        f"{app.settings.key_prefix}:test:starts", f"{ctx.id}|{ctx.attempt}|{ctx.worker_id}|{tag}"
    )


@app.task(name="add")
async def add(a: int, b: int) -> int:
    return a + b


# A variable a task sets in its own context: a run started later must not see it (each run's
# context is the worker's, not the one of the run whose outcome write claimed it).
_leak: contextvars.ContextVar[str | None] = contextvars.ContextVar("leak", default=None)


@app.task(name="context_leak")
async def context_leak(i: int) -> str | None:
    seen = _leak.get()
    _leak.set(f"run {i}")
    await asyncio.sleep(0.001)
    return seen


@app.task(name="child_context")
async def child_context() -> list[object]:
    """A child task asks for the context first, then the task itself: one and the same."""
    child = await asyncio.create_task(_ask())
    mine = current_task()
    mine.progress(1, 2, "from the task")
    return [child is mine, mine.attempt, mine.id]


async def _ask() -> TaskContext:
    ctx = current_task()
    ctx.progress(1, 2, "from a child task")
    return ctx


@app.task(name="sync_mul")
def sync_mul(a: int, b: int) -> int:
    return a * b


@app.task(name="noop")
async def noop() -> None:
    return None


@app.task(name="record")
async def record(tag: str = "", sleep: float = 0.0) -> str:
    record_start(tag)
    if sleep:
        await asyncio.sleep(sleep)
    return tag


@app.task(name="sync_record")
def sync_record(tag: str = "", sleep: float = 0.0) -> str:
    record_start(tag)
    if sleep:
        time.sleep(sleep)
    return tag


@app.task(name="flaky", max_retries=3)
async def flaky(fail_times: int) -> int:
    ctx = current_task()
    if ctx.attempt <= fail_times:
        raise ValueError(f"boom on attempt {ctx.attempt}")
    return ctx.attempt


@app.task(name="always_fails", max_retries=2)
async def always_fails() -> None:
    raise RuntimeError("always")


@app.task(name="fail_now")
async def fail_now() -> None:
    raise Fail("permanent problem")


@app.task(name="retry_later", max_retries=1)
async def retry_later(delay: float) -> int:
    if current_task().attempt == 1:
        raise Retry(delay=delay)
    return current_task().attempt


@app.task(name="slow", timeout=0.3, max_retries=0)
async def slow() -> None:
    await asyncio.sleep(10)


# Bodies of "sleep" running right now in this process, and the most seen at once.
SLEEPING = {"now": 0, "peak": 0}


@app.task(name="sleep")
async def sleep(seconds: float) -> float:
    record_start("sleep")
    SLEEPING["now"] += 1
    SLEEPING["peak"] = max(SLEEPING["peak"], SLEEPING["now"])
    try:
        await asyncio.sleep(seconds)
    finally:
        SLEEPING["now"] -= 1
    return seconds


@app.task(name="bad_result")
async def bad_result() -> object:
    return {"when": object()}  # not JSON (a set was, until sets became arrays: docs/arguments.md)


@app.task(name="die", max_retries=1)
def die() -> None:
    record_start("die")
    os._exit(17)


def _deep_helper(size: int) -> None:
    raise KeyError("x" * size)


@app.task(name="fails_deep", max_retries=1)
def fails_deep(size: int = 10) -> None:
    """A sync task whose failure happens in a helper: its traceback names both functions."""
    _deep_helper(size)


@app.task(name="fails_then_retries", max_retries=1)
async def fails_then_retries() -> None:
    """First run: an exception (traceback kept); second: a Retry request (not an error)."""
    if current_task().attempt == 1:
        raise ValueError("first run broke")
    raise Retry(delay=0)


@app.task(name="progress_steps")
async def progress_steps(steps: int) -> int:
    """Reports progress once per 0.2 s step (the dashboard shows it as a bar)."""
    ctx = current_task()
    for i in range(steps):
        ctx.progress(i + 1, steps, f"step {i + 1}")
        await asyncio.sleep(0.2)
    return steps


@app.task(name="record_until")
async def record_until(tag: str, key: str) -> str:
    """Records its start, then runs until ``key`` exists in Redis (a gate the test opens)."""
    record_start(tag)
    while not _r().exists(key):
        await asyncio.sleep(0.05)
    return tag
