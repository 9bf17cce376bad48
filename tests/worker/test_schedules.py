"""Periodic schedules: DST-correct cron arithmetic, exactly-once fires, grace, overlap, sync."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
import redis.asyncio as aredis

from dtq import App, AsyncClient, Client, InvalidRequest, RedisUnavailable, Settings
from dtq import scripts as sc
from dtq.schedules import (
    Schedule,
    ScheduleRunner,
    aadd_schedule,
    add_schedule,
    alist_schedules,
    aremove_schedule,
    arun_now,
    aset_enabled,
    cron_next,
    declared,
    list_schedules,
    remove_schedule,
)
from dtq.store.connection import async_redis
from dtq.store.keys import Keys
from tests.conftest import make_settings, running_worker, wait_until
from tests.redis_server import free_port

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)  # type: ignore[misc]


def fires(expr: str, start: datetime, n: int, tz: ZoneInfo = BERLIN) -> list[datetime]:
    out, t = [], start
    for _ in range(n):
        t = cron_next(expr, tz, t)
        out.append(t)
    return out


# --- time arithmetic (no Redis) --------------------------------------------------------------


def test_cron_daily_in_spring_forward_gap_fires_once_at_gap_end() -> None:
    # 2026-03-29: Berlin jumps from 02:00 CET to 03:00 CEST; 02:30 does not exist that day.
    got = fires("30 2 * * *", utc(2026, 3, 27, 12), 3)
    assert got == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]


def test_cron_daily_in_fall_back_fires_once_at_first_occurrence() -> None:
    # 2026-10-25: Berlin goes from 03:00 CEST back to 02:00 CET; 02:30 happens twice.
    got = fires("30 2 * * *", utc(2026, 10, 24, 12), 2)
    assert got == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_cron_every_half_hour_follows_real_time_through_fall_back() -> None:
    got = fires("*/30 * * * *", utc(2026, 10, 24, 23, 50), 5)
    # 02:00 CEST, 02:30 CEST, 02:00 CET, 02:30 CET, 03:00 CET
    assert got == [
        utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 0),
        utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 2, 0),
    ]  # fmt: skip


def test_cron_quarter_hours_in_spring_forward_collapse_to_one_fire() -> None:
    got = fires("*/15 * * * *", utc(2026, 3, 29, 0, 40), 3)
    # 01:45 CET, then 02:00..02:45 do not exist: one fire at 03:00 CEST, then 03:15 CEST.
    assert got == [utc(2026, 3, 29, 0, 45), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 15)]


def test_cron_in_utc_and_other_zone() -> None:
    assert cron_next("0 9 * * 1", ZoneInfo("UTC"), utc(2026, 11, 30, 9)) == utc(2026, 12, 7, 9)
    ny = ZoneInfo("America/New_York")
    assert cron_next("0 9 * * *", ny, utc(2026, 7, 1)) == utc(2026, 7, 1, 13)  # EDT
    assert cron_next("0 9 * * *", ny, utc(2026, 12, 1)) == utc(2026, 12, 1, 14)  # EST


def test_every_is_aligned_to_the_epoch() -> None:
    s = Schedule(name="s", task="t", every=30)
    assert s.next_after(1_000) == 30_000
    assert s.next_after(30_000) == 60_000
    assert s.latest_in(0, 95_000) == 90_000
    assert s.latest_in(91_000, 95_000) is None


def test_latest_in_for_cron() -> None:
    s = Schedule(name="s", task="t", cron="*/5 * * * *")
    lo = int(utc(2026, 1, 1, 10, 0).timestamp() * 1000)
    hi = int(utc(2026, 1, 1, 10, 17).timestamp() * 1000)
    assert s.latest_in(lo, hi) == int(utc(2026, 1, 1, 10, 15).timestamp() * 1000)
    assert s.latest_in(lo + 1, lo + 60_000) is None


@pytest.mark.parametrize(
    "kw",
    [
        {"cron": "* * *"},
        {"cron": "61 * * * *"},
        {"cron": "0 0 31 2 *"},
        {"cron": "* * * * *", "every": 5},
        {},
        {"every": 0.1},
        {"every": 5, "tz": "Mars/Olympus"},
        {"every": 5, "queue": "bad queue"},
        {"every": 5, "args": [object()]},
        # Refused when defined, not at every fire (each would log an error and fire nothing).
        {"every": 5, "priority": 10},
        {"every": 5, "priority": 5.5},
        {"every": 5, "priority": True},
        {"every": 5, "max_retries": -1},
        {"every": 5, "max_retries": 1.5},
        {"every": 5, "timeout": 0},
        {"every": 5, "timeout": "soon"},
        {"every": 5, "expires": "soon"},
    ],
)
def test_bad_schedules_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises((InvalidRequest, ValueError)):
        Schedule(name="s", task="t", **kw)


def test_periodic_decorator_registers_task_and_schedule() -> None:
    app = App()

    @app.periodic(cron="0 3 * * *", tz="Europe/Berlin", args=["nightly"], overlap=False)
    def build(kind: str) -> str:
        return kind

    @app.periodic(every=10, name="other")
    @app.task(name="x", queue="q2")
    async def x() -> None: ...

    assert build.name in app.tasks and "x" in app.tasks
    got = {s.name: s for s in declared(app)}
    assert got[build.name].cron == "0 3 * * *" and got[build.name].overlap is False
    assert got[build.name].source == "code"
    assert got["other"].queue == "q2" and got["other"].every == 10
    with pytest.raises(InvalidRequest):
        app.periodic(every=10, name="other", queue="q2")(x)


# --- firing against a real Redis ------------------------------------------------------------


def runner_for(app: App, settings: Settings) -> tuple[ScheduleRunner, aredis.Redis]:
    r = async_redis(settings.redis_url, decode_responses=True)
    return ScheduleRunner(r, sc.AsyncScripts(r), Keys(settings.key_prefix), settings, app), r


def server_ms(r: redis.Redis) -> int:
    s, us = r.time()  # type: ignore[misc]
    return int(s) * 1000 + int(us) // 1000


def set_next(
    r: redis.Redis, settings: Settings, name: str, ms: int, queue: str = "default"
) -> None:
    r.zadd(Keys(settings.key_prefix).queue(queue).schedules_next, {name: ms})


def tasks_of(r: redis.Redis, settings: Settings, queue: str = "default") -> list[str]:
    return sorted(r.keys(Keys(settings.key_prefix).queue(queue).task_base + "*"))  # type: ignore[arg-type]


async def test_due_schedule_fires_once_with_its_metadata(
    settings: Settings, r: redis.Redis
) -> None:
    app = App()
    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="hourly", task="add", cron="0 * * * *", args=[1, 2]))
        due = server_ms(r) - 1000
        set_next(r, settings, "hourly", due)
        runner, ar = runner_for(app, settings)
        try:
            nxt = await runner.tick("default")
            assert nxt is not None and nxt > server_ms(r)
            assert nxt % 3_600_000 == 0
            assert await runner.tick("default") == nxt  # nothing due any more
        finally:
            await ar.aclose()
        keys = tasks_of(r, settings)
        assert len(keys) == 1
        info = c.get("default:" + keys[0].rsplit(":", 1)[1])
        assert info.name == "add" and info.args == [1, 2] and info.status == "queued"
        assert {"attempt", "retries", "intr", "prio", "maxr"}.isdisjoint(r.hkeys(keys[0]))
        assert (info.priority, info.max_retries, info.attempt) == (5, 3, 0)
        assert info.metadata["schedule"] == "hourly"
        assert info.metadata["fire_at"] == datetime.fromtimestamp(due / 1000, UTC).isoformat()
        [listed] = list_schedules(c)
        assert listed.last_task_id == info.id
        assert (
            listed.next_fire_at is not None and int(listed.next_fire_at.timestamp() * 1000) == nxt
        )


async def test_a_fired_task_the_schedulers_app_does_not_know_takes_the_workers_declaration(
    settings: Settings, r: redis.Redis
) -> None:
    """As a by-name enqueue: what the schedule leaves unset (here timeout and expiry; the
    schedule sets max_retries) is the declaration's of the worker that runs it, not dtq's
    defaults (the scheduler may run where the task is not imported)."""
    app = App()
    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="nightly", task="elsewhere", every=3600, max_retries=5))
        set_next(r, settings, "nightly", server_ms(r) - 10)
        runner, ar = runner_for(app, settings)
        try:
            await runner.tick("default")
        finally:
            await ar.aclose()
        [key] = tasks_of(r, settings)
        assert r.hget(key, "dflt") == "te" and r.hget(key, "maxr") == "5"


async def test_concurrent_leaders_fire_exactly_once(settings: Settings, r: redis.Redis) -> None:
    """Eight runners on their own connections race for the same due fire: one wins."""
    app = App()
    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="race", task="add", every=60, args=[1, 1]))
    runners = [runner_for(app, settings) for _ in range(8)]
    try:
        for rnd in range(5):
            set_next(r, settings, "race", server_ms(r) - 10)
            results = await asyncio.gather(*(ru.tick("default") for ru, _ in runners))
            assert len(set(results)) == 1
            assert len(tasks_of(r, settings)) == rnd + 1
    finally:
        for _, ar in runners:
            await ar.aclose()


async def test_missed_fire_past_grace_is_skipped_and_never_floods(
    settings: Settings, r: redis.Redis
) -> None:
    app = App()
    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="yearly", task="add", cron="0 0 1 1 *", grace=5))
        add_schedule(c, Schedule(name="fast", task="add", every=1, grace=5, args=[0, 0]))
    runner, ar = runner_for(app, settings)
    try:
        # Down for 10 minutes: the yearly fire is past its 5 s grace -> it does not run.
        set_next(r, settings, "yearly", server_ms(r) - 600_000)
        await runner.tick("default")
        assert tasks_of(r, settings) == []
        events = r.xrange(Keys(settings.key_prefix).queue("default").events)
        assert any(f["type"] == "schedule_missed" for _, f in events)  # type: ignore[index,union-attr]
        nxt = r.zscore(Keys(settings.key_prefix).queue("default").schedules_next, "yearly")
        assert nxt is not None and nxt > server_ms(r) + 86_400_000
        # The every-second schedule, 10 minutes behind: one fire (the latest), not 600.
        set_next(r, settings, "fast", server_ms(r) - 600_000)
        await runner.tick("default")
        assert len(tasks_of(r, settings)) == 1
        # Down for 3 s (inside the grace): exactly one catch-up fire, not three.
        set_next(r, settings, "fast", server_ms(r) - 3000)
        await runner.tick("default")
        assert len(tasks_of(r, settings)) == 2
    finally:
        await ar.aclose()


async def test_overlap_false_skips_while_previous_run_is_active(
    settings: Settings, r: redis.Redis
) -> None:
    app = App()
    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="solo", task="add", every=60, overlap=False, args=[1, 1]))
        runner, ar = runner_for(app, settings)
        try:
            set_next(r, settings, "solo", server_ms(r) - 10)
            await runner.tick("default")
            [first] = tasks_of(r, settings)
            set_next(r, settings, "solo", server_ms(r) - 10)
            await runner.tick("default")
            assert tasks_of(r, settings) == [first]  # skipped: the first is still queued
            assert c.cancel("default:" + first.rsplit(":", 1)[1])
            set_next(r, settings, "solo", server_ms(r) - 10)
            await runner.tick("default")
            assert len(tasks_of(r, settings)) == 2  # the previous run ended: fires again
        finally:
            await ar.aclose()


@pytest.mark.cluster
async def test_code_schedules_sync_keep_next_fire_and_prune(
    settings: Settings, r: redis.Redis
) -> None:
    app = App()

    @app.periodic(cron="*/5 * * * *", name="five")
    async def five() -> None: ...

    qk = Keys(settings.key_prefix).queue("default")
    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="rt", task="add", every=60))
    runner, ar = runner_for(app, settings)
    try:
        await runner.tick("default")
        stored = r.zscore(qk.schedules_next, "five")
        assert stored is not None
        # A restart (a new runner, same code) keeps the stored next fire time.
        r.zadd(qk.schedules_next, {"five": stored + 123})
        runner2, ar2 = runner_for(app, settings)
        await runner2.tick("default")
        assert r.zscore(qk.schedules_next, "five") == stored + 123
        await ar2.aclose()
        # New code without the declaration: the code schedule goes once no live worker declared
        # it for the grace (none stamps it here: the grace counts from the first sync that
        # finds it); the runtime one stays.
        runner3, ar3 = runner_for(App(), settings)
        now = await runner3.now_ms()
        await runner3.sync("default", now)
        assert set(r.hkeys(qk.schedules)) == {"rt", "five"}  # type: ignore[arg-type]
        await runner3.sync("default", now + int(settings.declaration_grace_s * 1000) + 1)
        await ar3.aclose()
        assert set(r.hkeys(qk.schedules)) == {"rt"}  # type: ignore[arg-type]
    finally:
        await ar.aclose()


@pytest.mark.cluster
def test_add_list_remove(settings: Settings) -> None:
    with Client(settings=settings) as c:
        info = add_schedule(
            c, Schedule(name="a", task="add", cron="0 9 * * 1-5", tz="Europe/Berlin", queue="q1")
        )
        add_schedule(c, Schedule(name="b", task="add", every=30))
        got = list_schedules(c)
        assert [i.schedule.name for i in got] == ["b", "a"]  # soonest first
        assert got[1].next_fire_at == info.next_fire_at
        assert got[1].next_fire_at is not None
        local = got[1].next_fire_at.astimezone(BERLIN)
        assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
        d = got[1].to_dict()
        assert d["tz"] == "Europe/Berlin" and d["source"] == "runtime" and d["queue"] == "q1"
        assert [i.schedule.name for i in list_schedules(c, "q1")] == ["a"]
        assert remove_schedule(c, "a", "q1") is True
        assert remove_schedule(c, "a", "q1") is False
        assert [i.schedule.name for i in list_schedules(c)] == ["b"]


@pytest.mark.cluster
async def test_async_add_list_remove(settings: Settings) -> None:
    async with AsyncClient(settings=settings) as c:
        await aadd_schedule(c, Schedule(name="x", task="add", every=5))
        assert [i.schedule.name for i in await alist_schedules(c)] == ["x"]
        assert await aremove_schedule(c, "x")
        assert await alist_schedules(c) == []


def down(prefix: str) -> Settings:
    """Settings of a Redis that is not there (no re-sends: the error comes at once)."""
    return make_settings(f"redis://127.0.0.1:{free_port()}/0", prefix, client_retries=0)


def one_clear_line(exc: pytest.ExceptionInfo[RedisUnavailable], what: str) -> None:
    text = str(exc.value)
    assert text.startswith("Redis unreachable: ") and "\n" not in text, (what, text)


def test_schedule_operations_without_redis_raise_redis_unavailable(prefix: str) -> None:
    # As every other SDK call (README, "Connection blips"): not a raw redis-py error.
    with Client(settings=down(prefix)) as c:
        calls = {
            "list": lambda: list_schedules(c),
            "list one queue": lambda: list_schedules(c, "q1"),
            "add": lambda: add_schedule(c, Schedule(name="a", task="add", every=30)),
            "remove": lambda: remove_schedule(c, "a"),
        }
        for what, call in calls.items():
            with pytest.raises(RedisUnavailable) as exc:
                call()
            one_clear_line(exc, what)


async def test_async_schedule_operations_without_redis_raise_redis_unavailable(
    prefix: str,
) -> None:
    async with AsyncClient(settings=down(prefix)) as c:
        calls = {
            "list": lambda: alist_schedules(c),
            "list one queue": lambda: alist_schedules(c, "q1"),
            "add": lambda: aadd_schedule(c, Schedule(name="a", task="add", every=30)),
            "remove": lambda: aremove_schedule(c, "a"),
            "disable": lambda: aset_enabled(c, "a", "default", False),
            "run now": lambda: arun_now(c, "a", "default"),
        }
        for what, call in calls.items():
            with pytest.raises(RedisUnavailable) as exc:
                await call()
            one_clear_line(exc, what)


async def test_the_api_answers_503_for_schedules_without_redis(prefix: str) -> None:
    import httpx

    from dtq_api.app import create_app

    app = create_app(down(prefix))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h:
        r = await h.get("/api/v1/schedules")
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "redis_unavailable"
    assert r.json()["error"]["message"].count("unreachable") == 1


# --- with workers ---------------------------------------------------------------------------


@pytest.mark.cluster
async def test_worker_fires_declared_schedule(settings: Settings, r: redis.Redis) -> None:
    from tests.apps.periodic import app

    ticks = f"{settings.key_prefix}:test:ticks"
    async with running_worker(app, settings):
        await asyncio.to_thread(wait_until, lambda: r.llen(ticks) >= 2, 20)
    ids: list[str] = r.lrange(ticks, 0, -1)  # type: ignore[assignment]
    with Client(settings=settings) as c:
        fire_times = [c.get(i).metadata["fire_at"] for i in ids]
    assert len(set(fire_times)) == len(fire_times)


@pytest.mark.slow
def test_many_workers_and_a_killed_leader_never_double_fire(
    settings: Settings, r: redis.Redis, spawn_worker: Any
) -> None:
    """Three worker processes share an every-second schedule; the leader is SIGKILLed."""
    ticks = f"{settings.key_prefix}:test:ticks"
    lock = f"{settings.key_prefix}:lock:scheduler:default"
    procs = [
        spawn_worker("tests.apps.periodic:app", settings, "--worker-id", f"w{i}") for i in range(3)
    ]
    wait_until(lambda: r.llen(ticks) >= 3, 30)
    leader = r.get(lock)
    assert leader is not None
    victim = procs[int(str(leader)[1:])]
    victim.signal(signal.SIGKILL)
    victim.wait(10)
    n_at_kill = r.llen(ticks)
    # The lock lease (10 s) runs out, another worker leads and fires again.
    wait_until(lambda: r.llen(ticks) >= n_at_kill + 2, 40)  # type: ignore[operator]
    new_leader = r.get(lock)
    assert new_leader is not None and new_leader != leader
    time.sleep(1.5)
    ids: list[str] = r.lrange(ticks, 0, -1)  # type: ignore[assignment]
    with Client(settings=settings) as c:
        infos = {i: c.get(i) for i in set(ids)}
    fire_times = [info.metadata["fire_at"] for info in infos.values()]
    assert len(fire_times) == len(set(fire_times)), "a fire time was enqueued twice"
    # A task body runs once per attempt: the only repeat allowed is the run the SIGKILL cut
    # (its body had pushed its id, its outcome was never written) taken back as attempt 2.
    repeated = {i for i in ids if ids.count(i) > 1}
    assert all(ids.count(i) == 2 and infos[i].attempt == 2 for i in repeated), "a fire ran twice"
    assert len(repeated) <= 1, repeated


async def test_fired_task_keeps_the_task_limit(settings: Settings, r: redis.Redis) -> None:
    from dtq import Limit

    app = App()

    @app.periodic(every=3600, name="limited", args=["acme"])
    @app.task(name="per_tenant", limit=Limit(key=lambda tenant: tenant, concurrency=1))
    async def per_tenant(tenant: str) -> None: ...

    runner, ar = runner_for(app, settings)
    try:
        await runner.tick("default")  # stores the declaration
        set_next(r, settings, "limited", server_ms(r) - 10)
        await runner.tick("default")
    finally:
        await ar.aclose()
    [key] = tasks_of(r, settings)
    assert r.hget(key, "lc") == "1" and r.hget(key, "lk")
