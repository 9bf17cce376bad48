"""Admin's view of the workers, from their heartbeats."""

from __future__ import annotations

from typing import Any

from dtq.admin.core import AdminCore
from dtq.admin.views import WorkerInfo, iso
from dtq.declared import TASKS_FIELD, task_names
from dtq.store.partitions import logical


class WorkerOps(AdminCore):
    """Workers as their heartbeats show them."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Known workers; live unless the last heartbeat is older than 3 heartbeat intervals.

        A worker SIGKILLed stops heartbeating; its hash expires after 3 intervals and its
        entry in ``P:workers`` then shows it stale (from the last heartbeat time there).
        """
        entries = await self._r.zrange(self.keys.workers, 0, -1, withscores=True)
        async with self._r.pipeline(transaction=False) as pipe:
            for wid, _ in entries:
                pipe.hgetall(self.keys.worker(wid))
            if not self._cluster:  # ages on the Redis clock, which heartbeats carry
                pipe.time()
            replies: list[Any] = await pipe.execute()
        *hashes, (sec, usec) = [*replies, *await self._cluster_time()]
        now_ms = int(sec) * 1000 + int(usec) / 1000
        out: list[WorkerInfo] = []
        for (wid, score), h in zip(entries, hashes, strict=True):
            last = int(h.get("last_heartbeat") or score)
            interval_ms = (
                int(h["heartbeat_interval_ms"]) if h.get("heartbeat_interval_ms") else None
            )
            age_ms = max(0.0, now_ms - last)
            live = bool(h) and interval_ms is not None and age_ms <= 3 * interval_ms
            if h.get("status") == "stopped":
                live = False
            out.append(
                WorkerInfo(
                    worker_id=wid,
                    live=live,
                    last_heartbeat_ms=last,
                    heartbeat_age_s=round(age_ms / 1000, 3),
                    heartbeat_interval_s=None if interval_ms is None else interval_ms / 1000,
                    status=h.get("status", "unknown") if live else "stale",
                    hostname=h.get("hostname", ""),
                    pid=int(h["pid"]) if h.get("pid") else None,
                    # a partitioned queue once, by its name (the hash lists its partitions)
                    queues=list(
                        dict.fromkeys(logical(q) for q in h.get("queues", "").split(",") if q)
                    ),
                    tasks=task_names(h.get(TASKS_FIELD)),
                    active_tasks=int(h.get("active_tasks") or 0),
                    concurrency=int(h["concurrency"]) if h.get("concurrency") else None,
                    tasks_processed=int(h.get("tasks_processed") or 0),
                    tasks_failed=int(h.get("tasks_failed") or 0),
                    tasks_retried=int(h.get("tasks_retried") or 0),
                    started_at=iso(int(h["started_at"])) if h.get("started_at") else None,
                )
            )
        return out
