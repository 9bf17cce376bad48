"""Admin's queue operations: their state, pause and resume, purge, their history (dtq.stats)
and their fair groups (docs/groups.md; the SDK's dtq.sdk.groupops does the work, here the
queue must be a known one: :class:`dtq.UnknownQueue` otherwise)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dtq import scripts as sc
from dtq import stats
from dtq.admin.common import BATCH, Progress, check_queue_name, id_ms, pipelined
from dtq.admin.core import AdminCore
from dtq.admin.views import BulkResult, Page, QueueInfo, merge_infos
from dtq.errors import InvalidRequest
from dtq.scripts import parse_purge, purge_call
from dtq.sdk.groupops import GROUP_PAGE, check_group
from dtq.store.keys import GROUP, PRIORITIES, QueueKeys
from dtq.store.partitions import expand


class QueueOps(AdminCore):
    """Queues: their depth, running and dead letters; pause, resume, purge; history; groups."""

    async def list_queues(self) -> list[QueueInfo]:
        """Every known queue with its depth per priority, schedule, running, dead letters."""
        return await self.queue_infos(await self.queue_names())

    async def get_queue(self, name: str) -> QueueInfo:
        await self._require_queue(name)
        return (await self.queue_infos([name]))[0]

    async def queue_infos(self, names: Sequence[str]) -> list[QueueInfo]:
        """The state of each queue in ``names``, a partitioned queue's partitions summed."""
        parts = {n: expand([n], self.settings.queue_partitions) for n in names}
        flat = [p for n in names for p in parts[n]]
        infos = dict(zip(flat, await self._physical_infos(flat), strict=True))
        return [merge_infos(n, [infos[p] for p in parts[n]]) for n in names]

    async def _physical_infos(self, names: Sequence[str]) -> list[QueueInfo]:
        """The state of each queue in ``names``: two pipelined round trips for all of them."""
        per = 2 * len(PRIORITIES) + 4
        async with self._r.pipeline(transaction=False) as pipe:
            for name in names:
                qk = self.keys.queue(name)
                for p in PRIORITIES:
                    pipe.xlen(qk.stream(p))
                    pipe.xinfo_groups(qk.stream(p))
                pipe.zcard(qk.sched)
                pipe.zcard(qk.dlq)
                pipe.exists(qk.paused)
                pipe.zcard(qk.group_index)
            if not self._cluster:  # a cluster pipeline refuses TIME: sent after it
                pipe.time()
            raw = await pipe.execute(raise_on_error=False)
        raw.extend(await self._cluster_time())
        now = raw[-1]
        if isinstance(now, Exception):
            raise now
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        infos: list[QueueInfo] = []
        waiting: list[tuple[int, str, str]] = []  # (queue, stream, after its delivered) per band
        for j, name in enumerate(names):
            part = raw[j * per : (j + 1) * per]
            for x in (*part[0 : 2 * len(PRIORITIES) : 2], *part[-4:]):
                if isinstance(x, Exception):
                    raise x
            depth: dict[int, int] = {}
            running = 0
            for i, p in enumerate(PRIORITIES):
                groups = part[2 * i + 1]
                groups = [] if isinstance(groups, Exception) else groups  # (no stream yet)
                g: dict[str, Any] = next((x for x in groups if x.get("name") == GROUP), {})
                pending = int(g.get("pending", 0))
                depth[p] = max(0, int(part[2 * i]) - pending)
                running += pending
                if depth[p]:
                    start = ("(" + str(g.get("last-delivered-id"))) if g else "-"
                    waiting.append((j, self.keys.queue(name).stream(p), start))
            scheduled, dlq, paused, active = part[-4:]
            infos.append(
                QueueInfo(
                    name=name,
                    depth=depth,
                    queued=sum(depth.values()),
                    scheduled=int(scheduled),
                    running=running,
                    dlq=int(dlq),
                    paused=bool(paused),
                    oldest_waiting_age_s=None,
                    active_groups=int(active),
                )
            )
        firsts = await pipelined(
            self._r, waiting, lambda pipe, w: pipe.xrange(w[1], min=w[2], max="+", count=1)
        )
        oldest: dict[int, float] = {}
        for (j, _, _), entries in zip(waiting, firsts, strict=True):
            if entries:
                age = max(0.0, (now_ms - id_ms(entries[0][0])) / 1000)
                oldest[j] = max(age, oldest.get(j, age))
        return [replace(q, oldest_waiting_age_s=oldest.get(j)) for j, q in enumerate(infos)]

    async def _queue_event(self, qk: QueueKeys, etype: str, detail: str = "") -> None:
        if self.settings.events_maxlen > 0:
            await self._r.xadd(
                qk.events,
                {"type": etype, "tid": "", "attempt": "", "worker": "", "detail": detail},
                maxlen=self.settings.events_maxlen,
                approximate=True,
            )

    async def pause(self, name: str) -> bool:
        """Stop workers taking from the queue (running tasks finish). True if it changed."""
        await self._require_queue(name)
        return any([await self._pause(self.keys.queue(q)) for q in await self._physical_of(name)])

    async def _pause(self, qk: QueueKeys) -> bool:
        # The value names this call: re-sent after a lost reply, SET NX finds the key set and
        # the value tells that it was this very call (only the key's existence pauses).
        mark = f"{int(time.time() * 1000)} {sc.new_nonce()}"
        changed = bool(await self._r.set(qk.paused, mark, nx=True))
        if not changed:
            changed = await self._r.get(qk.paused) == mark
        if changed:
            await self._queue_event(qk, "paused")
        return changed

    async def resume(self, name: str) -> bool:
        """Let workers take from the queue again. True if it was paused."""
        await self._require_queue(name)
        changed = False
        for q in await self._physical_of(name):
            qk = self.keys.queue(q)
            if await self._r.delete(qk.paused):
                changed = True
                await self._queue_event(qk, "resumed")
        return changed

    async def purge(
        self, name: str, *, batch: int = BATCH, progress: Progress | None = None
    ) -> BulkResult:
        """Delete the queue's waiting tasks (queued and scheduled), in bounded batches; running
        tasks finish normally, finished records and dead letters stay."""
        await self._require_queue(name)
        counts = Counter(queued=0, scheduled=0)
        ttl_s = self.settings.result_ttl_s
        for q in await self._physical_of(name):
            qk, more = self.keys.queue(q), True
            while more:
                call = purge_call(qk, batch, self.settings.events_maxlen, sc.new_nonce(), ttl_s)
                res = parse_purge(await self._run(call))
                counts.update(queued=res.queued, scheduled=res.scheduled)
                if progress is not None:
                    progress(res.queued + res.scheduled)
                more = res.more
        return BulkResult(counts.total(), dict(counts))

    async def list_groups(
        self, queue: str, *, cursor: str | None = None, limit: int = GROUP_PAGE
    ) -> Page:
        """A page of the queue's active groups, then its held idle ones (items: GroupInfo's
        fields as a dict). Bounded work per page (dtq.sdk.groupops): a page may be short, even
        empty, while ``next_cursor`` is set."""
        await self._require_queue(queue)
        page = await self.client.groups(queue, cursor=cursor, limit=limit)
        return Page([g.to_dict() for g in page.items], page.next_cursor, 0, page.examined)

    async def pause_group(self, queue: str, group: str) -> bool:
        """Hold ``group`` of the queue: none of its tasks starts; running ones finish. True if
        it changed."""
        check_group(group)
        await self._require_queue(queue)
        return await self.client.pause_group(queue, group)

    async def resume_group(self, queue: str, group: str) -> bool:
        """Release ``group`` of the queue. True if it was held."""
        check_group(group)
        await self._require_queue(queue)
        return await self.client.resume_group(queue, group)

    async def stats(
        self, *, queue: str | None = None, minutes: int = 60, step: int = 1
    ) -> list[dict[str, Any]]:
        """Per-minute counts of ``queue`` (its partitions summed; every known queue summed when
        None) over the last ``minutes`` minutes, in buckets of ``step`` minutes, oldest first:
        each has ``minute`` (ISO 8601, UTC, the bucket's first), the :data:`dtq.stats.COUNTERS`,
        ``runs`` (runs timed) and the run-time percentiles ``p50``, ``p95``, ``p99`` (seconds,
        an upper bound; None without runs). Reads two ``MGET`` per physical queue (one more per
        day of minutes past the first)."""
        if not (1 <= minutes <= stats.MAX_MINUTES and 1 <= step <= minutes):
            raise InvalidRequest(f"need 1 <= minutes <= {stats.MAX_MINUTES}, 1 <= step <= minutes")
        if queue is not None:
            check_queue_name(queue)
        qks = [self.keys.queue(q) for q in await self._physical_of(queue)]
        return await stats.read(self._r, qks, minutes, step)
