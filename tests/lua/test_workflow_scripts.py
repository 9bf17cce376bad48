"""The workflow transitions on a real Redis, driven by hand: enqueue, join, replay, stale,
races, failure, resume, cancel, and the cross-slot handover (docs/workflows.md)."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import pytest
import redis

from dtq import Client, InvalidRequest, Settings, TaskFailed, chain, chord, group, sig
from dtq import scripts as sc
from dtq import workflows as wf
from dtq.scripts import dlq_requeue_call
from dtq.store.keys import Keys, split_task_id
from tests.helpers.flows import W, args_of, claim, complete, fail, outbox, qk_of


@pytest.fixture
def client(settings: Settings) -> Any:
    with Client(settings=settings) as c:
        yield c


def test_chain_passes_each_result_on_and_ends_with_the_last(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chain(sig("a", [1]), sig("b", [10]), sig("c")))
    assert split_task_id(h.id)[1].startswith("wf") and h.created
    [a] = claim(r, settings, "default")  # only the first step exists yet
    assert a.name == "a" and claim(r, settings, "default") == []
    assert client.get(h.id).status == "running"
    assert complete(r, settings, "default", a, 2)
    [b] = claim(r, settings, "default")
    assert b.name == "b" and args_of(r, settings, "default", b) == [2, 10]
    # A step's record leaves its defaults out, as an enqueued task's (the claim wrote attempt).
    stored = set(r.hkeys(qk_of(settings, "default").task(b.tid)))
    assert {"retries", "intr", "prio", "maxr"}.isdisjoint(stored) and "attempt" in stored
    assert (b.priority, b.max_retries, b.retries) == (5, 3, 0)
    assert complete(r, settings, "default", b, {"x": 12})
    [c] = claim(r, settings, "default")
    assert args_of(r, settings, "default", c) == [{"x": 12}]
    assert complete(r, settings, "default", c, "done")
    info = client.get(h.id)
    assert info.status == "succeeded" and info.result == "done"
    assert info.steps is not None and [s["status"] for s in info.steps] == ["succeeded"] * 3
    assert client.result(h.id, timeout=1) == "done"
    assert client.get(f"default:{b.tid}").flow == h.id  # a step names its flow
    # Events carry the flow id: each step's enqueue and outcome, and the flow's own.
    qk = qk_of(settings, "default")
    events = [f for _, f in r.xrange(qk.events)]  # type: ignore[misc]
    assert {
        (e["type"], e["detail"]) for e in events if e["tid"] == b.tid and e["type"] == "succeeded"
    } == {("succeeded", f"flow {h.id} step 1")}
    assert [e.get("flow") for e in events if e["tid"] == c.tid and e["type"] == "enqueued"] == [
        h.id
    ]
    ftid = split_task_id(h.id)[1]
    assert [e["type"] for e in events if e["tid"] == ftid] == ["flow_enqueued", "flow_succeeded"]


def test_chord_callback_gets_results_in_member_order_once(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chord(group(*(sig("m", [i]) for i in range(5))), sig("total")))
    runs = claim(r, settings, "default")
    assert sorted(json.loads(r.hget(qk_of(settings, "default").task(x.tid), "args"))[0]
                  for x in runs) == [0, 1, 2, 3, 4]  # fmt: skip
    by_arg = {args_of(r, settings, "default", x)[0]: x for x in runs}
    for i in (4, 2, 0, 3):  # out of order
        assert complete(r, settings, "default", by_arg[i], i * 10)
    assert claim(r, settings, "default") == []  # the callback waits for member 1
    # Replay: member 4's outcome written again (a lost reply) counts nothing twice.
    assert complete(r, settings, "default", by_arg[4], 40)
    assert claim(r, settings, "default") == []
    assert complete(r, settings, "default", by_arg[1], 10)
    [cb] = claim(r, settings, "default")
    assert cb.name == "total" and args_of(r, settings, "default", cb) == [[0, 10, 20, 30, 40]]
    assert claim(r, settings, "default") == []  # exactly one callback
    assert complete(r, settings, "default", cb, 100)
    assert client.result(h.id, timeout=1) == 100


def test_stale_write_of_a_member_does_not_count(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chord(group(sig("m", [1]), sig("m", [2])), sig("total")))
    m1, m2 = claim(r, settings, "default")
    # A writer that does not hold the run (another worker, an old attempt) is rejected.
    assert not complete(r, settings, "default", m1, 1, worker="intruder")
    # So is an earlier attempt's late write.
    assert not complete(r, settings, "default", dataclasses.replace(m1, attempt=0), 1)
    fk = qk_of(settings, "default").flow(split_task_id(h.id)[1])
    assert r.hget(fk, "left") == "3" and not r.hexists(fk, "r0")
    assert complete(r, settings, "default", m1, 1) and complete(r, settings, "default", m2, 2)
    [cb] = claim(r, settings, "default")
    assert args_of(r, settings, "default", cb) == [[1, 2]]


def test_two_members_finishing_at_once_release_the_callback_once(
    r: redis.Redis, redis_server: Any, settings: Settings, client: Client
) -> None:
    """A real race: many pairs of members complete from two threads on two connections."""
    for _ in range(20):
        h = client.enqueue_workflow(chord(group(sig("m", [1]), sig("m", [2])), sig("total")))
        m1, m2 = claim(r, settings, "default")
        barrier = threading.Barrier(2)
        oks: list[bool] = []

        def go(c: sc.Claimed, v: int, barrier: threading.Barrier, oks: list[bool]) -> None:
            conn = redis_server.client()
            barrier.wait()
            oks.append(complete(conn, settings, "default", c, v))
            conn.close()

        ts = [threading.Thread(target=go, args=(m, v, barrier, oks)) for m, v in ((m1, 1), (m2, 2))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert oks == [True, True]
        [cb] = claim(r, settings, "default")
        assert args_of(r, settings, "default", cb) == [[1, 2]]
        assert complete(r, settings, "default", cb, 3)
        assert client.get(h.id).status == "succeeded"


def test_failed_step_fails_the_flow_and_a_requeue_from_the_dlq_resumes_it(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chain(sig("a"), group(sig("b"), sig("c")), sig("d")))
    [a] = claim(r, settings, "default")
    assert complete(r, settings, "default", a, 1)
    b, c = sorted(claim(r, settings, "default"), key=lambda x: x.name)
    assert args_of(r, settings, "default", b) == [1] == args_of(r, settings, "default", c)
    assert fail(r, settings, "default", b, "ValueError: boom") == "failed"
    info = client.get(h.id)
    assert info.status == "failed" and info.error is not None
    assert "step 1" in info.error and b.tid in info.error and "boom" in info.error
    with pytest.raises(TaskFailed):
        client.result(h.id, timeout=1)
    assert complete(r, settings, "default", c, 3)
    assert claim(r, settings, "default") == []  # d never starts while the flow is failed
    # An operator requeues b from the dead-letter queue; it runs again and succeeds.
    qk = qk_of(settings, "default")
    sc.SyncScripts(r).run(dlq_requeue_call(qk, [b.tid], events_maxlen=100))
    assert r.hget(qk.task(b.tid), "status") == "queued"
    [b2] = claim(r, settings, "default")
    assert b2.tid == b.tid
    assert complete(r, settings, "default", b2, 2)
    [d] = claim(r, settings, "default")
    assert args_of(r, settings, "default", d) == [[2, 3]]
    assert complete(r, settings, "default", d, "ok")
    assert client.result(h.id, timeout=1) == "ok"


def test_cancel_stops_waiting_steps_and_cancels_queued_ones(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chain(group(sig("a"), sig("b")), sig("c")))
    a, b = claim(r, settings, "default")
    h2 = client.enqueue_workflow(chain(sig("x"), sig("y")))
    assert client.cancel(h.id) is True
    assert client.get(h.id).status == "cancelled"
    qk = qk_of(settings, "default")
    assert r.hget(qk.task(a.tid), "cancel") and r.hget(qk.task(b.tid), "cancel")
    assert complete(r, settings, "default", a, 1) and complete(r, settings, "default", b, 2)
    [x] = claim(r, settings, "default")  # c never starts; the other flow goes on
    assert x.name == "x"
    assert client.cancel(h2.id) is True
    assert r.hget(qk.task(x.tid), "cancel")
    # a queued step of a cancelled flow ends cancelled at once
    h3 = client.enqueue_workflow(chain(sig("p"), sig("q")))
    assert client.cancel(h3.id)
    info = client.get(h3.id)
    assert info.status == "cancelled" and info.steps is not None
    assert [s["status"] for s in info.steps] == ["cancelled", "waiting"]
    with pytest.raises(TaskFailed):
        client.result(h3.id, timeout=1)


def test_cross_slot_handover_is_moved_exactly_once(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """A step on another queue (another slot on a cluster) is released through the home's
    outbox and reports back through its own; moving either twice changes nothing."""
    run = sc.SyncScripts(r).run
    h = client.enqueue_workflow(chain(sig("a"), sig("b", queue="other"), sig("c")))
    home, ftid = split_task_id(h.id)
    assert home == "default"
    [a] = claim(r, settings, "default")
    assert complete(r, settings, "default", a, 1)
    [put] = outbox(r, settings, "default")
    assert put["k"] == "put" and json.loads(put["args"]) == [1]
    other = qk_of(settings, "other")
    assert sc.parse_created(run(sc.flow_put_call(other, put["spec"], put["args"], 100))) is (
        sc.Created.CREATED
    )
    again = run(sc.flow_put_call(other, put["spec"], put["args"], 100))
    assert sc.parse_created(again) is sc.Created.EXISTED  # moved again: no-op
    [b] = claim(r, settings, "other")
    assert claim(r, settings, "other") == [] and b.name == "b"
    assert complete(r, settings, "other", b, 2)
    assert complete(r, settings, "other", b, 2)  # a re-sent outcome: no second note
    [note] = outbox(r, settings, "other")
    assert note["k"] == "note" and note["s"] == "succeeded" and note["p"] == "2"
    nhome, nftid, step = wf.parse_flow_key(settings.key_prefix, note["f"])
    assert (nhome, nftid, step) == (home, ftid, "1")
    hk = qk_of(settings, home)
    apply = sc.flow_apply_call(hk, ftid, step, "succeeded", note["p"], 100, 60)
    assert sc.parse_applied(run(apply)) is sc.Applied.APPLIED
    assert sc.parse_applied(run(apply)) is sc.Applied.NOT_APPLIED
    [c] = claim(r, settings, "default")
    assert claim(r, settings, "default") == [] and args_of(r, settings, "default", c) == [2]
    assert complete(r, settings, "default", c, 3)
    assert client.result(h.id, timeout=1) == 3


def test_enqueue_workflow_is_validated_before_anything_is_sent(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    from dtq import InvalidRequest, SerializationError

    before = r.dbsize()
    with pytest.raises(InvalidRequest):
        client.enqueue_workflow(chain(sig("a"), sig("b", queue="bad queue")))
    with pytest.raises(SerializationError):
        client.enqueue_workflow(group(sig("a"), sig("b", [object()])))
    with pytest.raises(InvalidRequest):
        sig("a", idempotency_key="k")
    with pytest.raises(InvalidRequest):
        group()
    assert r.dbsize() == before
    # A re-send of the same enqueue (a lost reply) creates nothing twice.
    p = wf.plan(chain(sig("a"), sig("b")), settings)
    call, _ = wf.enqueue_call(Keys(settings.key_prefix), p, 100)
    run = sc.SyncScripts(r).run
    assert run(call) == ["running", 1] and run(call) == ["running", 0]
    assert len(claim(r, settings, "default")) == 1


def test_dtq_task_draws_the_flow_tree_and_the_api_form_has_steps(
    r: redis.Redis, settings: Settings, client: Client, capsys: Any, monkeypatch: Any
) -> None:
    from dtq.cli import main

    h = client.enqueue_workflow(chain(sig("a"), group(sig("b"), chain(sig("c"), sig("d")))))
    [a] = claim(r, settings, "default")
    assert complete(r, settings, "default", a, 1)
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["task", h.id, "--no-history"])
    out = capsys.readouterr().out
    assert exc.value.code in (0, None)
    lines = out[out.index("steps:") :].splitlines()[1:8]
    ids = [x["id"] for x in client.get(h.id).steps or []]
    assert [ln.rstrip() for ln in lines] == [
        "  chain",
        f"  ├─ [0] a succeeded  {ids[0]}",
        "  └─ group",
        f"     ├─ [1] b queued  {ids[1]}",
        "     └─ chain",
        f"        ├─ [2] c queued  {ids[2]}",
        f"        └─ [3] d waiting  {ids[3]}",
    ]
    d = client.get(h.id).to_dict()
    assert d["status"] == "running" and [s["status"] for s in d["steps"]] == [
        "succeeded", "queued", "queued", "waiting",
    ]  # fmt: skip
    assert d["tree"] == {"chain": [0, {"group": [1, {"chain": [2, 3]}]}]}


def test_cancelling_one_queued_step_cancels_its_flow(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chord(group(sig("a"), sig("b")), sig("c")))
    info = client.get(h.id)
    assert info.steps is not None
    assert client.cancel(info.steps[1]["id"]) is True
    info = client.get(h.id)
    assert info.status == "cancelled" and "step 1" in (info.error or "")
    [a] = claim(r, settings, "default")
    assert complete(r, settings, "default", a, 1)
    assert claim(r, settings, "default") == []  # the callback never starts
    with pytest.raises(InvalidRequest):
        client.enqueue_workflow(chain(sig("a", unique=True), sig("b")))


def test_dtq_cancel_takes_a_flow_id(
    r: redis.Redis, settings: Settings, client: Client, capsys: Any, monkeypatch: Any
) -> None:
    from dtq.cli import main

    h = client.enqueue_workflow(chain(sig("a"), sig("b")))
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)
    with pytest.raises(SystemExit) as exc:
        main(["cancel", h.id])
    assert exc.value.code in (0, None), capsys.readouterr()
    info = client.get(h.id)
    assert info.status == "cancelled" and info.steps is not None
    assert [s["status"] for s in info.steps] == ["cancelled", "waiting"]


def test_a_step_lost_past_its_budget_or_handed_back_cancelled_ends_its_flow(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """The other ways a step ends: reclaim ("worker lost", no retry left) fails the flow,
    on another queue through the outbox; a hand-back of a run whose cancel was requested
    cancels it."""
    run = sc.SyncScripts(r).run
    flow = chord(group(sig("x"), sig("a", max_retries=0, queue="other")), sig("b"))
    h = client.enqueue_workflow(flow)
    assert split_task_id(h.id)[0] == "default"  # the home; a's first move was the client's
    [a] = claim(r, settings, "other")
    assert a.name == "a"
    other = qk_of(settings, "other")
    call = sc.reclaim_call(other, "reaper", min_idle_ms=0, count=10, events_maxlen=100, ttl_s=60)
    assert sc.parse_reclaim(run(call)).failed == 1
    [note] = outbox(r, settings, "other")
    assert note["s"] == "failed" and "worker lost" in note["p"]
    home, ftid, step = wf.parse_flow_key(settings.key_prefix, note["f"])
    run(sc.flow_apply_call(qk_of(settings, home), ftid, step, note["s"], note["p"], 100, 60))
    info = client.get(h.id)
    assert info.status == "failed" and "worker lost" in (info.error or "")

    h2 = client.enqueue_workflow(chain(sig("c"), sig("d")))
    [c] = [x for x in claim(r, settings, "default") if x.name == "c"]  # (x: the first flow's)
    qk = qk_of(settings, "default")
    r.hset(qk.task(c.tid), "cancel", "stop it")  # the durable flag, as cancel.lua sets it
    ref = sc.RunRef(c.tid, c.eid, c.attempt)
    call = sc.requeue_call(qk, W, [ref], events_maxlen=100, ttl_s=60, max_interruptions=3,
                           retry_delay_ms=0)  # fmt: skip
    assert sc.parse_verdicts(run(call)) == ["cancelled"]
    info = client.get(h2.id)
    assert info.status == "cancelled" and "stop it" in (info.error or "")
    assert claim(r, settings, "default") == []


def test_cancel_wins_over_a_cross_slot_release_still_in_an_outbox(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """A flow cancelled while its released step's "put" waits in the home's outbox: moving
    the put afterwards creates nothing, the step never runs."""
    run = sc.SyncScripts(r).run
    h = client.enqueue_workflow(chain(sig("a"), sig("b", queue="other")))
    [a] = claim(r, settings, "default")
    assert complete(r, settings, "default", a, 1)
    [put] = outbox(r, settings, "default")  # b is released, not yet on its queue
    assert client.cancel(h.id) is True
    other = qk_of(settings, "other")
    assert run(sc.flow_put_call(other, put["spec"], put["args"], 100)) == 0
    assert claim(r, settings, "other") == []
    info = client.get(h.id)
    assert info.status == "cancelled" and info.steps is not None
    assert [s["status"] for s in info.steps] == ["succeeded", "cancelled"]


def test_a_step_that_expires_at_its_claim_fails_its_flow(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """A declared expiry (the worker's @app.task(expires=...)) ends a waiting step "expired"
    at its claim: its flow fails then, in the claim's call, rather than staying running."""
    h = client.enqueue_workflow(chain(sig("a"), sig("b")))
    qk = qk_of(settings, "default")
    info = client.get(h.id)
    assert info.steps is not None
    _, tid = split_task_id(info.steps[0]["id"])
    r.hset(qk.task(tid), "exp", "1")  # its expiry passed (as a declared one fills it in)
    assert claim(r, settings, "default") == []
    assert r.hget(qk.task(tid), "status") == "expired"
    info = client.get(h.id)
    assert info.status == "failed" and "expired" in (info.error or "")
    with pytest.raises(TaskFailed):
        client.result(h.id, timeout=1)


def test_steps_made_ready_while_the_flow_is_failed_wait_for_its_resume(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(group(chain(sig("a"), sig("b")), chain(sig("c"), sig("d"))))
    a, c = sorted(claim(r, settings, "default"), key=lambda x: x.name)
    assert fail(r, settings, "default", a, "boom") == "failed"
    assert complete(r, settings, "default", c, 3)
    assert claim(r, settings, "default") == []  # d is ready but held: the flow failed
    info = client.get(h.id)
    assert info.status == "failed" and info.steps is not None
    assert [s["status"] for s in info.steps] == ["failed", "waiting", "succeeded", "waiting"]
    qk = qk_of(settings, "default")
    sc.SyncScripts(r).run(dlq_requeue_call(qk, [a.tid], events_maxlen=100))
    [a2] = claim(r, settings, "default")
    assert complete(r, settings, "default", a2, 1)  # resumes: releases b, and the held d
    b, d = sorted(claim(r, settings, "default"), key=lambda x: x.name)
    assert (b.name, d.name) == ("b", "d")
    assert args_of(r, settings, "default", b) == [1] and args_of(r, settings, "default", d) == [3]
    assert complete(r, settings, "default", b, 2) and complete(r, settings, "default", d, 4)
    assert client.result(h.id, timeout=1) == [2, 4]


def test_a_step_by_name_records_what_it_left_to_the_declaration(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """A step enqueued by name names the values it left to the worker's declaration in its
    spec's own field: its record holds them as dflt (and max_retries as a plain number, left
    out at dtq's default) until the first claim fills them (dtq.declared)."""
    h = client.enqueue_workflow(chain(sig("a", [1]), sig("b", max_retries=7)))
    qk = qk_of(settings, "default")
    [tid] = [k.rsplit(":", 1)[1] for k in r.scan_iter(qk.task("*")) if r.hget(k, "flow")]
    rec = r.hgetall(qk.task(tid))
    assert rec["dflt"] == "mte" and "maxr" not in rec and rec["name"] == "a"
    [a] = claim(r, settings, "default")
    assert r.hget(qk.task(a.tid), "dflt") == "" and a.max_retries == 3
    assert complete(r, settings, "default", a, 2)
    [b] = claim(r, settings, "default")
    assert b.max_retries == 7 and r.hget(qk.task(b.tid), "maxr") == "7"
    assert client.get(h.id).status == "running"
