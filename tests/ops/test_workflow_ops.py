"""Workflows meet the rest of dtq: purge and the dead-letter queue end a flow, a flow cancel
re-sent after a lost reply, before_enqueue middleware on every step, the payload limit of a
released step, and the typed partial signature ``task.p`` (docs/workflows.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from dtq import (
    App,
    AsyncClient,
    Client,
    InvalidRequest,
    Settings,
    TaskFailed,
    chain,
    chord,
    group,
    sig,
)
from dtq import scripts as sc
from dtq import workflows as wf
from dtq.admin import Admin
from dtq.middleware import EnqueueRequest, Middleware
from dtq.scripts import dlq_discard_call
from dtq.store.keys import split_task_id
from tests.chaos.proxy import Proxy
from tests.conftest import make_settings
from tests.helpers.flows import args_of, claim, complete, fail, outbox, qk_of
from tests.redis_server import RedisServer, free_port


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    with Client(settings=settings) as c:
        yield c


def step_ids(client: Client, flow_id: str) -> list[str]:
    info = client.get(flow_id)
    assert info.steps is not None
    return [s["id"] for s in info.steps]


# --- purge and the dead-letter queue ---------------------------------------------------------


async def test_purging_a_flows_queued_step_cancels_the_flow(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chain(sig("a"), sig("b")))
    async with Admin(settings) as admin:
        res = await admin.purge("default")
    assert res.done == 1
    info = client.get(h.id)
    assert info.status == "cancelled", info
    assert info.error is not None and "step 0" in info.error and "purged" in info.error
    with pytest.raises(TaskFailed):
        client.result(h.id, timeout=5)  # returns at once: no hang
    assert claim(r, settings, "default") == []  # b never starts
    assert r.ttl(qk_of(settings, "default").flow(split_task_id(h.id)[1])) > 0


async def test_purging_a_step_on_another_queue_cancels_the_flow_through_the_outbox(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chord(group(sig("a"), sig("b", queue="other")), sig("c")))
    [a] = claim(r, settings, "default")
    async with Admin(settings) as admin:
        res = await admin.purge("other")
    assert res.done == 1
    [note] = outbox(r, settings, "other")
    assert note["k"] == "note" and note["s"] == "cancelled"
    call = wf.handover_call(client.keys, settings, note)
    assert call is not None and sc.SyncScripts(r).run(call) == 1
    assert client.get(h.id).status == "cancelled"
    assert complete(r, settings, "default", a, 1)
    assert claim(r, settings, "default") == []  # the callback never starts
    with pytest.raises(TaskFailed):
        client.result(h.id, timeout=5)


def test_discarding_a_failed_step_leaves_its_flow_failed_for_good(
    r: redis.Redis, settings: Settings, client: Client
) -> None:
    h = client.enqueue_workflow(chain(sig("a"), sig("b")))
    [a] = claim(r, settings, "default")
    assert fail(r, settings, "default", a, "ValueError: boom") == "failed"
    qk = qk_of(settings, "default")
    out = sc.SyncScripts(r).run(dlq_discard_call(qk, [a.tid], events_maxlen=100))
    assert out == ["discarded"]
    info = client.get(h.id)
    assert info.status == "failed" and "boom" in (info.error or "")
    with pytest.raises(TaskFailed):
        client.result(h.id, timeout=5)
    assert r.ttl(qk.flow(split_task_id(h.id)[1])) > 0  # it expires as any failed flow


# --- a flow cancel re-sent after a lost reply --------------------------------------------------


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[Proxy]:
    r = redis_server.client()
    for name in ("flow_enqueue", "flow_cancel", "cancel"):
        r.script_load(sc.source(name))
    r.close()
    d = Proxy(free_port(), redis_server.port).start()
    yield d
    d.stop()


def test_flow_cancel_after_a_lost_reply_returns_true(
    dropper: Proxy, prefix: str, r: redis.Redis
) -> None:
    via = make_settings(dropper.url, prefix)
    with Client(settings=via) as c:
        h = c.enqueue_workflow(chain(sig("a"), sig("b")))
        dropper.drop_reply(b"flow stop 1")
        assert c.cancel(h.id, reason="flow stop 1") is True
        assert dropper.fired == 1
        info = c.get(h.id)
        assert info.status == "cancelled" and info.steps is not None
        assert [s["status"] for s in info.steps] == ["cancelled", "waiting"]
        assert c.cancel(h.id) is False  # a second cancel of its own: the flow had ended


async def test_async_flow_cancel_after_a_lost_reply_returns_true(
    dropper: Proxy, prefix: str
) -> None:
    via = make_settings(dropper.url, prefix)
    async with AsyncClient(settings=via) as c:
        h = await c.enqueue_workflow(chain(sig("a"), sig("b")))
        dropper.drop_reply(b"flow stop 2")
        assert await c.cancel(h.id, reason="flow stop 2") is True
        assert dropper.fired == 1
        assert (await c.get(h.id)).status == "cancelled"


# --- before_enqueue middleware on every step ---------------------------------------------------


class Stamp(Middleware):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_enqueue(self, request: EnqueueRequest) -> None:
        self.seen.append(request.name)
        request.headers["traceparent"] = f"00-trace-{request.name}"
        request.metadata["tenant"] = "acme"


class AsyncStamp(Stamp):
    async def before_enqueue(self, request: EnqueueRequest) -> None:  # type: ignore[override]
        super().before_enqueue(request)


def _record(r: redis.Redis, settings: Settings, step_id: str) -> dict[str, str]:
    q, tid = split_task_id(step_id)
    return r.hgetall(qk_of(settings, q).task(tid))  # type: ignore[return-value]


def test_before_enqueue_middleware_reaches_every_step(r: redis.Redis, settings: Settings) -> None:
    app = App(settings=settings)
    stamp = Stamp()
    app.add_middleware(stamp)
    with Client(settings=settings, app=app) as c:
        h = c.enqueue_workflow(chain(sig("a"), sig("b", queue="other"), sig("c")))
        assert stamp.seen == ["a", "b", "c"]
        ids = step_ids(c, h.id)
        rec = _record(r, settings, ids[0])
        assert json.loads(rec["hdr"]) == {"traceparent": "00-trace-a"}
        assert json.loads(rec["meta"]) == {"tenant": "acme"}
        [a] = claim(r, settings, "default")
        assert a.headers and json.loads(a.headers) == {"traceparent": "00-trace-a"}
        assert complete(r, settings, "default", a, 1)
        [put] = outbox(r, settings, "default")
        call = wf.handover_call(c.keys, settings, put)
        assert call is not None and sc.SyncScripts(r).run(call) == 1
        [b] = claim(r, settings, "other")  # released later, on another queue: still stamped
        assert b.headers and json.loads(b.headers) == {"traceparent": "00-trace-b"}
        assert json.loads(_record(r, settings, ids[1])["meta"]) == {"tenant": "acme"}


async def test_async_before_enqueue_middleware_reaches_every_step(
    r: redis.Redis, settings: Settings
) -> None:
    app = App(settings=settings)
    stamp = AsyncStamp()
    app.add_middleware(stamp)
    async with AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue_workflow(group(sig("a"), sig("b")))
        assert stamp.seen == ["a", "b"]
        info = await c.get(h.id)
        assert info.steps is not None
        for s in info.steps:
            rec = _record(r, settings, s["id"])
            assert json.loads(rec["hdr"]) == {"traceparent": f"00-trace-{s['name']}"}


def test_a_before_enqueue_error_sends_nothing_of_the_flow(
    r: redis.Redis, settings: Settings
) -> None:
    class Refuse(Middleware):
        def before_enqueue(self, request: EnqueueRequest) -> None:
            if request.name == "b":
                raise InvalidRequest("no b")

    app = App(settings=settings)
    app.add_middleware(Refuse())
    with Client(settings=settings, app=app) as c, pytest.raises(InvalidRequest):
        c.enqueue_workflow(chain(sig("a"), sig("b")))
    assert r.keys(f"{settings.key_prefix}:*") == []


# --- the payload limit of a released step ------------------------------------------------------


def test_a_released_step_over_the_payload_limit_fails_the_flow(
    r: redis.Redis, redis_server: RedisServer, prefix: str
) -> None:
    s = make_settings(redis_server.url, prefix, max_payload_bytes=200)
    with Client(settings=s) as c:
        h = c.enqueue_workflow(chain(sig("a"), sig("b", [1])))
        [a] = claim(r, s, "default")
        assert complete(r, s, "default", a, "x" * 300)  # a result may be bigger than that
        info = c.get(h.id)
        assert info.status == "failed", info
        assert info.error is not None
        assert "step 1" in info.error and "DTQ_MAX_PAYLOAD_BYTES" in info.error
        assert claim(r, s, "default") == []  # no oversized task was made
        with pytest.raises(TaskFailed):
            c.result(h.id, timeout=5)
        # Just under the limit it is released as usual.
        h2 = c.enqueue_workflow(chain(sig("a"), sig("b", [1])))
        [a2] = claim(r, s, "default")
        assert complete(r, s, "default", a2, "y" * 190)  # args ["yyy...", 1]: 198 bytes
        [b2] = claim(r, s, "default")
        assert args_of(r, s, "default", b2) == ["y" * 190, 1]
        assert c.get(h2.id).status == "running"


def test_a_cross_slot_release_over_the_payload_limit_fails_the_flow(
    r: redis.Redis, redis_server: RedisServer, prefix: str
) -> None:
    s = make_settings(redis_server.url, prefix, max_payload_bytes=200)
    with Client(settings=s) as c:
        h = c.enqueue_workflow(chord(group(sig("a"), sig("a")), sig("b", queue="other")))
        a1, a2 = claim(r, s, "default")
        assert complete(r, s, "default", a1, "x" * 100)
        assert complete(r, s, "default", a2, "x" * 100)
        assert outbox(r, s, "default") == []  # nothing handed over
        info = c.get(h.id)
        assert info.status == "failed" and "step 2" in (info.error or "")


# --- task.p: the typed partial signature ------------------------------------------------------


def test_task_p_is_a_step_whose_first_argument_the_flow_fills(
    r: redis.Redis, settings: Settings
) -> None:
    app = App(settings=settings)

    @app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="mul", queue="other")
    def mul(a: int, b: int = 2) -> int:
        return a * b

    @app.task(name="total")
    def total(xs: list[int]) -> int:
        return sum(xs)

    @app.task(name="nothing")
    def nothing() -> int:
        return 0

    s = mul.taking_result(10)
    assert s.name == "mul" and s.args == (10,) and s.defaults is mul.defaults
    assert mul.taking_result(b=3).kwargs == {"b": 3}
    assert total.taking_result().args == ()
    with pytest.raises(InvalidRequest, match="first"):
        nothing.taking_result()
    with pytest.raises(InvalidRequest, match="mul"):
        mul.taking_result(1, 2)  # too many: the flow gives the first
    with Client(settings=settings, app=app) as c:
        h = c.enqueue_workflow(chain(add.s(1, 2), mul.taking_result(10)))
        [a] = claim(r, settings, "default")
        assert complete(r, settings, "default", a, 3)
        [put] = outbox(r, settings, "default")  # released to the task's declared queue
        call = wf.handover_call(c.keys, settings, put)
        assert call is not None and sc.SyncScripts(r).run(call) == 1
        [m] = claim(r, settings, "other")
        assert args_of(r, settings, "other", m) == [3, 10]
        assert complete(r, settings, "other", m, 30)
        info = c.get(h.id)
        assert info.steps is not None and info.steps[1]["status"] == "succeeded"
        h2 = c.enqueue_workflow(chord(group(add.s(1, 1), add.s(2, 2)), total.taking_result()))
        assert h2.id.startswith("default:")


def _typed_usage(app: App) -> Any:  # checked by mypy (make lint): task.p is typed
    @app.task(name="mul")
    def mul(a: int, b: int) -> int:
        return a * b

    return chain(mul.s(1, 2), mul.taking_result(10))
