"""The ``/api/v1/tasks`` routes: list, enqueue, read, cancel, retry."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response

from dtq.models import TaskStatus
from dtq_api import deps
from dtq_api import schemas as s
from dtq_api.deps import A, Limit, NameFilter, QueueFilter, RetryBody, TaskCursor, TaskId
from dtq_api.errors import ApiError

log = logging.getLogger("dtq.api")

router = APIRouter(tags=["tasks"])


@router.get("/tasks", response_model=s.TaskPage)
async def list_tasks(
    a: A,
    queue: QueueFilter = None,
    status: TaskStatus | None = None,
    name: NameFilter = None,
    cursor: TaskCursor = None,
    limit: Limit = 50,
) -> Any:
    """Tasks matching all filters, newest first, with cursor pagination.

    The list is read from the queues' capped event streams (``DTQ_EVENTS_MAXLEN`` per
    queue): a task older than its queue's last events is found by id, not listed. The
    first page (no ``cursor``) also carries ``running``: every task running now (at most
    200), however old. One request reads a bounded number of stream entries: a filter
    matching few tasks answers a short (even empty) page with a ``next_cursor``.
    """
    st = status.value if status is not None else None
    return await a.recent_tasks(queue=queue, status=st, name=name, cursor=cursor, limit=limit)


existing: dict[int | str, dict[str, Any]] = {
    200: {"model": s.Task, "description": "Existing task (same idempotency key)"}
}


@router.post("/tasks", response_model=s.Task, status_code=201, responses=existing)
async def enqueue(
    a: A,
    body: s.EnqueueRequest,
    response: Response,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", min_length=1, max_length=256)
    ] = None,
) -> Any:
    """Enqueue a task. A repeated ``Idempotency-Key`` answers 200 with the original.

    The key may come as the ``Idempotency-Key`` header (UTF-8) or the body's
    ``idempotency_key``; when both are given, the header wins.
    """
    fields = body.model_dump(exclude_none=True)
    if idempotency_key is not None:  # the header wins over the body field
        fields["idempotency_key"] = deps.utf8_header("Idempotency-Key", idempotency_key)
    name = fields.pop("name")
    h = await a.client.enqueue(name, fields.pop("args", None), fields.pop("kwargs", None), **fields)
    response.status_code = 201 if h.created else 200
    if h.created:
        log.info(
            "enqueued %s (%s) over HTTP", h.id, name, extra={"task_id": h.id, "queue": h.queue}
        )
    return {**await a.get_task(h.id), "created": h.created}


@router.get("/tasks/{task_id}", response_model=s.Task)
async def get_task(a: A, task_id: TaskId, history: bool = True) -> Any:
    """One task: arguments, status, attempts, result or error, and its event history."""
    return await a.get_task(task_id, history=history)


@router.post("/tasks/{task_id}/cancel", response_model=s.CancelOut)
async def cancel_task(a: A, task_id: TaskId) -> Any:
    """Cancel a queued/scheduled task, or ask a running one to stop. 409 when finished."""
    d = await a.cancel(task_id)
    if d["outcome"] == "unchanged":
        raise ApiError(409, "conflict", f"task {task_id} already ended {d['status']}")
    log.info("cancel %s: %s", task_id, d["outcome"], extra={"task_id": task_id})
    return d


@router.post("/tasks/{task_id}/retry", response_model=s.RetryOut)
async def retry_task(a: A, task_id: TaskId, body: RetryBody = None) -> Any:
    """Run a failed, cancelled or expired task again, same id, history kept."""
    d = await a.retry(task_id, max_retries=body.max_retries if body else None)
    log.info("retry %s", task_id, extra={"task_id": task_id})
    return d
