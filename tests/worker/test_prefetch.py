"""DTQ_WORKER_PREFETCH: runs claimed ahead of free slots.

A run claimed ahead is started in Redis (status running, attempt counted, leased by the
heartbeat) but its body waits in the worker until a body ends. These tests check that the
bodies never exceed the concurrency, that such runs really wait (and so exist), and what becomes
of one that is stopped before its body began: a shutdown hands it back with no interruption
counted, a cancel ends it without its body, a lost claim drops it, and a lease that may have
lapsed (a frozen worker) keeps it from starting until a heartbeat renews it.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, Settings, TaskStatus
from dtq.store.keys import Keys, split_task_id
from tests.apps.basic import SLEEPING, app
from tests.conftest import body_starts as starts
from tests.conftest import make_settings, running_worker, wait_until

APP = "tests.apps.basic:app"


async def wait_status(c: AsyncClient, ids: list[str], status: TaskStatus, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all([(await c.get(i)).status == status for i in ids]):
        assert time.monotonic() < deadline, f"not all {status.value} in time"
        await asyncio.sleep(0.01)


def settings_with(s: Settings, **kw: Any) -> Settings:
    return make_settings(s.redis_url, s.key_prefix, **kw)


async def test_bodies_never_exceed_the_concurrency_while_runs_wait(settings: Settings) -> None:
    s = settings_with(settings, worker_concurrency=3, worker_prefetch=3)
    SLEEPING["peak"] = 0
    waited = 0
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        hs = await c.enqueue_many([{"name": "sleep", "args": [0.02]} for _ in range(90)])
        pending = {h.id for h in hs}
        while pending:
            waited = max(waited, len(w.slots.ready))
            assert w.slots.active <= 6 and w.slots.active - len(w.slots.ready) <= 3  # held; bodies
            for i in list(pending)[:10]:
                if (await c.get(i)).status == TaskStatus.SUCCEEDED:
                    pending.discard(i)
            await asyncio.sleep(0.005)
        assert [(await c.get(h.id)).attempt for h in hs] == [1] * 90
    assert SLEEPING["peak"] == 3  # counted by the bodies themselves
    assert waited > 0  # runs were really claimed ahead


async def test_stop_hands_back_runs_claimed_ahead_without_an_interruption(
    settings: Settings, r: redis.Redis
) -> None:
    s = settings_with(settings, worker_concurrency=1, worker_prefetch=2, drain_timeout_s=10)
    async with AsyncClient(settings=s, app=app) as c:
        async with running_worker(app, s) as w:
            hs = [await c.enqueue("sleep", [0.6]) for _ in range(3)]
            ids = [h.id for h in hs]
            await wait_status(c, ids, TaskStatus.RUNNING, 10)
            assert len(w.slots.ready) == 2
        infos = [await c.get(i) for i in ids]
        # The body that ran was drained; the two that waited went back to the queue.
        assert sorted(i.status.value for i in infos) == ["queued", "queued", "succeeded"]
        assert [i.interruptions for i in infos] == [0, 0, 0]
        assert len(starts(r, s.key_prefix)) == 1
        q, _ = split_task_id(ids[0])
        events = r.xrange(Keys(s.key_prefix).queue(q).events)
        assert [f["detail"] for _, f in events if f["type"] == "requeued"] == ["not started"] * 2
        # Another worker runs them: a new attempt (the one claimed ahead counted as started).
        async with running_worker(app, s):
            for i in ids:
                assert await c.result(i, timeout=15) == 0.6
        attempts = sorted([(await c.get(i)).attempt for i in ids])
        assert attempts == [1, 2, 2]
        assert len(starts(r, s.key_prefix)) == 3  # each body ran once


async def one_running_one_waiting(w: Any, c: AsyncClient, body_s: float) -> tuple[Any, Any]:
    """On a worker of one slot and one run claimed ahead: a body of ``body_s`` seconds running,
    and a second task claimed behind it, waiting. Returns both handles."""
    first = await c.enqueue("sleep", [body_s])
    second = await c.enqueue("sleep", [0.0])
    await wait_status(c, [first.id, second.id], TaskStatus.RUNNING, 10)
    assert [run.task_id for run in w.slots.ready] == [second.id]
    return first, second


async def test_cancel_of_a_waiting_run_ends_it_without_its_body(
    settings: Settings, r: redis.Redis
) -> None:
    s = settings_with(settings, worker_concurrency=1, worker_prefetch=1)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        first, second = await one_running_one_waiting(w, c, 1.5)
        t0 = time.monotonic()
        assert await c.cancel(second.id)
        await wait_status(c, [second.id], TaskStatus.CANCELLED, 5)
        assert time.monotonic() - t0 < 1.0  # it did not wait for the running body's slot
        assert (await c.get(first.id)).status == TaskStatus.RUNNING
        assert await c.result(first.id, timeout=10) == 1.5
    assert [t for t, _, _ in starts(r, s.key_prefix)] == [first.id]


async def test_a_lost_claim_of_a_waiting_run_is_dropped_then_reclaimed(
    settings: Settings, r: redis.Redis
) -> None:
    s = settings_with(settings, worker_concurrency=1, worker_prefetch=1)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        first, second = await one_running_one_waiting(w, c, 0.8)
        [waiting] = list(w.slots.ready)
        w.runs.lose(waiting, "test")  # as when a touch reports the entry reclaimed
        assert not w.slots.ready and waiting.key not in w.slots.inflight
        assert w.slots.active == 1  # only the running body holds a slot
        # Nobody touches its entry now: the reaper reclaims it after the visibility timeout.
        assert await c.result(second.id, timeout=20) == 0.0
        assert await c.result(first.id, timeout=10) == 0.8
        assert (await c.get(second.id)).attempt == 2
    mine = [a for t, a, _ in starts(r, s.key_prefix) if t == second.id]
    assert mine == [2]  # attempt 1 never ran its body


async def test_a_run_whose_lease_may_have_lapsed_waits_for_a_heartbeat(settings: Settings) -> None:
    """As after a freeze longer than the visibility timeout: a claimed run is not started
    until a heartbeat has renewed its lease (or reported it lost)."""
    s = settings_with(settings, worker_concurrency=2, heartbeat_interval_s=0.5)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        beat = w.heartbeat.beat
        beats: list[float] = []

        async def counted(status: str | None = None) -> bool:
            ok = await beat(status)
            beats.append(time.monotonic())
            return ok

        w.heartbeat.beat = counted  # type: ignore[method-assign]
        real_launch = w.runs.launch

        def launch_as_if_frozen(claimed: Any, sent: float | None = None) -> None:
            # The claim was sent before a long freeze (the worker just resumed).
            real_launch(claimed, time.monotonic() - 10 * s.visibility_timeout_s)

        w.runs.launch = launch_as_if_frozen  # type: ignore[method-assign]
        h = await c.enqueue("sleep", [0.0])
        for _ in range(300):
            if w.slots.ready:
                break
            await asyncio.sleep(0.01)
        assert [run.task_id for run in w.slots.ready] == [h.id]
        n = len(beats)
        assert await c.result(h.id, timeout=10) == 0.0
        assert len(beats) > n  # started only once a heartbeat had renewed it
        assert (await c.get(h.id)).attempt == 1


@pytest.mark.slow
def test_workers_with_prefetch_under_sigkill_and_sigstop_start_each_attempt_once(
    redis_server: Any, prefix: str, spawn_worker: Any, r: redis.Redis
) -> None:
    s = make_settings(redis_server.url, prefix, worker_concurrency=4)
    env = {"DTQ_WORKER_CONCURRENCY": "4", "DTQ_WORKER_PREFETCH": "4"}
    n = 400
    with Client(settings=s) as c:
        ids = [h.id for h in c.enqueue_many([{"name": "sleep", "args": [0.05]}] * n)]
        ws = [spawn_worker(APP, s, "--worker-id", f"w{i}", **env) for i in range(4)]
        # Once every worker holds runs (bodies and runs claimed ahead): kill one, freeze one
        # for longer than the visibility timeout, so their waiting runs are reclaimed.
        wait_until(lambda: len({w for _, _, w in starts(r, prefix)}) == 4, timeout=60)
        ws[0].kill()
        ws[1].signal(signal.SIGSTOP)
        time.sleep(s.visibility_timeout_s * 2.5)
        ws[1].signal(signal.SIGCONT)

        def done() -> bool:
            with c.redis.pipeline(transaction=False) as p:
                for i in ids:
                    q, tid = i.split(":")
                    p.hget(c.keys.queue(q).task(tid), "status")
                return all(st == "succeeded" for st in p.execute())

        wait_until(done, timeout=240, interval=0.2)
        seen = starts(r, prefix)
        twice = [p for p, k in collections.Counter((t, a) for t, a, _ in seen).items() if k > 1]
        assert not twice, f"an attempt started twice: {twice}"
        assert {t for t, _, _ in seen} == set(ids)
        infos = [c.get(i) for i in ids]
        assert max(i.attempt for i in infos) >= 2  # the faults really took runs away
        for w in ws[1:]:
            w.signal(signal.SIGTERM)
        assert [w.wait(60) for w in ws[1:]] == [0, 0, 0]
