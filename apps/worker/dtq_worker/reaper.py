"""The reaper loop: put back entries whose worker stopped heartbeating (XAUTOCLAIM in Lua)."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dtq import scripts as sc
from dtq_worker.faults import is_nogroup

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv

log = logging.getLogger("dtq.reaper")


class Reaper:
    def __init__(self, env: WorkerEnv, ensure_groups: Callable[[], Awaitable[None]]) -> None:
        """``ensure_groups()``: recreate the streams and groups found missing."""
        self.env = env
        self._ensure_groups = ensure_groups

    async def loop(self) -> None:
        env = self.env
        period = max(0.5, env.settings.visibility_timeout_s / 2)
        while not env.stopping:
            await env.sleep(period * random.uniform(0.8, 1.2))
            if env.stopping or not env.healthy.is_set():
                continue
            await self.reap_once()

    async def reap_once(self) -> sc.ReclaimResult:
        """One pass over every queue: each run idle past the visibility timeout when it starts is
        reclaimed by its end (docs/design.md, "The worker", reaper)."""
        env = self.env
        total = sc.ReclaimResult(0, 0, 0)
        for queue in env.queues:
            res = await self._pass(queue)
            if res is None:
                continue
            lost = res.requeued + res.failed + res.cancelled
            if lost:
                log.warning("reclaimed %d lost runs on %s (%d failed past their retries, %d "
                            "cancelled as requested)", lost, queue, res.failed,
                            res.cancelled)  # fmt: skip
            total += res
        return total

    async def _pass(self, queue: str) -> sc.ReclaimResult | None:
        """Reclaim calls over ``queue`` until its pass is complete (None: its groups were
        missing and are recreated; the next pass covers it)."""
        env, s = self.env, self.env.settings
        band, cursor = 1, "0-0"
        total = sc.ReclaimResult(0, 0, 0)
        while True:
            call = sc.reclaim_call(
                env.keys.queue(queue),
                env.worker_id,
                min_idle_ms=int(s.visibility_timeout_s * 1000),
                count=max(10, s.worker_concurrency * 2),
                events_maxlen=s.events_maxlen,
                ttl_s=max(s.result_ttl_s, s.dlq_ttl_s),
                band=band,
                cursor=cursor,
            )
            try:
                res = sc.parse_reclaim(await env.scripts.run(call))
            except Exception as exc:
                if is_nogroup(exc):
                    await self._ensure_groups()
                    return None
                raise
            env.metrics.reclaimed.inc(res.requeued + res.failed + res.cancelled)
            env.metrics.absorbed.inc(res.absorbed)
            total += res
            if not res.more or env.stopping:
                return total
            band, cursor = res.band, res.cursor
