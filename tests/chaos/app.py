"""Tasks of the chaos soak. Every run journals its start and its end to a file of its own
worker process (O_APPEND, fsync per line): SIGKILL, Redis restarts and cut connections cannot
erase what a run did, so the checker can compare what ran with what Redis says.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

from dtq import App, current_task

app = App()
_fd: int | None = None
_lock = threading.Lock()


def journal(event: str, idx: int) -> None:
    global _fd
    ctx = current_task()
    line = json.dumps(
        {
            "ev": event,
            "id": ctx.id,
            "idx": idx,
            "attempt": ctx.attempt,
            "worker": ctx.worker_id,
            "pid": os.getpid(),
            "t": time.time(),
        }
    )
    with _lock:
        if _fd is None:
            path = os.path.join(os.environ["DTQ_CHAOS_DIR"], f"journal-{os.getpid()}.jsonl")
            _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_fd, (line + "\n").encode())
        os.fsync(_fd)


def _result(idx: int) -> dict[str, Any]:
    ctx = current_task()
    return {"idx": idx, "attempt": ctx.attempt, "worker": ctx.worker_id}


class Planned(Exception):
    """A failure the soak planned (``fail``): "once" raises in attempt 1, "always" in every."""


def _raise_if_planned(fail: str, idx: int) -> None:
    if fail == "always" or (fail == "once" and current_task().attempt == 1):
        journal("raised", idx)
        raise Planned(fail)


@app.task(name="chaos.async", max_retries=50)
async def work_async(idx: int, ms: int, fail: str = "") -> dict[str, Any]:
    journal("start", idx)
    try:
        await asyncio.sleep(ms / 1000)
    except asyncio.CancelledError:
        journal("cancelled", idx)
        raise
    _raise_if_planned(fail, idx)
    journal("finish", idx)
    return _result(idx)


@app.task(name="chaos.sync", max_retries=50)
def work_sync(idx: int, ms: int, fail: str = "") -> dict[str, Any]:
    journal("start", idx)
    time.sleep(ms / 1000)
    _raise_if_planned(fail, idx)
    journal("finish", idx)
    return _result(idx)


@app.task(name="chaos.join", max_retries=50)
async def join(results: list[dict[str, Any]], idx: int) -> dict[str, Any]:
    """A chord's callback: gets its members' results (in member order) first."""
    journal("start", idx)
    try:
        await asyncio.sleep(0.02)
    except asyncio.CancelledError:
        journal("cancelled", idx)
        raise
    journal("finish", idx)
    return _result(idx) | {"members": [r["idx"] for r in results]}
