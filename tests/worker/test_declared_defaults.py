"""A worker's ``@app.task(max_retries=, timeout=, expires=)`` governs a task however it was
enqueued: by name from a client that never imported it, over HTTP without ``--app``, or from
``dtq enqueue``. A value given at enqueue overrides the declaration."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from typing import Any

import httpx
import pytest
import redis

from dtq import AsyncClient, Client, Settings, TaskFailed
from dtq.admin import Admin, Page, filled_page
from dtq.cli import main as dtq_main
from dtq.store.keys import Keys
from tests.api_proc import ApiProc
from tests.apps.declared import app
from tests.conftest import running_worker, wait_until

FAILS = "declared.always_fails"  # max_retries=1: two attempts, then failed
SLEEPY = "declared.sleepy"  # timeout=0.3, max_retries=0
PERISHABLE = "declared.perishable"  # expires=0.4


def starts(r: redis.Redis, settings: Settings, task_id: str) -> list[int]:
    """Attempt numbers of the bodies of ``task_id`` that began."""
    lines: list[str] = r.lrange(f"{settings.key_prefix}:test:starts", 0, -1)  # type: ignore[assignment]
    return [int(x.split("|")[1]) for x in lines if x.split("|")[0] == task_id]


async def ends_failed(c: AsyncClient, task_id: str) -> TaskFailed:
    with pytest.raises(TaskFailed) as exc:
        await c.result(task_id, timeout=20)
    return exc.value


async def test_declared_max_retries_governs_a_by_name_enqueue_from_a_plain_client(
    settings: Settings, r: redis.Redis
) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        h = await c.enqueue(FAILS)
        assert (await ends_failed(c, h.id)).status == "failed"
        info = await c.get(h.id)
        assert info.max_retries == 1 and info.attempt == 2 and info.retries == 2
        assert starts(r, settings, h.id) == [1, 2]


async def test_declared_max_retries_governs_an_http_enqueue_without_app(
    settings: Settings, r: redis.Redis
) -> None:
    api = ApiProc(settings)
    try:
        async with (
            running_worker(app, settings),
            AsyncClient(settings=settings) as c,
            httpx.AsyncClient(base_url=api.url, timeout=10) as http,
        ):
            resp = await http.post("/api/v1/tasks", json={"name": FAILS})
            assert resp.status_code in (200, 201), resp.text
            task_id = resp.json()["id"]
            await ends_failed(c, task_id)
            shown = (await http.get(f"/api/v1/tasks/{task_id}")).json()
        assert shown["max_retries"] == 1 and shown["attempt"] == 2
        assert starts(r, settings, task_id) == [1, 2]
    finally:
        api.close()


def cli(settings: Settings, monkeypatch: Any, capsys: Any, *argv: str) -> str:
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        dtq_main(list(argv))
    out, err = capsys.readouterr()
    assert not exc.value.code, err
    return out


async def test_declared_max_retries_governs_dtq_enqueue(
    settings: Settings, r: redis.Redis, monkeypatch: Any, capsys: Any
) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        out = await asyncio.to_thread(
            cli, settings, monkeypatch, capsys, "enqueue", FAILS, "--json"
        )
        task_id = json.loads(out)["id"]
        await ends_failed(c, task_id)
        shown = json.loads(
            await asyncio.to_thread(cli, settings, monkeypatch, capsys, "task", task_id, "--json")
        )
        assert shown["max_retries"] == 1 and shown["attempt"] == 2
        assert starts(r, settings, task_id) == [1, 2]
        # Options given on the command line override the declaration.
        out = await asyncio.to_thread(
            cli, settings, monkeypatch, capsys, "enqueue", SLEEPY, "--args", "[0.6]",
            "--timeout", "10", "--max-retries", "2", "--expires", "60", "--json",
        )  # fmt: skip
        given = json.loads(out)["id"]
        assert await c.result(given, timeout=20) == "woke"
        info = await c.get(given)
        assert (info.timeout, info.max_retries, info.defaults) == (10, 2, None)
        assert info.expires_at is not None


async def test_declared_timeout_governs_a_by_name_enqueue(
    settings: Settings, r: redis.Redis
) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        h = await c.enqueue(SLEEPY, [30])
        err = await ends_failed(c, h.id)
        assert err.status == "failed" and "timed out" in (err.error or "")
        info = await c.get(h.id)
        assert info.timeout == 0.3 and info.max_retries == 0 and info.attempt == 1
        assert starts(r, settings, h.id) == [1]


async def test_declared_expires_counts_from_a_by_name_enqueue(
    settings: Settings, r: redis.Redis
) -> None:
    async with running_worker(app, settings):
        pass  # the worker published its declarations; now none runs
    async with AsyncClient(settings=settings) as c:
        late = await c.enqueue(PERISHABLE)
        await asyncio.sleep(0.8)  # past the declared 0.4 s from its enqueue
        async with running_worker(app, settings):
            assert (await ends_failed(c, late.id)).status == "expired"
            # Enqueued with a worker up (its start-up, slow on a loaded host, is not in the
            # 0.4 s): claimed at once, within its declared expiry.
            fresh = await c.enqueue(PERISHABLE)
            assert await c.result(fresh.id, timeout=20) == "ran"
        info = await c.get(late.id)
        assert info.attempt == 0 and starts(r, settings, late.id) == []
        assert info.expires_at is not None and info.enqueued_at is not None
        assert abs((info.expires_at - info.enqueued_at).total_seconds() - 0.4) < 0.002
        assert (await c.get(fresh.id)).expires_at is not None


async def test_a_value_given_at_enqueue_overrides_the_declaration(
    settings: Settings, r: redis.Redis
) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        # 3 is the old default: "left unset" must not be inferred from the value.
        three = await c.enqueue(FAILS, max_retries=3)
        zero = await c.enqueue(FAILS, max_retries=0)
        slow_ok = await c.enqueue(SLEEPY, [0.6], timeout=10)
        await ends_failed(c, three.id)
        await ends_failed(c, zero.id)
        assert await c.result(slow_ok.id, timeout=20) == "woke"
        assert starts(r, settings, three.id) == [1, 2, 3, 4]
        assert starts(r, settings, zero.id) == [1]
        assert (await c.get(three.id)).max_retries == 3
        assert (await c.get(slow_ok.id)).timeout == 10
    async with AsyncClient(settings=settings) as c:
        keep = await c.enqueue(PERISHABLE, expires=60)
        await asyncio.sleep(0.8)
        async with running_worker(app, settings):
            assert await c.result(keep.id, timeout=20) == "ran"


def test_sync_client_by_name_enqueue_is_governed_too(settings: Settings, r: redis.Redis) -> None:
    async def run_worker_until(task_id: str) -> None:
        async with running_worker(app, settings), AsyncClient(settings=settings) as c:
            await ends_failed(c, task_id)

    with Client(settings=settings) as c:
        [h] = c.enqueue_many([{"name": FAILS}])
        asyncio.run(run_worker_until(h.id))
        assert c.get(h.id).max_retries == 1
    assert starts(r, settings, h.id) == [1, 2]


async def test_get_before_the_claim_shows_the_declared_values(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        before = await c.get((await c.enqueue(FAILS)).id)
        # No worker declared the name yet: dtq's defaults are shown, and said to be defaults.
        assert before.max_retries == 3 and before.defaults == "default"
        async with running_worker(app, settings):
            pass
        info = await c.get((await c.enqueue(SLEEPY, [1])).id)
        assert info.status == "queued" and info.defaults == "declared"
        assert info.max_retries == 0 and info.timeout == 0.3
        explicit = await c.get((await c.enqueue(SLEEPY, [1], max_retries=2)).id)
        assert explicit.max_retries == 2 and explicit.timeout == 0.3
        assert explicit.defaults == "declared"
        async with running_worker(app, settings):
            await ends_failed(c, info.id)
        after = await c.get(info.id)
        assert after.defaults is None and after.max_retries == 0 and after.timeout == 0.3


async def test_declarations_come_back_after_the_keys_were_flushed(
    settings: Settings, r: redis.Redis
) -> None:
    decl = Keys(settings.key_prefix).queue("default").decl
    async with running_worker(app, settings), AsyncClient(settings=settings) as c:
        assert r.hget(decl, FAILS) == "1||"
        for k in list(r.scan_iter(match=f"{settings.key_prefix}:*", count=1000)):
            r.delete(k)  # what a FLUSHALL does to this prefix
        await asyncio.to_thread(wait_until, lambda: r.hget(decl, FAILS) == "1||")
        h = await c.enqueue(FAILS)
        await ends_failed(c, h.id)
        assert starts(r, settings, h.id) == [1, 2]


async def every_page(a: Admin, **filters: Any) -> Page:
    """The listing's pages up to 50 tasks: a page's SCANs are bounded (SCAN_BUDGET), so on a
    session server crowded by other tests' keys the first page can be empty with a cursor."""
    return await filled_page(lambda cur, n: a.list_tasks(cursor=cur, limit=n, **filters), None, 50)


async def test_listings_show_the_declared_values_before_the_claim(settings: Settings) -> None:
    async with running_worker(app, settings):
        pass  # published its declarations
    async with AsyncClient(settings=settings) as c, Admin(settings) as a:
        queued = await c.enqueue(SLEEPY, [1])
        later = await c.enqueue(SLEEPY, [1], delay=60)
        given = await c.enqueue(FAILS, max_retries=5)
        for status in ("queued", "scheduled"):
            page = await every_page(a, queue="default", status=status)
            rows = {t["id"]: t for t in page.items}
            want = queued.id if status == "queued" else later.id
            assert rows[want]["max_retries"] == 0 and rows[want]["timeout"] == 0.3
            assert rows[want]["defaults"] == "declared"
        rows = {t["id"]: t for t in (await every_page(a)).items}
        assert rows[queued.id]["defaults"] == "declared" and rows[queued.id]["max_retries"] == 0
        assert rows[given.id]["max_retries"] == 5 and rows[given.id]["defaults"] == "declared"


async def test_a_forgotten_queue_takes_its_declarations_with_it(
    settings: Settings, r: redis.Redis
) -> None:
    s = settings.model_copy(update={"retention_interval_s": 3600})
    keys = Keys(s.key_prefix)
    async with running_worker(app, s.model_copy(update={"queues": ("old",)})):
        pass  # consumed "old" once: its declarations were published there
    assert r.hget(keys.queue("old").decl, FAILS) == "1||"
    async with running_worker(app, s) as w:  # consumes "default" only
        ret = w.scheduler.retention
        await ret.run_once()
        await ret.run_once()
    assert not r.sismember(keys.queues, "old")
    assert not list(r.scan_iter(f"{keys.prefix}:{{{keys.prefix}:old}}*"))
    assert r.hget(keys.queue("default").decl, FAILS) == "1||"  # a consumed queue keeps them
