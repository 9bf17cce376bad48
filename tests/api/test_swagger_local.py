"""/docs (Swagger UI) is served from the installed wheel (swagger-ui-bundle), under the same
Content-Security-Policy as the dashboard: no CDN, no inline script."""

from __future__ import annotations

import re

import httpx
import pytest

from dtq import Settings
from dtq_api.app import create_app
from dtq_api.guard import CSP


async def test_swagger_ui_is_served_from_the_wheel_under_the_strict_csp(
    settings: Settings,
) -> None:
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h:
        page = await h.get("/docs")
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == CSP
        html = page.text
        assert "<script>" not in html and "cdn" not in html.lower()
        refs = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
        for ref in refs:
            r = await h.get(ref)
            assert r.status_code == 200, ref
        assert any(r.endswith("swagger-ui-bundle.js") for r in refs)
        spec = await h.get("/openapi.json")
        assert spec.status_code == 200 and "/api/v1/tasks" in spec.json()["paths"]


async def test_dashboard_has_a_favicon(settings: Settings) -> None:
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h:
        html = (await h.get("/")).text
        [ref] = re.findall(r'<link rel="icon" href="([^"]+)"', html)
        for path in (ref, "/favicon.ico"):
            r = await h.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg")


async def test_api_starts_and_docs_say_what_to_install_without_the_swagger_package(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtq_api import docs_ui

    monkeypatch.setattr(docs_ui, "assets_dir", lambda: None)
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as h:
        page = await h.get("/docs")
        assert page.status_code == 200 and "pip install 'dtq[api]'" in page.text
        assert (await h.get("/healthz")).status_code == 200
