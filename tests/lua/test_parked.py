"""Tasks parked behind a fleet concurrency limit keep moving: dead parked ids are skipped with
bounded work per call, and purge takes the parked tasks of its queue too (scripts on a real Redis).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from dtq import AsyncClient, TaskFailed
from dtq import scripts as sc
from dtq.admin import Admin
from dtq.scripts import parse_purge, purge_call
from dtq.settings import Settings
from dtq.store.keys import Keys, QueueKeys, new_tid
from tests.apps.limited import app as limited_app
from tests.conftest import create_groups, running_worker
from tests.helpers import until

Q = "q1"
LK = "acct"


def limited(**kw: Any) -> sc.NewTask:
    base: dict[str, Any] = dict(
        tid=new_tid(), name="t", args="[]", kwargs="", priority=5, max_retries=3, timeout=None,
        delay_ms=0, expires_ms=0, idempotency_key="", meta="", limit=f"1|0|0|{LK}",
    )  # fmt: skip
    base.update(kw)
    return sc.NewTask(**base)


def held_key(qk: QueueKeys) -> str:
    return f"{qk.lim_base}{LK}:held"


def setup_parked(r: redis.Redis, run: Any, qk: QueueKeys, n: int) -> tuple[sc.Claimed, list[str]]:
    """One run holding the limit's only place and n tasks parked behind it, in order."""
    create_groups(r, qk)
    tasks = [limited() for _ in range(n + 1)]
    sc.parse_enqueue(run(sc.enqueue_call(qk, tasks, 100)))
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", n + 1, 100, 60)))
    assert len(batch.runs) == 1 and batch.held == n
    assert r.lrange(held_key(qk), 0, -1) == [t.tid for t in tasks[1:]]
    return batch.runs[0], [t.tid for t in tasks[1:]]


def end_run(run: Any, qk: QueueKeys, c: sc.Claimed) -> None:
    done = sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [done], 100, 60))) == [True]


def in_stream(r: redis.Redis, qk: QueueKeys, tid: str) -> bool:
    return any(f["t"] == tid for _, f in r.xrange(qk.stream(5)))


def test_a_cancelled_head_does_not_strand_the_next_parked_task(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c, parked = setup_parked(r, run, qk, 3)
    res = sc.parse_cancel(
        run(
            sc.cancel_call(
                qk, parked[0], events_maxlen=100, ttl_s=60, hint_channel="h", reason="stop"
            )
        )
    )
    assert res.outcome == "cancelled"
    end_run(run, qk, c)
    # The run's end released the next live parked task at once, not the cancelled one.
    assert in_stream(r, qk, parked[1]) and not in_stream(r, qk, parked[0])
    assert r.lrange(held_key(qk), 0, -1) == [parked[2]]
    nxt = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    assert [x.tid for x in nxt.runs] == [parked[1]]


def test_an_expired_head_does_not_strand_the_next_parked_task(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c, parked = setup_parked(r, run, qk, 3)
    # The head's expiry passes while it is parked (status stays queued).
    r.hset(qk.task(parked[0]), "exp", "1")
    end_run(run, qk, c)
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    # The expired one ends expired; the live one behind it starts in the same claim.
    assert batch.expired == 1 and [x.tid for x in batch.runs] == [parked[1]]
    assert r.hget(qk.task(parked[0]), "status") == "expired"
    assert r.lrange(held_key(qk), 0, -1) == [parked[2]]


def test_purge_removes_parked_tasks(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c, parked = setup_parked(r, run, qk, 5)
    total = 0
    while True:
        res = parse_purge(run(purge_call(qk, 2, 100)))
        total += res.queued + res.scheduled
        if not res.more:
            break
    assert total == 5
    for tid in parked:
        assert not r.exists(qk.task(tid)), "a parked task survived the purge"
    assert not r.exists(held_key(qk))
    # The running task is untouched, and its end releases nothing (nothing is left).
    assert r.hget(qk.task(c.tid), "status") == "running"
    end_run(run, qk, c)
    assert r.xlen(qk.stream(5)) == 0


def lpop_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_lpop", {}).get("calls", 0))


def test_many_dead_parked_ids_cost_bounded_work_per_call(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    dead = 50_000
    c, parked = setup_parked(r, run, qk, 1)
    live = parked[0]
    # Dead ids (records purged or expired) ahead of the live parked task.
    r.delete(held_key(qk))
    pipe = r.pipeline(transaction=False)
    for _ in range(dead // 5000):
        pipe.rpush(held_key(qk), *[new_tid() for _ in range(5000)])
    pipe.rpush(held_key(qk), live)
    pipe.execute()
    before = lpop_calls(r)
    end_run(run, qk, c)
    per_call = lpop_calls(r) - before
    assert 0 < per_call <= 1000, f"one run's end popped {per_call} parked ids"
    assert not in_stream(r, qk, live)
    # The rest is not lost: sweeps continue it, each bounded, until the live one is out.
    calls = 0
    while not in_stream(r, qk, live):
        before = lpop_calls(r)
        released, more = run(sc.limit_sweep_call(qk, []))
        assert lpop_calls(r) - before <= 5000
        calls += 1
        assert calls <= dead // 5000 + 2, "the live parked task was not released"
        if not more:
            break
    assert int(released) == 1 and in_stream(r, qk, live)
    assert r.llen(held_key(qk)) == 0
    assert run(sc.limit_sweep_call(qk, [])) == [0, 0]
    nxt = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    assert [x.tid for x in nxt.runs] == [live]


async def test_a_worker_releases_parked_tasks_behind_many_dead_ids(
    settings: Settings, r: redis.Redis
) -> None:
    """End to end: the run's end gives up after its budget, the scheduler's sweep goes on
    (retention, whose SCAN would find the held list too, is kept out of the way)."""
    settings = settings.model_copy(update={"retention_interval_s": 3600})
    qk = Keys(settings.key_prefix).queue("default")
    held = f"{qk.lim_base}d:held"
    async with AsyncClient(settings=settings, app=limited_app) as c:
        hs = [await c.enqueue("tenant_job", kwargs={"tenant": "d", "sleep": 1.0}) for _ in range(4)]
        async with running_worker(limited_app, settings):

            async def parked() -> bool:
                return bool(r.llen(held) == 2)

            await until(parked)
            # 3000 dead ids (records gone) ahead of the two live parked tasks.
            r.lpush(held, *[new_tid() for _ in range(3000)])
            for h in hs:
                assert await c.result(h.id, timeout=30) == "d"
    assert r.llen(held) == 0 and not r.exists(f"{qk.lim_base}~owed")


def cancel(run: Any, qk: QueueKeys, tid: str) -> sc.CancelResult:
    """cancel.lua as the SDK, CLI and API send it (with a nonce: the call's full keys)."""
    call = sc.cancel_call(
        qk, tid, events_maxlen=100, ttl_s=60, hint_channel="h", reason="stop", nonce=sc.new_nonce()
    )
    return sc.parse_cancel(run(call))


@pytest.mark.cluster
def test_a_released_task_cancelled_before_its_claim_passes_its_place_on(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The run's end released B into the stream (the queue paused, say); B is cancelled before
    any claim: C, parked behind it, goes to the stream now, not at the next retention pass."""
    c, (b, c2, d) = setup_parked(r, run, qk, 3)
    end_run(run, qk, c)
    assert in_stream(r, qk, b) and r.lrange(held_key(qk), 0, -1) == [c2, d]
    assert cancel(run, qk, b).outcome == "cancelled"
    assert in_stream(r, qk, c2), "the cancelled released task stranded the next parked one"
    assert r.lrange(held_key(qk), 0, -1) == [d]
    nxt = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    assert [x.tid for x in nxt.runs] == [c2] and nxt.held == 0


def test_a_released_task_expired_at_its_claim_passes_its_place_on(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c, (b, c2, d) = setup_parked(r, run, qk, 3)
    end_run(run, qk, c)
    # B's expiry passes after its release, before any claim reads it.
    r.hset(qk.task(b), "exp", "1")
    nxt = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    assert nxt.expired == 1 and r.hget(qk.task(b), "status") == "expired"
    # The claim that ended B released C and started it in the same call.
    assert [x.tid for x in nxt.runs] == [c2], "the expired released task stranded C"
    assert r.lrange(held_key(qk), 0, -1) == [d]


def test_a_released_task_throttled_then_cancelled_passes_its_place_on(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """Concurrency 1 and a rate of 1 a minute: B, released by A's end, is throttled into the
    schedule by the rate (it still owes the limit's place); cancelled there, C moves on."""
    create_groups(r, qk)
    tasks = [limited(limit=f"1|1|60000|{LK}") for _ in range(3)]
    a, b, c2 = (t.tid for t in tasks)
    sc.parse_enqueue(run(sc.enqueue_call(qk, tasks, 100)))
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 3, 100, 60)))
    assert [x.tid for x in batch.runs] == [a] and batch.held == 2
    end_run(run, qk, batch.runs[0])
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 3, 100, 60)))
    assert batch.runs == [] and r.hget(qk.task(b), "status") == "scheduled"
    assert r.lrange(held_key(qk), 0, -1) == [c2]
    assert cancel(run, qk, b).outcome == "cancelled"
    assert in_stream(r, qk, c2), "the cancelled throttled task stranded C"


def test_the_cancel_of_a_task_owed_no_place_releases_nothing(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """Only a released task hands a place on: cancelling a task that merely waits in the stream
    (never parked) or one still parked leaves the parked order as it is."""
    c, (b, c2) = setup_parked(r, run, qk, 2)
    fresh = limited()
    sc.parse_enqueue(run(sc.enqueue_call(qk, [fresh], 100)))
    assert cancel(run, qk, fresh.tid).outcome == "cancelled"
    assert cancel(run, qk, b).outcome == "cancelled"
    assert r.lrange(held_key(qk), 0, -1) == [b, c2] and not in_stream(r, qk, c2)
    end_run(run, qk, c)
    nxt = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    assert [x.tid for x in nxt.runs] == [c2]


@pytest.mark.cluster
def test_a_purge_stopped_after_a_released_task_leaves_the_next_parked_one_moving(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """purge.lua works in batches; one that ended the released B and was not called again (the
    operator's CLI interrupted) passed B's place on: C is in the stream, not stranded."""
    c, (b, c2, d) = setup_parked(r, run, qk, 3)
    end_run(run, qk, c)
    res = parse_purge(run(purge_call(qk, 1, 100, nonce=sc.new_nonce())))  # as Admin sends it
    assert res.queued == 1 and res.more and not r.exists(qk.task(b))
    assert in_stream(r, qk, c2), "the purged released task stranded C"
    nxt = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    assert [x.tid for x in nxt.runs] == [c2] and r.lrange(held_key(qk), 0, -1) == [d]


@pytest.mark.parametrize("end", ["cancel", "expire"])
async def test_a_released_task_ended_while_paused_does_not_strand_the_next(
    settings: Settings, r: redis.Redis, spawn_worker: Any, end: str
) -> None:
    """End to end, a dtq-worker process: A runs, B and C are parked; the queue is paused while A
    ends (B is released into the stream), B is cancelled or its expiry passes, the queue is
    resumed: C runs. Retention, which would sweep the key, is kept out of the way."""
    qk = Keys(settings.key_prefix).queue("default")
    held = f"{qk.lim_base}t:held"
    kw = {"tenant": "t"}
    async with AsyncClient(settings=settings, app=limited_app) as c, Admin(settings) as adm:
        ha = await c.enqueue("gated_job", kwargs={**kw, "gate": "a"})
        hb = await c.enqueue("gated_job", kwargs=kw)
        hc = await c.enqueue("gated_job", kwargs=kw)
        b, c2 = (h.id.split(":", 1)[1] for h in (hb, hc))
        spawn_worker("tests.apps.limited:app", settings, DTQ_RETENTION_INTERVAL_S="3600")

        async def a_runs_b_c_parked() -> bool:
            return bool(r.lrange(held, 0, -1) == [b, c2]) and (
                (await c.get(ha.id)).status == "running"
            )

        await until(a_runs_b_c_parked)
        assert await adm.pause("default")
        r.set(f"{settings.key_prefix}:test:gate:a", "1")
        assert await c.result(ha.id, timeout=30) == "t"
        # A's end released B into the stream; the pause keeps it there.
        assert r.hget(qk.task(b), "eid") and r.lrange(held, 0, -1) == [c2]
        if end == "cancel":
            assert await c.cancel(hb.id)
        else:
            r.hset(qk.task(b), "exp", "1")  # its deadline passes before any claim reads it
        assert await adm.resume("default")
        assert await c.result(hc.id, timeout=20) == "t", "C was stranded"
        if end == "expire":
            with pytest.raises(TaskFailed) as exc:
                await c.result(hb.id, timeout=20)
            assert exc.value.status == "expired"
    assert not r.exists(held) and not r.exists(f"{qk.lim_base}t:run")
