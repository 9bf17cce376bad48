"""Rolling deploys: workers of two versions of one app share a queue (tests/apps/rollout.py:
``v1`` knows task ``a``, ``v2`` knows ``a`` and ``b``). A worker hands a task whose name it does
not know back, spending nothing, while a live worker declares that name on the queue, and fails
it only once no live worker has declared it for ``DTQ_DECLARATION_GRACE_S``; the scheduler
leader keeps every code schedule a live worker declares."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from dtq import Client, Settings, TaskFailed
from dtq.models import TaskStatus
from dtq.store.keys import Keys
from tests.conftest import make_settings, wait_until
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

V1, V2 = "tests.apps.rollout:v1", "tests.apps.rollout:v2"


def _settings(server: RedisServer, prefix: str) -> Settings:
    return make_settings(server.url, prefix)


def _up(r: Any, keys: Keys, worker_id: str, task: str) -> None:
    """Wait until ``worker_id`` beats and has published that it runs ``task``."""
    wait_until(lambda: task in (r.hget(keys.worker(worker_id), "tasks") or ""), timeout=30)


def test_unknown_name_goes_to_a_live_worker_that_declares_it(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    s = _settings(redis_server, prefix)
    r, keys = redis_server.client(), Keys(prefix)
    v2 = spawn_worker(V2, s, DTQ_WORKER_ID="v2")
    _up(r, keys, "v2", '"b"')
    # v2 is frozen: only v1 claims, so every b task meets a worker that does not know it.
    v2.signal(signal.SIGSTOP)
    spawn_worker(V1, s, DTQ_WORKER_ID="v1", DTQ_DECLARATION_GRACE_S="300")
    _up(r, keys, "v1", '"a"')
    with Client(settings=s) as c:
        hs = [c.enqueue("b", args=[i]) for i in range(20)]
        wait_until(lambda: all(c.get(h.id).attempt >= 1 for h in hs), timeout=30)
        v2.signal(signal.SIGCONT)
        results = [c.result(h.id, timeout=60) for h in hs]
        assert results == list(range(20))
        infos = [c.get(h.id) for h in hs]
    assert all(i.status is TaskStatus.SUCCEEDED for i in infos)
    assert all(i.retries == 0 for i in infos)  # no attempt was spent on the hand-backs


def test_unknown_name_fails_once_no_live_worker_declared_it_for_the_grace(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    s = _settings(redis_server, prefix)
    r, keys = redis_server.client(), Keys(prefix)
    spawn_worker(V1, s, DTQ_WORKER_ID="v1", DTQ_DECLARATION_GRACE_S="5")
    v2 = spawn_worker(V2, s, DTQ_WORKER_ID="v2")
    _up(r, keys, "v1", '"a"')
    _up(r, keys, "v2", '"b"')
    # v2 stops (gracefully: a frozen one could hold the task in its blocked claim): its last
    # declaration of b ages from here.
    v2.signal(signal.SIGTERM)
    assert v2.wait() == 0
    with Client(settings=s) as c:
        h = c.enqueue("b", args=[1])
        with pytest.raises(TaskFailed):
            c.result(h.id, timeout=60)
        info = c.get(h.id)
    assert info.status is TaskStatus.FAILED
    assert "unknown task 'b'" in (info.error or "")
    # Handed back while v2's declaration was within the grace, failed after it.
    assert info.attempt > 1


def test_a_name_no_worker_ever_declared_fails_at_once(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    s = _settings(redis_server, prefix)
    r, keys = redis_server.client(), Keys(prefix)
    spawn_worker(V1, s, DTQ_WORKER_ID="v1", DTQ_DECLARATION_GRACE_S="300")
    _up(r, keys, "v1", '"a"')
    with Client(settings=s) as c:
        h = c.enqueue("payments.charge")
        with pytest.raises(TaskFailed):
            c.result(h.id, timeout=30)
        info = c.get(h.id)
    assert info.attempt == 1 and "unknown task 'payments.charge'" in (info.error or "")


def _log_has(w: Any, text: str) -> bool:
    return text in w.output()


def test_leader_keeps_the_schedule_of_a_live_worker_of_another_version(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    s = _settings(redis_server, prefix)
    r, keys = redis_server.client(), Keys(prefix)
    qk = keys.queue("default")
    v2 = spawn_worker(V2, s, DTQ_WORKER_ID="v2")
    wait_until(lambda: r.get(keys.scheduler_lock_of("default")) == "v2", timeout=30)
    wait_until(lambda: r.hexists(qk.schedules, "s-b"), timeout=30)
    v1 = spawn_worker(V1, s, DTQ_WORKER_ID="v1", DTQ_DECLARATION_GRACE_S="300")
    _up(r, keys, "v1", '"a"')
    # Leadership moves to v1 (v2 frozen past the lock's lease); v1 syncs the code schedules.
    v2.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: r.get(keys.scheduler_lock_of("default")) == "v1", timeout=40)
        wait_until(
            lambda: (
                _log_has(v1, "schedule s-b of queue default removed")
                or _log_has(v1, "schedule s-b of queue default kept")
            ),
            timeout=30,
        )
    finally:
        v2.signal(signal.SIGCONT)
    assert r.hexists(qk.schedules, "s-b"), v1.output()
    assert r.zscore(qk.schedules_next, "s-b") is not None


def test_a_new_version_stores_its_schedule_while_another_leads(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    s = _settings(redis_server, prefix)
    r, keys = redis_server.client(), Keys(prefix)
    qk = keys.queue("default")
    spawn_worker(V1, s, DTQ_WORKER_ID="v1")
    wait_until(lambda: r.get(keys.scheduler_lock_of("default")) == "v1", timeout=30)
    spawn_worker(V2, s, DTQ_WORKER_ID="v2")
    _up(r, keys, "v2", '"b"')
    wait_until(lambda: r.hexists(qk.schedules, "s-b"), timeout=30)
    assert r.zscore(qk.schedules_next, "s-b") is not None


def test_leader_removes_a_schedule_no_live_worker_declared_for_the_grace(
    redis_server: RedisServer, prefix: str, spawn_worker: Any
) -> None:
    s = _settings(redis_server, prefix)
    r, keys = redis_server.client(), Keys(prefix)
    qk = keys.queue("default")
    v2 = spawn_worker(V2, s, DTQ_WORKER_ID="v2")
    wait_until(lambda: r.hexists(qk.schedules, "s-b"), timeout=30)
    spawn_worker(V1, s, DTQ_WORKER_ID="v1", DTQ_DECLARATION_GRACE_S="2")
    _up(r, keys, "v1", '"a"')
    v2.kill()
    wait_until(lambda: not r.hexists(qk.schedules, "s-b"), timeout=60)
    assert r.hexists(qk.schedules, "s-a")
