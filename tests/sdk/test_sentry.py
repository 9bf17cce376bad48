"""The Sentry example (dtq.contrib.sentry) with sentry-sdk's transport replaced by one that
keeps envelopes in memory, and a real worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from dtq import App, AsyncClient, Retry, Settings, TaskFailed, current_task
from dtq.contrib.sentry import SentryMiddleware
from tests.conftest import running_worker


class MemoryTransport(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        return [e for env in self.envelopes if (e := env.get_event()) is not None]


@pytest.fixture
def transport() -> Iterator[MemoryTransport]:
    t = MemoryTransport()
    # Default integrations off: the logging one would also report ERROR log lines.
    sentry_sdk.init(
        dsn="https://public@sentry.example.com/1", transport=t, default_integrations=False
    )
    yield t
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def sentry_app() -> App:
    app = App()

    @app.task(name="explode", max_retries=1)
    async def explode() -> None:
        sentry_sdk.set_tag("tenant", "acme")  # in this run's scope only
        raise ValueError("kaboom")

    @app.task(name="fine")
    def fine() -> str:
        sentry_sdk.set_tag("leak", "yes")  # must not reach another run's event
        return "ok"

    @app.task(name="again", max_retries=1)
    async def again() -> str:
        if current_task().attempt == 1:
            raise Retry(delay=0)
        return "ok"

    app.add_middleware(SentryMiddleware())
    return app


async def test_a_failing_task_produces_one_event_with_the_tasks_tags(
    settings: Settings, transport: MemoryTransport
) -> None:
    app = sentry_app()
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        for _ in range(3):
            await c.result((await c.enqueue("fine")).id, timeout=15)
        again = await c.enqueue("again")
        bad = await c.enqueue("explode")
        with pytest.raises(TaskFailed):
            await c.result(bad.id, timeout=15)
        assert await c.result(again.id, timeout=15) == "ok"
        deadline = time.monotonic() + 20
        while not transport.events():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # room for a wrong second event to show up
    sentry_sdk.flush()
    (event,) = transport.events()  # attempt 1 was retried: not reported; nor were the others
    assert event["tags"] == {
        "dtq.task": "explode", "dtq.queue": "default", "dtq.attempt": "2",
        "dtq.task_id": bad.id, "dtq.outcome": "failed", "tenant": "acme",
    }  # fmt: skip
    (exc,) = event["exception"]["values"]
    assert exc["type"] == "ValueError" and exc["value"] == "kaboom"
    assert exc["stacktrace"]["frames"][-1]["function"] == "explode"
    assert event["contexts"]["dtq"]["max_retries"] == 1


async def test_report_retries_reports_each_failed_attempt(
    settings: Settings, transport: MemoryTransport
) -> None:
    app = App()

    @app.task(name="explode", max_retries=1)
    async def explode() -> None:
        raise ValueError("kaboom")

    app.add_middleware(SentryMiddleware(report_retries=True))
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        bad = await c.enqueue("explode")
        with pytest.raises(TaskFailed):
            await c.result(bad.id, timeout=15)
        deadline = time.monotonic() + 20
        while len(transport.events()) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    tags = sorted((e["tags"]["dtq.attempt"], e["tags"]["dtq.outcome"]) for e in transport.events())
    assert tags == [("1", "retried"), ("2", "failed")]
