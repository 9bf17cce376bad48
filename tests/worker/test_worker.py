"""Worker behaviour with an in-process worker: results, retries, Fail/Retry, timeouts, delays."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Settings, TaskFailed, TaskStatus
from dtq.store.keys import Keys, split_task_id
from tests.apps.basic import SLEEPING, app
from tests.conftest import make_settings, running_worker


@pytest.mark.cluster
async def test_retries_until_success(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("flaky", [2])
        assert await c.result(h.id, timeout=15) == 3
        info = await c.get(h.id)
        assert info.attempt == 3 and info.retries == 2 and info.status == TaskStatus.SUCCEEDED
        assert info.error is None


@pytest.mark.cluster
async def test_retries_spent_ends_failed_in_dlq(settings: Settings, r: redis.Redis) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("always_fails")
        with pytest.raises(TaskFailed, match="RuntimeError: always"):
            await c.result(h.id, timeout=15)
        info = await c.get(h.id)
        assert info.status == TaskStatus.FAILED and info.attempt == 3 and info.retries == 3
        q, tid = split_task_id(h.id)
        assert r.zscore(Keys(settings.key_prefix).queue(q).dlq, tid) is not None


async def test_fail_ends_without_retry(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("fail_now")
        with pytest.raises(TaskFailed, match="permanent problem"):
            await c.result(h.id, timeout=10)
        assert (await c.get(h.id)).attempt == 1


async def test_retry_with_delay(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        t0 = time.monotonic()
        h = await c.enqueue("retry_later", [0.6])
        assert await c.result(h.id, timeout=15) == 2
        assert time.monotonic() - t0 >= 0.6


async def test_async_timeout_cancels_and_fails(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        t0 = time.monotonic()
        h = await c.enqueue("slow")
        with pytest.raises(TaskFailed, match=r"timed out after 0\.3s"):
            await c.result(h.id, timeout=10)
        assert time.monotonic() - t0 < 9  # cancelled, not waited out


async def test_unstorable_result_fails_without_retry(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("bad_result")
        with pytest.raises(TaskFailed, match="unstorable result"):
            await c.result(h.id, timeout=10)
        assert (await c.get(h.id)).attempt == 1


async def test_oversized_result_fails(redis_server: object, prefix: str) -> None:
    s = make_settings(redis_server.url, prefix, max_result_bytes=10)  # type: ignore[attr-defined]
    async with running_worker(app, s), AsyncClient(settings=s, app=app) as c:
        h = await c.enqueue("record", ["x" * 50])
        with pytest.raises(TaskFailed, match="DTQ_MAX_RESULT_BYTES"):
            await c.result(h.id, timeout=10)


async def test_unknown_task_fails_clearly(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        h = await c.enqueue("no.such.task")
        with pytest.raises(TaskFailed, match=r"unknown task 'no\.such\.task'"):
            await c.result(h.id, timeout=10)


async def test_delay_and_eta(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        t0 = time.time()
        h = await c.enqueue("add", [1, 1], delay=0.5)
        assert (await c.get(h.id)).status == TaskStatus.SCHEDULED
        assert await c.result(h.id, timeout=10) == 2
        started = (await c.get(h.id)).started_at
        assert started is not None and started.timestamp() >= t0 + 0.45


async def test_priority_order_with_concurrency_one(redis_server: object, prefix: str) -> None:
    s = make_settings(redis_server.url, prefix, worker_concurrency=1)  # type: ignore[attr-defined]
    async with AsyncClient(settings=s, app=app) as c:
        items = [
            {"name": "record", "args": [f"p{p}-{i}"], "priority": p}
            for i in range(3)
            for p in (0, 5, 9)
        ]
        handles = await c.enqueue_many(items)
        async with running_worker(app, s):
            for h in handles:
                await c.result(h.id, timeout=15)
        starts = c.redis.lrange(f"{prefix}:test:starts", 0, -1)
        tags = [x.split("|")[3] for x in await starts]
        assert [t.split("-")[0] for t in tags] == ["p9"] * 3 + ["p5"] * 3 + ["p0"] * 3
        # FIFO inside a band.
        assert tags[:3] == ["p9-0", "p9-1", "p9-2"]


async def test_current_task_is_made_once_per_run(settings: Settings) -> None:
    """The worker makes the context on first use; a child task and the task share it."""
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("child_context")
        assert await c.result(h.id, timeout=15) == [True, 1, h.id]
        info = await c.get(h.id)
        assert info.progress is not None and info.progress["message"] == "from the task"


async def test_outcome_writes_claim_the_next_runs(redis_server: object, prefix: str) -> None:
    """Under steady load the slots a batch frees are refilled by its own write (complete.lua
    claims), not by separate claims of the poll loop; every task still runs exactly once."""
    s = make_settings(redis_server.url, prefix, worker_concurrency=8)  # type: ignore[attr-defined]
    async with AsyncClient(settings=s, app=app) as c:
        hs = await c.enqueue_many([{"name": "add", "args": [i, 1]} for i in range(400)])
        async with running_worker(app, s) as w:
            for i, h in enumerate(hs):
                assert await c.result(h.id, timeout=30) == i + 1
            polls = w.metrics.registry.get_sample_value("dtq_claim_seconds_count")
        # The first claim, then a few when the queue ran dry: not one per batch (400 / 8 = 50).
        assert polls is not None and polls <= 10, polls
        starts = [(await c.get(h.id)).attempt for h in hs]
        assert starts == [1] * 400


async def test_concurrency_bounds_inflight(redis_server: object, prefix: str) -> None:
    s = make_settings(redis_server.url, prefix, worker_concurrency=3)  # type: ignore[attr-defined]
    SLEEPING["peak"] = 0
    async with running_worker(app, s), AsyncClient(settings=s, app=app) as c:
        # Short bodies, many of them: slots are refilled by the outcome writes' claims while
        # other bodies run, the case that could overshoot.
        hs = await c.enqueue_many([{"name": "sleep", "args": [0.02]} for _ in range(60)])
        for h in hs:
            assert await c.result(h.id, timeout=15) == 0.02
    assert SLEEPING["peak"] == 3  # bodies seen running at once, counted by the bodies


@pytest.mark.cluster
async def test_graceful_stop_finishes_running_tasks(settings: Settings) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        async with running_worker(app, settings):
            h = await c.enqueue("sleep", [0.5])
            for _ in range(200):
                if (await c.get(h.id)).status == TaskStatus.RUNNING:
                    break
                await asyncio.sleep(0.01)
        # running_worker stops the worker on exit: the drain let the task finish.
        info = await c.get(h.id)
        assert info.status == TaskStatus.SUCCEEDED and info.attempt == 1


async def test_drain_waits_for_a_claim_in_flight_when_the_stop_came(settings: Settings) -> None:
    """The stop arrives between a claim's work in Redis and its reply: the run it started must
    still run inside the drain (it was neither handed back nor left "running"). The claim of an
    idle worker rides behind its XREAD (Consumer.claim_once); a busy one's goes alone."""
    from dtq import scripts as sc

    gate = asyncio.Event()
    hooked_wait = asyncio.Event()

    def took_runs(claim_reply: Any) -> bool:  # a claim.lua reply that started runs
        return isinstance(claim_reply, list) and bool(sc.parse_claim("default", claim_reply).runs)

    async with AsyncClient(settings=settings, app=app) as c:
        async with running_worker(app, settings) as w:
            real = w.scripts.run

            async def slow_claim_reply(call: sc.Call, pipe: object = None) -> object:
                reply = await real(call, pipe)  # type: ignore[arg-type]
                if call.script == "claim" and took_runs(reply):
                    await gate.wait()
                return reply

            w.scripts.run = slow_claim_reply  # type: ignore[method-assign]
            lane = w.consumer._wake
            real_pair = lane.call_pair

            async def slow_pair_reply(first: Any, then: Any, timeout: float) -> tuple[Any, Any]:
                hooked_wait.set()
                replies = await real_pair(first, then, timeout)
                if took_runs(replies[1]):
                    await gate.wait()
                return replies

            lane.call_pair = slow_pair_reply  # type: ignore[method-assign]
            # An idle wait sent before the hooks would take the task unhooked: enqueue once
            # the one in flight is hooked (the one before ends within its 1 s block).
            await asyncio.wait_for(hooked_wait.wait(), 5)
            h = await c.enqueue("sleep", [0.1])
            for _ in range(300):
                if (await c.get(h.id)).status == TaskStatus.RUNNING:
                    break
                await asyncio.sleep(0.01)
            assert (await c.get(h.id)).status == TaskStatus.RUNNING
            assert not w.slots.inflight and w.slots.claiming  # started in Redis, reply unread
            # running_worker stops the worker on exit; the reply comes once the drain began.
            asyncio.get_running_loop().call_later(0.3, gate.set)
        info = await c.get(h.id)
        assert info.status == TaskStatus.SUCCEEDED and info.attempt == 1


@pytest.mark.cluster
async def test_events_are_recorded(settings: Settings, r: redis.Redis) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("flaky", [1])
        await c.result(h.id, timeout=10)
    q, tid = split_task_id(h.id)
    events = r.xrange(Keys(settings.key_prefix).queue(q).events)
    types = [f["type"] for _, f in events if f["tid"] == tid]
    assert types == ["enqueued", "started", "retried", "promoted", "started", "succeeded"]
    wev = [f["type"] for _, f in r.xrange(Keys(settings.key_prefix).worker_events)]
    assert "worker_started" in wev and "worker_stopped" in wev
