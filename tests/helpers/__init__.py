"""Helpers that tests in more than one file share (the fixtures every test may take are in
tests/conftest.py; the Redis servers, the API process and the apps under test are beside it).
A test file imports from here, never from another test file."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis

from dtq import Client
from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store import transport
from dtq.store.keys import GROUP, Keys, QueueKeys
from tests.redis_cluster import RedisClusterFixture


def spans(settings: Settings, r: redis.Redis) -> list[tuple[str, float, float, str]]:
    out = []
    for raw in r.lrange(f"{settings.key_prefix}:test:spans", 0, -1):  # type: ignore[union-attr]
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        tag, start, end, tid, _ = text.split("|")
        out.append((tag, float(start), float(end), tid))
    return out


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    # Ends sort before starts at the same instant: back-to-back runs do not overlap.
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


async def until(pred: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def spread_queues(backend: Any, prefix: str, n: int) -> list[str]:
    """``n`` queue names; on the cluster, each served by a different master (so a command
    naming two of them would span slots and nodes)."""
    if not isinstance(backend, RedisClusterFixture):
        return [f"q{i}" for i in range(n)]
    names: list[str] = []
    ports: set[int] = set()
    keys = Keys(prefix)
    for i in range(200):
        port = backend.master_of(keys.queue(f"q{i}").streams[0]).port
        if port not in ports:
            ports.add(port)
            names.append(f"q{i}")
            if len(names) == n:
                return names
    raise AssertionError("could not spread queues over the masters")


# The fast lane is what the test looks at: skipped where it is off.
needs_lane = pytest.mark.skipif(
    not transport.fast_lane(), reason="the fast lane is off here (DTQ_FAST_LANE=0 or redis-py)"
)


def evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def stream_args(r: redis.Redis, s: Settings, queue: str = "default") -> list[int]:
    """The first argument of each task in the queue's default-priority stream, in stream order."""
    qk = QueueKeys(s.key_prefix, queue)
    out = []
    for _, fields in r.xrange(qk.stream(5)):
        out.append(json.loads(r.hget(qk.task(fields["t"]), "args") or "null")[0])
    return out


def make_dead_letters(client: Client, n: int, name: str = "job") -> list[str]:
    keys = Keys(client.settings.key_prefix)
    qk = keys.queue("default")
    for s in qk.streams:
        client.redis.xgroup_create(s, GROUP, id="0", mkstream=True)
    hs = client.enqueue_many([{"name": name, "args": [i], "max_retries": 0} for i in range(n)])
    scripts = sc.SyncScripts(client.redis)
    runs = sc.parse_claim("default", scripts.run(sc.claim_call(qk, "w", n, 1000, 60))).runs
    fails = [sc.Failure(r.tid, r.eid, r.attempt, f"RuntimeError: no {r.tid}", 0) for r in runs]
    scripts.run(sc.fail_call(qk, "w", fails, 1000, 60))
    return [h.id for h in hs]
