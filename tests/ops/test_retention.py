"""Retention: pruning in bounded passes by one worker; nothing grows without bound."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import redis

from dtq import Client
from dtq.settings import Settings
from dtq.store.keys import Keys
from tests.apps.limited import app
from tests.conftest import make_settings, running_worker, wait_until

APP = "tests.apps.limited:app"
# 100k is the documented full run (`DTQ_RETENTION_TASKS=100000 pytest tests/ops/test_retention.py`);
# CI runs a smaller count.
N_TASKS = int(os.environ.get("DTQ_RETENTION_TASKS", "20000"))


async def test_one_pass_prunes_dlq_idem_and_dead_workers(
    settings: Settings, r: redis.Redis
) -> None:
    s = settings.model_copy(update={"dlq_max": 2, "dead_worker_ttl_s": 60.0})
    qk = Keys(s.key_prefix).queue("default")
    now = int(time.time() * 1000)
    r.sadd(Keys(s.key_prefix).queues, "default")
    for i in range(5):  # five live dead letters: two over the cap of 2... plus the oldest
        r.hset(qk.task(f"f{i}"), mapping={"status": "failed", "name": "x"})
        r.zadd(qk.dlq, {f"f{i}": now - 1000 + i})
    r.zadd(qk.dlq, {"gone": now - 5000})  # its record expired
    r.set(qk.idem("stale"), "nosuchtid")  # no TTL, task gone
    r.set(qk.idem("live"), "f4")
    r.zadd(Keys(s.key_prefix).workers, {"dead": now - 120_000, "alive": now})
    async with running_worker(app, s) as w:
        rep = await w.scheduler.retention.run_once()
    assert rep.dlq_removed == 4
    assert r.zrange(qk.dlq, 0, -1) == ["f3", "f4"]
    assert not r.exists(qk.task("f0")) and r.exists(qk.task("f4"))
    assert not r.exists(qk.idem("stale")) and r.exists(qk.idem("live"))
    assert r.zscore(Keys(s.key_prefix).workers, "dead") is None


def snapshot(c: redis.Redis) -> tuple[int, int]:
    return int(c.dbsize()), int(c.info("memory")["used_memory"])


def all_settled(c: redis.Redis, prefix: str) -> bool:
    qk = Keys(prefix).queue("default")
    return sum(int(c.xlen(s)) for s in qk.streams) == 0 and c.zcard(qk.sched) == 0


def run_batch(client: Client, n: int, tag: int) -> None:
    for i in range(0, n, 2000):
        items: list[dict[str, Any]] = []
        for j in range(i, min(n, i + 2000)):
            if j % 25 == 0:
                items.append({"name": "nop_fail"})
            elif j % 50 == 1:
                items.append({"name": "nop", "idempotency_key": f"k{tag}-{j}"})
            else:
                items.append({"name": "nop"})
        client.enqueue_many(items)


@pytest.mark.slow
def test_steady_load_returns_to_baseline(fresh_redis: Any, prefix: str, spawn_worker: Any) -> None:
    s = make_settings(fresh_redis.url, prefix)
    env = {
        "DTQ_RESULT_TTL_S": "2",
        "DTQ_DLQ_TTL_S": "2",
        "DTQ_RETENTION_INTERVAL_S": "1",
        "DTQ_EVENTS_MAXLEN": "1000",
        "DTQ_WORKER_CONCURRENCY": "64",
        "DTQ_LOG_LEVEL": "WARNING",
    }
    raw = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    client = Client(settings=s.model_copy(update={"events_maxlen": 1000}), app=app)
    workers = [spawn_worker(APP, s, **env) for _ in range(2)]
    # Warm-up: streams, groups, consumers, scripts, event streams at their cap.
    run_batch(client, 3000, 0)
    wait_until(lambda: all_settled(raw, prefix), timeout=120, interval=0.5)
    time.sleep(4)  # records expire (2 s), retention runs (1 s)
    base_keys, base_mem = snapshot(raw)
    t0 = time.monotonic()
    run_batch(client, N_TASKS, 1)
    enq = time.monotonic() - t0
    wait_until(lambda: all_settled(raw, prefix), timeout=600, interval=0.5)
    ran = time.monotonic() - t0
    peak_keys, peak_mem = snapshot(raw)

    def back_to_baseline() -> bool:
        keys, mem = snapshot(raw)
        dlq = raw.zcard(Keys(prefix).queue("default").dlq)
        return keys <= base_keys + 5 and mem <= base_mem + 1_500_000 and dlq == 0

    wait_until(back_to_baseline, timeout=60, interval=0.5)
    end_keys, end_mem = snapshot(raw)
    print(
        f"\nretention run: {N_TASKS} tasks, enqueue {enq:.1f}s, all done {ran:.1f}s; "
        f"keys base={base_keys} peak={peak_keys} end={end_keys}; used_memory "
        f"base={base_mem} peak={peak_mem} end={end_mem}"
    )
    qk = Keys(prefix).queue("default")
    assert raw.zcard(qk.dlq) == 0
    assert raw.xlen(qk.events) <= 2000
    for w in workers:
        w.signal(15)
        assert w.wait(60) == 0
    client.close()
