"""Ending asyncio tasks for sure: on Python 3.11 ``asyncio.wait_for`` (under every redis-py
command) can drop a cancel, so it is given again until they end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

AGAIN_EVERY_S = 0.05


async def cancel_until_done(tasks: Iterable[asyncio.Future[Any]], timeout_s: float) -> set[Any]:
    """Cancel ``tasks`` and wait up to ``timeout_s`` for every one to end, cancelling those
    still running again every :data:`AGAIN_EVERY_S`. Returns those still running at the
    deadline."""
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
