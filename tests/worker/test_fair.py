"""Fair mode (DTQ_FAIR / --fair): weighted selection across priority bands."""

from __future__ import annotations

import redis

from dtq import AsyncClient
from dtq.settings import Settings
from dtq.store.keys import Keys
from tests.apps.limited import app
from tests.conftest import make_settings, running_worker


def starts(settings: Settings, r: redis.Redis) -> list[tuple[float, str]]:
    out = []
    for raw in r.lrange(f"{settings.key_prefix}:test:spans", 0, -1):  # type: ignore[union-attr]
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        tag, start, *_ = text.split("|")
        out.append((float(start), tag))
    return sorted(out)


async def run_flood(settings: Settings) -> list[str]:
    """Run the flood; the task ids in enqueue order (100 of p9, then 5 of p0)."""
    async with AsyncClient(settings=settings, app=app) as c:
        # Everything is queued before the worker starts, so the order is the claim's choice.
        batch = [{"name": "free_job", "args": ["p9", 0.01], "priority": 9} for _ in range(100)]
        batch += [{"name": "free_job", "args": ["p0", 0.01], "priority": 0} for _ in range(5)]
        handles = await c.enqueue_many(batch)
        async with running_worker(app, settings):
            for h in handles:
                await c.result(h.id, timeout=60)
    return [h.id for h in handles]


def claim_order(settings: Settings, r: redis.Redis) -> list[str]:
    """Task ids in the order the claims started them: the queue's ``started`` events (one
    entry per claim, its tids in claim order). The bodies' own start times do not give it: two
    runs one claim started together begin in either order on a busy machine."""
    out = []
    for _, f in r.xrange(Keys(settings.key_prefix).queue("default").events):  # type: ignore[union-attr]
        if f["type"] == "started":
            out += [f"default:{tid}" for tid in f["tid"].split(" ")]
    return out


async def test_fair_mode_does_not_starve_the_low_band(
    redis_server: object, prefix: str, r: redis.Redis
) -> None:
    s = make_settings(redis_server.url, prefix, worker_concurrency=2, fair=True)  # type: ignore[attr-defined]
    await run_flood(s)
    order = [tag for _, tag in starts(s, r)]
    last_p9 = max(i for i, t in enumerate(order) if t == "p9")
    p0 = [i for i, t in enumerate(order) if t == "p0"]
    assert len(p0) == 5
    assert max(p0) < last_p9, f"p0 waited for the whole p9 flood: {order}"
    assert p0[0] < 20, "the first p0 task should start within the first round of picks"
    # Weighted, not round-robin: p9 (weight 10) still gets most early picks.
    assert order[:11].count("p9") >= 8


async def test_strict_mode_keeps_strict_order(
    redis_server: object, prefix: str, r: redis.Redis
) -> None:
    s = make_settings(redis_server.url, prefix, worker_concurrency=2)  # type: ignore[attr-defined]
    ids = await run_flood(s)
    tag = {tid: "p9" if i < 100 else "p0" for i, tid in enumerate(ids)}
    order = [tag[tid] for tid in claim_order(s, r)]
    assert order == ["p9"] * 100 + ["p0"] * 5
