"""OpenTelemetry tracing (dtq.contrib.otel) with a real worker and the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from dtq import App, AsyncClient, ConfigError, Settings, TaskFailed
from dtq.contrib.otel import OpenTelemetryMiddleware
from tests.conftest import ROOT, make_settings, running_worker


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p


def traced_app(provider: TracerProvider) -> tuple[App, dict[str, int]]:
    app = App()
    seen: dict[str, int] = {}  # span id current inside each body

    @app.task(name="report")
    def report(day: str) -> str:  # sync: runs in the thread pool
        seen["report"] = trace.get_current_span().get_span_context().span_id
        return f"report {day}"

    @app.task(name="explode", max_retries=1)
    async def explode() -> None:
        seen["explode"] = trace.get_current_span().get_span_context().span_id
        raise ValueError("kaboom")

    app.add_middleware(OpenTelemetryMiddleware(tracer_provider=provider))
    return app, seen


async def spans_when(
    exporter: InMemorySpanExporter, pred: Callable[[list[ReadableSpan]], bool]
) -> list[ReadableSpan]:
    """The finished spans once ``pred`` holds (run spans end after the outcome is written)."""
    deadline = time.monotonic() + 20
    while True:
        spans = list(exporter.get_finished_spans())
        if pred(spans):
            return spans
        assert time.monotonic() < deadline, [s.name for s in spans]
        await asyncio.sleep(0.01)


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted(
        (s for s in spans if s.name == name), key=lambda s: s.attributes["dtq.task.attempt"]
        if s.attributes and "dtq.task.attempt" in s.attributes else 0,
    )  # fmt: skip


async def test_enqueue_and_run_spans_are_linked_through_the_task(
    settings: Settings, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A task enqueued inside a span: the enqueue span is its child, each run span a child of
    the enqueue span in the same trace, current while the body runs (in its thread too), with
    queue, task name, attempt and outcome as attributes; failures have ERROR status."""
    app, seen = traced_app(provider)
    tracer = provider.get_tracer("test")
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        with tracer.start_as_current_span("http request") as parent:
            ok = await c.enqueue("report", ["mon"])
            bad = await c.enqueue("explode")
        assert await c.result(ok.id, timeout=15) == "report mon"
        with pytest.raises(TaskFailed):
            await c.result(bad.id, timeout=15)
        spans = await spans_when(
            exporter,
            lambda s: len(named(s, "run report")) == 1 and len(named(s, "run explode")) == 2,
        )
    trace_id = parent.get_span_context().trace_id
    (enq,) = named(spans, "enqueue report")
    assert enq.kind is SpanKind.PRODUCER and enq.parent is not None
    assert enq.parent.span_id == parent.get_span_context().span_id
    assert enq.context is not None and enq.context.trace_id == trace_id
    assert enq.attributes is not None
    assert enq.attributes["messaging.destination.name"] == "default"
    assert enq.attributes["messaging.operation.type"] == "send"
    assert enq.attributes["dtq.task.name"] == "report"

    (run,) = named(spans, "run report")
    assert run.kind is SpanKind.CONSUMER and run.parent is not None and run.context is not None
    assert run.parent.span_id == enq.context.span_id and run.context.trace_id == trace_id
    assert dict(run.attributes or {}) | {"messaging.client.id": "-"} == {
        "messaging.system": "dtq", "messaging.operation.type": "process",
        "messaging.operation.name": "run", "messaging.destination.name": "default",
        "messaging.message.id": ok.id, "messaging.client.id": "-", "dtq.task.name": "report",
        "dtq.task.attempt": 1, "dtq.task.outcome": "succeeded",
    }  # fmt: skip
    assert run.status.status_code is StatusCode.UNSET
    assert seen["report"] == run.context.span_id  # the sync body's thread sees the run span

    (enq_bad,) = named(spans, "enqueue explode")
    first, second = named(spans, "run explode")
    assert enq_bad.context is not None
    for attempt, (span, outcome) in enumerate(((first, "retried"), (second, "failed")), 1):
        assert span.parent is not None and span.parent.span_id == enq_bad.context.span_id
        assert span.attributes is not None
        assert span.attributes["dtq.task.attempt"] == attempt
        assert span.attributes["dtq.task.outcome"] == outcome
        assert span.attributes["error.type"] == "ValueError"
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError: kaboom"
        assert [e.name for e in span.events] == ["exception"]
    assert second.context is not None and seen["explode"] == second.context.span_id


async def test_a_task_enqueued_without_a_span_starts_its_own_trace(
    settings: Settings, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app, _ = traced_app(provider)
    async with running_worker(app, settings), AsyncClient(settings=settings, app=app) as c:
        h = await c.enqueue("report", ["tue"])
        await c.result(h.id, timeout=15)
        spans = await spans_when(exporter, lambda s: len(named(s, "run report")) == 1)
    (enq,) = named(spans, "enqueue report")
    (run,) = named(spans, "run report")
    assert enq.parent is None and enq.context is not None and run.context is not None
    assert run.parent is not None and run.parent.span_id == enq.context.span_id
    assert run.context.trace_id == enq.context.trace_id


def test_tracing_setting_installs_the_middleware(redis_server: object, prefix: str) -> None:
    url = "redis://127.0.0.1:1/0"  # never contacted
    for app in (App(tracing=True), App(make_settings(url, prefix, tracing=True))):
        hooks = app.hooks()
        assert hooks is not None
        assert isinstance(getattr(hooks.around_task[0], "__self__", None), OpenTelemetryMiddleware)
    off = App(make_settings(url, prefix, tracing=True), tracing=False)
    assert off.hooks() is None
    # The worker's configure() keeps App(tracing=True): it is the app's, not a setting.
    app = App(tracing=True)
    app.configure(make_settings(url, prefix))
    assert app.hooks() is not None


def test_tracing_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "dtq.contrib.otel")
    with pytest.raises(ConfigError, match=r"pip install 'dtq\[otel\]'"):
        App(tracing=True).hooks()


def test_a_worker_with_tracing_but_without_the_extra_exits_2(
    settings: Settings, spawn_worker: Any, tmp_path: Path
) -> None:
    hidden = tmp_path / "opentelemetry"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    w = spawn_worker(
        "tests.apps.basic:app", settings, DTQ_TRACING="1", PYTHONPATH=f"{tmp_path}:{ROOT}"
    )
    assert w.wait(60) == 2
    out = w.output()
    assert "pip install 'dtq[otel]'" in out and "Traceback" not in out
