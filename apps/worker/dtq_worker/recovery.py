"""Finding the runs a lost reply hid from this worker (lua/recover.lua), and taking them up
(docs/faults.md, "Lost replies"; docs/design.md, "The worker", recovery)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from dtq import scripts as sc
from dtq_worker.faults import is_transient
from dtq_worker.slots import Run

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv
    from dtq_worker.runs import Runs

log = logging.getLogger("dtq.recovery")
AT_ONCE = 8  # recoveries sent at once: hundreds of queues must not take the client's pool


class Recovery:
    def __init__(self, env: WorkerEnv, runs: Runs) -> None:
        """``runs``: takes up (or hands back) the runs found; says which are known here."""
        self.env = env
        self.runs = runs
        self.slots = runs.slots
        self._busy: dict[str, asyncio.Event] = {}  # queue -> set when its recovery is over
        self._queue_of = {env.keys.queue(q).task_base: q for q in env.queues}
        self._failed: set[str] = set()  # queues whose last recovery did not get through
        self._sending = asyncio.Semaphore(AT_ONCE)
        self.since_ms = 0  # server ms when this process started (set by Worker.prepare)
        self.last = time.monotonic()
        # The periodic check: a few times per visibility timeout, at most once per heartbeat.
        self.period = max(env.settings.heartbeat_interval_s, env.settings.visibility_timeout_s / 4)

    def active(self, queue: str) -> bool:
        """A recovery of ``queue`` is pending or in flight: send no claim of it."""
        return queue in self.slots.recovering

    async def wait(self, queue: str) -> None:
        if (ev := self._busy.get(queue)) is not None:
            await ev.wait()

    def reply_lost(self, call: sc.Call) -> None:
        """AsyncScripts.on_reply_lost: a call that may have claimed lost its reply."""
        claims = call.script == "claim" or (call.script == "complete" and int(call.args[6]) > 0)
        if claims and (queue := self._queue_of.get(call.keys[13])) is not None:
            self.request(queue)

    def request(self, queue: str) -> None:
        """Recover ``queue`` soon (once no claim of it is in flight); one at a time per queue."""
        if queue not in self._busy:
            self._busy[queue] = asyncio.Event()
            self.slots.recovering.add(queue)
            self.env.spawn(self._recover(queue))

    def tick(self) -> None:
        """From the heartbeat loop: the periodic check of every queue."""
        if time.monotonic() - self.last >= self.period:
            self.last = time.monotonic()
            for q in self.env.queues:
                self.request(q)

    async def _recover(self, queue: str) -> None:
        env = self.env
        done = self._busy[queue]
        try:
            await self.slots.claims_settled(queue)
            try:
                async with self._sending:
                    call = sc.recover_call(
                        env.keys.queue(queue),
                        env.worker_id,
                        self.runs.known(queue),
                        events_maxlen=env.settings.events_maxlen,
                        since_ms=self.since_ms,
                    )
                    sent = time.monotonic()
                    batch = sc.parse_claim(queue, await env.scripts.run(call))
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.debug("recovery of %s failed: %s", queue, exc)
                self._failed.add(queue)
                return
            self._failed.discard(queue)
            fresh = []
            for c in batch.runs:
                old = self.slots.inflight.get((queue, c.tid))
                if old is not None and old.claimed.attempt == c.attempt:
                    continue
                env.metrics.adopted.inc()
                back = " (handing it back: stopping)" if env.stopping else ""
                log.warning(
                    "adopted run after a lost reply: %s:%s attempt %d%s",
                    queue,
                    c.tid,
                    c.attempt,
                    back,
                )
                fresh.append(c)
            if env.stopping:  # bodies never started: handed back, nothing spent
                if batch.absorbed:
                    env.metrics.absorbed.inc(batch.absorbed)
                await self.runs.hand_back([Run(c) for c in fresh], started=False)
            else:
                self.runs.take(queue, dataclasses.replace(batch, runs=fresh), sent)
        except Exception:
            log.exception("recovery of %s failed", queue)
        finally:
            del self._busy[queue]
            self.slots.recovering.discard(queue)
            done.set()

    async def settle(self, timeout: float) -> None:
        """Shutdown: a last check of every queue (lost replies of the drain's claims), its runs
        handed back; retried while Redis is away, for at most ``timeout``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        todo = set(self.env.queues)
        while todo and loop.time() < end:
            for q in todo:
                self.request(q)
            waits = [asyncio.ensure_future(ev.wait()) for ev in self._busy.values()]
            if waits:
                await asyncio.wait(waits, timeout=max(0.0, end - loop.time()))
                for t in waits:
                    t.cancel()
            todo = {q for q in todo if q in self._failed or q in self._busy}
            if todo:
                await asyncio.sleep(0.1)
