"""Supervised loops: a loop that raises is logged and restarted after 0.5-1.5 s."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from dtq.errors import describe
from dtq_worker.faults import is_transient

log = logging.getLogger("dtq.supervisor")
EPISODE_GAP_S = 10.0  # a loop that ran this long without error starts a new episode


async def supervise(
    name: str,
    body: Callable[[], Awaitable[None]],
    stopping: Callable[[], bool],
    on_restart: Callable[[str, BaseException], None] | None = None,
) -> None:
    """Run ``body`` until it returns while ``stopping()``; restart it whenever it raises, and
    tell ``on_restart(name, exc)`` (the worker counts restarts in metrics)."""
    restarts = 0
    in_episode = False  # transient errors are logged once per outage, not once per restart
    while True:
        began = time.monotonic()
        try:
            await body()
            if stopping():
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            restarts += 1
            if on_restart is not None:
                on_restart(name, exc)
            if is_transient(exc):
                quiet = in_episode and time.monotonic() - began < EPISODE_GAP_S
                lvl = logging.DEBUG if quiet else logging.WARNING
                log.log(lvl, "loop %s: transient Redis error, restarting: %s", name, describe(exc))
                in_episode = True
            else:
                log.exception("loop %s crashed (restart %d)", name, restarts)
            if stopping():
                return
        await asyncio.sleep(random.uniform(0.5, 1.5))
