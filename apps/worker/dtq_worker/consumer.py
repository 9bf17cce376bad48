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
from dtq.store import partitions, transport
from dtq.store.connection import is_cluster
from dtq_worker.clusterwait import ClusterWait
from dtq_worker.faults import Backoff, is_nogroup, is_transient

if TYPE_CHECKING:
    from dtq_worker.env import WorkerEnv
    from dtq_worker.recovery import Recovery
    from dtq_worker.runs import Runs

log = logging.getLogger("dtq.consumer")
MAX_SEQ = 18446744073709551615
IDLE_BLOCK_MS = 1000
IDLE_WAIT_TIMEOUT_S = 2.0


class Consumer:
    def __init__(
        self,
        env: WorkerEnv,
        runs: Runs,
        recovery: Recovery,
        ensure_groups: Callable[[], Awaitable[None]],
    ) -> None:
        """``runs``: takes every claim's reply (Runs.take); ``ensure_groups()``: recreate the
        streams and groups found missing."""
        self.env = env
        self.runs = runs
        self.slots = runs.slots
        self.recovery = recovery
        self._ensure_groups = ensure_groups
        self.backoff = Backoff(log, "poll")
        self._turn = 0  # claim passes so far: which partition of a queue comes first
        self._streams: list[str] | None = None  # every band of every queue, for the idle XREAD
        # The idle XREAD goes over a kept connection of the blocking client (no redis-py command
        # layer on the pickup path; its reply is not needed, only the wake-up).
        self._wake = transport.AsyncLane(env.blocking)
        self._wake_conn: Any = None  # the lane's connection whose CLIENT ID is _wake_id
        self._wake_id: int | None = None
        # On a Redis Cluster the wake-up is one XREAD per queue instead (clusterwait.py).
        self._cluster = (
            ClusterWait(env, IDLE_BLOCK_MS, IDLE_WAIT_TIMEOUT_S)
            if is_cluster(env.blocking)
            else None
        )

    async def wait_slot(self, timeout: float) -> None:
        """Until a run ends (or shutdown starts), at most ``timeout`` seconds.

        No wrapper tasks (this runs once per claim cycle when every slot is busy).
        """
        await self.slots.changed.wait(timeout)

    async def loop(self) -> None:
        env = self.env
        woke: tuple[int, int, bool] | None = None  # the claim pipelined behind the idle XREAD
        while not env.stopping:
            if not env.healthy.is_set():
                woke = None
                await env.wait_or_stop(env.healthy.wait(), 1.0)
                continue
            if env.evicting is not None:  # Redis may evict what it would claim: wait for the fix
                woke = None
                await env.sleep(min(env.settings.heartbeat_interval_s, 1.0))
                continue
            if self.slots.unheld <= 0:
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
                    await self._ensure_groups()
                    continue
                if not is_transient(exc):
                    raise
                env.metrics.redis_errors.labels("poll").inc()
                await env.wait_or_stop(asyncio.sleep(self.backoff.failed(exc)), None)
                continue
            if (claimed == 0 or drained) and not self.runs.more and not env.stopping:
                # Nothing left to take (a claim that got fewer runs than it asked for emptied
                # every band): block at once rather than spend a round trip on an empty claim
                # (that claim would also delay the start of the runs just launched).
                if claimed:
                    # Let the runs just launched start before the XREAD is sent: sending it
                    # wakes Redis, which on a small machine competes for the CPU they need.
                    await asyncio.sleep(0)
                    if env.stopping:
                        break
                woke = await self.wait_for_work(now_ms)

    def _order(self) -> list[str]:
        """The queues in claim order: a partitioned queue's partitions take turns, the turn
        moving on with each claim sent (_next_turn), so successive claims start at successive
        partitions whatever the waits and empty passes between them."""
        env = self.env
        if not env.partitions_of:
            return env.queues
        return partitions.poll_order(env.queues, self._turn)

    def _next_turn(self) -> None:
        self._turn += 1

    async def claim_once(self) -> tuple[int, int, bool]:
        """One claim pass over the queues in order.

        Returns (runs started, server ms, drained): drained is true when every queue was asked
        and each gave fewer runs than free slots, i.e. its bands held nothing more to start.
        """
        env = self.env
        total, now_ms = 0, 0
        drained = True
        self.runs.more = False  # (set by a claim that stopped at its scan budget: Runs.take)
        order, sent = self._order(), False
        # Partitioned queues whose claim in this pass got all the slots it asked for: a slot
        # that frees later in the pass (while it waits for a recovery or a claim) is the next
        # pass's, which starts at the next partition: so each claim starts at the next one.
        full: set[str] = set()
        for queue in order:
            if full and partitions.logical(queue) in full:
                drained = False
                continue
            if self.recovery.active(queue):
                await self.recovery.wait(queue)  # its claims wait for it (recovery.py)
            free = self.slots.free(queue)
            if free <= 0 or env.stopping:
                drained = False
                continue
            t0 = time.perf_counter()
            call = self._claim_call(queue, free)
            if not sent:
                sent = True
                self._next_turn()
            batch = await self._claim(queue, free, partial(env.scripts.run, call))
            env.metrics.claim_latency.observe(time.perf_counter() - t0)
            now_ms = batch.now_ms
            if batch.missing_streams:
                drained = False
                continue
            total += len(batch.runs)
            if len(batch.runs) >= free:
                drained = False
                if queue in env.partitions_of:
                    full.add(partitions.logical(queue))
        return total, now_ms, drained

    async def _claim(
        self, queue: str, free: int, send: Callable[[], Awaitable[Any]]
    ) -> sc.ClaimBatch:
        """A claim of ``free`` slots of ``queue``, sent by ``send()`` (its reply): the slots are
        held until Runs.take launches its runs (or the groups are recreated, when its streams
        were missing)."""
        sent = time.monotonic()
        self.slots.reserve(queue, free)
        try:
            batch = sc.parse_claim(queue, await send())
        except BaseException as exc:
            self.slots.unreserve(queue, free)
            if isinstance(exc, Exception) and is_transient(exc):
                self.recovery.request(queue)  # it may have run, its reply lost (the idle pair)
            raise
        self.runs.take(queue, batch, sent, free)
        if batch.missing_streams:
            await self._ensure_groups()
        return batch

    def _claim_call(self, queue: str, free: int) -> sc.Call:
        env, s = self.env, self.env.settings
        return sc.claim_call(
            env.keys.queue(queue), env.worker_id, free, s.events_maxlen, s.result_ttl_s, s.fair,
            s.group_cap(queue),
        )  # fmt: skip

    async def wait_for_work(self, now_ms: int) -> tuple[int, int, bool] | None:
        """Block until an entry newer than ``now_ms`` lands in any band (or 1 s passes); return
        what the claim pipelined behind the wait took, as claim_once does, or None.

        XREAD (not XREADGROUP) only watches: the claim script does the taking, sent in the same
        write for the first queue's free slots (held meanwhile, so a drain waits for it; the stop
        unblocks the XREAD at once, see interrupt()). Entries added after the last claim have
        ids above ``now_ms - 1``, so none is missed between the two calls.
        """
        env = self.env
        order = self._order()
        capped = [q for q in order if self.slots.free(q) <= 0]
        if len(capped) == len(order):
            # Every queue is at its cap (the loop waits elsewhere while no slot is free): new
            # entries cannot be taken before a run ends, so wait for that, not for entries.
            await self.wait_slot(IDLE_BLOCK_MS / 1000)
            return None
        after = f"{max(0, now_ms - 1)}-{MAX_SEQ}"
        if self._cluster is not None:
            await self._wait_cluster(self._cluster, after, capped)
            return None
        if self._streams is None:
            self._streams = [s for q in env.queues for s in env.keys.queue(q).streams]
        streams = self._streams
        args = (
            "XREAD", "COUNT", 1, "BLOCK", IDLE_BLOCK_MS, "STREAMS", *streams,
            *([after] * len(streams)),
        )  # fmt: skip
        queue = next(q for q in order if q not in capped)  # the claim behind the wait: its turn
        env.idle = True
        try:
            # Awaited directly (no wrapper task per wake-up: this is the pickup path). The
            # block bounds how long it waits; the timeout bounds a hung connection.
            if env.stopping or self.recovery.active(queue):
                async with asyncio.timeout(IDLE_WAIT_TIMEOUT_S):
                    await self._wake.call(args)
                return None
            return await self._wake_and_claim(args, queue, self.slots.free(queue), capped)
        except TimeoutError:
            return None
        except Exception as exc:
            if not is_transient(exc):
                raise
            await env.wait_or_stop(asyncio.sleep(self.backoff.failed(exc)), None)
            return None
        finally:
            env.idle = False

    async def _wait_cluster(self, cw: ClusterWait, after: str, capped: list[str]) -> None:
        self.env.idle = True
        freed = asyncio.ensure_future(self._slot_for(capped)) if capped else None
        try:
            if not self.env.stopping:
                await cw.wait(after, freed)
        except Exception as exc:
            if not is_transient(exc):
                raise
            await self.env.wait_or_stop(asyncio.sleep(self.backoff.failed(exc)), None)
        finally:
            self.env.idle = False
            if freed is not None:
                freed.cancel()

    def _freed(self, capped: list[str]) -> bool:
        """Whether a queue of ``capped`` (at its cap when the wait began) may claim again."""
        return any(self.slots.free(q) > 0 for q in capped)

    async def _slot_for(self, capped: list[str]) -> None:
        """Until a queue of ``capped`` may claim again: a run that ends ends the idle wait too,
        for the backlog its cap held back."""
        while not self._freed(capped):
            await self.slots.changed.wait()

    async def _unblock_when_freed(self, capped: list[str], client_id: int) -> None:
        await self._slot_for(capped)
        await self._unblock(client_id)

    async def _wake_and_claim(
        self, xread: tuple[Any, ...], queue: str, free: int, capped: list[str]
    ) -> tuple[int, int, bool] | None:
        env = self.env
        async with asyncio.timeout(IDLE_WAIT_TIMEOUT_S):
            conn = await self._wake.connection()
            if conn is not self._wake_conn:  # a new connection: learn its id for CLIENT UNBLOCK
                self._wake_conn, self._wake_id = None, None
                self._wake_id = int(await self._wake.call(("CLIENT", "ID")))
                self._wake_conn = conn
        claim = env.scripts.evalsha(self._claim_call(queue, free))
        if env.stopping or self.recovery.active(queue) or self._freed(capped):
            # The stop came during the awaits above (no claim now: the loop ends), a recovery
            # of the queue is pending (the loop's next claim waits for it), or a capped queue's
            # run ended meanwhile (the loop's next claim takes its backlog).
            return None
        # From here to the write (call_pair) nothing yields: a stop that comes later finds
        # ``env.idle`` set and the id known, and unblocks the XREAD.

        async def send() -> Any:
            # The pair's own deadline: replies that came while this process was frozen past
            # it are still read (call_pair), so the runs the claim took are not lost.
            _, raw = await self._wake.call_pair(xread, claim, IDLE_WAIT_TIMEOUT_S)
            if isinstance(raw, ResponseError):
                raise raw
            return raw

        self.runs.more = False
        self._next_turn()
        assert self._wake_id is not None  # (learnt above)
        freed = (
            asyncio.ensure_future(self._unblock_when_freed(capped, self._wake_id))
            if capped
            else None
        )
        try:
            batch = await self._claim(queue, free, send)
        except NoScriptError:
            return None  # it did not run; claim_once loads the script
        finally:
            if freed is not None:
                freed.cancel()
        if batch.missing_streams or self._freed(capped):
            return None  # (a capped queue may claim again: claim_once takes its backlog)
        # Drained when the only queue had fewer runs than free slots (as claim_once says).
        drained = len(env.queues) == 1 and len(batch.runs) < free
        return len(batch.runs), batch.now_ms, drained

    def interrupt(self) -> None:
        """Shutdown: end the idle XREAD now (CLIENT UNBLOCK), so the claim behind it runs and
        its reply comes at once instead of after the block."""
        if self._cluster is not None:
            self._cluster.interrupt()
        if self.env.idle and self._wake_id is not None:
            self.env.spawn(self._unblock(self._wake_id))

    async def close(self) -> None:
        """After the loop has ended: the cluster's idle reads end too (clusterwait.py)."""
        if self._cluster is not None:
            await self._cluster.close()

    async def _unblock(self, client_id: int) -> None:
        try:
            await self.env.redis.client_unblock(client_id)
        except Exception as exc:  # the block ends by itself within IDLE_BLOCK_MS
            log.debug("could not unblock the idle wait: %s", exc)
