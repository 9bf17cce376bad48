"""Retention: one worker at a time (the ``P:lock:retention`` lease) prunes, in bounded passes,
what outlived its age or cap and does not expire by itself (docs/limits.md, "Retention").
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dtq import scripts as sc
from dtq.store.cluster import scan_step
from dtq.store.partitions import is_physical

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv

log = logging.getLogger("dtq.retention")
DLQ_BATCH = 1000  # dead letters looked at per queue per pass
SCAN_CALLS = 20  # SCAN calls per pass
SCAN_COUNT = 1000
HIST_FOLD_MINUTES = 60  # minutes of enqueue counters each pass folds (dtq.stats)
_STREAM = re.compile(r"p[0-9]")


@dataclass
class RetentionReport:
    dlq_removed: int = 0
    workers_removed: int = 0
    consumers_removed: int = 0
    idem_removed: int = 0
    records_expired: int = 0
    parked_released: int = 0
    queues_forgotten: int = 0
    queues_registered: int = 0
    hist_folded: int = 0
    scan_done: bool = False
    queues: list[str] = field(default_factory=list)


class Retention:
    def __init__(self, env: WorkerEnv) -> None:
        self.env = env
        self.next_at = time.monotonic() + env.settings.retention_interval_s * random.random()
        self.cursor = "0"  # a SCAN walk's (over every primary of a cluster: dtq.store.cluster)
        self.empty_before: set[str] = set()  # queues that held nothing on the last pass

    async def maybe_run(self) -> RetentionReport | None:
        """Run a pass when one is due and this worker holds (or takes) the retention lease."""
        s = self.env.settings
        if time.monotonic() < self.next_at:
            return None
        self.next_at = time.monotonic() + s.retention_interval_s * random.uniform(0.9, 1.1)
        lease_ms = int(max(30.0, s.retention_interval_s * 3) * 1000)
        try:
            call = sc.lock_call(self.env.keys.retention_lock, self.env.worker_id, lease_ms)
            if sc.parse_lock(await self.env.scripts.run(call)) is not sc.Lock.HELD:
                return None
            report = await self.run_once()
        except Exception as exc:  # best effort: the next pass tries again
            log.warning("retention pass failed: %s", exc)
            return None
        if report.dlq_removed or report.workers_removed or report.idem_removed:
            log.info("retention: %s", report)
        return report

    async def run_once(self) -> RetentionReport:
        env, s = self.env, self.env.settings
        rep = RetentionReport()
        queues = sorted(str(q) for q in await env.redis.smembers(env.keys.queues))  # type: ignore[misc]
        rep.queues = queues
        for q in queues:
            qk = env.keys.queue(q)
            call = sc.retention_dlq_call(qk, s.dlq_ttl_s * 1000, s.dlq_max, DLQ_BATCH)
            rep.dlq_removed += sc.parse_retention_dlq(await env.scripts.run(call)).removed
            if s.events_maxlen > 0:
                await env.redis.xtrim(qk.events, maxlen=s.events_maxlen, approximate=True)
            if s.stats_retention_h:
                now_m = int(time.time()) // 60
                minutes = range(now_m - HIST_FOLD_MINUTES - 1, now_m - 1)
                call = sc.hist_fold_call(qk, minutes, s.stats_retention_h * 3600)
                rep.hist_folded += int(await env.scripts.run(call))
        rep.workers_removed = await self.prune_workers()
        rep.consumers_removed = await self.prune_consumers(queues)
        rep.queues_forgotten = await self.forget_queues(queues)
        await self.scan_pass(rep, set(queues))
        return rep

    async def prune_workers(self) -> int:
        """Drop ``P:workers`` entries older than the dead-worker age, on the Redis clock (as the
        scores): a skewed worker clock prunes nothing live."""
        env = self.env
        sec, usec = await env.redis.time()
        cutoff = int(sec) * 1000 + int(usec) // 1000 - int(env.settings.dead_worker_ttl_s * 1000)
        return int(await env.redis.zremrangebyscore(env.keys.workers, "-inf", cutoff))

    async def prune_consumers(self, queues: list[str]) -> int:
        """Delete stream consumers idle past the dead-worker age that hold no pending entry (one
        script per queue: no claim lands between the check and the delete)."""
        env = self.env
        idle_ms = int(env.settings.dead_worker_ttl_s * 1000)
        removed = 0
        for q in queues:
            call = sc.consumer_prune_call(env.keys.queue(q), idle_ms)
            removed += sc.parse_consumer_prune(await env.scripts.run(call))
        return removed

    async def forget_queues(self, queues: list[str]) -> int:
        """Drop from ``P:queues`` (with their empty keys) the queues no live worker consumes that
        held nothing on this pass and the last; a client's next enqueue registers one again."""
        env = self.env
        consumed: set[str] = set(env.queues)
        ids = await env.redis.zrange(env.keys.workers, 0, -1)
        if ids:
            async with env.redis.pipeline(transaction=False) as pipe:
                for wid in ids:
                    pipe.hget(env.keys.worker(str(wid)), "queues")
                for listed in await pipe.execute():
                    consumed.update(q for q in str(listed or "").split(",") if q)
        empty: set[str] = set()
        forgotten = 0
        for q in queues:
            if q in consumed:
                continue
            drop = q in self.empty_before
            state = await env.scripts.run(sc.queue_empty_call(env.keys.queue(q), drop))
            if sc.parse_queue_state(state) is not sc.QueueState.EMPTY:
                continue
            if drop:
                await env.redis.srem(env.keys.queues, q)
                forgotten += 1
                log.info("retention: forgot queue %s (it held nothing, no worker consumes it)", q)
            else:
                empty.add(q)
        self.empty_before = empty
        return forgotten

    async def scan_pass(self, rep: RetentionReport, registered: set[str]) -> None:
        """A bounded slice of a SCAN over the prefix (the cursor carries over to the next pass);
        a queue with waiting work missing from ``P:queues`` is registered again."""
        env, s = self.env, self.env.settings
        pattern = env.keys.every_queue_key_pattern
        found: dict[str, list[str]] = defaultdict(list)
        held: dict[str, list[str]] = defaultdict(list)
        busy: set[str] = set()
        for _ in range(SCAN_CALLS):
            self.cursor, batch = await scan_step(env.redis, self.cursor, pattern, SCAN_COUNT)
            for key in map(str, batch):
                if (parts := env.keys.queue_key_parts(key)) is None:
                    continue
                queue, rest = parts
                if rest == "sched" or _STREAM.fullmatch(rest):
                    # (forget_queues deletes these: after it they mean new work; records do not)
                    busy.add(queue)
                if rest.startswith(("t:", "idem:")):
                    found[queue].append(key)
                elif rest.startswith("lim:") and rest.endswith(":held"):
                    held[queue].append(rest[len("lim:") : -len(":held")])
            if self.cursor == "0":
                rep.scan_done = True
                break
        missing = sorted(q for q in busy - registered if is_physical(q))  # partitions too
        if missing:
            rep.queues_registered = int(await env.redis.sadd(env.keys.queues, *missing))
        ttl_s = max(s.result_ttl_s, s.dlq_ttl_s)
        for q, keys in found.items():
            qk = env.keys.queue(q)
            for i in range(0, len(keys), 500):
                call = sc.retention_keys_call(qk, keys[i : i + 500], ttl_s)
                swept = sc.parse_retention_keys(await env.scripts.run(call))
                rep.idem_removed += swept.idem_deleted
                rep.records_expired += swept.expired
        for q, lks in held.items():
            qk = env.keys.queue(q)
            for i in range(0, len(lks), 100):
                call = sc.limit_sweep_call(qk, lks[i : i + 100])
                rep.parked_released += sc.parse_limit_sweep(await env.scripts.run(call)).released
