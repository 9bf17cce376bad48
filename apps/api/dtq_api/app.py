"""The FastAPI application: ``/api/v1`` (backed by :mod:`dtq.admin` and the SDK), the dashboard
at ``/``, ``/healthz``, ``/readyz`` and the fleet ``/metrics``; every error answers
``{"error": {"code", "message"}}`` and only ``/api/v1`` needs the token (docs/operations.md).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp

from dtq import __version__
from dtq.admin import Admin
from dtq.app import App
from dtq.settings import Settings, load_settings
from dtq_api import docs_ui
from dtq_api.deps import get_hub
from dtq_api.errors import install_errors
from dtq_api.guard import Guard, allowed_hosts
from dtq_api.routes import api_router, health

log = logging.getLogger("dtq.api")
BODY_SLACK = 64 * 1024  # JSON framing around the arguments


class GuardedFastAPI(FastAPI):
    """FastAPI with :class:`~dtq_api.guard.Guard` outside everything, even the handler of
    unexpected errors, so every answer (a 500 too) passes the guard's checks and headers."""

    guard_options: dict[str, Any]

    def build_middleware_stack(self) -> ASGIApp:
        return Guard(super().build_middleware_stack(), **self.guard_options)


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

    install_errors(app)
    app.guard_options = {
        "token": settings.api_token,
        "max_body": settings.api_max_body_bytes or settings.max_payload_bytes + BODY_SLACK,
        "hosts": allowed_hosts(bind_host, settings.api_allowed_hosts),
    }
    app.include_router(api_router())

    app.include_router(health.router)
    docs_ui.install(app)
    static = Path(str(resources.files("dtq_api") / "static"))

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(static / "index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(static / "favicon.svg", media_type="image/svg+xml")

    app.mount("/static", StaticFiles(directory=static), name="static")
    return app
