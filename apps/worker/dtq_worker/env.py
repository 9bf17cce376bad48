"""What every loop of a worker reads (identity, settings, Redis, metrics, its life) and nothing
more: no run, slot or claim, so a loop can be tested with a WorkerEnv and fakes of those."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Coroutine
from typing import Any

from dtq import scripts as sc
from dtq.settings import Settings
from dtq.store import partitions
from dtq.store.keys import Keys
from dtq_worker.metrics import WorkerMetrics

log = logging.getLogger("dtq.worker")
PROGRESS_WRITES_AT_ONCE = 16  # (WorkerEnv.progress_writes)


class RedisClock:
    """The Redis server's clock, read through this process's monotonic one, for times others
    compare (heartbeats). The offset comes from TIME replies (one every beat)."""

    def __init__(self) -> None:
        self.offset_ms: int | None = None  # Redis ms minus monotonic ms; None before a reply

    def set(self, reply: tuple[int, int]) -> None:
        """Take the offset from a TIME reply (seconds, microseconds)."""
        sec, usec = reply
        self.offset_ms = int(sec) * 1000 + int(usec) // 1000 - int(time.monotonic() * 1000)

    def now_ms(self) -> int:
        return int(time.monotonic() * 1000) + (self.offset_ms or 0)


class WorkerEnv:
    def __init__(
        self,
        settings: Settings,
        keys: Keys,
        redis: Any,
        blocking: Any,
        scripts: sc.AsyncScripts,
        metrics: WorkerMetrics,
    ) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id
        # A partitioned queue is consumed as all its partitions (dtq.store.partitions).
        self.queues = partitions.expand(settings.queues, settings.queue_partitions)
        self.partitions_of = partitions.siblings(self.queues)
        self.keys = keys
        self.redis = redis  # commands and scripts
        self.blocking = blocking  # blocking reads only (they never hold up the others)
        self.scripts = scripts
        self.metrics = metrics
        self.clock = RedisClock()
        self.healthy = asyncio.Event()  # the last heartbeat reached Redis
        self.stop_event = asyncio.Event()  # shutdown began
        self.finished_event = asyncio.Event()  # shutdown is over (the heartbeat's last beat)
        self.self_stopping = False  # stopping because Redis stayed away (exit 1, no drain)
        # Redis's maxmemory-policy while it may evict waiting tasks: no claims meanwhile.
        self.evicting: str | None = None
        self.idle = False  # the poll loop waits for new entries: outcome writes claim no refill
        # Bounds the runs' progress writes in flight (they must not take the client's pool).
        self.progress_writes = asyncio.Semaphore(PROGRESS_WRITES_AT_ONCE)
        self._bg: set[asyncio.Task[Any]] = set()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    @property
    def finished(self) -> bool:
        return self.finished_event.is_set()

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking early when shutdown starts."""
        await self.wait_or_stop(asyncio.sleep(seconds), None)

    async def sleep_until_finished(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.finished_event.wait(), seconds)

    async def wait_or_stop(self, aw: Awaitable[Any], timeout: float | None) -> None:
        """Await ``aw`` until it ends, shutdown starts, or ``timeout`` passes."""
        main = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.stop_event.wait())
        try:
            await asyncio.wait({main, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (main, stop):
                if not t.done():
                    t.cancel()
            if main.done() and not main.cancelled() and main.exception() is not None:
                raise main.exception()  # type: ignore[misc]

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background (cancelled when the worker closes)."""
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        return t

    def cancel_background(self) -> None:
        for t in list(self._bg):
            t.cancel()

    def emit_event(self, etype: str, detail: str = "") -> None:
        """A worker event (started, claim lost...) on the worker events stream; best effort."""
        self.spawn(self.write_event(etype, detail))

    async def write_event(self, etype: str, detail: str = "") -> None:
        try:
            ts = int(time.time() * 1000)
            fields = {"type": etype, "worker": self.worker_id, "detail": detail, "ts": ts}
            await self.redis.xadd(self.keys.worker_events, fields, maxlen=1000, approximate=True)
        except Exception as exc:
            log.debug("worker event %s not written: %s", etype, exc)
