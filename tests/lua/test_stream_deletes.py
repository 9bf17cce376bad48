"""complete.lua deletes the entries of the runs it ends; the stream keeps exactly the entries
still waiting or running, whatever order runs end in and whichever worker holds the others
(complete.lua's ack_and_delete trims below the lowest pending entry instead of deleting entry by
entry). On a real server and on the fakeredis of ``dtq.testing``, which runs the same scripts."""

from __future__ import annotations

import dataclasses
from typing import Any

import fakeredis
import pytest
import redis

from dtq import scripts as sc
from dtq.store.keys import GROUP, QueueKeys, new_tid
from tests.conftest import create_groups

Q = "sd"


def task() -> sc.NewTask:
    return sc.NewTask(
        tid=new_tid(), name="t", args="[]", kwargs="", priority=5, max_retries=3,
        timeout=None, delay_ms=0, expires_ms=0, idempotency_key="", meta="",
    )  # fmt: skip


class Queue:
    """One queue's scripts and stream (band 5) on a client: a real server's or a fakeredis."""

    def __init__(self, r: Any, qk: QueueKeys) -> None:
        self.r, self.qk, self.run = r, qk, sc.SyncScripts(r).run
        self.stream = qk.stream(5)
        create_groups(r, qk)

    def enqueue(self, n: int) -> list[str]:
        tasks = [task() for _ in range(n)]
        sc.parse_enqueue(self.run(sc.enqueue_call(self.qk, tasks, 100)))
        return [t.tid for t in tasks]

    def claim(self, worker: str, count: int) -> list[sc.Claimed]:
        return sc.parse_claim(Q, self.run(sc.claim_call(self.qk, worker, count, 100, 60))).runs

    def complete(self, worker: str, runs: list[sc.Claimed]) -> list[bool]:
        outs = [sc.Success(c.tid, c.eid, c.attempt, "succeeded", "null") for c in runs]
        return sc.parse_complete(self.run(sc.complete_call(self.qk, worker, outs, 100, 60)))

    def entries(self) -> list[str]:
        return [eid for eid, _ in self.r.xrange(self.stream)]

    def pending(self) -> list[str]:
        return [p["message_id"] for p in self.r.xpending_range(self.stream, GROUP, "-", "+", 100)]


def runs_ending_in_any_order(q: Queue) -> None:
    tids = q.enqueue(8)
    a = q.claim("wa", 3)  # entries 1-3 to worker a
    b = q.claim("wb", 3)  # 4-6 to worker b; 7-8 wait
    assert [c.tid for c in a + b] == tids[:6]
    waiting = q.entries()[6:]
    # b ends its middle run and its last while a holds all three of its own: only those go.
    assert q.complete("wb", [b[2], b[1]]) == [True, True]
    assert q.entries() == [c.eid for c in a] + [b[0].eid, *waiting]
    assert q.pending() == [c.eid for c in a] + [b[0].eid]
    # a ends its last run first (its others below it still running), then the first.
    assert q.complete("wa", [a[2]]) == [True]
    assert q.entries() == [a[0].eid, a[1].eid, b[0].eid, *waiting]
    assert q.complete("wa", [a[0]]) == [True]
    assert q.entries() == [a[1].eid, b[0].eid, *waiting]
    # The rest end; the waiting entries stay until claimed, and are claimed as before.
    assert q.complete("wb", [b[0]]) == [True]
    assert q.complete("wa", [a[1]]) == [True]
    assert q.entries() == waiting and q.pending() == []
    rest = q.claim("wa", 10)
    assert [c.tid for c in rest] == tids[6:]
    assert q.complete("wa", rest) == [True, True]
    assert q.entries() == [] and q.pending() == []
    for tid in tids:
        assert q.r.hget(q.qk.task(tid), "status") == "succeeded"


def test_complete_deletes_exactly_the_ended_runs_entries(r: redis.Redis, qk: QueueKeys) -> None:
    runs_ending_in_any_order(Queue(r, qk))


def test_complete_deletes_exactly_the_ended_runs_entries_in_dtq_testing(qk: QueueKeys) -> None:
    runs_ending_in_any_order(Queue(fakeredis.FakeRedis(decode_responses=True), qk))


def test_a_stale_or_replayed_outcome_deletes_nothing(r: redis.Redis, qk: QueueKeys) -> None:
    q = Queue(r, qk)
    q.enqueue(3)
    runs = q.claim("wa", 3)
    assert q.complete("wa", runs[:2]) == [True, True]
    left = q.entries()
    assert left == [runs[2].eid]
    # The same outcomes again (a re-send after a lost reply) and a stale writer's: no entry goes.
    assert q.complete("wa", runs[:2]) == [True, True]
    assert q.complete("wb", [runs[2]]) == [False]
    assert q.entries() == left and q.pending() == left


@pytest.mark.parametrize("external", ["acked", "never delivered"])
def test_an_entry_not_pending_among_the_outcomes_falls_back_to_deleting_by_id(
    r: redis.Redis, qk: QueueKeys, external: str
) -> None:
    """An outcome whose entry is not pending (acknowledged by hand, or an id the group never
    delivered) is no ground to trim: the call deletes its own entries one by one, nothing else."""
    q = Queue(r, qk)
    q.enqueue(4)
    runs = q.claim("wa", 2)
    if external == "acked":
        r.xack(q.stream, GROUP, runs[0].eid)
        bad = runs[0]
    else:  # the run's record names an entry of the stream no worker was handed
        bad = dataclasses.replace(runs[0], eid=q.entries()[3])
    before = q.entries()
    assert q.complete("wa", [bad, runs[1]]) == [True, True]
    assert q.entries() == [e for e in before if e not in (bad.eid, runs[1].eid)]
