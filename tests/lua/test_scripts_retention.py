"""Direct tests of the retention scripts (lua/retention_*.lua) and lua/limit_sweep.lua on a real
redis-server: each branch of each script, through its wrapper in dtq.scripts. The retention pass
that calls them is tested in tests/ops/test_retention.py; these pin down what one call does."""

from __future__ import annotations

from typing import Any

import redis

from dtq import scripts as sc
from dtq.store.keys import GROUP, QueueKeys, new_tid
from dtq.store.record import Field
from tests.conftest import create_groups

Q = "ret"
DAY_MS = 86_400_000


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()  # type: ignore[misc]
    return int(sec) * 1000 + int(usec) // 1000


# --- retention_dlq ---------------------------------------------------------------------------


def dead_letter(r: redis.Redis, qk: QueueKeys, age_ms: int, status: str | None = "failed") -> str:
    """A dead letter that failed ``age_ms`` ago (Redis clock), its record in ``status`` (None:
    no record)."""
    tid = new_tid()
    r.zadd(qk.dlq, {tid: redis_ms(r) - age_ms})
    if status is not None:
        r.hset(qk.task(tid), mapping={Field.STATUS: status, Field.NAME: "t"})
    return tid


def test_retention_dlq_removes_old_entries_and_keeps_their_records(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    old, recent = dead_letter(r, qk, DAY_MS), dead_letter(r, qk, 0)
    got = sc.parse_retention_dlq(run(sc.retention_dlq_call(qk, 3_600_000, 0, 100)))
    assert got == sc.DlqPruned(removed=1, remaining=1)
    assert r.zrange(qk.dlq, 0, -1) == [recent]
    assert r.hget(qk.task(old), Field.STATUS) == "failed"  # its record ends by its own TTL


def test_retention_dlq_removes_entries_whose_record_is_gone_or_not_failed(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    gone = dead_letter(r, qk, 0, status=None)
    requeued = dead_letter(r, qk, 0, status="queued")
    kept = dead_letter(r, qk, 0)
    got = sc.parse_retention_dlq(run(sc.retention_dlq_call(qk, DAY_MS, 0, 100)))
    assert got == sc.DlqPruned(removed=2, remaining=1)
    assert r.zrange(qk.dlq, 0, -1) == [kept]
    assert r.hget(qk.task(requeued), Field.STATUS) == "queued"  # not a dead letter's to delete
    assert not r.exists(qk.task(gone))


def test_retention_dlq_over_the_cap_drops_the_oldest_with_their_records(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    tids = [dead_letter(r, qk, 1000 - i) for i in range(5)]  # tids[0] the oldest
    got = sc.parse_retention_dlq(run(sc.retention_dlq_call(qk, DAY_MS, 3, 100)))
    assert got == sc.DlqPruned(removed=2, remaining=3)
    assert r.zrange(qk.dlq, 0, -1) == tids[2:]
    assert [r.exists(qk.task(t)) for t in tids] == [0, 0, 1, 1, 1]


def test_retention_dlq_over_the_cap_deletes_only_failed_records(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """An entry dropped for the cap whose record moved on (requeued elsewhere) leaves it."""
    moved = dead_letter(r, qk, 2000, status="running")
    failed = dead_letter(r, qk, 1000)
    got = sc.parse_retention_dlq(run(sc.retention_dlq_call(qk, DAY_MS, 1, 100)))
    assert got == sc.DlqPruned(removed=1, remaining=1)
    assert r.zrange(qk.dlq, 0, -1) == [failed]
    assert r.hget(qk.task(moved), Field.STATUS) == "running"


def test_retention_dlq_looks_at_no_more_than_its_budget(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    tids = [dead_letter(r, qk, DAY_MS - i) for i in range(5)]  # all past the age
    got = sc.parse_retention_dlq(run(sc.retention_dlq_call(qk, 3_600_000, 0, 2)))
    assert got == sc.DlqPruned(removed=2, remaining=3)
    assert r.zrange(qk.dlq, 0, -1) == tids[2:]  # the oldest two went; the next call goes on
    got = sc.parse_retention_dlq(run(sc.retention_dlq_call(qk, 3_600_000, 0, 2)))
    assert got == sc.DlqPruned(removed=2, remaining=1)


def test_retention_dlq_of_an_empty_queue(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    got = sc.parse_retention_dlq(run(sc.retention_dlq_call(qk, 0, 1, 100)))
    assert got == sc.DlqPruned(removed=0, remaining=0)


# --- retention_consumers ---------------------------------------------------------------------


def test_retention_consumers_deletes_idle_consumers_that_hold_nothing(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    create_groups(r, qk)
    s5, s1 = qk.stream(5), qk.stream(1)
    r.xgroup_createconsumer(s5, GROUP, "idle")
    r.xgroup_createconsumer(s1, GROUP, "idle")  # one consumer per stream: counted per stream
    r.xadd(s5, {"t": "x"})
    r.xreadgroup(GROUP, "holder", {s5: ">"}, count=1)  # holds a pending entry
    assert run(sc.consumer_prune_call(qk, 0)) == 2
    assert [c["name"] for c in r.xinfo_consumers(s5, GROUP)] == ["holder"]
    assert r.xinfo_consumers(s1, GROUP) == []


def test_retention_consumers_keeps_consumers_idle_for_less_than_the_age(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    create_groups(r, qk)
    r.xgroup_createconsumer(qk.stream(5), GROUP, "fresh")
    assert run(sc.consumer_prune_call(qk, DAY_MS)) == 0
    assert [c["name"] for c in r.xinfo_consumers(qk.stream(5), GROUP)] == ["fresh"]


def test_retention_consumers_skips_streams_without_the_group_or_missing(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    r.xadd(qk.stream(5), {"t": "x"})  # a stream with no group yet; the others do not exist
    assert run(sc.consumer_prune_call(qk, 0)) == 0
    assert r.xlen(qk.stream(5)) == 1


# --- retention_queue -------------------------------------------------------------------------


def is_empty(run: Any, qk: QueueKeys, drop: bool = False) -> bool:
    return sc.parse_queue_state(run(sc.queue_empty_call(qk, drop))) is sc.QueueState.EMPTY


def test_retention_queue_a_queue_that_never_existed_is_empty(run: Any, qk: QueueKeys) -> None:
    assert is_empty(run, qk) and is_empty(run, qk, drop=True)


def test_retention_queue_streams_with_groups_but_nothing_in_them_are_empty(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    create_groups(r, qk)
    assert is_empty(run, qk)


def test_retention_queue_an_entry_holds_the_queue(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    create_groups(r, qk)
    r.xadd(qk.stream(0), {"t": "x"})
    assert not is_empty(run, qk, drop=True)
    assert r.xlen(qk.stream(0)) == 1  # nothing dropped


def test_retention_queue_a_consumer_or_a_pending_entry_holds_the_queue(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    create_groups(r, qk)
    r.xgroup_createconsumer(qk.stream(3), GROUP, "w1")
    assert not is_empty(run, qk)
    r.xgroup_delconsumer(qk.stream(3), GROUP, "w1")
    assert is_empty(run, qk)
    # A pending entry whose stream entry was deleted: the stream is empty, the group is not.
    eid = r.xadd(qk.stream(3), {"t": "x"})
    r.xreadgroup(GROUP, "w2", {qk.stream(3): ">"}, count=1)
    r.xdel(qk.stream(3), eid)
    assert r.xlen(qk.stream(3)) == 0 and not is_empty(run, qk)


def test_retention_queue_each_holding_key_holds_the_queue(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A scheduled task, a dead letter, a pause, a periodic schedule, a parked task."""
    for key, make in [
        (qk.sched, lambda k: r.zadd(k, {"t1": 1})),
        (qk.dlq, lambda k: r.zadd(k, {"t1": 1})),
        (qk.paused, lambda k: r.set(k, "1")),
        (qk.schedules, lambda k: r.hset(k, "s", "{}")),
        (qk.lim_parked, lambda k: r.sadd(k, "lk")),
    ]:
        make(key)
        assert not is_empty(run, qk, drop=True), key
        assert r.exists(key)
        r.delete(key)
        assert is_empty(run, qk), key


def test_retention_queue_the_flow_outbox_holds_it_with_entries_or_pending_only(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    eid = r.xadd(qk.flowq, {"k": "put"})
    assert not is_empty(run, qk)
    r.xgroup_create(qk.flowq, GROUP, id="0")
    r.xreadgroup(GROUP, "mover", {qk.flowq: ">"}, count=1)
    r.xdel(qk.flowq, eid)
    assert not is_empty(run, qk)  # moved out of the stream, not acknowledged yet
    r.xack(qk.flowq, GROUP, eid)
    assert is_empty(run, qk)  # the mover's consumer stays in its group: it does not count


def test_retention_queue_drop_deletes_the_empty_keys_and_only_with_drop(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    create_groups(r, qk)
    r.xadd(qk.events, {"e": "enqueued"})
    r.hset(qk.stats, "done", 1)
    r.zadd(qk.fair, {"x": 1})
    r.hset(qk.decl, "t", "{}")
    r.xadd(qk.flowq, {"k": "put"})
    r.xtrim(qk.flowq, maxlen=0)
    kept = [*qk.streams, qk.events, qk.stats, qk.fair, qk.decl, qk.flowq]
    assert is_empty(run, qk)  # events, stats, fair, declarations do not hold a queue
    assert all(r.exists(k) for k in kept)
    assert is_empty(run, qk, drop=True)
    assert not any(r.exists(k) for k in kept)


# --- retention_keys --------------------------------------------------------------------------


def keys_swept(run: Any, qk: QueueKeys, *keys: str) -> sc.KeysSwept:
    return sc.parse_retention_keys(run(sc.retention_keys_call(qk, list(keys), 600)))


def test_retention_keys_deletes_idempotency_keys_without_ttl_whose_task_is_gone(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    live = new_tid()
    r.hset(qk.task(live), Field.STATUS, "queued")
    r.set(qk.idem_base + "gone", new_tid())  # its task's record is gone
    r.set(qk.idem_base + "live", live)
    r.set(qk.idem_base + "ttl", new_tid(), ex=100)  # gone too, but it expires by itself
    keys = [qk.idem_base + k for k in ("gone", "live", "ttl")]
    assert keys_swept(run, qk, *keys) == sc.KeysSwept(idem_deleted=1, expired=0)
    assert [r.exists(k) for k in keys] == [0, 1, 1]


def test_retention_keys_gives_finished_records_without_ttl_one(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    tids = {s: new_tid() for s in ("succeeded", "failed", "cancelled", "expired", "running")}
    for status, tid in tids.items():
        r.hset(qk.task(tid), Field.STATUS, status)
    timed = new_tid()
    r.hset(qk.task(timed), Field.STATUS, "succeeded")
    r.expire(qk.task(timed), 50)
    no_status = new_tid()
    r.hset(qk.task(no_status), Field.NAME, "t")
    keys = [qk.task(t) for t in [*tids.values(), timed, no_status]]
    assert keys_swept(run, qk, *keys) == sc.KeysSwept(idem_deleted=0, expired=4)
    ttls = {s: r.ttl(qk.task(t)) for s, t in tids.items()}
    assert all(0 < ttls[s] <= 600 for s in ("succeeded", "failed", "cancelled", "expired"))
    assert ttls["running"] == -1 and r.ttl(qk.task(no_status)) == -1
    assert 0 < r.ttl(qk.task(timed)) <= 50  # a TTL it had is left as it is


def test_retention_keys_ignores_other_keys_and_missing_ones(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    r.set(qk.decl, "x")  # a key of the queue that is neither a record nor an idempotency key
    gone = qk.task(new_tid())
    assert keys_swept(run, qk, qk.decl, gone) == sc.KeysSwept(idem_deleted=0, expired=0)
    assert r.get(qk.decl) == "x" and r.ttl(qk.decl) == -1


# --- limit_sweep -----------------------------------------------------------------------------

LK = "tenant-a"


def parked(r: redis.Redis, qk: QueueKeys, lk: str = LK, lc: int = 1, **extra: Any) -> str:
    """A task parked behind limit key ``lk`` (concurrency ``lc``): queued, no stream entry."""
    tid = new_tid()
    fields = {Field.STATUS: "queued", Field.PRIORITY: 5, Field.LIMIT_KEY: lk}
    fields |= {Field.LIMIT_CONCURRENCY: lc, **extra}
    r.hset(qk.task(tid), mapping=fields)
    r.rpush(f"{qk.lim_base}{lk}:held", tid)
    r.sadd(qk.lim_parked, lk)
    return tid


def running(r: redis.Redis, qk: QueueKeys, lk: str = LK, attempt: int = 1) -> str:
    """A run of ``lk`` holding its place (its record running at ``attempt``)."""
    tid = new_tid()
    r.hset(qk.task(tid), mapping={Field.STATUS: "running", Field.ATTEMPT: attempt})
    r.zadd(f"{qk.lim_base}{lk}:run", {tid: attempt})
    return tid


def sweep(run: Any, qk: QueueKeys, *lks: str) -> sc.SweepResult:
    return sc.parse_limit_sweep(run(sc.limit_sweep_call(qk, list(lks))))


def in_stream(r: redis.Redis, qk: QueueKeys, tid: str) -> bool:
    return any(f["t"] == tid for _, f in r.xrange(qk.stream(5)))


def test_limit_sweep_with_nothing_owed_does_nothing(run: Any, qk: QueueKeys) -> None:
    assert sweep(run, qk) == sc.SweepResult(released=0, more=False)


def test_limit_sweep_drops_places_of_vanished_runs_and_releases_as_many_as_fit(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A place whose run's record is gone, or moved on to another attempt or status, is
    dropped; the limit's room (lc minus live runs) is filled from the parked tasks, in order."""
    live = running(r, qk)
    gone = new_tid()
    r.zadd(f"{qk.lim_base}{LK}:run", {gone: 1})  # record purged
    later = running(r, qk, attempt=2)
    r.zadd(f"{qk.lim_base}{LK}:run", {later: 1})  # its place is of attempt 1: stale
    done = running(r, qk)
    r.hset(qk.task(done), Field.STATUS, "succeeded")
    first, second, third = (parked(r, qk, lc=3) for _ in range(3))
    assert sweep(run, qk, LK) == sc.SweepResult(released=2, more=False)
    assert r.zrange(f"{qk.lim_base}{LK}:run", 0, -1) == [live]
    assert in_stream(r, qk, first) and in_stream(r, qk, second) and not in_stream(r, qk, third)
    assert r.hget(qk.task(first), Field.ENTRY_ID) is not None
    assert r.lrange(f"{qk.lim_base}{LK}:held", 0, -1) == [third]


def test_limit_sweep_releases_nothing_while_live_runs_fill_the_limit(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    running(r, qk)
    waiting = parked(r, qk, lc=1)
    assert sweep(run, qk, LK) == sc.SweepResult(released=0, more=False)
    assert not in_stream(r, qk, waiting)
    assert r.lrange(f"{qk.lim_base}{LK}:held", 0, -1) == [waiting]


def test_limit_sweep_drops_dead_parked_ids_and_returns_expired_ones_uncounted(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """Dead parked ids (cancelled, record gone, already given an entry) are dropped; a parked
    task whose expiry passed goes back to its stream (for the claim to end it expired) but is
    not counted as released; the list emptied, the key leaves ~parked."""
    cancelled = parked(r, qk)
    r.hset(qk.task(cancelled), Field.STATUS, "cancelled")
    r.rpush(f"{qk.lim_base}{LK}:held", new_tid())  # record gone
    has_entry = parked(r, qk, **{Field.ENTRY_ID: "1-0"})
    expired = parked(r, qk, **{Field.EXPIRES: 1})
    live = parked(r, qk)
    assert sweep(run, qk, LK) == sc.SweepResult(released=1, more=False)
    assert in_stream(r, qk, expired) and in_stream(r, qk, live)
    assert not in_stream(r, qk, cancelled) and not in_stream(r, qk, has_entry)
    assert r.llen(f"{qk.lim_base}{LK}:held") == 0
    assert not r.sismember(qk.lim_parked, LK)


def test_limit_sweep_without_keys_finishes_the_owed_releases(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    waiting = parked(r, qk)
    other = parked(r, qk, lk="tenant-b")  # not owed: left alone by a call without keys
    r.sadd(qk.lim_owed, LK)
    assert sweep(run, qk) == sc.SweepResult(released=1, more=False)
    assert in_stream(r, qk, waiting) and not in_stream(r, qk, other)
    assert not r.exists(qk.lim_owed)


def test_limit_sweep_out_of_budget_owes_the_rest_and_says_more(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """One call looks at no more than 5000 parked ids: dead ones ahead of a live one use it up,
    the key is owed, and the next call (without keys) goes on."""
    held = f"{qk.lim_base}{LK}:held"
    r.rpush(held, *[new_tid() for _ in range(5000)])  # dead ids: no records
    r.sadd(qk.lim_parked, LK)
    live = parked(r, qk)
    assert sweep(run, qk, LK) == sc.SweepResult(released=0, more=True)
    assert r.smembers(qk.lim_owed) == {LK} and not in_stream(r, qk, live)
    assert sweep(run, qk) == sc.SweepResult(released=1, more=False)
    assert in_stream(r, qk, live) and not r.exists(qk.lim_owed)


def test_limit_sweep_says_more_when_more_keys_are_owed_than_one_call_takes(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A call without keys takes 100 owed keys; with more owed it says so."""
    r.sadd(qk.lim_owed, *[f"k{i}" for i in range(101)])  # nothing parked behind any
    assert sweep(run, qk) == sc.SweepResult(released=0, more=True)
    assert r.scard(qk.lim_owed) == 1
    assert sweep(run, qk) == sc.SweepResult(released=0, more=False)
    assert not r.exists(qk.lim_owed)
