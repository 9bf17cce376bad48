"""Progress reports of running tasks: ``dtq.current_task().progress(current, total, message)``.

A report is stored in the task record (``progress``, shown by ``get()`` as ``TaskInfo.progress``)
and announced as a ``progress`` event, through the fenced ``lua/progress.lua``. Calling
``progress()`` never blocks the task, from an async task or from a sync task's thread alike:
the worker writes reports in the background, keeping only the latest while a write is under
way, and writes the last one before the task's outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from dtq import codec
from dtq import scripts as sc
from dtq.errors import InvalidRequest
from dtq.store.keys import QueueKeys

log = logging.getLogger("dtq.progress")
T = TypeVar("T")
MAX_MESSAGE = 1000
# The last report's wait before the outcome write: it may queue behind the worker's other runs'
# writes (16 in flight at once), seconds on a loaded host with hundreds of runs reporting.
FLUSH_TIMEOUT_S = 10.0


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


class ProgressWriter:
    """The worker's :class:`RunHooks` for one run: coalescing background writes."""

    def __init__(
        self,
        scripts: sc.AsyncScripts,
        qk: QueueKeys,
        tid: str,
        attempt: int,
        worker_id: str,
        events_maxlen: int,
        stopped: Callable[[], bool],
        gate: asyncio.Semaphore | None = None,
    ) -> None:
        """``gate``: shared by the writers of one runner, bounds the writes in flight at once
        (each writer keeps only its latest report while it waits)."""
        self._scripts = scripts
        self._gate: contextlib.AbstractAsyncContextManager[Any] = gate or contextlib.nullcontext()
        self._qk = qk
        self._tid = tid
        self._attempt = attempt
        self._worker_id = worker_id
        self._maxlen = events_maxlen
        self._stopped = stopped
        self._loop = asyncio.get_running_loop()
        self._pending: str | None = None
        self._task: asyncio.Task[None] | None = None

    def stop_requested(self) -> bool:
        return self._stopped()

    def report_progress(self, payload: str) -> None:
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._submit(payload)
        else:  # a sync task's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the run is over
                self._loop.call_soon_threadsafe(self._submit, payload)

    def _submit(self, payload: str) -> None:
        self._pending = payload
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending is not None:
            try:
                async with self._gate:  # (the latest report is taken once its turn came)
                    payload, self._pending = self._pending, None
                    call = sc.progress_call(
                        self._qk, self._tid, self._attempt, self._worker_id, payload, self._maxlen
                    )
                    await self._scripts.run(call)
            except Exception as exc:  # progress is best effort; the outcome write is not
                log.debug("progress of %s not written: %s", self._tid, exc)

    async def flush(self) -> None:
        """Wait (briefly) until the latest report is written."""
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), FLUSH_TIMEOUT_S)

    async def after(self, aw: Awaitable[T]) -> T:
        """Await the task's own result, then flush its last report before the outcome write."""
        result = await aw
        await self.flush()
        return result
