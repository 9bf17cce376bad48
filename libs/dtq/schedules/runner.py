"""Firing schedules: run by the worker's scheduler leader (and by :mod:`dtq.testing`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dtq import scripts as sc
from dtq.schedules.cron import from_ms
from dtq.schedules.model import Schedule, declared
from dtq.schedules.ops import forget, put_call, server_ms
from dtq.sdk.requests import build_task
from dtq.settings import Settings
from dtq.store.keys import Keys, QueueKeys, make_task_id

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis

    from dtq.app import App

log = logging.getLogger("dtq.schedules")


def _is_code(spec: str) -> bool:
    try:
        return bool(json.loads(spec).get("source") == "code")
    except (ValueError, AttributeError):
        return False


class ScheduleRunner:
    """Fires the due schedules of a queue; called from the scheduler leader's tick.

    Also keeps the code-declared schedules in step with Redis: every worker stores its new or
    changed ones (:meth:`store_if_due`); the leader removes one no live worker declared within
    DTQ_DECLARATION_GRACE_S, so each version's schedules fire during a rolling deploy
    (docs/operations.md, "Rolling deploys"). Runtime ones are never touched.
    """

    SYNC_EVERY_S = 30.0
    BATCH = 100

    def __init__(
        self, redis: AsyncRedis, scripts: sc.AsyncScripts, keys: Keys, settings: Settings, app: App
    ) -> None:
        self.redis = redis
        self.scripts = scripts
        self.keys = keys
        self.settings = settings
        self.app = app
        self._next_sync: dict[str, float] = {}
        self._next_store: dict[str, float] = {}
        self._kept: set[tuple[str, str]] = set()  # (queue, name) logged as kept for another
        # A short grace is checked as often (tests; a deploy that wants removals soon).
        self._sync_every_s = min(self.SYNC_EVERY_S, max(0.5, settings.declaration_grace_s / 2))

    async def now_ms(self) -> int:
        return server_ms(await self.redis.time())

    def names_by_queue(self, queues: Iterable[str]) -> dict[str, list[str]]:
        """The names of the code schedules this app declares on each of ``queues``."""
        mine = declared(self.app)
        return {q: [s.name for s in mine if s.queue == q] for q in queues}

    async def store(self, queue: str, now: int) -> dict[str, Schedule]:
        """Store this app's code schedules of ``queue`` that are new or changed; returns them."""
        qk = self.keys.queue(queue)
        mine = {s.name: s for s in declared(self.app) if s.queue == queue}
        for s in mine.values():
            stored_now = await self.scripts.run(put_call(qk, s, s.next_after(now)))
            if sc.parse_schedule_put(stored_now) is sc.Stored.CHANGED:
                log.info("schedule %s of queue %s stored from code", s.name, queue)
        return mine

    async def store_if_due(self, queue: str) -> None:
        """:meth:`store`, every :data:`SYNC_EVERY_S` (a worker that does not lead ``queue``)."""
        if not any(s.queue == queue for s in declared(self.app)):
            return
        if time.monotonic() >= self._next_store.get(queue, 0.0):
            await self.store(queue, await self.now_ms())
            self._next_store[queue] = time.monotonic() + self.SYNC_EVERY_S

    async def sync(self, queue: str, now: int) -> None:
        qk = self.keys.queue(queue)
        mine = await self.store(queue, now)
        stored: dict[str, str] = await self.redis.hgetall(qk.schedules)  # type: ignore[misc,assignment]
        seen: dict[str, str] = await self.redis.hgetall(qk.schedules_seen)  # type: ignore[misc,assignment]
        grace_ms = int(self.settings.declaration_grace_s * 1000)
        for name, spec in stored.items():
            if name in mine or not _is_code(spec):
                continue
            try:
                last = int(seen[name])
            except (KeyError, ValueError):
                # Declared by no worker that stamps: its grace counts from now.
                await self.redis.hsetnx(qk.schedules_seen, name, now)  # type: ignore[misc]
                continue
            if now - last <= grace_ms:
                if (queue, name) not in self._kept:
                    self._kept.add((queue, name))
                    log.info("schedule %s of queue %s kept: declared by a live worker", name, queue)
                continue
            async with self.redis.pipeline(transaction=True) as pipe:
                forget(pipe, qk, name)
                pipe.hdel(qk.schedules_seen, name)
                await pipe.execute()
            self._kept.discard((queue, name))
            log.info(
                "schedule %s of queue %s removed: no live worker declared it for %gs",
                name,
                queue,
                self.settings.declaration_grace_s,
            )

    async def tick_if_due(self, queue: str, next_fire_ms: int | None, now_ms: int) -> int | None:
        """:meth:`tick` when a schedule is due at ``now_ms`` (the server's time) by
        ``next_fire_ms`` (read by promote.lua) or the code's schedules are to be synced again;
        else the next fire time as given, and no call is made."""
        if time.monotonic() >= self._next_sync.get(queue, 0.0) or (
            next_fire_ms is not None and next_fire_ms <= now_ms
        ):
            return await self.tick(queue)
        return next_fire_ms

    async def tick(self, queue: str) -> int | None:
        """Fire what is due in ``queue``; return the next fire time (ms), or None."""
        qk = self.keys.queue(queue)
        now = await self.now_ms()
        if time.monotonic() >= self._next_sync.get(queue, 0.0):
            await self.sync(queue, now)
            self._next_sync[queue] = time.monotonic() + self._sync_every_s
        due: Any = await self.redis.zrange(
            qk.schedules_next, "-inf", now, byscore=True, offset=0, num=self.BATCH, withscores=True
        )
        if due:
            names = [n for n, _ in due]
            specs: Any = await self.redis.hmget(qk.schedules, names)  # type: ignore[misc]
            for (name, score), spec in zip(due, specs, strict=True):
                await self.fire_one(qk, name, int(score), spec, now)
        first: Any = await self.redis.zrange(
            qk.schedules_next, "-inf", "(inf", byscore=True, offset=0, num=1, withscores=True
        )  # a disabled schedule (score inf) is never next
        return int(first[0][1]) if first else None

    async def fire_one(
        self, qk: QueueKeys, name: str, expected: int, spec: str | None, now: int
    ) -> None:
        if spec is None:
            await self.redis.zrem(qk.schedules_next, name)
            return
        try:
            s = Schedule.from_json(spec)
            lo = max(expected, now - int(s.grace * 1000))
            # The stored next fire time is authoritative; a later one in the window replaces it.
            fire_ms = s.latest_in(lo, now) or (expected if expected == lo else None)
            next_ms = s.next_after(now)
            task = self._task(s, fire_ms or expected)
        except Exception as exc:
            # A definition that cannot fire (bad JSON, task arguments refused): retry in a
            # minute rather than spin or stop the scheduler.
            log.error("schedule %s of queue %s cannot fire: %s", name, qk.queue, exc)
            await self.redis.zadd(qk.schedules_next, {name: now + 60_000}, xx=True)
            return
        call = sc.schedule_fire_call(
            qk, name, spec=spec, expected_ms=expected, next_ms=next_ms, fire_ms=fire_ms,
            overlap=s.overlap, task=task, events_maxlen=self.settings.events_maxlen,
        )  # fmt: skip
        fired = sc.parse_schedule_fire(await self.scripts.run(call))
        outcome, tid = fired.outcome, fired.tid
        task_id = make_task_id(qk.queue, tid) if tid else None
        if outcome is sc.FireOutcome.FIRED:
            log.info("schedule %s fired %s (due %s)", name, task_id, from_ms(fire_ms or expected))
        elif outcome is sc.FireOutcome.OVERLAP:
            log.info("schedule %s skipped a fire: previous run %s still active", name, task_id)
        elif outcome is sc.FireOutcome.MISSED:
            log.warning(
                "schedule %s skipped missed fire(s) from %s (past the %gs grace)",
                name,
                from_ms(expected),
                s.grace,
            )

    def _task(self, s: Schedule, fire_ms: int) -> sc.NewTask:
        # A task this app does not know is enqueued by name: what the schedule leaves unset is
        # the running worker's declaration (docs/tasks.md), not dtq's defaults.
        req = s.request(fire_at=from_ms(fire_ms).isoformat())
        return build_task(self.settings, s.task, defaults=self.app.defaults_for(s.task), **req)[1]
