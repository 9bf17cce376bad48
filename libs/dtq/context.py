"""What a running task can read about itself: ``dtq.current_task()``."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from dtq.errors import DtqError


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

    @property
    def fencing_token(self) -> int:
        return self.attempt


_current: ContextVar[TaskContext | None] = ContextVar("dtq_current_task", default=None)


def current_task() -> TaskContext:
    """The context of the task being run; raises outside a task."""
    ctx = _current.get()
    if ctx is None:
        raise DtqError("current_task() called outside a running dtq task")
    return ctx


def set_current(ctx: TaskContext | None) -> object:
    return _current.set(ctx)
