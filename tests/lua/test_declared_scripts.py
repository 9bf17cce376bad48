"""enqueue.lua and the claim (lua/includes/claim_entries.lua) on values an enqueue left to the
declaration: raw keys in, reply and record out, on a real Redis."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from dtq import scripts as sc
from dtq.declared import declarations
from dtq.scripts import dlq_requeue_call
from dtq.sdk.requests import TaskDefaults, build_task
from dtq.settings import Settings
from dtq.store.keys import Keys, QueueKeys
from tests.conftest import create_groups

Q = "q1"


@pytest.fixture
def qk(prefix: str, r: redis.Redis) -> QueueKeys:
    q = Keys(prefix).queue(Q)
    create_groups(r, q)
    return q


def by_name(settings: Settings, name: str = "t", **kw: Any) -> sc.NewTask:
    """A task as a client that does not know it builds it."""
    return build_task(settings, name, [1], queue=Q, **kw)[1]


def enqueue(run: Any, qk: QueueKeys, *tasks: sc.NewTask) -> None:
    run(sc.enqueue_call(qk, list(tasks), 100))


def claim(run: Any, qk: QueueKeys, count: int = 10) -> dict[str, sc.Claimed]:
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", count, 100, 60)))
    return {c.tid: c for c in batch.runs}


def test_enqueue_records_what_it_left_unset_not_a_value(
    r: redis.Redis, run: Any, qk: QueueKeys, settings: Settings
) -> None:
    plain = by_name(settings)
    three = by_name(settings, max_retries=3, timeout=2)
    known = build_task(settings, "t", [1], defaults=TaskDefaults(queue=Q))[1]
    enqueue(run, qk, plain)
    enqueue(run, qk, three, known)
    p = r.hgetall(qk.task(plain.tid))
    assert p["dflt"] == "mte" and "timeout" not in p and "exp" not in p
    # maxr at dtq's default (3) is left out, as every field at its default.
    assert "maxr" not in p
    t = r.hgetall(qk.task(three.tid))
    assert t["dflt"] == "e" and "maxr" not in t and t["timeout"] == "2.0"
    k = r.hgetall(qk.task(known.tid))
    assert "dflt" not in k and "maxr" not in k


def test_claim_fills_unset_values_from_the_declaration_once(
    r: redis.Redis, run: Any, qk: QueueKeys, settings: Settings
) -> None:
    r.hset(
        qk.decl,
        mapping=declarations(
            [("t", TaskDefaults(max_retries=1, timeout=2.5, expires=600)), ("u", TaskDefaults())]
        ),
    )
    a, b = by_name(settings), by_name(settings)  # same name: one declaration read serves both
    given = by_name(settings, max_retries=7)
    other = by_name(settings, "u")
    nobody = by_name(settings, "v")  # no worker declared it: dtq's defaults
    enqueue(run, qk, a, b, given, other, nobody)
    runs = claim(run, qk)
    got = [(runs[x.tid].max_retries, runs[x.tid].timeout) for x in (a, b, given, other, nobody)]
    assert got == [(1, 2.5), (1, 2.5), (7, 2.5), (3, None), (3, None)]
    rec = r.hgetall(qk.task(a.tid))
    assert rec["maxr"] == "1" and rec["timeout"] == "2.5" and rec["dflt"] == ""
    assert int(rec["exp"]) == int(rec["enq"]) + 600_000  # from the enqueue, not the claim
    assert r.hget(qk.task(given.tid), "maxr") == "7"
    assert r.hget(qk.task(nobody.tid), "maxr") is None  # dtq's default: left out
    assert r.hget(qk.task(nobody.tid), "exp") is None

    # Fixed at the first claim: a later declaration does not change a handed-back task.
    r.hset(qk.decl, "t", "9|1.0|")
    run(sc.requeue_call(
        qk, "w1", [sc.RunRef(a.tid, runs[a.tid].eid, runs[a.tid].attempt)], events_maxlen=100,
        ttl_s=60, max_interruptions=5, retry_delay_ms=0, started=False,
    ))  # fmt: skip
    again = claim(run, qk)
    assert again[a.tid].attempt == 2 and again[a.tid].max_retries == 1
    assert again[a.tid].timeout == 2.5


def test_a_budget_given_by_a_retry_before_any_claim_overrides_the_declaration(
    r: redis.Redis, run: Any, qk: QueueKeys, settings: Settings
) -> None:
    """A by-name task cancelled before its first claim, retried with a new budget: the budget
    given then wins over the declaration its first claim applies; timeout still comes from it."""
    r.hset(qk.decl, "t", "1|4.0|")
    t = by_name(settings)
    enqueue(run, qk, t)
    cancel = sc.cancel_call(qk, t.tid, events_maxlen=100, ttl_s=60, hint_channel="h", reason="test")
    assert sc.parse_cancel(run(cancel)).outcome == "cancelled"
    out = run(dlq_requeue_call(qk, [t.tid], events_maxlen=100, max_retries=5,
                               allowed=("cancelled",)))  # fmt: skip
    assert out == ["requeued"]
    c = claim(run, qk)[t.tid]
    assert (c.max_retries, c.timeout) == (5, 4.0)


def test_claim_treats_an_unreadable_declaration_as_none(
    r: redis.Redis, run: Any, qk: QueueKeys, settings: Settings
) -> None:
    r.hset(qk.decl, "t", "garbage")
    t = by_name(settings)
    enqueue(run, qk, t)
    c = claim(run, qk)[t.tid]
    assert (c.max_retries, c.timeout) == (3, None)


def test_claim_expires_a_by_name_task_past_its_declared_expiry(
    r: redis.Redis, run: Any, qk: QueueKeys, settings: Settings
) -> None:
    r.hset(qk.decl, "t", "3||1")
    t = by_name(settings)
    enqueue(run, qk, t)
    enq = int(r.hget(qk.task(t.tid), "enq") or 0)

    # Wait on Redis's clock until the declared 1 ms has passed since the enqueue.
    def redis_ms() -> int:
        sec, usec = r.time()  # type: ignore[misc]
        return int(sec) * 1000 + int(usec) // 1000

    while redis_ms() <= enq + 1:
        pass
    batch = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 5, 100, 60)))
    assert batch.runs == [] and batch.expired == 1
    rec = r.hgetall(qk.task(t.tid))
    assert rec["status"] == "expired" and "attempt" not in rec  # (0: left out)
    # The values it ended under are fixed in its record, as for a started run (maxr 3: the
    # default, left out).
    assert rec["exp"] == str(enq + 1) and "maxr" not in rec and rec["dflt"] == ""


def test_fixed_defaults_are_unchanged_by_a_declaration_for_known_tasks(
    r: redis.Redis, run: Any, qk: QueueKeys, settings: Settings
) -> None:
    """A client that knows the task wrote everything: no declaration is read or applied."""
    r.hset(qk.decl, "t", "0|1.0|1")
    known = build_task(settings, "t", [1], defaults=TaskDefaults(queue=Q, max_retries=4))[1]
    enqueue(run, qk, known)
    c = claim(run, qk)[known.tid]
    assert (c.max_retries, c.timeout) == (4, None)
    assert r.hget(qk.task(known.tid), "exp") is None
