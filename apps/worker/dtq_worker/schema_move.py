"""Move the keyspace from schema 1 to 2 once no worker of an older version is alive
(dtq.schema says what the versions mean).

Every worker of this version takes one step after each heartbeat while the keyspace is not at
2 (then it stops looking: one ``GET`` per beat until the move is done):

1. At ``"1"``, when every live worker (its hash ``P:worker:<id>`` there, found by a SCAN: an id
   claim makes it before the first beat lists the worker in ``P:workers``) carries the schema
   field this version's heartbeat and id claim write, it sets ``"1>2"`` (swap.lua: only while
   the key holds ``"1"``). From then a worker of an older version refuses to start, as it
   refuses any version but its own.
2. At ``"1>2"``, once this worker has seen it for :func:`settle_s`, it looks again: a worker of
   an older version that read ``"1"`` just before step 1 has made its hash by then (its id
   claim follows its version check after one more round trip). None found: ``"2"``, and
   clients write records without their defaults from their next registration on. One found:
   back to ``"1"``, and the move waits for it to go.

Known limit: a worker of an older version frozen (SIGSTOP, a paused VM) for longer than its
heartbeat TTL is not seen (its hash expired); resumed after the move, it would meet records it
cannot read. Stop old workers during an upgrade, do not pause them (docs/operations.md,
"Upgrading a fleet").
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from dtq import schema
from dtq import scripts as sc
from dtq.cluster import scan_step

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv

log = logging.getLogger("dtq.worker.schema")


def settle_s(heartbeat_interval_s: float) -> float:
    """How long ``"1>2"`` stands before the second look: two heartbeats and a margin."""
    return 2 * heartbeat_interval_s + 0.5


class SchemaMove:
    def __init__(self, env: WorkerEnv) -> None:
        self.env = env
        self.done = False
        self.moving_seen: float | None = None  # when this worker first saw "1>2"

    async def step(self) -> None:
        """One step of the move (see the module's text); nothing once the keyspace is at 2."""
        if self.done:
            return
        env = self.env
        found = await env.redis.get(env.keys.schema)
        if found == schema.CURRENT:
            self.done = True
            return
        if found == schema.LEGACY:
            self.moving_seen = None
            old = await self.older_workers()
            if not old and await self._swap(schema.LEGACY, schema.MOVING):
                log.info("no worker of an older dtq is alive: moving the keyspace to schema 2")
                self.moving_seen = time.monotonic()
            return
        if found != schema.MOVING:
            return  # none (a flushed keyspace: the next process sets it) or unknown
        now = time.monotonic()
        if self.moving_seen is None:
            self.moving_seen = now
        if now - self.moving_seen < settle_s(env.settings.heartbeat_interval_s):
            return
        old = await self.older_workers()
        if not old:
            if await self._swap(schema.MOVING, schema.CURRENT):
                log.info("keyspace moved to schema 2: records leave out their defaults")
            self.done = True
        else:
            log.warning(
                "a worker of an older dtq started during the move to schema 2 (%s): the "
                "keyspace stays at schema 1 while it lives", ", ".join(old[:5]),
            )  # fmt: skip
            await self._swap(schema.MOVING, schema.LEGACY)
            self.moving_seen = None

    async def older_workers(self) -> list[str]:
        """Ids of the live workers whose heartbeat hash lacks this version's schema field."""
        env = self.env
        head = env.keys.worker("")
        seen: set[str] = set()
        cursor = "0"
        while True:
            cursor, found = await scan_step(env.redis, cursor, head + "*", 1000)
            seen.update(k[len(head) :] for k in found)
            if cursor == "0":
                break
        ids = sorted(seen)
        if not ids:
            return []
        async with env.redis.pipeline(transaction=False) as pipe:
            for wid in ids:
                pipe.hmget(env.keys.worker(wid), ["owner", "last_heartbeat", schema.WORKER_FIELD])
            rows = await pipe.execute()
        # A hash with none of the three expired since the SCAN (its worker died or stopped).
        return [
            wid for wid, (owner, beat, mark) in zip(ids, rows, strict=True)
            if (owner is not None or beat is not None) and mark is None
        ]  # fmt: skip

    async def _swap(self, expected: str, new: str) -> bool:
        call = sc.swap_call(self.env.keys.schema, expected, new)
        return sc.parse_swap(await self.env.scripts.run(call)) is sc.Swapped.SWAPPED
