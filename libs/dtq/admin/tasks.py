"""Admin's task operations: one task, its history, the two task listings, cancel and retry;
periodic schedules (dtq.schedules) and the delayed tasks and retries waiting to run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dtq import scripts as sc
from dtq.admin import task_index
from dtq.admin.common import (
    DLQ_BUDGET,
    HISTORY_SCAN,
    RETRYABLE,
    SCAN_BUDGET,
    as_int,
    check_listing,
    check_queue_name,
    parse_cursor,
    pipelined,
    position,
    records,
    zset_scan,
)
from dtq.admin.core import AdminCore
from dtq.admin.views import Event, Page, ScheduledTask, entry_has_task, events_from, iso, task_info
from dtq.declared import pending as pending_declared
from dtq.errors import Conflict, InvalidRequest, UnknownTask
from dtq.models import TaskInfo
from dtq.sdk.client import CANCEL_REASON
from dtq.store.cluster import ascan_tasks, scan_step
from dtq.store.keys import is_flow_id, make_task_id, split_task_id
from dtq.store.partitions import logical
from dtq.store.record import Field


class TaskOps(AdminCore):
    """Tasks: read one, list them (SCAN walk or newest first), cancel, retry; schedules."""

    async def get_task(self, task_id: str, *, history: bool = False) -> dict[str, Any]:
        """The task's fields (as :class:`dtq.TaskInfo` names them), optionally its history."""
        d = (await self.client.get(task_id)).to_dict()
        queue, tid = split_task_id(task_id)
        d["requeues"] = as_int(await self._r.hget(self.keys.queue(queue).task(tid), Field.REQUEUES))
        if history:
            d["history"] = [e.to_dict() for e in await self.task_history(task_id)]
        return d

    async def task_history(self, task_id: str, limit: int = HISTORY_SCAN) -> list[Event]:
        """The task's lifecycle events still in its queue's capped event stream, oldest first
        (read newest first, at most ``limit`` entries)."""
        queue, tid = split_task_id(task_id)
        key = self.keys.queue(queue).events
        found: list[Event] = []
        own = make_task_id(queue, tid)
        upper, read = "+", 0
        while read < limit:
            chunk = await self._r.xrevrange(key, max=upper, min="-", count=1000)
            if not chunk:
                break
            for eid, fields in chunk:
                if entry_has_task(fields, tid):
                    found.extend(e for e in events_from(queue, eid, fields) if e.task_id == own)
            read += len(chunk)
            upper = "(" + chunk[-1][0]
            if found and found[-1].type == "enqueued":
                break
        return found[::-1]

    async def list_tasks(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page:
        """Tasks matching all given filters, about ``limit`` per page (see the module doc)."""
        check_listing(queue, status, limit)
        # A partitioned queue's records are in several slots: walked like every queue's, with
        # a pattern matching its partitions' keys only (dtq.store.partitions).
        parted = queue is not None and self.settings.queue_partitions.get(queue, 1) > 1
        one = None if parted else queue
        if one is not None and status in ("failed", "scheduled"):
            return await self._list_zset(one, status, name, cursor, limit)
        scan_cursor, skip = parse_cursor(cursor)
        if ":" in scan_cursor and (one is not None or not self._cluster):
            # "<primary>:<cursor>" is a walk over every primary of a cluster only
            raise InvalidRequest(f"bad cursor {cursor!r}")
        items: list[TaskInfo] = []
        scans = examined = 0
        # One queue's records are in its slot's node; across queues the walk visits every
        # primary of a cluster (dtq.store.cluster): its cursor then reads "<primary>:<cursor>".
        while True:
            if one is not None:
                qk = self.keys.queue(one)
                at, keys = await ascan_tasks(self._r, qk, int(scan_cursor), 1000)
                nxt = str(at)
            else:
                match = (
                    self.keys.every_task_key_pattern
                    if queue is None
                    else self.keys.partitioned_task_key_pattern(queue)
                )
                nxt, keys = await scan_step(self._r, scan_cursor, match, 1000)
            scans += 1
            examined += len(keys)
            matched = await self._filter_records(keys, status, name)
            take = matched[skip:]
            room = limit - len(items)
            if len(take) > room:
                items.extend(take[:room])
                next_cursor: str | None = f"{scan_cursor}.{skip + room}"
                break
            items.extend(take)
            skip = 0
            scan_cursor = str(nxt)
            if scan_cursor == "0":
                next_cursor = None
                break
            if len(items) >= limit or scans >= SCAN_BUDGET:
                next_cursor = f"{nxt}.0"
                break
        return Page([t.to_dict() for t in items], next_cursor, scans, examined)

    async def recent_tasks(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> Page:
        """Tasks newest first from the queues' event streams (see :mod:`dtq.admin.task_index`);
        ``Page.running`` holds the running tasks on the first page (no cursor)."""
        check_listing(queue, status, limit)
        queues = await self._physical_of(queue)
        try:
            items, nxt, read = await task_index.newest(
                self._r, self.keys, queues, status=status, name=name, cursor=cursor, limit=limit
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        running: list[dict[str, Any]] = []
        if cursor is None and status in (None, "running"):
            running = await task_index.running(self._r, self.keys, queues, name=name)
        return Page(items, nxt, 0, read, running)

    async def _filter_records(
        self, keys: Sequence[str], status: str | None, name: str | None
    ) -> list[TaskInfo]:
        recs = await records(self._r, keys)
        decls = await self._declared_of(keys, recs)
        infos = [
            info
            for k, rec, decl in zip(keys, recs, decls, strict=True)
            if (parts := self.keys.task_key_parts(k))
            and (info := task_info(*parts, rec, decl, status=status, name=name))
        ]
        return sorted(infos, key=lambda t: t.id)

    async def _declared_of(
        self, keys: Sequence[str], recs: Sequence[dict[str, str]]
    ) -> list[str | None]:
        """The published declaration of each record still waiting for one (dtq.declared),
        None for the others; one pipelined round trip, and none when no record waits."""
        want = [
            (i, self.keys.queue(parts[0]).decl, rec.get(Field.NAME, ""))
            for i, (k, rec) in enumerate(zip(keys, recs, strict=True))
            if rec and pending_declared(rec) and (parts := self.keys.task_key_parts(k))
        ]
        out: list[str | None] = [None] * len(keys)
        raws = await pipelined(self._r, want, lambda p, w: p.hget(w[1], w[2]))
        for (i, _, _), raw in zip(want, raws, strict=True):
            out[i] = raw
        return out

    async def _list_zset(
        self, queue: str, status: str, name: str | None, cursor: str | None, limit: int
    ) -> Page:
        """Failed or scheduled tasks of one queue from its zset (:func:`zset_scan`), at most
        ``DLQ_BUDGET`` entries per page."""
        qk = self.keys.queue(queue)

        async def pick(entries: list[tuple[str, float]]) -> list[TaskInfo | None]:
            keys = [qk.task(tid) for tid, _ in entries]
            recs = await records(self._r, keys)
            decls = await self._declared_of(keys, recs)
            return [
                task_info(queue, tid, rec, decl, status=status, name=name)
                for (tid, _), rec, decl in zip(entries, recs, decls, strict=True)
            ]

        key = qk.dlq if status == "failed" else qk.sched
        pos = int(position(cursor)[0]) if cursor else 0
        items, nxt, examined = await zset_scan(self._r, key, pos, limit, DLQ_BUDGET, pick)
        return Page([t.to_dict() for t in items], None if nxt is None else str(nxt), 0, examined)

    async def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> dict[str, Any]:
        """Cancel through the SDK's transition; returns the outcome and the task's status."""
        split_task_id(task_id)
        if is_flow_id(task_id):  # a workflow (docs/workflows.md): the flow and its steps
            before = (await self.client.get(task_id)).status.value
            changed = await self.client.cancel(task_id, reason)
            outcome = "cancelled" if changed else "unchanged"
            return {"id": task_id, "outcome": outcome, "status": "cancelled" if changed else before}
        res = sc.parse_cancel(await self._run(self.client._cancel_call(task_id, reason)))
        if res.outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        return {"id": task_id, "outcome": res.outcome, "status": res.status}

    async def retry(self, task_id: str, *, max_retries: int | None = None) -> dict[str, Any]:
        """Run a failed, cancelled or expired task again under the same id (keeps history)."""
        queue, tid = split_task_id(task_id)
        (outcome,) = await self._requeue(self.keys.queue(queue), [tid], max_retries, RETRYABLE)
        if outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        if outcome != "requeued":
            raise Conflict(
                f"task {task_id} is {outcome}; only {', '.join(RETRYABLE)} tasks can be retried",
                outcome,
            )
        return {"id": task_id, "status": "queued"}

    async def list_schedules(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Periodic schedules with their next fire times (from :mod:`dtq.schedules`)."""
        return [i.to_dict() for i in await self.client.list_schedules(queue)]

    async def set_schedule_enabled(self, queue: str, name: str, enabled: bool) -> dict[str, Any]:
        """Enable or disable one schedule; its fields, ``enabled`` and ``changed``."""
        check_queue_name(queue)
        changed, info = await self.client.set_schedule_enabled(name, queue, enabled)
        return {**info.to_dict(), "changed": changed}

    async def remove_schedule(self, queue: str, name: str) -> bool:
        """Remove one schedule; whether it existed."""
        check_queue_name(queue)
        return await self.client.remove_schedule(name, queue)

    async def run_schedule(self, queue: str, name: str) -> dict[str, Any]:
        """Enqueue one schedule's task now; the new task's fields."""
        check_queue_name(queue)
        return await self.get_task(await self.client.run_schedule_now(name, queue))

    async def list_scheduled(
        self, queue: str | None = None, limit: int = 100
    ) -> list[ScheduledTask]:
        """Delayed tasks and retries waiting in the schedule, soonest first.

        Two pipelined round trips for all queues: their soonest entries, then those records.
        """
        queues = await self._physical_of(queue)
        sched = [self.keys.queue(q).sched for q in queues]
        per_queue = await pipelined(
            self._r, sched, lambda p, k: p.zrange(k, 0, limit - 1, withscores=True)
        )
        # The soonest ``limit`` over all queues are all that is shown: read only their records.
        entries = [(s, q, t) for q, es in zip(queues, per_queue, strict=True) for t, s in es]
        soonest = sorted(entries)[:limit]
        task = [self.keys.queue(q).task(tid) for _, q, tid in soonest]
        recs = await pipelined(self._r, task, lambda p, k: p.hmget(k, [Field.NAME, Field.RETRIES]))
        out = [
            ScheduledTask(
                task_id=make_task_id(q, tid),
                queue=logical(q),
                name=nm or "",
                due_at=iso(score),
                kind="retry" if as_int(retries) > 0 else "delayed",
            )
            for (score, q, tid), (nm, retries) in zip(soonest, recs, strict=True)
        ]
        out.sort(key=lambda s: s.due_at or "")
        return out[:limit]
