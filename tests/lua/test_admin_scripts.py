"""Direct tests of the operator scripts (purge, dlq_requeue, dlq_discard) on a real Redis.

Raw keys in, reply and keys out; each script is called twice (replay) and raced where a race
exists.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from dtq import admin
from dtq import scripts as sc
from dtq.store.keys import GROUP, QueueKeys, new_tid
from tests.conftest import create_groups

Q = "ops"


groups = create_groups


def new_task(prio: int = 5, delay_ms: int = 0, idem: str = "", max_retries: int = 0) -> sc.NewTask:
    return sc.NewTask(
        tid=new_tid(), name="t", args="[1]", kwargs="", priority=prio, max_retries=max_retries,
        timeout=None, delay_ms=delay_ms, expires_ms=0, idempotency_key=idem, meta="",
    )  # fmt: skip


def enqueue(run: Any, qk: QueueKeys, *tasks: sc.NewTask) -> list[str]:
    return [e.tid for e in sc.parse_enqueue(run(sc.enqueue_call(qk, list(tasks), 1000)))]


def claim(run: Any, qk: QueueKeys, count: int = 10, worker: str = "w1") -> list[sc.Claimed]:
    return sc.parse_claim(Q, run(sc.claim_call(qk, worker, count, 1000, 60))).runs


def dead_letters(run: Any, r: redis.Redis, qk: QueueKeys, n: int, idem: str = "") -> list[str]:
    """n tasks that ended failed (max_retries=0, one failure each)."""
    groups(r, qk)
    tids = enqueue(run, qk, *[new_task(idem=f"{idem}{i}" if idem else "") for i in range(n)])
    runs = claim(run, qk, count=n)
    fails = [sc.Failure(c.tid, c.eid, c.attempt, "ValueError: boom", 0) for c in runs]
    assert set(sc.parse_verdicts(run(sc.fail_call(qk, "w1", fails, 1000, 60)))) == {"failed"}
    return tids


def requeue(run: Any, qk: QueueKeys, tids: list[str], **kw: Any) -> list[sc.DlqVerdict]:
    return sc.parse_dlq(run(sc.dlq_requeue_call(qk, tids, events_maxlen=1000, **kw)))


def discard(run: Any, qk: QueueKeys, tids: list[str]) -> list[sc.DlqVerdict]:
    return sc.parse_dlq(run(sc.dlq_discard_call(qk, tids, events_maxlen=1000)))


# --- purge -----------------------------------------------------------------------------------


def test_purge_removes_waiting_keeps_running_and_finished(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    failed = dead_letters(run, r, qk, 1)
    running = enqueue(run, qk, new_task(prio=9))
    assert [c.tid for c in claim(run, qk, count=1)] == running
    waiting = enqueue(run, qk, *[new_task(prio=p % 10, idem=f"k{p}") for p in range(25)])
    delayed = enqueue(run, qk, *[new_task(delay_ms=60_000) for _ in range(7)])

    batches = []
    while True:
        b = sc.parse_purge(run(sc.purge_call(qk, 10, 1000)))
        batches.append(b)
        if not b.more:
            break
    assert sum(b.queued for b in batches) == 25
    assert sum(b.scheduled for b in batches) == 7
    assert all(b.queued + b.scheduled <= 10 for b in batches)
    for tid in waiting + delayed:
        assert not r.exists(qk.task(tid))
    assert not any(r.exists(qk.idem(f"k{p}")) for p in range(25))
    assert r.zcard(qk.sched) == 0
    # The running task keeps its entry (pending) and record; the dead letter stays.
    assert r.hget(qk.task(running[0]), "status") == "running"
    assert r.xlen(qk.stream(9)) == 1 and r.xpending(qk.stream(9), GROUP)["pending"] == 1
    assert sum(r.xlen(s) for s in qk.streams) == 1
    assert r.hget(qk.task(failed[0]), "status") == "failed" and r.zcard(qk.dlq) == 1
    # Replay: nothing left to purge.
    assert sc.parse_purge(run(sc.purge_call(qk, 10, 1000))) == sc.PurgeBatch(0, 0, False)


def test_purge_without_group_treats_all_entries_as_waiting(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    tids = enqueue(run, qk, new_task(), new_task(prio=0))  # no group created yet
    assert sc.parse_purge(run(sc.purge_call(qk, 100, 1000))) == sc.PurgeBatch(2, 0, False)
    assert not any(r.exists(qk.task(t)) for t in tids)


def test_purge_races_claimers_each_task_either_started_or_purged(
    redis_server: Any, qk: QueueKeys
) -> None:
    c = redis_server.client()
    run = sc.SyncScripts(c).run
    groups(c, qk)
    n = 600
    tids = enqueue(run, qk, *[new_task(prio=i % 10) for i in range(n)])
    started: list[str] = []
    purged = [0]
    stop = threading.Event()
    go = threading.Barrier(3)  # all three start together, so purge and claims really race

    def claimer(name: str) -> None:
        cl = redis_server.client()
        rn = sc.SyncScripts(cl).run
        go.wait(30)
        while not stop.is_set():
            started.extend(x.tid for x in claim(rn, qk, count=1, worker=name))

    def purger() -> None:
        cl = redis_server.client()
        rn = sc.SyncScripts(cl).run
        go.wait(30)
        while True:
            b = sc.parse_purge(rn(sc.purge_call(qk, 7, 1000)))
            purged[0] += b.queued + b.scheduled
            if not b.more:
                break
        stop.set()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(2)]
    threads.append(threading.Thread(target=purger))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(started) == len(set(started)), "a task was started twice"
    assert len(started) + purged[0] == n
    assert purged[0] > 0
    for tid in tids:
        status = c.hget(qk.task(tid), "status")
        assert (status == "running") == (tid in started)
        assert (status is None) == (tid not in started)


# --- dlq_requeue -----------------------------------------------------------------------------


def test_dlq_requeue_keeps_id_and_history_and_replays_unchanged(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    (tid,) = dead_letters(run, r, qk, 1, idem="key")
    assert r.ttl(qk.task(tid)) > 0
    assert requeue(run, qk, [tid], max_retries=2) == ["requeued"]
    rec = r.hgetall(qk.task(tid))
    assert rec["status"] == "queued" and rec["retries"] == "0" and rec["maxr"] == "2"
    assert rec["attempt"] == "1" and rec["requeues"] == "1"
    assert rec["error"] == "ValueError: boom"  # last error kept until the next outcome
    assert "finished" not in rec
    assert r.ttl(qk.task(tid)) == -1 and r.ttl(qk.idem("key0")) == -1
    assert r.zcard(qk.dlq) == 0
    assert r.xlen(qk.stream(5)) == 1
    # The claim raises the attempt: the fencing token never goes back.
    (c,) = claim(run, qk)
    assert c.tid == tid and c.attempt == 2 and c.retries == 0 and c.max_retries == 2
    types = [f["type"] for _, f in r.xrange(qk.events) if f["tid"] == tid]
    assert types == ["enqueued", "started", "failed", "dlq_requeued", "started"]


def test_dlq_requeue_replay_is_a_no_op(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    (tid,) = dead_letters(run, r, qk, 1)
    assert requeue(run, qk, [tid]) == ["requeued"]
    assert requeue(run, qk, [tid]) == ["queued"] == [r.hget(qk.task(tid), "status")]
    assert r.xlen(qk.stream(5)) == 1
    assert r.hget(qk.task(tid), "requeues") == "1"
    assert requeue(run, qk, ["nope"]) == ["missing"]


def test_dlq_requeue_refuses_states_not_allowed(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    groups(r, qk)
    (tid,) = enqueue(run, qk, new_task())
    claim(run, qk)
    assert requeue(run, qk, [tid]) == ["running"]
    cancelled = enqueue(run, qk, new_task())[0]
    res = sc.parse_cancel(
        run(sc.cancel_call(qk, cancelled, events_maxlen=100, ttl_s=60,
                           hint_channel="h", reason="no"))
    )  # fmt: skip
    assert res.outcome == "cancelled"
    assert requeue(run, qk, [cancelled]) == ["cancelled"]  # dlq requeue takes failed only
    assert requeue(run, qk, [cancelled], allowed=admin.RETRYABLE) == ["requeued"]
    assert r.hget(qk.task(cancelled), "status") == "queued"


def test_dlq_requeue_races_itself_each_task_requeued_once(redis_server: Any, qk: QueueKeys) -> None:
    c = redis_server.client()
    run = sc.SyncScripts(c).run
    tids = dead_letters(run, c, qk, 300)
    results: list[list[str]] = []

    def go() -> None:
        cl = redis_server.client()
        rn = sc.SyncScripts(cl).run
        out: list[str] = []
        for i in range(0, len(tids), 20):
            out += requeue(rn, qk, tids[i : i + 20])
        results.append(out)

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    per_task = list(zip(*results, strict=True))
    assert all(sorted(o) == ["queued", "queued", "requeued"] for o in per_task)
    # Exactly one entry per task, whichever call won.
    assert c.xlen(qk.stream(5)) == 300
    assert {c.hget(qk.task(t), "requeues") for t in tids} == {"1"}


# --- dlq_discard -----------------------------------------------------------------------------


def test_dlq_discard_deletes_and_replays(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    a, b = dead_letters(run, r, qk, 2, idem="d")
    assert discard(run, qk, [a]) == ["discarded"]
    assert not r.exists(qk.task(a)) and not r.exists(qk.idem("d0"))
    assert r.zrange(qk.dlq, 0, -1) == [b]
    assert discard(run, qk, [a]) == ["missing"]  # replay
    # A listed dead letter whose record already expired is cleaned up.
    r.delete(qk.task(b))
    assert discard(run, qk, [b]) == ["discarded"] and r.zcard(qk.dlq) == 0


def test_dlq_discard_races_requeue_one_wins(redis_server: Any, qk: QueueKeys) -> None:
    c = redis_server.client()
    run = sc.SyncScripts(c).run
    tids = dead_letters(run, c, qk, 200)
    out: dict[str, list[str]] = {}

    def go(op: str) -> None:
        cl = redis_server.client()
        rn = sc.SyncScripts(cl).run
        res: list[str] = []
        for i in range(0, len(tids), 10):
            chunk = tids[i : i + 10]
            res += requeue(rn, qk, chunk) if op == "requeue" else discard(rn, qk, chunk)
        out[op] = res

    threads = [threading.Thread(target=go, args=(op,)) for op in ("requeue", "discard")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for tid, rq, ds in zip(tids, out["requeue"], out["discard"], strict=True):
        status = c.hget(qk.task(tid), "status")
        if ds == "discarded":
            assert rq in ("missing", "failed") and status is None
        else:
            assert rq == "requeued" and ds == "queued" and status == "queued"
    queued = sum(1 for o in out["requeue"] if o == "requeued")
    assert sum(c.xlen(s) for s in qk.streams) == queued
    assert c.zcard(qk.dlq) == 0
