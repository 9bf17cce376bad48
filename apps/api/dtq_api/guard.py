"""The API's front door, a pure ASGI middleware run before any route reads the request; in
order: the ``Host`` check (403), the bearer token on ``/api/v1`` from the headers alone (401),
a state-changing request's ``Origin``/``Referer`` against its ``Host`` (403), the body counted
while it arrives (413 past the cap), then the security headers on every answer. Why each:
docs/operations.md, "Exposure: who may change things".
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The dashboard and /docs (Swagger UI from the wheel) load their own scripts and stylesheets
# only; their markup sets a few inline styles.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "content-security-policy": CSP,
}
SECURED = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]


def is_loopback(host: str) -> bool:
    return host.strip("[]").lower() in LOOPBACK_HOSTS or host.startswith("127.")


def bearer_ok(header: bytes, token: str) -> bool:
    """Whether an ``Authorization`` header is ``Bearer <token>`` (constant-time compare)."""
    scheme, _, given = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token.encode())


def allowed_hosts(bind_host: str | None, extra: Iterable[str]) -> frozenset[str] | None:
    """Host names requests may name; None means any (nothing to check against).

    Bound to loopback, loopback names (a DNS-rebound name is refused). Bound beyond it, the
    names in ``extra`` when given, else any: the server cannot know its public names. The
    bound name itself counts when it is one (not ``0.0.0.0`` or ``::``).
    """
    names = {h.lower().strip("[]") for h in extra}
    if bind_host is not None and bind_host.strip("[]") not in ("", "0.0.0.0", "::"):
        names.add(bind_host.lower().strip("[]"))
    if bind_host is not None and is_loopback(bind_host):
        return frozenset(LOOPBACK_HOSTS | names)
    return frozenset(names) if names else None


def host_allowed(hosts: frozenset[str] | None, netloc: str) -> bool:
    """Whether a request's ``Host`` (``name[:port]``, ``[v6][:port]``) is one ``hosts`` allows.

    An IP address always is: DNS rebinding needs a name the attacker controls (the browser
    sends the page's name as ``Host``), and a probe or scraper sends the pod's address. The
    port is not compared: a rebound page has the server's port already.
    """
    if hosts is None:
        return True
    name = _hostname(netloc)
    if name is None:
        return False
    if name in hosts:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _hostname(netloc: str) -> str | None:
    """``host[:port]`` to the host name, IPv6 brackets removed; None when malformed."""
    netloc = netloc.lower()
    if netloc.startswith("["):
        name, close, port = netloc[1:].partition("]")
        if not close or (port and not (port[0] == ":" and port[1:].isdigit())):
            return None
        return name
    name, colon, port = netloc.partition(":")
    if colon and not port.isdigit():
        return None  # a second colon (an IPv6 address without brackets) or a bad port
    return name or None


def _origin_netloc(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    netloc = parts.netloc.lower().rpartition("@")[2]
    default = ":443" if parts.scheme == "https" else ":80"
    return netloc.removesuffix(default)


class Guard:
    """See the module doc. ``max_body`` in bytes; ``hosts`` from :func:`allowed_hosts`."""

    def __init__(
        self, app: ASGIApp, *, token: str | None, max_body: int, hosts: frozenset[str] | None
    ) -> None:
        self.app, self.token, self.max_body, self.hosts = app, token, max_body, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *SECURED]}
            await send(message)

        async def refuse(status: int, code: str, message: str, *more: tuple[str, str]) -> None:
            body = {"error": {"code": code, "message": message}}
            hdrs = {**dict(more), **SECURITY_HEADERS}
            await JSONResponse(body, status, hdrs)(scope, receive, send)

        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k.lower(), v)
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_allowed(self.hosts, host):
            where = f"Host {host[:100]!r} is not one this server answers for"
            await refuse(403, "forbidden", where + " (DTQ_API_ALLOWED_HOSTS)")
            return
        api_path = path == "/api/v1" or path.startswith("/api/v1/")
        given = headers.get(b"authorization", b"")
        if self.token and api_path and not bearer_ok(given, self.token):
            msg = "missing or wrong bearer token"
            await refuse(401, "unauthorized", msg, ("www-authenticate", "Bearer"))
            return
        if scope.get("method", "GET") in UNSAFE_METHODS:
            cross = self._cross_site(headers)
            if cross:
                await refuse(403, "forbidden", cross)
                return
        body = await self._read_body(headers, receive)
        if body is None:
            return  # the client left while sending
        if isinstance(body, int):
            msg = f"request body over {body} bytes"
            await refuse(413, "payload_too_large", msg, ("connection", "close"))
            return
        await self.app(scope, _replay(body, receive), send_secured)

    def _cross_site(self, headers: dict[bytes, bytes]) -> str | None:
        host = headers.get(b"host", b"").decode("latin-1").lower()
        raw = headers.get(b"origin") or headers.get(b"referer")
        if raw is None:
            return None  # not sent by a browser page
        origin = _origin_netloc(raw.decode("latin-1"))
        if origin is None or origin != host.removesuffix(":80"):
            return "cross-origin request refused (Origin/Referer is not this server)"
        return None

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes | int | None:
        """The whole body, the cap (int) once it is passed, or None when the client left."""
        size = headers.get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > self.max_body):
            return self.max_body
        if size is None and b"transfer-encoding" not in headers:
            return b""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body:
                return self.max_body
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the buffered body once, then waits on the real one (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message: Message = await receive()
        return message

    return replay
