"""The API's task list: newest first from the queues' event streams (no SCAN), filters,
cursor pages, and the running tasks (consumer-group pending entries) on the first page."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dtq import Settings
from dtq.admin import Admin
from dtq_api.app import create_app
from tests.apps.basic import app as tasks_app
from tests.conftest import make_settings, running_worker


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


async def pages(http: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        q = {**params, **({"cursor": cursor} if cursor else {})}
        r = await http.get("/api/v1/tasks", params=q)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= int(params.get("limit", 50))
        items += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return items


async def scans(a: Admin) -> int:
    stats = await a.redis.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


async def test_task_list_is_newest_first_across_queues_without_scan(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    async with Admin(settings) as a:
        ids: list[str] = []
        for i in range(14):  # interleaved over two queues and two names
            h = await a.client.enqueue("add" if i % 2 else "sync_mul", [i, 1],
                                       queue="qa" if i % 3 else "qb")  # fmt: skip
            ids.append(h.id)
            # Two queues' streams order their own events only: within one millisecond,
            # tasks of different queues have no order to check.
            await asyncio.sleep(0.002)
        before = await scans(a)
        listed = await pages(http, limit=4)
        assert [t["id"] for t in listed] == ids[::-1]
        # Filters combine, and keep the order.
        qb_adds = await pages(http, limit=2, queue="qb", name="add")
        want = [t for i, t in enumerate(ids) if i % 3 == 0 and i % 2][::-1]
        assert [t["id"] for t in qb_adds] == want and want
        queued = await pages(http, status="queued", limit=100)
        assert len(queued) == 14
        assert await pages(http, status="succeeded") == []
        assert await scans(a) == before  # the index, not a SCAN
        # Lookup by id answers any task, listed or not.
        r = await http.get(f"/api/v1/tasks/{ids[0]}")
        assert r.status_code == 200 and r.json()["id"] == ids[0]


async def test_running_tasks_are_on_the_first_page_however_old(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    async with Admin(settings) as a, running_worker(tasks_app, settings):
        long = await a.client.enqueue("sleep", [30])
        for _ in range(400):
            if (await a.get_task(long.id))["status"] == "running":
                break
            await asyncio.sleep(0.05)
        newer = [(await a.client.enqueue("add", [i, 0], queue="held")).id for i in range(6)]
        page = (await http.get("/api/v1/tasks", params={"limit": 3})).json()
        assert [t["id"] for t in page["items"]] == newer[:-4:-1]
        assert [t["id"] for t in page["running"]] == [long.id]
        assert page["running"][0]["status"] == "running"
        # A later page does not repeat them; a name filter applies to them too.
        nxt = {"limit": 3, "cursor": page["next_cursor"]}
        later = (await http.get("/api/v1/tasks", params=nxt)).json()
        assert later["running"] == []
        other = (await http.get("/api/v1/tasks", params={"name": "add"})).json()
        assert other["running"] == []
        await a.cancel(long.id)


async def test_task_pages_lose_and_repeat_nothing_when_ids_share_a_millisecond(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    async with Admin(settings) as a:
        # enqueue_many puts many events in one millisecond; two queues' streams then hold
        # equal stream ids, which the cursor must tell apart.
        qa = await a.client.enqueue_many(
            [{"name": "add", "args": [i, 0], "queue": "qa"} for i in range(40)]
        )
        qb = await a.client.enqueue_many(
            [{"name": "add", "args": [i, 0], "queue": "qb"} for i in range(40)]
        )
        listed = [t["id"] for t in await pages(http, limit=3)]
        assert sorted(listed) == sorted(h.id for h in qa + qb)
        assert [i for i in listed if i.startswith("qa:")] == [h.id for h in qa][::-1]
        assert [i for i in listed if i.startswith("qb:")] == [h.id for h in qb][::-1]
        r = await http.get("/api/v1/tasks", params={"cursor": "12.x"})
        assert r.status_code == 422


@pytest.mark.cluster
async def test_newest_first_running_and_resume_span_nodes(backend: Any, prefix: str) -> None:
    """On a cluster each queue has its own slot: the index's reads, the running list and an
    event stream's resume read every queue's keys without one command spanning two slots."""
    from tests.helpers import spread_queues

    queues = spread_queues(backend, prefix, 3)
    s = make_settings(backend.url, prefix)
    async with Admin(s) as a, running_worker(tasks_app, s.model_copy(update={"queues": queues})):
        ids: list[str] = []
        for i, q in enumerate(queues):
            ids.append((await a.client.enqueue("add", [i, 0], queue=q)).id)
            await asyncio.sleep(0.002)
        first_event = next(
            e.id
            for e in await a.recent_events(queues=[queues[0]])
            if e.type == "enqueued" and e.task_id == ids[0]
        )
        long = await a.client.enqueue("sleep", [30], queue=queues[1])
        listed: list[str] = []
        cursor = None
        running: list[dict[str, Any]] = []
        for _ in range(400):
            page = await a.recent_tasks(limit=1, cursor=cursor)
            running += page.running
            listed += [t["id"] for t in page.items]
            cursor = page.next_cursor
            if cursor is None:
                if long.id in {t["id"] for t in running}:
                    break
                listed, running = [], []  # the long task not started yet: list again
                await asyncio.sleep(0.05)
        assert listed == [long.id, *ids[::-1]]
        assert [t["id"] for t in running] == [long.id]
        missed, more = await a.events_after(first_event)
        assert not more
        enq = [e.task_id for e in missed if e.type == "enqueued"]
        assert enq == [*ids[1:], long.id]
        await a.cancel(long.id)


async def hgetalls(r: Any) -> int:
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


async def test_a_page_over_a_bulk_backlog_reads_a_bounded_number_of_records(
    fresh_redis: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bulk enqueue's event entry holds up to 250 tids: a page is bounded in records
    read (not stream entries), and its cursor resumes inside an entry, losing nothing."""
    from dtq.admin import task_index

    settings = make_settings(fresh_redis.url, prefix)
    app = create_app(settings)
    async with (
        Admin(settings) as a,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        ids: list[str] = []
        for start in range(0, 3000, 1000):
            items = [
                {"name": "add" if i % 3 else "noop", "args": [i, 0]}
                for i in range(start, start + 1000)
            ]
            ids += [h.id for h in await a.client.enqueue_many(items)]
        entries = await a.redis.xlen(a.keys.queue("default").events)
        assert entries <= 3000 // 100, entries  # bulk entries, many tids each
        await a.redis.config_resetstat()
        r = await http.get("/api/v1/tasks", params={"limit": 1})
        assert r.status_code == 200 and [t["id"] for t in r.json()["items"]] == [ids[-1]]
        assert await hgetalls(a.redis) <= task_index.FETCH_MIN, await hgetalls(a.redis)
        # A filter matching nothing stops at the budget, with a cursor to go on from.
        monkeypatch.setattr(task_index, "RECORD_BUDGET", 1000)
        await a.redis.config_resetstat()
        r = await http.get("/api/v1/tasks", params={"limit": 5, "name": "none"})
        page = r.json()
        assert page["items"] == [] and page["next_cursor"], page
        assert await hgetalls(a.redis) <= 1000
        # A cursor walk with a small budget (pages stop inside bulk entries) lists every
        # "noop" task once, newest first.
        monkeypatch.setattr(task_index, "RECORD_BUDGET", 317)
        monkeypatch.setattr(task_index, "FETCH_MIN", 50)
        listed = [t["id"] for t in await pages(http, limit=1000, name="noop")]
        assert listed == [ids[i] for i in range(0, 3000, 3)][::-1]
        listed = [t["id"] for t in await pages(http, limit=37)]
        assert listed == ids[::-1]
