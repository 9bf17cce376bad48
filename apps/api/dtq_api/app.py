"""The FastAPI application: ``/api/v1`` (backed by :mod:`dtq.admin` and the SDK), the dashboard
at ``/``, ``/healthz``, ``/readyz`` and the fleet ``/metrics``.

Every error answers ``{"error": {"code", "message"}}``. With ``DTQ_API_TOKEN`` set, every
``/api/v1`` call needs ``Authorization: Bearer <token>`` (compared in constant time); the
dashboard, health checks, metrics and the OpenAPI document stay open.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Body, Depends, FastAPI, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from dtq import __version__
from dtq.admin import Admin, Conflict, Event, UnknownQueue
from dtq.app import App
from dtq.errors import (
    DtqError,
    InvalidRequest,
    PayloadTooLarge,
    RedisUnavailable,
    SerializationError,
    UnknownTask,
)
from dtq.keys import BadTaskId
from dtq.models import TaskStatus
from dtq.schedules import UnknownSchedule
from dtq.settings import Settings, load_settings
from dtq_api import docs_ui, metrics
from dtq_api import schemas as s
from dtq_api.events import EventHub, TooManyStreams, sse
from dtq_api.guard import Guard, allowed_hosts

log = logging.getLogger("dtq.api")
SSE_PING_S = 15.0
QUEUE_RE = r"^[A-Za-z0-9_.\-]{1,100}$"
CURSOR_RE = r"^[0-9]{1,19}(\.[0-9]{1,9})?$"  # a position: the DLQ listing's
Cursor = Annotated[
    str | None,
    Query(pattern=CURSOR_RE, description="The previous page's next_cursor (opaque)."),
]
TASK_CURSOR_RE = r"^[0-9]{1,19}\.[0-9]{1,19}(\.[A-Za-z0-9_.\-]{0,100}(~[1-9][0-9]{0,2})?)?$"
TaskCursor = Annotated[
    str | None,
    Query(pattern=TASK_CURSOR_RE, description="The previous page's next_cursor (opaque)."),
]
TASK_ID_RE = s.TASK_ID_RE
TaskId = Annotated[str, PathParam(pattern=TASK_ID_RE, description="<queue>:<tid>")]
QueueName = Annotated[str, PathParam(pattern=QUEUE_RE)]
ScheduleName = Annotated[str, PathParam(min_length=1, max_length=200)]
BODY_SLACK = 64 * 1024  # JSON framing around the arguments
STREAM_RETRY_S = 5
RESUME_MAX = 5000
"""Most missed events a resumed event stream (Last-Event-ID) sends before the live ones."""


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def _utf8_header(name: str, value: str) -> str:
    """A header value as the UTF-8 its bytes are (ASGI servers hand them over as latin-1)."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise ApiError(400, "bad_request", f"{name} is not UTF-8") from None


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


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": s.ErrorBody, "description": desc}
    for code, desc in (
        (400, "Malformed request (bad id, cursor or JSON)"),
        (401, "Missing or wrong bearer token (only when DTQ_API_TOKEN is set)"),
        (404, "No such task, queue or dead letter"),
        (409, "The task is not in a state that allows this"),
        (403, "Cross-site request refused (Origin, Referer or Host not this server's)"),
        (413, "Request or arguments too large"),
        (422, "A field is invalid"),
        (503, "Redis unreachable"),
    )
}


def get_admin(app: FastAPI) -> Admin:
    """The app's Admin (made on first use when the lifespan did not run, as in ASGI tests)."""
    a: Admin | None = getattr(app.state, "admin", None)
    if a is None:
        a = app.state.admin = Admin(app.state.settings)
    return a


class GuardedFastAPI(FastAPI):
    """FastAPI with :class:`~dtq_api.guard.Guard` outside everything, even the handler of
    unexpected errors, so every answer (a 500 too) passes the guard's checks and headers."""

    guard_options: dict[str, Any]

    def build_middleware_stack(self) -> ASGIApp:
        return Guard(super().build_middleware_stack(), **self.guard_options)


def get_hub(app: FastAPI) -> EventHub:
    """The app's event hub (one Redis reader for every SSE stream), made on first use."""
    hub: EventHub | None = getattr(app.state, "hub", None)
    if hub is None:
        settings: Settings = app.state.settings
        hub = app.state.hub = EventHub(lambda: Admin(settings), settings.api_max_streams)
    return hub


def _admin_dep(request: Request) -> Admin:
    return get_admin(request.app)


A = Annotated[Admin, Depends(_admin_dep)]


def _static_dir() -> Path:
    return Path(str(resources.files("dtq_api") / "static"))


def create_app(
    settings: Settings | None = None, tasks_app: App | None = None, *, bind_host: str | None = None
) -> FastAPI:
    """Build the application; one Redis connection pool for its lifetime (and one more
    connection shared by every event stream).

    With ``tasks_app`` (the user's ``dtq.App``), enqueues over HTTP get each task's declared
    defaults: queue, priority, retries, timeout, uniqueness and fleet limits. ``bind_host`` is
    the address served: bound to loopback, state-changing requests must name a loopback Host
    (see :mod:`dtq_api.guard`); None checks no Host (for tests and embedding).
    """
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.admin = Admin(settings, app=tasks_app)
        try:  # best effort: Redis may not be up yet, the API starts anyway
            warned = await app.state.admin.eviction_warning()
        except Exception as exc:
            log.debug("maxmemory-policy not checked: %s", exc)
        else:
            if warned:
                log.warning("%s", warned)
        try:
            yield
        finally:
            await get_hub(app).close()
            await app.state.admin.close()

    app = GuardedFastAPI(
        title="dtq",
        version=__version__,
        description="HTTP API of dtq, a distributed task queue on Redis Streams. "
        'Errors answer {"error": {"code", "message"}}.',
        lifespan=lifespan,
        docs_url=None,  # served from the wheel by dtq_api.docs_ui
        redoc_url=None,
    )

    app.state.settings = settings

    def admin() -> Admin:
        return get_admin(app)

    _install_errors(app, settings)
    app.guard_options = {
        "token": settings.api_token,
        "max_body": settings.api_max_body_bytes or settings.max_payload_bytes + BODY_SLACK,
        "hosts": allowed_hosts(bind_host, settings.api_allowed_hosts),
    }

    async def auth(authorization: Annotated[str | None, Header()] = None) -> None:
        token = settings.api_token
        if not token:
            return
        scheme, _, given = (authorization or "").partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), token.encode()
        )
        if not ok:
            raise ApiError(401, "unauthorized", "missing or wrong bearer token")

    api = APIRouter(prefix="/api/v1", dependencies=[Depends(auth)], responses=ERRORS)

    # --- tasks ------------------------------------------------------------------------------

    @api.get("/tasks", response_model=s.TaskPage, tags=["tasks"])
    async def list_tasks(
        a: A,
        queue: Annotated[str | None, Query(pattern=QUEUE_RE)] = None,
        status: TaskStatus | None = None,
        name: Annotated[str | None, Query(max_length=200)] = None,
        cursor: TaskCursor = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Tasks matching all filters, newest first, with cursor pagination.

        The list is read from the queues' capped event streams (``DTQ_EVENTS_MAXLEN`` per
        queue): a task older than its queue's last events is found by id, not listed. The
        first page (no ``cursor``) also carries ``running``: every task running now (at most
        200), however old. One request reads a bounded number of stream entries: a filter
        matching few tasks answers a short (even empty) page with a ``next_cursor``.
        """
        st = status.value if status is not None else None
        page = await a.recent_tasks(queue=queue, status=st, name=name, cursor=cursor, limit=limit)
        return {"items": page.items, "next_cursor": page.next_cursor, "running": page.running}

    existing: dict[int | str, dict[str, Any]] = {
        200: {"model": s.Task, "description": "Existing task (same idempotency key)"}
    }

    @api.post("/tasks", response_model=s.Task, status_code=201, tags=["tasks"], responses=existing)
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
            fields["idempotency_key"] = _utf8_header("Idempotency-Key", idempotency_key)
        name = fields.pop("name")
        h = await a.client.enqueue(name, fields.pop("args", None), fields.pop("kwargs", None),
                                   **fields)  # fmt: skip
        if not h.created:
            response.status_code = 200
        else:
            log.info("enqueued %s (%s) over HTTP", h.id, name,
                     extra={"task_id": h.id, "queue": h.queue})  # fmt: skip
        d = await a.get_task(h.id)
        d["created"] = h.created
        return d

    @api.get("/tasks/{task_id}", response_model=s.Task, tags=["tasks"])
    async def get_task(a: A, task_id: TaskId, history: bool = True) -> Any:
        """One task: arguments, status, attempts, result or error, and its event history."""
        return await a.get_task(task_id, history=history)

    @api.post("/tasks/{task_id}/cancel", response_model=s.CancelOut, tags=["tasks"])
    async def cancel_task(a: A, task_id: TaskId) -> Any:
        """Cancel a queued/scheduled task, or ask a running one to stop. 409 when finished."""
        d = await a.cancel(task_id)
        if d["outcome"] == "unchanged":
            raise ApiError(409, "conflict", f"task {task_id} already ended {d['status']}")
        log.info("cancel %s: %s", task_id, d["outcome"], extra={"task_id": task_id})
        return d

    @api.post("/tasks/{task_id}/retry", response_model=s.RetryOut, tags=["tasks"])
    async def retry_task(
        a: A, task_id: TaskId, body: Annotated[s.RetryRequest | None, Body()] = None
    ) -> Any:
        """Run a failed, cancelled or expired task again, same id, history kept."""
        d = await a.retry(task_id, max_retries=body.max_retries if body else None)
        log.info("retry %s", task_id, extra={"task_id": task_id})
        return d

    # --- queues -----------------------------------------------------------------------------

    @api.get("/queues", response_model=s.QueueList, tags=["queues"])
    async def list_queues(a: A) -> Any:
        """Every queue: waiting per priority, scheduled, running, dead letters, paused."""
        return {"items": [q.to_dict() for q in await a.list_queues()]}

    @api.get("/queues/{name}", response_model=s.Queue, tags=["queues"])
    async def get_queue(a: A, name: QueueName) -> Any:
        return (await a.get_queue(name)).to_dict()

    @api.post("/queues/{name}/pause", response_model=s.QueueChange, tags=["queues"])
    async def pause_queue(a: A, name: QueueName) -> Any:
        """Workers stop taking from the queue; running tasks finish."""
        changed = await a.pause(name)
        log.info("queue %s paused", name, extra={"queue": name})
        return {**(await a.get_queue(name)).to_dict(), "changed": changed}

    @api.post("/queues/{name}/resume", response_model=s.QueueChange, tags=["queues"])
    async def resume_queue(a: A, name: QueueName) -> Any:
        changed = await a.resume(name)
        log.info("queue %s resumed", name, extra={"queue": name})
        return {**(await a.get_queue(name)).to_dict(), "changed": changed}

    @api.post("/queues/{name}/purge", response_model=s.BulkOut, tags=["queues"])
    async def purge_queue(a: A, name: QueueName) -> Any:
        """Delete every waiting (queued and scheduled) task of the queue, in bounded batches."""
        res = await a.purge(name)
        log.info("queue %s purged: %d tasks", name, res.done, extra={"queue": name})
        return res.to_dict()

    # --- workers, schedules -----------------------------------------------------------------

    @api.get("/workers", response_model=s.WorkerList, tags=["workers"])
    async def list_workers(a: A) -> Any:
        """Workers with heartbeat age; ``stale`` once it passes 3 heartbeat intervals."""
        return {"items": [w.to_dict() for w in await a.list_workers()]}

    @api.get("/schedules", response_model=s.Schedules, tags=["schedules"])
    async def schedules(a: A, queue: Annotated[str | None, Query(pattern=QUEUE_RE)] = None) -> Any:
        """Periodic schedules with their next fire times, and delayed tasks and retries."""
        periodic = await a.list_schedules(queue)
        delayed = await a.list_scheduled(queue)
        return {"schedules": periodic, "scheduled_tasks": [d.to_dict() for d in delayed]}

    @api.post("/schedules/{queue}/{name}/run", response_model=s.Task, status_code=201,
              tags=["schedules"])  # fmt: skip
    async def run_schedule(a: A, queue: QueueName, name: ScheduleName) -> Any:
        """Enqueue the schedule's task now (metadata ``schedule``, ``run_now``); its own fire
        times do not move, enabled or not."""
        d = await a.run_schedule(queue, name)
        log.info("schedule %s of %s run now: %s", name, queue, d["id"],
                 extra={"task_id": d["id"], "queue": queue})  # fmt: skip
        return d

    @api.post("/schedules/{queue}/{name}/disable", response_model=s.ScheduleChange,
              tags=["schedules"])  # fmt: skip
    async def disable_schedule(a: A, queue: QueueName, name: ScheduleName) -> Any:
        """Stop the schedule firing; its definition stays (a worker's code sync keeps it
        disabled unless the definition in the code changes)."""
        d = await a.set_schedule_enabled(queue, name, False)
        log.info("schedule %s of %s disabled", name, queue, extra={"queue": queue})
        return d

    @api.post("/schedules/{queue}/{name}/enable", response_model=s.ScheduleChange,
              tags=["schedules"])  # fmt: skip
    async def enable_schedule(a: A, queue: QueueName, name: ScheduleName) -> Any:
        """Fire the schedule again, from its next fire time after now."""
        d = await a.set_schedule_enabled(queue, name, True)
        log.info("schedule %s of %s enabled", name, queue, extra={"queue": queue})
        return d

    # --- dead letters -----------------------------------------------------------------------

    @api.get("/dlq", response_model=s.DeadLetterPage, tags=["dlq"])
    async def list_dlq(
        a: A,
        queue: Annotated[str | None, Query(pattern=QUEUE_RE)] = None,
        name: Annotated[str | None, Query(max_length=200)] = None,
        error_contains: Annotated[str | None, Query(alias="error", max_length=200)] = None,
        cursor: Cursor = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Failed tasks, newest failure first, with their last error.

        One request examines a bounded number of dead letters: a filter matching few answers
        a short (even empty) page with a ``next_cursor`` to continue from.
        """
        page = await a.dlq_list(queue=queue, name=name, error=error_contains, cursor=cursor,
                                limit=limit)  # fmt: skip
        return {"items": page.items, "next_cursor": page.next_cursor}

    @api.post("/dlq/requeue", response_model=s.BulkOut, tags=["dlq"])
    async def requeue_many(a: A, body: s.DlqBulkRequest) -> Any:
        """Requeue ``ids``, or every dead letter matching the filters (all when none)."""
        res = await a.dlq_requeue(body.ids, queue=body.queue, name=body.name, error=body.error,
                                  max_retries=body.max_retries)  # fmt: skip
        log.info("requeued %d dead letters", res.done)
        return res.to_dict()

    @api.post("/dlq/discard", response_model=s.BulkOut, tags=["dlq"])
    async def discard_many(a: A, body: s.DlqBulkRequest) -> Any:
        """Delete ``ids``, or every dead letter matching the filters (all when none)."""
        res = await a.dlq_discard(body.ids, queue=body.queue, name=body.name, error=body.error)
        log.info("discarded %d dead letters", res.done)
        return res.to_dict()

    @api.post("/dlq/{task_id}/requeue", response_model=s.RetryOut, tags=["dlq"])
    async def requeue_one(
        a: A, task_id: TaskId, body: Annotated[s.RetryRequest | None, Body()] = None
    ) -> Any:
        """Requeue one dead letter (same id and history; optionally a new retry budget)."""
        await a.dlq_requeue_one(task_id, max_retries=body.max_retries if body else None)
        log.info("requeued dead letter %s", task_id, extra={"task_id": task_id})
        return {"id": task_id, "status": "queued"}

    @api.delete("/dlq/{task_id}", response_model=s.DiscardOut, tags=["dlq"])
    async def discard_one(a: A, task_id: TaskId) -> Any:
        """Delete one dead letter for good."""
        await a.dlq_discard_one(task_id)
        log.info("discarded dead letter %s", task_id, extra={"task_id": task_id})
        return {"id": task_id, "discarded": True}

    # --- events -----------------------------------------------------------------------------

    @api.get(
        "/events",
        tags=["events"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                         "description": "Server-sent events: one JSON event per message"},
                   503: {"model": s.ErrorBody, "description": "Too many open streams "
                         "(DTQ_API_MAX_STREAMS; see Retry-After) or Redis unreachable"}},
    )  # fmt: skip
    async def events(
        last_event_id: Annotated[
            str | None, Header(alias="Last-Event-ID", pattern=r"^[0-9]{1,19}-[0-9]{1,19}$")
        ] = None,
    ) -> StreamingResponse:
        """Live lifecycle events of every queue and worker (server-sent events).

        Each message's ``id`` is the event's stream id. A client reconnecting with
        ``Last-Event-ID`` (browsers' EventSource does so by itself) first gets the events it
        missed (up to 5000; an ``error`` message says when more were left out), then the live
        ones.

        Each message's data is one event as JSON (``type``, ``task_id``, ``queue``,
        ``attempt``, ``worker``, ``detail``, ``ts``); a comment line keeps idle streams open.
        All streams of a process share one Redis reader; past ``DTQ_API_MAX_STREAMS`` open
        streams the answer is 503 with ``Retry-After``.
        """
        try:
            sub = get_hub(app).subscribe()
        except TooManyStreams as exc:
            raise ApiError(503, "too_many_streams", str(exc),
                           {"Retry-After": str(STREAM_RETRY_S)}) from None  # fmt: skip
        backlog: list[Event] = []
        truncated = False
        if last_event_id is not None:
            try:  # after subscribing: what happens meanwhile is in both, and sent once
                backlog, truncated = await admin().events_after(last_event_id, RESUME_MAX)
            except BaseException:
                sub.close()
                raise
        return StreamResponse(
            sub.close,
            sse(sub, SSE_PING_S, backlog, truncated),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @api.get("/stats/throughput", response_model=s.Throughput, tags=["events"])
    async def throughput(
        a: A,
        window_s: Annotated[int, Query(ge=1, le=86400)] = 600,
        bucket_s: Annotated[int, Query(ge=1, le=86400)] = 10,
    ) -> Any:
        """Succeeded, failed, retried and enqueued counts per time bucket (from the events)."""
        return await a.throughput(window_s=window_s, bucket_s=bucket_s)

    app.include_router(api)

    # --- open endpoints ---------------------------------------------------------------------

    @app.get("/healthz", response_model=s.Health, tags=["health"])
    async def healthz() -> Any:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=s.Health, tags=["health"],
             responses={503: {"model": s.ErrorBody}})  # fmt: skip
    async def readyz() -> Any:
        """Redis answers."""
        await admin().ping()
        return {"status": "ready"}

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                         "description": "Prometheus text format"},
                   503: {"model": s.ErrorBody}},
    )  # fmt: skip
    async def prometheus_metrics() -> Response:
        """Fleet gauges: queue depth per priority, scheduled, running, dead letters, workers."""
        body = await metrics.render(admin())
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    docs_ui.install(app)
    static = _static_dir()

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(static / "index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(static / "favicon.svg", media_type="image/svg+xml")

    app.mount("/static", StaticFiles(directory=static), name="static")
    return app


def _install_errors(app: FastAPI, settings: Settings) -> None:
    def handle(status: int, code: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def h(_: Request, exc: Exception) -> JSONResponse:
            return error(status, code, str(exc))

        return h

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error(exc.status, exc.code, exc.message, exc.headers)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        codes = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
                 401: "unauthorized"}  # fmt: skip
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request.scope))
        return error(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail),
                     headers)  # fmt: skip

    async def validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return error(400, "bad_request", "request body is not valid JSON")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(422, "validation_error", f"{where}: {first.get('msg', 'invalid')}")

    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        # RedisUnavailable already says so; a raw redis-py error does not.
        msg = str(exc) if isinstance(exc, RedisUnavailable) else f"Redis unreachable: {exc}"
        log.warning("Redis unavailable: %s", msg.removeprefix("Redis unreachable: "))
        return error(503, "redis_unavailable", msg)

    async def dtq_error(_: Request, exc: Exception) -> JSONResponse:
        return error(400, "bad_request", str(exc))

    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, "internal", f"internal error: {type(exc).__name__}")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(BadTaskId, handle(400, "bad_task_id"))
    app.add_exception_handler(UnknownTask, handle(404, "not_found"))
    app.add_exception_handler(UnknownQueue, handle(404, "not_found"))
    app.add_exception_handler(UnknownSchedule, handle(404, "not_found"))
    app.add_exception_handler(Conflict, handle(409, "conflict"))
    app.add_exception_handler(PayloadTooLarge, handle(413, "payload_too_large"))
    app.add_exception_handler(SerializationError, handle(422, "validation_error"))
    app.add_exception_handler(InvalidRequest, handle(422, "validation_error"))
    app.add_exception_handler(RedisUnavailable, unavailable)
    app.add_exception_handler(redis.ConnectionError, unavailable)
    app.add_exception_handler(redis.TimeoutError, unavailable)
    app.add_exception_handler(DtqError, dtq_error)
    app.add_exception_handler(Exception, internal)


def _allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route serves at this path (a 405's ``Allow``), HEAD left out."""
    methods: set[str] = set()
    for m in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**scope, "method": m}
        if any(route.matches(probe)[0] is Match.FULL for route in app.router.routes):
            methods.add(m)
    methods.discard("HEAD")
    return sorted(methods)
