"""Operator operations on a dtq deployment: the one implementation behind the CLI and the API.

Everything here reads or changes Redis through the key layout in :mod:`dtq.keys` and, for every
change that must be atomic, a Lua script (``lua/purge.lua``, ``lua/dlq_requeue.lua``,
``lua/dlq_discard.lua``; the cancel transition is the SDK's). The ``dtq`` CLI runs these
coroutines with :func:`asyncio.run`; ``dtq-api`` awaits them directly.

Costs worth knowing:

* :meth:`Admin.list_queues` is a fixed handful of commands per queue (pipelined), whatever
  the queue lengths.
* :meth:`Admin.recent_tasks` (the API's and dashboard's list) reads tasks newest first from
  the queues' event streams, which every enqueue already writes (:mod:`dtq.task_index`).
* :meth:`Admin.list_tasks` walks task records with ``SCAN`` (the CLI's complete walk), so
  one page costs O(keys scanned), not O(page). A status filter on ``failed`` or ``scheduled``
  with a queue uses the dead-letter/schedule zsets instead. Pages are cursor based;
  as with any ``SCAN``, a task may appear twice across pages while Redis rehashes, and
  records created during the walk may or may not be seen.
* Purge and bulk requeue/discard run in bounded batches (one short script call per batch), so
  Redis is never blocked for long and progress can be reported.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis

from dtq import eviction, task_index
from dtq import scripts as sc
from dtq.client import CANCEL_REASON, AsyncClient
from dtq.cluster import ascan_slot, scan_step
from dtq.connection import async_redis, is_cluster
from dtq.declared import pending as pending_declared
from dtq.errors import DtqError, InvalidRequest, RedisUnavailable, UnknownTask
from dtq.keys import GROUP, PRIORITIES, Keys, QueueKeys, is_flow_id, make_task_id, split_task_id
from dtq.models import TaskInfo, TaskStatus, ms_to_datetime
from dtq.partitions import expand, is_physical, logical
from dtq.settings import QUEUE_NAME_RE, Settings, load_settings

if TYPE_CHECKING:
    from dtq.app import App

BATCH = 500
"""Tasks handled per script call by purge and bulk dead-letter operations."""
MAX_PAGE = 1000
HISTORY_SCAN = 20_000
SCAN_BUDGET = 20
"""Most SCAN calls (COUNT 1000 each) one task listing makes before answering with a cursor."""
DLQ_BUDGET = 10_000
"""Most zset entries one dead-letter (or failed/scheduled) listing examines per request."""
"""Most event-stream entries read to build one task's history."""
RETRYABLE = ("failed", "cancelled", "expired")

Progress = Callable[[int], None]


class UnknownQueue(DtqError, LookupError):
    """No queue of that name has ever been used under this prefix."""


class Conflict(DtqError):
    """The task is not in a state that allows the operation (e.g. retrying a running task)."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


# --- script calls ----------------------------------------------------------------------------


def purge_call(
    qk: QueueKeys,
    limit: int,
    events_maxlen: int,
    nonce: str | None = None,
    flow_ttl_s: int = 86_400,
) -> sc.Call:
    """``nonce``: a re-send of this very call gets its first reply (see dtq.scripts.new_nonce).
    With it, a purged workflow step ends its flow cancelled (kept ``flow_ttl_s``)."""
    keys = [*qk.streams, qk.sched, qk.events, qk.task_base, qk.idem_base, qk.lim_base]
    args: list[Any] = [GROUP, limit, events_maxlen, qk.done_base]
    if nonce is not None:
        keys += [qk.reply(nonce), qk.flow_base, qk.flowq]
        args += [sc.REPLY_TTL_MS, flow_ttl_s]
    return sc.Call("purge", keys, args)


@dataclass(frozen=True, slots=True)
class PurgeBatch:
    queued: int
    scheduled: int
    more: bool


def parse_purge(raw: list[Any]) -> PurgeBatch:
    return PurgeBatch(int(raw[0]), int(raw[1]), int(raw[2]) == 1)


def dlq_requeue_call(
    qk: QueueKeys,
    tids: Sequence[str],
    *,
    events_maxlen: int,
    max_retries: int | None = None,
    allowed: Sequence[str] = ("failed",),
    nonce: str | None = None,
) -> sc.Call:
    """``nonce``: a re-send of this very call gets its first reply (see dtq.scripts.new_nonce)."""
    keys = [*qk.streams, qk.dlq, qk.events, qk.task_base, qk.idem_base]
    args: list[Any] = [
        events_maxlen, "" if max_retries is None else max_retries, ",".join(allowed), len(tids),
        *tids,
    ]  # fmt: skip
    if nonce is not None:
        keys.append(qk.reply(nonce))
        args.append(sc.REPLY_TTL_MS)
    return sc.Call("dlq_requeue", keys, args)


def dlq_discard_call(
    qk: QueueKeys, tids: Sequence[str], *, events_maxlen: int, nonce: str | None = None
) -> sc.Call:
    """``nonce``: a re-send of this very call gets its first reply (see dtq.scripts.new_nonce)."""
    keys = [qk.dlq, qk.events, qk.task_base, qk.idem_base]
    args: list[Any] = [events_maxlen, len(tids), *tids]
    if nonce is not None:
        keys.append(qk.reply(nonce))
        args.append(sc.REPLY_TTL_MS)
    return sc.Call("dlq_discard", keys, args)


# --- views -----------------------------------------------------------------------------------


def _iso(ms: float | None) -> str | None:
    dt = ms_to_datetime(ms)  # None for a time no datetime holds (a bad record is still listed)
    return None if dt is None else dt.isoformat()


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue as an operator sees it."""

    name: str
    depth: dict[int, int]
    """Waiting (queued, not yet taken) tasks per priority band."""
    scheduled: int
    running: int
    """Entries taken by a worker and not yet finished (the group's pending list)."""
    dlq: int
    paused: bool
    oldest_waiting_age_s: float | None
    """Age of the oldest waiting entry (since it became ready to run), None when none waits."""

    @property
    def queued(self) -> int:
        return sum(self.depth.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["depth"] = {str(p): n for p, n in self.depth.items()}
        d["queued"] = self.queued
        return d


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker's last heartbeat and the observer's verdict on its liveness."""

    worker_id: str
    live: bool
    last_heartbeat_ms: int
    heartbeat_age_s: float
    heartbeat_interval_s: float | None
    status: str
    hostname: str = ""
    pid: int | None = None
    queues: list[str] = field(default_factory=list)
    active_tasks: int = 0
    concurrency: int | None = None
    tasks_processed: int = 0
    tasks_failed: int = 0
    tasks_retried: int = 0
    started_at: str | None = None

    @property
    def stale(self) -> bool:
        return not self.live

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stale"] = self.stale
        d["last_heartbeat"] = _iso(self.last_heartbeat_ms)
        return d


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle event from a queue's event stream or the workers' stream."""

    stream: str
    """``<queue>`` for task events, ``@workers`` for worker events."""
    id: str
    ts_ms: int
    type: str
    task_id: str | None
    queue: str | None
    attempt: int | None
    worker: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ts"] = _iso(self.ts_ms)
        return d


@dataclass(frozen=True, slots=True)
class DeadLetter:
    task_id: str
    queue: str
    name: str
    failed_at: str | None
    attempt: int
    retries: int
    max_retries: int
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Page:
    """A page of results and the cursor of the next (None on the last page).

    A page may hold fewer than ``limit`` items, even none, while ``next_cursor`` is set: each
    request stops after a bounded amount of work (``SCAN_BUDGET``, ``DLQ_BUDGET``).
    ``scans`` and ``examined`` say what this page cost: SCAN calls, records/entries read.
    """

    items: list[Any]
    next_cursor: str | None
    scans: int = 0
    examined: int = 0
    running: list[Any] = field(default_factory=list)
    """The running tasks, on a newest-first listing's first page."""


@dataclass(frozen=True, slots=True)
class BulkResult:
    """Counts of a bulk operation: how many changed, how many were skipped (and why)."""

    done: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "skipped": dict(self.skipped)}


@dataclass(frozen=True, slots=True)
class ScheduledTask:
    task_id: str
    queue: str
    name: str
    due_at: str | None
    kind: str  # "delayed" | "retry"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- helpers ---------------------------------------------------------------------------------


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def merge_infos(name: str, parts: Sequence[QueueInfo]) -> QueueInfo:
    """One queue's state from its partitions' (dtq.partitions): counts summed, the oldest
    waiting age the largest, paused when any partition is."""
    if len(parts) == 1:
        return parts[0]
    depth: dict[int, int] = {}
    for p in parts:
        for band, n in p.depth.items():
            depth[band] = depth.get(band, 0) + n
    ages = [p.oldest_waiting_age_s for p in parts if p.oldest_waiting_age_s is not None]
    return QueueInfo(
        name=name,
        depth=depth,
        scheduled=sum(p.scheduled for p in parts),
        running=sum(p.running for p in parts),
        dlq=sum(p.dlq for p in parts),
        paused=any(p.paused for p in parts),
        oldest_waiting_age_s=max(ages) if ages else None,
    )


def _check_queue_name(name: str) -> None:
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise InvalidRequest(f"bad queue name {name!r}: use letters, digits, '_', '.', '-'")


def _check_listing(queue: str | None, status: str | None, limit: int) -> None:
    """The filters both task listings take (the SCAN one and the newest-first one)."""
    if queue is not None:
        _check_queue_name(queue)
    if status is not None and status not in TaskStatus._value2member_map_:
        raise InvalidRequest(
            f"unknown status {status!r}; one of {', '.join(s.value for s in TaskStatus)}"
        )
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")


def _id_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


async def filled_page(
    fetch: Callable[[str | None, int], Awaitable[Page]], cursor: str | None, limit: int
) -> Page:
    """Follow ``fetch(cursor, room)`` until ``limit`` items or the end: for a caller of its own
    (the CLI) that wants a full page; each call stays bounded, so Redis is never held long."""
    items: list[Any] = []
    scans = examined = 0
    while True:
        page = await fetch(cursor, limit - len(items))
        items += page.items
        scans, examined = scans + page.scans, examined + page.examined
        cursor = page.next_cursor
        if cursor is None or len(items) >= limit:
            return Page(items, cursor, scans, examined)


def _int(value: str | None) -> int:
    """A counter field as an int; 0 when missing or unreadable (never a 500 for a listing)."""
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _chunks(items: Sequence[str], n: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


class Admin:
    """Operator operations. ``async with Admin(settings) as a: ...`` closes its connection."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        redis_client: aredis.Redis | None = None,
        app: App | None = None,
    ) -> None:
        self.settings = settings or load_settings()
        self.keys = Keys(self.settings.key_prefix)
        # Re-sends after a blip (DTQ_CLIENT_RETRIES): reads, and state changes made safe to
        # re-send (docs/faults.md, "Connection blips at the SDK").
        self.redis: aredis.Redis = redis_client or async_redis(
            self.settings.redis_url, retries=self.settings.client_retries, decode_responses=True
        )
        # redis-py's command stubs are unions of bytes/str; this client decodes to str.
        self._r: Any = self.redis
        # With the app, enqueues get each task's declared defaults (queue, priority, limits).
        self.client = AsyncClient(settings=self.settings, redis_client=self.redis, app=app)
        self.scripts = sc.AsyncScripts(self.redis, replay_safe=True)  # (docs/faults.md)
        self._cluster = is_cluster(self.redis)  # (see connection.py)

    async def __aenter__(self) -> Admin:
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
            raise RedisUnavailable(f"Redis unreachable: {exc}") from None

    async def eviction_warning(self) -> str | None:
        """What is wrong with Redis's ``maxmemory-policy`` for dtq (dtq.eviction), or None."""
        return eviction.warning(await eviction.eviction_policy(self._r))

    async def _run(self, call: sc.Call) -> Any:
        try:
            return await self.scripts.run(call)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise RedisUnavailable(f"Redis unreachable: {exc}") from None
        except (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError) as exc:
            raise RedisUnavailable(f"Redis refused the write: {exc}") from None

    # --- queues ----------------------------------------------------------------------------

    async def queue_names(self) -> list[str]:
        """Queues seen under this prefix (enqueued to, or consumed by a known worker); a
        partitioned queue once, by its name (dtq.partitions)."""
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

    async def _queue_exists(self, name: str) -> bool:
        _check_queue_name(name)
        if await self._r.sismember(self.keys.queues, name):
            return True
        return name in await self.queue_names()

    async def _require_queue(self, name: str) -> QueueKeys:
        if not await self._queue_exists(name):
            raise UnknownQueue(f"no queue named {name!r}")
        return self.keys.queue(name)

    async def list_queues(self) -> list[QueueInfo]:
        """Every known queue with its depth per priority, schedule, running, dead letters."""
        return await self.queue_infos(await self.queue_names())

    async def get_queue(self, name: str) -> QueueInfo:
        await self._require_queue(name)
        return await self.queue_info(name)

    async def queue_info(self, name: str) -> QueueInfo:
        return (await self.queue_infos([name]))[0]

    async def queue_infos(self, names: Sequence[str]) -> list[QueueInfo]:
        """The state of each queue in ``names``, a partitioned queue's partitions summed."""
        parts = {n: expand([n], self.settings.queue_partitions) for n in names}
        flat = [p for n in names for p in parts[n]]
        infos = dict(zip(flat, await self._physical_infos(flat), strict=True))
        return [merge_infos(n, [infos[p] for p in parts[n]]) for n in names]

    async def _physical_infos(self, names: Sequence[str]) -> list[QueueInfo]:
        """The state of each queue in ``names``: two pipelined round trips for all of them."""
        per = 2 * len(PRIORITIES) + 3
        async with self._r.pipeline(transaction=False) as pipe:
            for name in names:
                qk = self.keys.queue(name)
                for p in PRIORITIES:
                    pipe.xlen(qk.stream(p))
                    pipe.xinfo_groups(qk.stream(p))
                pipe.zcard(qk.sched)
                pipe.zcard(qk.dlq)
                pipe.exists(qk.paused)
            if not self._cluster:  # a cluster pipeline refuses TIME: sent after it
                pipe.time()
            raw = await pipe.execute(raise_on_error=False)
        raw.extend(await self._cluster_time())
        now = raw[-1]
        if isinstance(now, Exception):
            raise now
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        partial: list[tuple[str, dict[int, int], int, dict[int, str], list[Any]]] = []
        for j, name in enumerate(names):
            part = raw[j * per : (j + 1) * per]
            depth: dict[int, int] = {}
            running = 0
            starts: dict[int, str] = {}
            for i, p in enumerate(PRIORITIES):
                length, groups = part[2 * i], part[2 * i + 1]
                if isinstance(length, Exception):
                    raise length
                pending, start = 0, "-"
                if not isinstance(groups, Exception):
                    for g in groups:
                        if g.get("name") == GROUP:
                            pending = int(g.get("pending", 0))
                            start = "(" + str(g.get("last-delivered-id"))
                depth[p] = max(0, int(length) - pending)
                running += pending
                if depth[p]:
                    starts[p] = start
            for x in part[-3:]:
                if isinstance(x, Exception):
                    raise x
            partial.append((name, depth, running, starts, part[-3:]))
        firsts: list[Any] = []
        if any(starts for _, _, _, starts, _ in partial):
            async with self._r.pipeline(transaction=False) as pipe:
                for name, _, _, starts, _ in partial:
                    qk = self.keys.queue(name)
                    for p, start in starts.items():
                        pipe.xrange(qk.stream(p), min=start, max="+", count=1)
                firsts = await pipe.execute()
        out: list[QueueInfo] = []
        k = 0
        for name, depth, running, starts, (scheduled, dlq, paused) in partial:
            oldest: float | None = None
            for entries in firsts[k : k + len(starts)]:
                if entries:
                    age = max(0.0, (now_ms - _id_ms(entries[0][0])) / 1000)
                    oldest = age if oldest is None else max(oldest, age)
            k += len(starts)
            out.append(
                QueueInfo(
                    name=name,
                    depth=depth,
                    scheduled=int(scheduled),
                    running=running,
                    dlq=int(dlq),
                    paused=bool(paused),
                    oldest_waiting_age_s=oldest,
                )
            )
        return out

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
        changed = False
        for q in await self._physical_of(name):
            changed = await self._pause(self.keys.queue(q)) or changed
        return changed

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
        """Delete the queue's waiting tasks (queued and scheduled), in bounded batches.

        Running tasks finish normally; finished records and dead letters stay.
        """
        await self._require_queue(name)
        queued = scheduled = 0
        for q in await self._physical_of(name):
            q_queued, q_scheduled = await self._purge(self.keys.queue(q), batch, progress)
            queued += q_queued
            scheduled += q_scheduled
        return BulkResult(queued + scheduled, {"queued": queued, "scheduled": scheduled})

    async def _purge(self, qk: QueueKeys, batch: int, progress: Progress | None) -> tuple[int, int]:
        queued = scheduled = 0
        while True:
            call = purge_call(
                qk, batch, self.settings.events_maxlen, nonce=sc.new_nonce(),
                flow_ttl_s=self.settings.result_ttl_s,
            )  # fmt: skip
            res = parse_purge(await self._run(call))
            queued += res.queued
            scheduled += res.scheduled
            if progress is not None:
                progress(res.queued + res.scheduled)
            if not res.more:
                break
        return queued, scheduled

    # --- tasks -----------------------------------------------------------------------------

    async def get_task(self, task_id: str, *, history: bool = False) -> dict[str, Any]:
        """The task's fields (as :class:`dtq.TaskInfo` names them), optionally its history."""
        info = await self.client.get(task_id)
        d = info.to_dict()
        queue, tid = split_task_id(task_id)
        extra = await self._r.hmget(self.keys.queue(queue).task(tid), ["requeues"])
        d["requeues"] = int(extra[0] or 0)
        if history:
            d["history"] = [e.to_dict() for e in await self.task_history(task_id)]
        return d

    async def task_history(self, task_id: str, limit: int = HISTORY_SCAN) -> list[Event]:
        """The task's lifecycle events still in its queue's capped event stream, oldest first.

        Reads the stream newest first, at most ``limit`` entries.
        """
        queue, tid = split_task_id(task_id)
        key = self.keys.queue(queue).events
        found: list[Event] = []
        upper = "+"
        read = 0
        while read < limit:
            chunk = await self._r.xrevrange(key, max=upper, min="-", count=1000)
            if not chunk:
                break
            for eid, fields in chunk:
                if fields.get("tid") == tid:
                    found.append(self._event(queue, eid, fields))
            read += len(chunk)
            upper = "(" + chunk[-1][0]
            if found and found[-1].type == "enqueued":
                break
        found.reverse()
        return found

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
        _check_listing(queue, status, limit)
        # A partitioned queue's records are in several slots: walked like every queue's, with
        # a pattern matching its partitions' keys only (dtq.partitions).
        parted = queue is not None and self.settings.queue_partitions.get(queue, 1) > 1
        one = None if parted else queue
        if one is not None and status in ("failed", "scheduled"):
            return await self._list_zset(one, status, name, cursor, limit)
        scan_cursor, skip = self._parse_cursor(cursor)
        if ":" in scan_cursor and (one is not None or not self._cluster):
            # "<primary>:<cursor>" is a walk over every primary of a cluster only
            raise InvalidRequest(f"bad cursor {cursor!r}")
        p = _glob_escape(self.keys.prefix)
        if one is not None:
            match = _glob_escape(self.keys.queue(one).task_base) + "*"
        elif queue is not None:
            match = f"{p}:{{{p}:{_glob_escape(queue)}[}}~]*:t:*"
        else:
            match = f"{p}:{{{p}:*}}:t:*"
        items: list[TaskInfo] = []
        scans = examined = 0
        # One queue's records are in its slot's node; across queues the walk visits every
        # primary of a cluster (dtq.cluster): its cursor then reads "<primary>:<cursor>".
        while True:
            if one is not None:
                base = self.keys.queue(one).task_base
                at, keys = await ascan_slot(self._r, base, int(scan_cursor), match, 1000)
                nxt = str(at)
            else:
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
        """Tasks newest first from the queues' event streams (see :mod:`dtq.task_index`);
        ``Page.running`` holds the running tasks on the first page (no cursor)."""
        _check_listing(queue, status, limit)
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

    @staticmethod
    def _parse_cursor(cursor: str | None) -> tuple[str, int]:
        if not cursor:
            return "0", 0
        head, _, tail = cursor.partition(".")
        node, _, at = head.rpartition(":")  # "<primary>:<cursor>" on a cluster (dtq.cluster)
        if (
            not at.isdigit()
            or (node and not node.isdigit())
            or (tail and not tail.isdigit())
            or int(at) >= 2**64
        ):
            raise InvalidRequest(f"bad cursor {cursor!r}")
        return head, int(tail or 0)

    @classmethod
    def _position(cls, cursor: str | None) -> tuple[str, int]:
        """A cursor of a listing that is no SCAN walk (no "<primary>:" part)."""
        head, skip = cls._parse_cursor(cursor)
        if ":" in head:
            raise InvalidRequest(f"bad cursor {cursor!r}")
        return head, skip

    async def _filter_records(
        self, keys: Sequence[str], status: str | None, name: str | None
    ) -> list[TaskInfo]:
        if not keys:
            return []
        async with self._r.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.hgetall(k)
            recs = await pipe.execute()
        decls = await self._declared_of(keys, recs)
        out: list[TaskInfo] = []
        for k, rec, decl in zip(keys, recs, decls, strict=True):
            if not rec or "status" not in rec:
                continue
            if status is not None and rec["status"] != status:
                continue
            if name is not None and rec.get("name") != name:
                continue
            info = self._info_from_key(k, rec, decl)
            if info is not None:
                out.append(info)
        out.sort(key=lambda t: t.id)
        return out

    async def _declared_of(
        self, keys: Sequence[str], recs: Sequence[dict[str, str]]
    ) -> list[str | None]:
        """The published declaration of each record still waiting for one (dtq.declared),
        None for the others; one pipelined round trip, and none when no record waits."""
        want = [
            (i, k)
            for i, (k, rec) in enumerate(zip(keys, recs, strict=True))
            if rec and pending_declared(rec)
        ]
        out: list[str | None] = [None] * len(keys)
        if want:
            async with self._r.pipeline(transaction=False) as pipe:
                for i, k in want:
                    # P:{q}:t:<tid> -> P:{q}:decl (dtq/keys.py)
                    pipe.hget(k.rpartition(":t:")[0] + ":decl", recs[i].get("name", ""))
                for (i, _), raw in zip(want, await pipe.execute(), strict=True):
                    out[i] = raw
        return out

    def _info_from_key(
        self, key: str, rec: dict[str, str], declared: str | None = None
    ) -> TaskInfo | None:
        # key = P:{P:queue}:t:<tid>
        head, sep, tid = key.rpartition(":t:")
        start = head.find("{" + self.keys.prefix + ":")
        if not sep or start < 0 or not head.endswith("}"):
            return None
        queue = head[start + len(self.keys.prefix) + 2 : -1]
        try:
            return TaskInfo.from_record(make_task_id(queue, tid), queue, rec, declared)
        except (ValueError, KeyError):
            return None

    async def _list_zset(
        self, queue: str, status: str, name: str | None, cursor: str | None, limit: int
    ) -> Page:
        """Failed or scheduled tasks of one queue from its zset: one range read and one
        pipelined read of the records per chunk, at most ``DLQ_BUDGET`` entries per page."""
        qk = self.keys.queue(queue)
        key = qk.dlq if status == "failed" else qk.sched
        pos = int(self._position(cursor)[0]) if cursor else 0
        items: list[dict[str, Any]] = []
        examined = 0
        chunk = max(limit, 200)
        while len(items) < limit and examined < DLQ_BUDGET:
            n = min(chunk, DLQ_BUDGET - examined)
            tids: list[str] = await self._r.zrange(key, pos, pos + n - 1)
            recs = await self._records(qk, tids)
            decls = await self._declared_of([qk.task(t) for t in tids], recs)
            examined += len(tids)
            for i, (tid, rec) in enumerate(zip(tids, recs, strict=True)):
                if rec and rec.get("status") == status and name in (None, rec.get("name")):
                    info = self._info(queue, tid, rec, decls[i])
                    if info is not None:
                        items.append(info.to_dict())
                    if len(items) >= limit:
                        return Page(items, str(pos + i + 1), 0, examined)
            pos += len(tids)
            if len(tids) < n:
                return Page(items, None, 0, examined)
        return Page(items, str(pos), 0, examined)

    async def _records(self, qk: QueueKeys, tids: Sequence[str]) -> list[dict[str, str]]:
        if not tids:
            return []
        async with self._r.pipeline(transaction=False) as pipe:
            for tid in tids:
                pipe.hgetall(qk.task(tid))
            recs: list[dict[str, str]] = await pipe.execute()
        return recs

    @staticmethod
    def _info(
        queue: str, tid: str, rec: dict[str, str], declared: str | None = None
    ) -> TaskInfo | None:
        try:
            return TaskInfo.from_record(make_task_id(queue, tid), queue, rec, declared)
        except (ValueError, KeyError):
            return None  # a record this version cannot read is left out, not a 500

    async def cancel(self, task_id: str, reason: str = CANCEL_REASON) -> dict[str, Any]:
        """Cancel through the SDK's transition; returns the outcome and the task's status."""
        split_task_id(task_id)
        if is_flow_id(task_id):  # a workflow (docs/workflows.md): the flow and its steps
            before = (await self.client.get(task_id)).status.value
            changed = await self.client.cancel(task_id, reason)
            outcome = "cancelled" if changed else "unchanged"
            return {"id": task_id, "outcome": outcome, "status": "cancelled" if changed else before}
        call = self.client._cancel_call(task_id, reason)
        res = sc.parse_cancel(await self._run(call))
        if res.outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        return {"id": task_id, "outcome": res.outcome, "status": res.status}

    async def retry(self, task_id: str, *, max_retries: int | None = None) -> dict[str, Any]:
        """Run a failed, cancelled or expired task again under the same id (keeps history)."""
        queue, tid = split_task_id(task_id)
        qk = self.keys.queue(queue)
        res = await self._requeue(qk, [tid], max_retries, RETRYABLE)
        outcome = res[0]
        if outcome == "missing":
            raise UnknownTask(f"no task {task_id}")
        if outcome != "requeued":
            raise Conflict(
                f"task {task_id} is {outcome}; only {', '.join(RETRYABLE)} tasks can be retried",
                outcome,
            )
        return {"id": task_id, "status": "queued"}

    async def _requeue(
        self,
        qk: QueueKeys,
        tids: Sequence[str],
        max_retries: int | None,
        allowed: Sequence[str] = ("failed",),
    ) -> list[str]:
        if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
        ):
            raise InvalidRequest("max_retries must be a non-negative integer")
        call = dlq_requeue_call(
            qk,
            tids,
            events_maxlen=self.settings.events_maxlen,
            max_retries=max_retries,
            allowed=allowed,
            nonce=sc.new_nonce(),  # a re-send after a blip gets this call's own answer
        )
        return sc.parse_strings(await self._run(call))

    # --- dead letters ----------------------------------------------------------------------

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
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
        if queue is not None:
            _check_queue_name(queue)
        queues = await self._physical_of(queue)
        qi, off = self._position(cursor)
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
        """Dead letters of one queue from ``offset`` (newest first), reading at most ``budget``
        entries in chunks of at least ``want`` (one range read and one pipelined read each).

        Returns the letters, the next offset (None at the end) and the entries examined.
        """
        qk = self.keys.queue(queue)
        out: list[DeadLetter] = []
        pos = offset
        seen = 0
        while len(out) < want and seen < budget:
            n = min(max(want, 200), budget - seen)
            entries = await self._r.zrevrange(qk.dlq, pos, pos + n - 1, withscores=True)
            if not entries:
                return out, None, seen
            async with self._r.pipeline(transaction=False) as pipe:
                for tid, _ in entries:
                    pipe.hmget(qk.task(tid), ["name", "attempt", "retries", "maxr", "error"])
                recs = await pipe.execute()
            seen += len(entries)
            for i, ((tid, score), r) in enumerate(zip(entries, recs, strict=True)):
                if r[0] is None:
                    continue  # record expired; retention removes the entry
                if name is not None and r[0] != name:
                    continue
                if error is not None and error.lower() not in (r[4] or "").lower():
                    continue
                out.append(
                    DeadLetter(
                        task_id=make_task_id(queue, tid),
                        queue=logical(queue),
                        name=r[0],
                        failed_at=_iso(score),
                        attempt=_int(r[1]),
                        retries=_int(r[2]),
                        max_retries=_int(r[3]),
                        error=r[4],
                    )
                )
                if len(out) >= want:
                    return out, pos + i + 1, seen
            pos += len(entries)
            if len(entries) < n:
                return out, None, seen
        return out, pos, seen

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
        async with self._r.pipeline(transaction=False) as pipe:
            for tid in tids:
                pipe.hmget(qk.task(tid), ["name", "error"])
            recs = await pipe.execute()
        return [
            tid
            for tid, (n, e) in zip(tids, recs, strict=True)
            if (name is None or n == name) and (error is None or error.lower() in (e or "").lower())
        ]

    async def dlq_count(self, queue: str | None = None) -> int:
        queues = await self._physical_of(queue)
        async with self._r.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zcard(self.keys.queue(q).dlq)
            return sum(int(x) for x in await pipe.execute())

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
        """Requeue dead letters: the given ids, or all matching the filters (all when none).

        Each keeps its id, record and history; ``max_retries`` sets a new retry budget.
        """
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
        res = await self.dlq_requeue([task_id], max_retries=max_retries)
        self._single(task_id, res)

    async def dlq_discard_one(self, task_id: str) -> None:
        res = await self.dlq_discard([task_id])
        self._single(task_id, res)

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
        skipped: dict[str, int] = {}

        async def apply(qk: QueueKeys, tids: Sequence[str]) -> None:
            nonlocal done
            if op == "requeue":
                outcomes = await self._requeue(qk, tids, max_retries)
                ok = "requeued"
            else:
                call = dlq_discard_call(
                    qk, tids, events_maxlen=self.settings.events_maxlen, nonce=sc.new_nonce()
                )
                outcomes = sc.parse_strings(await self._run(call))
                ok = "discarded"
            for o in outcomes:
                if o == ok:
                    done += 1
                else:
                    skipped[o] = skipped.get(o, 0) + 1
            if progress is not None:
                progress(len(tids))

        if task_ids is not None:
            by_queue: dict[str, list[str]] = {}
            for task_id in task_ids:
                q, tid = split_task_id(task_id)
                by_queue.setdefault(q, []).append(tid)
            for q, tids in by_queue.items():
                _check_queue_name(logical(q))
                for chunk in _chunks(tids, BATCH):
                    # Ids outside the filters are left alone (skipped as "filtered").
                    picked = await self._dlq_filter(q, chunk, queue, name, error)
                    if len(picked) < len(chunk):
                        skipped["filtered"] = skipped.get("filtered", 0) + len(chunk) - len(picked)
                    if picked:
                        await apply(self.keys.queue(q), picked)
        else:
            if queue is not None:
                _check_queue_name(queue)
            queues = await self._physical_of(queue)
            for q in queues:
                # The zset shrinks as tasks leave it, so collect first, then apply.
                batches = [b async for b in self._dlq_matching(q, name, error)]
                for b in batches:
                    await apply(self.keys.queue(q), b)
        return BulkResult(done, skipped)

    # --- workers ---------------------------------------------------------------------------

    async def _cluster_time(self) -> list[Any]:
        """[TIME] on a cluster (whose pipelines refuse it), else [] (it was pipelined)."""
        return [await self._r.time()] if self._cluster else []

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
                    active_tasks=int(h.get("active_tasks") or 0),
                    concurrency=int(h["concurrency"]) if h.get("concurrency") else None,
                    tasks_processed=int(h.get("tasks_processed") or 0),
                    tasks_failed=int(h.get("tasks_failed") or 0),
                    tasks_retried=int(h.get("tasks_retried") or 0),
                    started_at=_iso(int(h["started_at"])) if h.get("started_at") else None,
                )
            )
        return out

    # --- schedules -------------------------------------------------------------------------

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

        _check_queue_name(queue)
        changed, info = await schedules.aset_enabled(self.client, name, queue, enabled)
        return {**info.to_dict(), "changed": changed}

    async def run_schedule(self, queue: str, name: str) -> dict[str, Any]:
        """Enqueue one schedule's task now; the new task's fields."""
        from dtq import schedules

        _check_queue_name(queue)
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
            ((score, q, tid) for q, entries in zip(queues, per_queue, strict=True)
             for tid, score in entries),
        )[:limit]  # fmt: skip
        async with self._r.pipeline(transaction=False) as pipe:
            for _, q, tid in soonest:
                pipe.hmget(self.keys.queue(q).task(tid), ["name", "retries"])
            recs = await pipe.execute() if soonest else []
        out: list[ScheduledTask] = []
        for (score, q, tid), (nm, retries) in zip(soonest, recs, strict=True):
            out.append(
                ScheduledTask(
                    task_id=make_task_id(q, tid),
                    queue=logical(q),
                    name=nm or "",
                    due_at=_iso(score),
                    kind="retry" if _int(retries) > 0 else "delayed",
                )
            )
        out.sort(key=lambda s: s.due_at or "")
        return out[:limit]

    # --- events ----------------------------------------------------------------------------

    def _event(self, stream: str, eid: str, f: dict[str, str]) -> Event:
        if stream == "@workers":
            return Event(
                stream, eid, _id_ms(eid), f.get("type", ""), None, None, None,
                f.get("worker") or None, f.get("detail", ""),
            )  # fmt: skip
        tid = f.get("tid") or ""
        attempt = f.get("attempt") or ""
        return Event(
            stream=stream,
            id=eid,
            ts_ms=_id_ms(eid),
            type=f.get("type", ""),
            task_id=make_task_id(stream, tid) if tid else None,
            queue=logical(stream),
            attempt=int(attempt) if attempt.isdigit() else None,
            worker=f.get("worker") or None,
            detail=f.get("detail", ""),
        )

    def _event_keys(self, queues: Sequence[str]) -> dict[str, str]:
        keys = {self.keys.queue(q).events: q for q in queues}
        keys[self.keys.worker_events] = "@workers"
        return keys

    async def recent_events(
        self, *, queues: Sequence[str] | None = None, since_ms: int | None = None, limit: int = 1000
    ) -> list[Event]:
        """Events newer than ``since_ms`` (default: the last ``limit`` of each stream)."""
        qs = (
            await self.physical_names()
            if queues is None
            else expand(queues, self.settings.queue_partitions)
        )
        out: list[Event] = []
        for key, stream in self._event_keys(qs).items():
            lo = "-" if since_ms is None else str(since_ms)
            entries = await self._r.xrevrange(key, max="+", min=lo, count=limit)
            out.extend(self._event(stream, eid, f) for eid, f in entries)
        out.sort(key=lambda e: (e.ts_ms, e.id))
        return out

    async def read_events(
        self, cursors: dict[str, str] | None, *, block_ms: int = 5000, count: int = 500
    ) -> tuple[list[Event], dict[str, str]]:
        """Wait up to ``block_ms`` for new events on every queue's stream and the workers'.

        ``cursors`` maps stream keys to the last id seen (None: start from now). Returns the
        events and the cursors to pass next time; queues that appear later are picked up.
        """
        qs = await self.physical_names()
        keys = self._event_keys(qs)
        cur = dict(cursors or {})
        fresh = cursors is None
        for k in keys:
            if k not in cur:
                # A queue seen for the first time mid-stream is read from its start of now.
                cur[k] = "$" if fresh else "0-0"
        # "$" cannot be kept between calls: resolve it to the stream's last id.
        for k, v in list(cur.items()):
            if v == "$":
                last = await self._r.xrevrange(k, count=1)
                cur[k] = last[0][0] if last else "0-0"
        if self._cluster:
            res = await self._xread_each(keys, cur, count, block_ms)
        else:
            res = await self._r.xread(
                {k: cur[k] for k in keys}, count=count, block=block_ms or None
            )
        events: list[Event] = []
        for key, entries in res or []:
            for eid, f in entries:
                events.append(self._event(keys[key], eid, f))
                cur[key] = eid
        events.sort(key=lambda e: (e.ts_ms, e.id))
        return events, cur

    async def _xread_each(
        self, keys: Iterable[str], cur: dict[str, str], count: int, block_ms: int
    ) -> list[Any]:
        """On a cluster, where one XREAD cannot span the queues' slots: one XREAD per stream,
        in parallel, until the first has events (the others are cancelled: their cursors stay,
        so the next call reads what they would have)."""
        reads = [
            asyncio.ensure_future(self._r.xread({k: cur[k]}, count=count, block=block_ms or None))
            for k in keys
        ]
        try:
            pending = set(reads)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.result() for t in done):
                    break
        finally:
            for t in reads:
                t.cancel()
        return [x for t in reads if t.done() and not t.cancelled() for x in t.result() or []]

    async def events_after(self, last_id: str, limit: int = 5000) -> tuple[list[Event], bool]:
        """Events of every stream after stream id ``last_id`` (a client's ``Last-Event-ID``),
        oldest first, at most ``limit``; the flag says whether more were left out.

        One ``XRANGE`` per stream, pipelined (a cluster splits it by slot). Stream ids are per
        stream, so events of another stream in the same millisecond as ``last_id`` may be
        missed or repeated; later ones are all there.
        """
        keys = self._event_keys(await self.physical_names())
        async with self._r.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.xrange(k, min="(" + last_id, max="+", count=limit)
            chunks: list[list[tuple[str, dict[str, str]]]] = await pipe.execute()
        out = [
            self._event(keys[k], eid, f)
            for k, chunk in zip(keys, chunks, strict=True)
            for eid, f in chunk
        ]
        out.sort(key=lambda e: (e.ts_ms, e.id))
        return out[:limit], len(out) > limit or any(len(c) >= limit for c in chunks)

    async def throughput(self, *, window_s: int = 600, bucket_s: int = 10) -> dict[str, Any]:
        """Finished runs per time bucket over the last ``window_s`` seconds, from the events.

        Bounded by the event streams' caps (``DTQ_EVENTS_MAXLEN`` per queue).
        """
        if not (bucket_s >= 1 and 1 <= window_s <= 86_400):
            raise InvalidRequest("need bucket_s >= 1 and 1 <= window_s <= 86400")
        bucket_s = min(bucket_s, window_s)
        now_ms = int(time.time() * 1000)
        start = now_ms - window_s * 1000
        start -= start % (bucket_s * 1000)
        n = (now_ms - start) // (bucket_s * 1000) + 1
        kinds = ("succeeded", "failed", "retried", "enqueued")
        series = {k: [0] * n for k in kinds}
        for q in await self.physical_names():
            key = self.keys.queue(q).events
            lo = str(start)
            while True:
                entries = await self._r.xrange(key, min=lo, max="+", count=5000)
                for eid, f in entries:
                    t = f.get("type")
                    if t in series:
                        series[t][(_id_ms(eid) - start) // (bucket_s * 1000)] += 1
                if len(entries) < 5000:
                    break
                lo = "(" + entries[-1][0]
        return {
            "start": _iso(start),
            "bucket_s": bucket_s,
            "buckets": [_iso(start + i * bucket_s * 1000) for i in range(n)],
            "series": series,
        }


def _as_dict(obj: Any) -> dict[str, Any]:
    if hasattr(obj, "to_dict"):
        return dict(obj.to_dict())
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    return dict(vars(obj))


def dumps(obj: Any) -> str:
    """JSON for ``--json`` output and the API: dataclasses and datetimes handled."""

    def default(o: Any) -> Any:
        if hasattr(o, "to_dict"):
            return o.to_dict()
        if isinstance(o, datetime):
            return o.isoformat()
        return str(o)

    return json.dumps(obj, default=default, indent=2)
