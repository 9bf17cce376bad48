"""The ``/api/v1/stats`` route: the history (dtq.stats)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from dtq import stats
from dtq_api import schemas as s
from dtq_api.deps import QUEUE_RE, A

router = APIRouter()


@router.get("/stats", response_model=list[s.StatsBucket], tags=["stats"])
async def get_stats(
    a: A,
    queue: Annotated[str | None, Query(pattern=QUEUE_RE)] = None,
    minutes: Annotated[int, Query(ge=1, le=stats.MAX_MINUTES)] = 60,
    step: Annotated[int, Query(ge=1, le=stats.MAX_MINUTES)] = 1,
) -> Any:
    """Per-minute counts of ``queue`` (its partitions summed; every queue summed without it)
    over the last ``minutes`` minutes, in buckets of ``step`` minutes, oldest first.

    Each bucket: ``minute`` (ISO 8601, UTC: its first minute), ``enqueued``, ``succeeded``,
    ``failed``, ``retried``, ``cancelled``, ``runs`` (runs timed) and ``p50``/``p95``/``p99``
    (run time in seconds, an upper bound from fixed buckets; null without runs). Kept in
    Redis for ``DTQ_STATS_RETENTION_H`` hours, so it outlives restarts of every process.
    """
    return await a.stats(queue=queue, minutes=minutes, step=min(step, minutes))
