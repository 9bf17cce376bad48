"""What a running task can read about itself: ``dtq.current_task()``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dtq.errors import DtqError

if TYPE_CHECKING:
    from dtq.progress import RunHooks


@dataclass(frozen=True, slots=True)
class TaskContext:
    """The run in progress. ``attempt`` is also the fencing token of this run."""

    id: str
    name: str
    queue: str
    attempt: int
    retries: int
    max_retries: int
    worker_id: str
    deadline: float | None
    """``time.time()`` by which the run must end (from the task's timeout), or None."""
    hooks: RunHooks | None = field(default=None, repr=False, compare=False)
    """Set by the runner (worker or dtq.testing); behind progress() and cancel_requested."""

    @property
    def fencing_token(self) -> int:
        return self.attempt

    @property
    def headers(self) -> Mapping[str, str]:
        """Set at enqueue by middleware (``before_enqueue``), e.g. a W3C ``traceparent``.

        Read from the run (decoded when asked, not stored here: most runs never ask)."""
        raw = self.hooks.headers() if self.hooks is not None else ""
        return json.loads(raw) if raw else {}

    def progress(
        self, current: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report progress (e.g. ``progress(3, 10, "page 3")``); ``get()`` and events show it.

        Never blocks: safe from async tasks and from sync tasks' threads alike.
        """
        from dtq.progress import encode_progress

        payload = encode_progress(current, total, message, self.attempt)
        if self.hooks is not None:
            self.hooks.report_progress(payload)

    @property
    def cancel_requested(self) -> bool:
        """True once this run was asked to stop (cancel, lost claim, shutdown).

        Async tasks are cancelled for them; a sync task can check this to stop early (its
        result would be discarded anyway).
        """
        return self.hooks is not None and self.hooks.stop_requested()


# A runner sets either the context or a function making it: most tasks never ask, so the worker
# makes it on the first current_task() of a run (then kept for the rest of the run).
_current: ContextVar[TaskContext | Callable[[], TaskContext] | None] = ContextVar(
    "dtq_current_task", default=None
)


def running_task() -> TaskContext | None:
    """The context of the task being run, None outside a task."""
    ctx = _current.get()
    if ctx is not None and not isinstance(ctx, TaskContext):
        ctx = ctx()
        _current.set(ctx)
    return ctx


def current_task() -> TaskContext:
    """The context of the task being run; raises outside a task."""
    ctx = running_task()
    if ctx is None:
        raise DtqError("current_task() called outside a running dtq task")
    return ctx


def set_current(ctx: TaskContext | Callable[[], TaskContext] | None) -> object:
    return _current.set(ctx)
