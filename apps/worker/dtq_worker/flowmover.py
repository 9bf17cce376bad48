"""The flow mover: moves workflow handovers between slots, each acknowledged only after its
idempotent move succeeded (docs/workflows.md, "Redis Cluster")."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis

from dtq import workflows as wf
from dtq.errors import DtqError
from dtq.store.connection import is_cluster

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv

log = logging.getLogger("dtq.worker.flows")

MOVERS = "movers"  # the consumer group of every outbox
BATCH = 100
BLOCK_MS = 1000
AT_ONCE = 8  # readers making their non-blocking calls at once (a cluster: one per outbox)


class FlowMover:
    def __init__(self, env: WorkerEnv) -> None:
        self.env = env
        self._grouped: set[str] = set()
        self._calling = asyncio.Semaphore(AT_ONCE)

    def _outboxes(self) -> dict[str, str]:
        return {self.env.keys.queue(q).flowq: q for q in self.env.queues}

    async def _ensure_groups(self, streams: list[str]) -> None:
        for s in streams:
            if s in self._grouped:
                continue
            try:
                await self.env.redis.xgroup_create(s, MOVERS, id="0", mkstream=True)
            except aredis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._grouped.add(s)

    async def loop(self) -> None:
        """One blocking read over every outbox; on a cluster one reader per outbox."""
        streams = list(self._outboxes())
        await self._ensure_groups(streams)
        if not is_cluster(self.env.blocking):
            await self._read(streams)
            return
        try:
            async with asyncio.TaskGroup() as tg:  # one reader failing restarts them all
                for s in streams:
                    tg.create_task(self._read([s]))
        except ExceptionGroup as eg:  # the supervisor classifies one error (an outage: transient)
            raise eg.exceptions[0] from eg

    async def _read(self, streams: list[str]) -> None:
        env = self.env
        last_sweep = 0.0
        while not env.stopping:
            # Entries a dead mover left unacknowledged: taken over after the visibility timeout.
            now = time.monotonic()
            if now - last_sweep > max(1.0, env.settings.visibility_timeout_s / 2):
                last_sweep = now
                async with self._calling:
                    for stream in streams:
                        await self._take_over(stream)
            try:
                reply: Any = await env.blocking.xreadgroup(
                    MOVERS, env.worker_id, dict.fromkeys(streams, ">"), count=BATCH, block=BLOCK_MS
                )
            except aredis.ResponseError as exc:
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                    raise
                # An outbox was deleted (a flush, retention): which one the error does not say.
                self._grouped.difference_update(streams)
                async with self._calling:
                    await self._ensure_groups(streams)
                continue
            if reply:
                async with self._calling:
                    for stream, entries in reply:
                        await self._move_all(stream, entries)

    async def _take_over(self, stream: str) -> None:
        idle = int(self.env.settings.visibility_timeout_s * 1000)
        try:
            res: Any = await self.env.redis.xautoclaim(
                stream, MOVERS, self.env.worker_id, idle, "0-0", count=BATCH
            )
        except aredis.ResponseError as exc:
            if "NOGROUP" in str(exc):
                self._grouped.discard(stream)
                await self._ensure_groups([stream])
                return
            raise
        if res and res[1]:
            await self._move_all(stream, res[1])

    async def _move_all(self, stream: str, entries: list[Any]) -> None:
        for eid, fields in entries:
            if not fields:  # deleted meanwhile
                await self._done(stream, eid)
                continue
            try:
                await self.move(fields)
            except DtqError as exc:
                log.warning("workflow handover %s %s not moved: %s", stream, eid, exc)
                continue  # left pending: taken over again later
            await self._done(stream, eid)
            marker = wf.put_marker(self.env.keys, fields)
            if marker is not None:  # after the XDEL: a later move of the entry finds the marker
                await self.env.redis.expire(marker, self.env.settings.result_ttl_s)

    async def _done(self, stream: str, eid: str) -> None:
        pipe = self.env.redis.pipeline(transaction=False)
        pipe.xack(stream, MOVERS, eid)
        pipe.xdel(stream, eid)
        await pipe.execute()

    async def move(self, fields: dict[str, str]) -> None:
        """Move one handover (see the module's docstring)."""
        call = wf.handover_call(self.env.keys, self.env.settings, fields)
        if call is None:
            log.warning("unknown workflow handover %r dropped", fields.get("k"))
            return
        await self.env.scripts.run(call)
