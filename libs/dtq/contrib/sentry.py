"""Sentry error reporting as a middleware: a run that ends ``failed`` becomes one Sentry event,
tagged with the task, in the run's own isolation scope (a worker runs many tasks in one
process). An example of the hooks as much as an integration; needs ``sentry-sdk``. Usage and
what is reported: docs/integrations/sentry.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from dtq.errors import ConfigError, Retry
from dtq.middleware import Middleware, RunOutcome

try:
    import sentry_sdk
    from sentry_sdk.scope import use_isolation_scope
except ImportError:  # pragma: no cover - depends on what is installed
    raise ConfigError("dtq.contrib.sentry needs sentry-sdk: pip install sentry-sdk") from None

if TYPE_CHECKING:
    from dtq.context import TaskContext


class SentryMiddleware(Middleware):
    """Report failed runs to Sentry, each in its run's own scope, tagged with the task."""

    def __init__(self, *, report_retries: bool = False) -> None:
        self.report_retries = report_retries
        # The scope of each run in progress, by (task id, attempt), for on_outcome.
        self._scopes: dict[tuple[str, int], sentry_sdk.Scope] = {}

    async def around_task(self, ctx: TaskContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        with sentry_sdk.isolation_scope() as scope:
            scope.set_tag("dtq.task", ctx.name)
            scope.set_tag("dtq.queue", ctx.queue)
            scope.set_tag("dtq.attempt", str(ctx.attempt))
            scope.set_tag("dtq.task_id", ctx.id)
            retries = {"retries": ctx.retries, "max_retries": ctx.max_retries}
            scope.set_context("dtq", {"worker_id": ctx.worker_id, **retries})
            self._scopes[(ctx.id, ctx.attempt)] = scope
            return await call_next()

    def on_outcome(self, ctx: TaskContext, outcome: RunOutcome) -> None:
        scope = self._scopes.pop((ctx.id, ctx.attempt), None)
        wanted = outcome.verdict == "failed" or (
            self.report_retries and outcome.verdict == "retried"
        )
        if not wanted or scope is None:
            return
        if outcome.verdict == "retried" and isinstance(outcome.exception, Retry):
            return  # asked for by the task itself: not an error
        with use_isolation_scope(scope):
            sentry_sdk.set_tag("dtq.outcome", outcome.verdict)
            if outcome.exception is not None:
                sentry_sdk.capture_exception(outcome.exception)
            else:
                sentry_sdk.capture_message(f"{ctx.name} failed: {outcome.error}", level="error")
