"""Middleware (dtq.middleware): before_enqueue, around_task and on_outcome with a real worker."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis

from dtq import (
    App,
    AsyncClient,
    Client,
    ConfigError,
    DtqError,
    Fail,
    Settings,
    TaskContext,
    TaskFailed,
    current_task,
)
from dtq.middleware import EnqueueRequest, Middleware, RunOutcome
from tests.conftest import make_settings, running_worker

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def make_app() -> App:
    app = App()

    @app.task(name="headers")
    async def headers() -> dict[str, Any]:
        ctx = current_task()
        return {"headers": dict(ctx.headers), "seen": request_id.get()}

    @app.task(name="headers_sync")
    def headers_sync() -> dict[str, Any]:
        ctx = current_task()
        return {"headers": dict(ctx.headers), "seen": request_id.get()}

    @app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="boom", max_retries=1)
    async def boom() -> None:
        raise RuntimeError("boom")

    return app


async def wait_for(pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class Tagging(Middleware):
    """Sets metadata and a header at enqueue; exposes the header as a context variable."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def before_enqueue(self, request: EnqueueRequest) -> None:
        request.metadata["tenant"] = "acme"
        request.headers["x-request-id"] = f"req-{request.name}"

    async def around_task(self, ctx: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        self.events.append(f"enter {ctx.name} {ctx.attempt}")
        token = request_id.set(ctx.headers.get("x-request-id", ""))
        try:
            return await call_next()
        finally:
            request_id.reset(token)
            self.events.append(f"exit {ctx.name}")


async def test_before_enqueue_amends_the_request_and_around_task_sees_it(
    settings: Settings,
) -> None:
    """Metadata and headers set by before_enqueue are stored and reach the run; a context
    variable set by around_task is seen by async bodies and by sync bodies in their thread."""
    app = make_app()
    mw = Tagging()
    app.add_middleware(mw)
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        a = await c.enqueue("headers")
        s = await c.enqueue("headers_sync")
        assert await c.result(a.id, timeout=15) == {
            "headers": {"x-request-id": "req-headers"}, "seen": "req-headers",
        }  # fmt: skip
        assert await c.result(s.id, timeout=15) == {
            "headers": {"x-request-id": "req-headers_sync"}, "seen": "req-headers_sync",
        }  # fmt: skip
        assert (await c.get(a.id)).metadata == {"tenant": "acme"}
        # enqueue_many and the typed shortcut go through the hook too.
        (m,) = await c.enqueue_many([{"name": "headers", "metadata": {"own": 1}}])
        assert (await c.result(m.id, timeout=15))["headers"] == {"x-request-id": "req-headers"}
        assert (await c.get(m.id)).metadata == {"own": 1, "tenant": "acme"}
        h = await app.tasks["add"].aenqueue(2, 3)
        assert await c.result(h.id, timeout=15) == 5
        assert (await c.get(h.id)).metadata == {"tenant": "acme"}
    assert "enter headers 1" in mw.events and "exit headers_sync" in mw.events


def test_blocking_client_runs_before_enqueue(settings: Settings) -> None:
    app = make_app()
    app.configure(settings)
    with Client(settings=settings, app=app) as c:
        assert c.get(c.enqueue("add", [0, 0]).id).metadata == {}
        assert app.no_enqueue_hooks  # learnt by that enqueue: later ones skip the hooks
        app.add_middleware(Tagging())  # a middleware added later is still seen
        h = c.enqueue("add", [1, 2], metadata={"x": 1})
        (m,) = c.enqueue_many([{"name": "add", "args": [3, 4]}])
        assert c.get(h.id).metadata == {"x": 1, "tenant": "acme"}
        assert c.get(m.id).metadata == {"tenant": "acme"}
    # A client without the app knows no middleware: the request goes as given.
    with Client(settings=settings) as plain:
        assert plain.get(plain.enqueue("add", [1, 2]).id).metadata == {}


class Refusing(Middleware):
    def before_enqueue(self, request: EnqueueRequest) -> None:
        raise PermissionError(f"{request.name} not allowed")


async def test_failing_before_enqueue_raises_and_sends_nothing(
    settings: Settings, r: redis.Redis
) -> None:
    app = make_app()
    app.add_middleware(Refusing())
    app.configure(settings)
    with Client(settings=settings, app=app) as c, pytest.raises(PermissionError):
        c.enqueue("add", [1, 2])
    async with AsyncClient(settings=settings, app=app) as ac:
        with pytest.raises(PermissionError):
            await ac.enqueue_many([{"name": "add", "args": [1, 2]}])
    assert r.keys(f"{settings.key_prefix}:*") == []


class AsyncBefore(Middleware):
    async def before_enqueue(self, request: EnqueueRequest) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        request.metadata["async"] = True


async def test_async_before_enqueue_is_awaited_and_refused_by_the_blocking_client(
    settings: Settings, r: redis.Redis
) -> None:
    app = make_app()
    app.add_middleware(AsyncBefore())
    app.configure(settings)
    async with AsyncClient(settings=settings, app=app) as ac:
        h = await ac.enqueue("add", [1, 2])
        assert (await ac.get(h.id)).metadata == {"async": True}
    with Client(settings=settings, app=app) as c, pytest.raises(DtqError, match="cannot await"):
        c.enqueue("add", [1, 2])


def test_add_middleware_refuses_what_cannot_work() -> None:
    app = App()

    class SyncAround:
        def around_task(self, ctx: TaskContext, call_next: Any) -> Any:
            return call_next()

    with pytest.raises(ConfigError, match="must be 'async def'"):
        app.add_middleware(SyncAround())
    with pytest.raises(ConfigError, match="not a middleware"):
        app.add_middleware(object())
    with pytest.raises(ConfigError, match="instance"):
        app.add_middleware(Tagging)
    assert app.middleware == []


def test_no_middleware_means_no_hooks(settings: Settings) -> None:
    """The fast path: an app without middleware (and without tracing) has no hooks at all, and
    a middleware keeping the base class's no-op hooks adds none of them."""
    app = App(settings)
    assert app.hooks() is None

    class OnlyOutcome(Middleware):
        def on_outcome(self, ctx: TaskContext, outcome: RunOutcome) -> None:
            pass

    app.add_middleware(OnlyOutcome())
    hooks = app.hooks()
    assert hooks is not None
    assert hooks.before_enqueue == () and hooks.around_task == () and len(hooks.on_outcome) == 1


class Failing(Middleware):
    async def around_task(self, ctx: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        if ctx.name == "add":
            raise Fail("refused by middleware")
        return 2 * await call_next()


async def test_around_task_result_and_failure_are_the_tasks(settings: Settings) -> None:
    app = make_app()

    @app.task(name="seven")
    async def seven() -> int:
        return 7

    app.add_middleware(Failing())
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("seven")
        assert await c.result(h.id, timeout=15) == 14
        bad = await c.enqueue("add", [1, 2])
        with pytest.raises(TaskFailed, match="Fail: refused by middleware"):
            await c.result(bad.id, timeout=15)
        assert (await c.get(bad.id)).attempt == 1


class Recording(Middleware):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, RunOutcome]] = []

    async def on_outcome(self, ctx: TaskContext, outcome: RunOutcome) -> None:  # type: ignore[override]
        self.seen.append((ctx.id, ctx.attempt, outcome))


class Exploding(Middleware):
    def on_outcome(self, ctx: TaskContext, outcome: RunOutcome) -> None:
        raise RuntimeError("hook bug")


async def test_on_outcome_gets_each_verdict_and_a_failing_hook_loses_nothing(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    rec = Recording()
    app.add_middleware(Exploding())  # runs first and raises: logged, the next hook still runs
    app.add_middleware(rec)
    caplog.set_level(logging.ERROR, "dtq.middleware")
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        ok = await c.enqueue("add", [2, 2])
        bad = await c.enqueue("boom")
        assert await c.result(ok.id, timeout=15) == 4
        with pytest.raises(TaskFailed):
            await c.result(bad.id, timeout=15)
        await wait_for(lambda: len(rec.seen) == 3)
    by_task: dict[str, list[tuple[int, RunOutcome]]] = {}
    for tid, attempt, outcome in rec.seen:
        by_task.setdefault(tid, []).append((attempt, outcome))
    ((_, success),) = by_task[ok.id]
    assert success.verdict == "succeeded" and success.result == 4 and success.exception is None
    (a1, first), (a2, second) = sorted(by_task[bad.id], key=lambda x: x[0])
    assert (a1, first.verdict, a2, second.verdict) == (1, "retried", 2, "failed")
    assert isinstance(second.exception, RuntimeError) and second.error == "RuntimeError: boom"
    assert second.duration >= 0
    assert "on_outcome hook" in caplog.text and "hook bug" in caplog.text
    async with AsyncClient(settings=settings) as c:
        assert (await c.get(ok.id)).result == 4  # the outcome stood


async def test_on_outcome_hears_cancelled_and_interrupted_runs(
    redis_server: Any, prefix: str
) -> None:
    """Every run that entered around_task gets its on_outcome, also when it was cancelled or
    handed back at shutdown (tracing ends its span there)."""
    settings = make_settings(redis_server.url, prefix, drain_timeout_s=0.2)
    app = make_app()
    started: list[str] = []

    @app.task(name="forever")
    async def forever() -> None:
        started.append(current_task().id)
        await asyncio.sleep(3600)

    rec = Recording()
    app.add_middleware(rec)
    async with AsyncClient(settings=settings, app=app) as c:
        async with running_worker(app, settings):
            a = await c.enqueue("forever")
            b = await c.enqueue("forever")
            await wait_for(lambda: len(started) == 2)
            assert await c.cancel(a.id)
            await wait_for(lambda: len(rec.seen) == 1)
        # Leaving the block stops the worker: b's drain times out and it is handed back.
        verdicts = {tid: o.verdict for tid, _, o in rec.seen}
        assert verdicts == {a.id: "cancelled", b.id: "interrupted"}
        assert all(o.exception is None for _, _, o in rec.seen)
        assert (await c.get(b.id)).status.value == "queued"


def test_testqueue_runs_the_middleware_as_a_worker_does() -> None:
    """dtq.testing runs before_enqueue in its clients and around_task/on_outcome per run, so
    users can test their middleware (or tasks that rely on it) without Redis."""
    from dtq.testing import TestQueue

    app = make_app()
    tagging, rec = Tagging(), Recording()
    app.add_middleware(tagging)
    app.add_middleware(rec)
    with TestQueue(app) as tq:
        h = app.tasks["headers_sync"].enqueue()
        b = app.client().enqueue("boom")
        infos = {i.id: i for i in tq.drain()}
    assert infos[h.id].result == {
        "headers": {"x-request-id": "req-headers_sync"}, "seen": "req-headers_sync",
    }  # fmt: skip
    assert infos[h.id].metadata == {"tenant": "acme"}
    assert infos[b.id].status.value == "failed"
    verdicts = sorted((tid, a, o.verdict) for tid, a, o in rec.seen)
    assert verdicts == sorted([(h.id, 1, "succeeded"), (b.id, 1, "retried"), (b.id, 2, "failed")])
    assert "enter headers_sync 1" in tagging.events


async def test_a_run_whose_outcome_cannot_be_stored_still_ends_for_the_hooks(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A non-transient error writing the outcome (the run is reclaimed later) still reaches
    on_outcome, as "lost": state kept since around_task (an open span) is always released."""
    app = make_app()
    rec = Recording()
    app.add_middleware(rec)
    async with running_worker(app, settings) as w, AsyncClient(settings=settings) as c:

        async def refuse(*_: Any) -> str:
            raise RuntimeError("script bug")

        w.outcomes.write = refuse
        await c.enqueue("add", [1, 1])
        await wait_for(lambda: len(rec.seen) == 1)
    ((_, _, outcome),) = rec.seen
    assert outcome.verdict == "lost" and outcome.result == 2  # returned, never stored
    assert "could not store its outcome" in caplog.text
