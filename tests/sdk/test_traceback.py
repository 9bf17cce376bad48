"""The last failure's traceback is kept (bounded) and shown by get, `dtq task` and the API; the
retry counters read as what they are (failures, retries left)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import httpx

from dtq import AsyncClient, Settings
from dtq import scripts as sc
from dtq.cli import main
from dtq.errors import DtqError
from dtq.models import MAX_TRACEBACK_CHARS
from dtq.store.keys import Keys
from dtq_api.app import create_app
from tests.apps.basic import app
from tests.conftest import create_groups, running_worker


async def _finished(c: AsyncClient, task_id: str) -> Any:
    with contextlib.suppress(DtqError):
        await c.result(task_id, timeout=30)
    return await c.get(task_id)


async def test_failure_keeps_its_traceback_and_counts_read_right(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("fails_deep", [10])
        info = await _finished(c, h.id)
    assert info.status == "failed"
    assert info.traceback is not None
    assert "Traceback (most recent call last)" in info.traceback
    assert "in fails_deep" in info.traceback and "in _deep_helper" in info.traceback
    assert "tests/apps/basic.py" in info.traceback
    assert info.traceback.rstrip().endswith("KeyError: 'xxxxxxxxxx'")
    # Two runs failed with max_retries=1: 2 failures, no retry left (not "retries: 2 of 1").
    assert info.retries == 2 and info.max_retries == 1  # the contract's names still work
    assert info.failures == 2 and info.retries_left == 0
    assert info.to_dict()["traceback"] == info.traceback

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(settings)), base_url="http://t"
    ) as http:
        body = (await http.get(f"/api/v1/tasks/{h.id}")).json()
    assert body["traceback"] == info.traceback
    assert body["failures"] == 2 and body["retries_left"] == 0


def test_dtq_task_shows_traceback_and_failures(
    settings: Settings, capsys: Any, monkeypatch: Any
) -> None:
    import asyncio

    async def go() -> str:
        async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
            h = await c.enqueue("fails_deep", [10])
            await _finished(c, h.id)
            return h.id

    tid = asyncio.run(go())
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)
    capsys.readouterr()
    try:
        main(["task", tid, "--no-history"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    out = capsys.readouterr().out
    assert "failures: 2" in out
    assert "retries left: 0 of 1" in out
    assert "retries: 2" not in out
    assert "traceback:" in out and "in _deep_helper" in out


async def test_traceback_is_bounded(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("fails_deep", [100_000], max_retries=0)
        info = await _finished(c, h.id)
    assert info.status == "failed" and info.traceback is not None
    assert len(info.traceback) <= MAX_TRACEBACK_CHARS
    assert "Traceback (most recent call last)" in info.traceback  # the head is kept
    assert "characters cut" in info.traceback


async def test_a_later_failure_without_traceback_clears_the_old_one(settings: Settings) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("fails_then_retries")
        info = await _finished(c, h.id)
    assert info.status == "failed" and info.failures == 2
    assert info.error is not None and info.error.startswith("Retry")
    assert info.traceback is None  # it belonged to the first run's error, not this one


def test_fail_script_with_an_empty_traceback_stores_none(settings: Settings, r: Any) -> None:
    """The tracebacks block is always sent (a fixed layout): a failure without one sends '' and
    its record holds none; the history TTL after it is 0 when not counted."""
    qk = Keys(settings.key_prefix).queue("default")
    create_groups(r, qk)
    with __import__("dtq").Client(settings=settings) as c:
        h = c.enqueue("x", max_retries=0)
        scripts = sc.SyncScripts(c.redis)
        [run] = sc.parse_claim("default", scripts.run(sc.claim_call(qk, "w", 1, 1000, 60))).runs
        call = sc.fail_call(qk, "w", [sc.Failure(run.tid, run.eid, run.attempt, "E: x", None)],
                            1000, 60)  # fmt: skip
        assert call.args[6 + 5 :] == ["", 0]
        assert sc.parse_verdicts(scripts.run(call)) == ["failed"]
        assert c.get(h.id).traceback is None
        assert json.loads(json.dumps(c.get(h.id).to_dict()))["status"] == "failed"


def test_test_queue_keeps_the_traceback_too() -> None:
    from dtq.testing import TestQueue

    with TestQueue(app) as tq:
        h = app.tasks["fails_deep"].enqueue(10)
        tq.drain()
        info = app.client().get(h.id)
    assert info.status == "failed" and info.traceback and "in _deep_helper" in info.traceback
