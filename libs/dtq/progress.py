"""Progress reports of running tasks: ``dtq.current_task().progress(current, total, message)``,
stored fenced in the task record and announced as an event; written in the background by
:mod:`dtq.run`, so a report never blocks the task."""

from __future__ import annotations

import math
from typing import Any, Protocol

from dtq import codec
from dtq.errors import InvalidRequest

MAX_MESSAGE = 1000


class RunHooks(Protocol):
    """What a runner (the worker, or dtq.testing) gives a running task's context."""

    def report_progress(self, payload: str) -> None: ...

    def stop_requested(self) -> bool: ...

    def headers(self) -> str:
        """The run's middleware headers as stored (JSON object), or ""."""
        ...


def _number(value: Any, what: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"progress {what} must be a finite number")
    return value


def encode_progress(current: float, total: float | None, message: str | None, attempt: int) -> str:
    """Validate one report and encode it as the JSON stored in the record."""
    out: dict[str, Any] = {"current": _number(current, "current"), "attempt": attempt}
    if total is not None:
        out["total"] = _number(total, "total")
    if message is not None:
        if not isinstance(message, str):
            raise InvalidRequest("progress message must be a string")
        out["message"] = message[:MAX_MESSAGE]
    return codec.dumps(out, "progress")
