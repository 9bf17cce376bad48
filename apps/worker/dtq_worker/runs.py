"""The one run path: every claimed batch goes to :meth:`Runs.take` and becomes runs here
(docs/design.md, module map)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from concurrent.futures import Executor as Executor_
from typing import TYPE_CHECKING

from dtq import scripts as sc
from dtq.app import App
from dtq.retrypolicy import retry_delay_ms
from dtq_worker.executor import Executor
from dtq_worker.faults import Backoff, is_transient
from dtq_worker.outcomes import OutcomeWriter
from dtq_worker.slots import Run, Slots, StopReason

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv

log = logging.getLogger("dtq.worker")

# How long (in visibility timeouts) a run forgotten without a fence answer stays known
# (Runs.known): a recovery adopting it would start the same attempt twice.
UNANSWERED_KEEP_VISIBILITY = 3


class Runs:
    def __init__(
        self,
        env: WorkerEnv,
        app: App,
        pool: Executor_,
        queue_caps: dict[str, int],
        counters: dict[str, int],
    ) -> None:
        """``pool`` runs sync task bodies; ``queue_caps``: queue -> its most runs held at once;
        ``counters``: outcomes so far (the heartbeat publishes them)."""
        s = env.settings
        self.env = env
        self._ctx = contextvars.copy_context()  # each run starts in a copy (start())
        self.slots = Slots(
            s.worker_concurrency,
            s.worker_prefetch,
            queue_caps,
            s.visibility_timeout_s - s.heartbeat_interval_s,
            self.start,
            env.partitions_of,
        )
        self.outcomes = OutcomeWriter(env, self.slots, self.take)
        self.executor = Executor(env, app, pool, self.outcomes, self.slots, counters)
        self.more = False  # a claim stopped at its scan budget: the poll loop claims again
        self._unanswered: dict[tuple[str, int, str], float] = {}  # (queue, prio, eid) -> until

    # --- in --------------------------------------------------------------------------------

    def take(self, queue: str, batch: sc.ClaimBatch, sent: float, reserved: int = 0) -> None:
        """A claim's reply for ``queue``, sent at ``sent`` (monotonic: its leases count from then):
        give back the ``reserved`` slots it held and launch its runs, with no await between."""
        if reserved:
            self.slots.unreserve(queue, reserved)
        if batch.absorbed:
            self.env.metrics.absorbed.inc(batch.absorbed)
        self.more = self.more or batch.more
        for c in batch.runs:
            self.launch(c, sent)

    def launch(self, claimed: sc.Claimed, sent: float | None = None) -> None:
        """Take a claimed run: start its body, or keep it waiting for a slot (Slots.launch).
        ``sent``: when the claim was sent (monotonic; default now)."""
        run = Run(claimed)
        if sent is not None:
            run.leased_mono = sent
        slots = self.slots
        old = slots.inflight.get(run.key)
        if old is not None:
            if old.claimed.attempt == claimed.attempt:  # a recovery and a claim both carry it
                log.warning("run %s attempt %d is already held here", run.task_id, claimed.attempt)
                return
            # An older attempt still runs here (this worker was frozen): its claim was lost.
            self.forget(old)
            if old.stop_reason is None:
                self.lose(old, "was reclaimed and its task claimed again here")
        if slots.launch(run):
            self.start(run)

    def start(self, run: Run) -> None:
        """Begin the run's task: its body, or the write of its stop (Executor.execute)."""
        run.started_mono = time.monotonic()
        # A copy of the worker's context, not of the caller's: an outcome write that claims
        # the next runs runs in a run's context, whose variables must not leak into them.
        run.task = asyncio.get_running_loop().create_task(self._run(run), context=self._ctx.copy())

    async def _run(self, run: Run) -> None:
        try:
            await self.executor.execute(run)
        except asyncio.CancelledError:
            if run.stop_reason is None:
                log.warning("run %s cancelled without a reason", run.task_id)
        except Exception:  # the entry stays pending: reclaimed after the visibility timeout
            log.exception("run %s could not store its outcome", run.task_id)
        finally:  # a run stopped for shutdown and not answered is the shutdown's to hand back
            if run.stop_reason is not StopReason.SHUTDOWN or run.answered:
                self.forget(run)

    # --- out -------------------------------------------------------------------------------

    def forget(self, run: Run) -> None:
        """The run is no longer this worker's (Slots.forget). One whose outcome the fence never
        answered is remembered as known for a while (see :meth:`known`)."""
        if self.slots.forget(run) and not run.answered:
            c = run.claimed
            keep = self.env.settings.visibility_timeout_s * UNANSWERED_KEEP_VISIBILITY
            self._unanswered[(c.queue, c.priority, c.eid)] = time.monotonic() + keep

    def known(self, queue: str) -> list[tuple[int, str]]:
        """The (priority, entry id) of every run of ``queue`` held here or forgotten unanswered
        lately: a recovery must not adopt them (recovery.py)."""
        now = time.monotonic()
        self._unanswered = {k: until for k, until in self._unanswered.items() if until >= now}
        held = [r.claimed for r in self.slots.inflight.values()]
        known = [(p, eid) for q, p, eid in self._unanswered if q == queue]
        return known + [(c.priority, c.eid) for c in held if c.queue == queue]

    def cancel(self, queue: str | None, tid: str) -> None:
        """A cancel request for task ``tid`` (of ``queue``; any queue when None): stop its run,
        or keep a hint for a claim of it that may be on its way back (Slots.hint)."""
        held = False
        for run in list(self.slots.inflight.values()):
            same = run.claimed.tid == tid and (queue is None or run.claimed.queue == queue)
            held = held or same
            if same and run.stop_reason is None:
                log.info("cancel requested: %s attempt %d", run.task_id, run.claimed.attempt)
                self.stop(run, StopReason.CANCELLED, "cancelled by request")
        if not held:  # kept one visibility timeout: by then every touch reports the flag
            self.slots.hint(tid, self.env.settings.visibility_timeout_s)

    def lose(self, run: Run, why: str) -> None:
        """Count, log and announce a lost claim; stop the run (an async run is cancelled)."""
        env = self.env
        env.metrics.claims_lost.inc()
        log.warning(
            "claim lost: %s attempt %d %s; cancelling", run.task_id, run.claimed.attempt, why
        )
        env.emit_event("claim_lost", f"{run.task_id}:{run.claimed.attempt}")
        self.stop(run, StopReason.CLAIM_LOST)

    def stop(self, run: Run, reason: StopReason, detail: str = "") -> None:
        """Stop a run (Run.stop: the first reason wins). A run waiting for a slot is dropped (a
        lost claim), or starts and writes "cancelled" without its body; a shutdown hands it back."""
        run.stop(reason, detail)
        if not run.waiting or run.stop_reason is StopReason.SHUTDOWN:
            return
        if run.stop_reason is StopReason.CLAIM_LOST:
            self.forget(run)
        else:  # it starts now, in the slot it holds
            self.slots.ready.remove(run)
            run.waiting = False
            self.start(run)

    async def hand_back_unstarted(self) -> None:
        """Runs claimed ahead (bodies not started): back to the queue at once, for other workers."""
        unstarted = self.slots.take_ready()
        if not unstarted:
            return
        for r in unstarted:
            r.stop(StopReason.SHUTDOWN)
        await self.hand_back(unstarted, started=False)
        for r in unstarted:  # not handed back (Redis stayed away): reclaimed after the timeout
            self.forget(r)

    async def hand_back(self, runs: list[Run], started: bool = True) -> None:
        """requeue.lua for ``runs``, retried while Redis is away up to most of DTQ_HARD_EXIT_S.
        ``started=False``: their bodies never began (no interruption is counted)."""
        env, s = self.env, self.env.settings
        by_queue: dict[str, list[Run]] = {}
        for r in runs:
            by_queue.setdefault(r.claimed.queue, []).append(r)
        backoff = Backoff(log, "hand-back")
        deadline = time.monotonic() + s.hard_exit_s * 0.8
        for queue, qruns in by_queue.items():
            call = sc.requeue_call(
                env.keys.queue(queue),
                env.worker_id,
                [r.ref for r in qruns],
                events_maxlen=s.events_maxlen,
                ttl_s=max(s.result_ttl_s, s.dlq_ttl_s),
                max_interruptions=s.max_interruptions,
                retry_delay_ms=retry_delay_ms(s, 0),
                started=started,
            )
            while True:
                try:
                    verdicts = sc.parse_verdicts(await env.scripts.run(call))
                    for r, v in zip(qruns, verdicts, strict=True):
                        log.info("handed back %s attempt %d: %s", r.task_id, r.claimed.attempt, v)
                        self.forget(r)
                    break
                except Exception as exc:
                    if not is_transient(exc) or time.monotonic() > deadline:
                        log.error(
                            "could not hand back %d runs of %s (%s); other workers will "
                            "reclaim them after the visibility timeout",
                            len(qruns),
                            queue,
                            exc,
                        )
                        break
                    await asyncio.sleep(backoff.failed(exc))
