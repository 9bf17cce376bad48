"""AsyncClient's group commit of single enqueues (dtq/sdk/coalesce.py): the enqueues that many
coroutines make while one is in flight go out as one bulk call, and nothing is lost, doubled or
reordered on the way; a waiter cancelled before its batch is sent is not enqueued; a failed
batch raises in each of its waiters. Real redis-servers (paused with SIGSTOP, killed)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dtq import AsyncClient, RedisUnavailable, Settings
from dtq import scripts as sc
from tests.conftest import make_settings
from tests.helpers import evalsha_calls, stream_args
from tests.redis_server import RedisServer

N = 200


@pytest.mark.cluster
async def test_concurrent_enqueues_are_each_made_once_and_in_order(
    settings: Settings, r: redis.Redis
) -> None:
    # (Sent one call each, more than 100 at once failed: redis-py's asyncio pool holds 100
    # connections and refuses the next with "Too many connections".)
    async with AsyncClient(settings=settings) as c:
        handles = await asyncio.gather(*(c.enqueue("job", args=[i]) for i in range(N)))
    assert len({h.id for h in handles}) == N and all(h.created for h in handles)
    assert stream_args(r, settings) == list(range(N))  # one entry each, in the calls' order


@pytest.mark.parametrize("coalesce", [True, False])
async def test_concurrent_enqueues_go_out_in_a_few_calls(
    fresh_redis: RedisServer, prefix: str, coalesce: bool
) -> None:
    s = make_settings(fresh_redis.url, prefix, client_coalesce=coalesce)
    r = fresh_redis.client()  # (a server of its own: no other test's calls in the count)
    n = 50  # (under redis-py's 100 connections, for the calls sent one by one)
    async with AsyncClient(settings=s) as c:
        await c.enqueue("job", args=[-1])  # registers the queue, loads the script
        before = evalsha_calls(r)
        await asyncio.gather(*(c.enqueue("job", args=[i]) for i in range(n)))
        calls = evalsha_calls(r) - before
    made = stream_args(r, s)[1:]
    if coalesce:
        assert made == list(range(n))
        assert calls == 2  # the first alone, the other 49 in one batch when it returned
    else:  # (each on a connection of its own: Redis runs them in the order they arrive)
        assert sorted(made) == list(range(n))
        assert calls == n
    r.close()


async def test_a_waiter_cancelled_before_its_batch_is_sent_is_not_enqueued(
    fresh_redis: RedisServer, prefix: str
) -> None:
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    async with AsyncClient(settings=s) as c:
        await c.enqueue("job", args=[0])
        fresh_redis.pause()  # the next enqueue stays in flight
        try:
            first = asyncio.create_task(c.enqueue("job", args=[1]))
            await asyncio.sleep(0.2)
            gone = asyncio.create_task(c.enqueue("job", args=[2]))
            kept = asyncio.create_task(c.enqueue("job", args=[3]))
            await asyncio.sleep(0.1)
            gone.cancel()
            await asyncio.sleep(0.1)
        finally:
            fresh_redis.resume()
        h1, h3 = await asyncio.wait_for(asyncio.gather(first, kept), 10)
        with pytest.raises(asyncio.CancelledError):
            await gone
    assert stream_args(r, s) == [0, 1, 3]
    assert h1.created and h3.created
    r.close()


async def test_a_failed_batch_raises_in_each_of_its_waiters(
    fresh_redis: RedisServer, prefix: str
) -> None:
    s = make_settings(fresh_redis.url, prefix, client_retries=0)
    async with AsyncClient(settings=s) as c:
        await c.enqueue("job", args=[0])
        fresh_redis.pause()
        first = asyncio.create_task(c.enqueue("job", args=[1]))
        await asyncio.sleep(0.2)
        waiting = [asyncio.create_task(c.enqueue("job", args=[i])) for i in range(2, 6)]
        await asyncio.sleep(0.1)
        fresh_redis.stop()  # (killed while stopped: its connections are reset)
        done = await asyncio.wait_for(asyncio.gather(first, *waiting, return_exceptions=True), 20)
    assert all(isinstance(x, RedisUnavailable) for x in done), done


async def test_an_idempotency_key_in_one_batch_makes_one_task(
    redis_server: RedisServer, prefix: str
) -> None:
    s = make_settings(redis_server.url, prefix)
    r = redis_server.client()
    async with AsyncClient(settings=s) as c:
        await c.enqueue("job", args=[0])
        hs = await asyncio.gather(
            c.enqueue("job", args=[1]),
            *(c.enqueue("job", args=[2], idempotency_key="once") for _ in range(3)),
        )
    assert len({h.id for h in hs[1:]}) == 1
    assert [h.created for h in hs[1:]] == [True, False, False]
    assert stream_args(r, s) == [0, 1, 2]
    r.close()


class _Reentrant(AsyncClient):
    """A client whose sends make one enqueue of their own (as dtq.testing's eager mode does:
    it runs the task, which enqueues, inside the enqueue's send)."""

    nested: list[int]  # the tasks of each send that made one (its own sends make none)
    inner = False

    def _single(self, queue: str, task: sc.NewTask) -> None:
        return None  # every enqueue through _send (as dtq.testing's clients)

    async def _send(self, by_queue: dict[str, list[tuple[int, sc.NewTask]]], n: int) -> Any:
        out = await super()._send(by_queue, n)
        if not self.inner and len(self.nested) < 2:
            self.nested.append(n)
            self.inner = True
            try:
                await self.enqueue("job", args=[100 + len(self.nested)])
            finally:
                self.inner = False
        return out


async def test_an_enqueue_made_inside_a_send_goes_out_on_its_own(
    fresh_redis: RedisServer, prefix: str
) -> None:
    """From a lone enqueue's send and from a batch's: it cannot wait for the send it is part
    of (before, both waited for ever)."""
    s = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    async with _Reentrant(settings=s) as c:
        c.nested = [-1, -1]  # (the first enqueue's send makes none)
        await c.enqueue("job", args=[0])
        c.nested = []
        fresh_redis.pause()  # the next enqueue stays in flight while three wait for it
        try:
            first = asyncio.ensure_future(c.enqueue("job", args=[1]))
            await asyncio.sleep(0.1)
            rest = [asyncio.ensure_future(c.enqueue("job", args=[i])) for i in (2, 3, 4)]
            await asyncio.sleep(0.1)
        finally:
            fresh_redis.resume()
        done = await asyncio.wait_for(asyncio.gather(first, *rest), 10)
    assert all(h.created for h in done) and c.nested == [1, 3]  # the lone send, then the batch
    assert sorted(stream_args(r, s)) == [0, 1, 2, 3, 4, 101, 102]
    r.close()
