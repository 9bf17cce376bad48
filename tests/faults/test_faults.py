"""Fault behaviour (issue 3): claim loss, Redis outages, self-stop, outcome writes, shutdown
hand-back, poison pills, hung sync tasks. Worker subprocesses, real signals, a real redis-server.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dtq import Client
from dtq.settings import Settings
from dtq.store.keys import GROUP, Keys, split_task_id
from dtq.store.record import with_defaults
from tests.apps.faulty import app, read_journal
from tests.conftest import make_settings, wait_until
from tests.redis_server import RedisServer, free_port

APP = "tests.apps.faulty:app"


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    """A private server with AOF (fsync always): its data survives a restart."""
    server = RedisServer(aof=True).start()
    yield server
    server.cleanup()


@pytest.fixture
def jpath(tmp_path: Path) -> str:
    return str(tmp_path / "journal.jsonl")


def record(rc: redis.Redis, settings: Settings, task_id: str) -> dict[str, str]:
    """The task's record, the fields it leaves out at their defaults put in."""
    q, tid = split_task_id(task_id)
    return with_defaults(rc.hgetall(Keys(settings.key_prefix).queue(q).task(tid)))  # type: ignore[arg-type]


def events(j: str, ev: str, task_id: str | None = None) -> list[dict[str, Any]]:
    return [e for e in read_journal(j) if e["ev"] == ev and (task_id is None or e["id"] == task_id)]


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not found")


def terminal(rc: redis.Redis, settings: Settings, task_id: str) -> bool:
    return record(rc, settings, task_id).get("status") in ("succeeded", "failed", "cancelled")


# --- 1. claim loss ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["long_async", "long_sync"])
def test_claim_loss_cancels_and_fences_the_old_run(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, jpath: str, kind: str
) -> None:
    # Heartbeat 0.5 s, visibility 2 s: A is frozen for 4 s, B reclaims and reruns the task.
    settings = make_settings(
        redis_server.url, prefix, heartbeat_interval_s=0.5, visibility_timeout_s=2.0
    )
    rc = redis_server.client()
    port = free_port()
    a = spawn_worker(
        APP, settings, "--worker-id", "A", "--concurrency", "1", DTQ_METRICS_PORT=str(port)
    )
    with Client(settings=settings, app=app) as client:
        h = client.enqueue(kind, kwargs={"seconds": 9, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
        a.signal(signal.SIGSTOP)
        b = spawn_worker(APP, settings, "--worker-id", "B", "--concurrency", "1")
        # B's reaper finds A's entry idle past the visibility timeout and B runs attempt 2.
        wait_until(lambda: len(events(jpath, "start")) == 2, 40)
        second = events(jpath, "start")[1]
        assert (second["attempt"], second["worker"]) == (2, "B")
        rec = record(rc, settings, h.id)
        assert (rec["status"], rec["attempt"], rec["worker"]) == ("running", "2", "B")
        resumed = time.time()
        a.signal(signal.SIGCONT)
        wait_until(lambda: metric(port, "dtq_claims_lost_total") == 1.0, 20)
        if kind == "long_async":
            # A cancels its own run at once (within a heartbeat interval, plus scheduling slack).
            wait_until(lambda: len(events(jpath, "cancelled")) == 1, 10)
            cancel = events(jpath, "cancelled")[0]
            assert (cancel["worker"], cancel["attempt"]) == ("A", 1)
            assert cancel["t"] - resumed < settings.heartbeat_interval_s + 2.0
        # The touch never takes the entry back: B still owns the pending entry.
        qk = Keys(prefix).queue("default")
        pending = [p for s in qk.streams for p in rc.xpending_range(s, GROUP, "-", "+", 10)]
        assert [p["consumer"] for p in pending] == ["B"]
        assert client.result(h.id, timeout=30) == {"attempt": 2, "worker": "B"}
        rec = record(rc, settings, h.id)
        assert (rec["attempt"], rec["retries"]) == ("2", "1")
        if kind == "long_sync":
            # A's thread finished its sleep; its result was discarded, never written.
            wait_until(lambda: any(e["worker"] == "A" for e in events(jpath, "finish")), 20)
            time.sleep(1.0)
            assert client.result(h.id, timeout=5) == {"attempt": 2, "worker": "B"}
        assert "claim lost" in a.output()
        evs = [f for _, f in rc.xrange(Keys(prefix).worker_events) if f["type"] == "claim_lost"]
        assert [(f["worker"], f["detail"]) for f in evs] == [("A", f"{h.id}:1")]
        assert a.proc.poll() is None and b.proc.poll() is None


@pytest.mark.slow
def test_frozen_worker_that_claims_its_task_again_cancels_the_old_run(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    """A is frozen, its run is reclaimed, and on resume A itself claims the next attempt (maybe
    before its heartbeat notices the loss): the old run must still be cancelled at once."""
    from dtq import scripts as sc

    settings = make_settings(
        redis_server.url, prefix, heartbeat_interval_s=0.5, visibility_timeout_s=2.0
    )
    rc = redis_server.client()
    a = spawn_worker(APP, settings, "--worker-id", "A", "--concurrency", "2")
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("long_async", kwargs={"seconds": 8, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
        a.signal(signal.SIGSTOP)
        # A reaper that claims nothing itself (this test), so A gets the task back.
        call = sc.reclaim_call(
            Keys(prefix).queue("default"), "R", min_idle_ms=2000, count=10,
            events_maxlen=100, ttl_s=60,
        )  # fmt: skip
        s = sc.SyncScripts(rc)
        wait_until(lambda: sc.parse_reclaim(s.run(call)).requeued == 1, 20, 0.2)
        resumed = time.time()
        a.signal(signal.SIGCONT)
        wait_until(lambda: len(events(jpath, "start")) == 2, 20)
        assert [(e["attempt"], e["worker"]) for e in events(jpath, "start")] == [(1, "A"), (2, "A")]
        wait_until(lambda: len(events(jpath, "cancelled")) == 1, 10)
        cancel = events(jpath, "cancelled")[0]
        assert cancel["attempt"] == 1
        assert cancel["t"] - resumed < settings.heartbeat_interval_s + 2.0
        assert client.result(h.id, timeout=30) == {"attempt": 2, "worker": "A"}
    assert events(jpath, "finish") == [e for e in events(jpath, "finish") if e["attempt"] == 2]


def test_touch_reports_loss_and_never_takes_back(r: redis.Redis, settings: Settings) -> None:
    """touch.lua and the outcome fence, called directly with a stale attempt."""
    from dtq import scripts as sc

    qk = Keys(settings.key_prefix).queue("default")
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("quick", args=[1])
        s = sc.SyncScripts(r)
        for stream in qk.streams:
            r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        run_a = sc.parse_claim("default", s.run(sc.claim_call(qk, "A", 1, 100, 60))).runs[0]
        # A is presumed dead: the reaper moves the entry on; B claims attempt 2.
        res = sc.parse_reclaim(
            s.run(sc.reclaim_call(qk, "B", min_idle_ms=0, count=10, events_maxlen=100, ttl_s=60))
        )
        assert res.requeued == 1
        run_b = sc.parse_claim("default", s.run(sc.claim_call(qk, "B", 1, 100, 60))).runs[0]
        assert run_b.attempt == 2
        ref_a = sc.RunRef(run_a.tid, run_a.eid, run_a.attempt)
        touched = sc.parse_touch(s.run(sc.touch_call(qk, "A", [ref_a])))
        assert touched.lost == [run_a.tid]
        # Even with B's entry id, A's stale attempt cannot take it.
        ref_a2 = sc.RunRef(run_b.tid, run_b.eid, run_a.attempt)
        assert sc.parse_touch(s.run(sc.touch_call(qk, "A", [ref_a2]))).lost == [run_b.tid]
        pend = r.xpending_range(qk.stream(5), GROUP, "-", "+", 10)
        assert [(p["message_id"], p["consumer"]) for p in pend] == [(run_b.eid, "B")]
        stale = sc.Success(run_a.tid, run_a.eid, run_a.attempt, "succeeded", json.dumps("old"))
        assert sc.parse_complete(s.run(sc.complete_call(qk, "A", [stale], 100, 60))) == [False]
        fail = sc.Failure(run_a.tid, run_a.eid, run_a.attempt, "late", 0)
        assert sc.parse_verdicts(s.run(sc.fail_call(qk, "A", [fail], 100, 60))) == ["stale"]
        again = sc.requeue_call(qk, "A", [ref_a], events_maxlen=100, ttl_s=60,
                                max_interruptions=3, retry_delay_ms=0)  # fmt: skip
        assert sc.parse_verdicts(s.run(again)) == ["stale"]
        fresh = sc.Success(run_b.tid, run_b.eid, run_b.attempt, "succeeded", json.dumps("new"))
        assert sc.parse_complete(s.run(sc.complete_call(qk, "B", [fresh], 100, 60))) == [True]
        assert client.get(h.id).result == "new"
        # A heartbeat that listed B's run just before its outcome landed: not a lost claim.
        ref_b = sc.RunRef(run_b.tid, run_b.eid, run_b.attempt)
        assert sc.parse_touch(s.run(sc.touch_call(qk, "B", [ref_b]))).lost == []
        assert r.hget(qk.stats, "stale_writes") == "3"


# --- 2. transient Redis errors ---------------------------------------------------------------


def _count(text: str, needle: str) -> int:
    return sum(1 for line in text.splitlines() if needle in line)


@pytest.mark.slow
def test_redis_restart_and_pause_under_a_running_worker(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(aof_redis.url, prefix, visibility_timeout_s=5.0)
    w = spawn_worker(APP, settings, "--concurrency", "2", DTQ_HEARTBEAT_TTL_S="30")
    with Client(settings=settings, app=app) as client:
        handles = [
            client.enqueue("long_async", kwargs={"seconds": 0.05, "journal_path": jpath})
            for i in range(150)
        ]
        wait_until(lambda: len(events(jpath, "finish")) >= 10, 30)
    aof_redis.restart(down_for=0.8)  # episode 1: connection refused, then a fresh server
    time.sleep(1.0)
    aof_redis.pause()  # episode 2: the server hangs (SIGSTOP), then answers again
    time.sleep(1.0)
    aof_redis.resume()
    resumed = time.time()
    rc = aof_redis.client()
    wait_until(lambda: all(terminal(rc, settings, h.id) for h in handles), 60)
    assert all(record(rc, settings, h.id)["status"] == "succeeded" for h in handles)
    starts = events(jpath, "start")
    assert len(starts) == len({e["id"] for e in starts}) == 150  # nothing lost, nothing rerun
    assert w.proc.poll() is None  # the worker kept running
    assert any(e["t"] > resumed for e in events(jpath, "finish"))  # work spanned both faults
    out = w.output()
    # Logged once per episode per loop, not once per failed call.
    assert 1 <= _count(out, "heartbeat: Redis error, retrying") <= 2
    assert _count(out, "heartbeat: Redis reachable again") >= 1
    with Client(settings=settings, app=app) as client:
        assert client.result(client.enqueue("quick", args=[7]).id, timeout=20) == 7


@pytest.mark.slow
def test_flushall_under_a_worker_recreates_the_groups(
    fresh_redis: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = make_settings(fresh_redis.url, prefix)
    w = spawn_worker(APP, settings)
    with Client(settings=settings, app=app) as client:
        assert client.result(client.enqueue("quick", args=[1]).id, timeout=20) == 1
        fresh_redis.client().flushall()
        hs = [client.enqueue("quick", args=[i]) for i in range(20)]
        assert [client.result(h.id, timeout=30) for h in hs] == list(range(20))
    assert w.proc.poll() is None


# --- 3. self-stop ---------------------------------------------------------------------------


@pytest.mark.slow
def test_self_stop_hands_back_when_redis_returns(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(aof_redis.url, prefix)  # heartbeat TTL = 3 x 0.2 s
    a = spawn_worker(APP, settings, "--worker-id", "A", DTQ_HARD_EXIT_S="15")
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("long_async", kwargs={"seconds": 2, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
    aof_redis.stop()
    # A stops itself (heartbeat TTL), cancels its run and keeps trying to hand it back.
    wait_until(lambda: "stopping this worker" in a.output(), 20)
    wait_until(lambda: len(events(jpath, "cancelled")) == 1, 10)
    time.sleep(1.0)
    assert a.proc.poll() is None
    aof_redis.start()
    assert a.wait(30) == 1
    rc = aof_redis.client()
    rec = record(rc, settings, h.id)
    assert (rec["status"], rec["attempt"], rec["retries"], rec["intr"]) == ("queued", "1", "0", "1")
    spawn_worker(APP, settings, "--worker-id", "B")
    with Client(settings=settings, app=app) as client:
        assert client.result(h.id, timeout=30) == {"attempt": 2, "worker": "B"}
    rec = record(rc, settings, h.id)
    assert (rec["attempt"], rec["retries"]) == ("2", "0")  # no retry was spent


@pytest.mark.slow
def test_a_resumed_worker_does_not_stop_on_one_failed_beat(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    """Frozen past the heartbeat TTL, and Redis still down for a moment after it resumes: the
    first beats fail, but the TTL counts from the first failed beat, not the last success."""
    settings = make_settings(aof_redis.url, prefix, visibility_timeout_s=10.0)
    a = spawn_worker(APP, settings, "--worker-id", "A", DTQ_HEARTBEAT_TTL_S="1.5")
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("long_async", kwargs={"seconds": 5, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
    a.signal(signal.SIGSTOP)
    aof_redis.stop()
    time.sleep(3.0)  # frozen well past the heartbeat TTL, within the visibility timeout
    a.signal(signal.SIGCONT)
    time.sleep(0.2)
    aof_redis.start()  # back well within one TTL of the first failed beat
    with Client(settings=settings, app=app) as client:
        assert client.result(h.id, timeout=30) == {"attempt": 1, "worker": "A"}
    assert a.proc.poll() is None
    assert "stopping this worker" not in a.output()


@pytest.mark.slow
def test_self_stop_when_redis_never_returns(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(aof_redis.url, prefix)
    a = spawn_worker(APP, settings, "--worker-id", "A", DTQ_HARD_EXIT_S="2")
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("long_async", kwargs={"seconds": 2, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
    aof_redis.stop()
    assert a.wait(30) == 1
    assert "could not hand back" in a.output()
    aof_redis.start()
    rc = aof_redis.client()
    assert record(rc, settings, h.id)["status"] == "running"
    spawn_worker(APP, settings, "--worker-id", "B")
    with Client(settings=settings, app=app) as client:
        assert client.result(h.id, timeout=30) == {"attempt": 2, "worker": "B"}
    rec = record(rc, settings, h.id)
    assert (rec["attempt"], rec["retries"]) == ("2", "1")  # the lost run spent a retry


# --- 4. outcome writes ----------------------------------------------------------------------


@pytest.mark.slow
def test_outcome_write_is_retried_not_rerun(
    aof_redis: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(aof_redis.url, prefix, visibility_timeout_s=10.0)
    w = spawn_worker(APP, settings, DTQ_HEARTBEAT_TTL_S="30")
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("long_async", kwargs={"seconds": 1.0, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
    aof_redis.stop()
    wait_until(lambda: len(events(jpath, "finish")) == 1, 10)  # finished while Redis is away
    time.sleep(1.0)
    aof_redis.start()
    with Client(settings=settings, app=app) as client:
        info = client.get(h.id)
        wait_until(lambda: client.get(h.id).status == "succeeded", 30)
        info = client.get(h.id)
    assert info.result["attempt"] == 1 and info.attempt == 1
    assert len(events(jpath, "start")) == 1  # stored by a retried write, never run again
    assert "outcome write: Redis error" in w.output()
    assert w.proc.poll() is None


async def test_unstorable_results_fail_without_retries(settings: Settings) -> None:
    from dtq import AsyncClient
    from tests.conftest import running_worker

    s = settings.model_copy(update={"max_result_bytes": 1000})
    async with running_worker(app, s), AsyncClient(settings=s, app=app) as c:
        h1 = await c.enqueue("not_json")
        h2 = await c.enqueue("big_result", [5000])
        h3 = await c.enqueue("big_result", [10])
        assert await c.result(h3.id, timeout=10) == "x" * 10
        for h, why in ((h1, "not JSON"), (h2, "DTQ_MAX_RESULT_BYTES=1000")):
            with pytest.raises(Exception):  # noqa: B017 - dtq.TaskFailed
                await c.result(h.id, timeout=10)
            info = await c.get(h.id)
            assert info.status == "failed" and info.attempt == 1
            assert info.error is not None and "unstorable result" in info.error
            assert why.lower() in info.error.lower() or why in info.error, info.error


# --- 5. shutdown hand-back -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.cluster
def test_sigterm_hands_back_after_the_drain(
    backend: Any, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(backend.url, prefix, drain_timeout_s=0.5)
    w = spawn_worker(APP, settings, "--worker-id", "A")
    rc = backend.client()
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("long_async", kwargs={"seconds": 30, "journal_path": jpath})
        quick = client.enqueue("long_async", kwargs={"seconds": 0.2})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
        assert client.get(quick.id).status == "succeeded"  # drained
    rec = record(rc, settings, h.id)
    assert (rec["status"], rec["attempt"], rec["retries"], rec["intr"]) == ("queued", "1", "0", "1")
    assert [e["worker"] for e in events(jpath, "cancelled")] == ["A"]


async def test_interruption_budget(settings: Settings, r: redis.Redis, jpath: str) -> None:
    """max_interruptions hand-backs are free; the next interruption counts as a failure."""
    from dtq import AsyncClient
    from tests.conftest import running_worker

    s = settings.model_copy(update={"drain_timeout_s": 0.1})
    assert s.max_interruptions == 3
    async with AsyncClient(settings=s, app=app) as c:
        h = await c.enqueue("never_done", kwargs={"journal_path": jpath})  # max_retries=0
        for i in range(1, 5):
            async with running_worker(app, s):
                for _ in range(500):
                    if len(events(jpath, "start")) == i:
                        break
                    await _asleep(0.02)
                assert len(events(jpath, "start")) == i
            rec = record(r, s, h.id)
            assert rec["attempt"] == str(i)
            if i <= 3:
                assert (rec["status"], rec["retries"], rec["intr"]) == ("queued", "0", str(i))
        assert (rec["status"], rec["retries"], rec["intr"]) == ("failed", "1", "4")
        assert rec["error"] == "interrupted by worker shutdown 4 times"
        q, tid = split_task_id(h.id)
        assert r.zscore(Keys(s.key_prefix).queue(q).dlq, tid) is not None


async def _asleep(t: float) -> None:
    import asyncio

    await asyncio.sleep(t)


@pytest.mark.slow
def test_second_sigterm_skips_the_drain(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(redis_server.url, prefix, drain_timeout_s=60)
    w = spawn_worker(APP, settings)
    rc = redis_server.client()
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("long_async", kwargs={"seconds": 60, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
    w.signal(signal.SIGTERM)
    wait_until(lambda: "draining" in w.output(), 10)
    time.sleep(0.3)
    assert w.proc.poll() is None  # still draining
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0  # far before the 60 s drain
    assert "skipping the drain" in w.output()
    assert record(rc, settings, h.id)["status"] == "queued"


@pytest.mark.slow
@pytest.mark.parametrize("task", ["long_sync", "loop_blocker"])
def test_hard_exit_deadline(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, jpath: str, task: str
) -> None:
    """A thread that will not stop (or a task blocking the event loop) cannot hold the process
    past drain + DTQ_HARD_EXIT_S."""
    settings = make_settings(redis_server.url, prefix, drain_timeout_s=0.5, hard_exit_s=2)
    w = spawn_worker(APP, settings)
    with Client(settings=settings, app=app) as client:
        client.enqueue(task, kwargs={"seconds": 120, "journal_path": jpath})
        wait_until(lambda: len(events(jpath, "start")) == 1, 30)
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    w.wait(30)  # raises if the process outlives it (the task would run 120 s)
    assert time.monotonic() - t0 < 0.5 + 2 + 10  # drain + hard exit, plus slack for a busy box


# --- 6. poison pills ---------------------------------------------------------------------------


@pytest.mark.slow
def test_poison_pill_ends_failed_worker_lost(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(redis_server.url, prefix)
    rc = redis_server.client()
    workers = [spawn_worker(APP, settings, "--concurrency", "2") for _ in range(3)]
    with Client(settings=settings, app=app) as client:
        pill = client.enqueue("poison", kwargs={"journal_path": jpath})  # max_retries=2
        good = [client.enqueue("quick", args=[i]) for i in range(40)]
        deadline = time.monotonic() + 90
        while not terminal(rc, settings, pill.id):
            assert time.monotonic() < deadline, "poison pill never ended"
            for i, w in enumerate(workers):
                if w.proc.poll() is not None:  # a supervisor restarts dead workers
                    workers[i] = spawn_worker(APP, settings, "--concurrency", "2")
            time.sleep(0.1)
        good.append(client.enqueue("quick", args=[40]))
        assert [client.result(h.id, timeout=60) for h in good] == list(range(41))
        info = client.get(pill.id)
    assert info.status == "failed"
    assert info.error is not None and info.error.startswith("worker lost")
    assert [e["attempt"] for e in events(jpath, "start")] == [1, 2, 3]
    q, tid = split_task_id(pill.id)
    assert rc.zscore(Keys(prefix).queue(q).dlq, tid) is not None


# --- 7. hung sync tasks ------------------------------------------------------------------------


@pytest.mark.slow
def test_hung_sync_task_times_out_and_its_thread_is_left(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, jpath: str
) -> None:
    settings = make_settings(redis_server.url, prefix)
    w = spawn_worker(APP, settings, "--concurrency", "2")
    with Client(settings=settings, app=app) as client:
        h = client.enqueue("hung_sync", kwargs={"seconds": 3, "journal_path": jpath})
        wait_until(lambda: client.get(h.id).status == "failed", 30)
        info = client.get(h.id)
        assert info.error is not None and "timed out after 0.5s" in info.error
        assert "thread was left to finish" in info.error
        assert events(jpath, "finish") == []  # the thread still runs...
        # ...its slot is free again: other tasks keep flowing meanwhile.
        assert client.result(client.enqueue("quick", args=[3]).id, timeout=20) == 3
        wait_until(lambda: len(events(jpath, "finish")) == 1, 20)  # it ends on its own
        time.sleep(0.5)
        info = client.get(h.id)
        assert info.status == "failed" and info.result is None  # its late result is discarded
    assert w.proc.poll() is None


@pytest.mark.slow
def test_wrong_schema_version_stops_the_worker_clearly(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    settings = make_settings(redis_server.url, prefix)
    redis_server.client().set(Keys(prefix).schema, "999")
    w = spawn_worker(APP, settings)
    assert w.wait(30) == 2
    assert "schema version '999'; this dtq knows '2'" in w.output()
    assert redis_server.client().get(Keys(prefix).schema) == "999"  # left as found
