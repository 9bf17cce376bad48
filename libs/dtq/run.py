"""Running a claimed task's body, for the worker's executor and :mod:`dtq.testing` alike: its
arguments, context, timeout and middleware. Outcomes are :mod:`dtq.retrypolicy`'s; writing them,
and what stops a run, are the caller's. The only I/O here is the run's progress reports."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Awaitable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dtq import scripts as sc
from dtq.app import App
from dtq.context import TaskContext, set_current
from dtq.errors import Fail, UnknownName
from dtq.middleware import RunOutcome, around, notify_outcome
from dtq.retrypolicy import TaskTimeout
from dtq.store.keys import Keys, make_task_id
from dtq.store.partitions import logical

log = logging.getLogger("dtq.run")
# The last report's wait before the outcome write (it may queue behind other runs' reports).
FLUSH_TIMEOUT_S = 10.0


@dataclass(slots=True)
class Hooked:
    """What middleware needs of a run beyond the run itself: made only when there is some."""

    ctx: TaskContext
    result: Any = None
    raised: BaseException | None = None  # what the around_task chain raised


@dataclass(eq=False)
class Attempt:
    """One attempt of a claimed task, as the runner sees it (the worker's ``Run`` extends it)."""

    claimed: sc.Claimed
    started_mono: float = field(default_factory=time.monotonic)  # reset when its body starts
    stop_reason: Enum | None = None  # why it was stopped (the worker's StopReason), else None
    hooked: Hooked | None = None  # only when the app has middleware (Runner._around)

    @property
    def task_id(self) -> str:
        return make_task_id(self.claimed.queue, self.claimed.tid)


def _detach(fut: asyncio.Future[Any]) -> None:
    """Let a sync task's thread run on after its run was stopped (a thread cannot be killed),
    its outcome discarded (taken, or asyncio would log "Future exception was never retrieved")."""

    def done(f: asyncio.Future[Any]) -> None:
        if not f.cancelled():
            f.exception()

    fut.add_done_callback(done)


class Reports:
    """A run's :class:`dtq.progress.RunHooks`: reports written in the background, only the
    latest kept while a write is under way, the last one before the outcome (:meth:`flush`)."""

    __slots__ = ("_loop", "_pending", "_run", "_runner", "writing")

    def __init__(self, runner: Runner, run: Attempt, loop: asyncio.AbstractEventLoop) -> None:
        self._runner = runner
        self._run = run
        self._loop = loop
        self._pending: str | None = None
        self.writing: asyncio.Task[None] | None = None  # made by the first report (most: none)

    def stop_requested(self) -> bool:
        return self._runner.stopped(self._run)

    def headers(self) -> str:
        return self._run.claimed.headers

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
        if self.writing is None or self.writing.done():
            self.writing = self._loop.create_task(self._write())

    async def _write(self) -> None:
        r, c = self._runner, self._run.claimed
        qk, maxlen = r.keys.queue(c.queue), r.events_maxlen
        gate: contextlib.AbstractAsyncContextManager[Any] = r.gate or contextlib.nullcontext()
        while self._pending is not None:
            try:
                async with gate:  # (the latest report is taken once its turn came)
                    payload, self._pending = self._pending, None
                    call = sc.progress_call(qk, c.tid, c.attempt, r.worker_id, payload, maxlen)
                    await r.scripts.run(call)
            except Exception as exc:  # progress is best effort; the outcome write is not
                log.debug("progress of %s not written: %s", c.tid, exc)

    async def flush(self) -> None:
        """Wait (briefly) until the latest report is written."""
        task = self.writing
        if task is not None and not task.done():
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), FLUSH_TIMEOUT_S)


class Runner:
    """Runs claimed tasks' bodies for a worker or a TestQueue (:meth:`call`, :meth:`notify`)."""

    def __init__(
        self,
        app: App,
        pool: Executor,
        worker_id: str,
        scripts: sc.AsyncScripts,
        keys: Keys,
        events_maxlen: int,
        gate: asyncio.Semaphore | None = None,
    ) -> None:
        """``pool`` runs sync task bodies; ``scripts``, ``keys``, ``events_maxlen`` and ``gate``
        (bounds the progress writes in flight at once) write the runs' progress reports."""
        self.tasks = app.tasks
        self.pool = pool
        self.worker_id = worker_id
        self.scripts, self.keys, self.events_maxlen, self.gate = scripts, keys, events_maxlen, gate
        self.mw = app.hooks()  # the app's middleware, None when it has none; read once

    def stopped(self, run: Attempt) -> bool:
        """Whether ``run`` was asked to stop (``current_task().cancel_requested``)."""
        return run.stop_reason is not None

    def call(self, run: Attempt) -> Awaitable[Any]:
        """The body inside the middleware: its result, or what it raised (a timeout as
        ``TaskTimeout``, a name not registered as ``UnknownName``). A stop cancels it."""
        return self._invoke(run) if self.mw is None else self._around(run)

    def context(self, run: Attempt, hooks: Reports | None, deadline: float | None) -> TaskContext:
        c = run.claimed
        return TaskContext(
            id=run.task_id,
            name=c.name,
            queue=logical(c.queue),
            attempt=c.attempt,
            retries=c.retries,
            max_retries=c.max_retries,
            worker_id=self.worker_id,
            deadline=deadline,
            hooks=hooks,
        )

    async def _around(self, run: Attempt) -> Any:
        """The run inside the middleware's ``around_task`` hooks (one context for all)."""
        assert self.mw is not None
        timeout = run.claimed.timeout
        deadline = None if timeout is None else time.time() + timeout
        ctx = self.context(run, Reports(self, run, asyncio.get_running_loop()), deadline)
        hk = run.hooked = Hooked(ctx)
        set_current(ctx)
        try:
            hk.result = await around(self.mw, ctx, lambda: self._invoke(run))
        except BaseException as exc:
            hk.raised = exc
            raise
        return hk.result

    async def notify(
        self, run: Attempt, verdict: str | None, item: sc.Success | sc.Failure | None
    ) -> None:
        """Tell the ``on_outcome`` hooks what became of the run (never raises). ``verdict``:
        the fence's answer (None: nothing was written, "lost"), "lost" or "interrupted"."""
        mw, hk = self.mw, run.hooked
        run.hooked = None  # run -> ctx -> its hooks -> run: no cycle left behind
        if mw is None or not mw.on_outcome:
            return
        if hk is None:  # a run stopped before its body
            hk = Hooked(self.context(run, Reports(self, run, asyncio.get_running_loop()), None))
        v = "lost" if verdict is None else "retried" if verdict == "scheduled" else verdict
        error = item.error if isinstance(item, sc.Failure) else None
        raised = None if isinstance(hk.raised, asyncio.CancelledError) else hk.raised
        result = hk.result if isinstance(item, sc.Success) else None
        elapsed = time.monotonic() - run.started_mono
        await notify_outcome(mw, hk.ctx, RunOutcome(v, elapsed, error, raised, result))

    async def _invoke(self, run: Attempt) -> Any:
        c = run.claimed
        task = self.tasks.get(c.name)
        if task is None:
            raise UnknownName(f"unknown task {c.name!r}: not registered on worker {self.worker_id}")
        try:
            args = json.loads(c.args) if c.args != "[]" else []
            kwargs = json.loads(c.kwargs) if c.kwargs else {}
        except ValueError as exc:
            raise Fail(f"arguments are not valid JSON: {exc}") from None
        if task.arg_types is not None:  # typed parameters (datetime, UUID, models...): convert
            try:
                args, kwargs = task.arg_types.decode(args, kwargs)
            except ValueError as exc:
                raise Fail(str(exc)) from None
        timeout = c.timeout
        loop = asyncio.get_running_loop()
        # Made already by _around. No local more: a bigger frame made sync runs slower.
        ctx = None if run.hooked is None else run.hooked.ctx
        if ctx is None:
            deadline = None if timeout is None else time.time() + timeout
            hooks = Reports(self, run, loop)
        else:
            deadline = ctx.deadline
            hooks = ctx.hooks  # type: ignore[assignment]

        def context() -> TaskContext:  # made once: a child task asking later gets the same
            nonlocal ctx
            if ctx is None:
                ctx = self.context(run, hooks, deadline)
            return ctx

        if task.is_async:
            set_current(context)  # made on the task's first current_task() (most never ask)
            coro = task.fn(*args, **kwargs)
            try:
                if timeout is None:
                    result = await coro  # no wait_for layer: one coroutine fewer per resume
                else:
                    result = await asyncio.wait_for(coro, timeout)
            except TimeoutError:
                if run.stop_reason is not None:
                    raise asyncio.CancelledError() from None
                raise TaskTimeout(f"timed out after {timeout}s") from None
            if hooks.writing is not None:
                await hooks.flush()  # the last progress report lands before the outcome
            return result
        set_current(context())
        cv = contextvars.copy_context()
        # The pool's future is the body's start gate: cancelled, the body never starts.
        gate = self.pool.submit(cv.run, task.fn, *args, **kwargs)
        fut = asyncio.wrap_future(gate, loop=loop)
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if gate.cancel():
                raise TaskTimeout(
                    f"timed out after {timeout}s (sync task: no pool thread came free, "
                    "its body never started)"
                ) from None
            _detach(fut)
            raise TaskTimeout(
                f"timed out after {timeout}s (sync task: its thread was left to finish)"
            ) from None
        except asyncio.CancelledError:
            if not gate.cancel():  # (cancelled: its body never starts)
                _detach(fut)
            raise
        if hooks.writing is not None:  # (its thread's reports were handed over before its end)
            await hooks.flush()
        return result
