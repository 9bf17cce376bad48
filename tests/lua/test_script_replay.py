"""Outcome scripts sent twice: a re-send after a lost reply is answered with what the first send
stored, and writes nothing again; a genuinely stale writer stays stale. Also recover.lua, the
script a worker uses to find the runs whose claim reply it never got."""

from __future__ import annotations

import time
from typing import Any

import redis

from dtq import scripts as sc
from dtq.store.keys import GROUP, QueueKeys
from tests.conftest import create_groups
from tests.helpers.scripts import Q, claim, enqueue, started, task


def _marks(r: redis.Redis, qk: QueueKeys) -> tuple[int, str | None]:
    return r.xlen(qk.events), r.hget(qk.stats, "stale_writes")


def test_a_resent_complete_reports_the_stored_outcome(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c = started(run, r, qk)
    ok = sc.Success(c.tid, c.eid, c.attempt, "succeeded", '{"x": 1}')
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [ok], 100, 60))) == [True]
    marks = _marks(r, qk)
    # The same call again (its first reply was lost): stored, and nothing is written twice.
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [ok], 100, 60))) == [True]
    assert _marks(r, qk) == marks
    assert r.hget(qk.task(c.tid), "status") == "succeeded"
    # A writer of another attempt or another worker is still stale, and counted.
    for worker, attempt in (("w2", c.attempt), ("w1", c.attempt + 1)):
        other = sc.Success(c.tid, c.eid, attempt, "succeeded", "2")
        assert sc.parse_complete(run(sc.complete_call(qk, worker, [other], 100, 60))) == [False]
    assert r.hget(qk.stats, "stale_writes") == "2"
    assert r.hget(qk.task(c.tid), "result") == '{"x": 1}'


def test_a_resent_complete_of_a_handed_back_run_stays_stale(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The record names this attempt and worker but holds another status (the run was handed
    back): the complete did not land, so it is not reported as stored."""
    c = started(run, r, qk)
    back = sc.requeue_call(qk, "w1", [sc.RunRef(c.tid, c.eid, c.attempt)], events_maxlen=0,
                           ttl_s=60, max_interruptions=1, retry_delay_ms=0)  # fmt: skip
    assert sc.parse_verdicts(run(back)) == ["queued"]
    ok = sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [ok], 100, 60))) == [False]
    assert r.hget(qk.task(c.tid), "status") == "queued"


def test_a_resent_fail_reports_the_stored_status(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk, task(max_retries=1))
    f = sc.Failure(c.tid, c.eid, c.attempt, "ValueError: x", 0)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["scheduled"]
    marks, retries = _marks(r, qk), r.hget(qk.task(c.tid), "retries")
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["scheduled"]
    assert _marks(r, qk) == marks and r.hget(qk.task(c.tid), "retries") == retries
    assert r.zcard(qk.sched) == 1
    # Once the next attempt started, the old run's write is stale.
    run(sc.promote_call(qk, 100, 100))
    c2 = claim(run, qk).runs[0]
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["stale"]
    # Past the budget: "failed", and the re-send says "failed" too.
    f2 = sc.Failure(c2.tid, c2.eid, c2.attempt, "ValueError: y", 0)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f2], 100, 60))) == ["failed"]
    marks = _marks(r, qk)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f2], 100, 60))) == ["failed"]
    assert _marks(r, qk) == marks and r.zcard(qk.dlq) == 1


def test_a_resent_requeue_reports_the_stored_status(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    c = started(run, r, qk, task(max_retries=0))
    ref = sc.RunRef(c.tid, c.eid, c.attempt)
    back = sc.requeue_call(qk, "w1", [ref], events_maxlen=100, ttl_s=60, max_interruptions=1,
                           retry_delay_ms=0)  # fmt: skip
    assert sc.parse_verdicts(run(back)) == ["queued"]
    marks, eid = _marks(r, qk), r.hget(qk.task(c.tid), "eid")
    assert sc.parse_verdicts(run(back)) == ["queued"]
    assert _marks(r, qk) == marks and r.hget(qk.task(c.tid), "eid") == eid
    assert r.hget(qk.task(c.tid), "intr") == "1" and r.xlen(qk.stream(5)) == 1
    # Another worker's hand-back of that run is stale.
    other = sc.requeue_call(qk, "w2", [ref], events_maxlen=100, ttl_s=60, max_interruptions=1,
                            retry_delay_ms=0)  # fmt: skip
    assert sc.parse_verdicts(run(other)) == ["stale"]


def test_a_late_write_of_a_reclaimed_run_stays_stale(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """reclaim.lua removes the record's worker: the lost run's writes are never replays."""
    c = started(run, r, qk, task(max_retries=0))
    time.sleep(0.02)
    res = sc.parse_reclaim(run(sc.reclaim_call(qk, "w2", min_idle_ms=10, count=10,
                                               events_maxlen=10, ttl_s=60)))  # fmt: skip
    assert res.failed == 1
    ok = sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [ok], 100, 60))) == [False]
    f = sc.Failure(c.tid, c.eid, c.attempt, "x", 0)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["stale"]
    assert r.hget(qk.task(c.tid), "status") == "failed"


def recover(run: Any, qk: QueueKeys, known: list[sc.Claimed], since_ms: int = 0) -> sc.ClaimBatch:
    call = sc.recover_call(
        qk, "w1", [(c.priority, c.eid) for c in known], events_maxlen=100, since_ms=since_ms
    )
    return sc.parse_claim(Q, run(call))


def test_recover_returns_the_runs_a_lost_claim_started(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    create_groups(r, qk)
    # (With headers: recover.lua answers every field claim.lua does, middleware's included.)
    tasks = [task(prio=p, kwargs='{"k": 1}', headers=f'{{"h":"{p}"}}') for p in (9, 5, 5, 0)]
    enqueue(run, qk, *tasks)
    lost = claim(run, qk, count=4).runs  # its reply "lost": the worker knows none of them
    assert len(lost) == 4
    time.sleep(0.02)
    # Known runs are skipped; the others come back in claim.lua's format, same attempt, and
    # their lease is renewed (idle reset) without a new delivery being counted.
    got = recover(run, qk, lost[:1])
    assert sorted(got.runs, key=lambda c: c.tid) == sorted(lost[1:], key=lambda c: c.tid)
    assert got.absorbed == 0
    idle = {p["message_id"]: p for p in r.xpending_range(qk.stream(5), GROUP, "-", "+", 10)}
    for c in lost[1:3]:
        assert idle[c.eid]["time_since_delivered"] < 20 and idle[c.eid]["times_delivered"] == 1
    assert recover(run, qk, lost).runs == []
    # Runs started before this process (an earlier life of this worker id) are left alone.
    assert recover(run, qk, [], since_ms=got.now_ms + 10_000).runs == []
    # A pending entry its record does not name is a duplicate: acknowledged and deleted.
    ok = sc.Success(lost[1].tid, lost[1].eid, lost[1].attempt, "succeeded", "1")
    run(sc.complete_call(qk, "w1", [ok], 100, 60))
    r.hset(qk.task(lost[2].tid), "eid", "0-1")
    events = r.xlen(qk.events)
    got = recover(run, qk, [])
    assert {c.tid for c in got.runs} == {lost[0].tid, lost[3].tid}
    assert got.absorbed == 1 and r.hget(qk.stats, "absorbed") == "1"
    assert r.xlen(qk.events) == events + 1
    assert r.xpending(qk.stream(5), GROUP)["pending"] == 0
    # Another worker's pending runs are never touched.
    assert recover(run, qk, []).runs == got.runs
    other = sc.parse_claim(Q, run(sc.recover_call(qk, "w2", [], events_maxlen=0, since_ms=0)))
    assert other.runs == [] and other.absorbed == 0
