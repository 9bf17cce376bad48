"""Ending asyncio tasks for sure: a cancel can be lost, so it is given again until they end.

On Python 3.11, ``asyncio.wait_for`` drops a cancel that lands as its inner awaitable
completes, and redis-py sends every command under it: a read cancelled as its command is sent
goes on waiting for the reply (docs/operations.md, "Server-sent events").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

AGAIN_EVERY_S = 0.05


async def cancel_until_done(tasks: Iterable[asyncio.Future[Any]], timeout_s: float) -> set[Any]:
    """Cancel ``tasks`` and wait up to ``timeout_s`` for every one to end, cancelling those
    still running again every :data:`AGAIN_EVERY_S` (a lost cancel is given again: by then the
    task waits on something else, which the new cancel interrupts). Returns those still
    running at the deadline (a task that catches every cancel)."""
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        for t in pending:
            t.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(AGAIN_EVERY_S, left))
    return pending
