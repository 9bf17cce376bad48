"""dtq-api: every /api/v1 path, the error shape and codes, auth, SSE, health endpoints."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dtq import Settings
from dtq import scripts as sc
from dtq.admin import Admin
from dtq.store.keys import GROUP
from dtq_api.app import create_app
from tests.api_proc import ApiProc
from tests.apps.basic import app as tasks_app
from tests.conftest import make_settings, running_worker


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


def err(r: httpx.Response, status: int, code: str | None = None) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    if code:
        assert body["error"]["code"] == code
    return str(body["error"]["message"])


async def test_enqueue_with_idempotency_key_and_get_result(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    body = {"name": "add", "args": [2, 3], "priority": 7}
    r1 = await http.post("/api/v1/tasks", json=body, headers={"Idempotency-Key": "order-1"})
    assert r1.status_code == 201, r1.text
    t = r1.json()
    assert t["status"] == "queued" and t["priority"] == 7 and t["created"] is True
    assert t["id"].startswith("default:") and t["args"] == [2, 3]
    r2 = await http.post("/api/v1/tasks", json=body, headers={"Idempotency-Key": "order-1"})
    assert r2.status_code == 200 and r2.json()["id"] == t["id"] and r2.json()["created"] is False
    r3 = await http.post("/api/v1/tasks", json={**body, "idempotency_key": "order-1"})
    assert r3.status_code == 200 and r3.json()["id"] == t["id"]
    both = await http.post(
        "/api/v1/tasks",
        json={**body, "idempotency_key": "x"},
        headers={"Idempotency-Key": "order-1"},
    )
    assert both.status_code == 200 and both.json()["id"] == t["id"]  # the header wins
    async with running_worker(tasks_app, settings):
        deadline = time.monotonic() + 20
        while True:
            got = (await http.get(f"/api/v1/tasks/{t['id']}")).json()
            if got["status"] == "succeeded" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    assert got["status"] == "succeeded" and got["result"] == 5 and got["attempt"] == 1
    assert [e["type"] for e in got["history"]] == ["enqueued", "started", "succeeded"]
    r = await http.post(f"/api/v1/tasks/{t['id']}/cancel")
    assert "already ended succeeded" in err(r, 409, "conflict")


async def test_enqueue_unique_answers_the_unfinished_task(http: httpx.AsyncClient) -> None:
    # `unique` is one of the SDK's enqueue fields, so the body takes it too (a bool only).
    body = {"name": "add", "args": [1, 1], "unique": True}
    r1 = await http.post("/api/v1/tasks", json=body)
    assert r1.status_code == 201, r1.text
    r2 = await http.post("/api/v1/tasks", json=body)
    assert r2.status_code == 200 and r2.json()["id"] == r1.json()["id"]
    r3 = await http.post("/api/v1/tasks", json={**body, "unique": False})
    assert r3.status_code == 201 and r3.json()["id"] != r1.json()["id"]
    err(await http.post("/api/v1/tasks", json={**body, "unique": "yes"}), 422)


@pytest.mark.cluster
@pytest.mark.parametrize("path", ["/api/v1/tasks/{tid}", "/api/v1/queues", "/api/v1/tasks"])
async def test_many_requests_at_once_wait_for_a_connection(settings: Settings, path: str) -> None:
    """300 requests at once: the API's Redis client waits for one of its 100 connections, as
    the SDK's does. Before, 199 of them were answered 503 ("Too many connections"); on a
    cluster, 160-200 of those whose route sends a pipeline (the queue list, the task list) were
    still answered 503: the cluster client's cap on calls in flight left pipelines out."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:
            r = await c.post("/api/v1/tasks", json={"name": "add", "args": [1, 2]})
            url = path.format(tid=r.json()["id"])
            got = await asyncio.gather(*(c.get(url) for _ in range(300)))
    assert [g.status_code for g in got] == [200] * 300, next(
        g.text for g in got if g.status_code != 200
    )


async def test_error_codes_and_shape(http: httpx.AsyncClient, settings: Settings) -> None:
    err(await http.get("/api/v1/tasks/default:0000"), 404, "not_found")
    err(await http.get("/api/v1/tasks/nocolon"), 422, "validation_error")
    err(await http.get("/api/v1/queues/nope"), 404, "not_found")
    err(await http.post("/api/v1/queues/nope/pause"), 404, "not_found")
    err(await http.get("/api/v1/nothing-here"), 404, "not_found")
    err(await http.delete("/api/v1/dlq/default:0000"), 404, "not_found")
    err(await http.post("/api/v1/tasks", json={"name": "add", "priority": 10}), 422)
    err(await http.post("/api/v1/tasks", json={"name": "add", "bogus": 1}), 422)
    err(await http.post("/api/v1/tasks", json={"args": []}), 422)
    # Numbers are strict: a JSON true or "3" is not read as 1 or 3 (found by schemathesis).
    err(await http.post("/api/v1/tasks", json={"name": "add", "priority": True}), 422)
    err(await http.post("/api/v1/tasks", json={"name": "add", "max_retries": "3"}), 422)
    err(await http.post("/api/v1/tasks", json={"name": "add", "delay": True}), 422)
    err(await http.post("/api/v1/dlq/requeue", json={"max_retries": True}), 422)
    assert (await http.post("/api/v1/tasks", json={"name": "add", "delay": 5})).status_code in (
        200,
        201,
        202,
    )  # an integer is still a number of seconds
    err(await http.get("/api/v1/tasks", params={"limit": 0}), 422)
    err(await http.get("/api/v1/tasks", params={"status": "nope"}), 422)
    r = await http.post(
        "/api/v1/tasks", content=b"{not json", headers={"content-type": "application/json"}
    )
    err(r, 400, "bad_request")
    # Arguments past DTQ_MAX_PAYLOAD_BYTES: refused by the SDK's check.
    big = "x" * (settings.max_payload_bytes + 10)
    err(await http.post("/api/v1/tasks", json={"name": "add", "args": [big]}), 413)
    # A body far past the limit is refused before it is read.
    huge = b"[" + b"1," * (settings.max_payload_bytes // 2 + 40_000) + b"1]"
    r = await http.post("/api/v1/tasks", content=huge, headers={"content-type": "application/json"})
    err(r, 413, "payload_too_large")
    # 409: retrying a task that is still waiting.
    t = (await http.post("/api/v1/tasks", json={"name": "add", "delay": 60})).json()
    err(await http.post(f"/api/v1/tasks/{t['id']}/retry"), 409, "conflict")
    err(await http.post(f"/api/v1/dlq/{t['id']}/requeue"), 409, "conflict")


async def test_token_required_on_api_only(settings: Settings) -> None:
    s = settings.model_copy(update={"api_token": "s3cret-token"})
    transport = httpx.ASGITransport(app=create_app(s))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        err(await c.get("/api/v1/queues"), 401, "unauthorized")
        err(await c.get("/api/v1/queues", headers={"Authorization": "Bearer nope"}), 401)
        err(await c.get("/api/v1/queues", headers={"Authorization": "Basic s3cret-token"}), 401)
        ok = await c.get("/api/v1/queues", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/"):
            assert (await c.get(open_path)).status_code == 200, open_path


@pytest.mark.cluster
async def test_tasks_listing_filters_and_pagination(http: httpx.AsyncClient) -> None:
    ids = set()
    for i in range(9):
        r = await http.post("/api/v1/tasks", json={"name": "add" if i % 3 else "sync_mul",
                                                   "args": [i, 1]})  # fmt: skip
        ids.add(r.json()["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 4}
        if cursor:
            params["cursor"] = cursor
        page = (await http.get("/api/v1/tasks", params=params)).json()
        assert len(page["items"]) <= 4
        seen += [t["id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert set(seen) == ids
    # A filter's request does bounded work (a page may come back short): follow the cursor.
    muls = await follow(http, name="sync_mul")
    assert len(muls) == 3 and {t["name"] for t in muls} == {"sync_mul"}
    queued = await follow(http, status="queued", queue="default")
    assert len(queued) == 9


async def follow(http: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        q = {**params, "limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = (await http.get("/api/v1/tasks", params=q)).json()
        items += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return items


@pytest.mark.cluster
async def test_queues_workers_dlq_schedules(http: httpx.AsyncClient, settings: Settings) -> None:
    # A slower heartbeat than the suite's 0.2 s: a loaded machine must not flip it to stale.
    slow_hb = settings.model_copy(update={"heartbeat_interval_s": 1.0, "visibility_timeout_s": 10})
    async with running_worker(tasks_app, slow_hb):
        for _ in range(2):
            await http.post("/api/v1/tasks", json={"name": "fail_now"})
        await http.post("/api/v1/tasks", json={"name": "add", "args": [1, 1], "delay": 300})
        deadline = time.monotonic() + 20
        while (await http.get("/api/v1/queues/default")).json()["dlq"] < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        workers = (await http.get("/api/v1/workers")).json()["items"]
        assert len(workers) == 1 and workers[0]["live"] and not workers[0]["stale"]
        assert workers[0]["heartbeat_age_s"] < 5
        r = await http.post("/api/v1/queues/default/pause")
        assert r.status_code == 200 and r.json()["paused"] and r.json()["changed"]
        q = (await http.get("/api/v1/queues")).json()["items"][0]
        assert q["name"] == "default" and q["paused"] and q["scheduled"] == 1 and q["dlq"] == 2
        dl = (await http.get("/api/v1/dlq")).json()["items"]
        assert len(dl) == 2 and all("permanent problem" in d["error"] for d in dl)
        one, two = dl[0]["task_id"], dl[1]["task_id"]
        r = await http.post(f"/api/v1/dlq/{one}/requeue", json={"max_retries": 1})
        assert r.status_code == 200 and r.json() == {"id": one, "status": "queued"}
        t = (await http.get(f"/api/v1/tasks/{one}")).json()
        assert t["status"] == "queued" and t["max_retries"] == 1 and t["requeues"] == 1
        r = await http.delete(f"/api/v1/dlq/{two}")
        assert r.json() == {"id": two, "discarded": True}
        err(await http.get(f"/api/v1/tasks/{two}"), 404)
        sch = (await http.get("/api/v1/schedules")).json()
        assert [x["kind"] for x in sch["scheduled_tasks"]] == ["delayed"]
        assert isinstance(sch["schedules"], list)
        r = await http.post("/api/v1/queues/default/purge")
        assert r.json() == {"done": 2, "skipped": {"queued": 1, "scheduled": 1}}
        r = await http.post("/api/v1/queues/default/resume")
        assert r.json()["changed"] and not r.json()["paused"]
        tp = (await http.get("/api/v1/stats/throughput", params={"window_s": 60})).json()
        assert sum(tp["series"]["failed"]) == 2


async def test_dlq_bulk_endpoints(http: httpx.AsyncClient, settings: Settings) -> None:
    async with Admin(settings) as a:
        qk = a.keys.queue("default")
        for st in qk.streams:
            await a.redis.xgroup_create(st, GROUP, id="0", mkstream=True)
        await a.client.enqueue_many([{"name": n, "max_retries": 0} for n in ["x"] * 4 + ["y"]])
        runs = sc.parse_claim("default", await a.scripts.run(sc.claim_call(qk, "w", 9, 100, 60)))
        fails = [sc.Failure(r.tid, r.eid, r.attempt, "E", 0) for r in runs.runs]
        await a.scripts.run(sc.fail_call(qk, "w", fails, 100, 60))
    r = await http.post("/api/v1/dlq/requeue", json={"name": "x", "max_retries": 2})
    assert r.json() == {"done": 4, "skipped": {}}
    r = await http.post("/api/v1/dlq/discard", json={})
    assert r.json() == {"done": 1, "skipped": {}}
    assert (await http.get("/api/v1/dlq")).json()["items"] == []


async def test_health_readiness_and_redis_down(settings: Settings) -> None:
    down = make_settings("redis://127.0.0.1:1/0", settings.key_prefix)
    transport = httpx.ASGITransport(app=create_app(down))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        err(await c.get("/readyz"), 503, "redis_unavailable")
        err(await c.get("/api/v1/queues"), 503, "redis_unavailable")


async def test_openapi_lists_every_contract_path(http: httpx.AsyncClient) -> None:
    doc = (await http.get("/openapi.json")).json()
    paths = doc["paths"]
    want = {
        ("/api/v1/tasks", "get"), ("/api/v1/tasks", "post"), ("/api/v1/tasks/{task_id}", "get"),
        ("/api/v1/tasks/{task_id}/cancel", "post"), ("/api/v1/tasks/{task_id}/retry", "post"),
        ("/api/v1/queues", "get"), ("/api/v1/queues/{name}", "get"),
        ("/api/v1/queues/{name}/pause", "post"), ("/api/v1/queues/{name}/resume", "post"),
        ("/api/v1/queues/{name}/purge", "post"), ("/api/v1/workers", "get"),
        ("/api/v1/dlq", "get"), ("/api/v1/dlq/{task_id}/requeue", "post"),
        ("/api/v1/dlq/{task_id}", "delete"), ("/api/v1/schedules", "get"),
        ("/api/v1/events", "get"), ("/healthz", "get"), ("/readyz", "get"), ("/metrics", "get"),
    }  # fmt: skip
    have = {(p, m) for p, ops in paths.items() for m in ops}
    assert want <= have
    for p, ops in paths.items():
        for m, op in ops.items():
            assert op.get("summary") and op.get("responses"), (p, m)
            if p.startswith("/api/v1"):
                assert {"401", "404", "422"} <= set(op["responses"]), (p, m)
    post = paths["/api/v1/tasks"]["post"]
    assert any(prm["name"] == "Idempotency-Key" for prm in post["parameters"])


@pytest.mark.slow
@pytest.mark.cluster
def test_sse_streams_lifecycle_events_from_a_real_server(
    settings: Settings, spawn_worker: Any
) -> None:
    api = ApiProc(settings, DTQ_API_TOKEN="tok", DTQ_LOG_FORMAT="json")
    spawn_worker("tests.apps.basic:app", settings)
    try:
        hdr = {"Authorization": "Bearer tok"}
        httpx.post(api.url + "/api/v1/tasks", json={"name": "noop"}, headers=hdr)  # queue known
        seen: list[dict[str, Any]] = []
        with httpx.stream("GET", api.url + "/api/v1/events", headers=hdr, timeout=30) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = resp.iter_lines()
            assert next(lines) == ": connected"
            t = httpx.post(api.url + "/api/v1/tasks", json={"name": "add", "args": [4, 4]},
                           headers=hdr).json()  # fmt: skip
            deadline = time.monotonic() + 30
            for line in lines:
                if line.startswith("data: "):
                    ev = json.loads(line[6:])
                    if ev.get("task_id") == t["id"]:
                        seen.append(ev)
                        if ev["type"] == "succeeded":
                            break
                assert time.monotonic() < deadline, seen
        assert [e["type"] for e in seen] == ["enqueued", "started", "succeeded"]
        assert seen[1]["attempt"] == 1 and seen[1]["worker"] and seen[1]["queue"] == "default"
        r = httpx.get(api.url + "/api/v1/events", timeout=5)
        assert r.status_code == 401
        # The API logs one JSON object per line.
        logged = [json.loads(x) for x in api.output().splitlines() if x.startswith("{")]
        assert any(x.get("task_id") == t["id"] for x in logged)
    finally:
        api.close()


async def test_api_with_the_tasks_app_applies_declared_defaults(settings: Settings) -> None:
    from tests.apps.limited import app as limited_app

    limited_app.configure(settings)
    app = create_app(settings, limited_app)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        r = await c.post("/api/v1/tasks", json={"name": "slow_job", "args": [0]})
        assert r.status_code == 201, r.text
        assert r.json()["queue"] == "slow"  # declared with @app.task(queue="slow")
    plain = create_app(settings)
    async with (
        plain.router.lifespan_context(plain),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=plain), base_url="http://t") as c,
    ):
        r = await c.post("/api/v1/tasks", json={"name": "slow_job", "args": [0]})
        assert r.json()["queue"] == "default"  # without the app, only the request's fields


def test_api_refuses_an_unimportable_app() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    p = subprocess.run(
        [sys.executable, "-m", "dtq_api", "--app", "tests.apps.nope:app"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "cannot import 'tests.apps.nope'" in p.stderr
