"""The poll loop: claim up to the free slots, highest priority first; block while idle
(docs/design.md, "The worker", poll)."""

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
        self._again = False  # the next pass is sent at once, not behind the idle wait
        # Every band of every queue, for the idle XREAD.
        self._streams = [s for q in env.queues for s in env.keys.queue(q).streams]
        self._wake = transport.AsyncLane(env.blocking)  # the idle XREAD's kept connection
        self._wake_conn: Any = None  # the lane's connection whose CLIENT ID is _wake_id
        self._wake_id: int | None = None
        self._cluster = (
            ClusterWait(env, IDLE_BLOCK_MS, IDLE_WAIT_TIMEOUT_S)
            if is_cluster(env.blocking)
            else None
        )

    async def loop(self) -> None:
        env = self.env
        idle, now_ms = False, 0  # idle: the last pass left nothing, the next one waits first
        while not env.stopping:
            wait_first, idle = idle, False
            if not env.healthy.is_set():
                await env.wait_or_stop(env.healthy.wait(), 1.0)
                continue
            if env.evicting is not None:  # Redis may evict what it would claim
                await env.sleep(min(env.settings.heartbeat_interval_s, 1.0))
                continue
            if self.slots.unheld <= 0:
                await self.slots.changed.wait(1.0)  # a run ends, or the drain starts
                continue
            try:
                claimed, now_ms, drained = await self.claim_once(now_ms if wait_first else None)
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
            # Nothing left to take: the next pass waits first rather than send an empty claim.
            idle = (claimed == 0 or drained) and not (self.runs.more or self._again or env.stopping)
            if idle and claimed:
                await asyncio.sleep(0)  # the runs just launched start before the XREAD wakes Redis

    async def claim_once(self, idle_ms: int | None = None) -> tuple[int, int, bool]:
        """One claim pass over the queues in order; ``idle_ms``: the last pass, at that server
        time, left nothing, so this one waits first (docs/design.md, "The worker", poll).
        Returns (runs started, server ms, drained: every queue gave fewer runs than asked)."""
        env = self.env
        total, now_ms, drained = 0, 0, True
        # (runs.more: set by a claim that stopped at its scan budget, Runs.take)
        self.runs.more = self._again = False
        # A partitioned queue's partitions take turns, moving on with each pass that claims.
        turn = self._turn
        order = partitions.poll_order(env.queues, turn) if env.partitions_of else env.queues
        after, capped = (None, []) if idle_ms is None else await self._idle_wait(idle_ms, order)
        # Partitioned queues whose claim got all it asked for: a slot freed later in the pass is
        # the next pass's, which starts at the next partition.
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
            direct = partial(env.scripts.run, call)
            send: Callable[[], Awaitable[Any]] = direct
            if after is not None:  # the pass's first claim: behind the idle XREAD
                pair, after = await self._behind_xread(after, call, capped), None
                if env.stopping or self.recovery.active(queue):  # came while the lane was readied
                    drained = False
                    continue
                if self._freed(capped):
                    self._again = True  # a capped queue may claim: no wait, the next pass
                else:
                    send = pair
            self._turn = turn + 1
            try:
                batch = await self._claim(queue, free, send)
            except NoScriptError:  # the pair's claim did not run: sent the usual way (loads it)
                batch = await self._claim(queue, free, direct)
            if send is direct:
                env.metrics.claim_latency.observe(time.perf_counter() - t0)
            elif self._freed(capped):
                self._again = True  # (a run of a capped queue ended the wait)
            now_ms = batch.now_ms
            if batch.missing_streams:
                drained = False
                self._again = True
                continue
            total += len(batch.runs)
            if len(batch.runs) >= free:
                drained = False
                if queue in env.partitions_of:
                    full.add(partitions.logical(queue))
        return total, now_ms, drained

    async def _idle_wait(self, idle_ms: int, order: list[str]) -> tuple[str | None, list[str]]:
        """An idle pass's wait, and the queues at their cap as it began: the XREAD's cursor when
        the first claim rides behind it (one server), else None (the wait is over)."""
        after = f"{max(0, idle_ms - 1)}-{MAX_SEQ}"  # entries added after the last pass's claim
        capped = [q for q in order if self.slots.free(q) <= 0]
        if len(capped) == len(order):  # nothing can be taken before a run ends
            await self.slots.changed.wait(IDLE_BLOCK_MS / 1000)
            return None, capped
        if self._cluster is None:
            return after, capped
        self.env.idle = True
        freed = asyncio.ensure_future(self._slot_for(capped)) if capped else None
        try:
            if not self.env.stopping:
                await self._cluster.wait(after, freed)
        finally:
            self.env.idle = False
            if freed is not None:
                freed.cancel()
        return None, capped

    async def _claim(
        self, queue: str, free: int, send: Callable[[], Awaitable[Any]]
    ) -> sc.ClaimBatch:
        """A claim of ``free`` slots of ``queue``, sent by ``send()``, held until Runs.take."""
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
        qk = env.keys.queue(queue)
        return sc.claim_call(
            qk, env.worker_id, free, s.events_maxlen, s.result_ttl_s, s.fair, s.group_cap(queue)
        )

    async def _behind_xread(
        self, after: str, call: sc.Call, capped: list[str]
    ) -> Callable[[], Awaitable[Any]]:
        """The idle wait on one server: a send of ``call`` pipelined behind an XREAD of every
        band from ``after`` (a stop, or a run of a ``capped`` queue that ends, unblocks it)."""
        env = self.env
        async with asyncio.timeout(IDLE_WAIT_TIMEOUT_S):  # (a hung connection)
            conn = await self._wake.connection()
            if conn is not self._wake_conn:  # a new connection: learn its id for CLIENT UNBLOCK
                self._wake_conn, self._wake_id = None, None
                self._wake_id = int(await self._wake.call(("CLIENT", "ID")))
                self._wake_conn = conn
        streams = self._streams
        ids = [after] * len(streams)
        xread = ("XREAD", "COUNT", 1, "BLOCK", IDLE_BLOCK_MS, "STREAMS", *streams, *ids)
        claim, wake_id = env.scripts.evalsha(call), self._wake_id

        async def send() -> Any:
            env.idle = True  # (no yield since the checks: a later stop unblocks the XREAD)
            freed = (
                asyncio.ensure_future(self._unblock_when_freed(capped, wake_id)) if capped else None
            )
            try:
                _, raw = await self._wake.call_pair(xread, claim, IDLE_WAIT_TIMEOUT_S)
            finally:
                env.idle = False
                if freed is not None:
                    freed.cancel()
            if isinstance(raw, ResponseError):
                raise raw
            return raw

        return send

    def _freed(self, capped: list[str]) -> bool:
        """Whether a queue of ``capped`` (at its cap when the wait began) may claim again."""
        return any(self.slots.free(q) > 0 for q in capped)

    async def _slot_for(self, capped: list[str]) -> None:
        """Until a queue of ``capped`` may claim again."""
        while not self._freed(capped):
            await self.slots.changed.wait()

    async def _unblock_when_freed(self, capped: list[str], client_id: int | None) -> None:
        await self._slot_for(capped)
        if client_id is not None:
            await self._unblock(client_id)

    def interrupt(self) -> None:
        """Shutdown: end the idle XREAD now (CLIENT UNBLOCK), so the claim behind it answers."""
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
