"""How the API answers errors: always ``{"error": {"code", "message"}}``, one status per error
type of the SDK and of FastAPI/Starlette."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from dtq.admin import Conflict, UnknownQueue
from dtq.errors import (
    BadTaskId,
    DtqError,
    InvalidRequest,
    PayloadTooLarge,
    RedisUnavailable,
    SerializationError,
    UnknownTask,
    unreachable,
)
from dtq.schedules import UnknownSchedule
from dtq_api import schemas as s

log = logging.getLogger("dtq.api")


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
"""The error answers every ``/api/v1`` operation documents."""


HTTP_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}


def install_errors(app: FastAPI) -> None:
    """Answer every error the API can meet in the one error shape."""

    def handle(status: int, code: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def h(_: Request, exc: Exception) -> JSONResponse:
            return error(status, code, str(exc))

        return h

    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error(exc.status, exc.code, exc.message, exc.headers)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = HTTP_CODES.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(app, request.scope))
        return error(exc.status_code, code, str(exc.detail), headers)

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
        msg = str(exc) if isinstance(exc, RedisUnavailable) else unreachable(exc)
        log.warning("Redis unavailable: %s", msg.removeprefix("Redis unreachable: "))
        return error(503, "redis_unavailable", msg)

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
    app.add_exception_handler(DtqError, handle(400, "bad_request"))
    app.add_exception_handler(Exception, internal)


def _allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route serves at this path (a 405's ``Allow``), HEAD left out."""
    return [
        m
        for m in ("DELETE", "GET", "PATCH", "POST", "PUT")
        if any(r.matches({**scope, "method": m})[0] is Match.FULL for r in app.router.routes)
    ]
