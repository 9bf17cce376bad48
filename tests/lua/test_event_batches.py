"""Events in batches: a claim writes one ``started`` entry for all the runs it starts, a
completion one entry per outcome status, and every reader (recent events, live reads, a task's
history, the resume after ``Last-Event-ID``, throughput, the SSE frames) gives one event per
task, as if each had its own entry (lua/includes/emit_batch.lua, dtq/admin/views.py
``events_from``)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from dtq import Settings
from dtq import scripts as sc
from dtq.admin import Admin, task_index
from dtq.admin.views import events_from
from dtq.store.keys import QueueKeys, make_task_id, new_tid
from dtq_api.events import _frames
from tests.conftest import create_groups

Q = "default"


def task() -> sc.NewTask:
    return sc.NewTask(new_tid(), "t", "[]", "", 5, 3, None, 0, 0, "", "")


def entries(r: redis.Redis, qk: QueueKeys, etype: str) -> list[dict[str, str]]:
    return [f for _, f in r.xrange(qk.events) if f["type"] == etype]


def run_three(r: redis.Redis, run: Any, qk: QueueKeys) -> list[str]:
    """Three tasks enqueued, then every waiting task claimed by one call and ended by one
    completion: the second cancelled, the rest succeeded. Returns the tids in claim order."""
    create_groups(r, qk)
    run(sc.enqueue_call(qk, [task() for _ in range(3)], 100))
    runs = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 10, 100, 60))).runs
    outs = [
        sc.Success(x.tid, x.eid, x.attempt, "cancelled" if i == 1 else "succeeded", "1")
        for i, x in enumerate(runs)
    ]
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", outs, 100, 60))) == [True] * len(runs)
    return [x.tid for x in runs]


def test_one_entry_per_call_and_status(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    tids = run_three(r, run, qk)
    started = entries(r, qk, "started")
    assert len(started) == 1
    assert started[0]["tid"] == " ".join(tids) and started[0]["attempt"] == "1 1 1"
    assert started[0]["worker"] == "w1" and started[0]["detail"] == ""
    ok = entries(r, qk, "succeeded")
    assert len(ok) == 1 and ok[0]["tid"] == f"{tids[0]} {tids[2]}" and ok[0]["attempt"] == "1 1"
    # An entry of one task keeps the one-event format: no separator.
    assert [(f["tid"], f["attempt"]) for f in entries(r, qk, "cancelled")] == [(tids[1], "1")]
    # A claim of one run writes the one-event format too.
    one = task()  # (the groups exist: run_three made them)
    run(sc.enqueue_call(qk, [one], 100))
    sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 10, 100, 60)))
    assert entries(r, qk, "started")[-1]["tid"] == one.tid


def test_no_events_when_disabled(r: redis.Redis, run: Any, qk: QueueKeys) -> None:
    create_groups(r, qk)
    tasks = [task(), task()]
    run(sc.enqueue_call(qk, tasks, 0))
    runs = sc.parse_claim(Q, run(sc.claim_call(qk, "w1", 10, 0, 60))).runs
    done = [sc.Success(x.tid, x.eid, x.attempt, "succeeded", "1") for x in runs]
    assert sc.parse_complete(run(sc.complete_call(qk, "w1", done, 0, 60))) == [True, True]
    assert r.xlen(qk.events) == 0


def test_events_from_splits_a_batch_in_order() -> None:
    f = {"type": "started", "tid": "a b c", "attempt": "1 2 1", "worker": "w", "detail": ""}
    evs = events_from("q~1", "5-0", f)
    assert [(e.task_id, e.attempt, e.worker, e.id) for e in evs] == [
        (make_task_id("q~1", t), n, "w", "5-0") for t, n in (("a", 1), ("b", 2), ("c", 1))
    ]
    assert {e.queue for e in evs} == {"q"}
    single = events_from("q", "6-0", {"type": "enqueued", "tid": "a", "attempt": "0"})
    assert [(e.task_id, e.attempt) for e in single] == [("q:a", 0)]


async def test_every_reader_gives_one_event_per_task(
    settings: Settings, r: redis.Redis, run: Any
) -> None:
    qk = QueueKeys(settings.key_prefix, Q)
    async with Admin(settings) as a:
        await a.client.enqueue("noop")  # registers the queue
        _, cursors = await a.read_events(None, block_ms=0)
        tids = run_three(r, run, qk)  # the noop task above is the first of 4 runs
        ids = [make_task_id(Q, t) for t in tids]
        live, _ = await a.read_events(cursors, block_ms=0)
        assert [(e.type, e.task_id) for e in live if e.type != "enqueued"] == [
            *[("started", i) for i in ids],
            *[("succeeded", i) for i in ids if i != ids[1]],
            ("cancelled", ids[1]),
        ]
        recent = await a.recent_events(queues=[Q])
        assert sum(e.type == "started" and e.task_id in ids for e in recent) == 4
        history = await a.task_history(ids[-1])
        assert [(e.type, e.attempt) for e in history] == [
            ("enqueued", 0), ("started", 1), ("succeeded", 1),
        ]  # fmt: skip
        tp = await a.throughput(window_s=60, bucket_s=60)
        assert sum(tp["series"]["succeeded"]) == 3
        assert sum(tp["series"]["enqueued"]) == 4


async def test_resume_never_cuts_an_entry(settings: Settings, r: redis.Redis, run: Any) -> None:
    qk = QueueKeys(settings.key_prefix, Q)
    async with Admin(settings) as a:
        await a.client.enqueue("noop")
        before = r.xrevrange(qk.events, count=1)[0][0]
        run_three(r, run, qk)
        started_id = next(i for i, f in r.xrange(qk.events) if f["type"] == "started")
        # A limit that falls inside the "started" entry (3 enqueued events, then 4 started):
        # the answer ends before that entry, and says that more were left out.
        got, more = await a.events_after(before, limit=4)
        assert more and [e.type for e in got] == ["enqueued"] * 3
        # Resuming after the last id sent gets the whole entry (the noop task's run too).
        got, more = await a.events_after(got[-1].id, limit=5000)
        assert [e.type for e in got[:4]] == ["started"] * 4
        assert {e.id for e in got[:4]} == {started_id}


def test_sse_frames_carry_an_entry_id_on_its_last_event_only() -> None:
    f = {"type": "started", "tid": "a b", "attempt": "1 1", "worker": "w", "detail": ""}
    evs = events_from("q", "7-0", f) + events_from("q", "7-1", {"type": "x", "tid": "c"})
    frames = [frame.decode() for _, frame in _frames(evs)]
    assert [fr.startswith("id: ") for fr in frames] == [False, True, True]
    assert frames[1].startswith("id: 7-0\n") and frames[2].startswith("id: 7-1\n")


def test_task_list_cursor_names_a_place_inside_a_bulk_entry() -> None:
    # A bulk enqueue's tids share one entry: the cursor adds the index (the form without one,
    # index 0, is the one-event entries' and stays valid).
    assert task_index.parse_cursor("12.3.q") == (12, 3, "q", 0)
    assert task_index.make_cursor((12, 3, "q", 2)) == "12.3-2.q"
    assert task_index.parse_cursor("12.3-2.q.x") == (12, 3, "q.x", 2)
    assert task_index.make_cursor((12, 3, "q", 0)) == "12.3.q"
    with pytest.raises(ValueError):
        task_index.parse_cursor("12.3-x.q")
