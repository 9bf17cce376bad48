"""The scheduler loop: one leader per queue promotes due delayed tasks and retries."""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from dtq import scripts as sc
from dtq.schedules import ScheduleRunner
from dtq_worker.retention import Retention

if TYPE_CHECKING:
    from dtq.app import App
    from dtq_worker.env import WorkerEnv

log = logging.getLogger("dtq.scheduler")
LEASE_MS = 10_000
# How often each queue's lock is taken or renewed: a quarter of the lease, not every tick.
LOCK_EVERY_S = LEASE_MS / 4000
BATCH = 1000
SWEEP_CALLS = 20  # limit_sweep calls per queue per tick (5000 parked ids each at most)


class Scheduler:
    def __init__(self, env: WorkerEnv, app: App) -> None:
        """``app``: its periodic schedules (dtq.schedules)."""
        self.env = env
        self.leading: set[str] = set()
        self._locked_at: dict[str, float] = {}  # queue -> its last lock call (monotonic)
        self.retention = Retention(env)
        self.periodic = ScheduleRunner(env.redis, env.scripts, env.keys, env.settings, app)

    async def loop(self) -> None:
        env = self.env
        while not env.stopping:
            pause = 1.0
            if env.healthy.is_set():
                next_due = await self.tick()
                if next_due is not None:
                    pause = min(pause, max(0.02, next_due / 1000 - time.time()))
                await self.retention.maybe_run()
            await env.sleep(pause * random.uniform(0.8, 1.0))

    async def tick(self) -> int | None:
        """Take or keep each queue's lock; promote what is due. Returns the next due ms."""
        env = self.env
        soonest: int | None = None
        for queue in env.queues:
            if not await self.leads(queue):
                # Its own code schedules are stored whoever leads (another version may).
                await self.periodic.store_if_due(queue)
                continue
            while True:
                call = sc.promote_call(env.keys.queue(queue), BATCH, env.settings.events_maxlen)
                res = sc.parse_promote(await env.scripts.run(call))
                if res.promoted + res.dropped < BATCH:
                    break
            if res.owed:
                await self.sweep_owed(queue)
            next_fire = await self.periodic.tick_if_due(queue, res.next_fire_ms, res.now_ms)
            due = [t for t in (soonest, res.next_due_ms, next_fire) if t is not None]
            soonest = min(due) if due else None
        return soonest

    async def leads(self, queue: str) -> bool:
        """Whether this worker leads ``queue`` (two overlapping leaders promote each task once)."""
        now = time.monotonic()
        if now - self._locked_at.get(queue, -LOCK_EVERY_S) < LOCK_EVERY_S:
            return queue in self.leading
        call = sc.lock_call(self.env.keys.scheduler_lock_of(queue), self.env.worker_id, LEASE_MS)
        held = sc.parse_lock(await self.env.scripts.run(call)) is sc.Lock.HELD
        self._locked_at[queue] = now
        if not held:
            if queue in self.leading:
                log.info("lost scheduler leadership of %s", queue)
            self.leading.discard(queue)
        elif queue not in self.leading:
            log.info("scheduler leader for queue %s", queue)
            self.leading.add(queue)
        return held

    async def sweep_owed(self, queue: str) -> None:
        """Finish the parked-task releases a run's end left owed (dead parked ids used up its
        budget, see lua/limit_sweep.lua); each call looks at no more than 5000 parked ids."""
        for _ in range(SWEEP_CALLS):
            call = sc.limit_sweep_call(self.env.keys.queue(queue), [])
            if not sc.parse_limit_sweep(await self.env.scripts.run(call)).more:
                break

    async def release(self) -> None:
        env = self.env
        for queue in list(self.leading):
            await env.scripts.run(sc.unlock_call(env.keys.scheduler_lock_of(queue), env.worker_id))
        self.leading.clear()
        self._locked_at.clear()
