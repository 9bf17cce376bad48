"""Fleet-wide limits (dtq.Limit): concurrency per key and rate per key, enforced in claim.lua."""

from __future__ import annotations

import signal
import time
from collections import defaultdict

import pytest
import redis

from dtq import AsyncClient, Client, InvalidRequest, Limit, Rate, TaskStatus
from dtq.settings import Settings
from dtq.store.keys import split_task_id
from tests.apps.limited import app
from tests.conftest import running_worker, wait_until
from tests.helpers import peak_overlap, spans, until

APP = "tests.apps.limited:app"


def lim_keys(r: redis.Redis, settings: Settings) -> list[str]:
    return [str(k) for k in r.scan_iter(f"{settings.key_prefix}:*:lim:*", count=1000)]


# --- declaration -------------------------------------------------------------------------------


def test_rate_parsing() -> None:
    assert Rate.parse("10/s") == Rate(10, 1000)
    assert Rate.parse("3/10s") == Rate(3, 10_000)
    assert Rate.parse("100/m") == Rate(100, 60_000)
    assert Rate.parse("20/500ms") == Rate(20, 500)
    assert Rate.parse("1/d") == Rate(1, 86_400_000)
    for bad in ("10", "0/s", "x/s", "10/parsec", "-1/s"):
        with pytest.raises(InvalidRequest):
            Rate.parse(bad)


def test_limit_declaration_checks() -> None:
    with pytest.raises(InvalidRequest):
        Limit(key=lambda t: t)
    with pytest.raises(InvalidRequest):
        Limit(concurrency=0)
    lim = Limit(key=lambda tenant, **_: tenant, concurrency=2, rate="10/s")
    assert lim.rate == Rate(10, 1000)
    assert lim.encode("t", [], {"tenant": "acme", "x": 1}) == "2|10|1000|acme"
    assert Limit(concurrency=1).encode("reports.build", [1], None) == "1|0|0|reports.build"
    with pytest.raises(InvalidRequest, match="could not be computed"):
        lim.key_for("t", [], {"other": 1})


def test_enqueue_stores_the_key(settings: Settings, r: redis.Redis) -> None:
    app.configure(settings)
    h = app.client().enqueue("tenant_job", kwargs={"tenant": "acme"})
    q, tid = split_task_id(h.id)
    rec = r.hgetall(f"{settings.key_prefix}:{{{settings.key_prefix}:{q}}}:t:{tid}")
    assert (rec["lk"], rec["lc"], rec["lrn"], rec["lrw"]) == ("acme", "2", "0", "0")


# --- behaviour, one in-process worker ------------------------------------------------------------


async def test_concurrency_limit_parks_without_spending_attempts(
    settings: Settings, r: redis.Redis
) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        kw = {"tenant": "a", "sleep": 0.3}
        limited = [await c.enqueue("tenant_job", kwargs=kw) for _ in range(8)]
        free = [await c.enqueue("free_job", ["free"]) for _ in range(4)]
        async with running_worker(app, settings):
            for h in free:
                assert await c.result(h.id, timeout=20) == "free"
            # While the limited backlog still drains two at a time, the free tasks are done.
            states = [(await c.get(h.id)).status for h in limited]
            assert any(st != TaskStatus.SUCCEEDED for st in states)
            for h in limited:
                assert await c.result(h.id, timeout=30) == "a"
        for h in limited:
            assert (await c.get(h.id)).attempt == 1, "a parked task must not spend an attempt"
    got = [(s, e) for tag, s, e, _ in spans(settings, r) if tag == "a"]
    assert peak_overlap(got) == 2
    assert lim_keys(r, settings) == [], "limit keys must empty once the runs end"


async def test_cancel_of_a_parked_task(settings: Settings, r: redis.Redis) -> None:
    held = f"{settings.key_prefix}:{{{settings.key_prefix}:default}}:lim:b:held"
    async with AsyncClient(settings=settings, app=app) as c:
        hs = [await c.enqueue("tenant_job", kwargs={"tenant": "b", "sleep": 0.5}) for _ in range(4)]
        async with running_worker(app, settings):

            async def parked() -> bool:
                return bool(r.llen(held) == 2)

            await until(parked)
            assert (await c.get(hs[3].id)).status == TaskStatus.QUEUED
            assert await c.cancel(hs[3].id)
            assert (await c.get(hs[3].id)).status == TaskStatus.CANCELLED
            for h in hs[:3]:
                assert await c.result(h.id, timeout=30) == "b"
        assert (await c.get(hs[3].id)).attempt == 0
    assert lim_keys(r, settings) == []


async def test_rate_limit_is_a_sliding_window(settings: Settings) -> None:
    async with AsyncClient(settings=settings, app=app) as c:
        hs = [await c.enqueue("rated_job", kwargs={"tenant": "r"}) for _ in range(10)]
        other = [await c.enqueue("rated_job", kwargs={"tenant": "other"}) for _ in range(3)]
        async with running_worker(app, settings):
            for h in other:
                await c.result(h.id, timeout=20)
            # The other tenant's tasks did not wait for the throttled backlog.
            states = [(await c.get(h.id)).status for h in hs]
            assert any(st != TaskStatus.SUCCEEDED for st in states)
            for h in hs:
                await c.result(h.id, timeout=30)
        infos = [await c.get(h.id) for h in hs]
    starts = sorted(int(i.started_at.timestamp() * 1000) for i in infos if i.started_at)
    # "4/s" as a sliding window: each start lies at least 1000 ms after its 4th predecessor
    # (server clock, as the claim saw it).
    for i in range(len(starts) - 4):
        assert starts[i + 4] - starts[i] >= 1000, starts
    assert starts[-1] - starts[0] >= 2000
    assert all(i.attempt == 1 for i in infos)


# --- the race: several worker processes, many tenants ------------------------------------------


@pytest.mark.slow
def test_fleet_concurrency_limit_holds_across_processes(
    settings: Settings, r: redis.Redis, spawn_worker: object
) -> None:
    app.configure(settings)
    c = Client(settings=settings, app=app)
    handles = []
    tenants = [f"t{i}" for i in range(6)]
    for _ in range(8):
        for t in tenants:
            handles.append(c.enqueue("tenant_job", kwargs={"tenant": t, "sleep": 0.15}))
    # One heavy tenant queued first must not hold the others back.
    heavy = [c.enqueue("tenant_job", kwargs={"tenant": "heavy", "sleep": 0.4}) for _ in range(20)]
    free = [c.enqueue("free_job", ["free"]) for _ in range(20)]
    procs = [spawn_worker(APP, settings, "--concurrency", "8") for _ in range(3)]  # type: ignore[operator]
    # Kill one worker mid-run: its limited runs must not leak their places.
    time.sleep(1.0)
    procs[0].signal(signal.SIGKILL)
    for h in [*handles, *free]:
        c.result(h.id, timeout=90)
    light_done = time.time()
    for h in heavy:
        c.result(h.id, timeout=120)
    heavy_done = time.time()
    assert heavy_done - light_done > 0.5, "the heavy tenant should still be draining"
    by_tenant: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for tag, s, e, _ in spans(settings, r):
        by_tenant[tag].append((s, e))
    peaks = {t: peak_overlap(v) for t, v in by_tenant.items() if t != "free"}
    assert max(peaks.values()) <= 2, peaks
    assert peaks["heavy"] == 2, "the race never reached the limit: test too weak"
    wait_until(lambda: lim_keys(r, settings) == [], 30)
    for p in procs[1:]:
        p.signal(signal.SIGTERM)
        assert p.wait(30) == 0
    c.close()
