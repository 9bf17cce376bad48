"""Task states and the read-only views of a task (and of a queue's fair groups) the SDK returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic

from typing_extensions import TypeVar

from dtq.codec import loads_stored
from dtq.declared import fill as fill_declared
from dtq.store.partitions import logical
from dtq.store.record import Field, with_defaults


class TaskStatus(StrEnum):
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.EXPIRED}
)


MAX_TRACEBACK_CHARS = 8192
"""Most characters of a failure's traceback kept in its task record."""


def clip_traceback(text: str, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters: the head (where it began) and the tail (the
    innermost frames and the exception itself) are kept, the middle is cut."""
    if len(text) <= limit:
        return text
    marker = "\n... ({} characters cut) ...\n"
    room = limit - len(marker.format(len(text)))
    head = room // 4
    tail = room - head
    return text[:head] + marker.format(len(text) - head - tail) + text[len(text) - tail :]


def ms_to_datetime(raw: str | float | None) -> datetime | None:
    """A stored time (server milliseconds) as a datetime; None when unset, or when it is not a
    time a datetime can hold (a record written before times were bounded, or by hand): a reader
    shows such a task rather than failing on it."""
    if raw is None or raw == "":
        return None
    try:  # (float: also a number stored as float text, "1.7e12"; exact for any ms time)
        return datetime.fromtimestamp(float(raw) / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None


def _flow_id(field_: str) -> str | None:
    """The public flow id of a step record's ``flow`` field (``P:{P:home}:f:<ftid>|<i>``)."""
    head, sep, ftid = field_.rpartition("|")[0].rpartition("}:f:")
    if not sep or ":" not in head:
        return None
    return f"{head.rsplit(':', 1)[1]}:{ftid}"


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """Everything known about one task, as stored in its record."""

    id: str
    name: str
    queue: str
    status: TaskStatus
    priority: int
    attempt: int
    """Runs started so far; also the fencing token of the current run."""
    retries: int
    """Failed runs so far (also ``failures``); a ``Fail`` counts too. Kept by this name for
    compatibility: ``failures`` and ``retries_left`` read right."""
    max_retries: int
    interruptions: int
    args: list[Any]
    kwargs: dict[str, Any]
    result: Any = None
    error: str | None = None
    worker_id: str | None = None
    timeout: float | None = None
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    due_at: datetime | None = None
    expires_at: datetime | None = None
    idempotency_key: str | None = None
    cancel_requested: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, Any] | None = None
    """The last ``current_task().progress(...)`` report: current, total, message, attempt."""
    defaults: str | None = None
    """Where ``max_retries``, ``timeout`` and ``expires_at`` come from while the task waits for
    its first claim, when its enqueue left some unset (a client that did not know the task):
    ``"declared"``, a worker's ``@app.task`` declaration; ``"default"``, no worker declared the
    name yet, so dtq's defaults. The claim fixes them in the record; then (and for every task
    whose enqueue gave or knew them) None: the values shown are the task's own."""
    traceback: str | None = None
    """The traceback of the last failed run's exception (at most MAX_TRACEBACK_CHARS), if the
    last failure had one (a ``Retry`` request or a timeout has none)."""
    failures: int = 0
    """Failed runs so far (the same count as ``retries``)."""
    retries_left: int = 0
    """Retries the task may still spend: ``max_retries`` minus ``failures``, at least 0."""
    steps: list[dict[str, Any]] | None = None
    """A workflow's steps (docs/workflows.md): index, task id and status ("waiting" until the
    steps it waits for succeeded); None for a task."""
    tree: Any = None
    """A workflow's shape: nested ``{"chain"|"group"|"chord": [...]}`` of step indices."""
    flow: str | None = None
    """A workflow step's flow id (``<home queue>:wf...``); None for a task of no flow."""
    group: str | None = None
    """The task's fair group within its queue (docs/groups.md); None when it has none."""

    @classmethod
    def from_record(
        cls, task_id: str, queue: str, rec: dict[str, str], declared: str | None = None
    ) -> TaskInfo:
        """``declared``: the task name's published declaration (``P:{q}:decl``), read by the
        caller when the record still leaves values to it (:func:`dtq.declared.pending`)."""
        defaults = None
        if rec.get(Field.LEFT_TO_DECLARATION):
            rec, defaults = fill_declared(rec, declared)
        rec = with_defaults(rec)  # the fields a record leaves out at their defaults
        args = loads_stored(rec.get(Field.ARGS, "[]"))
        return cls(
            id=task_id,
            name=rec.get(Field.NAME, ""),
            queue=logical(queue),  # a partition's task belongs to its queue (dtq.store.partitions)
            status=TaskStatus(rec.get(Field.STATUS, "queued")),
            priority=int(rec[Field.PRIORITY]),
            attempt=int(rec[Field.ATTEMPT]),
            retries=int(rec[Field.RETRIES]),
            max_retries=int(rec[Field.MAX_RETRIES]),
            interruptions=int(rec[Field.INTERRUPTIONS]),
            args=args if isinstance(args, list) else [args],  # (undecodable: in a list)
            kwargs=loads_stored(rec[Field.KWARGS]) if rec.get(Field.KWARGS) else {},
            result=loads_stored(rec[Field.RESULT]) if Field.RESULT in rec else None,
            error=rec.get(Field.ERROR),
            worker_id=rec.get(Field.WORKER),
            timeout=float(rec[Field.TIMEOUT]) if rec.get(Field.TIMEOUT) else None,
            enqueued_at=ms_to_datetime(rec.get(Field.ENQUEUED)),
            started_at=ms_to_datetime(rec.get(Field.STARTED)),
            finished_at=ms_to_datetime(rec.get(Field.FINISHED)),
            due_at=ms_to_datetime(rec.get(Field.DUE)),
            expires_at=ms_to_datetime(rec.get(Field.EXPIRES)),
            idempotency_key=rec.get(Field.IDEMPOTENCY_KEY),
            cancel_requested=Field.CANCEL in rec,
            metadata=loads_stored(rec[Field.META]) if rec.get(Field.META) else {},
            progress=loads_stored(rec[Field.PROGRESS]) if rec.get(Field.PROGRESS) else None,
            defaults=defaults,
            traceback=rec.get(Field.TRACEBACK),
            failures=int(rec[Field.RETRIES]),
            retries_left=max(0, int(rec[Field.MAX_RETRIES]) - int(rec[Field.RETRIES])),
            flow=_flow_id(rec[Field.FLOW]) if Field.FLOW in rec else None,
            group=rec.get(Field.GROUP) or None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (timestamps as ISO 8601), as the HTTP API and ``--json`` show it."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, TaskStatus):
                value = value.value
            elif value is None and name in ("steps", "tree", "flow"):
                continue  # a task, not a workflow: its form is unchanged
            out[name] = value
        return out


R = TypeVar("R", default=Any)


@dataclass(frozen=True, slots=True)
class TaskHandle(Generic[R]):
    """What enqueue returns: the task's id, plus whether this call created it.

    Typed by the task's result when enqueued through its :class:`dtq.app.Task` object
    (``client.enqueue(send_email, ...)`` gives a ``TaskHandle[dict]``, and
    ``client.result(handle)`` a ``dict``); by name, a ``TaskHandle[Any]``.
    """

    id: str
    queue: str
    status: TaskStatus
    created: bool = True


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One fair group of a queue (docs/groups.md), its partitions summed: what
    ``client.groups(queue)`` lists."""

    __pydantic_config__ = {"use_attribute_docstrings": True}  # descriptions in dtq-api's schema
    group: str
    """The group's name; ``""`` for the queue's tasks enqueued without a group."""
    waiting: int
    """Tasks of the group waiting to start (queued, in every priority band)."""
    running: int
    """Tasks of the group a worker runs now."""
    paused: bool
    """Held by ``pause_group``: no task of the group starts until ``resume_group``."""
    oldest_waiting_s: float | None
    """How long the group's oldest waiting task has waited since its enqueue (seconds, by the
    Redis clock); None when none waits."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GroupPage:
    """A page of :class:`GroupInfo` and the cursor of the next (None on the last page). Each
    call does bounded work, so a page may hold fewer groups than asked for, even none, while
    ``next_cursor`` is set."""

    items: list[GroupInfo]
    next_cursor: str | None
    examined: int = 0
    """Group names this page looked up (its cost: each is a few reads per partition)."""
