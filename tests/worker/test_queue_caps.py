"""Per-queue concurrency caps on one worker (DTQ_QUEUE_CONCURRENCY / --queue-concurrency)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import redis

from dtq import AsyncClient, ConfigError
from dtq.settings import Settings, load_settings
from tests.apps.limited import app
from tests.conftest import make_settings, running_worker
from tests.redis_server import RedisServer


def spans(settings: Settings, r: redis.Redis) -> list[tuple[str, float, float]]:
    out = []
    for raw in r.lrange(f"{settings.key_prefix}:test:spans", 0, -1):  # type: ignore[union-attr]
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        tag, start, end, *_ = text.split("|")
        out.append((tag, float(start), float(end)))
    return out


def test_setting_parses_and_validates() -> None:
    s = load_settings(worker_concurrency=8, queue_concurrency="bulk=4, critical=8")
    assert s.queue_concurrency == {"bulk": 4, "critical": 8}
    for bad in ("bulk=0", "bulk=9", "bulk", "=3", "bulk=x"):
        with pytest.raises(ConfigError, match="DTQ_QUEUE_CONCURRENCY"):
            load_settings(worker_concurrency=8, queue_concurrency=bad)


def test_setting_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTQ_QUEUE_CONCURRENCY", "slow=2")
    monkeypatch.setenv("DTQ_WORKER_CONCURRENCY", "4")
    assert load_settings().queue_concurrency == {"slow": 2}


async def test_slow_queue_cannot_take_every_slot(
    redis_server: object, prefix: str, r: redis.Redis
) -> None:
    settings = make_settings(
        redis_server.url,  # type: ignore[attr-defined]
        prefix,
        queues=("slow", "fast"),
        worker_concurrency=4,
        queue_concurrency={"slow": 2},
    )
    async with AsyncClient(settings=settings, app=app) as c:
        # The slow queue is listed first and has a backlog: without the cap it would take all
        # four slots for 1.5 s and the fast tasks would wait behind it.
        slow = [await c.enqueue("slow_job", [f"slow{i}", 1.5]) for i in range(8)]
        async with running_worker(app, settings):
            await asyncio.sleep(0.3)
            fast = [await c.enqueue("fast_job", [f"fast{i}"]) for i in range(6)]
            for h in fast:
                await c.result(h.id, timeout=30)
            for h in slow:
                await c.result(h.id, timeout=60)
    got = spans(settings, r)
    slow_spans = [(s, e) for tag, s, e in got if tag.startswith("slow")]
    fast_ends = [e for tag, _, e in got if tag.startswith("fast")]
    first_slow_end = min(e for _, e in slow_spans)
    assert max(fast_ends) < first_slow_end, "fast tasks waited for a slow one to end"
    # Never more than the cap of slow runs at once on this worker.
    events = sorted([(s, 1) for s, _ in slow_spans] + [(e, -1) for _, e in slow_spans])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == 2


async def _capped_runs(
    server: RedisServer, prefix: str, queues: tuple[str, ...], n: int, sleep: float, command: str
) -> tuple[Settings, int]:
    """``n`` slow runs of ``sleep`` s on a worker of ``queues`` with slow capped at 1 of 4
    slots: the settings, and how many times the worker sent ``command`` meanwhile."""
    s = make_settings(server.url, prefix, queues=queues, worker_concurrency=4,
                      queue_concurrency={"slow": 1})  # fmt: skip
    with server.client() as r:
        async with AsyncClient(settings=s, app=app) as c:
            hs = [await c.enqueue("slow_job", [f"slow{i}", sleep]) for i in range(n)]
            async with running_worker(app, s):
                before = _calls(r, command)
                for h in hs:
                    await c.result(h.id, timeout=30)
                return s, _calls(r, command) - before


def _calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_worker_whose_queues_are_at_their_caps_sends_nothing_until_a_run_ends(
    fresh_redis: RedisServer, prefix: str
) -> None:
    """Slots free but the only queue at its cap: before, the poll loop sent an XREAD from id 0
    after every empty pass, answered at once by the queue's backlog (8,750 XREADs and 1.8 s of
    CPU in 3 s of three sleeping runs)."""
    _, during = await _capped_runs(fresh_redis, prefix, ("slow",), 3, 0.5, "xread")
    assert during <= 3, f"{during} XREADs while the queue sat at its cap"


async def test_a_capped_run_that_ends_wakes_the_idle_worker_for_its_backlog(
    fresh_redis: RedisServer, prefix: str
) -> None:
    """A capped queue with a backlog and an empty second queue: the worker waits for new
    entries, and each capped run that ends must end that wait (CLIENT UNBLOCK) for the next of
    the backlog. Before, the next run started when the wait's block ran out: six runs of 0.2 s
    at a cap of 1 took 5.4 s, not 1.3."""
    s, unblocked = await _capped_runs(
        fresh_redis, prefix, ("slow", "fast"), 6, 0.2, "client|unblock"
    )
    with fresh_redis.client() as r:
        got = sorted((start, end) for tag, start, end in spans(s, r) if tag.startswith("slow"))
    assert len(got) == 6 and all(a[1] <= b[0] for a, b in itertools.pairwise(got))
    assert unblocked >= 1, "no capped run ended the idle wait"
