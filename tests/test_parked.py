"""Tasks parked behind a fleet concurrency limit keep moving: dead parked ids are skipped with
bounded work per call, and purge takes the parked tasks of its queue too (scripts on a real Redis).
"""

from __future__ import annotations

from typing import Any

import redis

from dtq import AsyncClient
from dtq import scripts as sc
from dtq.admin import parse_purge, purge_call
from dtq.keys import Keys, QueueKeys, new_tid
from dtq.settings import Settings
from tests.apps.limited import app as limited_app
from tests.conftest import create_groups, running_worker
from tests.test_limits import until

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
