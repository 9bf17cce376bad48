"""The reaper's reach: one pass finds every lost run, however many live ones its band holds,
in calls of bounded work (reclaim.lua continues a band from a cursor the reaper passes back)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from dtq import App
from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store.keys import GROUP, Keys, QueueKeys, new_tid
from tests.conftest import create_groups, make_settings
from tests.redis_server import RedisServer

Q = "default"
CONCURRENCY = 8  # the reaper adopts at most max(10, 2 x concurrency) = 16 entries per call


@pytest.fixture
def cfg(redis_server: RedisServer, prefix: str) -> Settings:
    return make_settings(
        redis_server.url, prefix, visibility_timeout_s=30, worker_concurrency=CONCURRENCY
    )


@pytest.fixture
async def worker(cfg: Settings) -> AsyncIterator[Any]:
    """A worker whose loops do not run: the test drives its reaper alone."""
    from dtq_worker.worker import Worker

    w = Worker(App(), cfg)
    yield w
    await w._close()


def start_runs(r: redis.Redis, qk: QueueKeys, prios: list[int], consumer: str) -> list[Any]:
    """Enqueue one task per priority given and claim them all as ``consumer`` (records running,
    entries pending, idle ~0 as a live worker's touched entries are)."""
    s = sc.SyncScripts(r)
    tasks = [
        sc.NewTask(
            tid=new_tid(), name="t", args="[]", kwargs="", priority=p, max_retries=3,
            timeout=None, delay_ms=0, expires_ms=0, idempotency_key="", meta="",
        )
        for p in prios
    ]  # fmt: skip
    for i in range(0, len(tasks), 250):
        s.run(sc.enqueue_call(qk, tasks[i : i + 250], 0))
    runs: list[Any] = []
    while len(runs) < len(tasks):
        batch = sc.parse_claim(Q, s.run(sc.claim_call(qk, consumer, 500, 0, 60)))
        assert batch.runs
        runs += batch.runs
    return runs


def lose(r: redis.Redis, qk: QueueKeys, run: Any, prio: int) -> None:
    """Make a run's entry look abandoned: idle for a minute (its worker stopped touching it)."""
    r.execute_command(
        "XCLAIM", qk.stream(prio), GROUP, "live", 0, run.eid, "IDLE", 60_000, "JUSTID"
    )


def pending_owners(r: redis.Redis, qk: QueueKeys) -> dict[tuple[str, str], str]:
    """(stream, entry id) -> consumer of every pending entry (ids repeat across streams)."""
    out = {}
    for stream in qk.streams:
        for p in r.xpending_range(stream, GROUP, "-", "+", 100_000):
            out[(stream, p["message_id"])] = p["consumer"]
    return out


async def test_a_reaper_pass_reaches_a_lost_run_behind_hundreds_of_live_ones(
    cfg: Settings, r: redis.Redis, worker: Any
) -> None:
    qk = Keys(cfg.key_prefix).queue(Q)
    create_groups(r, qk)
    runs = start_runs(r, qk, [5] * 401, "live")
    lost = runs[-1]  # the newest entry: behind 400 live ones in the band's pending list
    lose(r, qk, lost, 5)
    res = await worker.reaper.reap_once()
    assert (res.requeued, res.failed) == (1, 0)
    rec = r.hgetall(qk.task(lost.tid))
    assert rec["status"] == "queued" and rec["retries"] == "1" and "worker lost" in rec["error"]
    # The live runs are untouched: still running, still pending under their worker.
    owners = pending_owners(r, qk)
    assert len(owners) == 400 and set(owners.values()) == {"live"}
    assert {r.hget(qk.task(x.tid), "status") for x in runs[:-1]} == {"running"}


async def test_a_reaper_pass_over_thousands_of_entries_takes_bounded_calls(
    cfg: Settings, r: redis.Redis, worker: Any
) -> None:
    """Every lost run of a large pending list is found in one pass; each call does bounded
    work (at most STEPS XAUTOCLAIMs of COUNT entries) and the pass takes no more calls than
    the pending list needs."""
    qk = Keys(cfg.key_prefix).queue(Q)
    create_groups(r, qk)
    sizes = {9: 1200, 5: 2000, 0: 800}
    prios = [p for p, n in sizes.items() for _ in range(n)]
    runs = start_runs(r, qk, prios, "live")
    lost = {}
    for i in range(150, len(runs), 333):  # scattered through every band, the last ones too
        prio = runs[i].priority
        lose(r, qk, runs[i], prio)
        lost[runs[i].tid] = runs[i]
    replies: list[sc.ReclaimResult] = []
    orig = worker.scripts.run

    async def counted(call: sc.Call, *a: Any) -> Any:
        raw = await orig(call, *a)
        if call.script == "reclaim":
            replies.append(sc.parse_reclaim(raw))
        return raw

    worker.scripts.run = counted
    res = await worker.reaper.reap_once()
    assert res.requeued == len(lost) and res.failed == 0
    assert all(r.hget(qk.task(t), "status") == "queued" for t in lost)
    count = max(10, 2 * CONCURRENCY)
    # Each XAUTOCLAIM examines up to 10 x COUNT entries or stops at COUNT adopted; every band
    # (all ten streams exist) ends with one call that finds its end.
    steps_needed = sum(math.ceil(n / (10 * count)) + 1 for n in sizes.values()) + 7
    steps_needed += math.ceil(len(lost) / count) + len(lost)  # adoption may cut a step short
    calls_bound = math.ceil(steps_needed / sc.RECLAIM_STEPS)
    print("reclaim calls in the pass:", len(replies), "bound:", calls_bound)
    assert 2 <= len(replies) <= calls_bound, (len(replies), calls_bound)
    assert all(x.steps <= sc.RECLAIM_STEPS for x in replies)
    assert all(x.more for x in replies[:-1]) and not replies[-1].more
    # A second pass finds nothing more and leaves the live runs alone.
    replies.clear()
    again = await worker.reaper.reap_once()
    assert (again.requeued, again.failed, again.absorbed) == (0, 0, 0)
    owners = pending_owners(r, qk)
    assert len(owners) == len(runs) - len(lost) and set(owners.values()) == {"live"}
