"""What the API's routers share: the app's Admin and event hub, the bearer-token check, and the
path and query parameter types."""

from __future__ import annotations

from typing import Annotated

from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi import Path as PathParam

from dtq.admin import Admin
from dtq.sdk.groupops import CURSOR_RE as GROUP_CURSOR_RE
from dtq.sdk.groupops import MAX_GROUP_LEN
from dtq.settings import Settings
from dtq_api import schemas as s
from dtq_api.errors import ApiError
from dtq_api.events import EventHub, hub_for
from dtq_api.guard import bearer_ok


def _cursor(pattern: str) -> object:
    return Query(pattern=pattern, description="The previous page's next_cursor (opaque).")


Cursor = Annotated[str | None, _cursor(r"^[0-9]{1,19}(\.[0-9]{1,9})?$")]  # the DLQ's position
# <ms>.<seq>[-<index in a bulk enqueue's entry>].<queue>: dtq.admin.task_index
TASK_CURSOR_RE = (
    r"^[0-9]{1,19}\.[0-9]{1,19}(-[0-9]{1,19})?(\.[A-Za-z0-9_.\-]{0,100}(~[1-9][0-9]{0,2})?)?$"
)
TaskCursor = Annotated[str | None, _cursor(TASK_CURSOR_RE)]
GroupCursor = Annotated[str | None, _cursor(GROUP_CURSOR_RE)]  # dtq.sdk.groupops
QueueFilter = Annotated[str | None, Query(pattern=s.QUEUE_RE)]
NameFilter = Annotated[str | None, Query(max_length=200)]
Limit = Annotated[int, Query(ge=1, le=1000)]
RetryBody = Annotated[s.RetryRequest | None, Body()]
TaskId = Annotated[str, PathParam(pattern=s.TASK_ID_RE, description="<queue>:<tid>")]
QueueName = Annotated[str, PathParam(pattern=s.QUEUE_RE)]
ScheduleName = Annotated[str, PathParam(min_length=1, max_length=200)]
GroupName = Annotated[str, PathParam(min_length=1, max_length=MAX_GROUP_LEN)]


def get_admin(app: FastAPI) -> Admin:
    """The app's Admin (made on first use when the lifespan did not run, as in ASGI tests)."""
    a: Admin | None = getattr(app.state, "admin", None)
    if a is None:
        a = app.state.admin = Admin(app.state.settings)
    return a


def get_hub(app: FastAPI) -> EventHub:
    """The app's event hub (one Redis reader for every SSE stream), made on first use."""
    hub: EventHub | None = getattr(app.state, "hub", None)
    if hub is None:
        settings: Settings = app.state.settings
        hub = app.state.hub = hub_for(settings, settings.api_max_streams)
    return hub


def _admin_dep(request: Request) -> Admin:
    return get_admin(request.app)


A = Annotated[Admin, Depends(_admin_dep)]


async def auth(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """With ``DTQ_API_TOKEN`` set, ``Authorization: Bearer <token>`` (constant-time compare)."""
    token = request.app.state.settings.api_token
    if token and not bearer_ok((authorization or "").encode("latin-1"), token):
        raise ApiError(401, "unauthorized", "missing or wrong bearer token")


def utf8_header(name: str, value: str) -> str:
    """A header value as the UTF-8 its bytes are (ASGI servers hand them over as latin-1)."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise ApiError(400, "bad_request", f"{name} is not UTF-8") from None
