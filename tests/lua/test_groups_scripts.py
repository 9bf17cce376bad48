"""Fair groups in the Lua transitions (lua/includes/group_*.lua, claim_entries.lua): each active
group of a band has one turn in the stream, so claims serve the groups in turn; caps and pauses
withhold a group's turn; no group key outlives the group's last task."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from dtq import scripts as sc
from dtq.store.keys import GROUP_MARK, QueueKeys, new_tid
from tests.conftest import create_groups

Q = "gq"

pytestmark = pytest.mark.cluster


@pytest.fixture
def qk(prefix: str, r: redis.Redis) -> QueueKeys:
    """The queue's keys, with its streams and consumer group made."""
    k = QueueKeys(prefix, Q)
    create_groups(r, k)
    return k


@pytest.fixture
def run(r: redis.Redis) -> Any:
    return sc.SyncScripts(r).run


def task(group: str = "", prio: int = 5, **kw: Any) -> sc.NewTask:
    base: dict[str, Any] = dict(
        tid=new_tid(), name="t", args="[1]", kwargs="", priority=prio, max_retries=3,
        timeout=None, delay_ms=0, expires_ms=0, idempotency_key="", meta="", group=group,
    )  # fmt: skip
    base.update(kw)
    return sc.NewTask(**base)


def enqueue(run: Any, qk: QueueKeys, *tasks: sc.NewTask) -> list[sc.Enqueued]:
    return sc.parse_enqueue(run(sc.enqueue_call(qk, list(tasks), 100)))


def claim(run: Any, qk: QueueKeys, count: int = 1, cap: int = 0, w: str = "w1") -> sc.ClaimBatch:
    return sc.parse_claim(Q, run(sc.claim_call(qk, w, count, 100, 60, group_cap=cap)))


def complete(run: Any, qk: QueueKeys, c: sc.Claimed, w: str = "w1", cap: int = 0) -> bool:
    out = sc.complete_call(qk, w, [sc.Success.of(c, "succeeded", "null")], 100, 60, group_cap=cap)
    return sc.parse_complete(run(out)) == [True]


def purge_all(run: Any, qk: QueueKeys, batch: int) -> int:
    """purge.lua called until it reports no more, as dtq.admin does; the queued tasks removed."""
    removed = 0
    while True:
        q, _s, more = run(sc.purge_call(qk, batch, 0, nonce=sc.new_nonce()))
        removed += q
        if not more:
            return removed


def group_keys(r: redis.Redis, qk: QueueKeys) -> list[str]:
    return sorted(r.scan_iter(match=qk.group_base + "*"))


def running(r: redis.Redis, qk: QueueKeys, group: str) -> int | None:
    """The group's running count, None when it has none (it is not active)."""
    n = r.get(qk.group_running(group))
    return None if n is None else int(n) % GROUP_MARK


def turn(r: redis.Redis, qk: QueueKeys, band: int, group: str) -> str | None:
    """The group's turn in the band: the head of its list (a tid, "~" while withheld), or
    None when it has none."""
    return r.lindex(qk.group_waiting(band, group), 0)


def test_a_backlog_does_not_hold_another_group_behind_it(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    big = [task("big") for _ in range(50)]
    enqueue(run, qk, *big)
    small = [task("small") for _ in range(3)]
    for t in small:
        enqueue(run, qk, t)
    # One entry per active group in the stream: the backlog waits in its group's list.
    assert r.xlen(qk.stream(5)) == 2
    assert r.llen(qk.group_waiting(5, "big")) == 50 and turn(r, qk, 5, "big") == big[0].tid
    order = []
    for _ in range(8):
        b = claim(run, qk)
        assert len(b.runs) == 1
        order.append(r.hget(qk.task(b.runs[0].tid), "grp"))
    assert order == ["big", "small"] * 3 + ["big", "big"]


def test_a_bulk_enqueue_appends_a_groups_run_of_tasks_in_one_rpush(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The first task of a group in a call takes its turn (or joins its list); the ones after it
    of the same group and band join the list together, in their order."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("counts the commands of one server (INFO commandstats)")
    big, small, last = (
        [task("big") for _ in range(30)],
        [task("small") for _ in range(3)],
        task("big"),
    )
    r.config_resetstat()
    enqueue(run, qk, *big, *small, last)
    assert int(r.info("commandstats")["cmdstat_rpush"]["calls"]) == 2 + 2 + 1
    assert r.lrange(qk.group_waiting(5, "big"), 0, 29) == [t.tid for t in big]
    assert r.lrange(qk.group_waiting(5, "small"), 0, -1) == [t.tid for t in small]
    assert r.xlen(qk.stream(5)) == 2  # one turn each
    order = [c.tid for c in claim(run, qk, count=34).runs]
    assert sorted(order) == sorted(t.tid for t in [*big, *small, last])  # each once
    assert {r.hget(qk.task(t), "grp") for t in order} == {"big", "small"}


def test_a_bulk_enqueue_indexes_its_new_groups_in_one_zadd(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """Many new groups in one call: one ZADD makes them active, and while no group of the queue
    is paused no paused set is read per group; a paused group's first task is still withheld."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("counts the commands of one server (INFO commandstats)")
    r.config_resetstat()
    enqueue(run, qk, *[task(f"n{i}") for i in range(50)], task(), task("n0"))
    stats = r.info("commandstats")
    assert int(stats["cmdstat_zadd"]["calls"]) == 1 and "cmdstat_sismember" not in stats
    assert r.zcard(qk.group_index) == 51  # and '' : the plain task after them joined a group
    assert r.xlen(qk.stream(5)) == 51 and r.llen(qk.group_waiting(5, "n0")) == 2
    hold(run, qk, "p", True)
    enqueue(run, qk, task("p"), task("q"))
    assert turn(r, qk, 5, "p") == "~" and r.zscore(qk.group_index, "q") is not None
    assert r.xlen(qk.stream(5)) == 52  # q's turn only


def test_a_by_name_grouped_enqueue_writes_the_record_a_full_layout_would(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """Grouped tasks enqueued by name (their retries, timeout and expiry left to the worker's
    declaration) at the default band and retries have their records written without a table:
    the same fields as any other path writes, the turn's task with its entry, the others with
    their status once; and the declaration fills them at the claim."""
    from dtq import declared
    from dtq.sdk.requests import TaskDefaults

    r.hset(qk.decl, "t", declared.encode(TaskDefaults(max_retries=7)))
    bulk = [task("a", unset="mte"), task("a", unset="mte"), task("b", unset="mte", prio=7)]
    enqueue(run, qk, *bulk)
    (single,) = [task("a", unset="mte")]
    enqueue(run, qk, single)
    recs = [r.hgetall(qk.task(t.tid)) for t in (*bulk, single)]
    for rec, t in zip(recs, (*bulk, single), strict=True):
        assert rec["name"] == "t" and rec["args"] == "[1]" and rec["status"] == "queued"
        assert rec["dflt"] == "mte" and rec["grp"] == t.group and int(rec["enq"]) > 0
    assert set(recs[0]) == {"name", "args", "enq", "status", "dflt", "grp", "eid"}
    assert set(recs[1]) == set(recs[3]) == {"name", "args", "enq", "status", "dflt", "grp"}
    assert recs[2]["prio"] == "7" and "eid" in recs[2]  # (b's turn, in band 7)
    runs = {c.tid: c for c in claim(run, qk, count=4).runs}
    assert set(runs) == {t.tid for t in (*bulk, single)}
    assert {c.max_retries for c in runs.values()} == {7}


def test_a_lone_group_runs_at_full_batch_size(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    ts = [task("solo") for _ in range(30)]
    enqueue(run, qk, *ts)
    b = claim(run, qk, count=10)
    assert [c.tid for c in b.runs] == [t.tid for t in ts[:10]]
    assert all("g" in c.flags for c in b.runs)
    assert running(r, qk, "solo") == 10


def test_a_claim_reads_a_lone_groups_batch_in_one_read(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """With one active group, the claim gives the tasks behind its turn their entries before it
    reads the band (not an XREADGROUP per task, nor a second one for them); the next turn stays
    in the stream for the next claim."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("counts the commands of one server (INFO commandstats)")
    ts = [task("solo") for _ in range(30)]
    enqueue(run, qk, *ts)
    r.config_resetstat()
    b = claim(run, qk, count=16)
    assert [c.tid for c in b.runs] == [t.tid for t in ts[:16]]
    assert int(r.info("commandstats")["cmdstat_xreadgroup"]["calls"]) == 1
    # The next turn's entry, behind the 16 delivered ones (pending until their runs end).
    assert turn(r, qk, 5, "solo") == ts[16].tid and r.xlen(qk.stream(5)) == 17
    assert r.llen(qk.group_waiting(5, "solo")) == 14
    assert [c.tid for c in claim(run, qk, count=16).runs] == [t.tid for t in ts[16:]]
    assert turn(r, qk, 5, "solo") is None and running(r, qk, "solo") == 30


def test_a_lone_group_is_issued_ahead_only_when_its_turn_is_the_bands_one_new_entry(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The claim gives a lone group's next tasks their entries before its read only when the
    band holds one entry not delivered (the group's turn), so the read's count reaches all of
    them: with other new entries in front (here tasks queued before the queue had groups, which
    join group '' when met), it reads first and issues ahead after, and every task runs once."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("counts the commands of one server (INFO commandstats)")
    plain = [task() for _ in range(3)]
    enqueue(run, qk, *plain)  # (no group active yet: entries of their own)
    ts = [task("solo") for _ in range(30)]
    enqueue(run, qk, *ts)
    r.config_resetstat()
    b = claim(run, qk, count=16)
    assert int(r.info("commandstats")["cmdstat_xreadgroup"]["calls"]) == 2
    # The first plain task takes group ''s turn (the others wait behind it in its list).
    # (Each takes group ''s turn in turn: its list is empty again once the one before started.)
    assert [c.tid for c in b.runs] == [t.tid for t in plain + ts[:13]]
    assert b.held == 0 and running(r, qk, "solo") == 13
    seen = [c.tid for c in b.runs]
    for _ in range(10):
        for c in b.runs:
            assert complete(run, qk, c)
        b = claim(run, qk, count=16)
        seen += [c.tid for c in b.runs]
    assert sorted(seen) == sorted(t.tid for t in plain + ts)  # each once
    assert group_keys(r, qk) == []


def test_a_claim_reads_no_record_for_the_turns_it_gives(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The tasks a claim gives their entries (ahead of their turn, or the turn passed on) are
    read once, when their entries are delivered (HGETALL); no record is read or written to
    give a turn."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("counts the commands of one server (INFO commandstats)")
    ts = [task("solo") for _ in range(30)]
    enqueue(run, qk, *ts)
    r.config_resetstat()
    assert [c.tid for c in claim(run, qk, count=16).runs] == [t.tid for t in ts[:16]]
    stats = r.info("commandstats")
    assert "cmdstat_hmget" not in stats
    assert int(stats["cmdstat_hgetall"]["calls"]) == 16
    assert int(stats["cmdstat_hset"]["calls"]) == 16  # the starts, each with its entry's id


def test_a_paused_groups_turn_passed_on_in_a_claim_issues_nothing_ahead(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A claim that meets a paused group's turn held by a task that no longer waits passes the
    turn on (the next task's entry), but issues none of the group's tasks ahead: its read then
    withholds the turn, and the group starts nothing until it is resumed."""
    a = [task("a") for _ in range(10)]
    p = [task("p") for _ in range(10)]
    enqueue(run, qk, *a, *p)
    # The first of each start; the second of each holds its group's turn (group_issue's entry).
    assert [c.tid for c in claim(run, qk, count=2).runs] == [a[0].tid, p[0].tid]
    hold(run, qk, "p", True)
    r.hset(qk.task(p[1].tid), "status", "succeeded")  # the turn's task, ended by hand
    b = claim(run, qk, count=16)
    assert [c.tid for c in b.runs] == [t.tid for t in a[1:]]
    assert turn(r, qk, 5, "p") == "~" and r.lindex(qk.group_waiting(5, "p"), 1) == p[2].tid
    assert running(r, qk, "p") == 1  # (p[0])
    hold(run, qk, "p", False)
    b = claim(run, qk, count=16)
    assert [c.tid for c in b.runs] == [t.tid for t in p[2:]]


def test_a_task_issued_ahead_that_no_longer_waits_is_not_run_and_passes_the_turn(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A listed id whose record no longer waits (ended, or gone) gets an entry ahead like the
    others; the claim that delivers it absorbs it without a run, and the turn it held passes
    on, so the group's later tasks still run and an idle group leaves no key."""
    ts = [task("solo") for _ in range(8)]
    enqueue(run, qk, *ts)
    r.hset(qk.task(ts[3].tid), "status", "succeeded")  # a middle one: the chain goes on
    r.delete(qk.task(ts[5].tid))  # a record gone
    r.hset(qk.task(ts[7].tid), "status", "cancelled")  # the last: it would hold the turn
    b = claim(run, qk, count=16)
    want = [ts[i].tid for i in (0, 1, 2, 4, 6)]
    assert [c.tid for c in b.runs] == want
    assert b.absorbed == 3
    assert turn(r, qk, 5, "solo") is None and r.xlen(qk.stream(5)) == len(want)
    for c in b.runs:
        assert complete(run, qk, c)
    assert group_keys(r, qk) == []


def test_a_lone_groups_batch_enters_and_leaves_its_running_count_in_one_call_each(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    if isinstance(r, redis.RedisCluster):
        pytest.skip("counts the commands of one server (INFO commandstats)")
    enqueue(run, qk, *[task("solo") for _ in range(30)])
    r.config_resetstat()
    b = claim(run, qk, count=16)
    assert running(r, qk, "solo") == 16
    outs = [sc.Success.of(c, "succeeded", "null") for c in b.runs]
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", outs, 100, 60))) == [True] * 16
    assert running(r, qk, "solo") == 0 and turn(r, qk, 5, "solo")
    stats = r.info("commandstats")
    assert int(stats["cmdstat_incrby"]["calls"]) == 1  # the 16 starts
    assert int(stats["cmdstat_decrby"]["calls"]) == 1  # the 16 ends


def test_groups_that_read_their_band_dry_share_the_batch(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    enqueue(run, qk, *[task("a") for _ in range(20)], *[task("b") for _ in range(3)])
    b = claim(run, qk, count=8)
    assert sorted(r.hget(qk.task(c.tid), "grp") for c in b.runs) == ["a"] * 5 + ["b"] * 3
    assert turn(r, qk, 5, "b") is None and r.xlen(qk.stream(5)) == 8 + 1  # a's turn


def test_tasks_without_a_group_are_one_group_while_groups_are_active(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    plain_before = [task() for _ in range(20)]  # queued before any group: in the stream
    enqueue(run, qk, *plain_before)
    assert not group_keys(r, qk)  # a queue without groups has no group key
    enqueue(run, qk, task("acme"))
    plain_after = [task() for _ in range(5)]
    enqueue(run, qk, *plain_after)
    assert r.hget(qk.task(plain_after[0].tid), "grp") == ""
    got = []
    for _ in range(4):
        b = claim(run, qk)
        got.append(r.hget(qk.task(b.runs[0].tid), "grp"))
    # The earlier plain tasks join the '' group (its list) as the claim meets them: acme's one
    # task starts within the first turn of the two groups, not after the twenty.
    assert sorted(got[:2]) == ["", "acme"]
    assert got[2:] == ["", ""]
    assert r.hget(qk.task(plain_before[-1].tid), "grp") == ""


@pytest.mark.parametrize("groups_active", [False, True])
def test_a_resent_plain_enqueue_is_answered_once_with_or_without_active_groups(
    r: redis.Redis, run: Any, qk: QueueKeys, groups_active: bool
) -> None:
    # enqueue.lua asks "does the record exist (a re-send)?" and "are groups active?" with one
    # call; each answer must still be read right when the other is yes.
    if groups_active:
        enqueue(run, qk, task("acme"))
    t = task()
    first = enqueue(run, qk, t)
    entries = r.xlen(qk.stream(5))
    again = enqueue(run, qk, t)
    assert [(e.tid, e.status, e.created) for e in again] == [(t.tid, "queued", True)]
    assert first[0].tid == t.tid and r.xlen(qk.stream(5)) == entries
    assert (r.hget(qk.task(t.tid), "grp") == "") is groups_active
    if groups_active:  # the plain task waits in group '' behind its turn, once
        assert r.lrange(qk.group_waiting(5, ""), 0, -1) == [t.tid]


def test_completing_every_task_leaves_no_group_key(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    enqueue(run, qk, *[task(g) for g in ("a", "b", "a", "c")], task())
    while True:
        b = claim(run, qk, count=3)
        if not b.runs:
            break
        for c in b.runs:
            assert complete(run, qk, c)
    assert group_keys(r, qk) == []


def test_a_runs_end_reads_no_turn_unless_the_group_lost_one_while_it_ran(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The end of a run changes the running count and reads nothing more while the group keeps
    its turn; a turn that ended while the group ran (its last waiting task started) marks the
    count, and the end of the last run then settles the group (it goes, or the mark does)."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("counts the commands of one server (INFO commandstats)")
    a1, a2, a3 = (task("a") for _ in range(3))
    enqueue(run, qk, a1, a2, a3)
    (c1,) = claim(run, qk).runs
    r.config_resetstat()
    assert complete(run, qk, c1)
    stats = r.info("commandstats")
    assert int(stats["cmdstat_decr"]["calls"]) == 1
    assert "cmdstat_lindex" not in stats and "cmdstat_exists" not in stats  # (no turn read)
    assert r.get(qk.group_running("a")) == "0" and turn(r, qk, 5, "a") == a2.tid
    (c2,) = claim(run, qk).runs
    (c3,) = claim(run, qk).runs  # the group's last waiting task: its turn ends, runs go on
    assert turn(r, qk, 5, "a") is None
    assert int(r.get(qk.group_running("a"))) == GROUP_MARK + 2
    assert complete(run, qk, c2) and int(r.get(qk.group_running("a"))) == GROUP_MARK + 1
    a4 = task("a")
    enqueue(run, qk, a4)  # a turn again before the last run ends: the group stays, unmarked
    assert complete(run, qk, c3)
    assert r.get(qk.group_running("a")) == "0" and turn(r, qk, 5, "a") == a4.tid
    (c4,) = claim(run, qk).runs
    assert int(r.get(qk.group_running("a"))) == GROUP_MARK + 1
    assert complete(run, qk, c4)
    assert group_keys(r, qk) == []  # the last run's end settled the group


def test_a_cap_withholds_the_turn_until_a_run_ends(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    enqueue(run, qk, *[task("capped") for _ in range(5)], *[task("free") for _ in range(2)])
    b = claim(run, qk, count=10, cap=2)
    by = [r.hget(qk.task(c.tid), "grp") for c in b.runs]
    assert by.count("capped") == 2 and by.count("free") == 2  # the cap is each group's
    assert turn(r, qk, 5, "capped") == "~"
    assert not claim(run, qk, count=10, cap=2).runs  # nothing more: no busy loop either
    first = next(c for c in b.runs if r.hget(qk.task(c.tid), "grp") == "capped")
    assert complete(run, qk, first, cap=2)  # (a worker sends its cap with its outcomes too)
    b2 = claim(run, qk, count=10, cap=2)
    assert len(b2.runs) == 1 and r.hget(qk.task(b2.runs[0].tid), "grp") == "capped"


def test_a_turn_another_workers_cap_withheld_goes_out_with_the_groups_last_run(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A worker without a cap ends a run and reads no turn while the group runs others (a run's
    end lifts no pause): a turn a capped worker withheld waits for the group's last run."""
    enqueue(run, qk, *[task("capped") for _ in range(4)])
    a, b = claim(run, qk, count=10, cap=2).runs
    assert turn(r, qk, 5, "capped") == "~"
    assert complete(run, qk, a)  # no cap here: the group still runs b
    assert turn(r, qk, 5, "capped") == "~" and not claim(run, qk, count=10, cap=2).runs
    assert complete(run, qk, b)  # its last run: the turn goes out
    assert len(claim(run, qk, count=10, cap=2).runs) == 2


def test_a_paused_group_holds_only_itself(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    r.sadd(qk.group_paused, "held")
    enqueue(run, qk, *[task("held") for _ in range(3)], *[task("other") for _ in range(3)])
    b = claim(run, qk, count=10)
    assert {r.hget(qk.task(c.tid), "grp") for c in b.runs} == {"other"}
    assert len(b.runs) == 3
    assert r.lrange(qk.group_waiting(5, "held"), 0, 0) == ["~"]  # withheld, 3 tasks behind
    assert r.llen(qk.group_waiting(5, "held")) == 1 + 3


def test_priorities_decide_before_turns(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    enqueue(run, qk, *[task("a") for _ in range(3)])
    urgent = task("b", prio=9)
    enqueue(run, qk, urgent)
    assert claim(run, qk).runs[0].tid == urgent.tid


def test_a_group_is_an_option_of_the_enqueue_call(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    """A task whose only option is its group sends enqueue.lua's 6 fields (with another
    option, one more each); its record holds grp."""
    t = task("acme")
    call = sc.enqueue_call(qk, [t], 100)
    assert call.args[3] == "tid name args prio maxr grp" and len(call.args) == 4 + 6
    run(call)
    assert r.hget(qk.task(t.tid), "grp") == "acme"
    assert turn(r, qk, 5, "acme") == t.tid
    other = task("acme", meta='{"k": 1}')
    call = sc.enqueue_call(qk, [other], 100)
    assert call.args[3] == "tid name args prio maxr meta grp" and len(call.args) == 4 + 7
    run(call)
    assert r.hget(qk.task(other.tid), "grp") == "acme"
    assert r.lrange(qk.group_waiting(5, "acme"), 0, -1) == [t.tid, other.tid]


def hold(run: Any, qk: QueueKeys, group: str, pause: bool) -> int:
    keys = [*qk.streams, qk.group_base, qk.events]
    return int(run(sc.Call("group_hold", keys, [group, "1" if pause else "0", 100])))


def grp_of(r: redis.Redis, qk: QueueKeys, b: sc.ClaimBatch) -> list[str | None]:
    return [r.hget(qk.task(c.tid), "grp") for c in b.runs]


def test_pause_and_resume_one_group(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    enqueue(run, qk, *[task("a") for _ in range(3)], *[task("b") for _ in range(2)])
    assert hold(run, qk, "a", True) == 1 and hold(run, qk, "a", True) == 0
    b = claim(run, qk, count=10)
    assert grp_of(r, qk, b) == ["b", "b"]
    assert turn(r, qk, 5, "a") == "~" and r.llen(qk.group_waiting(5, "a")) == 1 + 3
    enqueue(run, qk, task("a"))  # a paused group's new task waits in its list
    assert r.llen(qk.group_waiting(5, "a")) == 1 + 4
    assert hold(run, qk, "a", False) == 1 and hold(run, qk, "a", False) == 0
    b = claim(run, qk, count=10)
    assert grp_of(r, qk, b) == ["a"] * 4


def test_a_failed_run_retries_through_its_group(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    a2 = task("a")
    enqueue(run, qk, task("a"), a2, task("b"))
    c = claim(run, qk).runs[0]
    assert r.hget(qk.task(c.tid), "grp") == "a"
    f = sc.Failure(c.tid, c.eid, c.attempt, "boom", 0)  # retry now
    assert run(sc.fail_call(qk, "w1", [f], 100, 60)) == ["scheduled"]
    assert not running(r, qk, "a")
    run(sc.promote_call(qk, 100, 100))
    # Back in its group: behind a's turn (a's second task) and b's.
    assert r.lrange(qk.group_waiting(5, "a"), 0, -1) == [a2.tid, c.tid]
    order = [claim(run, qk).runs[0].tid for _ in range(3)]
    assert order[2] == c.tid


def test_a_task_of_group_none_retried_after_the_groups_went_idle_runs_as_a_plain_task(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A task without a group joined group '' while groups were active; when it comes back to
    waiting after every group went idle, it waits as a plain task: its record names no group
    and its run counts in no group (found by make model: a running count of a group that was
    not active)."""
    enqueue(run, qk, task("a"))
    plain = task()
    enqueue(run, qk, plain)
    runs = {c.tid: c for c in claim(run, qk, count=5).runs}
    assert r.hget(qk.task(plain.tid), "grp") == ""
    assert complete(run, qk, next(c for t, c in runs.items() if t != plain.tid))
    c = runs[plain.tid]
    f = sc.Failure(c.tid, c.eid, c.attempt, "boom", 0)  # retry now
    assert run(sc.fail_call(qk, "w1", [f], 100, 60)) == ["scheduled"]
    assert group_keys(r, qk) == []  # every group idle
    run(sc.promote_call(qk, 100, 100))
    assert r.hget(qk.task(plain.tid), "grp") is None
    again = claim(run, qk).runs
    assert [x.tid for x in again] == [plain.tid] and "g" not in again[0].flags
    assert group_keys(r, qk) == []
    assert complete(run, qk, again[0]) and group_keys(r, qk) == []


def test_the_turn_entry_of_a_task_cancelled_and_retried_by_hand_starts_nothing(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """A turn passed on is an entry no record names (group_issue): cancelling its task leaves it
    in the stream. After `dtq retry` puts the task back behind the group's next one, a claim
    that meets the old entry absorbs it: the task starts in its new place, not out of turn."""
    ts = [task("a") for _ in range(3)]
    enqueue(run, qk, *ts)
    assert [c.tid for c in claim(run, qk).runs] == [ts[0].tid]  # ts[1] gets the turn's entry
    assert r.hget(qk.task(ts[1].tid), "eid") is None
    cancel = sc.cancel_call(
        qk, ts[1].tid, events_maxlen=0, ttl_s=60, hint_channel="h", reason="x",
        nonce=sc.new_nonce(),
    )  # fmt: skip
    run(cancel)
    retry = sc.dlq_requeue_call(
        qk, [ts[1].tid], events_maxlen=0, allowed=("cancelled",), nonce=sc.new_nonce()
    )
    assert sc.parse_dlq(run(retry)) == [sc.DlqVerdict.REQUEUED]
    assert r.lrange(qk.group_waiting(5, "a"), 0, -1) == [ts[2].tid, ts[1].tid]
    b = claim(run, qk)
    assert [c.tid for c in b.runs] == [ts[2].tid] and b.absorbed == 1
    assert [c.tid for c in claim(run, qk).runs] == [ts[1].tid]


def test_a_lost_run_goes_back_to_its_group(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    import time

    a2 = task("a")
    enqueue(run, qk, task("a"), a2)
    c = claim(run, qk, w="dead").runs[0]
    time.sleep(0.05)
    run(sc.reclaim_call(qk, "w2", min_idle_ms=10, count=10, events_maxlen=0, ttl_s=60))
    assert r.hget(qk.task(c.tid), "status") == "queued"
    assert not running(r, qk, "a")
    assert r.lrange(qk.group_waiting(5, "a"), 0, -1) == [a2.tid, c.tid]
    assert [x.tid for x in claim(run, qk, count=5).runs][-1] == c.tid


def test_a_handed_back_run_goes_back_to_its_group(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    enqueue(run, qk, task("a"))
    c = claim(run, qk).runs[0]
    call = sc.requeue_call(
        qk,
        "w1",
        [sc.RunRef(c.tid, c.eid, c.attempt)],
        events_maxlen=0,
        ttl_s=60,
        max_interruptions=3,
        retry_delay_ms=0,
        started=False,
    )
    assert run(call) == ["queued"]
    assert turn(r, qk, 5, "a") == c.tid
    assert claim(run, qk).runs[0].tid == c.tid


def test_cancel_passes_the_turn_or_leaves_the_list(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    ts = [task("a") for _ in range(3)]
    enqueue(run, qk, *ts)

    def cancel(tid: str) -> None:
        c = sc.cancel_call(
            qk, tid, events_maxlen=0, ttl_s=60, hint_channel="h", reason="x", nonce=sc.new_nonce()
        )
        run(c)

    cancel(ts[1].tid)  # in the list
    assert r.lrange(qk.group_waiting(5, "a"), 0, -1) == [ts[0].tid, ts[2].tid]
    cancel(ts[0].tid)  # the turn: the next task gets it
    assert r.lrange(qk.group_waiting(5, "a"), 0, -1) == [ts[2].tid]
    assert [c.tid for c in claim(run, qk, count=5).runs] == [ts[2].tid]
    cancel(ts[2].tid)  # running: a request, the run ends it
    assert group_keys(r, qk) == [qk.group_index, qk.group_running("a")]
    assert running(r, qk, "a") == 1


def test_expiry_at_the_claim_passes_the_turn(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    import time

    old, nxt = task("a", expires_ms=1), task("a")
    enqueue(run, qk, old, nxt)
    time.sleep(0.01)
    b = claim(run, qk)
    assert b.expired == 1 and [c.tid for c in b.runs] == [nxt.tid]


def test_expiry_of_a_passed_turn_passes_it_on(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    """A turn passed on (an entry naming its group, no record's eid) whose task expired: the
    claim ends the task and the group's next task gets the turn."""
    import time

    first, old, nxt = task("a"), task("a", expires_ms=1), task("a")
    enqueue(run, qk, first, old, nxt)
    time.sleep(0.01)
    assert [c.tid for c in claim(run, qk).runs] == [first.tid]  # old gets the passed turn
    assert turn(r, qk, 5, "a") == old.tid and r.hget(qk.task(old.tid), "eid") is None
    b = claim(run, qk)
    assert b.expired == 1 and [c.tid for c in b.runs] == [nxt.tid]
    assert r.hget(qk.task(old.tid), "status") == "expired"


def test_a_passed_turn_of_a_paused_group_is_withheld_and_given_back(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """The claim that meets a passed turn (no record's eid) of a paused group puts '~' in front
    of its task at the head of the list; the resume gives it an entry again."""
    ts = [task("a") for _ in range(3)]
    enqueue(run, qk, *ts)
    assert [c.tid for c in claim(run, qk).runs] == [ts[0].tid]
    hold(run, qk, "a", True)
    b = claim(run, qk)
    assert b.runs == [] and b.held == 1
    assert r.lrange(qk.group_waiting(5, "a"), 0, -1) == ["~", ts[1].tid, ts[2].tid]
    assert r.xlen(qk.stream(5)) == 1  # (ts[0]'s, pending)
    hold(run, qk, "a", False)
    assert [c.tid for c in claim(run, qk, count=5).runs] == [ts[1].tid, ts[2].tid]


def test_purge_removes_listed_tasks_and_every_group_key(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    enqueue(run, qk, *[task(f"g{i % 7}") for i in range(60)], *[task() for _ in range(5)])
    hold(run, qk, "g3", True)
    claim(run, qk, count=5)  # g3's turn may be withheld now
    removed = purge_all(run, qk, 10)
    assert removed == 60  # the five running stay
    left = set(group_keys(r, qk))
    assert not any(k.startswith(qk.group_base + "w:") for k in left)
    running = {qk.group_running(g) for g in [f"g{i}" for i in range(7)] + [""]}
    assert left <= {qk.group_index, qk.group_paused} | running


def test_a_limited_task_parked_returns_to_its_group(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    ts = [task("a", limit="1|0|0|k") for _ in range(2)]
    enqueue(run, qk, *ts)
    first = claim(run, qk, count=5)
    assert [c.tid for c in first.runs] == [ts[0].tid] and first.held == 1
    assert r.hget(qk.task(ts[1].tid), "status") == "queued"
    assert complete(run, qk, first.runs[0])  # frees the place: ts[1] goes back to group a
    assert turn(r, qk, 5, "a") == ts[1].tid
    second = claim(run, qk, count=5)
    assert [c.tid for c in second.runs] == [ts[1].tid]
    assert complete(run, qk, second.runs[0])
    assert group_keys(r, qk) == []


def test_a_purge_that_frees_a_limit_place_purges_the_parked_grouped_task_it_would_release(
    r: redis.Redis, run: Any, qk: QueueKeys
) -> None:
    """Found by the model test: purging a task released for a limit's place passed the place
    on within the call, to a grouped task parked behind the limit; the group pass then popped
    that task (which now held its group's turn) off its list, leaving its stream entry without
    a turn. The place passes on at the end of the call, after the parked tasks were purged."""
    plain = [task(limit="1|0|0|k1") for _ in range(2)]
    grouped = task("a", limit="1|0|0|k1")
    enqueue(run, qk, *plain, grouped)
    first = claim(run, qk, count=3)
    assert [c.tid for c in first.runs] == [plain[0].tid] and first.held == 2
    f = sc.Failure(plain[0].tid, first.runs[0].eid, first.runs[0].attempt, "E: boom", None)
    assert sc.parse_verdicts(run(sc.fail_call(qk, "w1", [f], 100, 60))) == ["failed"]
    assert r.hget(qk.task(plain[1].tid), "lown") == "1"  # released for the place, with an entry
    removed = purge_all(run, qk, 100)
    assert removed == 2  # plain[1] and the parked grouped task: every waiting task
    assert not r.exists(qk.task(grouped.tid)) and r.xlen(qk.stream(5)) == 0
    assert group_keys(r, qk) == []


def test_tasks_without_a_group_are_not_capped(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    """The cap is a named group's: with groups active, the plain tasks (group '') still run as
    the slots allow."""
    enqueue(run, qk, task("acme"), *[task() for _ in range(4)])
    b = claim(run, qk, count=10, cap=1)
    groups = [r.hget(qk.task(c.tid), "grp") for c in b.runs]
    assert groups.count("") == 4 and groups.count("acme") == 1
