"""Tasks for the fault tests: each run appends its start and end to a journal file.

The journal is a plain file opened with O_APPEND and fsync'd per line, so neither a Redis restart
nor a SIGKILL of the worker can erase what a run did. Tasks take the journal path as ``journal``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from dtq import App, current_task

app = App()


def journal(path: str, event: str, **extra: Any) -> None:
    """Append one JSON line: event, task id, attempt, worker id, pid, wall time."""
    if not path:
        return
    ctx = current_task()
    line = {
        "ev": event,
        "id": ctx.id,
        "attempt": ctx.attempt,
        "worker": ctx.worker_id,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_journal(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


@app.task(name="long_async", max_retries=3)
async def long_async(seconds: float, journal_path: str = "") -> dict[str, Any]:
    """Sleeps; records start, finish, or cancellation (claim loss, shutdown)."""
    ctx = current_task()
    journal(journal_path, "start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        journal(journal_path, "cancelled")
        raise
    journal(journal_path, "finish")
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@app.task(name="long_sync", max_retries=3)
def long_sync(seconds: float, journal_path: str = "") -> dict[str, Any]:
    ctx = current_task()
    journal(journal_path, "start")
    time.sleep(seconds)
    journal(journal_path, "finish")
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@app.task(name="once_then_quick", max_retries=3)
async def once_then_quick(seconds: float, journal_path: str = "") -> int:
    """Slow only on the first attempt (for the interruption budget test)."""
    journal(journal_path, "start")
    await asyncio.sleep(seconds)
    journal(journal_path, "finish")
    return current_task().attempt


@app.task(name="never_done", max_retries=0)
async def never_done(journal_path: str = "") -> None:
    journal(journal_path, "start")
    await asyncio.sleep(3600)


@app.task(name="hung_sync", timeout=0.5, max_retries=0)
def hung_sync(seconds: float, journal_path: str = "") -> str:
    """A sync task that overruns its timeout; the thread cannot be stopped."""
    journal(journal_path, "start")
    time.sleep(seconds)
    journal(journal_path, "finish")
    return "late"


@app.task(name="loop_blocker", max_retries=0)
async def loop_blocker(seconds: float, journal_path: str = "") -> None:
    """Blocks the event loop itself (a bug in user code): only the hard exit ends it."""
    journal(journal_path, "start")
    time.sleep(seconds)


@app.task(name="poison", max_retries=2)
def poison(journal_path: str = "") -> None:
    """Kills whichever worker runs it."""
    journal(journal_path, "start")
    os._exit(9)


@app.task(name="quick", max_retries=10)
async def quick(n: int, journal_path: str = "") -> int:
    journal(journal_path, "start")
    await asyncio.sleep(0.01)
    journal(journal_path, "finish")
    return n


@app.task(name="big_result", max_retries=3)
async def big_result(size: int) -> str:
    return "x" * size


@app.task(name="not_json", max_retries=3)
async def not_json() -> object:
    return object()


@app.task(name="slow_then_quick", max_retries=3)
async def slow_then_quick(seconds: float, journal_path: str = "") -> dict[str, Any]:
    """Sleeps ``seconds`` on its first attempt only; a later attempt ends at once (so one that
    should never run finishes before any heartbeat could stop it)."""
    ctx = current_task()
    journal(journal_path, "start")
    try:
        await asyncio.sleep(seconds if ctx.attempt == 1 else 0.01)
    except asyncio.CancelledError:
        journal(journal_path, "cancelled")
        raise
    journal(journal_path, "finish")
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@app.task(name="until_file", max_retries=3)
async def until_file(path: str, journal_path: str = "") -> int:
    """Runs until the file ``path`` exists (a test's release that needs no Redis); returns the
    attempt."""
    journal(journal_path, "start")
    while not os.path.exists(path):
        await asyncio.sleep(0.01)
    journal(journal_path, "finish")
    return current_task().attempt
