"""The flow mover: moves workflow handovers between slots (docs/workflows.md, "Cluster").

A workflow's join runs in the script that stores a step's outcome when the flow's state lives
in the same slot. When it does not (a step on another queue than the flow's home), that script
writes the handover to its own queue's outbox stream ``P:{q}:flowq``, in the same atomic step
as the outcome; this loop moves it on, for every queue the worker consumes:

* ``note`` (a step ended): ``flow_apply.lua`` at the flow's home; counted once per step.
* ``put`` (a step released, or a flow's first step on another queue): ``flow_put.lua`` on the
  step's queue; creates its record only if neither it nor the step's put marker exists (its
  tid was fixed at the enqueue). The marker has no TTL until the entry is acknowledged: the
  record expires after DTQ_RESULT_TTL_S, the entry may be moved again later than that.

Both are idempotent by (flow, step), so an entry moved twice (a mover that died between the
move and its acknowledgement: another worker claims the entry after the visibility timeout)
changes nothing the second time: exactly once by construction. An entry is acknowledged and
deleted only after its move succeeded.
"""

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
# Readers doing their calls (a take-over sweep, moving what they read) at once, on the worker's
# calls client. On a cluster there is a reader per outbox: a worker of 300 queues had all 300
# sweep together at its start, about 100 calls per node, that node's whole pool, so the other
# loops' calls failed meanwhile ("Too many connections"). Their blocking reads are not counted:
# they are on the blocking client, sized for them.
AT_ONCE = 8


class FlowMover:
    def __init__(self, env: WorkerEnv) -> None:
        self.env = env
        self.moved = 0
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
        """On one server, one blocking read over every outbox: one connection, whatever the
        number of queues (a reader per outbox held one each, and past 98 queues the blocking
        client's 100 ran out). On a cluster each outbox is in its own slot, so one blocking
        XREADGROUP cannot name two of them: one reader per outbox, side by side (the worker
        sizes its blocking client's pools for them)."""
        streams = list(self._outboxes())
        await self._ensure_groups(streams)
        if not is_cluster(self.env.blocking):
            await self._read(streams)
            return
        try:
            async with asyncio.TaskGroup() as tg:  # one reader failing restarts them all
                for s in streams:
                    tg.create_task(self._read([s]))
        except ExceptionGroup as eg:
            # The supervisor classifies one error: a Redis outage (every reader's connection
            # closed) is a transient warning, not a crash with a group's traceback.
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
                    MOVERS,
                    env.worker_id,
                    dict.fromkeys(streams, ">"),
                    count=BATCH,
                    block=BLOCK_MS,
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
            if marker is not None:
                # After the XDEL (another slot, so another call): while the entry exists, a
                # move of it may come at any time later and must find the marker.
                await self.env.redis.expire(marker, self.env.settings.result_ttl_s)
            self.moved += 1

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
