"""Example tasks shipped inside the package, so ``dtq dev`` works after a plain pip install."""

from __future__ import annotations

import asyncio
import random
import time

from dtq import App, Fail, current_task

app = App()


@app.task(name="examples.add", priority=5)
async def add(a: int, b: int) -> int:
    """An async task."""
    await asyncio.sleep(0.05)
    return a + b


@app.task(name="examples.resize", queue="default", priority=2)
def resize(image: str, width: int) -> dict[str, object]:
    """A sync task: runs in the worker's thread pool."""
    time.sleep(0.1)
    return {"image": image, "width": width, "bytes": random.randint(10_000, 99_999)}


@app.task(name="examples.urgent", priority=9)
async def urgent(message: str) -> str:
    """High priority: served before every lower band."""
    return message.upper()


@app.task(name="examples.flaky", max_retries=3)
async def flaky(succeed_on: int) -> str:
    """Fails until its attempt number reaches ``succeed_on``: shows retries with backoff."""
    ctx = current_task()
    if ctx.attempt < succeed_on:
        raise ConnectionError(f"upstream unavailable (attempt {ctx.attempt})")
    return f"succeeded on attempt {ctx.attempt}"


@app.task(name="examples.reject", max_retries=3)
async def reject(order_id: str) -> None:
    """Ends failed at once (dtq.Fail): listed in the dead-letter queue, no retries."""
    raise Fail(f"order {order_id} is invalid")


@app.task(name="examples.sleep", max_retries=3)
async def sleep(seconds: float) -> float:
    """A long task: shows work in flight, and a stopped worker handing it back to another."""
    await asyncio.sleep(seconds)
    return seconds
