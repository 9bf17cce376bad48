"""Progress reports (current_task().progress) and metadata, as get() and events show them."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from dtq import AsyncClient, InvalidRequest, SerializationError, Settings, TaskContext
from dtq import scripts as sc
from dtq.progress import encode_progress
from dtq.scripts import progress_call
from dtq.store.keys import Keys
from tests.apps.lifecycle import app
from tests.conftest import running_worker


async def wait_status(c: AsyncClient, task_id: str, status: str, timeout: float = 20) -> None:
    for _ in range(int(timeout / 0.02)):
        if (await c.get(task_id)).status == status:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{task_id} never reached {status}")


@pytest.mark.parametrize("name", ["stepper", "sync_stepper"])
async def test_progress_is_visible_while_running_and_after(
    settings: Settings, r: redis.Redis, name: str
) -> None:
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue(name, [4, 0.3])
        seen = set()
        for _ in range(500):
            info = await c.get(h.id)
            if info.progress and info.status == "running":
                seen.add(info.progress["current"])
            if info.status.terminal:
                break
            await asyncio.sleep(0.02)
        assert await c.result(h.id, timeout=20) == 4
        info = await c.get(h.id)
    assert len(seen) >= 2, seen  # several reports seen mid-run
    # The last report is written before the outcome, so it is never lost.
    assert info.progress == {"current": 4, "total": 4, "message": "step 4", "attempt": 1}
    assert info.to_dict()["progress"]["current"] == 4
    events = r.xrange(Keys(settings.key_prefix).queue("default").events)
    mine = [f for _, f in events if f["tid"] == h.id.split(":")[1]]  # type: ignore[index]
    kinds = [f["type"] for f in mine]
    assert "progress" in kinds and kinds[-1] == "succeeded"
    details = [json.loads(f["detail"]) for f in mine if f["type"] == "progress"]
    assert details[-1]["current"] == 4


async def test_the_last_report_of_each_of_400_runs_at_once_is_kept(settings: Settings) -> None:
    """400 runs reporting at once: each run's writes went straight to the worker's client,
    whose pool holds 100 connections, so about a third of the runs' reports (their last one
    too) failed ("Too many connections", logged at debug: progress is best effort)."""
    s = settings.model_copy(update={"worker_concurrency": 400})
    async with running_worker(app, s), AsyncClient(settings=s, app=app) as c:
        hs = await c.enqueue_many([{"name": "stepper", "args": [2, 0.1]}] * 400)
        assert await asyncio.gather(*(c.result(h.id, timeout=60) for h in hs)) == [2] * 400
        infos = [await c.get(h.id) for h in hs]
    lost = [i.id for i in infos if not i.progress or i.progress["current"] != 2]
    assert not lost, f"{len(lost)} of 400 runs lost their last report"


def test_progress_report_validation() -> None:
    assert json.loads(encode_progress(1, 3, "x", 2)) == {
        "current": 1, "total": 3, "message": "x", "attempt": 2,
    }  # fmt: skip
    assert json.loads(encode_progress(0.5, None, None, 1)) == {"current": 0.5, "attempt": 1}
    assert len(json.loads(encode_progress(1, None, "m" * 5000, 1))["message"]) == 1000
    for bad in ("x", float("nan"), True, None):
        with pytest.raises(InvalidRequest):
            encode_progress(bad, None, None, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        encode_progress(1, None, 5, 1)  # type: ignore[arg-type]


def test_progress_outside_a_runner_is_a_no_op() -> None:
    ctx = TaskContext("q:t", "n", "q", 1, 0, 3, "w", None)
    ctx.progress(1, 2)  # no hooks (e.g. a test calling the function directly): ignored
    assert ctx.cancel_requested is False


async def test_progress_write_is_fenced(settings: Settings, r: redis.Redis) -> None:
    """A report from an old attempt or another worker never lands."""
    qk = Keys(settings.key_prefix).queue("default")
    r.hset(qk.task("t1"), mapping={"status": "running", "attempt": 2, "worker": "w1"})
    s = sc.SyncScripts(r)
    assert s.run(progress_call(qk, "t1", 1, "w1", '{"current":1}', 100)) == 0
    assert s.run(progress_call(qk, "t1", 2, "w2", '{"current":1}', 100)) == 0
    assert s.run(progress_call(qk, "t1", 2, "w1", '{"current":7}', 100)) == 1
    assert r.hget(qk.task("t1"), "progress") == '{"current":7}'
    r.hset(qk.task("t1"), "status", "succeeded")
    assert s.run(progress_call(qk, "t1", 2, "w1", '{"current":8}', 100)) == 0


async def test_metadata_is_stored_and_shown(settings: Settings) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("echo", [1], metadata={"tenant": "acme", "trace": [1, 2]})
        info = await c.get(h.id)
        assert info.metadata == {"tenant": "acme", "trace": [1, 2]}
        assert info.to_dict()["metadata"]["tenant"] == "acme"
        [h2] = await c.enqueue_many([{"name": "echo", "metadata": {"k": "v"}}])
        assert (await c.get(h2.id)).metadata == {"k": "v"}
        with pytest.raises(SerializationError):
            await c.enqueue("echo", metadata={"big": "x" * 5000})
        with pytest.raises(SerializationError):
            await c.enqueue("echo", metadata={"bad": object()})
