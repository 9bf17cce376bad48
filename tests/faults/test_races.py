"""Races for real: several worker processes, SIGKILL, SIGTERM, competing schedulers."""

from __future__ import annotations

import collections
import signal
import time
from typing import Any

import pytest
import redis

from dtq import Client, Settings, TaskStatus
from dtq.store.keys import Keys
from tests.conftest import body_starts as starts
from tests.conftest import make_settings, wait_until

pytestmark = pytest.mark.slow
APP = "tests.apps.basic:app"


def all_done(c: Client, ids: list[str]) -> bool:
    # One pipeline instead of one round trip per task.
    with c.redis.pipeline(transaction=False) as p:
        for i in ids:
            q, tid = i.split(":")
            p.hget(c.keys.queue(q).task(tid), "status")
        return all(s in ("succeeded", "failed") for s in p.execute())


def test_many_workers_start_each_attempt_exactly_once(
    redis_server: Any, prefix: str, spawn_worker: Any, r: redis.Redis
) -> None:
    s = make_settings(redis_server.url, prefix, worker_concurrency=16)
    n = 3000
    with Client(settings=s) as c:
        ids = []
        for i in range(0, n, 500):
            batch = [
                {"name": "record", "args": [str(j)], "priority": j % 10} for j in range(i, i + 500)
            ]
            ids += [h.id for h in c.enqueue_many(batch)]
        workers = [spawn_worker(APP, s, "--worker-id", f"w{i}") for i in range(4)]
        wait_until(lambda: all_done(c, ids), timeout=240, interval=0.2)
        seen = starts(r, prefix)
        pairs = collections.Counter((t, a) for t, a, _ in seen)
        assert not [p for p, k in pairs.items() if k > 1], "an attempt started twice"
        assert {t for t, _, _ in seen} == set(ids)
        assert len({w for _, _, w in seen}) > 1, "work was not shared between workers"
        assert all(c.get(i).status == TaskStatus.SUCCEEDED for i in ids[:50])
        for w in workers:
            w.signal(signal.SIGTERM)
        assert [w.wait(60) for w in workers] == [0, 0, 0, 0]
        # Acknowledged entries are deleted: the streams are empty once all is done.
        qk = Keys(prefix).queue("default")
        assert sum(r.xlen(x) for x in qk.streams) == 0


@pytest.mark.cluster
def test_sigkilled_worker_task_is_reclaimed_by_another(
    backend: Any, prefix: str, spawn_worker: Any, r: redis.Redis
) -> None:
    s = make_settings(backend.url, prefix)
    with Client(settings=s) as c:
        a = spawn_worker(APP, s, "--worker-id", "victim")
        h = c.enqueue("sleep", [3.0])
        wait_until(lambda: c.get(h.id).status == TaskStatus.RUNNING, timeout=30)
        # Killed once the task body has begun (its start is recorded), mid-sleep.
        wait_until(lambda: len(starts(r, prefix)) == 1, timeout=30)
        assert c.get(h.id).worker_id == "victim"
        a.kill()
        killed_at = time.monotonic()
        b = spawn_worker(APP, s, "--worker-id", "rescuer")
        assert c.result(h.id, timeout=60) == 3.0
        info = c.get(h.id)
        assert info.attempt == 2 and info.retries == 1 and info.worker_id == "rescuer"
        assert time.monotonic() - killed_at >= s.visibility_timeout_s
        assert [(a_, w) for _, a_, w in starts(r, prefix)] == [(1, "victim"), (2, "rescuer")]
        b.signal(signal.SIGTERM)
        assert b.wait(30) == 0


@pytest.mark.cluster
def test_sigterm_drains_running_tasks(
    backend: Any, prefix: str, spawn_worker: Any, r: redis.Redis
) -> None:
    s = make_settings(backend.url, prefix, drain_timeout_s=20)
    with Client(settings=s) as c:
        w = spawn_worker(APP, s)
        hs = [c.enqueue("sleep", [1.0]) for _ in range(4)]
        wait_until(lambda: all(c.get(h.id).status == TaskStatus.RUNNING for h in hs), timeout=30)
        w.signal(signal.SIGTERM)
        time.sleep(0.3)
        late = c.enqueue("sleep", [0.0])  # arrives during the drain: must not be taken
        assert w.wait(30) == 0
        assert all(c.get(h.id).status == TaskStatus.SUCCEEDED for h in hs)
        assert all(c.get(h.id).attempt == 1 for h in hs)
        assert c.get(late.id).status == TaskStatus.QUEUED
        assert "draining" in w.output()
        # The worker deregistered itself.
        assert r.zcard(Keys(prefix).workers) == 0


def test_two_schedulers_promote_each_due_task_once(
    redis_server: Any, prefix: str, spawn_worker: Any, r: redis.Redis
) -> None:
    s = make_settings(redis_server.url, prefix, worker_concurrency=32)
    with Client(settings=s) as c:
        workers = [spawn_worker(APP, s, "--worker-id", f"s{i}") for i in range(2)]
        # Both schedulers up (heartbeating) before the tasks fall due.
        wait_until(lambda: r.zcard(Keys(prefix).workers) == 2, timeout=60)
        hs = c.enqueue_many(
            [{"name": "record", "args": [str(i)], "delay": 1.0} for i in range(600)]
        )
        ids = [h.id for h in hs]
        wait_until(lambda: all_done(c, ids), timeout=120, interval=0.2)
        pairs = collections.Counter((t, a) for t, a, _ in starts(r, prefix))
        assert len(pairs) == 600 and set(pairs.values()) == {1}
        stats = r.hgetall(Keys(prefix).queue("default").stats)
        assert int(stats.get("absorbed", 0)) == 0
        for w in workers:
            w.signal(signal.SIGTERM)
        assert [w.wait(30) for w in workers] == [0, 0]


def test_settings_fixture_is_short(settings: Settings) -> None:
    # The race tests rely on short timings; keep them honest if defaults change.
    assert settings.heartbeat_interval_s < settings.visibility_timeout_s <= 2
