"""The idle wake-up on a Redis Cluster, where one XREAD cannot span slots: one XREAD per queue
in parallel, the wait ending when any is served; a read still pending is kept for the next wait."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from dtq.aiotasks import cancel_until_done

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv

CLOSE_WAIT_S = 1.0


class ClusterWait:
    def __init__(self, env: WorkerEnv, block_ms: int, timeout_s: float) -> None:
        self.env = env
        self.block_ms, self.timeout_s = block_ms, timeout_s
        self._reads: dict[str, asyncio.Task[Any]] = {}

    async def wait(self, after: str, also: asyncio.Future[None] | None = None) -> None:
        """Until an entry above ``after`` is in any queue, a block ends, ``also`` is done (a
        capped queue's run ended) or the wait is interrupted; raises what a read raised."""
        env = self.env
        done: list[asyncio.Future[Any]] = [t for t in self._reads.values() if t.done()]
        if not done:
            for q in env.queues:
                if q not in self._reads:
                    self._reads[q] = asyncio.ensure_future(self._read(q, after))
            waits: list[asyncio.Future[Any]] = [*self._reads.values()]
            if also is not None:
                waits.append(also)
            finished, _ = await asyncio.wait(
                waits, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            done = [t for t in finished if t is not also]
        for q, t in list(self._reads.items()):
            if t in done:
                del self._reads[q]
        for f in done:
            if not f.cancelled() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]

    async def _read(self, queue: str, after: str) -> Any:
        streams = self.env.keys.queue(queue).streams
        return await self.env.blocking.xread(
            dict.fromkeys(streams, after), count=1, block=self.block_ms
        )

    def interrupt(self) -> None:
        """Shutdown: end every pending read now."""
        for t in self._reads.values():
            t.cancel()

    async def close(self) -> None:
        """Before the client closes: every read ended, a lost cancel given again."""
        await cancel_until_done(self._reads.values(), CLOSE_WAIT_S)
        self._reads.clear()
