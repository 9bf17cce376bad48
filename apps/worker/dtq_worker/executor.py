"""Running one claimed task: async on the event loop, sync in the thread pool, with timeout."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from concurrent.futures import Executor as Executor_
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq.app import App
from dtq.context import TaskContext, set_current
from dtq.errors import Fail
from dtq.middleware import Hooks, RunOutcome, around, notify_outcome
from dtq.progress import ProgressWriter
from dtq.retrypolicy import TaskTimeout, failure_item, result_item
from dtq.stats import bucket_of
from dtq.store.partitions import logical
from dtq_worker.outcomes import Outcome
from dtq_worker.slots import Hooked, Run, StopReason

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv
    from dtq_worker.outcomes import OutcomeWriter
    from dtq_worker.slots import Slots

log = logging.getLogger("dtq.executor")
# A task whose name this worker does not know, handed back while a live worker declares it
# (a rolling deploy), is due again this much later: this worker does not claim it again at once.
UNKNOWN_HANDBACK_MS = 1000


class UnknownName(Fail):
    """The claimed task's name is not registered on this worker."""


def _extra(run: Run, worker_id: str) -> dict[str, Any]:
    """Structured log fields of a run (built only when a line is actually logged)."""
    c = run.claimed
    return {
        "task_id": run.task_id, "queue": logical(c.queue), "attempt": c.attempt, "task": c.name,
        "worker": worker_id,
    }  # fmt: skip


def _log_failure(run: Run, item: sc.Failure, outcome: str, elapsed: float, worker: str) -> None:
    """A run that ended in an exception: ERROR with the stored traceback when the task ended
    ``failed`` (as Celery and RQ log it), INFO when it will be retried or was cancelled."""
    c = run.claimed
    level = logging.ERROR if outcome == "failed" else logging.INFO
    if not log.isEnabledFor(level):
        return
    rec = log.makeRecord(
        log.name, level, __file__, 0, "%s %s %s attempt %d in %.3fs: %s",
        (outcome, c.name, run.task_id, c.attempt, elapsed, item.error), None,
        extra=_extra(run, worker),
    )  # fmt: skip
    if level == logging.ERROR and item.traceback:
        rec.exc_text = item.traceback.rstrip("\n")  # written after the line, as exc_info's is
    log.handle(rec)


def _detach(ex: Executor, fut: asyncio.Future[Any]) -> None:
    """Let a sync task's thread run on after its run was stopped (a thread cannot be killed).

    Its outcome is discarded: the exception it may end with (a ``Fail`` after a cancel) is
    taken here, or asyncio would log "Future exception was never retrieved" with a traceback.
    """
    ex.detached_threads += 1

    def done(f: asyncio.Future[Any]) -> None:
        if not f.cancelled():
            f.exception()
        ex.detached_threads -= 1

    fut.add_done_callback(done)


class _Hooks:
    """A run's :class:`dtq.progress.RunHooks`; the progress writer is made on first use.

    Most tasks never report progress, so the writer (and its flush after the body) is skipped
    for them. Reports from other threads create it on the event loop.
    """

    __slots__ = ("_env", "_loop", "_run", "writer")

    def __init__(self, env: WorkerEnv, run: Run, loop: asyncio.AbstractEventLoop) -> None:
        self._env = env
        self._run = run
        self._loop = loop
        self.writer: ProgressWriter | None = None

    def start(self) -> ProgressWriter:
        if self.writer is None:
            env, c, run = self._env, self._run.claimed, self._run
            self.writer = ProgressWriter(
                env.scripts, env.keys.queue(c.queue), c.tid, c.attempt, env.worker_id,
                env.settings.events_maxlen, lambda: run.stop_reason is not None,
                gate=env.progress_writes,
            )  # fmt: skip
        return self.writer

    def stop_requested(self) -> bool:
        return self._run.stop_reason is not None

    def headers(self) -> str:
        return self._run.claimed.headers

    def report_progress(self, payload: str) -> None:
        if self.writer is not None:
            self.writer.report_progress(payload)
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.start().report_progress(payload)
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the run is over
                self._loop.call_soon_threadsafe(self.report_progress, payload)


class _Record:
    """The metric children one (queue, task name) updates per run, looked up once."""

    __slots__ = ("_labels", "_metrics", "_tasks", "duration")

    def __init__(self, metrics: Any, worker_id: str, queue: str, name: str) -> None:
        self._metrics = metrics
        self._labels = (worker_id, queue, name)
        self.duration = metrics.duration.labels(queue, name)
        self._tasks: dict[str, Any] = {}

    def count(self, outcome: str) -> Any:
        child = self._tasks.get(outcome)
        if child is None:
            child = self._tasks[outcome] = self._metrics.tasks.labels(*self._labels, outcome)
        return child


class Executor:
    def __init__(
        self,
        env: WorkerEnv,
        app: App,
        pool: Executor_,
        outcomes: OutcomeWriter,
        slots: Slots,
        counters: dict[str, int],
    ) -> None:
        """``pool`` runs sync tasks; ``counters``: outcomes so far, by kind (published by the
        heartbeat)."""
        self.env = env
        self.tasks = app.tasks
        self.pool = pool
        self.outcomes = outcomes
        self.slots = slots
        self.counters = counters
        self.detached_threads = 0  # sync tasks' threads left running after their run ended
        self._children: dict[tuple[Any, ...], Any] = {}
        self._records: dict[tuple[str, str], _Record] = {}
        # The app's middleware (dtq.middleware), None when it has none: then a run costs one
        # attribute test more than without the feature. Read once: middleware added after the
        # worker started is not seen.
        self.mw: Hooks | None = app.hooks()
        # Which per-task lines are logged (DTQ_LOG_TASKS), decided once.
        info = log.isEnabledFor(logging.INFO)
        self.log_starts = info and env.settings.log_tasks == "all"
        self.log_outcomes = info and env.settings.log_tasks != "failures"

    def _metric(self, metric: Any, *labels: str) -> Any:
        """The labelled child of ``metric``, cached (``labels()`` locks and hashes per call)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    async def execute(self, run: Run) -> None:
        """Run the task and store its outcome. Never raises (except cancellation at shutdown)."""
        env = self.env
        c = run.claimed
        if self.log_starts:  # DTQ_LOG_TASKS=all (per-task lines: docs/operations.md, "Logs")
            log.info("started %s %s attempt %d", c.name, run.task_id, c.attempt,
                     extra=_extra(run, env.worker_id))  # fmt: skip
        if c.attempt == 1:
            self._metric(env.metrics.wait, logical(c.queue)).observe(
                max(0.0, (time.time() * 1000 - c.enqueued_ms) / 1000)
            )
        item: sc.Success | sc.Failure
        # Middleware (self.mw) adds no local variable here: a bigger coroutine frame made sync
        # runs measurably slower (tools/bench_executor.py).
        try:
            if run.stop_reason is not None:
                # Stopped while it waited for a slot (claimed ahead): its body never runs.
                raise asyncio.CancelledError
            result = await (self._invoke(run) if self.mw is None else self._around(run))
            item = result_item(c, result, env.settings.max_result_bytes)
        except asyncio.CancelledError:
            reason = run.stop_reason
            if reason is StopReason.CANCELLED:
                item = sc.Success.of(c, "cancelled", run.cancel_detail)
            elif reason is StopReason.CLAIM_LOST:
                log.warning("claim lost, run cancelled: %s attempt %d", run.task_id, c.attempt,
                            extra=_extra(run, env.worker_id))  # fmt: skip
                if self.mw is not None:
                    await self._notify(run, "lost", None)
                return
            else:
                if self.mw is not None:
                    await self._notify(run, "interrupted", None)
                raise  # shutdown: the worker hands the task back
        except Exception as exc:  # Retry, Fail, a timeout, any error (dtq.retrypolicy)
            if isinstance(exc, UnknownName) and await self._hand_back_unknown(run):
                return
            item = failure_item(c, exc, env.settings)
        reason = run.stop_reason
        if reason is StopReason.CLAIM_LOST:
            if self.mw is not None:
                await self._notify(run, "lost", item)
            return  # result discarded; the fence would refuse it anyway
        if reason is StopReason.CANCELLED and isinstance(item, sc.Success):
            item = sc.Success.of(c, "cancelled", run.cancel_detail)
        # A stop arriving from now on (cancel, claim loss, shutdown) is recorded but does not
        # cancel this task (Run.stop): a finished run's write is never abandoned half way, and
        # the fence decides between it and a hand-back. (Cheaper than asyncio.shield, which
        # wraps the write in a task of its own.)
        run.writing = True
        self.slots.release(run)
        try:
            verdict = await self.outcomes.write(
                Outcome(c.queue, item, bucket=bucket_of(time.monotonic() - run.started_mono)),
                lambda: run.stop_reason is not StopReason.CLAIM_LOST,
            )
        except BaseException:
            if self.mw is not None:  # every hooked run hears its end (spans are not left open)
                await self._notify(run, "lost", item)
            raise
        run.answered = verdict is not None
        self._record(run, item, verdict)
        if self.mw is not None:
            v = "lost" if verdict is None else "retried" if verdict == "scheduled" else verdict
            await self._notify(run, v, item)

    async def _hand_back_unknown(self, run: Run) -> bool:
        """Hand a task whose name this worker does not know back (requeue.lua, spending
        nothing, due in :data:`UNKNOWN_HANDBACK_MS`) while a live worker consuming its queue
        declared the name within DTQ_DECLARATION_GRACE_S; False when none did (it fails)."""
        env, c, s = self.env, run.claimed, self.env.settings
        call = sc.requeue_call(
            env.keys.queue(c.queue), env.worker_id, [run.ref], events_maxlen=s.events_maxlen,
            ttl_s=max(s.result_ttl_s, s.dlq_ttl_s), max_interruptions=s.max_interruptions,
            retry_delay_ms=UNKNOWN_HANDBACK_MS,
            unknown_grace_ms=int(s.declaration_grace_s * 1000),
        )  # fmt: skip
        run.writing = True
        self.slots.release(run)
        [verdict] = sc.parse_verdicts(await env.scripts.run(call))
        if verdict is sc.Verdict.UNKNOWN:
            return False
        run.answered = True
        log.info("handed back %s %s attempt %d: task name unknown here, declared by a live "
                 "worker (%s)", c.name, run.task_id, c.attempt, verdict,
                 extra=_extra(run, env.worker_id))  # fmt: skip
        if self.mw is not None:
            await self._notify(run, "interrupted", None)
        return True

    def _context(self, run: Run, progress: _Hooks | None, deadline: float | None) -> TaskContext:
        c = run.claimed
        return TaskContext(
            id=run.task_id, name=c.name, queue=logical(c.queue), attempt=c.attempt,
            retries=c.retries, max_retries=c.max_retries, worker_id=self.env.worker_id,
            deadline=deadline,
            hooks=progress,
        )  # fmt: skip

    async def _around(self, run: Run) -> Any:
        """The run inside the middleware's ``around_task`` hooks (one context for all)."""
        assert self.mw is not None
        timeout = run.claimed.timeout
        deadline = None if timeout is None else time.time() + timeout
        ctx = self._context(run, _Hooks(self.env, run, asyncio.get_running_loop()), deadline)
        hk = run.hooked = Hooked(ctx)
        set_current(ctx)
        try:
            hk.result = await around(self.mw, ctx, lambda: self._invoke(run))
        except BaseException as exc:
            hk.raised = exc
            raise
        return hk.result

    async def _notify(self, run: Run, verdict: str, item: sc.Success | sc.Failure | None) -> None:
        """Tell the ``on_outcome`` hooks what became of the run (never raises)."""
        mw, hk = self.mw, run.hooked
        run.hooked = None  # run -> ctx -> its hooks -> run: no cycle left behind
        if mw is None or not mw.on_outcome:
            return
        if hk is None:  # a run stopped before its body
            hk = Hooked(self._context(run, _Hooks(self.env, run, asyncio.get_running_loop()), None))
        error = item.error if isinstance(item, sc.Failure) else None
        raised = None if isinstance(hk.raised, asyncio.CancelledError) else hk.raised
        result = hk.result if isinstance(item, sc.Success) else None
        elapsed = time.monotonic() - run.started_mono
        await notify_outcome(mw, hk.ctx, RunOutcome(verdict, elapsed, error, raised, result))

    def _record(self, run: Run, item: sc.Success | sc.Failure, verdict: str | None) -> None:
        env, c = self.env, run.claimed
        elapsed = time.monotonic() - run.started_mono
        rec = self._records.get((c.queue, c.name))
        if rec is None:
            rec = _Record(env.metrics, env.worker_id, logical(c.queue), c.name)
            self._records[(c.queue, c.name)] = rec
        rec.duration.observe(elapsed)
        if verdict is None:
            return
        if verdict == "stale":
            env.metrics.stale_writes.inc()
            log.warning("stale outcome rejected: %s attempt %d", run.task_id, c.attempt,
                        extra=_extra(run, env.worker_id))  # fmt: skip
            return
        outcome = "retried" if verdict == "scheduled" else verdict
        rec.count(outcome).inc()
        counters = self.counters
        counters[outcome] = counters.get(outcome, 0) + 1
        if isinstance(item, sc.Failure):
            _log_failure(run, item, outcome, elapsed, env.worker_id)
        elif self.log_outcomes:
            log.info("%s %s %s attempt %d in %.3fs", outcome, c.name, run.task_id,
                     c.attempt, elapsed, extra=_extra(run, env.worker_id))  # fmt: skip

    async def _invoke(self, run: Run) -> Any:
        env, c = self.env, run.claimed
        task = self.tasks.get(c.name)
        if task is None:
            raise UnknownName(f"unknown task {c.name!r}: not registered on worker {env.worker_id}")
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
        # Made already when middleware wraps the run (_around). No local more than without
        # middleware: see execute().
        ctx = None if run.hooked is None else run.hooked.ctx
        if ctx is None:
            deadline = None if timeout is None else time.time() + timeout
            hooks = _Hooks(env, run, loop)
        else:
            deadline = ctx.deadline
            hooks = ctx.hooks  # type: ignore[assignment]

        def context() -> TaskContext:  # made once: a child task asking later gets the same
            nonlocal ctx
            if ctx is None:
                ctx = self._context(run, hooks, deadline)
            return ctx

        if task.is_async:
            # Made on the task's first current_task() (most never ask).
            set_current(context)
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
            if hooks.writer is not None:
                await hooks.writer.flush()  # the last progress report lands before the outcome
            return result
        set_current(context())
        writer = hooks.start()  # a sync task reports from its thread: the writer must exist
        cv = contextvars.copy_context()
        # The pool's future is the body's start gate: a thread starts the body only if it can
        # mark the future running, and cancel() succeeds only while it is not (both under the
        # future's lock). An attempt that ends while its body waits for a thread cancels it
        # there and then, so that body never starts (docs/faults.md, hung sync tasks).
        gate = self.pool.submit(cv.run, task.fn, *args, **kwargs)
        fut = asyncio.wrap_future(gate, loop=loop)
        try:
            return await writer.after(asyncio.wait_for(asyncio.shield(fut), timeout))
        except TimeoutError:
            if gate.cancel():
                raise TaskTimeout(
                    f"timed out after {timeout}s (sync task: no pool thread came free, "
                    "its body never started)"
                ) from None
            # A thread cannot be killed: it runs on, its result discarded (see docs).
            _detach(self, fut)
            raise TaskTimeout(
                f"timed out after {timeout}s (sync task: its thread was left to finish)"
            ) from None
        except asyncio.CancelledError:
            if not gate.cancel():  # (cancelled: its body never starts)
                _detach(self, fut)
            raise
