"""The base of :class:`dtq.admin.Admin`: its connection, its script runner, the queue registry
(which queues exist, the workers' heartbeats among its sources) and the dead-letter requeue
transition both tasks and dead letters use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

import redis
import redis.asyncio as aredis

from dtq import scripts as sc
from dtq.admin.common import as_int, check_queue_name
from dtq.admin.views import WorkerInfo, iso
from dtq.declared import TASKS_FIELD, task_names
from dtq.errors import BadTaskId, InvalidRequest, RedisUnavailable, UnknownQueue, unreachable
from dtq.scripts import dlq_requeue_call
from dtq.sdk.client import AsyncClient
from dtq.settings import Settings, load_settings
from dtq.store import eviction
from dtq.store.connection import async_redis, is_cluster
from dtq.store.keys import Keys, QueueKeys, QueueRef, is_flow_id, split_task_id
from dtq.store.partitions import expand, is_physical, logical

if TYPE_CHECKING:
    from dtq.app import App


class AdminCore:
    """The connection, the script runner and the queue registry every part of Admin uses."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        redis_client: aredis.Redis | None = None,
        app: App | None = None,
    ) -> None:
        self.settings = settings or load_settings()
        self.keys = Keys(self.settings.key_prefix)
        # Re-sends after a blip what is safe to re-send (docs/faults.md); past the pool's 100
        # connections a call waits for one (an API serving many requests), as the SDK's do.
        self.redis: aredis.Redis = redis_client or async_redis(
            self.settings.redis_url,
            retries=self.settings.client_retries,
            wait_for_connection=True,
            decode_responses=True,
        )
        # redis-py's command stubs are unions of bytes/str; this client decodes to str.
        self._r: Any = self.redis
        # With the app, enqueues get each task's declared defaults (queue, priority, limits).
        self.client = AsyncClient(settings=self.settings, redis_client=self.redis, app=app)
        self.scripts = sc.AsyncScripts(self.redis, replay_safe=True)  # (docs/faults.md)
        self._cluster = is_cluster(self.redis)  # (see connection.py)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._r.aclose()

    async def ping(self) -> None:
        """Raise :class:`dtq.RedisUnavailable` unless Redis answers."""
        try:
            await self._r.ping()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise RedisUnavailable(unreachable(exc)) from None

    async def eviction_warning(self) -> str | None:
        """What is wrong with Redis's ``maxmemory-policy`` for dtq (dtq.store.eviction), or None."""
        return eviction.warning(await eviction.eviction_policy(self._r))

    async def _run(self, call: sc.Call) -> Any:
        try:
            return await self.scripts.run(call)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise RedisUnavailable(unreachable(exc)) from None
        except (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError) as exc:
            raise RedisUnavailable(f"Redis refused the write: {exc}") from None

    async def _cluster_time(self) -> list[Any]:
        """[TIME] on a cluster (whose pipelines refuse it), else [] (it was pipelined)."""
        return [await self._r.time()] if self._cluster else []

    # --- the queue registry ----------------------------------------------------------------

    async def queue_names(self) -> list[str]:
        """Queues seen under this prefix (enqueued to, or consumed by a known worker); a
        partitioned queue once, by its name (dtq.store.partitions)."""
        return sorted({logical(n) for n in await self.physical_names()})

    async def physical_names(self) -> list[str]:
        """:meth:`queue_names` with each partition of a partitioned queue (``q~i``) listed."""
        names: set[str] = set(await self._r.smembers(self.keys.queues))
        for w in await self.list_workers():
            names.update(w.queues)
        return sorted(n for n in names if is_physical(n))

    async def _physical_of(self, queue: str | None) -> list[str]:
        """The physical queues of ``queue`` (its partitions, as DTQ_QUEUE_PARTITIONS says: no
        round trip), or of every known queue when None (the registry's)."""
        if queue is not None:
            return expand([queue], self.settings.queue_partitions)
        return await self.physical_names()

    async def _require_queue(self, name: str) -> None:
        check_queue_name(name)
        registered = await self._r.sismember(self.keys.queues, name)
        if not registered and name not in await self.queue_names():
            raise UnknownQueue(f"no queue named {name!r}")

    async def resolve_id(self, task_id: str) -> str:
        """``task_id`` when it is a task or workflow id; for a bare ``<tid>`` (an id given
        without its queue), ``<queue>:<tid>`` of the one known queue holding that task. Else
        :class:`BadTaskId` saying the expected form (and the queues, when several hold it)."""
        try:
            split_task_id(task_id)
            return task_id
        except BadTaskId:
            if ":" in task_id or not task_id or not task_id.isprintable():
                raise BadTaskId(
                    f"not a dtq task id: {task_id!r} (expected <queue>:<tid>)"
                ) from None
        names = await self.physical_names()
        queues = [q for q in names if QueueRef.parse(q).partition == 0]
        pipe = self._r.pipeline(transaction=False)
        for q in queues:
            qk = self.keys.queue(q)
            pipe.exists(qk.flow(task_id) if is_flow_id(f"q:{task_id}") else qk.task_base + task_id)
        found = [q for q, n in zip(queues, await pipe.execute(), strict=True) if n]
        if len(found) == 1:
            return f"{found[0]}:{task_id}"
        where = f"; queues {', '.join(found)} each hold one" if found else ""
        raise BadTaskId(f"not a dtq task id: {task_id!r} (expected <queue>:<tid>{where})")

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
            interval_ms = as_int(h.get("heartbeat_interval_ms")) or None
            age_ms = max(0.0, now_ms - last)
            stopped = h.get("status") == "stopped"
            live = bool(h) and interval_ms is not None and age_ms <= 3 * interval_ms and not stopped
            out.append(
                WorkerInfo(
                    worker_id=wid,
                    live=live,
                    stale=not live,
                    last_heartbeat_ms=last,
                    last_heartbeat=iso(last),
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
                    active_tasks=as_int(h.get("active_tasks")),
                    concurrency=as_int(h.get("concurrency")) or None,
                    tasks_processed=as_int(h.get("tasks_processed")),
                    tasks_failed=as_int(h.get("tasks_failed")),
                    tasks_retried=as_int(h.get("tasks_retried")),
                    started_at=iso(int(h["started_at"])) if h.get("started_at") else None,
                )
            )
        return out

    # --- the requeue transition (a retry and a dead-letter requeue) -------------------------

    async def _requeue(
        self,
        qk: QueueKeys,
        tids: Sequence[str],
        max_retries: int | None,
        allowed: Sequence[str] = ("failed",),
    ) -> list[sc.DlqVerdict]:
        if max_retries is not None and (type(max_retries) is not int or max_retries < 0):
            raise InvalidRequest("max_retries must be a non-negative integer")
        call = dlq_requeue_call(
            qk,
            tids,
            events_maxlen=self.settings.events_maxlen,
            max_retries=max_retries,
            allowed=allowed,
            nonce=sc.new_nonce(),  # a re-send after a blip gets this call's own answer
        )
        return sc.parse_dlq(await self._run(call))
