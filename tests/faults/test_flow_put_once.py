"""A workflow step on another queue than its flow's home is put there from the home's outbox
(docs/workflows.md, "Redis Cluster"). Every late or repeated move of that put (the client
moved it at once and a worker moves it again; a mover killed between its move and its XACK,
its entry taken over later; a cancelled flow's put) must start nothing, also after the step's
record, the flow's state and a cancel's tombstone expired (DTQ_RESULT_TTL_S): the "put done"
fact lives on the step's queue until the outbox entry is gone."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import pytest
import redis

from dtq import Client, Settings, chain, group, sig
from dtq import scripts as sc
from dtq import workflows as wf
from dtq.store.keys import Keys, split_task_id
from tests.apps.flows import app
from tests.conftest import running_worker, wait_until
from tests.helpers.flows import (
    claim,
    complete,
    qk_of,
)


@pytest.fixture
def client(settings: Settings) -> Any:
    with Client(settings=settings) as c:
        yield c


def outbox(r: redis.Redis, settings: Settings, queue: str) -> list[tuple[str, dict[str, str]]]:
    return r.xrange(qk_of(settings, queue).flowq)  # type: ignore[return-value]


def move_notes(r: redis.Redis, settings: Settings, queue: str) -> None:
    """Move the step outcomes ("note") of queue's outbox to their flows, as a mover does."""
    run = sc.SyncScripts(r).run
    for eid, fields in outbox(r, settings, queue):
        if fields["k"] == "note":
            call = wf.handover_call(Keys(settings.key_prefix), settings, fields)
            assert call is not None
            run(call)
            r.xdel(qk_of(settings, queue).flowq, eid)


def move_put(r: redis.Redis, settings: Settings, fields: dict[str, str]) -> Any:
    call = wf.handover_call(Keys(settings.key_prefix), settings, fields)
    assert call is not None
    return sc.SyncScripts(r).run(call)


def expire_now(r: redis.Redis, *keys: str) -> None:
    """What DTQ_RESULT_TTL_S does to an ended record (or flow, or tombstone) in the end."""
    for k in keys:
        assert r.ttl(k) > 0, k  # it had a TTL: the expiry is what the test anticipates
        r.delete(k)


@pytest.mark.cluster
def test_a_first_step_put_again_after_its_record_expired_does_not_start_again(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """group(a, b@other): b is put by the client at once and its entry stays in the home's
    outbox until a worker of the home queue moves it. The home's workers are away until b
    ran, its flow ended and both expired; then the move must create nothing."""
    h = client.enqueue_workflow(group(sig("a"), sig("b", queue="other")))
    home, ftid = split_task_id(h.id)
    [(_, put)] = outbox(r, settings, home)
    assert put["k"] == "put"
    [b] = claim(r, settings, "other")  # the client's own move created it
    assert complete(r, settings, "other", b, 2)
    move_notes(r, settings, "other")
    [a] = claim(r, settings, home)
    assert complete(r, settings, home, a, 1)
    assert client.result(h.id, timeout=1) == [1, 2]
    expire_now(r, qk_of(settings, "other").task(b.tid), qk_of(settings, home).flow(ftid))
    assert sc.parse_created(move_put(r, settings, put)) is sc.Created.EXISTED
    assert claim(r, settings, "other") == []  # attempt 1 of b started once


def test_a_retried_client_put_after_the_record_expired_creates_nothing(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """The client's own move re-sent (a lost reply) after the step ended and expired."""
    h = client.enqueue_workflow(group(sig("a"), sig("b", queue="other")))
    [(_, put)] = outbox(r, settings, split_task_id(h.id)[0])
    [b] = claim(r, settings, "other")
    assert complete(r, settings, "other", b, 2)
    expire_now(r, qk_of(settings, "other").task(b.tid))
    other = qk_of(settings, "other")
    again = sc.flow_put_call(other, put["spec"], put["args"], 100)
    assert sc.parse_created(sc.SyncScripts(r).run(again)) is sc.Created.EXISTED
    assert claim(r, settings, "other") == []


@pytest.mark.cluster
def test_a_cancelled_flows_put_moved_after_its_tombstone_expired_starts_nothing(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """chain(a, b@other): a succeeded, b's put waits in the home's outbox; the flow is
    cancelled (b gets a tombstone record), then the flow and the tombstone expire before a
    worker of the home moves the put: b must never start."""
    h = client.enqueue_workflow(chain(sig("a"), sig("b", queue="other")))
    home, ftid = split_task_id(h.id)
    [a] = claim(r, settings, home)
    assert complete(r, settings, home, a, 1)
    [(_, put)] = outbox(r, settings, home)
    assert put["k"] == "put"
    assert client.cancel(h.id) is True
    b_tid = json.loads(put["spec"])[1]
    expire_now(r, qk_of(settings, "other").task(b_tid), qk_of(settings, home).flow(ftid))
    assert sc.parse_created(move_put(r, settings, put)) is sc.Created.EXISTED
    assert claim(r, settings, "other") == []
    assert not r.exists(qk_of(settings, "other").task(b_tid))


async def test_a_put_whose_mover_died_before_its_xack_is_taken_over_after_the_ttl(
    settings: Settings,
) -> None:
    """A mover read the put of chain(a, b@other), moved it (b created) and was killed before
    its XACK. b ran and ended, its record expired. A worker of the home queue then takes the
    entry over (after the visibility timeout) and moves it again: b must not be created
    again. Once the entry is acknowledged, the step's put marker gets a TTL."""
    s = settings.model_copy(update={"queues": ["default"]})
    r = redis.Redis.from_url(s.redis_url, decode_responses=True)
    keys = Keys(s.key_prefix)
    home, other = keys.queue("default"), keys.queue("other")
    c = Client(settings=s)
    h = c.enqueue_workflow(chain(sig("a"), sig("b", queue="other")))
    [a] = claim(r, s, "default")
    assert complete(r, s, "default", a, 1)
    r.xgroup_create(home.flowq, "movers", id="0", mkstream=True)
    got: Any = r.xreadgroup("movers", "ghost", {home.flowq: ">"}, count=10)
    [(_, [(_, put)])] = got  # pending to "ghost", which moves it and dies before its XACK
    assert sc.parse_created(move_put(r, s, put)) is sc.Created.CREATED
    [b] = claim(r, s, "other")
    assert complete(r, s, "other", b, 2)
    move_notes(r, s, "other")
    assert c.result(h.id, timeout=1) == 2
    c.close()
    expire_now(r, other.task(b.tid))
    async with running_worker(app, s):
        await asyncio.to_thread(wait_until, lambda: r.xlen(home.flowq) == 0, 20)
    assert not r.exists(other.task(b.tid))  # moved again: nothing created
    assert claim(r, s, "other") == []
    marker = other.flow_put(b.tid)
    assert r.ttl(marker) > 0  # kept a while after its entry is gone, then expires


def test_worker_processes_start_a_cross_queue_first_step_once_when_the_home_comes_late(
    settings: Settings, spawn_worker: Any
) -> None:
    """Real workers: one of queue "other" runs b of group(a, b@other) (put by the client) and
    stops; b's record expires; then a worker of both queues comes and moves the home's
    outbox. b's body starts once."""
    r = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = Keys(settings.key_prefix)
    with Client(settings=settings) as c:
        h = c.enqueue_workflow(group(sig("ident", [0]), sig("ident", [1], queue="other")))
        home, ftid = split_task_id(h.id)
        steps = c.get(h.id).steps
        assert steps is not None
        a_id, b_id = steps[0]["id"], steps[1]["id"]
        b_key = keys.queue("other").task(split_task_id(b_id)[1])
        w1 = spawn_worker("tests.apps.flows:app", settings, DTQ_QUEUES="other")
        wait_until(lambda: r.hexists(keys.queue(home).flow(ftid), "r1"), 30)
        w1.signal(signal.SIGTERM)
        assert w1.wait(30) == 0
        expire_now(r, b_key)
        spawn_worker("tests.apps.flows:app", settings, DTQ_QUEUES="default,other")
        assert c.result(h.id, timeout=30) == [0, 1]
        wait_until(lambda: r.xlen(keys.queue(home).flowq) == 0, 30)  # the put moved again
    assert not r.exists(b_key)  # not created again
    starts = [x.split("|")[0] for x in r.lrange(f"{settings.key_prefix}:test:fstarts", 0, -1)]
    assert sorted(starts) == sorted([a_id, b_id])  # each step's attempt 1 started once


def test_a_put_moved_between_a_cancels_step_cancel_and_its_tombstone_is_cancelled(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    """cancel(flow) found b missing on its queue, then a mover put b there before the
    cancel's tombstone: the tombstone finds the record, so the cancel cancels b as a task."""
    run = sc.SyncScripts(r).run
    h = client.enqueue_workflow(chain(sig("a"), sig("b", queue="other")))
    [a] = claim(r, settings, "default")
    assert complete(r, settings, "default", a, 1)
    [(_, put)] = outbox(r, settings, "default")
    steps = client._cancel_steps(h.id, "stop")  # the cancel's calls, sent one by one here
    call = next(steps)  # flow_cancel.lua
    call = steps.send(run(call))  # cancel.lua of b: missing
    reply = run(call)
    assert sc.parse_cancel(reply).outcome is sc.CancelOutcome.MISSING
    assert sc.parse_created(move_put(r, settings, put)) is sc.Created.CREATED  # the mover
    call = steps.send(reply)  # flow_tomb.lua
    assert call.script == "flow_tomb"
    with pytest.raises(StopIteration):
        while True:
            call = steps.send(run(call))
    assert claim(r, settings, "other") == []  # b was cancelled, not left to run
