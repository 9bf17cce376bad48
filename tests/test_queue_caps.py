"""Per-queue concurrency caps on one worker (DTQ_QUEUE_CONCURRENCY / --queue-concurrency)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from dtq import AsyncClient, ConfigError
from dtq.settings import Settings, load_settings
from tests.apps.limited import app
from tests.conftest import make_settings, running_worker


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
