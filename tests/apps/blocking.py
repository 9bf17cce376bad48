"""Tasks for the worker health tests: one that holds the event loop, one that waits politely."""

from __future__ import annotations

import asyncio
import time

from dtq import App

app = App()


@app.task(name="block_loop", max_retries=0)
async def block_loop(seconds: float) -> None:
    # A blocking call inside an async task: the worker's event loop cannot run meanwhile.
    time.sleep(seconds)


@app.task(name="nap", max_retries=0)
async def nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds
