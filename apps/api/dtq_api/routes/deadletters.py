"""The ``/api/v1/dlq`` routes: list, requeue and discard (one or in bulk)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query

from dtq.admin.views import BulkResult, DeadLetter
from dtq_api import schemas as s
from dtq_api.deps import A, Cursor, Limit, NameFilter, QueueFilter, RetryBody, TaskId

log = logging.getLogger("dtq.api")

router = APIRouter(tags=["dlq"])


@router.get("/dlq", response_model=s.Page[DeadLetter])
async def list_dlq(
    a: A,
    queue: QueueFilter = None,
    name: NameFilter = None,
    error_contains: Annotated[str | None, Query(alias="error", max_length=200)] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Any:
    """Failed tasks, newest failure first, with their last error.

    One request examines a bounded number of dead letters: a filter matching few answers
    a short (even empty) page with a ``next_cursor`` to continue from.
    """
    return await a.dlq_list(
        queue=queue, name=name, error=error_contains, cursor=cursor, limit=limit
    )


@router.post("/dlq/requeue")
async def requeue_many(a: A, body: s.DlqBulkRequest) -> BulkResult:
    """Requeue ``ids``, or every dead letter matching the filters (all when none)."""
    res = await a.dlq_requeue(body.ids, **body.model_dump(exclude={"ids"}))
    log.info("requeued %d dead letters", res.done)
    return res


@router.post("/dlq/discard")
async def discard_many(a: A, body: s.DlqBulkRequest) -> BulkResult:
    """Delete ``ids``, or every dead letter matching the filters (all when none)."""
    res = await a.dlq_discard(body.ids, **body.model_dump(exclude={"ids", "max_retries"}))
    log.info("discarded %d dead letters", res.done)
    return res


@router.post("/dlq/{task_id}/requeue", response_model=s.RetryOut)
async def requeue_one(a: A, task_id: TaskId, body: RetryBody = None) -> Any:
    """Requeue one dead letter (same id and history; optionally a new retry budget)."""
    await a.dlq_requeue_one(task_id, max_retries=body.max_retries if body else None)
    log.info("requeued dead letter %s", task_id, extra={"task_id": task_id})
    return {"id": task_id, "status": "queued"}


@router.delete("/dlq/{task_id}", response_model=s.DiscardOut)
async def discard_one(a: A, task_id: TaskId) -> Any:
    """Delete one dead letter for good."""
    await a.dlq_discard_one(task_id)
    log.info("discarded dead letter %s", task_id, extra={"task_id": task_id})
    return {"id": task_id, "discarded": True}
