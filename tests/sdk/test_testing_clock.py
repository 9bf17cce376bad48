"""``dtq.testing.TestQueue`` fires periodic schedules on a test clock (advance / fire_due), and
``dtq schedules`` shows the next fire in the schedule's own zone."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from dtq import App
from dtq.cli import main
from dtq.schedules import Schedule, add_schedule
from dtq.settings import Settings
from dtq.testing import TestQueue


def _app() -> tuple[App, list[str]]:
    app = App()
    seen: list[str] = []

    @app.periodic(every=30, name="half-minute")
    @app.task(name="beat")
    def beat() -> str:
        seen.append("beat")
        return "ok"

    @app.periodic(cron="0 3 * * *", tz="Europe/Berlin", name="nightly")
    @app.task(name="nightly_report")
    async def nightly_report() -> str:
        seen.append("nightly")
        return "report"

    return app, seen


def test_advance_fires_each_due_schedule_at_each_fire_time() -> None:
    app, seen = _app()
    with TestQueue(app) as tq:
        assert tq.fire_due() == []  # stored at the test clock; nothing due yet
        fired = tq.advance(120)
        names = [app.client().get(t).name for t in fired]
        assert names.count("beat") == 4 and "nightly_report" not in names
        infos = tq.drain()
        assert [i.status for i in infos] == ["succeeded"] * 4 and seen == ["beat"] * 4


def test_a_day_later_the_nightly_schedule_fired_once_at_its_local_time() -> None:
    app = App()

    @app.periodic(cron="0 3 * * *", tz="Europe/Berlin", name="nightly")
    @app.task(name="nightly_report")
    async def nightly_report() -> str:
        return "report"

    with TestQueue(app) as tq:
        [fired] = tq.advance(24 * 3600)
        fire_at = datetime.fromisoformat(app.client().get(fired).metadata["fire_at"])
        local = fire_at.astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.hour, local.minute) == (3, 0)
        assert tq.now() > datetime.now(UTC) + timedelta(hours=23, minutes=59)
        [info] = tq.drain()
        assert info.result == "report"


def test_advance_makes_delayed_tasks_due() -> None:
    app = App()

    @app.task(name="later")
    def later() -> int:
        return 1

    with TestQueue(app) as tq:
        h = app.client().enqueue(later.options(delay=300))
        assert tq.drain() == []
        tq.advance(299)
        assert tq.drain() == []
        tq.advance(2)
        [info] = tq.drain()
        assert info.id == h.id and info.status == "succeeded"


async def test_async_fire_due_with_a_runtime_schedule() -> None:
    app = App()

    @app.task(name="ping")
    async def ping() -> str:
        return "pong"

    with TestQueue(app) as tq:
        add_schedule(app.client(), Schedule(name="p", task="ping", every=10))
        assert await tq.afire_due() == []
        fired = await tq.aadvance(10.5)
        # Every-10-s fire times sit on multiples of 10 s since the epoch, so 10.5 s cross one
        # of them, or two when the clock started within 0.5 s of one: each fires once.
        assert 1 <= len(fired) <= 2
        c = app.client()
        at = sorted(datetime.fromisoformat(c.get(t).metadata["fire_at"]) for t in fired)
        assert all(t.timestamp() % 10 == 0 for t in at)
        assert all((b - a).total_seconds() == 10 for a, b in itertools.pairwise(at))
        infos = await tq.adrain()
        assert [i.result for i in infos] == ["pong"] * len(fired)


def test_dtq_schedules_shows_the_next_fire_in_the_schedules_zone(
    settings: Settings, capsys: Any, monkeypatch: Any
) -> None:
    from dtq import Client

    with Client(settings=settings) as c:
        add_schedule(c, Schedule(name="nightly", task="report", cron="0 3 * * *",
                                 tz="Europe/Berlin"))  # fmt: skip
    monkeypatch.setenv("DTQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DTQ_KEY_PREFIX", settings.key_prefix)
    capsys.readouterr()
    try:
        main(["schedules"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("nightly"))
    # 03:00 in Berlin is 02:00 UTC (winter) or 01:00 UTC (summer): both are shown, zone named.
    assert "03:00:00 CET" in row or "03:00:00 CEST" in row, row
    assert "02:00:00 UTC" in row or "01:00:00 UTC" in row, row


def test_testqueue_still_works_from_async_code() -> None:
    app, _ = _app()

    async def go() -> list[str]:
        with TestQueue(app) as tq:
            tq.fire_due()
            return tq.advance(30)

    assert len(asyncio.run(go())) == 1
