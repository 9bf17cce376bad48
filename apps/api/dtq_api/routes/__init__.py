"""The ``/api/v1`` routers, one per resource; :func:`api_router` puts them under the prefix,
the bearer-token check and the documented error answers."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from dtq_api.deps import auth
from dtq_api.errors import ERRORS
from dtq_api.routes import deadletters, events, queues, schedules, tasks


def api_router() -> APIRouter:
    """``/api/v1``: every resource's routes, in the order the OpenAPI document lists them."""
    api = APIRouter(prefix="/api/v1", dependencies=[Depends(auth)], responses=ERRORS)
    for part in (tasks, queues, schedules, deadletters, events):
        api.include_router(part.router)
    return api
