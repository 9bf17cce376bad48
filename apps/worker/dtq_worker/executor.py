"""A claimed task's run in the worker: its body (dtq.run), its outcome written, its metrics
and log lines; a stopped run (cancel, claim lost, shutdown) and a name not known here."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor as Executor_
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq.app import App
from dtq.errors import UnknownName
from dtq.retrypolicy import failure_item, result_item
from dtq.run import Runner
from dtq.stats import bucket_of
from dtq.store.partitions import logical
from dtq_worker.outcomes import Outcome
from dtq_worker.slots import Run, StopReason

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv
    from dtq_worker.outcomes import OutcomeWriter
    from dtq_worker.slots import Slots

log = logging.getLogger("dtq.executor")
# A task whose name this worker does not know, handed back (a rolling deploy), is due this later.
UNKNOWN_HANDBACK_MS = 1000


def _extra(run: Run, worker: str) -> dict[str, Any]:
    """Structured log fields of a run (built only when a line is actually logged)."""
    c = run.claimed
    return dict(
        task_id=run.task_id, queue=logical(c.queue), attempt=c.attempt, task=c.name, worker=worker
    )


def _log_failure(run: Run, item: sc.Failure, outcome: str, elapsed: float, worker: str) -> None:
    """A run that ended in an exception: ERROR with the stored traceback when the task ended
    ``failed`` (as Celery and RQ log it), INFO when it will be retried or was cancelled."""
    c = run.claimed
    level = logging.ERROR if outcome == "failed" else logging.INFO
    if not log.isEnabledFor(level):
        return
    msg = "%s %s %s attempt %d in %.3fs: %s"
    args = (outcome, c.name, run.task_id, c.attempt, elapsed, item.error)
    rec = log.makeRecord(log.name, level, __file__, 0, msg, args, None, extra=_extra(run, worker))
    if level == logging.ERROR and item.traceback:
        rec.exc_text = item.traceback.rstrip("\n")  # written after the line, as exc_info's is
    log.handle(rec)


class _Record:
    """The metric children one (queue, task name) updates per run, looked up once."""

    __slots__ = ("_labels", "_metrics", "_tasks", "duration", "wait")

    def __init__(self, metrics: Any, worker_id: str, queue: str, name: str) -> None:
        self._metrics = metrics
        self._labels = (worker_id, queue, name)
        self.duration = metrics.duration.labels(queue, name)
        self.wait = metrics.wait.labels(queue)
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
        self.outcomes = outcomes
        self.slots = slots
        self.counters = counters
        maxlen = env.settings.events_maxlen
        self.runner = Runner(
            app, pool, env.worker_id, env.scripts, env.keys, maxlen, env.progress_writes
        )
        self.mw = self.runner.mw  # the app's middleware, None when it has none
        self._records: dict[tuple[str, str], _Record] = {}
        info = log.isEnabledFor(logging.INFO)
        self.log_starts = info and env.settings.log_tasks == "all"
        self.log_outcomes = info and env.settings.log_tasks != "failures"

    def _rec(self, c: sc.Claimed) -> _Record:
        rec = self._records.get((c.queue, c.name))
        if rec is None:
            env = self.env
            rec = _Record(env.metrics, env.worker_id, logical(c.queue), c.name)
            self._records[(c.queue, c.name)] = rec
        return rec

    async def execute(self, run: Run) -> None:
        """Run the task and store its outcome. Never raises (except cancellation at shutdown)."""
        env = self.env
        c = run.claimed
        if self.log_starts:  # DTQ_LOG_TASKS=all (per-task lines: docs/operations.md, "Logs")
            log.info("started %s %s attempt %d", c.name, run.task_id, c.attempt,
                     extra=_extra(run, env.worker_id))  # fmt: skip
        if c.attempt == 1:
            self._rec(c).wait.observe(max(0.0, (time.time() * 1000 - c.enqueued_ms) / 1000))
        item: sc.Success | sc.Failure
        # No local variable more here: a bigger coroutine frame made sync runs slower.
        try:
            if run.stop_reason is not None:  # stopped while it waited for a slot: no body
                raise asyncio.CancelledError
            result = await self.runner.call(run)
            item = result_item(c, result, env.settings.max_result_bytes)
        except asyncio.CancelledError:
            if run.stop_reason is StopReason.CLAIM_LOST:
                log.warning(
                    "claim lost, run cancelled: %s attempt %d",
                    run.task_id,
                    c.attempt,
                    extra=_extra(run, env.worker_id),
                )
                await self.runner.notify(run, "lost", None)  # (off the hot path: unguarded)
                return
            if run.stop_reason is not StopReason.CANCELLED:
                await self.runner.notify(run, "interrupted", None)
                raise  # shutdown: the worker hands the task back
            item = sc.Success.of(c, "cancelled", run.cancel_detail)
        except Exception as exc:  # Retry, Fail, a timeout, any error (dtq.retrypolicy)
            if isinstance(exc, UnknownName) and await self._hand_back_unknown(run):
                return
            item = failure_item(c, exc, env.settings)
        reason = run.stop_reason
        if reason is StopReason.CLAIM_LOST:
            await self.runner.notify(run, "lost", item)
            return  # result discarded; the fence would refuse it anyway
        if reason is StopReason.CANCELLED and isinstance(item, sc.Success):
            item = sc.Success.of(c, "cancelled", run.cancel_detail)
        # A stop from now on is recorded but cancels nothing (Run.stop): the write is never
        # abandoned half way, the fence decides (cheaper than asyncio.shield).
        run.writing = True
        self.slots.release(run)
        try:
            verdict = await self.outcomes.write(
                Outcome(c.queue, item, bucket=bucket_of(time.monotonic() - run.started_mono)),
                lambda: run.stop_reason is not StopReason.CLAIM_LOST,
            )
        except BaseException:  # every hooked run hears its end (spans are not left open)
            await self.runner.notify(run, "lost", item)
            raise
        run.answered = verdict is not None
        self._record(run, item, verdict)
        if self.mw is not None:
            await self.runner.notify(run, verdict, item)

    async def _hand_back_unknown(self, run: Run) -> bool:
        """Hand a task whose name this worker does not know back, spending nothing, while a
        live worker declared the name within DTQ_DECLARATION_GRACE_S; False when none did."""
        env, c, s = self.env, run.claimed, self.env.settings
        call = sc.requeue_call(
            env.keys.queue(c.queue),
            env.worker_id,
            [run.ref],
            events_maxlen=s.events_maxlen,
            ttl_s=max(s.result_ttl_s, s.dlq_ttl_s),
            max_interruptions=s.max_interruptions,
            retry_delay_ms=UNKNOWN_HANDBACK_MS,
            unknown_grace_ms=int(s.declaration_grace_s * 1000),
        )
        run.writing = True
        self.slots.release(run)
        [verdict] = sc.parse_verdicts(await env.scripts.run(call))
        if verdict is sc.Verdict.UNKNOWN:
            return False
        run.answered = True
        log.info("handed back %s %s attempt %d: task name unknown here, declared by a live "
                 "worker (%s)", c.name, run.task_id, c.attempt, verdict,
                 extra=_extra(run, env.worker_id))  # fmt: skip
        await self.runner.notify(run, "interrupted", None)
        return True

    def _record(self, run: Run, item: sc.Success | sc.Failure, verdict: str | None) -> None:
        env, c = self.env, run.claimed
        elapsed = time.monotonic() - run.started_mono
        rec = self._rec(c)
        rec.duration.observe(elapsed)
        if verdict is None:
            return
        if verdict == "stale":
            env.metrics.stale_writes.inc()
            log.warning(
                "stale outcome rejected: %s attempt %d",
                run.task_id,
                c.attempt,
                extra=_extra(run, env.worker_id),
            )
            return
        outcome = "retried" if verdict == "scheduled" else verdict
        rec.count(outcome).inc()
        self.counters[outcome] = self.counters.get(outcome, 0) + 1
        if isinstance(item, sc.Failure):
            _log_failure(run, item, outcome, elapsed, env.worker_id)
        elif self.log_outcomes:
            log.info("%s %s %s attempt %d in %.3fs", outcome, c.name, run.task_id,
                     c.attempt, elapsed, extra=_extra(run, env.worker_id))  # fmt: skip
