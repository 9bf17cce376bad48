"""Admin's dead-letter operations: list, count, requeue and discard (one or in bulk)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence

from dtq import scripts as sc
from dtq.admin.common import (
    BATCH,
    DLQ_BUDGET,
    Progress,
    as_int,
    check_listing,
    check_queue_name,
    chunks,
    pipelined,
    position,
    zset_scan,
)
from dtq.admin.core import AdminCore
from dtq.admin.views import BulkResult, DeadLetter, Page, iso
from dtq.errors import Conflict, UnknownTask
from dtq.scripts import dlq_discard_call
from dtq.store.keys import QueueKeys, make_task_id, split_task_id
from dtq.store.partitions import logical
from dtq.store.record import DEFAULTS, Field

FIELDS = [Field.NAME, Field.ATTEMPT, Field.RETRIES, Field.MAX_RETRIES, Field.ERROR]
"""What a dead-letter listing reads of each record."""


def _matches(found: Sequence[str | None], name: str | None, error: str | None) -> bool:
    """Whether a dead letter (its task's name and last error) passes the filters."""
    n, e = found
    return name in (None, n) and (error is None or error.lower() in (e or "").lower())


class DeadLetterOps(AdminCore):
    """Dead letters: the failed tasks kept in each queue's ``dlq`` zset."""

    async def dlq_list(
        self,
        *,
        queue: str | None = None,
        name: str | None = None,
        error: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page:
        """Failed tasks, newest failure first, across queues (or one), with their last error.

        The cursor is ``<queue index>.<offset>`` over the queues in name order. One request
        examines at most ``DLQ_BUDGET`` entries (a queue visited counts as one).
        """
        check_listing(queue, None, limit)
        queues = await self._physical_of(queue)
        qi, off = position(cursor)
        qidx = int(qi)
        items: list[DeadLetter] = []
        examined = 0
        while qidx < len(queues) and len(items) < limit and examined < DLQ_BUDGET:
            letters, nxt, seen = await self._dlq_scan(
                queues[qidx], off, name, error, limit - len(items), DLQ_BUDGET - examined
            )
            items.extend(letters)
            examined += max(1, seen)
            if nxt is None:
                qidx, off = qidx + 1, 0
            else:
                off = nxt
        next_cursor = f"{qidx}.{off}" if qidx < len(queues) else None
        return Page([d.to_dict() for d in items], next_cursor, 0, examined)

    async def _dlq_scan(
        self, queue: str, offset: int, name: str | None, error: str | None, want: int, budget: int
    ) -> tuple[list[DeadLetter], int | None, int]:
        """Dead letters of one queue from ``offset``, newest first (:func:`zset_scan`); one whose
        record expired (no name) is left out, retention removes its entry."""
        qk = self.keys.queue(queue)

        async def pick(entries: list[tuple[str, float]]) -> list[DeadLetter | None]:
            recs = await pipelined(self._r, entries, lambda p, e: p.hmget(qk.task(e[0]), FIELDS))
            return [
                DeadLetter(
                    task_id=make_task_id(queue, tid),
                    queue=logical(queue),
                    name=r[0],
                    failed_at=iso(score),
                    attempt=as_int(r[1]),
                    retries=as_int(r[2]),
                    max_retries=as_int(r[3] or DEFAULTS[Field.MAX_RETRIES]),
                    error=r[4],
                )
                if r[0] is not None and _matches((r[0], r[4]), name, error)
                else None
                for (tid, score), r in zip(entries, recs, strict=True)
            ]

        return await zset_scan(self._r, qk.dlq, offset, want, budget, pick, newest_first=True)

    async def _dlq_matching(
        self, queue: str, name: str | None, error: str | None
    ) -> AsyncIterator[Sequence[str]]:
        """Batches of dead-letter tids of one queue matching the filters (oldest first)."""
        qk = self.keys.queue(queue)
        pos = 0
        while True:
            tids: list[str] = await self._r.zrange(qk.dlq, pos, pos + BATCH - 1)
            if not tids:
                return
            pos += len(tids)
            picked = await self._dlq_filter(queue, tids, None, name, error)
            if picked:
                yield picked

    async def _dlq_filter(
        self,
        queue: str,
        tids: Sequence[str],
        want_queue: str | None,
        name: str | None,
        error: str | None,
    ) -> Sequence[str]:
        """The tids of ``queue`` that match the filters (one pipelined read when filtering)."""
        if want_queue is not None and logical(queue) != want_queue:
            return []
        if name is None and error is None:
            return tids
        qk = self.keys.queue(queue)
        recs = await pipelined(
            self._r, tids, lambda p, t: p.hmget(qk.task(t), [Field.NAME, Field.ERROR])
        )
        return [tid for tid, rec in zip(tids, recs, strict=True) if _matches(rec, name, error)]

    async def dlq_count(self, queue: str | None = None) -> int:
        dlqs = [self.keys.queue(q).dlq for q in await self._physical_of(queue)]
        return sum(int(n) for n in await pipelined(self._r, dlqs, lambda p, k: p.zcard(k)))

    async def dlq_requeue(
        self,
        task_ids: Sequence[str] | None = None,
        *,
        queue: str | None = None,
        name: str | None = None,
        error: str | None = None,
        max_retries: int | None = None,
        progress: Progress | None = None,
    ) -> BulkResult:
        """Requeue dead letters: the given ids, or all matching the filters (all when none); each
        keeps its id, record and history, ``max_retries`` sets a new retry budget."""
        return await self._dlq_bulk("requeue", task_ids, queue, name, error, max_retries, progress)

    async def dlq_discard(
        self,
        task_ids: Sequence[str] | None = None,
        *,
        queue: str | None = None,
        name: str | None = None,
        error: str | None = None,
        progress: Progress | None = None,
    ) -> BulkResult:
        """Delete dead letters for good: the given ids, or all matching the filters."""
        return await self._dlq_bulk("discard", task_ids, queue, name, error, None, progress)

    async def dlq_purge(self, queue: str | None = None, progress: Progress | None = None) -> int:
        """Discard every dead letter of a queue (or of all queues); returns how many."""
        return (await self.dlq_discard(queue=queue, progress=progress)).done

    async def dlq_requeue_one(self, task_id: str, max_retries: int | None = None) -> None:
        """Requeue one dead letter; UnknownTask / Conflict when it is not one."""
        self._single(task_id, await self.dlq_requeue([task_id], max_retries=max_retries))

    async def dlq_discard_one(self, task_id: str) -> None:
        self._single(task_id, await self.dlq_discard([task_id]))

    @staticmethod
    def _single(task_id: str, res: BulkResult) -> None:
        if res.done == 1:
            return
        why = next(iter(res.skipped), "missing")
        if why == "missing":
            raise UnknownTask(f"no dead letter {task_id}")
        raise Conflict(f"task {task_id} is {why}, not a dead letter", why)

    async def _dlq_bulk(
        self,
        op: str,
        task_ids: Sequence[str] | None,
        queue: str | None,
        name: str | None,
        error: str | None,
        max_retries: int | None,
        progress: Progress | None,
    ) -> BulkResult:
        done = 0
        skipped: Counter[str] = Counter()

        async def apply(qk: QueueKeys, tids: Sequence[str]) -> None:
            nonlocal done
            if op == "requeue":
                outcomes = await self._requeue(qk, tids, max_retries)
                ok = "requeued"
            else:
                call = dlq_discard_call(
                    qk, tids, events_maxlen=self.settings.events_maxlen, nonce=sc.new_nonce()
                )
                outcomes = sc.parse_dlq(await self._run(call))
                ok = "discarded"
            skipped.update(outcomes)
            done += skipped.pop(ok, 0)
            if progress is not None:
                progress(len(tids))

        if task_ids is not None:
            by_queue: dict[str, list[str]] = {}
            for task_id in task_ids:
                q, tid = split_task_id(task_id)
                by_queue.setdefault(q, []).append(tid)
            for q, tids in by_queue.items():
                check_queue_name(logical(q))
                for chunk in chunks(tids, BATCH):
                    # Ids outside the filters are left alone (skipped as "filtered").
                    picked = await self._dlq_filter(q, chunk, queue, name, error)
                    if len(picked) < len(chunk):
                        skipped["filtered"] += len(chunk) - len(picked)
                    if picked:
                        await apply(self.keys.queue(q), picked)
        else:
            if queue is not None:
                check_queue_name(queue)
            for q in await self._physical_of(queue):
                # The zset shrinks as tasks leave it, so collect first, then apply.
                batches = [b async for b in self._dlq_matching(q, name, error)]
                for b in batches:
                    await apply(self.keys.queue(q), b)
        return BulkResult(done, dict(skipped))
