"""dtq-api under abuse: huge bodies, many event streams, cross-site requests, odd headers.

The body and stream tests run against a real ``dtq-api`` process (tests/api_proc.py): what they
protect (memory, connections) only shows in a real server.
"""

from __future__ import annotations

import asyncio
import select
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from dtq import Settings
from dtq_api.app import create_app
from tests.api_proc import ApiProc
from tests.conftest import ROOT, worker_env

TOKEN = "abuse-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send_chunked(port: int, path: str, headers: dict[str, str], total: int) -> tuple[int, int]:
    """POST ``total`` bytes of chunked body, stopping as soon as the server answers or closes.

    Returns (status code, body bytes the socket accepted).
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nTransfer-Encoding: chunked\r\n"
    head += "Content-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sock.sendall(head.encode())
    chunk = b"1" * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            sock.sendall(frame)
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    reply = b""
    try:
        while b"\r\n" not in reply:
            got = sock.recv(4096)
            if not got:
                break
            reply += got
    except ConnectionResetError:
        pass
    sock.close()
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0
    return status, sent


@pytest.mark.slow
def test_unauthenticated_huge_chunked_body_is_refused_unread(settings: Settings) -> None:
    api = ApiProc(settings, DTQ_API_TOKEN=TOKEN)
    try:
        before = rss_kb(api.proc.pid)
        status, sent = send_chunked(api.port, "/api/v1/tasks", {}, 100 * 1024 * 1024)
        after = rss_kb(api.proc.pid)
        assert status == 401
        # Socket buffers take a few MB before the answer lands; the server must not read on.
        assert sent < 20 * 1024 * 1024, sent
        assert after - before < 30 * 1024, (before, after)
        # With the token, a body past the cap is cut off with 413 while it is being read.
        status, sent = send_chunked(api.port, "/api/v1/tasks", AUTH, 100 * 1024 * 1024)
        assert status == 413
        assert sent < 20 * 1024 * 1024, sent
        assert rss_kb(api.proc.pid) - before < 30 * 1024
        # The server still serves.
        ok = httpx.post(api.url + "/api/v1/tasks", json={"name": "add"}, headers=AUTH)
        assert ok.status_code == 201, ok.text
    finally:
        api.close()


async def _open_stream(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
    return reader, writer, head


@pytest.mark.slow
async def test_many_event_streams_leave_probes_and_routes_answering(settings: Settings) -> None:
    api = ApiProc(settings)
    conns: list[asyncio.StreamWriter] = []
    try:
        async with httpx.AsyncClient(base_url=api.url, timeout=30) as c:
            assert (await c.post("/api/v1/tasks", json={"name": "add"})).status_code == 201
            heads: list[bytes] = []
            for start in range(0, 500, 50):
                batch = await asyncio.gather(
                    *(_open_stream(api.port) for _ in range(start, start + 50))
                )
                for _, w, head in batch:
                    conns.append(w)
                    heads.append(head)
            assert all(h.startswith(b"HTTP/1.1 200") for h in heads), {h[:20] for h in heads}
            for path in ("/readyz", "/metrics", "/api/v1/queues", "/api/v1/tasks"):
                r = await c.get(path)
                assert r.status_code == 200, (path, r.text)
            r = await c.post("/api/v1/tasks", json={"name": "add"})
            assert r.status_code == 201, r.text
    finally:
        for w in conns:
            w.close()
        api.close()


@pytest.mark.slow
async def test_event_streams_past_the_cap_get_503_with_retry_after(settings: Settings) -> None:
    api = ApiProc(settings, DTQ_API_MAX_STREAMS="5")
    conns: list[asyncio.StreamWriter] = []
    try:
        for _ in range(5):
            _, w, head = await _open_stream(api.port)
            conns.append(w)
            assert head.startswith(b"HTTP/1.1 200"), head
        r = httpx.get(api.url + "/api/v1/events", timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_streams"
        assert int(r.headers["retry-after"]) > 0
        assert httpx.get(api.url + "/readyz").status_code == 200
        # A closed stream frees its place.
        conns.pop().close()
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            _, w, head = await _open_stream(api.port)
            conns.append(w)
            if head.startswith(b"HTTP/1.1 200"):
                break
            conns.pop().close()
            assert asyncio.get_running_loop().time() < deadline, head
            await asyncio.sleep(0.1)
    finally:
        for w in conns:
            w.close()
        api.close()


# --- cross-site requests and exposure -------------------------------------------------------


@pytest.fixture
async def local(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app as `dtq-api` serves it on 127.0.0.1:8000 (no token)."""
    app = create_app(settings, bind_host="127.0.0.1")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
        yield c


async def test_cross_site_state_changes_are_refused(local: httpx.AsyncClient) -> None:
    t = (await local.post("/api/v1/tasks", json={"name": "add"})).json()  # no Origin: a script
    assert t["status"] == "queued"
    evil = {"Origin": "http://evil.example"}
    for method, path in (
        ("POST", "/api/v1/queues/default/purge"),
        ("POST", "/api/v1/queues/default/pause"),
        ("POST", f"/api/v1/tasks/{t['id']}/cancel"),
        ("POST", "/api/v1/tasks"),
        ("DELETE", f"/api/v1/dlq/{t['id']}"),
    ):
        r = await local.request(method, path, headers=evil, json={"name": "add"})
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "forbidden"
    r = await local.post(
        "/api/v1/queues/default/purge", headers={"Referer": "http://evil.example/page"}
    )
    assert r.status_code == 403
    # A form posted from a page served by a name rebound to 127.0.0.1: Origin matches Host,
    # but the Host is not the server's own.
    r = await local.post(
        "/api/v1/queues/default/purge",
        headers={"Host": "evil.example:8000", "Origin": "http://evil.example:8000"},
    )
    assert r.status_code == 403
    assert (await local.get(f"/api/v1/tasks/{t['id']}")).json()["status"] == "queued"
    # The dashboard's own requests (same origin) pass; reads pass from anywhere.
    own = {"Origin": "http://127.0.0.1:8000"}
    r = await local.post("/api/v1/queues/default/pause", headers=own)
    assert r.status_code == 200, r.text
    same = {"Origin": "http://localhost:8000", "Host": "localhost:8000"}
    r = await local.post("/api/v1/queues/default/resume", headers=same)
    assert r.status_code == 200, r.text
    assert (await local.get("/api/v1/queues", headers=evil)).status_code == 200


async def test_reads_from_a_dns_rebound_page_are_refused(local: httpx.AsyncClient) -> None:
    # A page of attacker.example whose name now resolves to 127.0.0.1 reads the API as its
    # own origin: the browser sends Host: attacker.example, and no Origin on a same-origin GET.
    t = (await local.post("/api/v1/tasks", json={"name": "add", "args": [1, 2]})).json()
    rebound = {"Host": "attacker.example:8000"}
    for path in (f"/api/v1/tasks/{t['id']}", "/api/v1/tasks", "/api/v1/events", "/metrics", "/"):
        r = await local.get(path, headers=rebound)
        assert r.status_code == 403, (path, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == "forbidden", path
        assert "attacker.example" in r.json()["error"]["message"]
        assert "\n" not in r.text
    r = await local.get("/api/v1/tasks", headers={"Host": "attacker.example"})
    assert r.status_code == 403
    # The server's own names, with or without a port, any case, IPv6 in brackets; and any
    # IP literal (a probe's pod IP: a rebound page always names a host, never an address).
    for host in ("127.0.0.1:8000", "localhost", "LocalHost:8000", "[::1]:8000", "[::1]",
                 "10.1.2.3:8000", "[fd00::5]:8000"):  # fmt: skip
        r = await local.get(f"/api/v1/tasks/{t['id']}", headers={"Host": host})
        assert r.status_code == 200, (host, r.text)
        assert (await local.get("/healthz", headers={"Host": host})).status_code == 200, host
    # A name that only looks like an address is a name.
    for host in ("127.0.0.1.attacker.example", "[::1].attacker.example", "1.2.3.4.nip.io:80"):
        assert (await local.get("/api/v1/tasks", headers={"Host": host})).status_code == 403, host


async def test_host_check_covers_reads_with_allowed_hosts_and_a_token(settings: Settings) -> None:
    # Behind a proxy with a token: the names of DTQ_API_ALLOWED_HOSTS pass, others are refused
    # on every method, before the token is looked at; probes by IP pass.
    named = settings.model_copy(update={"api_allowed_hosts": ("dtq.example",), "api_token": "t"})
    hdr = {"Authorization": "Bearer t"}
    app = create_app(named, bind_host="127.0.0.1")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        r = await c.get("/api/v1/queues", headers={**hdr, "Host": "dtq.example"})
        assert r.status_code == 200, r.text
        r = await c.get("/api/v1/queues", headers={**hdr, "Host": "evil.example"})
        assert r.status_code == 403, r.text
        r = await c.get("/metrics", headers={"Host": "evil.example"})
        assert r.status_code == 403, r.text
        assert (await c.get("/readyz", headers={"Host": "10.0.0.7:8000"})).status_code == 200
        assert (await c.get("/api/v1/queues", headers={"Host": "localhost"})).status_code == 401


async def test_every_response_carries_security_headers(local: httpx.AsyncClient) -> None:
    for path in ("/", "/healthz", "/api/v1/queues", "/api/v1/nothing", "/static/app.js"):
        r = await local.get(path)
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp, path
        assert "default-src 'self'" in csp, path
        assert r.headers.get("x-content-type-options") == "nosniff", path
        assert r.headers.get("referrer-policy") == "no-referrer", path
    r = await local.post("/api/v1/queues/default/purge", headers={"Origin": "http://evil.example"})
    assert r.headers.get("x-content-type-options") == "nosniff"


def run_api(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dtq_api", "--port", "0", *args],
        cwd=ROOT, env=worker_env(settings, **env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_binding_beyond_loopback_without_a_token_is_refused(settings: Settings) -> None:
    p = run_api(settings, "--host", "0.0.0.0")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "DTQ_API_TOKEN" in lines[0] and "--insecure" in lines[0]


def test_token_with_a_trailing_newline_is_refused_at_start(settings: Settings) -> None:
    p = run_api(settings, DTQ_API_TOKEN="s3cret\n")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "DTQ_API_TOKEN" in lines[0], p.stderr


@pytest.mark.slow
def test_insecure_bind_starts_and_warns_that_auth_is_off(settings: Settings) -> None:
    api = ApiProc(settings, args=("--host", "0.0.0.0", "--insecure"))
    try:
        assert "auth is off" in api.output()
    finally:
        api.close()


# --- smaller protocol faults ----------------------------------------------------------------


async def test_idempotency_key_header_is_read_as_utf8(local: httpx.AsyncClient) -> None:
    key = "commande-été-№1"
    r1 = await local.post(
        "/api/v1/tasks",
        json={"name": "add"},
        headers={"Idempotency-Key": key.encode()},  # UTF-8 bytes, as a browser sends them
    )
    r2 = await local.post("/api/v1/tasks", json={"name": "add", "idempotency_key": key})
    assert r1.status_code == 201, r1.text
    assert r2.status_code == 200 and r2.json()["id"] == r1.json()["id"]


async def test_dlq_discard_with_ids_honours_the_queue_filter(
    local: httpx.AsyncClient, settings: Settings
) -> None:
    a = (await local.post("/api/v1/tasks", json={"name": "add", "queue": "qa"})).json()
    b = (await local.post("/api/v1/tasks", json={"name": "add", "queue": "qb"})).json()
    for t in (a, b):
        await local.post(f"/api/v1/tasks/{t['id']}/cancel")
    # Neither is a dead letter; but the filter must first rule out qb's task.
    r = await local.post("/api/v1/dlq/discard", json={"ids": [a["id"], b["id"]], "queue": "qa"})
    assert r.status_code == 200, r.text
    assert r.json()["skipped"] == {"cancelled": 1, "filtered": 1}


async def test_readyz_names_the_cause_once(settings: Settings) -> None:
    from tests.conftest import make_settings

    down = make_settings("redis://127.0.0.1:1/0", settings.key_prefix)
    app = create_app(down)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/readyz")
    msg = r.json()["error"]["message"]
    assert r.status_code == 503 and msg.count("unreachable") == 1, msg


async def test_405_carries_allow_and_400s_say_bad_request(local: httpx.AsyncClient) -> None:
    r = await local.put("/api/v1/queues")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers.get("allow") == "GET", r.headers
    r = await local.delete("/api/v1/tasks")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "POST"}
    # A 400 raised by the framework (here: an undecodable form of a JSON body) says bad_request.
    r = await local.post(
        "/api/v1/tasks", content=b"\xff\xfe{", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.text


async def test_metadata_strings_past_their_cap_are_refused_not_read_as_numbers(
    local: httpx.AsyncClient,
) -> None:
    # Found by a long schemathesis run: "000...0" (201 digits) fell through to int 0.
    for value in ("0" * 201, "1" * 201, "1.5" + "0" * 200):
        r = await local.post("/api/v1/tasks", json={"name": "add", "metadata": {"k": value}})
        assert r.status_code == 422, (value[:10], r.text)
    ok = {"s": "0" * 200, "i": 3, "f": 1.5, "b": True, "n": None}
    r = await local.post("/api/v1/tasks", json={"name": "add", "metadata": ok})
    assert r.status_code == 201 and r.json()["metadata"] == ok, r.text


async def test_internal_errors_carry_the_security_headers_too(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtq.admin import Admin

    async def broken(self: Admin) -> list[str]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Admin, "queue_names", broken)
    app = create_app(settings, bind_host="127.0.0.1")
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
        r = await c.get("/api/v1/queues")
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal"
    assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", "")
    assert r.headers.get("x-content-type-options") == "nosniff"


async def test_allowed_hosts_bound_the_host_check_beyond_loopback(settings: Settings) -> None:
    named = settings.model_copy(update={"api_allowed_hosts": ("dtq.internal",), "api_token": "t"})
    hdr = {"Authorization": "Bearer t"}
    app = create_app(named, bind_host="0.0.0.0")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        await c.post("/api/v1/tasks", json={"name": "add"}, headers={**hdr, "Host": "dtq.internal"})
        r = await c.post("/api/v1/queues/default/pause", headers={**hdr, "Host": "dtq.internal"})
        assert r.status_code == 200, r.text
        r = await c.post("/api/v1/queues/default/resume", headers={**hdr, "Host": "evil.example"})
        assert r.status_code == 403, r.text
    # No names given and bound beyond loopback: any Host (only Origin is checked).
    app = create_app(settings.model_copy(update={"api_token": "t"}), bind_host="0.0.0.0")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        r = await c.post("/api/v1/queues/default/resume", headers={**hdr, "Host": "any.example"})
        assert r.status_code == 200, r.text
        foreign = {**hdr, "Host": "any.example", "Origin": "http://evil.example"}
        r = await c.post("/api/v1/queues/default/pause", headers=foreign)
        assert r.status_code == 403, r.text
