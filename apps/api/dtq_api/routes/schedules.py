"""The ``/api/v1/schedules`` routes: list, run now, disable, enable."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from dtq_api import schemas as s
from dtq_api.deps import A, QueueFilter, QueueName, ScheduleName

log = logging.getLogger("dtq.api")

router = APIRouter(tags=["schedules"])


@router.get("/schedules", response_model=s.Schedules)
async def schedules(a: A, queue: QueueFilter = None) -> Any:
    """Periodic schedules with their next fire times, and delayed tasks and retries."""
    periodic = await a.list_schedules(queue)
    delayed = await a.list_scheduled(queue)
    return {"schedules": periodic, "scheduled_tasks": delayed}


@router.post("/schedules/{queue}/{name}/run", response_model=s.Task, status_code=201)
async def run_schedule(a: A, queue: QueueName, name: ScheduleName) -> Any:
    """Enqueue the schedule's task now (metadata ``schedule``, ``run_now``); its own fire
    times do not move, enabled or not."""
    d = await a.run_schedule(queue, name)
    extra = {"task_id": d["id"], "queue": queue}
    log.info("schedule %s of %s run now: %s", name, queue, d["id"], extra=extra)
    return d


@router.post("/schedules/{queue}/{name}/disable", response_model=s.ScheduleChange)
async def disable_schedule(a: A, queue: QueueName, name: ScheduleName) -> Any:
    """Stop the schedule firing; its definition stays (a worker's code sync keeps it
    disabled unless the definition in the code changes)."""
    d = await a.set_schedule_enabled(queue, name, False)
    log.info("schedule %s of %s disabled", name, queue, extra={"queue": queue})
    return d


@router.post("/schedules/{queue}/{name}/enable", response_model=s.ScheduleChange)
async def enable_schedule(a: A, queue: QueueName, name: ScheduleName) -> Any:
    """Fire the schedule again, from its next fire time after now."""
    d = await a.set_schedule_enabled(queue, name, True)
    log.info("schedule %s of %s enabled", name, queue, extra={"queue": queue})
    return d
