"""The poll loop: claim up to the free slots, highest priority first; block while idle."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from dtq import scripts as sc
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

    async def wait_slot(self, timeout: float) -> None:
        """Until a run ends (or shutdown starts), at most ``timeout`` seconds.

        No wrapper tasks (this runs once per claim cycle when every slot is busy).
        """
        ev = self.w.slot_freed
        ev.clear()
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
        except TimeoutError:
            pass

    async def loop(self) -> None:
        w = self.w
        while not w.stopping:
            if not w.healthy.is_set():
                await w.wait_or_stop(w.healthy.wait(), 1.0)
                continue
            if w.unheld_slots <= 0:
                await self.wait_slot(1.0)  # shutdown sets slot_freed too
                continue
            try:
                claimed, now_ms, drained = await self.claim_once()
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
                await self.wait_for_work(now_ms)

    async def claim_once(self) -> tuple[int, int, bool]:
        """One claim pass over the queues in order.

        Returns (runs started, server ms, drained): drained is true when every queue was asked
        and each gave fewer runs than free slots, i.e. its bands held nothing more to start.
        """
        w = self.w
        s = w.settings
        total, now_ms = 0, 0
        drained = True
        self.more = False  # a claim stopped at its scan budget (limits parked many entries)
        for queue in w.queues:
            free = w.free_slots(queue)
            if free <= 0 or w.stopping:
                drained = False
                continue
            t0 = time.perf_counter()
            sent = time.monotonic()
            w.reserve(queue, free)
            try:
                raw = await w.scripts.run(
                    sc.claim_call(
                        w.keys.queue(queue), w.worker_id, free, s.events_maxlen, s.result_ttl_s,
                        s.fair,
                    )
                )  # fmt: skip
            finally:
                w.reserve(queue, -free)
            w.metrics.claim_latency.observe(time.perf_counter() - t0)
            batch = sc.parse_claim(queue, raw)
            now_ms = batch.now_ms
            if batch.missing_streams:
                await w.ensure_groups()
                drained = False
                continue
            self.took(batch, sent)
            total += len(batch.runs)
            if len(batch.runs) >= free:
                drained = False
        return total, now_ms, drained

    def took(self, batch: sc.ClaimBatch, sent: float) -> None:
        """Start the runs of a claim (this loop's, or the one an outcome write made) that was
        sent at ``sent`` (monotonic: the runs' leases count from no later than that)."""
        w = self.w
        if batch.absorbed:
            w.metrics.absorbed.inc(batch.absorbed)
        self.more = self.more or batch.more
        for c in batch.runs:
            w.launch(c, sent)

    async def wait_for_work(self, now_ms: int) -> None:
        """Block until an entry newer than ``now_ms`` lands in any band (or 1 s passes).

        XREAD (not XREADGROUP) only watches: the claim script does the taking. Entries added
        after the claim have ids above ``now_ms - 1``, so none is missed between the two calls.
        """
        w = self.w
        after = f"{max(0, now_ms - 1)}-{MAX_SEQ}"
        if self._streams is None:
            self._streams = [s for q in w.queues for s in w.keys.queue(q).streams]
        streams = self._streams
        args = (
            "XREAD", "COUNT", 1, "BLOCK", IDLE_BLOCK_MS, "STREAMS", *streams,
            *([after] * len(streams)),
        )  # fmt: skip
        self.waiting = True
        try:
            # Awaited directly (no wrapper task per wake-up: this is the pickup path). The
            # block bounds how long shutdown leaves it waiting (the loop is then cancelled);
            # the timeout bounds a hung connection.
            async with asyncio.timeout(IDLE_WAIT_TIMEOUT_S):
                await self._wake.call(args)
        except TimeoutError:
            return
        except Exception as exc:
            if not is_transient(exc):
                raise
            await w.wait_or_stop(asyncio.sleep(self.backoff.failed(exc)), None)
        finally:
            self.waiting = False
