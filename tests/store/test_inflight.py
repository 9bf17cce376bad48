"""The cap on a cluster client's calls in flight (dtq/store/inflight.py), alone: a call made inside
one already counted (a pipeline re-sending a command through its client) is not counted again,
so a full cap cannot wait on itself; every other call waits for a place. And what a full
pool's error says."""

from __future__ import annotations

import asyncio
import threading

import redis
from redis.exceptions import MaxConnectionsError

from dtq.errors import unreachable
from dtq.store.inflight import AsyncInFlight, SyncInFlight


async def test_a_call_inside_a_counted_one_does_not_wait_for_its_place() -> None:
    gate = AsyncInFlight(1)
    order: list[str] = []
    held = asyncio.Event()

    async def other() -> None:
        await held.wait()
        async with gate():
            order.append("other")

    # A call of its own (started outside: a task started inside a call is part of it).
    waiting = asyncio.ensure_future(other())
    async with gate():
        held.set()
        async with asyncio.timeout(5):
            async with gate():  # nested (the pipeline's own re-send): goes on at once
                order.append("nested")
            # A task started inside the call is part of it too (a pipeline's per-node sends).
            await asyncio.ensure_future(_enter(gate, order))
        await asyncio.sleep(0.01)
        assert not waiting.done()
    await asyncio.wait_for(waiting, 5)
    assert order == ["nested", "child", "other"]


async def _enter(gate: AsyncInFlight, order: list[str]) -> None:
    async with gate():
        order.append("child")


def test_a_thread_inside_a_counted_call_does_not_wait_for_its_place() -> None:
    gate = SyncInFlight(1)
    other_in = threading.Event()

    def other() -> None:
        with gate():
            other_in.set()

    with gate():
        t = threading.Thread(target=other)
        t.start()
        with gate():  # nested: goes on at once (a deadlock before)
            pass
        assert not other_in.wait(0.05)  # another thread waits for the place
    assert other_in.wait(5)
    t.join(5)


def test_a_full_pools_error_says_what_it_is() -> None:
    """redis-py's MaxConnectionsError says nothing: the API answered "Redis unreachable: "
    (seen while the cap left pipelines out); a client without the cap can still meet it."""
    assert unreachable(MaxConnectionsError()) == (
        "Redis unreachable: too many connections (every one of the client's is in use)"
    )
    assert unreachable(redis.ConnectionError("Connection refused")) == (
        "Redis unreachable: Connection refused"
    )
