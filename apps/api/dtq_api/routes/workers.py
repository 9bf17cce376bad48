"""The ``/api/v1/workers`` route."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from dtq_api import schemas as s
from dtq_api.deps import A

router = APIRouter()


@router.get("/workers", response_model=s.WorkerList, tags=["workers"])
async def list_workers(a: A) -> Any:
    """Workers with heartbeat age; ``stale`` once it passes 3 heartbeat intervals."""
    return {"items": [w.to_dict() for w in await a.list_workers()]}
