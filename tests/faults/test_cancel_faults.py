"""An acknowledged cancel is never lost: every path that moves a running task on (reclaim of a
lost run, retry after an exception, shutdown hand-back, a claim whose reply was in flight when
the cancel came) ends the task "cancelled" when its cancel was requested: the record says so,
the done channel announces it, the event stream has a "cancelled" event, no retry is spent and
the task is not in the dead-letter queue. A new life of the task (a requeue from the DLQ) starts
without the old flag."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, TaskFailed
from dtq import scripts as sc
from dtq.scripts import dlq_requeue_call
from dtq.store.keys import GROUP, Keys, QueueKeys, new_tid
from tests.apps.faulty import read_journal
from tests.conftest import create_groups, make_settings, wait_until
from tests.redis_server import RedisServer

Q = "default"


def start(run: Any, r: redis.Redis, qk: QueueKeys, max_retries: int = 3) -> sc.Claimed:
    """One task enqueued and claimed by worker w1: running attempt 1."""
    create_groups(r, qk)
    t = sc.NewTask(
        tid=new_tid(), name="t", args="[]", kwargs="", priority=5, max_retries=max_retries,
        timeout=None, delay_ms=0, expires_ms=0, idempotency_key="", meta="",
    )  # fmt: skip
    run(sc.enqueue_call(qk, [t], 100))
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 1, 100, 60)))
    assert [c.tid for c in batch.runs] == [t.tid]
    return batch.runs[0]


def request_cancel(run: Any, qk: QueueKeys, tid: str, reason: str = "stop it") -> None:
    res = sc.parse_cancel(run(sc.cancel_call(qk, tid, events_maxlen=100, ttl_s=60,
                                             hint_channel="hints", reason=reason)))  # fmt: skip
    assert res == sc.CancelResult("requested", "running")


class DoneListener:
    """Subscribed to a task's done channel before the transition under test."""

    def __init__(self, r: redis.Redis, qk: QueueKeys, tid: str) -> None:
        self.ps = r.pubsub(ignore_subscribe_messages=True)
        self.ps.subscribe(qk.done_channel(tid))
        assert self.ps.get_message(timeout=1) is None  # the subscribe confirmation

    def announced(self) -> list[str]:
        out = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msg = self.ps.get_message(timeout=0.2)
            if msg is None and out:
                break
            if msg is not None:
                out.append(msg["data"])
        self.ps.close()
        return out


def assert_ended_cancelled(r: redis.Redis, qk: QueueKeys, tid: str, reason: str) -> None:
    rec = r.hgetall(qk.task(tid))
    assert rec["status"] == "cancelled", rec
    assert rec["error"] == reason and rec.get("retries", "0") == "0" and "finished" in rec
    assert r.zscore(qk.dlq, tid) is None and r.zscore(qk.sched, tid) is None
    assert r.ttl(qk.task(tid)) > 0
    # No entry of the task is left waiting or pending in any band.
    for stream in qk.streams:
        assert [f["t"] for _, f in r.xrange(stream)] == []
        assert r.xpending(stream, GROUP)["pending"] == 0
    types = [f["type"] for _, f in r.xrange(qk.events) if f["tid"] == tid]
    assert types[-1] == "cancelled" and "retried" not in types and "failed" not in types


# --- each Lua path, called directly --------------------------------------------------------


def test_reclaim_of_a_lost_run_ends_it_cancelled_when_its_cancel_was_requested(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c = start(run, r, qk)
    request_cancel(run, qk, c.tid)
    done = DoneListener(r, qk, c.tid)
    time.sleep(0.02)
    res = sc.parse_reclaim(run(sc.reclaim_call(qk, "w2", min_idle_ms=10, count=10,
                                               events_maxlen=100, ttl_s=60)))  # fmt: skip
    assert (res.requeued, res.failed, res.cancelled) == (0, 0, 1)
    assert done.announced() == ["cancelled"]
    assert_ended_cancelled(r, qk, c.tid, "stop it")
    # The frozen worker's touch learns its claim is gone; its late outcome is stale.
    ref = sc.RunRef(c.tid, c.eid, c.attempt)
    assert sc.parse_touch(run(sc.touch_call(qk, "w1", [ref]))).lost == [c.tid]
    ok = sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [ok], 100, 60))) == [False]
    assert r.hget(qk.task(c.tid), "status") == "cancelled"


@pytest.mark.parametrize(
    ("max_retries", "delay_ms"),
    [(3, 0), (0, 0), (3, None)],
    ids=["retries-left", "retries-spent", "no-retry-allowed"],
)
def test_a_run_that_fails_after_its_cancel_was_requested_ends_cancelled(
    r: redis.Redis, run: Any, qk: QueueKeys, max_retries: int, delay_ms: int | None
) -> None:
    c = start(run, r, qk, max_retries=max_retries)
    request_cancel(run, qk, c.tid)
    done = DoneListener(r, qk, c.tid)
    f = sc.Failure(c.tid, c.eid, c.attempt, "ValueError: boom", delay_ms)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["cancelled"]
    assert done.announced() == ["cancelled"]
    assert_ended_cancelled(r, qk, c.tid, "stop it")
    # The body's own failure is kept in the event that ends it.
    ev = [f for _, f in r.xrange(qk.events) if f["tid"] == c.tid][-1]
    assert ev["detail"] == "ValueError: boom"


@pytest.mark.parametrize("started", [True, False], ids=["interrupted", "not-started"])
def test_a_handed_back_run_ends_cancelled_when_its_cancel_was_requested(
    r: redis.Redis, run: Any, qk: QueueKeys, started: bool
) -> None:
    c = start(run, r, qk)
    request_cancel(run, qk, c.tid)
    done = DoneListener(r, qk, c.tid)
    call = sc.requeue_call(qk, "w1", [sc.RunRef(c.tid, c.eid, c.attempt)], events_maxlen=100,
                           ttl_s=60, max_interruptions=3, retry_delay_ms=0,
                           started=started)  # fmt: skip
    assert sc.parse_verdicts(run(call)) == ["cancelled"]
    assert done.announced() == ["cancelled"]
    assert_ended_cancelled(r, qk, c.tid, "stop it")
    assert r.hget(qk.task(c.tid), "intr") in (None, "0")


def test_a_run_its_worker_ends_cancelled_keeps_the_cancellers_reason(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c = start(run, r, qk)
    request_cancel(run, qk, c.tid, reason="user pressed stop")
    done = DoneListener(r, qk, c.tid)
    out = sc.Success(c.tid, c.eid, c.attempt, "cancelled", "cancelled by request")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [out], 100, 60))) == [True]
    assert done.announced() == ["cancelled"]
    assert_ended_cancelled(r, qk, c.tid, "user pressed stop")
    # Without a cancel flag (the worker's own cancel, e.g. a timeout path), its reason stays.
    c2 = start(run, r, qk)
    out2 = sc.Success(c2.tid, c2.eid, c2.attempt, "cancelled", "cancelled by request")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [out2], 100, 60))) == [True]
    assert_ended_cancelled(r, qk, c2.tid, "cancelled by request")


def test_a_task_requeued_from_the_dlq_starts_without_its_old_cancel_flag(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c = start(run, r, qk)
    request_cancel(run, qk, c.tid)
    done = sc.Success(c.tid, c.eid, c.attempt, "cancelled", "cancelled by request")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [done], 100, 60))) == [True]
    assert r.hget(qk.task(c.tid), "cancel") == "stop it"
    out = run(dlq_requeue_call(qk, [c.tid], events_maxlen=100, allowed=("cancelled",)))
    assert out == ["requeued"]
    assert r.hget(qk.task(c.tid), "cancel") is None
    again = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 1, 100, 60))).runs[0]
    ref = sc.RunRef(again.tid, again.eid, again.attempt)
    assert sc.parse_touch(run(sc.touch_call(qk, "w1", [ref]))) == sc.TouchResult([], [])
    # Its new life fails and retries as any task does: the old request does not end it.
    f = sc.Failure(again.tid, again.eid, again.attempt, "ValueError: boom", 0)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["scheduled"]


# --- with real worker processes -------------------------------------------------------------

APP = "tests.apps.faulty:app"


@pytest.fixture
def jpath(tmp_path: Path) -> str:
    return str(tmp_path / "journal.jsonl")


def journal(j: str, ev: str) -> list[tuple[int, str]]:
    return [(e["attempt"], e["worker"]) for e in read_journal(j) if e["ev"] == ev]


@pytest.mark.slow
def test_cancel_survives_reclaim_of_a_frozen_worker(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    """cancel() said True while the task's worker was frozen (SIGSTOP: the pub/sub hint and
    the durable flag both unseen); another worker's reaper reclaims the lost run: the task
    ends cancelled, never runs again, spends no retry."""
    settings = make_settings(
        redis_server.url, prefix, heartbeat_interval_s=0.5, visibility_timeout_s=2.0
    )
    r = redis_server.client()
    qk = Keys(prefix).queue(Q)
    a = spawn_worker(APP, settings, "--worker-id", "A", "--concurrency", "1")
    with Client(settings=settings) as c:
        h = c.enqueue("slow_then_quick", kwargs={"seconds": 30, "journal_path": jpath})
        wait_until(lambda: journal(jpath, "start") == [(1, "A")], 30)
        a.signal(signal.SIGSTOP)
        try:
            assert c.cancel(h.id, reason="user pressed stop") is True
            b = spawn_worker(APP, settings, "--worker-id", "B", "--concurrency", "1")
            terminal = ("succeeded", "failed", "cancelled")
            wait_until(lambda: c.get(h.id).status in terminal, 40)
            info = c.get(h.id)
            assert (info.status, info.error, info.retries) == ("cancelled", "user pressed stop", 0)
            with pytest.raises(TaskFailed) as exc:
                c.result(h.id, timeout=5)
            assert exc.value.status == "cancelled"
            assert r.zscore(qk.dlq, h.id.split(":")[1]) is None
            time.sleep(1.0)  # B had time to claim a requeued task: it must not have one
            assert journal(jpath, "start") == [(1, "A")]
        finally:
            a.signal(signal.SIGCONT)
        # A resumes: its touch finds the run reclaimed and cancels its body; nothing is written.
        wait_until(lambda: journal(jpath, "cancelled") == [(1, "A")], 20)
        time.sleep(0.5)
        assert c.get(h.id).status == "cancelled"
    assert journal(jpath, "finish") == []
    for w in (a, b):
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0


async def test_a_cancel_heard_while_the_claims_reply_is_in_flight_stops_the_run_at_launch(
    redis_server: RedisServer, prefix: str, jpath: str
) -> None:
    """The claim ran in Redis, then cancel() flagged the run and its pub/sub hint reached the
    worker before the claim's reply did (the hint found no run to stop). When the reply comes,
    the run is stopped at launch: its body never starts and the task ends cancelled (before,
    a quick body ran and ended succeeded before any heartbeat read the flag)."""
    from dtq_worker.worker import Worker
    from tests.apps.faulty import app

    settings = make_settings(redis_server.url, prefix)
    app.configure(settings)
    r = redis_server.client()
    w = Worker(app, settings)
    heard = asyncio.Event()
    hear = w.runs.cancel

    def spy(queue: str | None, tid: str) -> None:
        hear(queue, tid)
        heard.set()

    w.runs.cancel = spy  # type: ignore[method-assign]
    await w.prepare()
    listener = asyncio.create_task(w._cancel_listener())
    try:
        channel = Keys(prefix).cancel_channel
        await asyncio.to_thread(wait_until, lambda: r.pubsub_numsub(channel)[0][1] == 1, 10)
        async with AsyncClient(settings=settings) as c:
            h = await c.enqueue("quick", args=[7], kwargs={"journal_path": jpath})
            sent = time.monotonic()
            raw = await w.scripts.run(w.consumer._claim_call(Q, 1))  # its reply, held back
            batch = sc.parse_claim(Q, raw)
            assert [x.tid for x in batch.runs] == [h.id.split(":")[1]]
            assert await c.cancel(h.id, reason="changed my mind") is True
            await asyncio.wait_for(heard.wait(), 10)
            w.runs.take(Q, batch, sent)  # the reply arrives: the run is launched
            run = w.slots.inflight[(Q, batch.runs[0].tid)]
            assert run.task is not None
            await asyncio.wait_for(run.task, 10)
            info = await c.get(h.id)
        assert (info.status, info.error, info.retries) == ("cancelled", "changed my mind", 0)
        assert journal(jpath, "start") == []  # the body never began
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await w._close()


async def test_a_cancel_hint_from_before_a_claim_was_sent_does_not_stop_its_run(
    redis_server: RedisServer, prefix: str, jpath: str
) -> None:
    """A remembered hint applies only to a claim sent before it came: a hint heard for an
    earlier life of the task (cancelled, then requeued from the DLQ) must not cancel the new
    one."""
    from dtq_worker.worker import Worker
    from tests.apps.faulty import app

    settings = make_settings(redis_server.url, prefix)
    app.configure(settings)
    w = Worker(app, settings)
    await w.prepare()
    try:
        async with AsyncClient(settings=settings) as c:
            h = await c.enqueue("quick", args=[7], kwargs={"journal_path": jpath})
            w.runs.cancel(None, h.id.split(":")[1])  # a hint for a task held nowhere here
            await asyncio.sleep(0.01)
            sent = time.monotonic()
            batch = sc.parse_claim(Q, await w.scripts.run(w.consumer._claim_call(Q, 1)))
            w.runs.take(Q, batch, sent)
            run = w.slots.inflight[(Q, batch.runs[0].tid)]
            assert run.task is not None
            await asyncio.wait_for(run.task, 10)
            assert (await c.get(h.id)).status == "succeeded"
        assert journal(jpath, "start") == [(1, settings.worker_id)]
    finally:
        await w._close()


async def test_remembered_cancel_hints_are_bounded_in_number_and_age(
    redis_server: RedisServer, prefix: str
) -> None:
    """Every worker hears every hint (most are for runs elsewhere): the ones it keeps are
    capped in number and dropped once older than the visibility timeout."""
    from dtq_worker.slots import CANCEL_HINTS_MAX
    from dtq_worker.worker import Worker
    from tests.apps.faulty import app

    settings = make_settings(
        redis_server.url, prefix, visibility_timeout_s=0.5, heartbeat_interval_s=0.1
    )
    w = Worker(app, settings)
    try:
        for i in range(CANCEL_HINTS_MAX + 500):
            w.runs.cancel(None, f"t{i}")
        assert len(w.slots.cancel_hints) == CANCEL_HINTS_MAX
        assert (
            "t0" not in w.slots.cancel_hints
            and f"t{CANCEL_HINTS_MAX + 499}" in w.slots.cancel_hints
        )
        await asyncio.sleep(0.6)
        w.runs.cancel(None, "fresh")
        assert list(w.slots.cancel_hints) == ["fresh"]
    finally:
        await w._close()
