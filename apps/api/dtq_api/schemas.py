"""Request and response bodies of the HTTP API (pydantic), so the OpenAPI document is complete;
the other answers are dtq.admin's views. The task's model allows extra fields: it grows with the
SDK's ``TaskInfo``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
)

from dtq.admin.views import Event, QueueInfo, ScheduledTask
from dtq.models import TaskStatus

# A task of partition i > 0 of a partitioned queue ends "~i" (dtq.store.partitions).
QUEUE_RE = r"^[A-Za-z0-9_.\-]{1,100}$"
TASK_ID_RE = r"^[A-Za-z0-9_.\-]{1,100}:[A-Za-z0-9_\-]{1,100}(~[1-9][0-9]{0,2})?$"
# Strict numbers: in a union a too-long digit string must not fall through to int 0.
NO_CONTROL_RE = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]+$"  # dtq.settings.CONTROL_RE, negated
T = TypeVar("T")
Scalar = Annotated[str, Field(max_length=200)] | StrictInt | StrictFloat | StrictBool | None


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. not_found, conflict.")
    message: str = Field(description="One line for a human.")


class ErrorBody(BaseModel):
    """The one error shape of every non-2xx answer."""

    error: ErrorDetail


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def _number(value: Any) -> Any:
    """JSON true/false and strings are not numbers here (pydantic would read them as 1, 0 or 3);
    6.0 for an integer is, as JSON Schema says."""
    if isinstance(value, bool | str):
        raise ValueError("must be a number")
    return value


# Numbers: JSON true or "3" is refused (422), not read as 1 or 3.
NumInt = Annotated[int | None, BeforeValidator(_number)]
NumFloat = Annotated[float | None, BeforeValidator(_number)]


class EnqueueRequest(BaseModel):
    """The SDK's enqueue fields (``dtq.sdk.requests.ENQUEUE_FIELDS``, checked by
    tests/sdk/test_enqueue_options.py). ``Idempotency-Key`` may also come as a header.

    ``delay`` and ``eta`` exclude each other.
    """

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"not": {"required": ["delay", "eta"]}}
    )

    name: str = Field(
        min_length=1,
        max_length=200,
        pattern=NO_CONTROL_RE,
        description="Registered task name (no control characters).",
    )
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    queue: str | None = Field(None, pattern=QUEUE_RE)
    priority: NumInt = Field(None, ge=0, le=9, description="0-9, 9 served first.")
    delay: NumFloat = Field(None, ge=0, le=10 * 365 * 86400, description="Seconds.")
    eta: AwareDatetime | None = Field(
        None, description="ISO 8601 time with a zone, within 10 years of now (else 422)."
    )
    max_retries: NumInt = Field(None, ge=0, le=1_000_000)
    timeout: NumFloat = Field(None, gt=0, le=10 * 365 * 86400, description="Seconds.")
    idempotency_key: str | None = Field(None, min_length=1, max_length=256)
    partition_key: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Of a partitioned queue: tasks with one key go to one partition.",
    )
    expires: NumFloat = Field(None, gt=0, le=10 * 365 * 86400, description="Seconds.")
    metadata: dict[Annotated[str, Field(max_length=100)], Scalar] | None = Field(
        None, max_length=10, description="Small flat metadata: at most 10 scalar entries."
    )
    unique: StrictBool | None = Field(
        None,
        description="While a task of this name with the same arguments is unfinished, "
        "answer that task instead of enqueueing another (200).",
    )
    group: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=NO_CONTROL_RE,
        description="The task's fair group within its queue (a tenant, a customer): the "
        "workers serve a queue's active groups in turn. No control characters.",
    )


class Task(Open):  # type: ignore[no-redef]
    """A task as the SDK's ``TaskInfo`` names its fields."""

    id: str
    name: str
    queue: str
    status: TaskStatus
    priority: int
    attempt: int
    retries: int = Field(description="Failed runs so far (same as failures).")
    max_retries: int
    failures: int = Field(0, description="Failed runs so far.")
    retries_left: int = Field(0, description="Retries the task may still spend.")
    args: list[Any]
    kwargs: dict[str, Any]
    result: Any = None
    error: str | None = None
    traceback: str | None = Field(None, description="The last failed run's traceback.")
    worker_id: str | None = None
    enqueued_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    requeues: int | None = None
    created: bool | None = Field(None, description="On enqueue: false for an existing task.")
    history: list[Event] | None = None
    steps: list[dict[str, Any]] | None = Field(
        None, description="A workflow's steps: index, id, name, status (docs/workflows.md)."
    )
    tree: Any = Field(None, description='A workflow\'s shape: {"chain"|"group"|"chord": [...]}.')
    flow: str | None = Field(None, description="A workflow step's flow id.")
    group: str | None = Field(None, description="The task's fair group; null when none.")
    defaults: Literal["declared", "default"] | None = Field(
        None,
        description="Before its first claim, for a task enqueued without knowing it: where the "
        "max_retries/timeout/expires_at left unset come from (a worker's declaration, or dtq's "
        "defaults where no worker declared the name). Null once claimed, or when all were given.",
    )


CURSOR_DOC = (
    "Pass as ?cursor= for the next page; null when the listing is complete. Each request does "
    "bounded work (a SCAN budget for tasks, an entry budget for dead letters), so a page may "
    "hold fewer items than the limit, even none, while next_cursor is set: keep following it."
)


class Items(BaseModel, Generic[T]):
    items: list[T]


class Page(Items[T], Generic[T]):
    next_cursor: str | None = Field(description=CURSOR_DOC)


class TaskPage(Page[Task]):
    running: list[Task] = Field(
        default_factory=list,
        description="The tasks running now (first page only; at most 200), however old.",
    )


class CancelOut(BaseModel):
    id: str
    outcome: Literal["cancelled", "requested"]
    status: str


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_retries: NumInt = Field(None, ge=0, le=1_000_000, description="New retry budget.")


class RetryOut(BaseModel):
    id: str
    status: str


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueChange(QueueInfo):
    """The queue after a pause or resume."""

    changed: bool
    """False when the queue already was so."""


class GroupChange(BaseModel):
    queue: str
    group: str
    paused: bool
    changed: bool = Field(description="False when the group already was so.")


class DlqBulkRequest(BaseModel):
    """Which dead letters: ``ids``, or every one matching the filters (all when none)."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Annotated[str, Field(pattern=TASK_ID_RE)]] | None = Field(None, max_length=10_000)
    queue: str | None = Field(None, pattern=QUEUE_RE)
    name: str | None = None
    error: str | None = None
    max_retries: NumInt = Field(None, ge=0, le=1_000_000)


class DiscardOut(BaseModel):
    id: str
    discarded: bool


class ScheduleChange(Open):
    name: str
    queue: str
    task: str
    enabled: bool
    next_fire_at: str | None
    changed: bool


class Schedules(BaseModel):
    schedules: list[dict[str, Any]] = Field(description="Periodic schedules, next fire first.")
    scheduled_tasks: list[ScheduledTask] = Field(description="Delayed tasks and retries.")


class Throughput(BaseModel):
    start: str | None
    bucket_s: int
    buckets: list[str | None]
    series: dict[str, list[int]]


class StatsBucket(BaseModel):
    minute: str
    enqueued: int
    succeeded: int
    failed: int
    retried: int
    cancelled: int
    runs: int
    p50: float | None
    p95: float | None
    p99: float | None


class Health(BaseModel):
    status: str
