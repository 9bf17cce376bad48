"""Schedules run now, disabled and enabled over the API: a disabled schedule never fires, even
when due and after the code's schedules are synced again; enabling it fires from its next time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aredis

from dtq import App, Client, Settings
from dtq import scripts as sc
from dtq.schedules import Schedule, ScheduleRunner, add_schedule, list_schedules, periodic
from dtq.store.keys import Keys
from dtq_api.app import create_app


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c


async def test_schedule_disable_holds_fires_and_enable_resumes(
    http: httpx.AsyncClient, settings: Settings
) -> None:
    app = App()

    async def beat() -> None: ...

    periodic(app, every=60, name="beat")(app.task(name="beat")(beat))
    r = aredis.Redis.from_url(settings.redis_url, decode_responses=True)
    runner = ScheduleRunner(r, sc.AsyncScripts(r), Keys(settings.key_prefix), settings, app)
    nxt_key = Keys(settings.key_prefix).queue("default").schedules_next
    try:
        await r.sadd(Keys(settings.key_prefix).queues, "default")  # as a worker registers it
        await runner.tick("default")  # stores the code's schedule
        base = "/api/v1/schedules/default/beat"
        off = await http.post(base + "/disable")
        assert off.status_code == 200, off.text
        assert off.json()["enabled"] is False and off.json()["next_fire_at"] is None
        listed = (await http.get("/api/v1/schedules")).json()["schedules"]
        assert [(s["name"], s["enabled"]) for s in listed] == [("beat", False)]
        # Due long ago and synced again from the code: still nothing fires.
        runner._next_sync.clear()
        assert await runner.tick("default") is None
        events = await r.xrange(Keys(settings.key_prefix).queue("default").events)
        assert not [e for e in events if e[1]["type"] == "enqueued"]
        assert (await http.post(base + "/disable")).json()["changed"] is False
        # Run now enqueues the schedule's task without moving it, disabled or not.
        run = await http.post(base + "/run")
        assert run.status_code == 201, run.text
        t = run.json()
        assert t["name"] == "beat" and t["status"] == "queued"
        assert t["metadata"]["schedule"] == "beat"
        on = await http.post(base + "/enable")
        assert on.json()["enabled"] is True and on.json()["changed"] is True
        score = await r.zscore(nxt_key, "beat")
        assert score is not None and score % 60_000 == 0
        assert await runner.tick("default") == int(score)
        missing = await http.post("/api/v1/schedules/default/nope/run")
        assert missing.status_code == 404
    finally:
        await r.aclose()


async def test_runtime_schedule_disabled_stays_listed_by_the_sdk(settings: Settings) -> None:
    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="hourly", task="add", cron="0 * * * *"))
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h:
        assert (await h.post("/api/v1/schedules/default/hourly/disable")).status_code == 200
        with Client(settings=settings) as c:
            from dtq.schedules import list_schedules

            [info] = list_schedules(c)
            assert info.next_fire_at is None and info.enabled is False


def test_cli_schedules_remove(settings: Settings, capsys: Any, monkeypatch: Any) -> None:
    """`dtq schedules remove NAME`: the explicit removal of a schedule (exit 1 when none)."""
    from dtq.cli import main

    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)

    def dtq(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(list(argv))
        out, err = capsys.readouterr()
        return int(exc.value.code or 0), out, err

    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="nightly", task="add", every=86400, queue="q1"))
        add_schedule(c, Schedule(name="hourly", task="add", every=3600))
        code, out, _ = dtq("schedules", "remove", "nightly", "--queue", "q1")
        assert code == 0 and "schedule nightly of queue q1 removed" in out
        code, out, err = dtq("schedules", "remove", "nightly", "--queue", "q1", "--json")
        assert code == 1 and json.loads(out)["removed"] is False and "no schedule" in err
        code, out, _ = dtq("schedules", "remove", "nightly", "--queue", "q1")
        assert code == 1 and "removed" not in out
        code, out, _ = dtq("schedules", "--json")
        assert code == 0 and [s["name"] for s in json.loads(out)["schedules"]] == ["hourly"]
        assert dtq("schedules", "remove", "hourly")[0] == 0
        assert list_schedules(c) == []
