"""Workflows run by real workers: same queue, across queues (the cross-slot handover),
failure and retries, cancel, and a big group (docs/workflows.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dtq import AsyncClient, Settings, TaskFailed, chain, chord, group, sig
from dtq.store.keys import Keys, split_task_id
from tests.apps.flows import add, app, double
from tests.conftest import make_settings, running_worker
from tests.redis_cluster import RedisClusterFixture
from tests.redis_server import RedisServer


@pytest.fixture
def both(settings: Settings) -> Settings:
    return settings.model_copy(update={"queues": ["default", "other"]})


async def test_chain_across_queues_moves_through_the_outboxes(both: Settings) -> None:
    """a on default (the home), b on other (another slot on a cluster), c back home."""
    async with running_worker(app, both), AsyncClient(settings=both, app=app) as c:
        h = await c.enqueue_workflow(chain(add.s(1, 2), sig("double"), sig("add", [10])))
        assert await c.result(h.id, timeout=20) == 16
        info = await c.get(h.id)
        assert info.steps is not None and [s["id"].split(":")[0] for s in info.steps] == [
            "default", "other", "default",
        ]  # fmt: skip
        # A flow whose first step is on "other" is homed there; its steps come back to default.
        h2 = await c.enqueue_workflow(chain(double.s(5), sig("add", [1])))
        assert split_task_id(h2.id)[0] == "other"
        assert await c.result(h2.id, timeout=20) == 11
        # Every handover was moved and acknowledged: the outboxes are empty.
        for q in ("default", "other"):
            assert await c.redis.xlen(Keys(both.key_prefix).queue(q).flowq) == 0


async def test_chord_with_members_on_two_queues(both: Settings) -> None:
    async with running_worker(app, both), AsyncClient(settings=both, app=app) as c:
        members = [sig("ident", [i]) if i % 2 else sig("double", [i]) for i in range(10)]
        h = await c.enqueue_workflow(chord(group(*members), sig("total")))
        want = [i if i % 2 else i * 2 for i in range(10)]
        assert await c.result(h.id, timeout=20) == want
        # nesting: a chain inside a group, a group inside a chain
        flow = chain(
            sig("add", [1, 1]),
            group(chain(sig("double"), sig("double")), sig("add", [3])),
            sig("total"),
        )
        h = await c.enqueue_workflow(flow)
        assert await c.result(h.id, timeout=20) == [8, 5]
        assert (await c.get(h.id)).tree == {"chain": [0, {"group": [{"chain": [1, 2]}, 3]}, 4]}


async def test_failed_step_fails_the_flow_after_its_retries(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue_workflow(chain(sig("add", [1, 2]), sig("boom"), sig("total")))
        with pytest.raises(TaskFailed) as exc:
            await c.result(h.id, timeout=20)
        info = await c.get(h.id)
        assert info.steps is not None
        boom = await c.get(info.steps[1]["id"])
        assert boom.status == "failed" and boom.attempt == 2  # its retry ran, as for any task
        assert exc.value.status == "failed" and "step 1" in (info.error or "")
        assert [s["status"] for s in info.steps] == ["succeeded", "failed", "waiting"]


async def test_cancel_a_flow_with_a_running_step(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue_workflow(chain(sig("ident", [1], kwargs={"sleep": 0.5}), sig("total")))
        for _ in range(200):
            info = await c.get(h.id)
            if info.status == "running":
                break
            await asyncio.sleep(0.02)
        assert await c.cancel(h.id) is True
        with pytest.raises(TaskFailed):
            await c.result(h.id, timeout=20)
        await asyncio.sleep(0.8)  # the running step ended (sync bodies run on)
        info = await c.get(h.id)
        assert info.status == "cancelled" and info.steps is not None
        assert info.steps[1]["status"] == "waiting"  # the callback never started


async def test_group_of_10000_members_enqueues_in_one_call_and_joins(settings: Settings) -> None:
    n = 10_000
    async with AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue_workflow(
            chord(group(*(sig("ident", [i]) for i in range(n))), sig("total"))
        )
        fk = Keys(settings.key_prefix).queue("default").flow(split_task_id(h.id)[1])
        assert await c.redis.hget(fk, "n") == str(n + 1)
        async with running_worker(app, settings.model_copy(update={"worker_concurrency": 32})):
            assert await c.result(h.id, timeout=240) == list(range(n))


def test_testqueue_runs_flows() -> None:
    from dtq.testing import TestQueue

    with TestQueue(app) as tq:
        c = app.client()
        h = c.enqueue_workflow(
            chord(group(sig("add", [1, 0]), sig("double", [2]), sig("add", [3, 0])), sig("sum"))
        )
        h2 = c.enqueue_workflow(chain(double.s(4), sig("add", [1])))
        tq.drain()
        assert c.result(h.id, timeout=1) == 8
        assert c.result(h2.id, timeout=1) == 9
    with TestQueue(app, eager=True):
        h = app.client().enqueue_workflow(chain(add.s(1, 2), sig("double")))
        assert app.client().get(h.id).result == 6


async def test_http_api_returns_a_flow_with_its_steps(settings: Settings) -> None:
    import httpx

    from dtq_api.app import create_app

    async with AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue_workflow(chain(sig("add", [1, 2]), sig("double")))
        transport = httpx.ASGITransport(app=create_app(settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            resp = await http.get(f"/api/v1/tasks/{h.id}")
            assert resp.status_code == 200, resp.text
            d = resp.json()
            assert d["id"] == h.id and d["status"] == "queued" and d["name"] == "workflow"
            assert [(s["name"], s["status"]) for s in d["steps"]] == [
                ("add", "queued"), ("double", "waiting"),
            ]  # fmt: skip
            assert d["tree"] == {"chain": [0, 1]}
            async with running_worker(
                app, settings.model_copy(update={"queues": ["default", "other"]})
            ):
                assert await c.result(h.id, timeout=20) == 6
            d = (await http.get(f"/api/v1/tasks/{h.id}")).json()
            assert d["status"] == "succeeded" and d["result"] == 6


async def test_a_step_result_over_the_limit_fails_the_step_and_the_flow(
    settings: Settings,
) -> None:
    s = settings.model_copy(update={"max_result_bytes": 1000})
    async with running_worker(app, s), AsyncClient(settings=s, app=app) as c:
        ok = await c.enqueue_workflow(chain(sig("big", [10]), sig("total")))
        h = await c.enqueue_workflow(chain(sig("big", [5000]), sig("total")))
        with pytest.raises(TaskFailed):
            await c.result(h.id, timeout=20)
        info = await c.get(h.id)
        assert "DTQ_MAX_RESULT_BYTES" in (info.error or "") and info.steps is not None
        assert [x["status"] for x in info.steps] == ["failed", "waiting"]
        assert await c.result(ok.id, timeout=20) == "x" * 10  # total() returns its input


def test_the_examples_of_docs_workflows_run() -> None:
    """docs/workflows.md: the first python block defines the tasks, the second uses them."""
    import re
    import sys
    import types
    from pathlib import Path

    from dtq.testing import TestQueue

    text = (Path(__file__).resolve().parents[2] / "docs" / "workflows.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    mod = types.ModuleType("flows_demo")
    sys.modules["flows_demo"] = mod
    try:
        exec(compile(blocks[0], "flows_demo", "exec"), mod.__dict__)
        with TestQueue(mod.app, eager=True):
            exec(compile(blocks[1], "docs/workflows.md", "exec"), dict(mod.__dict__))
    finally:
        del sys.modules["flows_demo"]


async def test_a_handover_left_by_a_dead_mover_is_taken_over(both: Settings) -> None:
    """A mover that read a handover and died before moving it: a live worker takes the entry
    over after the visibility timeout and moves it."""
    from dtq import scripts as sc
    from tests.conftest import create_groups

    keys = Keys(both.key_prefix)
    async with AsyncClient(settings=both, app=app) as c:
        h = await c.enqueue_workflow(chain(sig("add", [1, 2]), sig("double")))
        r = c.redis
        home = keys.queue("default")
        await asyncio.to_thread(create_groups, _sync(both), home)
        run = sc.AsyncScripts(r).run
        [a] = sc.parse_claim("default", await run(sc.claim_call(home, "w0", 1, 100, 60))).runs
        s = sc.Success(a.tid, a.eid, a.attempt, "succeeded", "3")
        await run(sc.complete_call(home, "w0", [s], 100, 60))
        await r.xgroup_create(home.flowq, "movers", id="0", mkstream=True)
        got = await r.xreadgroup("movers", "ghost", {home.flowq: ">"}, count=10)
        assert got and got[0][1][0][1]["k"] == "put"  # pending to the dead mover "ghost"
        async with running_worker(app, both):
            assert await c.result(h.id, timeout=30) == 6
        assert await r.xlen(home.flowq) == 0


def _sync(s: Settings) -> Any:
    import redis

    return redis.Redis.from_url(s.redis_url, decode_responses=True)


MANY = ["default", "other", *(f"q{i}" for i in range(298))]


def _restarts(w: Any, loop: str) -> float:
    return (
        w.metrics.registry.get_sample_value("dtq_worker_loop_restarts_total", {"loop": loop}) or 0.0
    )


@pytest.mark.cluster
async def test_a_worker_of_300_queues_moves_handovers_without_restarting_its_loops(
    settings: Settings,
) -> None:
    """Each queue's workflow outbox had a blocking reader of its own on the worker's blocking
    client, and the periodic recovery sent one call per queue at once on its main client: both
    pools hold 100 connections, so past about 98 queues the flow and scheduler loops failed
    ("Too many connections") and restarted again and again."""
    s = settings.model_copy(update={"queues": MANY})
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        h = await c.enqueue_workflow(chain(add.s(1, 2), sig("double"), sig("add", [10])))
        assert await c.result(h.id, timeout=30) == 16
        h2 = await c.enqueue_workflow(chain(double.s(5), sig("add", [1])))
        assert await c.result(h2.id, timeout=30) == 11
        await asyncio.sleep(1.5)  # (a failing loop is restarted after 0.5-1.5 s)
        loops = ("flows", "poll", "scheduler", "reaper", "heartbeat")
        assert {loop: _restarts(w, loop) for loop in loops} == dict.fromkeys(loops, 0)


def _most_per_node(client: Any) -> int:
    """The most connections a cluster client made to one node (redis-py keeps each it made)."""
    return max(len(node._connections) for node in client.get_nodes())


async def test_a_worker_of_300_queues_on_a_cluster_bounds_its_calls(
    redis_cluster: RedisClusterFixture, prefix: str
) -> None:
    """On a cluster each outbox has a reader of its own (one slot each), and all 300 swept their
    outbox for a dead mover's entries at once at the start, on the worker's calls client: about
    100 calls at once per node, its pool's whole 100, so the other loops' calls failed with "Too
    many connections" (the scheduler's, the heartbeat's) in one start in three. The readers' calls
    are bounded now, like the periodic recovery's."""
    s = make_settings(redis_cluster.url, prefix, queues=MANY)
    async with running_worker(app, s) as w, AsyncClient(settings=s, app=app) as c:
        h = await c.enqueue_workflow(chain(add.s(1, 2), sig("double"), sig("add", [10])))
        assert await c.result(h.id, timeout=30) == 16
        await asyncio.sleep(1.5)
        most = _most_per_node(w.env.redis)
    assert most <= 40, f"{most} connections to one node on the worker's calls client"


async def test_a_worker_of_300_queues_holds_a_few_connections(
    fresh_redis: RedisServer, prefix: str
) -> None:
    """On one server the outboxes are read by one blocking read over all of them, and the
    periodic recovery sends at most 8 calls at once: what the worker holds does not grow with
    its queues (before: a connection per queue, 105 here)."""
    s = make_settings(fresh_redis.url, prefix, queues=MANY)
    with fresh_redis.client() as r:
        before = len(r.client_list())
        async with running_worker(app, s), AsyncClient(settings=s, app=app) as c:
            h = await c.enqueue_workflow(chain(add.s(1, 2), sig("double"), sig("add", [10])))
            assert await c.result(h.id, timeout=30) == 16
            held = len(r.client_list()) - before
    assert held <= 30, f"{held} connections for a worker and a client"
