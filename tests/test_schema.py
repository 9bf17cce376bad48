"""The keyspace's schema version (dtq.schema): at 2 a record leaves out the fields at their
defaults, at 1 it holds them all (what older workers read); every step reads both forms; this
version's workers move a keyspace from 1 to 2 only once no worker of an older version lives,
and a worker refuses a version it does not know."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dtq import AsyncClient, Client, Settings, TaskFailed
from dtq.keys import Keys, QueueKeys
from tests.apps.basic import app
from tests.conftest import running_worker

DEFAULTS = {"attempt", "retries", "intr", "maxr", "prio"}


def record(r: redis.Redis, settings: Settings, task_id: str) -> dict[str, str]:
    queue, tid = task_id.split(":", 1)
    return r.hgetall(QueueKeys(settings.key_prefix, queue).task(tid))  # type: ignore[return-value]


def schema_key(settings: Settings) -> str:
    return Keys(settings.key_prefix).schema


def fake_older_worker(r: redis.Redis, settings: Settings, wid: str = "old-1") -> str:
    """The heartbeat hash a worker of dtq before schema 2 keeps: no schema field."""
    keys = Keys(settings.key_prefix)
    key = keys.worker(wid)
    sec, usec = r.time()
    now_ms = sec * 1000 + usec // 1000
    r.hset(key, mapping={"owner": "elsewhere:1", "worker_id": wid, "last_heartbeat": now_ms})
    r.pexpire(key, 60_000)
    return key


@pytest.mark.cluster
def test_a_new_keyspace_is_made_schema_2_and_its_records_leave_their_defaults_out(
    settings: Settings, r: redis.Redis
) -> None:
    with Client(settings=settings, app=app) as c:
        plain = c.enqueue("noop")
        assert r.get(schema_key(settings)) == "2"
        given = c.enqueue("noop", priority=7, max_retries=1)
        many = c.enqueue_many([{"name": "noop"}, {"name": "noop", "priority": 2}])
        rec = record(r, settings, plain.id)
        assert set(rec) == {"name", "args", "enq", "status", "eid"}
        assert DEFAULTS.isdisjoint(record(r, settings, many[0].id))
        assert record(r, settings, given.id)["prio"] == "7"
        assert record(r, settings, given.id)["maxr"] == "1"
        assert record(r, settings, many[1].id)["prio"] == "2"
        info = c.get(plain.id)
        assert (info.priority, info.max_retries, info.attempt, info.retries) == (5, 3, 0, 0)
        assert info.interruptions == 0 and info.retries_left == 3


@pytest.mark.cluster
async def test_a_schema_1_keyspace_gets_records_with_every_field(
    settings: Settings, r: redis.Redis
) -> None:
    r.set(schema_key(settings), "1")
    async with AsyncClient(settings=settings, app=app) as c:
        one = await c.enqueue("noop")
        many = await c.enqueue_many([{"name": "noop"}, {"name": "noop"}])
    for h in [one, *many]:
        rec = record(r, settings, h.id)
        assert {k: rec[k] for k in DEFAULTS} == {
            "attempt": "0", "retries": "0", "intr": "0", "maxr": "3", "prio": "5"
        }  # fmt: skip
    assert r.get(schema_key(settings)) == "1"  # a client never moves it


@pytest.mark.parametrize("version", ["1", "2"])
async def test_both_record_forms_run_retry_fail_and_succeed(
    settings: Settings, r: redis.Redis, version: str
) -> None:
    r.set(schema_key(settings), version)
    async with AsyncClient(settings=settings, app=app) as c:
        flaky = await c.enqueue("flaky", args=[1])  # fails once, then returns its attempt
        dead = await c.enqueue("always_fails")  # max_retries=2
        none = await c.enqueue("noop")
        low = await c.enqueue("add", args=[2, 3], priority=0)
        stored = record(r, settings, none.id)
        assert ("attempt" in stored) == (version == "1")
        async with running_worker(app, settings):
            assert await c.result(flaky.id, timeout=20) == 2
            with pytest.raises(TaskFailed):
                await c.result(dead.id, timeout=20)
            assert await c.result(none.id, timeout=20) is None
            assert await c.result(low.id, timeout=20) == 5
        info = await c.get(flaky.id)
        assert (info.attempt, info.retries, info.max_retries) == (2, 1, 3)
        info = await c.get(dead.id)
        assert (info.status, info.attempt, info.retries, info.max_retries) == ("failed", 3, 3, 2)
        assert "result" not in record(r, settings, none.id)  # a null result is not stored
        assert record(r, settings, low.id)["result"] == "5"
        assert (await c.get(low.id)).priority == 0


async def until(pred: Any, timeout: float = 30.0) -> None:
    """Wait for ``pred()`` without blocking the in-process worker's loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def beats(r: redis.Redis, settings: Settings, w: Any) -> int:
    return int(r.hget(Keys(settings.key_prefix).worker(w.worker_id), "last_heartbeat") or 0)


@pytest.mark.cluster
async def test_the_move_to_schema_2_waits_for_the_workers_of_an_older_version(
    settings: Settings, r: redis.Redis
) -> None:
    r.set(schema_key(settings), "1")
    old = fake_older_worker(r, settings)
    async with running_worker(app, settings) as w:
        await until(lambda: beats(r, settings, w) > 0)
        first = beats(r, settings, w)
        # Ten heartbeats (and ten steps of the move) with the older worker alive: no move.
        await until(lambda: beats(r, settings, w) >= first + 2000)
        assert r.get(schema_key(settings)) == "1"
        async with AsyncClient(settings=settings, app=app) as c:
            h = await c.enqueue("noop")
            # Full records meanwhile (intr: a field no run writes here; the claim may have
            # written attempt already).
            assert "intr" in record(r, settings, h.id)
            assert await c.result(h.id, timeout=20) is None
        r.delete(old)  # it stopped
        await until(lambda: r.get(schema_key(settings)) == "2")
        # (Set once the swap's reply is back: it may trail the value seen in Redis.)
        await until(lambda: w.heartbeat.schema_move.done)
        async with AsyncClient(settings=settings, app=app) as c:
            h = await c.enqueue("noop")
            assert "intr" not in record(r, settings, h.id)
            assert await c.result(h.id, timeout=20) is None


async def test_an_older_worker_that_starts_during_the_move_sends_the_keyspace_back_to_1(
    settings: Settings, r: redis.Redis
) -> None:
    # "1>2" set, and an older worker that read "1" just before makes its hash: the second look
    # finds it and puts the keyspace back at 1; once it is gone the move completes.
    r.set(schema_key(settings), "1>2")
    old = fake_older_worker(r, settings)
    async with running_worker(app, settings):
        await until(lambda: r.get(schema_key(settings)) == "1")
        r.delete(old)
        await until(lambda: r.get(schema_key(settings)) == "2")


def test_a_worker_refuses_a_schema_version_it_does_not_know(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    r.set(schema_key(settings), "9")
    w = spawn_worker("tests.apps.basic:app", settings)
    assert w.wait(30) == 2
    assert "schema version '9'" in w.output()
    assert r.get(schema_key(settings)) == "9"


def test_the_defaults_a_record_leaves_out_agree_in_python_and_lua() -> None:
    import re
    from pathlib import Path

    from dtq.record import DEFAULTS, Field
    from dtq.requests import DEFAULT_MAX_RETRIES, DEFAULT_PRIORITY

    common = (Path(__file__).resolve().parents[1] / "lua" / "_common.lua").read_text()
    m = re.search(r"^local DEF_MAXR, DEF_PRIO = '(\d+)', '(\d+)'$", common, re.M)
    assert m is not None
    assert DEFAULTS[Field.MAX_RETRIES] == m.group(1) == str(DEFAULT_MAX_RETRIES)
    assert DEFAULTS[Field.PRIORITY] == m.group(2) == str(DEFAULT_PRIORITY)
    assert {DEFAULTS[f] for f in (Field.ATTEMPT, Field.RETRIES, Field.INTERRUPTIONS)} == {"0"}
