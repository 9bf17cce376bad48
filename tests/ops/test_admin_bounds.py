"""Listings do bounded work per request: a filter that matches nothing answers within a scan
budget with a cursor to continue, and a page of dead letters costs the same few round trips
whatever its length."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio.connection as aconn

from dtq import Settings
from dtq.admin import DLQ_BUDGET, SCAN_BUDGET, Admin, filled_page

RECORDS = 50_000


@pytest.fixture(autouse=True)
async def drop_keys(settings: Settings) -> AsyncIterator[None]:
    """The planted records leave with the test: other tests share this Redis (and SCAN it)."""
    yield
    async with Admin(settings) as a:
        keys: list[str] = []
        async for k in a.redis.scan_iter(match=f"{a.keys.prefix}:*", count=5000):
            keys.append(k)
            if len(keys) >= 5000:
                await a.redis.unlink(*keys)
                keys = []
        if keys:
            await a.redis.unlink(*keys)


async def plant(a: Admin, queue: str, n: int, status: str = "queued", dlq: bool = False) -> None:
    """``n`` raw task records (and dead-letter entries), written fast with a pipeline."""
    qk = a.keys.queue(queue)
    await a.redis.sadd(a.keys.queues, queue)
    for start in range(0, n, 5000):
        async with a.redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(n, start + 5000)):
                tid = f"t{i:07d}"
                pipe.hset(qk.task(tid), mapping={
                    "name": "add", "status": status, "prio": "0", "attempt": "1", "maxr": "0",
                    "args": json.dumps([i]), "enq": "1700000000000", "error": "boom",
                })  # fmt: skip
                if dlq:
                    pipe.zadd(qk.dlq, {tid: 1700000000000 + i})
            await pipe.execute()


def count_calls(obj: Any, attr: str) -> list[int]:
    calls = [0]
    orig: Callable[..., Any] = getattr(obj, attr)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await orig(*args, **kwargs)

    setattr(obj, attr, counted)
    return calls


@pytest.mark.slow
async def test_task_listing_with_a_filter_matching_nothing_stops_within_its_scan_budget(
    settings: Settings,
) -> None:
    async with Admin(settings) as a:
        await plant(a, "big", RECORDS)
        await a.redis.hset(a.keys.queue("big").task("zlast"), mapping={
            "name": "rare", "status": "queued", "args": "[]", "enq": "1700000000000"})  # fmt: skip
        scans = count_calls(a._r, "scan")
        page = await a.list_tasks(name="rare-nothing", limit=50)
        assert page.items == [] and page.next_cursor is not None
        assert scans[0] <= SCAN_BUDGET and page.scans == scans[0]
        # Following the cursor walks the whole keyspace in bounded steps and finds the one match.
        found: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            scans[0] = 0
            page = await a.list_tasks(queue="big", name="rare", cursor=cursor, limit=50)
            assert scans[0] <= SCAN_BUDGET
            found += [t["id"] for t in page.items]
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert found == ["big:zlast"] and pages > 1
        # A caller of its own (the CLI) follows the cursor to fill a page, in bounded calls.
        scans[0] = 0
        full = await filled_page(
            lambda cur, n: a.list_tasks(name="rare", cursor=cur, limit=n), None, 50
        )
        assert [t["id"] for t in full.items] == ["big:zlast"] and full.next_cursor is None
        assert full.scans == scans[0] > SCAN_BUDGET


async def round_trips(monkeypatch: pytest.MonkeyPatch, coro: Any) -> tuple[Any, int]:
    calls = [0]
    orig = aconn.AbstractConnection.send_packed_command

    async def counted(self: Any, command: Any, check_health: bool = True) -> None:
        calls[0] += 1
        await orig(self, command, check_health)

    monkeypatch.setattr(aconn.AbstractConnection, "send_packed_command", counted)
    try:
        return await coro, calls[0]
    finally:
        monkeypatch.setattr(aconn.AbstractConnection, "send_packed_command", orig)


async def test_dead_letter_pages_cost_the_same_round_trips_whatever_their_length(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Admin(settings) as a:
        await plant(a, "few", 5, status="failed", dlq=True)
        await plant(a, "many", 900, status="failed", dlq=True)
        await a.ping()  # the connection is made outside the count
        trips: dict[str, int] = {}
        for q, n in (("few", 5), ("many", 900)):
            page, trips[f"dlq {q}"] = await round_trips(
                monkeypatch, a.dlq_list(queue=q, limit=1000)
            )
            assert len(page.items) == n and page.next_cursor is None
            page, trips[f"tasks {q}"] = await round_trips(
                monkeypatch, a.list_tasks(queue=q, status="failed", limit=1000)
            )
            assert len(page.items) == n and page.next_cursor is None
        assert trips["dlq few"] == trips["dlq many"] <= 3, trips
        assert trips["tasks few"] == trips["tasks many"] <= 3, trips


async def test_dead_letter_filter_matching_nothing_stops_within_its_budget(
    settings: Settings,
) -> None:
    async with Admin(settings) as a:
        await plant(a, "dl", 3 * DLQ_BUDGET, status="failed", dlq=True)
        page = await a.dlq_list(queue="dl", name="nothing", limit=10)
        assert page.items == [] and page.next_cursor is not None
        assert page.examined <= DLQ_BUDGET
        page = await a.list_tasks(queue="dl", status="failed", name="nothing", limit=10)
        assert page.items == [] and page.next_cursor is not None
        assert page.examined <= DLQ_BUDGET
        # Continuing reaches the end.
        cursor = page.next_cursor
        steps = 0
        while cursor is not None:
            page = await a.list_tasks(queue="dl", status="failed", name="nothing",
                                      cursor=cursor, limit=10)  # fmt: skip
            cursor, steps = page.next_cursor, steps + 1
            assert steps < 10


async def test_queue_listing_costs_the_same_round_trips_whatever_the_queue_count(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Admin(settings) as a:
        await a.client.enqueue("add", queue="q0")
        await a.ping()
        _, few = await round_trips(monkeypatch, a.list_queues())
        for i in range(1, 40):
            await a.client.enqueue("add", queue=f"q{i}")
        infos, many = await round_trips(monkeypatch, a.list_queues())
        assert len(infos) == 40 and all(q.queued == 1 for q in infos)
        assert few == many, (few, many)


async def test_scheduled_listing_costs_the_same_round_trips_whatever_the_queue_count(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Admin(settings) as a:
        await a.client.enqueue("add", queue="s0", delay=600)
        await a.ping()
        _, few = await round_trips(monkeypatch, a.list_scheduled())
        for i in range(1, 30):
            await a.client.enqueue("add", queue=f"s{i}", delay=600)
        got, many = await round_trips(monkeypatch, a.list_scheduled())
        assert len(got) == 30 and {s.kind for s in got} == {"delayed"}
        assert few == many, (few, many)
