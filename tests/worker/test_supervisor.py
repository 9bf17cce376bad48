"""Supervised loops restart after a crash and report each restart."""

from __future__ import annotations

import asyncio

import redis

from dtq_worker.supervisor import supervise


async def test_a_crashing_loop_is_restarted_and_reported() -> None:
    calls: list[str] = []
    restarts: list[tuple[str, str]] = []
    stop = False

    async def body() -> None:
        nonlocal stop
        calls.append("run")
        if len(calls) == 1:
            raise RuntimeError("bug")
        if len(calls) == 2:
            raise redis.ConnectionError("down")
        stop = True

    await asyncio.wait_for(
        supervise("poll", body, lambda: stop, lambda n, e: restarts.append((n, type(e).__name__))),
        10,
    )
    assert calls == ["run", "run", "run"]
    assert restarts == [("poll", "RuntimeError"), ("poll", "ConnectionError")]
