"""Chords of 50 members under SIGKILL and SIGSTOP of real worker processes: every callback
starts exactly once per attempt, no flow is lost, results are complete and in order."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from typing import Any

import pytest
import redis

from dtq import Client, Settings, chord, group, sig
from dtq.store.keys import Keys
from tests.conftest import make_settings, wait_until

APP = "tests.apps.flows:app"
FLOWS = 8
MEMBERS = 50


@pytest.mark.slow
def test_chords_survive_killed_and_frozen_workers(
    redis_server: Any, prefix: str, spawn_worker: Any, r: redis.Redis
) -> None:
    settings: Settings = make_settings(redis_server.url, prefix, visibility_timeout_s=1.5)
    env = {"DTQ_QUEUES": "default,other"}
    rng = random.Random(7)

    def spawn(i: int) -> Any:
        return spawn_worker(APP, settings, "--worker-id", f"W{i}", "--concurrency", "4", **env)

    workers = [spawn(i) for i in range(3)]
    with Client(settings=settings) as c:
        ids = []
        for f in range(FLOWS):
            members = [
                sig("ident", [i], {"sleep": 0.1}, max_retries=20,
                    queue="other" if (i + f) % 3 == 0 else "default")
                for i in range(MEMBERS)
            ]  # fmt: skip
            ids.append(
                c.enqueue_workflow(
                    chord(group(*members), sig("total", [], {"sleep": 0.5}, max_retries=20))
                ).id
            )
        # Faults while the flows run: kill one worker and start another, freeze one past the
        # visibility timeout and let it go on (its late outcomes are fenced out).
        n = 3
        deadline = time.monotonic() + 180
        for round_ in range(10):
            time.sleep(0.6)
            victim = workers[rng.randrange(len(workers))]
            if round_ % 2 == 0:
                victim.kill()
                workers.remove(victim)
                workers.append(spawn(n))
                n += 1
            else:
                victim.signal(signal.SIGSTOP)
                time.sleep(2.0)
                victim.signal(signal.SIGCONT)
        results = [c.result(fid, timeout=max(1.0, deadline - time.monotonic())) for fid in ids]
        infos = [c.get(fid) for fid in ids]
    # 0 lost, complete and in order.
    assert results == [list(range(MEMBERS))] * FLOWS
    assert all(i.status == "succeeded" for i in infos)
    # Each callback started exactly once per attempt (and at least once).
    starts = [s.split("|") for s in r.lrange(f"{prefix}:test:fstarts", 0, -1)]  # type: ignore[union-attr]
    cb = Counter((tid, attempt) for tid, attempt, tag in starts if tag == "cb")
    assert cb and max(cb.values()) == 1
    cb_tasks = {tid for tid, _ in cb}
    for info in infos:
        assert info.steps is not None
        assert info.steps[-1]["id"] in cb_tasks
    members = Counter((tid, attempt) for tid, attempt, tag in starts if tag != "cb")
    assert max(members.values()) == 1  # and so did every member attempt
    # Every handover was moved and deleted, also those a killed or frozen mover held.
    keys = Keys(prefix)
    wait_until(lambda: all(r.xlen(keys.queue(q).flowq) == 0 for q in ("default", "other")), 60)
    print(f"callback attempts: {len(cb)} for {FLOWS} flows; member attempts {len(members)}")
