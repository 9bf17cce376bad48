"""OpenTelemetry tracing as a middleware: ``App(tracing=True)``, ``DTQ_TRACING=1``, or
``app.add_middleware(OpenTelemetryMiddleware(tracer_provider=...))``; needs
``pip install 'dtq[otel]'``. A PRODUCER span per enqueue injects its W3C trace context into the
task's headers (kept in the record, back in the claim reply); a CONSUMER span per run is its
child. Spans and attributes: docs/integrations/opentelemetry.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from dtq.errors import ConfigError
from dtq.middleware import EnqueueRequest, Middleware, RunOutcome

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - depends on the installed extras
    raise ConfigError(
        "tracing needs OpenTelemetry: pip install 'dtq[otel]' (or unset DTQ_TRACING)"
    ) from None

if TYPE_CHECKING:
    from dtq.context import TaskContext

SYSTEM = "dtq"


class OpenTelemetryMiddleware(Middleware):
    """Spans for enqueues and runs, linked by a W3C trace context carried with the task."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        from dtq import __version__

        self._tracer = trace.get_tracer("dtq", __version__, tracer_provider=tracer_provider)
        # The span of each run in progress, by (task id, attempt): started by around_task, ended
        # by on_outcome once the fence's verdict is known.
        self._runs: dict[tuple[str, int], trace.Span] = {}

    def before_enqueue(self, request: EnqueueRequest) -> None:
        with self._tracer.start_as_current_span(
            f"enqueue {request.name}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "enqueue",
                "messaging.destination.name": request.queue,
                "dtq.task.name": request.name,
            },
        ):
            propagate.inject(request.headers)

    async def around_task(self, ctx: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        span = self._tracer.start_span(
            f"run {ctx.name}",
            context=propagate.extract(ctx.headers),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "run",
                "messaging.destination.name": ctx.queue,
                "messaging.message.id": ctx.id,
                "messaging.client.id": ctx.worker_id,
                "dtq.task.name": ctx.name,
                "dtq.task.attempt": ctx.attempt,
            },
        )
        self._runs[(ctx.id, ctx.attempt)] = span
        # Status and exception are set from the verdict (on_outcome): what the body raised is
        # not all that fails a run (an unstorable result fails it after the body returned).
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            return await call_next()

    def on_outcome(self, ctx: TaskContext, outcome: RunOutcome) -> None:
        span = self._runs.pop((ctx.id, ctx.attempt), None)
        if span is None:  # stopped before its body: no run span was started
            return
        span.set_attribute("dtq.task.outcome", outcome.verdict)
        if outcome.verdict in ("failed", "retried"):
            exc = outcome.exception
            if exc is not None:
                span.record_exception(exc)
            span.set_attribute("error.type", type(exc).__qualname__ if exc else "dtq.failed")
            span.set_status(Status(StatusCode.ERROR, outcome.error))
        span.end()
