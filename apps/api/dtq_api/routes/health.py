"""The open endpoints (no token): ``/healthz``, ``/readyz`` and the fleet ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from dtq_api import metrics
from dtq_api import schemas as s
from dtq_api.deps import get_admin

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=s.Health)
async def healthz() -> Any:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", response_model=s.Health, responses={503: {"model": s.ErrorBody}})
async def readyz(request: Request) -> Any:
    """Redis answers."""
    await get_admin(request.app).ping()
    return {"status": "ready"}


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text format",
        },
        503: {"model": s.ErrorBody},
    },
)
async def prometheus_metrics(request: Request) -> Response:
    """Fleet gauges: queue depth per priority, scheduled, running, dead letters, workers."""
    body = await metrics.render(get_admin(request.app))
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
