"""The ``/api/v1/queues`` routes: state, pause, resume, purge; a queue's fair groups; and
``/api/v1/workers``, the fleet that consumes them."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query

from dtq.admin import QueueInfo, WorkerInfo
from dtq.admin.views import BulkResult
from dtq.models import GroupInfo
from dtq.sdk.groupops import GROUP_PAGE, MAX_GROUP_PAGE
from dtq_api import schemas as s
from dtq_api.deps import A, GroupCursor, GroupName, QueueName

log = logging.getLogger("dtq.api")

router = APIRouter()


@router.get("/queues", response_model=s.Items[QueueInfo], tags=["queues"])
async def list_queues(a: A) -> Any:
    """Every queue: waiting per priority, scheduled, running, dead letters, paused."""
    return {"items": await a.list_queues()}


@router.get("/queues/{name}", tags=["queues"])
async def get_queue(a: A, name: QueueName) -> QueueInfo:
    return await a.get_queue(name)


@router.post("/queues/{name}/pause", tags=["queues"])
async def pause_queue(a: A, name: QueueName) -> s.QueueChange:
    """Workers stop taking from the queue; running tasks finish."""
    changed = await a.pause(name)
    log.info("queue %s paused", name, extra={"queue": name})
    return s.QueueChange(**asdict(await a.get_queue(name)), changed=changed)


@router.post("/queues/{name}/resume", tags=["queues"])
async def resume_queue(a: A, name: QueueName) -> s.QueueChange:
    changed = await a.resume(name)
    log.info("queue %s resumed", name, extra={"queue": name})
    return s.QueueChange(**asdict(await a.get_queue(name)), changed=changed)


@router.post("/queues/{name}/purge", tags=["queues"])
async def purge_queue(a: A, name: QueueName) -> BulkResult:
    """Delete every waiting (queued and scheduled) task of the queue, in bounded batches."""
    res = await a.purge(name)
    log.info("queue %s purged: %d tasks", name, res.done, extra={"queue": name})
    return res


@router.get("/queues/{name}/groups", response_model=s.Page[GroupInfo], tags=["queues"])
async def list_groups(
    a: A,
    name: QueueName,
    cursor: GroupCursor = None,
    limit: Annotated[int, Query(ge=1, le=MAX_GROUP_PAGE)] = GROUP_PAGE,
) -> Any:
    """The queue's fair groups: active ones (waiting or running tasks), longest active first,
    then held idle ones; each with waiting, running, paused and the oldest waiting age.

    One request does bounded work: a page may hold fewer groups than the limit, even none,
    with a ``next_cursor`` to continue from.
    """
    return await a.list_groups(name, cursor=cursor, limit=limit)


@router.post("/queues/{name}/groups/{group}/pause", response_model=s.GroupChange, tags=["queues"])
async def pause_group(a: A, name: QueueName, group: GroupName) -> Any:
    """Hold one group: none of its tasks starts (the queue's other groups go on); running
    ones finish."""
    changed = await a.pause_group(name, group)
    log.info("group %r of queue %s paused", group, name, extra={"queue": name})
    return {"queue": name, "group": group, "paused": True, "changed": changed}


@router.post("/queues/{name}/groups/{group}/resume", response_model=s.GroupChange, tags=["queues"])
async def resume_group(a: A, name: QueueName, group: GroupName) -> Any:
    """Release a held group."""
    changed = await a.resume_group(name, group)
    log.info("group %r of queue %s resumed", group, name, extra={"queue": name})
    return {"queue": name, "group": group, "paused": False, "changed": changed}


@router.get("/workers", response_model=s.Items[WorkerInfo], tags=["workers"])
async def list_workers(a: A) -> Any:
    """Workers with heartbeat age; ``stale`` once it passes 3 heartbeat intervals."""
    return {"items": await a.list_workers()}
