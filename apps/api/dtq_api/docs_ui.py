"""``/docs``: Swagger UI from an installed wheel, not a CDN: ``static/docs.html``, started by
``static/docs.js`` rather than an inline script, so the page runs under the dashboard's own
Content-Security-Policy ('self' only).

The files come from ``fastapi-offline`` (MIT; Swagger UI is Apache-2.0): its Swagger UI 5
renders FastAPI's OpenAPI 3.1 (``swagger-ui-bundle``'s 4.15 refuses it). Only its static files
are used, not its ``FastAPIOffline`` class.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

log = logging.getLogger("dtq.api")
ASSETS = "/docs/assets"  # (named in static/docs.html)
PAGE = Path(str(resources.files("dtq_api") / "static" / "docs.html"))
MISSING = """<!doctype html><meta charset="utf-8"><title>dtq API</title>
<p>Swagger UI needs the <code>fastapi-offline</code> package of the <code>api</code> extra:
<code>pip install 'dtq[api]'</code>. The OpenAPI document is at
<a href="/openapi.json">/openapi.json</a>.</p>
"""


def assets_dir() -> Path | None:
    """Where the Swagger UI files are, or None when ``fastapi-offline`` is not installed."""
    try:
        return Path(str(resources.files("fastapi_offline") / "static"))
    except ModuleNotFoundError:
        return None


def install(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets (build the app with ``docs_url=None``). Without the
    package the API still starts; ``/docs`` then says what to install."""
    assets = assets_dir()
    if assets is not None:
        app.mount(ASSETS, StaticFiles(directory=assets), name="swagger-ui")
    else:
        log.warning("/docs: Swagger UI not installed (pip install 'dtq[api]')")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text() if assets is not None else MISSING)
