"""The poll loop: claim up to the free slots, highest priority first; block while idle.

While idle it blocks in XREAD on every band with the claim pipelined behind it on the same
connection: Redis runs the claim the moment the XREAD is served, so a task enqueued to an idle
worker is started without a round trip through the worker in between.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError, ResponseError

from dtq import scripts as sc
from dtq.connection import is_cluster
from dtq_worker.clusterwait import ClusterWait
from dtq_worker.faults import Backoff, is_nogroup, is_transient

if TYPE_CHECKING:
    from dtq_worker.worker import Worker

log = logging.getLogger("dtq.consumer")
MAX_SEQ = 18446744073709551615
IDLE_BLOCK_MS = 1000
IDLE_WAIT_TIMEOUT_S = 2.0


class Consumer:
    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self.backoff = Backoff(log, "poll")
        self.more = False
        self.waiting = False  # blocked in wait_for_work: the queues were empty
        self._streams: list[str] | None = None  # every band of every queue, for the idle XREAD
        # The idle XREAD goes over a kept connection of the blocking client (no redis-py command
        # layer on the pickup path; its reply is not needed, only the wake-up).
        self._wake = sc.AsyncLane(worker.blocking)
        self._wake_conn: Any = None  # the lane's connection whose CLIENT ID is _wake_id
        self._wake_id: int | None = None
        # On a Redis Cluster the wake-up is one XREAD per queue instead (clusterwait.py).
        self._cluster = (
            ClusterWait(worker, IDLE_BLOCK_MS, IDLE_WAIT_TIMEOUT_S)
            if is_cluster(worker.blocking)
            else None
        )

    async def wait_slot(self, timeout: float) -> None:
        """Until a run ends (or shutdown starts), at most ``timeout`` seconds.

        No wrapper tasks (this runs once per claim cycle when every slot is busy).
        """
        await self.w.slots.changed.wait(timeout)

    async def loop(self) -> None:
        w = self.w
        woke: tuple[int, int, bool] | None = None  # the claim pipelined behind the idle XREAD
        while not w.stopping:
            if not w.healthy.is_set():
                woke = None
                await w.wait_or_stop(w.healthy.wait(), 1.0)
                continue
            if w.slots.unheld <= 0:
                woke = None
                await self.wait_slot(1.0)  # the drain's start wakes it too
                continue
            try:
                if woke is None:
                    claimed, now_ms, drained = await self.claim_once()
                else:
                    (claimed, now_ms, drained), woke = woke, None
                self.backoff.ok()
            except Exception as exc:
                if is_nogroup(exc):
                    await w.ensure_groups()
                    continue
                if not is_transient(exc):
                    raise
                w.metrics.redis_errors.labels("poll").inc()
                await w.wait_or_stop(asyncio.sleep(self.backoff.failed(exc)), None)
                continue
            if (claimed == 0 or drained) and not self.more and not w.stopping:
                # Nothing left to take (a claim that got fewer runs than it asked for emptied
                # every band): block at once rather than spend a round trip on an empty claim
                # (that claim would also delay the start of the runs just launched).
                if claimed:
                    # Let the runs just launched start before the XREAD is sent: sending it
                    # wakes Redis, which on a small machine competes for the CPU they need.
                    await asyncio.sleep(0)
                    if w.stopping:
                        break
                woke = await self.wait_for_work(now_ms)

    async def claim_once(self) -> tuple[int, int, bool]:
        """One claim pass over the queues in order.

        Returns (runs started, server ms, drained): drained is true when every queue was asked
        and each gave fewer runs than free slots, i.e. its bands held nothing more to start.
        """
        w = self.w
        total, now_ms = 0, 0
        drained = True
        self.more = False  # a claim stopped at its scan budget (limits parked many entries)
        for queue in w.queues:
            if w.recovery.active(queue):
                await w.recovery.wait(queue)  # its claims wait for it (recovery.py)
            free = w.slots.free(queue)
            if free <= 0 or w.stopping:
                drained = False
                continue
            t0 = time.perf_counter()
            call = self._claim_call(queue, free)
            batch = await self._claim(queue, free, partial(w.scripts.run, call))
            w.metrics.claim_latency.observe(time.perf_counter() - t0)
            now_ms = batch.now_ms
            if batch.missing_streams:
                drained = False
                continue
            total += len(batch.runs)
            if len(batch.runs) >= free:
                drained = False
        return total, now_ms, drained

    async def _claim(
        self, queue: str, free: int, send: Callable[[], Awaitable[Any]]
    ) -> sc.ClaimBatch:
        """A claim of ``free`` slots of ``queue``, sent by ``send()`` (its reply): the slots are
        held until the reply, then its runs are launched (or the groups recreated, when its
        streams were missing)."""
        w = self.w
        sent = time.monotonic()
        w.slots.reserve(queue, free)
        try:
            raw = await send()
        except Exception as exc:
            if is_transient(exc):  # it may have run, its reply lost (the idle pair's case)
                w.recovery.request(queue)
            raise
        finally:
            w.slots.unreserve(queue, free)
        batch = sc.parse_claim(queue, raw)
        if batch.missing_streams:
            await w.ensure_groups()
        else:
            self.took(batch, sent)
        return batch

    def _claim_call(self, queue: str, free: int) -> sc.Call:
        w, s = self.w, self.w.settings
        return sc.claim_call(
            w.keys.queue(queue), w.worker_id, free, s.events_maxlen, s.result_ttl_s, s.fair
        )

    def took(self, batch: sc.ClaimBatch, sent: float) -> None:
        """Start the runs of a claim (this loop's, or the one an outcome write made) that was
        sent at ``sent`` (monotonic: the runs' leases count from no later than that)."""
        w = self.w
        if batch.absorbed:
            w.metrics.absorbed.inc(batch.absorbed)
        self.more = self.more or batch.more
        if batch.runs:
            w.launch_batch(batch.runs, sent)

    async def wait_for_work(self, now_ms: int) -> tuple[int, int, bool] | None:
        """Block until an entry newer than ``now_ms`` lands in any band (or 1 s passes); return
        what the claim pipelined behind the wait took, as claim_once does, or None.

        XREAD (not XREADGROUP) only watches: the claim script does the taking, sent in the same
        write for the first queue's free slots (held meanwhile, so a drain waits for it; the stop
        unblocks the XREAD at once, see interrupt()). Entries added after the last claim have
        ids above ``now_ms - 1``, so none is missed between the two calls.
        """
        w = self.w
        after = f"{max(0, now_ms - 1)}-{MAX_SEQ}"
        if self._cluster is not None:
            await self._wait_cluster(self._cluster, after)
            return None
        if self._streams is None:
            self._streams = [s for q in w.queues for s in w.keys.queue(q).streams]
        streams = self._streams
        args = (
            "XREAD", "COUNT", 1, "BLOCK", IDLE_BLOCK_MS, "STREAMS", *streams,
            *([after] * len(streams)),
        )  # fmt: skip
        queue = w.queues[0]
        free = w.slots.free(queue)
        self.waiting = True
        try:
            # Awaited directly (no wrapper task per wake-up: this is the pickup path). The
            # block bounds how long it waits; the timeout bounds a hung connection.
            if free <= 0 or w.stopping or w.recovery.active(queue):
                async with asyncio.timeout(IDLE_WAIT_TIMEOUT_S):
                    await self._wake.call(args)
                return None
            return await self._wake_and_claim(args, queue, free)
        except TimeoutError:
            return None
        except Exception as exc:
            if not is_transient(exc):
                raise
            await w.wait_or_stop(asyncio.sleep(self.backoff.failed(exc)), None)
            return None
        finally:
            self.waiting = False

    async def _wait_cluster(self, cw: ClusterWait, after: str) -> None:
        self.waiting = True
        try:
            if not self.w.stopping:
                await cw.wait(after)
        except Exception as exc:
            if not is_transient(exc):
                raise
            await self.w.wait_or_stop(asyncio.sleep(self.backoff.failed(exc)), None)
        finally:
            self.waiting = False

    async def _wake_and_claim(
        self, xread: tuple[Any, ...], queue: str, free: int
    ) -> tuple[int, int, bool] | None:
        w = self.w
        async with asyncio.timeout(IDLE_WAIT_TIMEOUT_S):
            conn = await self._wake.connection()
            if conn is not self._wake_conn:  # a new connection: learn its id for CLIENT UNBLOCK
                self._wake_conn, self._wake_id = None, None
                self._wake_id = int(await self._wake.call(("CLIENT", "ID")))
                self._wake_conn = conn
        claim = w.scripts.evalsha(self._claim_call(queue, free))
        if w.stopping or w.recovery.active(queue):
            # The stop came during the awaits above (no claim now: the loop ends), or a recovery
            # of the queue is pending (the loop's next claim waits for it).
            return None
        # From here to the write (call_pair) nothing yields: a stop that comes later finds
        # ``waiting`` set and the id known, and unblocks the XREAD.

        async def send() -> Any:
            # The pair's own deadline: replies that came while this process was frozen past
            # it are still read (call_pair), so the runs the claim took are not lost.
            _, raw = await self._wake.call_pair(xread, claim, IDLE_WAIT_TIMEOUT_S)
            if isinstance(raw, ResponseError):
                raise raw
            return raw

        self.more = False
        try:
            batch = await self._claim(queue, free, send)
        except NoScriptError:
            return None  # it did not run; claim_once loads the script
        if batch.missing_streams:
            return None
        # Drained when the only queue had fewer runs than free slots (as claim_once says).
        drained = len(w.queues) == 1 and len(batch.runs) < free
        return len(batch.runs), batch.now_ms, drained

    def interrupt(self) -> None:
        """Shutdown: end the idle XREAD now (CLIENT UNBLOCK), so the claim behind it runs and
        its reply comes at once instead of after the block."""
        if self._cluster is not None:
            self._cluster.interrupt()
        if self.waiting and self._wake_id is not None:
            self.w.spawn(self._unblock(self._wake_id))

    async def _unblock(self, client_id: int) -> None:
        try:
            await self.w.redis.client_unblock(client_id)
        except Exception as exc:  # the block ends by itself within IDLE_BLOCK_MS
            log.debug("could not unblock the idle wait: %s", exc)
