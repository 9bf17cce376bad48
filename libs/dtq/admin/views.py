"""What the operator operations answer: plain frozen dataclasses, also the API's response models
(FastAPI reads them through pydantic; attribute docstrings become field descriptions)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import Field as DataclassField
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from pydantic import ConfigDict

from dtq.admin.common import id_ms
from dtq.models import TaskInfo, ms_to_datetime
from dtq.store.keys import make_task_id
from dtq.store.partitions import logical
from dtq.store.record import Field


def task_info(
    queue: str,
    tid: str,
    rec: dict[str, str],
    declared: str | None = None,
    *,
    status: str | None = None,
    name: str | None = None,
) -> TaskInfo | None:
    """The task of a record when it has the ``status`` and ``name`` asked for (any when None);
    None otherwise, for none, or for one this version cannot read (left out of a listing, not
    a 500)."""
    if Field.STATUS not in rec or status not in (None, rec[Field.STATUS]):
        return None
    if name not in (None, rec.get(Field.NAME)):
        return None
    try:
        return TaskInfo.from_record(make_task_id(queue, tid), queue, rec, declared)
    except (ValueError, KeyError):
        return None


def iso(ms: float | None) -> str | None:
    dt = ms_to_datetime(ms)  # None for a time no datetime holds (a bad record is still listed)
    return None if dt is None else dt.isoformat()


class View:
    """The base of what an operation answers: ``to_dict`` for ``--json``, and for the API's
    schema, attribute docstrings as descriptions and every field required (always sent)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, DataclassField[Any]]]
    __pydantic_config__ = ConfigDict(
        use_attribute_docstrings=True, json_schema_serialization_defaults_required=True
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class QueueInfo(View):
    """One queue as an operator sees it."""

    name: str
    depth: dict[int, int]
    """Waiting (queued, not yet taken) tasks per priority band ('9'..'0')."""
    queued: int
    """Waiting tasks in every band (the sum of ``depth``)."""
    scheduled: int
    running: int
    """Entries taken by a worker and not yet finished (the group's pending list)."""
    dlq: int
    paused: bool
    oldest_waiting_age_s: float | None
    """Age of the oldest waiting entry (since it became ready to run), None when none waits."""
    active_groups: int = 0
    """Fair groups with waiting or running tasks (docs/groups.md); of a partitioned queue, the
    partitions' counts summed (a group active in two partitions counts twice)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "depth": {str(p): n for p, n in self.depth.items()}}


def merge_infos(name: str, parts: Sequence[QueueInfo]) -> QueueInfo:
    """One queue's state from its partitions' (dtq.store.partitions): counts summed, the oldest
    waiting age the largest, paused when any partition is."""
    if len(parts) == 1:
        return parts[0]
    depth = {band: sum(p.depth.get(band, 0) for p in parts) for band in parts[0].depth}
    ages = [p.oldest_waiting_age_s for p in parts if p.oldest_waiting_age_s is not None]
    return QueueInfo(
        name=name,
        depth=depth,
        queued=sum(p.queued for p in parts),
        scheduled=sum(p.scheduled for p in parts),
        running=sum(p.running for p in parts),
        dlq=sum(p.dlq for p in parts),
        paused=any(p.paused for p in parts),
        oldest_waiting_age_s=max(ages) if ages else None,
        active_groups=sum(p.active_groups for p in parts),
    )


@dataclass(frozen=True, slots=True)
class WorkerInfo(View):
    """A worker's last heartbeat and the observer's verdict on its liveness."""

    worker_id: str
    live: bool
    stale: bool
    """Not live: its last heartbeat is older than 3 heartbeat intervals (or it stopped)."""
    last_heartbeat_ms: int
    last_heartbeat: str | None
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
    tasks: list[str] = field(default_factory=list)
    """The task names the worker can run (its app's registry, published with its heartbeat)."""


@dataclass(frozen=True, slots=True)
class Event(View):
    """One lifecycle event from a queue's event stream or the workers' stream."""

    stream: str
    """``<queue>`` for task events, ``@workers`` for worker events."""
    id: str
    ts_ms: int
    ts: str | None
    type: str
    task_id: str | None
    queue: str | None
    attempt: int | None
    worker: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class DeadLetter(View):
    task_id: str
    queue: str
    name: str
    failed_at: str | None
    attempt: int
    retries: int
    max_retries: int
    error: str | None


@dataclass(frozen=True, slots=True)
class Page:
    """A page of results and the cursor of the next (None on the last page); bounded work per
    request, so a page may be short, even empty, while ``next_cursor`` is set. ``scans`` and
    ``examined`` say what it cost: SCAN calls, records/entries read."""

    items: list[Any]
    next_cursor: str | None
    scans: int = 0
    examined: int = 0
    running: list[Any] = field(default_factory=list)
    """The running tasks, on a newest-first listing's first page."""


@dataclass(frozen=True, slots=True)
class BulkResult(View):
    """Counts of a bulk operation: how many changed, how many were skipped (and why)."""

    done: int = 0
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScheduledTask(View):
    task_id: str
    queue: str
    name: str
    due_at: str | None
    kind: str  # "delayed" | "retry"


# --- helpers ---------------------------------------------------------------------------------


def events_from(stream: str, eid: str, f: dict[str, str]) -> list[Event]:
    """The events of one entry of a queue's event stream (``stream`` is the queue) or the
    workers', in order: one, or a batch whose ``tid`` and ``attempt`` fields hold several,
    space-separated (lua/includes/emit_batch.lua), each with the entry's id."""
    tids = f.get("tid") or ""
    if " " not in tids or stream == "@workers":
        return [event_from(stream, eid, f)]
    attempts = (f.get("attempt") or "").split(" ")
    return [
        event_from(stream, eid, dict(f, tid=tid, attempt=attempts[i] if i < len(attempts) else ""))
        for i, tid in enumerate(tids.split(" "))
    ]


def entry_has_task(f: dict[str, str], tid: str) -> bool:
    """Whether an event-stream entry (one event or a batch, see :func:`events_from`) is about
    task ``tid``."""
    tids = f.get("tid") or ""
    return tids == tid or (" " in tids and tid in tids.split(" "))


def event_from(stream: str, eid: str, f: dict[str, str]) -> Event:
    """One event, from an entry that holds one (see :func:`events_from`)."""
    task_event = stream != "@workers"
    tid = (f.get("tid") or "") if task_event else ""
    attempt = (f.get("attempt") or "") if task_event else ""
    return Event(
        stream=stream,
        id=eid,
        ts_ms=id_ms(eid),
        ts=iso(id_ms(eid)),
        type=f.get("type", ""),
        task_id=make_task_id(stream, tid) if tid else None,
        queue=logical(stream) if task_event else None,
        attempt=int(attempt) if attempt.isdigit() else None,
        worker=f.get("worker") or None,
        detail=f.get("detail", ""),
    )


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
