"""An idle worker's pickup: the claim rides behind the blocked XREAD on the same connection, so
Redis starts the run the moment the entry lands (no round trip through the worker between the
wake-up and the claim); a stop unblocks that XREAD at once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from dtq import AsyncClient, Client, Settings, TaskStatus
from dtq import scripts as sc
from dtq_worker import consumer
from tests.apps.basic import app
from tests.conftest import make_settings, running_worker


async def idle(w: Any) -> None:
    for _ in range(500):
        if w.env.idle:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the worker never went idle")


async def test_an_idle_worker_starts_a_new_task_with_the_claim_behind_its_wait(
    settings: Settings,
) -> None:
    async with running_worker(app, settings) as w, AsyncClient(settings=settings, app=app) as c:
        await idle(w)
        claims_alone: list[sc.Call] = []
        pairs: list[tuple[Any, Any]] = []
        real_run, lane = w.scripts.run, w.consumer._wake
        real_pair = lane.call_pair

        async def run(call: sc.Call, pipe: object = None) -> object:
            if call.script == "claim":
                claims_alone.append(call)
            return await real_run(call, pipe)  # type: ignore[arg-type]

        async def pair(first: Any, then: Any, timeout: float) -> tuple[Any, Any]:
            pairs.append((first[0], then[0]))
            return await real_pair(first, then, timeout)

        w.scripts.run = run  # type: ignore[method-assign]
        lane.call_pair = pair  # type: ignore[method-assign]
        await idle(w)  # waiting again, now through the hooks
        for i in range(5):
            h = await c.enqueue("add", [i, 1])
            assert await c.result(h.id, timeout=10) == i + 1
            assert (await c.get(h.id)).attempt == 1
            await idle(w)
        # Every pickup's claim went in the same write as the XREAD; none needed a claim of its
        # own (the queue held one task at a time, so each pipelined claim drained it).
        assert claims_alone == []
        assert len(pairs) >= 5 and set(pairs) == {("XREAD", "EVALSHA")}


async def test_a_stop_unblocks_the_idle_wait_at_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 10 s block: without CLIENT UNBLOCK the drain would wait for it (its claim holds slots).
    monkeypatch.setattr(consumer, "IDLE_BLOCK_MS", 10_000)
    monkeypatch.setattr(consumer, "IDLE_WAIT_TIMEOUT_S", 12.0)
    async with AsyncClient(settings=settings, app=app) as c:
        async with running_worker(app, settings) as w:
            h = await c.enqueue("add", [1, 1])
            assert await c.result(h.id, timeout=10) == 2
            await idle(w)
            assert w.slots.claiming > 0  # the claim behind the wait holds the free slots
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 5.0  # not the 10 s block
        # A task enqueued now stays queued for the next worker (nothing was left running).
        late = await c.enqueue("add", [2, 2])
        assert (await c.get(late.id)).status == TaskStatus.QUEUED


async def test_a_task_enqueued_as_an_idle_worker_stops_is_run_or_left_queued(
    settings: Settings,
) -> None:
    """The stop and the entry race for the claim behind the wait: either the claim took the
    task (it then runs within the drain) or it stays queued. Never left running."""
    async with AsyncClient(settings=settings, app=app) as c:
        for i in range(12):
            async with running_worker(app, settings) as w:
                await idle(w)
                await asyncio.sleep(0.002 * (i % 4))
                h = await c.enqueue("add", [i, 1])
                w.initiate_shutdown()
            info = await c.get(h.id)
            assert info.status in (TaskStatus.SUCCEEDED, TaskStatus.QUEUED), info
            if info.status == TaskStatus.SUCCEEDED:
                assert info.attempt == 1 and await c.result(h.id) == i + 1
            else:
                assert info.attempt == 0


async def test_a_worker_frozen_past_its_wait_still_starts_what_the_claim_behind_it_took(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker frozen (here: its event loop blocked) while the claim behind its XREAD takes a
    task resumes after the wait's hung-connection deadline: the replies already in its socket
    are still read, so the run starts now, attempt 1, instead of being lost until the
    visibility timeout reclaims it (attempt 2)."""
    # A long block, so the XREAD is surely still waiting when the entry lands; a short
    # deadline, so the freeze below outlasts it.
    monkeypatch.setattr(consumer, "IDLE_BLOCK_MS", 10_000)
    monkeypatch.setattr(consumer, "IDLE_WAIT_TIMEOUT_S", 1.0)
    s = make_settings(settings.redis_url, settings.key_prefix, visibility_timeout_s=60.0)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        await idle(w)
        await asyncio.sleep(0.05)  # the XREAD and the claim behind it are sent
        with Client(settings=s, app=app) as sync:
            h = sync.enqueue("add", [2, 3])
            time.sleep(1.5)  # frozen: nothing of the worker runs
            # The claim ran in Redis meanwhile: the task is the worker's, attempt 1.
            frozen = sync.get(h.id)
        assert frozen.status == TaskStatus.RUNNING and frozen.attempt == 1
        assert await c.result(h.id, timeout=10) == 5
        assert (await c.get(h.id)).attempt == 1
