"""The ``/api/v1/events`` stream (server-sent events), ``/api/v1/stats/throughput`` and
``/api/v1/stats``, the history (dtq.stats)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from dtq import stats
from dtq_api import schemas as s
from dtq_api.deps import A, QueueFilter, get_admin, get_hub
from dtq_api.errors import ApiError
from dtq_api.events import TooManyStreams, sse

SSE_PING_S = 15.0
STREAM_RETRY_S = 5
RESUME_MAX = 5000
"""Most missed events a resumed event stream (Last-Event-ID) sends before the live ones."""


class StreamResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends, even unstarted."""

    def __init__(self, on_close: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


router = APIRouter()


@router.get(
    "/events",
    tags=["events"],
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "Server-sent events: one JSON event per message",
        },
        503: {
            "model": s.ErrorBody,
            "description": "Too many open streams "
            "(DTQ_API_MAX_STREAMS; see Retry-After) or Redis unreachable",
        },
    },
)
async def events(
    request: Request,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", pattern=r"^[0-9]{1,19}-[0-9]{1,19}$")
    ] = None,
) -> StreamingResponse:
    """Live lifecycle events of every queue and worker (server-sent events).

    Each message's ``id`` is the event's stream id. A client reconnecting with
    ``Last-Event-ID`` (browsers' EventSource does so by itself) first gets the events it
    missed (up to 5000, read in pages while they are sent; an ``error`` message says when
    more were left out), then the live ones.

    Each message's data is one event as JSON (``type``, ``task_id``, ``queue``,
    ``attempt``, ``worker``, ``detail``, ``ts``); a comment line keeps idle streams open.
    All streams of a process share one Redis reader; past ``DTQ_API_MAX_STREAMS`` open
    streams the answer is 503 with ``Retry-After``.
    """
    try:
        sub = get_hub(request.app).subscribe()
    except TooManyStreams as exc:
        raise ApiError(
            503, "too_many_streams", str(exc), {"Retry-After": str(STREAM_RETRY_S)}
        ) from None
    # Read while sent, after subscribing: what happens meanwhile is in both, and sent once.
    backlog = None
    if last_event_id is not None:
        backlog = get_admin(request.app).resume_pages(last_event_id, RESUME_MAX)
    return StreamResponse(
        sub.close,
        sse(sub, SSE_PING_S, backlog),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/stats/throughput", response_model=s.Throughput, tags=["events"])
async def throughput(
    a: A,
    window_s: Annotated[int, Query(ge=1, le=86400)] = 600,
    bucket_s: Annotated[int, Query(ge=1, le=86400)] = 10,
) -> Any:
    """Succeeded, failed, retried and enqueued counts per time bucket (from the events)."""
    return await a.throughput(window_s=window_s, bucket_s=bucket_s)


@router.get("/stats", response_model=list[s.StatsBucket], tags=["stats"])
async def get_stats(
    a: A,
    queue: QueueFilter = None,
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
