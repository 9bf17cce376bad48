"""Slot accounting of a worker with runs claimed ahead (DTQ_WORKER_PREFETCH) when runs stop
early: every slot a stopped run held comes back, so a worker never wedges with its slots
counted busy and no body running (found by the chaos soak: a worker resumed after a SIGSTOP,
lost the claims it had taken just before, and never started a body again).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Settings, TaskStatus
from dtq.store.keys import Keys, split_task_id
from dtq_worker.heartbeat import Heartbeat
from tests.apps.basic import app
from tests.conftest import body_starts as starts
from tests.conftest import make_settings, running_worker


def settings_with(s: Settings, **kw: Any) -> Settings:
    return make_settings(s.redis_url, s.key_prefix, **kw)


async def poll(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def assert_no_slot_held(w: Any) -> None:
    """Nothing in flight: no slot may be counted (the invariant the wedge broke)."""
    assert not w.slots.inflight and not w.slots.ready
    assert w.slots.active == 0 and sum(w.slots.active_per_queue.values()) == 0


async def test_runs_claimed_ahead_that_a_touch_reports_lost_free_their_slots_and_never_start(
    settings: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker resumes from a freeze holding runs whose claim was sent before it (so they wait
    for a heartbeat), and that heartbeat's touch reports them all reclaimed. Dropping the first
    one frees a slot: the others must not be started on the strength of that same heartbeat,
    and every slot must come back."""
    s = settings_with(settings, worker_concurrency=2, worker_prefetch=2)
    real_beat = Heartbeat.beat
    beats_open = asyncio.Event()

    async def gated_beat(self: Heartbeat, status: str | None = None) -> bool:
        await beats_open.wait()  # the test sends the beat that matters itself
        return await real_beat(self, status)

    monkeypatch.setattr(Heartbeat, "beat", gated_beat)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        try:
            real_launch = w.runs.launch

            def launch_as_if_frozen(claimed: Any, sent: float | None = None) -> None:
                real_launch(claimed, time.monotonic() - 10 * s.visibility_timeout_s)

            w.runs.launch = launch_as_if_frozen
            hs = [await c.enqueue("sleep", [0.0]) for _ in range(4)]
            await poll(lambda: len(w.slots.ready) == 4)
            runs = list(w.slots.ready)
            assert sorted(run.task_id for run in runs) == sorted(h.id for h in hs)
            for run in runs:  # reclaimed by another worker while this one was frozen
                r.hset(Keys(s.key_prefix).queue(run.claimed.queue).task(run.claimed.tid),
                       "worker", "another")  # fmt: skip
            assert await real_beat(w.heartbeat)
            await poll(lambda: all(run.task is None or run.task.done() for run in runs))
            for _ in range(3):
                await asyncio.sleep(0)
            assert [run.task for run in runs] == [None] * 4  # none was started
            assert_no_slot_held(w)
            w.runs.launch = real_launch
            beats_open.set()
            h = await c.enqueue("sleep", [0.0])
            assert await c.result(h.id, timeout=10) == 0.0  # not wedged
        finally:
            beats_open.set()  # the worker's farewell beats too
    assert [t for t, _, _ in starts(r, s.key_prefix)] == [h.id]


async def test_a_run_cancelled_before_its_task_first_ran_writes_cancelled_and_frees_its_slot(
    settings: Settings, r: redis.Redis
) -> None:
    """A cancel hint handled between a run's launch and the first step of its task (the
    listener's message was ready in the same loop turn as the claim's reply): cancelling a task
    that never ran skips its coroutine, cleanup included, so the run must be ended otherwise."""
    s = settings_with(settings, worker_concurrency=1, worker_prefetch=0)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        real_launch = w.runs.launch
        cancelled: list[Any] = []

        def launch_then_cancel(claimed: Any, sent: float | None = None) -> None:
            real_launch(claimed, sent)
            if not cancelled:
                cancelled.append(w.slots.inflight[(claimed.queue, claimed.tid)])
                w.runs.cancel(claimed.queue, claimed.tid)

        w.runs.launch = launch_then_cancel
        first = await c.enqueue("sleep", [5.0])
        await poll(lambda: bool(cancelled))
        deadline = time.monotonic() + 10
        while (await c.get(first.id)).status != TaskStatus.CANCELLED:
            assert time.monotonic() < deadline, "the cancelled run wrote no outcome"
            await asyncio.sleep(0.01)
        await poll(lambda: not w.slots.inflight)
        assert_no_slot_held(w)
        second = await c.enqueue("sleep", [0.0])
        assert await c.result(second.id, timeout=10) == 0.0  # its slot came back
    assert [t for t, _, _ in starts(r, s.key_prefix)] == [second.id]
    assert split_task_id(first.id)[0] == cancelled[0].claimed.queue
