"""FastAPI integration: one :class:`dtq.AsyncClient` for the web app's lifetime
(:func:`dtq_lifespan`), and a dependency that hands it to each request (:data:`DtqClient`).
Needs ``dtq[api]``; usage: docs/integrations/fastapi.md. Given the :class:`dtq.App`, the client
knows the tasks' declared defaults and runs the app's ``before_enqueue`` middleware.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any

from dtq.app import App
from dtq.errors import ConfigError
from dtq.sdk.client import AsyncClient
from dtq.settings import Settings

try:
    from fastapi import Depends, FastAPI, Request
except ImportError:  # pragma: no cover - depends on the installed extras
    raise ConfigError("dtq.contrib.fastapi needs FastAPI: pip install 'dtq[api]'") from None

STATE_KEY = "dtq_client"
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[Any]]


def dtq_lifespan(
    target: App | Settings | str | None = None, *, lifespan: Lifespan | None = None
) -> Lifespan:
    """A FastAPI lifespan opening one AsyncClient at startup and closing it at shutdown; the
    client of ``target``: a dtq.App, Settings, a Redis URL, or None (DTQ_*).

    ``lifespan``: your own lifespan, run inside this one (the client is ready before it
    starts and closed after it ends); what it yields is passed on as the lifespan state.
    """

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[Mapping[str, Any] | None]:
        if isinstance(target, App):
            client = AsyncClient(app=target)
        elif isinstance(target, Settings):
            client = AsyncClient(settings=target)
        else:
            client = AsyncClient(target)
        setattr(app.state, STATE_KEY, client)
        try:
            if lifespan is None:
                yield None
            else:
                async with lifespan(app) as state:
                    yield state
        finally:
            delattr(app.state, STATE_KEY)
            await client.close()

    return run


def get_client(request: Request) -> AsyncClient:
    """The dependency: the AsyncClient opened by :func:`dtq_lifespan`."""
    client = getattr(request.app.state, STATE_KEY, None)
    if not isinstance(client, AsyncClient):
        raise ConfigError("no dtq client: create the app with FastAPI(lifespan=dtq_lifespan(...))")
    return client


DtqClient = Annotated[AsyncClient, Depends(get_client)]
"""Annotate a path operation's parameter with this to receive the client."""
