"""dtq.admin against a real Redis and real workers: queues, tasks, dead letters, workers, events."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest

from dtq import Settings, UnknownTask
from dtq import scripts as sc
from dtq.admin import Admin, Conflict, UnknownQueue
from dtq.errors import InvalidRequest
from dtq.store.keys import GROUP
from tests.apps.basic import app
from tests.conftest import running_worker


async def wait_for(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def ensure_groups(a: Admin, queue: str) -> None:
    for s in a.keys.queue(queue).streams:
        try:
            await a.redis.xgroup_create(s, GROUP, id="0", mkstream=True)
        except Exception as exc:
            assert "BUSYGROUP" in str(exc)


async def test_queue_depths_per_priority_scheduled_running_dlq_paused(settings: Settings) -> None:
    async with Admin(settings) as a:
        c = a.client
        await ensure_groups(a, "q")
        for p in (9, 9, 0, 0, 0, 4):
            await c.enqueue("add", [1, 2], queue="q", priority=p)
        await c.enqueue("add", [1, 2], queue="q", delay=60)
        # One task taken by a (fake) worker: running, no longer waiting.
        qk = a.keys.queue("q")
        claimed = sc.parse_claim("q", await a.scripts.run(sc.claim_call(qk, "wx", 1, 100, 60)))
        assert len(claimed.runs) == 1 and claimed.runs[0].priority == 9
        await asyncio.sleep(0.05)
        (q,) = await a.list_queues()
        assert q.name == "q"
        assert q.depth == {9: 1, 8: 0, 7: 0, 6: 0, 5: 0, 4: 1, 3: 0, 2: 0, 1: 0, 0: 3}
        assert q.queued == 5 and q.scheduled == 1 and q.running == 1 and q.dlq == 0
        assert not q.paused
        assert q.oldest_waiting_age_s is not None and 0.04 <= q.oldest_waiting_age_s < 60
        assert await a.pause("q") is True
        assert await a.pause("q") is False  # replay
        assert (await a.get_queue("q")).paused
        assert await a.resume("q") is True and await a.resume("q") is False
        with pytest.raises(UnknownQueue):
            await a.get_queue("nope")
        with pytest.raises(InvalidRequest):
            await a.get_queue("bad name!")
        d = q.to_dict()
        assert d["depth"]["9"] == 1 and d["queued"] == 5


async def test_pause_stops_a_live_worker_and_resume_lets_it_go(settings: Settings) -> None:
    async with running_worker(app, settings), Admin(settings) as a:
        c = a.client
        h = await c.enqueue("add", [1, 1])
        assert await c.result(h.id, timeout=20) == 2
        await a.pause("default")
        h2 = await c.enqueue("add", [2, 2])
        await asyncio.sleep(1.0)  # several claim passes of a paused queue
        assert (await c.get(h2.id)).status.value == "queued"
        await a.resume("default")
        assert await c.result(h2.id, timeout=20) == 4
        types = [e.type for e in await a.recent_events(queues=["default"])]
        assert "paused" in types and "resumed" in types


async def test_purge_in_batches_with_progress(settings: Settings) -> None:
    async with Admin(settings) as a:
        hs = await a.client.enqueue_many([{"name": "add", "args": [i, i]} for i in range(120)])
        await a.client.enqueue("add", [0, 0], delay=30)
        steps: list[int] = []
        res = await a.purge("default", batch=50, progress=steps.append)
        assert res.done == 121 and res.skipped == {"queued": 120, "scheduled": 1}
        assert sum(steps) == 121 and len(steps) >= 3
        with pytest.raises(UnknownTask):
            await a.client.get(hs[0].id)
        q = await a.get_queue("default")
        assert q.queued == 0 and q.scheduled == 0


async def test_dlq_list_requeue_with_raised_budget_keeps_id_and_history(
    settings: Settings,
) -> None:
    async with running_worker(app, settings), Admin(settings) as a:
        c = a.client
        flaky = await c.enqueue("flaky", [2], max_retries=0)  # fails on attempts 1 and 2
        fail = await c.enqueue("fail_now")
        for h in (flaky, fail):
            with pytest.raises(Exception, match="ended failed"):
                await c.result(h.id, timeout=20)
        page = await a.dlq_list()
        by_id = {d["task_id"]: d for d in page.items}
        assert set(by_id) == {flaky.id, fail.id} and page.next_cursor is None
        assert by_id[flaky.id]["error"].startswith("ValueError: boom on attempt 1")
        assert by_id[fail.id]["name"] == "fail_now" and by_id[fail.id]["attempt"] == 1
        only = await a.dlq_list(name="flaky")
        assert [d["task_id"] for d in only.items] == [flaky.id]
        assert [d["task_id"] for d in (await a.dlq_list(error="permanent")).items] == [fail.id]

        # Requeue the filtered set with a raised retry budget: attempt 2 fails, 3 succeeds.
        res = await a.dlq_requeue(name="flaky", max_retries=3)
        assert res.done == 1
        assert await c.result(flaky.id, timeout=20) == 3
        d = await a.get_task(flaky.id, history=True)
        assert d["id"] == flaky.id and d["status"] == "succeeded" and d["requeues"] == 1
        types = [e["type"] for e in d["history"]]
        assert types[:4] == ["enqueued", "started", "failed", "dlq_requeued"]
        assert types[-1] == "succeeded" and types.count("started") == 3
        assert [e["attempt"] for e in d["history"] if e["type"] == "started"] == [1, 2, 3]

        # The other dead letter is still there; requeue one by id, then it fails again.
        assert [x["task_id"] for x in (await a.dlq_list()).items] == [fail.id]
        await a.dlq_requeue_one(fail.id)
        with pytest.raises(Conflict):
            await a.dlq_requeue_one(flaky.id)  # succeeded: not a dead letter
        with pytest.raises(Exception, match="ended failed"):
            await c.result(fail.id, timeout=20)
        info = await c.get(fail.id)
        assert info.attempt == 2 and info.status.value == "failed"
        await a.dlq_discard_one(fail.id)
        with pytest.raises(UnknownTask):
            await c.get(fail.id)
        with pytest.raises(UnknownTask):
            await a.dlq_discard_one(fail.id)
        assert (await a.dlq_list()).items == []


async def test_dlq_bulk_requeue_all_discard_and_purge(settings: Settings) -> None:
    async with Admin(settings) as a:
        await ensure_groups(a, "default")
        qk = a.keys.queue("default")
        hs = await a.client.enqueue_many(
            [{"name": "n", "args": [i], "max_retries": 0} for i in range(30)]
        )
        runs = sc.parse_claim("default", await a.scripts.run(sc.claim_call(qk, "w", 30, 1000, 60)))
        fails = [sc.Failure(r.tid, r.eid, r.attempt, "E: x", 0) for r in runs.runs]
        await a.scripts.run(sc.fail_call(qk, "w", fails, 1000, 60))
        assert await a.dlq_count() == 30
        steps: list[int] = []
        res = await a.dlq_requeue(progress=steps.append)  # all
        assert res.done == 30 and sum(steps) == 30 and await a.dlq_count() == 0
        assert (await a.get_queue("default")).queued == 30
        # Fail them again; discard 5 by id, purge the rest.
        runs = sc.parse_claim("default", await a.scripts.run(sc.claim_call(qk, "w", 30, 1000, 60)))
        fails = [sc.Failure(r.tid, r.eid, r.attempt, "E: y", 0) for r in runs.runs]
        await a.scripts.run(sc.fail_call(qk, "w", fails, 1000, 60))
        res = await a.dlq_discard([h.id for h in hs[:5]])
        assert res.done == 5
        assert await a.dlq_purge() == 25
        assert await a.dlq_count() == 0
        again = await a.dlq_discard([hs[0].id])
        assert again.done == 0 and again.skipped == {"missing": 1}


async def test_dlq_pagination_across_queues(settings: Settings) -> None:
    async with Admin(settings) as a:
        ids = []
        for q in ("a", "b"):
            await ensure_groups(a, q)
            qk = a.keys.queue(q)
            hs = await a.client.enqueue_many(
                [{"name": "n", "queue": q, "max_retries": 0} for _ in range(7)]
            )
            ids += [h.id for h in hs]
            runs = sc.parse_claim(q, await a.scripts.run(sc.claim_call(qk, "w", 10, 100, 60)))
            fails = [sc.Failure(r.tid, r.eid, r.attempt, "E", 0) for r in runs.runs]
            await a.scripts.run(sc.fail_call(qk, "w", fails, 100, 60))
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            page = await a.dlq_list(cursor=cursor, limit=4)
            seen += [d["task_id"] for d in page.items]
            pages += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert sorted(seen) == sorted(ids) and pages >= 4


async def all_tasks(a: Admin, **filters: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await a.list_tasks(cursor=cursor, limit=1000, **filters)
        out += page.items
        cursor = page.next_cursor
        if cursor is None:
            return out


@pytest.mark.cluster
async def test_list_tasks_filters_and_cursor_pagination(settings: Settings) -> None:
    async with Admin(settings) as a:
        c = a.client
        adds = await c.enqueue_many([{"name": "add", "args": [i, 1]} for i in range(23)])
        muls = await c.enqueue_many([{"name": "sync_mul", "args": [i, 2]} for i in range(5)])
        other = await c.enqueue("add", [0, 0], queue="other", delay=60)
        seen: list[str] = []
        cursor = None
        while True:
            page = await a.list_tasks(limit=6, cursor=cursor)
            assert len(page.items) <= 6
            seen += [t["id"] for t in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert set(seen) == {h.id for h in adds + muls} | {other.id}
        # A filtered listing does bounded work per call: follow the cursor to the end.
        names = await all_tasks(a, name="sync_mul")
        assert {t["id"] for t in names} == {h.id for h in muls}
        sched = await all_tasks(a, status="scheduled")
        assert [t["id"] for t in sched] == [other.id]
        by_q = await a.list_tasks(queue="other", status="scheduled", limit=100)
        assert [t["id"] for t in by_q.items] == [other.id]
        in_default = await all_tasks(a, queue="default")
        assert len(in_default) == 28
        with pytest.raises(InvalidRequest):
            await a.list_tasks(status="bogus")
        with pytest.raises(InvalidRequest):
            await a.list_tasks(cursor="x.y")


async def test_retry_and_cancel(settings: Settings) -> None:
    async with Admin(settings) as a:
        c = a.client
        h = await c.enqueue("add", [1, 2], delay=60)
        assert (await a.cancel(h.id))["outcome"] == "cancelled"
        assert (await a.cancel(h.id))["outcome"] == "unchanged"
        assert (await a.retry(h.id))["status"] == "queued"
        info = await c.get(h.id)
        assert info.status.value == "queued" and not info.cancel_requested
        with pytest.raises(Conflict) as exc:
            await a.retry(h.id)
        assert exc.value.status == "queued"
        with pytest.raises(UnknownTask):
            await a.retry("default:0000")
        with pytest.raises(UnknownTask):
            await a.cancel("default:0000")


@pytest.mark.cluster
async def test_events_read_from_now_and_throughput(settings: Settings) -> None:
    async with running_worker(app, settings), Admin(settings) as a:
        await a.client.enqueue("add", [0, 0])  # registers the queue
        await asyncio.sleep(0.3)
        _, cursors = await a.read_events(None, block_ms=0)
        h = await a.client.enqueue("add", [2, 2])
        await a.client.result(h.id, timeout=20)
        got: list[Any] = []
        for _ in range(20):
            evs, cursors = await a.read_events(cursors, block_ms=500)
            got += [e for e in evs if e.task_id == h.id]
            if any(e.type == "succeeded" for e in got):
                break
        assert [e.type for e in got] == ["enqueued", "started", "succeeded"]
        assert got[1].attempt == 1 and got[1].worker
        tp = await a.throughput(window_s=60, bucket_s=5)
        assert sum(tp["series"]["succeeded"]) == 2
        assert sum(tp["series"]["enqueued"]) == 2


@pytest.mark.slow
@pytest.mark.cluster
async def test_sigkilled_worker_shows_stale_within_three_heartbeats(
    settings: Settings, spawn_worker: Any
) -> None:
    w = spawn_worker("tests.apps.basic:app", settings, "--worker-id", "victim")
    async with Admin(settings) as a:

        async def live() -> bool:
            ws = {x.worker_id: x for x in await a.list_workers()}
            return "victim" in ws and ws["victim"].live

        await wait_for(live)
        (info,) = await a.list_workers()
        assert info.heartbeat_interval_s == pytest.approx(0.2)
        assert info.queues == ["default"] and info.pid == w.proc.pid
        w.signal(signal.SIGKILL)
        w.proc.wait(10)
        killed_at = time.time() * 1000
        interval_ms = 200
        # Sample the observer until it says stale: each verdict must follow the heartbeat age
        # (live below 2 intervals, stale past 3), so a dead worker turns stale within 3.
        samples = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (info,) = await a.list_workers()
            samples.append((info.heartbeat_age_s * 1000, info.live))
            if not info.live:
                break
            await asyncio.sleep(0.03)
        assert samples and not samples[-1][1], "never turned stale"
        for age_ms, live in samples:
            if age_ms > 3 * interval_ms:
                assert not live
            if age_ms < 2 * interval_ms:
                assert live
        assert info.stale and info.status == "stale"
        assert info.last_heartbeat_ms <= killed_at
        # Still listed (stale) after its heartbeat hash expired.
        await asyncio.sleep(1.0)
        (info,) = await a.list_workers()
        assert info.stale and info.worker_id == "victim"


async def test_a_cluster_walk_cursor_on_one_server_is_a_bad_cursor(settings: Settings) -> None:
    """schemathesis sent a cluster walk's cursor ("<primary>:<cursor>") to one server: 500."""
    async with Admin(settings) as a:
        with pytest.raises(InvalidRequest, match="bad cursor"):
            await a.list_tasks(cursor="3:4830.6751")


async def test_a_walk_cursor_given_to_a_position_listing_is_a_bad_cursor(
    settings: Settings,
) -> None:
    """schemathesis sent "<primary>:<cursor>" to the DLQ and the failed-task listing: 500."""
    async with Admin(settings) as a:
        with pytest.raises(InvalidRequest, match="bad cursor"):
            await a.dlq_list(cursor="5815:200178")
        with pytest.raises(InvalidRequest, match="bad cursor"):
            await a.list_tasks(queue="default", status="failed", cursor="5815:200178")
