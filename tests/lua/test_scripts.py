"""Direct tests of each Lua transition on a real Redis: raw keys in, reply and keys out."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from dtq import scripts as sc
from dtq.store.keys import GROUP, QueueKeys
from dtq.store.record import with_defaults
from tests.conftest import create_groups
from tests.helpers.scripts import Q, claim, enqueue, started, task


@pytest.fixture
def run(r: redis.Redis) -> Any:
    runner = sc.SyncScripts(r)
    return runner.run


groups = create_groups


def test_enqueue_single_and_bulk(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    a, b, c = task(prio=9), task(prio=0), task(delay_ms=60_000)
    res = enqueue(run, qk, a, b, c)
    assert [(e.tid, e.status, e.created) for e in res] == [
        (a.tid, "queued", True), (b.tid, "queued", True), (c.tid, "scheduled", True),
    ]  # fmt: skip
    assert r.xlen(qk.stream(9)) == 1 and r.xlen(qk.stream(0)) == 1
    assert r.zscore(qk.sched, c.tid) is not None
    rec = r.hgetall(qk.task(a.tid))
    assert rec["status"] == "queued" and "attempt" not in rec and rec["eid"]  # (0: left out)
    # The same call sent again (a client's re-send after a lost reply: tids are made per
    # enqueue) answers with the tasks it made, as they are now, and writes nothing again.
    r.hset(qk.task(b.tid), "status", "running")
    events = r.xlen(qk.events)
    again = enqueue(run, qk, a, b, c)
    assert [(e.tid, e.status, e.created) for e in again] == [
        (a.tid, "queued", True), (b.tid, "running", True), (c.tid, "scheduled", True),
    ]  # fmt: skip
    assert r.xlen(qk.stream(9)) == 1 and r.xlen(qk.stream(0)) == 1 and r.zcard(qk.sched) == 1
    assert r.xlen(qk.events) == events and r.hget(qk.task(a.tid), "eid") == rec["eid"]
    # The call's time is the first entry's id (no TIME call); a scheduled task counts from it.
    eid_ms = int(rec["eid"].split("-")[0])
    assert int(rec["enq"]) == eid_ms
    assert int(r.hget(qk.task(c.tid), "due")) == int(r.hget(qk.task(c.tid), "enq")) + 60_000


def test_enqueue_refuses_a_call_without_the_stream_of_a_tasks_band(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    good, bad = task(prio=5), task(prio=3)
    call = sc.enqueue_call(qk, [good, bad], 100)
    call = sc.Call(call.script, [k for k in call.keys if not k.endswith(":p3")], call.args)
    with pytest.raises(redis.ResponseError, match="DTQ_BAD_CALL"):
        run(call)
    assert not r.exists(qk.task(good.tid)) and r.xlen(qk.stream(5)) == 0  # nothing written


FULL = " ".join((sc.enqueue.FIXED, *sc.enqueue.OPTIONS))  # enqueue.lua's every field


def full_fields(t: sc.NewTask) -> list[Any]:
    """Task ``t`` as the fields of the layout :data:`FULL` (every option sent, empty or not)."""
    o = sc.enqueue._options(t)
    rest = [o.get(f, sc.enqueue._UNSET[f]) for f in sc.enqueue.OPTIONS]
    return [t.tid, t.name, t.args, t.priority, t.max_retries, *rest]


def test_a_plain_single_enqueue_sends_only_the_fixed_fields(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A task without options is sent as its 5 fixed fields under the fixed layout (the single
    enqueue's hot path); the record is the one every field makes, and an option adds only
    itself to the layout and to the fields."""
    plain, twin = task(args="[]"), task(args="[]")
    call = sc.enqueue_call(qk, [plain], 100)
    assert call.args == [100, 1, 0, "tid name args prio maxr", plain.tid, "t", "[]", 5, 3]
    assert sc.parse_enqueue(run(call)) == [sc.Enqueued(plain.tid, "queued", True)]
    run(sc.Call("enqueue", call.keys, [100, 1, 0, FULL, *full_fields(twin)]))
    short, full = r.hgetall(qk.task(plain.tid)), r.hgetall(qk.task(twin.tid))
    assert short.pop("eid") != full.pop("eid")
    short.pop("enq"), full.pop("enq")
    assert short == full and short["status"] == "queued" and "kwargs" not in short
    # Each option alone: the layout names it after the fixed 5, and the record carries it.
    options = {
        "kwargs": ({"kwargs": '{"a":1}'}, "kwargs"), "timeout": ({"timeout": 2.5}, "timeout"),
        "delay": ({"delay_ms": 60_000}, "due"), "exp": ({"expires_ms": 9_000}, "exp"),
        "idem": ({"idempotency_key": "k-opt"}, "idem"), "meta": ({"meta": '{"m":1}'}, "meta"),
        "lk lc lrn lrw": ({"limit": "1|0|0|lk"}, "lk"),
        "hdr": ({"headers": '{"traceparent":"00-ab-cd-01"}'}, "hdr"),
        "dflt": ({"unset": "mt"}, "dflt"), "grp": ({"group": "g1"}, "grp"),
    }  # fmt: skip
    for what, (kw, field) in options.items():
        t = task(**kw)
        c = sc.enqueue_call(qk, [t], 100)
        assert c.args[3] == f"tid name args prio maxr {what}", what
        assert len(c.args) == 4 + 5 + len(what.split()), what
        run(c)
        assert r.hget(qk.task(t.tid), field) is not None, what
    # The fields follow the layout's order, whatever it is.
    t = task(prio=9, meta='{"m":2}', kwargs='{"b":2}')
    keys = sc.enqueue_call(qk, [t], 100).keys
    fields = [t.tid, t.name, t.args, 9, 3, '{"m":2}', '{"b":2}']
    run(sc.Call("enqueue", keys, [100, 1, 0, "tid name args prio maxr meta kwargs", *fields]))
    assert r.hmget(qk.task(t.tid), "meta", "kwargs") == ['{"m":2}', '{"b":2}']


def test_enqueue_refuses_a_layout_it_does_not_know(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    """A layout must start with the fixed 5 fields and name each known option at most once:
    anything else is refused before a task is written."""
    t = task(prio=9)
    keys = sc.enqueue_call(qk, [t], 100).keys
    fixed = [t.tid, t.name, t.args, 9, 3]
    for layout, extra in (
        ("tid name args maxr prio", []), ("tid name args prio maxr color", ["red"]),
        ("tid name args prio maxr meta meta", ["", ""]), ("tid name args prio", []),
    ):  # fmt: skip
        with pytest.raises(redis.ResponseError, match="DTQ_BAD_CALL"):
            run(sc.Call("enqueue", keys, [100, 1, 0, layout, *fixed, *extra]))
    assert not r.exists(qk.task(t.tid)) and r.xlen(qk.stream(9)) == 0


def test_a_bulk_enqueue_of_plain_tasks_sends_only_their_fixed_fields(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A batch in which no task has an option sends 5 fields per task (the bulk enqueue's hot
    path); its records are those every field makes. A batch in which some task has options
    names those in its layout, every task sends them, and each record gets only its own."""
    plain = [task(prio=p, args="[]") for p in (9, 9, 0)]
    call = sc.enqueue_call(qk, plain, 100)
    assert len(call.args) == 4 + 5 * 3 and call.args[3] == sc.enqueue.FIXED
    assert [e.status for e in sc.parse_enqueue(run(call))] == ["queued"] * 3
    twin = task(prio=9, args="[]")
    run(sc.Call("enqueue", call.keys, [100, 1, 0, FULL, *full_fields(twin)]))
    short, full = r.hgetall(qk.task(plain[0].tid)), r.hgetall(qk.task(twin.tid))
    for rec in (short, full):
        rec.pop("eid"), rec.pop("enq")
    assert short == full and r.xlen(qk.stream(9)) == 3 and r.xlen(qk.stream(0)) == 1
    # Left to the declaration (dtq.declared): the one option named, 6 fields per task.
    unset = task(unset="m")
    call = sc.enqueue_call(qk, [unset, task()], 100)
    assert call.args[3] == "tid name args prio maxr dflt" and len(call.args) == 4 + 6 * 2
    run(call)
    assert r.hget(qk.task(unset.tid), "dflt") == "m"
    mixed = [task(), task(kwargs='{"a":1}'), task(delay_ms=60_000, unset="e")]
    call = sc.enqueue_call(qk, mixed, 100)
    assert call.args[3] == "tid name args prio maxr dflt kwargs delay"
    assert len(call.args) == 4 + 8 * 3
    run(call)
    assert [r.hget(qk.task(t.tid), "kwargs") for t in mixed] == [None, '{"a":1}', None]
    assert [r.hget(qk.task(t.tid), "status") for t in mixed] == ["queued", "queued", "scheduled"]
    assert [r.hget(qk.task(t.tid), "dflt") for t in mixed] == [None, None, "e"]
    # A limit is four fields of their own (key, concurrency, rate count, rate window).
    limited = [task(limit="0|5|1000|k|x"), task()]
    call = sc.enqueue_call(qk, limited, 100)
    assert call.args[3] == "tid name args prio maxr lk lc lrn lrw"
    run(call)
    assert r.hmget(qk.task(limited[0].tid), "lk", "lc", "lrn", "lrw") == ["k|x", "0", "5", "1000"]
    assert r.hmget(qk.task(limited[1].tid), "lk", "lc", "lrn", "lrw") == [None] * 4


def test_enqueue_scheduled_first_reads_the_clock(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    later, now = task(delay_ms=5_000), task(prio=2)
    enqueue(run, qk, later, now)
    server_ms = int(r.time()[0]) * 1000
    enq = int(r.hget(qk.task(later.tid), "enq"))
    assert abs(enq - server_ms) < 5_000
    assert r.hget(qk.task(now.tid), "enq") == str(enq)  # one time per call


def test_enqueue_idempotency_key_returns_original(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    t = task(idem="k1")
    first = enqueue(run, qk, t)[0]
    again = enqueue(run, qk, task(idem="k1"), task(idem="k1"))
    assert [(e.tid, e.created) for e in again] == [(first.tid, False), (first.tid, False)]
    # A re-send of the call that made it (same tid) is that call's answer: created.
    assert enqueue(run, qk, t) == [sc.Enqueued(t.tid, "queued", True)]
    assert r.xlen(qk.stream(5)) == 1


def test_claim_reply_carries_the_headers_set_at_enqueue(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """Middleware headers (a trace context) reach the worker in the claim reply itself, with
    no second round trip; a task without headers claims with "" in their place, and costs the
    reply nothing (14 fields per run; headers follow the tail, only for runs that have them)."""
    groups(r, qk)
    traced = task(
        headers='{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    )
    plain, other = task(), task(headers='{"k":"v"}')
    enqueue(run, qk, plain, traced, other)
    raw = run(sc.claim_call(qk, "w1", 10, 100, 60))
    assert len(raw) == 5 + 3 * sc.outcomes.RUN_FIELDS + 2 + 2 * 2
    runs = {c.tid: c for c in sc.parse_claim(Q, raw).runs}
    assert runs[traced.tid].headers == traced.headers and runs[other.tid].headers == '{"k":"v"}'
    assert runs[plain.tid].headers == ""
    enqueue(run, qk, task())
    assert len(run(sc.claim_call(qk, "w1", 10, 100, 60))) == 5 + sc.outcomes.RUN_FIELDS + 2
    assert r.hget(qk.task(traced.tid), "hdr") == traced.headers
    assert r.hget(qk.task(plain.tid), "hdr") is None


def test_claim_strict_priority_and_count_across_bands(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    groups(r, qk)
    low = [task(prio=1) for _ in range(3)]
    high = [task(prio=8) for _ in range(2)]
    enqueue(run, qk, *low, *high)
    b = claim(run, qk, count=3)
    # COUNT is spent across bands: 2 from p8 then 1 from p1, never 3 per band.
    assert [c.tid for c in b.runs] == [high[0].tid, high[1].tid, low[0].tid]
    assert all(c.attempt == 1 for c in b.runs)
    assert r.hget(qk.task(high[0].tid), "status") == "running"
    assert r.hget(qk.task(high[0].tid), "worker") == "w1"
    # Replay: nothing left but two p1 entries.
    assert [c.tid for c in claim(run, qk, count=10).runs] == [low[1].tid, low[2].tid]
    assert claim(run, qk).runs == []


def test_claim_reads_no_band_without_entries(fresh_redis: Any) -> None:
    # Tasks at the default priority leave bands 9-6 empty: the claim reads band 5 (twice: the
    # second finds nothing new) and skips the empty bands (XLEN 0) instead of reading each.
    r = fresh_redis.client()
    qk = QueueKeys("fr", Q)
    groups(r, qk)
    run = sc.SyncScripts(r).run
    tasks = [task(prio=5) for _ in range(3)]
    enqueue(run, qk, *tasks)
    r.xadd(qk.stream(1), {"t": "gone"})  # a band below with an entry is still read
    r.config_resetstat()
    b = claim(run, qk, count=10)
    assert [c.tid for c in b.runs] == [t.tid for t in tasks] and b.absorbed == 1
    stats = r.info("commandstats")
    # Band 5 twice; band 1 once (its entry, absorbed, is deleted: the band is empty again).
    assert stats["cmdstat_xreadgroup"]["calls"] == 3
    assert stats["cmdstat_xlen"]["calls"] == 10 + 2  # every band once, bands 5 and 1 again
    r.close()


def test_claim_absorbs_duplicate_entries(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    groups(r, qk)
    t = task()
    enqueue(run, qk, t)
    r.xadd(qk.stream(5), {"t": t.tid})  # a duplicate entry, as after a crash between steps
    r.xadd(qk.stream(5), {"t": "gone"})  # an entry whose task no longer exists
    b = claim(run, qk)
    assert [c.tid for c in b.runs] == [t.tid]
    assert b.absorbed == 2
    assert r.xlen(qk.stream(5)) == 1  # the running entry stays until its outcome
    assert r.xpending(qk.stream(5), GROUP)["pending"] == 1
    assert r.hget(qk.stats, "absorbed") == "2"


def test_claim_paused_and_missing_streams(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    assert claim(run, qk).missing_streams
    groups(r, qk)
    enqueue(run, qk, task())
    r.set(qk.paused, 1)
    assert claim(run, qk).paused
    r.delete(qk.paused)
    assert len(claim(run, qk).runs) == 1


def test_claim_expires_unstarted_task(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    groups(r, qk)
    t = task(expires_ms=1)
    enqueue(run, qk, t)
    time.sleep(0.01)
    b = claim(run, qk)
    assert b.runs == [] and b.expired == 1
    assert r.hget(qk.task(t.tid), "status") == "expired"
    assert r.xlen(qk.stream(5)) == 0


def test_two_claimers_race_each_entry_started_once(redis_server: Any, qk: QueueKeys) -> None:
    setup = redis_server.client()
    groups(setup, qk)
    tasks = [task() for _ in range(400)]
    sc_setup = sc.SyncScripts(setup)
    for i in range(0, 400, 100):
        sc_setup.run(sc.enqueue_call(qk, tasks[i : i + 100], 0))
    got: dict[str, list[str]] = {"a": [], "b": []}

    def worker(name: str) -> None:
        c = redis_server.client()
        s = sc.SyncScripts(c)
        while True:
            b = sc.parse_claim(Q, s.run(sc.claim_call(qk, name, 7, 0, 60)))
            if not b.runs:
                return
            got[name] += [x.tid for x in b.runs]

    ths = [threading.Thread(target=worker, args=(n,)) for n in got]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert sorted(got["a"] + got["b"]) == sorted(t.tid for t in tasks)
    assert not set(got["a"]) & set(got["b"])


def test_complete_is_fenced(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk)
    stale = sc.Success(c.tid, c.eid, c.attempt + 1, "succeeded", "1")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [stale], 100, 60))) == [False]
    other = sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1")
    assert sc.parse_complete(run(sc.complete_call(qk, "w2", [other], 100, 60))) == [False]
    assert r.hget(qk.stats, "stale_writes") == "2"
    assert r.hget(qk.task(c.tid), "status") == "running"
    good = sc.Success(c.tid, c.eid, c.attempt, "succeeded", '{"x": 1}')
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [good], 100, 60))) == [True]
    rec = r.hgetall(qk.task(c.tid))
    assert rec["status"] == "succeeded" and rec["result"] == '{"x": 1}'
    assert 0 < r.ttl(qk.task(c.tid)) <= 60
    assert r.xlen(qk.stream(5)) == 0 and r.xpending(qk.stream(5), GROUP)["pending"] == 0
    # Replay (a re-send after a lost reply): answered as stored, and changes nothing.
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [good], 100, 60))) == [True]
    assert r.hget(qk.stats, "stale_writes") == "2"


def test_complete_with_what_the_claim_told_does_what_a_full_read_does(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The worker gives back each run's band and flags (Success.of): complete.lua then reads 3
    fields instead of 8, and still expires the idempotency key, frees the limit's place (and
    releases the task parked behind it), and drops the error of an earlier attempt."""
    groups(r, qk)
    plain, idem = task(), task(idem="key-1")
    limited, parked = task(limit="1|0|0|k"), task(limit="1|0|0|k")
    erred = task(prio=7)
    enqueue(run, qk, plain, idem, limited, erred)
    r.hset(qk.task(erred.tid), "error", "ValueError: attempt before")
    runs = {c.tid: c for c in claim(run, qk, count=10).runs}
    enqueue(run, qk, parked)
    assert claim(run, qk).held == 1  # behind the limit
    assert {t: runs[t].flags for t in runs} == {
        plain.tid: "-", idem.tid: "i", limited.tid: "l", erred.tid: "e",
    }  # fmt: skip
    outs = [sc.Success.of(runs[t.tid], "succeeded", "1") for t in (plain, idem, limited, erred)]
    assert all(o.flags and o.priority is not None and o.priority >= 0 for o in outs)
    r.config_resetstat()
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", outs, 100, 60))) == [True] * 4
    stats = r.info("commandstats")
    # 4 fences, and the release's read of the parked task.
    assert stats["cmdstat_hmget"]["calls"] == 5 and "cmdstat_hgetall" not in stats
    for t in (plain, idem, limited, erred):
        rec = r.hgetall(qk.task(t.tid))
        assert rec["status"] == "succeeded" and "error" not in rec, t.tid
    assert 0 < r.ttl(qk.idem("key-1")) <= 60
    assert r.zcard(qk.lim_base + "k:run") == 0
    assert r.hget(qk.task(parked.tid), "eid")  # released into its stream
    (again,) = claim(run, qk).runs
    assert again.tid == parked.tid and again.flags == "l"
    # The flags are what the fence goes by (so the worker must give back its claim's): told
    # "-", this run's end leaves its limit place taken (the full read would have freed it).
    lie = sc.Success(again.tid, again.eid, again.attempt, "succeeded", "1", again.priority, "-")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [lie], 100, 60))) == [True]
    assert r.zcard(qk.lim_base + "k:run") == 1


def test_complete_then_claims_in_the_same_call(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk)
    waiting = [task(prio=1), task(prio=8), task(prio=1)]
    enqueue(run, qk, *waiting)
    done = sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1")
    stored, batch = sc.parse_complete_claim(
        Q, run(sc.complete_call(qk, "w1", [done], 100, 60, claim=2))
    )
    assert stored == [True] and batch is not None
    # Priority order, COUNT respected, each started (attempt 1, owned by w1).
    assert [x.tid for x in batch.runs] == [waiting[1].tid, waiting[0].tid]
    for x in batch.runs:
        rec = r.hgetall(qk.task(x.tid))
        assert (rec["status"], rec["attempt"], rec["worker"]) == ("running", "1", "w1")
    assert r.hget(qk.task(c.tid), "status") == "succeeded"
    assert r.hget(qk.task(waiting[2].tid), "status") == "queued"
    # A stale outcome still claims (the slot is free either way); a paused queue claims nothing
    # but the outcome is stored.
    stale = sc.Success(c.tid, c.eid, c.attempt + 1, "succeeded", "1")
    stored, batch = sc.parse_complete_claim(
        Q, run(sc.complete_call(qk, "w1", [stale], 100, 60, claim=5))
    )
    assert stored == [False] and batch is not None
    assert [x.tid for x in batch.runs] == [waiting[2].tid]
    r.set(qk.paused, "1")
    first = batch.runs[0]
    ok = sc.Success(first.tid, first.eid, first.attempt, "succeeded", "2")
    stored, batch = sc.parse_complete_claim(
        Q, run(sc.complete_call(qk, "w1", [ok], 100, 60, claim=5))
    )
    assert stored == [True] and batch is not None and batch.paused and not batch.runs
    # Without a claim count the reply is the verdicts alone (as before; this one a replay).
    stored, batch = sc.parse_complete_claim(Q, run(sc.complete_call(qk, "w1", [ok], 100, 60)))
    assert stored == [True] and batch is None


def test_fail_retries_then_dead_letters(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk, task(max_retries=1))
    f = sc.Failure(c.tid, c.eid, c.attempt, "ValueError: x", 0)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["scheduled"]
    assert r.hget(qk.task(c.tid), "status") == "scheduled"
    assert r.zscore(qk.sched, c.tid) is not None
    # A re-send (lost reply) is answered as the first send was (tests/lua/test_script_replay.py).
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["scheduled"]
    p = sc.parse_promote(run(sc.promote_call(qk, 100, 100)))
    assert p.promoted == 1
    c2 = claim(run, qk).runs[0]
    assert c2.attempt == 2 and c2.retries == 1
    f2 = sc.Failure(c2.tid, c2.eid, c2.attempt, "ValueError: y", 0)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f2], 100, 60))) == ["failed"]
    rec = r.hgetall(qk.task(c.tid))
    assert rec["status"] == "failed" and rec["error"] == "ValueError: y" and rec["retries"] == "2"
    assert r.zscore(qk.dlq, c.tid) is not None


def test_fail_without_retry(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk)
    f = sc.Failure(c.tid, c.eid, c.attempt, "Fail: no", None)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["failed"]


def test_requeue_spends_no_retry_within_budget(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk, task(max_retries=0))
    for i in range(2):
        call = sc.requeue_call(qk, "w1", [sc.RunRef(c.tid, c.eid, c.attempt)], events_maxlen=0,
                               ttl_s=60, max_interruptions=1, retry_delay_ms=0)  # fmt: skip
        verdict = sc.parse_verdicts(run(call))
        if i == 0:
            assert verdict == ["queued"]
            assert with_defaults(r.hgetall(qk.task(c.tid)))["retries"] == "0"  # type: ignore[arg-type]
            c = claim(run, qk).runs[0]
            assert c.attempt == 2
        else:
            # Past the interruption budget the hand-back counts as a failure: no retries left.
            assert verdict == ["failed"]
            assert "interrupted" in r.hget(qk.task(c.tid), "error")


def test_requeue_refuses_a_hand_back_kind_it_does_not_know(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """ARGV[9] names what the runs were ('started', 'prefetched', 'unknown'); anything else is
    refused before a run is touched."""
    c = started(run, r, qk)
    ref = sc.RunRef(c.tid, c.eid, c.attempt)
    call = sc.requeue_call(
        qk, "w1", [ref], events_maxlen=0, ttl_s=60, max_interruptions=1, retry_delay_ms=0
    )
    assert call.args[8] == "started"
    with pytest.raises(redis.ResponseError, match="DTQ_BAD_CALL"):
        run(sc.Call(call.script, call.keys, [*call.args[:8], "1", *call.args[9:]]))
    assert r.hget(qk.task(c.tid), "status") == "running"


def test_reclaim_exactly_one_reclaimer_wins(redis_server: Any, qk: QueueKeys) -> None:
    r = redis_server.client()
    run = sc.SyncScripts(r).run
    groups(r, qk)
    tasks = [task() for _ in range(50)]
    enqueue(run, qk, *tasks)
    runs = claim(run, qk, count=50).runs
    assert len(runs) == 50
    time.sleep(0.05)
    results: list[sc.ReclaimResult] = []

    def reap(name: str) -> None:
        s = sc.SyncScripts(redis_server.client())
        results.append(sc.parse_reclaim(s.run(sc.reclaim_call(
            qk, name, min_idle_ms=20, count=100, events_maxlen=10, ttl_s=60))))  # fmt: skip

    ths = [threading.Thread(target=reap, args=(f"r{i}",)) for i in range(3)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert sum(x.requeued for x in results) == 50
    assert sum(x.absorbed for x in results) == 0
    # Each task is queued once more, with one retry spent, under a new entry.
    assert r.xlen(qk.stream(5)) == 50
    rec = r.hgetall(qk.task(tasks[0].tid))
    assert rec["status"] == "queued" and rec["retries"] == "1" and "worker lost" in rec["error"]
    # The old owner's outcome is now stale.
    c = runs[0]
    ok = sc.Success(c.tid, c.eid, c.attempt, "succeeded", "1")
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", [ok], 0, 60))) == [False]
    again = claim(run, qk, count=100).runs
    assert len(again) == 50 and {x.attempt for x in again} == {2}


def test_reclaim_poison_pill_ends_failed(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk, task(max_retries=0))
    time.sleep(0.02)
    res = sc.parse_reclaim(run(sc.reclaim_call(qk, "w2", min_idle_ms=10, count=10,
                                               events_maxlen=10, ttl_s=60)))  # fmt: skip
    assert res.failed == 1
    rec = r.hgetall(qk.task(c.tid))
    assert rec["status"] == "failed" and rec["error"].startswith("worker lost")
    assert r.zscore(qk.dlq, c.tid) is not None


def test_touch_reports_lost_and_never_takes_back(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    c = started(run, r, qk)
    ref = sc.RunRef(c.tid, c.eid, c.attempt)
    assert sc.parse_touch(run(sc.touch_call(qk, "w1", [ref]))) == sc.TouchResult([], [])
    time.sleep(0.02)
    run(sc.reclaim_call(qk, "w2", min_idle_ms=10, count=10, events_maxlen=0, ttl_s=60))
    c2 = claim(run, qk, worker="w3").runs[0]
    res = sc.parse_touch(run(sc.touch_call(qk, "w1", [ref])))
    assert res.lost == [c.tid]
    owners = {
        p["message_id"]: p["consumer"] for p in r.xpending_range(qk.stream(5), GROUP, "-", "+", 10)
    }
    assert owners == {c2.eid: "w3"}


def test_promote_exactly_once_with_racing_schedulers(redis_server: Any, qk: QueueKeys) -> None:
    r = redis_server.client()
    run = sc.SyncScripts(r).run
    groups(r, qk)
    tasks = [task(delay_ms=1) for _ in range(300)]
    enqueue(run, qk, *tasks)
    time.sleep(0.01)
    total: list[int] = []

    def sched() -> None:
        s = sc.SyncScripts(redis_server.client())
        while True:
            p = sc.parse_promote(s.run(sc.promote_call(qk, 7, 0)))
            total.append(p.promoted)
            if p.promoted == 0:
                return

    ths = [threading.Thread(target=sched) for _ in range(3)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert sum(total) == 300
    assert r.xlen(qk.stream(5)) == 300
    assert r.zcard(qk.sched) == 0


def test_cancel_each_state(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    groups(r, qk)
    queued, sched = task(), task(delay_ms=60_000)
    enqueue(run, qk, queued, sched)

    def cancel(tid: str) -> sc.CancelResult:
        return sc.parse_cancel(run(sc.cancel_call(qk, tid, events_maxlen=10, ttl_s=60,
                                                  hint_channel="h", reason="stop")))  # fmt: skip

    assert cancel(queued.tid) == sc.CancelResult("cancelled", "cancelled")
    assert r.xlen(qk.stream(5)) == 0
    assert cancel(sched.tid).outcome == "cancelled" and r.zcard(qk.sched) == 0
    assert cancel(queued.tid) == sc.CancelResult("unchanged", "cancelled")
    c = started(run, r, qk)
    assert cancel(c.tid) == sc.CancelResult("requested", "running")
    assert cancel(c.tid) == sc.CancelResult("requested", "running")
    assert r.hget(qk.task(c.tid), "cancel") == "stop"
    assert sc.parse_touch(
        run(sc.touch_call(qk, "w1", [sc.RunRef(c.tid, c.eid, c.attempt)]))
    ).cancel_requested == [c.tid]
    assert cancel("nope").outcome == "missing"


def test_lock_compare_and_set(r: redis.Redis, run: Any, prefix: str) -> None:
    key = f"{prefix}:lock"

    def lock(token: str, ms: int) -> sc.Lock:
        return sc.parse_lock(run(sc.lock_call(key, token, ms)))

    def unlock(token: str) -> sc.Unlock:
        return sc.parse_unlock(run(sc.unlock_call(key, token)))

    assert lock("a", 1000) is sc.Lock.HELD
    assert lock("b", 1000) is sc.Lock.NOT_HELD
    assert lock("a", 5000) is sc.Lock.HELD and r.pttl(key) > 1000
    assert unlock("b") is sc.Unlock.NOT_HOLDER
    assert unlock("a") is sc.Unlock.RELEASED
    assert lock("b", 1000) is sc.Lock.HELD
