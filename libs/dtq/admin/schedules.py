"""Admin's schedule operations: periodic schedules (dtq.schedules) and the delayed tasks and
retries waiting in each queue's schedule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtq.admin.common import as_int, check_queue_name
from dtq.admin.core import AdminCore
from dtq.admin.views import ScheduledTask, iso
from dtq.store.keys import make_task_id
from dtq.store.partitions import logical
from dtq.store.record import Field


class ScheduleOps(AdminCore):
    """Periodic schedules and the tasks waiting in the schedule zsets."""

    async def list_schedules(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Periodic schedules with their next fire times (from :mod:`dtq.schedules`)."""
        try:
            from dtq import schedules
        except ImportError:  # pragma: no cover - the schedules feature is optional
            return []
        infos = await schedules.alist_schedules(self.client, queue)
        return [i.to_dict() for i in infos]

    async def set_schedule_enabled(self, queue: str, name: str, enabled: bool) -> dict[str, Any]:
        """Enable or disable one schedule; its fields, ``enabled`` and ``changed``."""
        from dtq import schedules

        check_queue_name(queue)
        changed, info = await schedules.aset_enabled(self.client, name, queue, enabled)
        return {**info.to_dict(), "changed": changed}

    async def remove_schedule(self, queue: str, name: str) -> bool:
        """Remove one schedule; whether it existed."""
        from dtq import schedules

        check_queue_name(queue)
        return await schedules.aremove_schedule(self.client, name, queue)

    async def run_schedule(self, queue: str, name: str) -> dict[str, Any]:
        """Enqueue one schedule's task now; the new task's fields."""
        from dtq import schedules

        check_queue_name(queue)
        return await self.get_task(await schedules.arun_now(self.client, name, queue))

    async def list_scheduled(
        self, queue: str | None = None, limit: int = 100
    ) -> list[ScheduledTask]:
        """Delayed tasks and retries waiting in the schedule, soonest first.

        Two pipelined round trips for all queues: their soonest entries, then those records.
        """
        queues = await self._physical_of(queue)
        async with self._r.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zrange(self.keys.queue(q).sched, 0, limit - 1, withscores=True)
            per_queue: list[list[tuple[str, float]]] = await pipe.execute()
        # The soonest ``limit`` over all queues are all that is shown: read only their records.
        soonest = sorted(
            (
                (score, q, tid)
                for q, entries in zip(queues, per_queue, strict=True)
                for tid, score in entries
            ),
        )[:limit]
        async with self._r.pipeline(transaction=False) as pipe:
            for _, q, tid in soonest:
                pipe.hmget(self.keys.queue(q).task(tid), [Field.NAME, Field.RETRIES])
            recs = await pipe.execute() if soonest else []
        out: list[ScheduledTask] = []
        for (score, q, tid), (nm, retries) in zip(soonest, recs, strict=True):
            out.append(
                ScheduledTask(
                    task_id=make_task_id(q, tid),
                    queue=logical(q),
                    name=nm or "",
                    due_at=iso(score),
                    kind="retry" if as_int(retries) > 0 else "delayed",
                )
            )
        out.sort(key=lambda s: s.due_at or "")
        return out[:limit]

    if TYPE_CHECKING:
        # run_schedule answers with the new task (dtq.admin.tasks).
        async def get_task(self, task_id: str, *, history: bool = False) -> dict[str, Any]: ...
