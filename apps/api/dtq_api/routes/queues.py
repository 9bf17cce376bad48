"""The ``/api/v1/queues`` routes: state, pause, resume, purge."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from dtq_api import schemas as s
from dtq_api.deps import A, QueueName

log = logging.getLogger("dtq.api")

router = APIRouter()


@router.get("/queues", response_model=s.QueueList, tags=["queues"])
async def list_queues(a: A) -> Any:
    """Every queue: waiting per priority, scheduled, running, dead letters, paused."""
    return {"items": [q.to_dict() for q in await a.list_queues()]}


@router.get("/queues/{name}", response_model=s.Queue, tags=["queues"])
async def get_queue(a: A, name: QueueName) -> Any:
    return (await a.get_queue(name)).to_dict()


@router.post("/queues/{name}/pause", response_model=s.QueueChange, tags=["queues"])
async def pause_queue(a: A, name: QueueName) -> Any:
    """Workers stop taking from the queue; running tasks finish."""
    changed = await a.pause(name)
    log.info("queue %s paused", name, extra={"queue": name})
    return {**(await a.get_queue(name)).to_dict(), "changed": changed}


@router.post("/queues/{name}/resume", response_model=s.QueueChange, tags=["queues"])
async def resume_queue(a: A, name: QueueName) -> Any:
    changed = await a.resume(name)
    log.info("queue %s resumed", name, extra={"queue": name})
    return {**(await a.get_queue(name)).to_dict(), "changed": changed}


@router.post("/queues/{name}/purge", response_model=s.BulkOut, tags=["queues"])
async def purge_queue(a: A, name: QueueName) -> Any:
    """Delete every waiting (queued and scheduled) task of the queue, in bounded batches."""
    res = await a.purge(name)
    log.info("queue %s purged: %d tasks", name, res.done, extra={"queue": name})
    return res.to_dict()
