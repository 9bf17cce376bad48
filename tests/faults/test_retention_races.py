"""Retention against races and clocks: consumer pruning cannot drop a fresh claim, and ages are
measured on the Redis clock, never on a worker's or observer's (which may be skewed)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from dtq import scripts as sc
from dtq.admin import Admin
from dtq.settings import Settings
from dtq.store.keys import GROUP, Keys
from tests.apps.limited import app
from tests.conftest import create_groups, running_worker

SKEW_S = 2 * 86_400.0  # two days


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()  # type: ignore[misc]
    return int(sec) * 1000 + int(usec) // 1000


def skew_clock(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + by_s)


def pending_of(r: redis.Redis, stream: str, consumer: str) -> int:
    return len(r.xpending_range(stream, GROUP, "-", "+", 10, consumername=consumer))


# --- consumer pruning ------------------------------------------------------------------------


async def test_a_claim_racing_consumer_pruning_keeps_its_pending_entry(
    settings: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim lands between the pruning's look at the consumer and its delete (forced by a
    hook on the read where the pruning reads from Python; where the check and the delete are
    one script, nothing can land between them and the claim comes right after)."""
    s = settings.model_copy(update={"dead_worker_ttl_s": 0.05})
    qk = Keys(s.key_prefix).queue("side")  # a queue the worker does not consume
    create_groups(r, qk)
    stream = qk.stream(5)
    r.xgroup_createconsumer(stream, GROUP, "ghost")  # the consumer exists, holds nothing
    r.xadd(stream, {"t": "x"})
    time.sleep(0.1)  # the ghost is idle past the age
    claimed = []

    def claim() -> None:
        got = r.xreadgroup(GROUP, "ghost", {stream: ">"}, count=1)
        claimed.append(got)

    async with running_worker(app, s) as w:
        orig = w.redis.xinfo_consumers

        async def read_then_claim(name: str, groupname: str) -> Any:
            res = await orig(name, groupname)
            if name == stream and not claimed:
                claim()
            return res

        monkeypatch.setattr(w.redis, "xinfo_consumers", read_then_claim)
        await w.scheduler.retention.prune_consumers(["side"])
        if not claimed:
            claim()
    assert claimed and claimed[0], "the claim did not get the entry"
    assert pending_of(r, stream, "ghost") == 1, "the claimed entry left the pending list"


def test_consumer_prune_script_deletes_only_idle_empty_consumers(
    r: redis.Redis, prefix: str
) -> None:
    qk = Keys(prefix).queue("q1")
    create_groups(r, qk)
    s5, s9 = qk.stream(5), qk.stream(9)
    r.xadd(s9, {"t": "a"})
    r.xgroup_createconsumer(s5, GROUP, "idle_empty")
    r.xreadgroup(GROUP, "idle_busy", {s9: ">"}, count=1)  # holds a pending entry
    time.sleep(0.3)
    r.xgroup_createconsumer(s5, GROUP, "fresh")
    run = sc.SyncScripts(r).run
    assert run(sc.consumer_prune_call(qk, 200)) == 1
    names5 = {c["name"] for c in r.xinfo_consumers(s5, GROUP)}
    names9 = {c["name"] for c in r.xinfo_consumers(s9, GROUP)}
    assert names5 == {"fresh"} and names9 == {"idle_busy"}
    assert pending_of(r, s9, "idle_busy") == 1
    # No stream or no group yet: nothing to do, no error.
    assert run(sc.consumer_prune_call(Keys(prefix).queue("none"), 200)) == 0


# --- clocks ----------------------------------------------------------------------------------


async def test_a_fast_worker_clock_does_not_prune_fresh_dead_letters_or_live_workers(
    settings: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings.model_copy(update={"dlq_ttl_s": 3600, "dead_worker_ttl_s": 60.0})
    keys = Keys(s.key_prefix)
    qk = keys.queue("default")
    now = redis_ms(r)
    r.sadd(keys.queues, "default")
    r.hset(qk.task("fresh"), mapping={"status": "failed", "name": "x"})
    r.zadd(qk.dlq, {"fresh": now - 1000})
    r.hset(qk.task("old"), mapping={"status": "failed", "name": "x"})
    r.zadd(qk.dlq, {"old": now - 7200_000})
    r.zadd(keys.workers, {"alive": now, "dead": now - 120_000})
    async with running_worker(app, s) as w:
        skew_clock(monkeypatch, SKEW_S)
        await w.scheduler.retention.run_once()
        monkeypatch.undo()
    assert r.zrange(qk.dlq, 0, -1) == ["fresh"], "a fresh dead letter was pruned"
    assert r.zscore(keys.workers, "alive") is not None, "a live worker was pruned"
    assert r.zscore(keys.workers, "dead") is None


async def test_a_slow_worker_clock_does_not_prune_old_dead_letters_late(
    settings: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings.model_copy(update={"dlq_ttl_s": 3600})
    keys = Keys(s.key_prefix)
    qk = keys.queue("default")
    r.sadd(keys.queues, "default")
    r.hset(qk.task("old"), mapping={"status": "failed", "name": "x"})
    r.zadd(qk.dlq, {"old": redis_ms(r) - 7200_000})
    async with running_worker(app, s) as w:
        skew_clock(monkeypatch, -SKEW_S)
        await w.scheduler.retention.run_once()
        monkeypatch.undo()
    assert r.zcard(qk.dlq) == 0


async def test_heartbeats_carry_the_redis_clock_whatever_the_worker_clock(
    settings: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys(settings.key_prefix)
    async with running_worker(app, settings) as w:
        skew_clock(monkeypatch, -SKEW_S)
        assert await w.heartbeat.beat()
        now = redis_ms(r)
        score = r.zscore(keys.workers, w.worker_id)
        last = int(r.hget(keys.worker(w.worker_id), "last_heartbeat") or 0)
        monkeypatch.undo()
    assert score is not None and abs(score - now) < 60_000, "P:workers score off the Redis clock"
    assert abs(last - now) < 60_000, "last_heartbeat off the Redis clock"


async def test_worker_liveness_is_judged_on_the_redis_clock(
    settings: Settings, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_worker(app, settings) as w:
        assert await w.heartbeat.beat()
        skew_clock(monkeypatch, SKEW_S)
        async with Admin(settings) as admin:
            infos = {i.worker_id: i for i in await admin.list_workers()}
        monkeypatch.undo()
    assert infos[w.worker_id].live, "a live worker looked dead to an observer with a fast clock"
