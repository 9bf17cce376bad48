"""Tasks for the workflow tests (in-process and subprocess workers)."""

from __future__ import annotations

import os
import time

import redis

from dtq import App, Fail, current_task

app = App()


def _r() -> redis.Redis:
    return redis.Redis.from_url(os.environ.get("DTQ_REDIS_URL", app.settings.redis_url))


def _started(tag: str) -> None:
    """Every body start, kept where no fault erases it: (task id, attempt, tag)."""
    ctx = current_task()
    _r().rpush(f"{app.settings.key_prefix}:test:fstarts", f"{ctx.id}|{ctx.attempt}|{tag}")


@app.task(name="add")
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="double", queue="other")
def double(a: int) -> int:
    return a * 2


@app.task(name="ident")
def ident(x: int, sleep: float = 0.0) -> int:
    _started(f"m{x}")
    if sleep:
        time.sleep(sleep)
    return x


@app.task(name="total")
def total(xs: list[int], sleep: float = 0.0) -> list[int]:
    _started("cb")
    if sleep:
        time.sleep(sleep)
    return xs


@app.task(name="sum")
def sum_(xs: list[int]) -> int:
    return sum(xs)


@app.task(name="big", max_retries=0)
def big(n: int) -> str:
    return "x" * n


@app.task(name="boom", max_retries=1)
def boom(*_: object) -> None:
    raise ValueError("boom")


@app.task(name="fail_now")
def fail_now(*_: object) -> None:
    raise Fail("no")
