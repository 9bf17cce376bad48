"""The live event stream resumes where a client left it (``Last-Event-ID``) after a reconnect,
against a real dtq-api process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx

from dtq import Settings
from dtq.admin import Admin
from dtq.admin.views import events_from
from tests.api_proc import ApiProc
from tests.conftest import make_settings

HDR = {"Authorization": "Bearer tok"}


def messages(lines: Iterator[str]) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """(id, data) of each SSE message carrying data."""
    eid: str | None = None
    for line in lines:
        if line.startswith("id: "):
            eid = line[4:]
        elif line.startswith("data: "):
            yield eid, json.loads(line[6:])
            eid = None


def enqueue(api: ApiProc, **body: Any) -> str:
    r = httpx.post(api.url + "/api/v1/tasks", json=body, headers=HDR)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_event_stream_resumes_after_last_event_id(settings: Settings) -> None:
    api = ApiProc(settings, DTQ_API_TOKEN="tok")
    # A read timeout fails the test instead of waiting for events that never come.
    timeout = httpx.Timeout(10.0)
    try:
        # Both queues known before the stream opens (the reader lists queues between reads).
        enqueue(api, name="noop")
        enqueue(api, name="noop", queue="other")
        with httpx.stream("GET", api.url + "/api/v1/events", headers=HDR, timeout=timeout) as r:
            lines = r.iter_lines()
            assert next(lines) == ": connected"
            first = enqueue(api, name="add", args=[1, 1])
            for eid, ev in messages(lines):
                if ev.get("task_id") == first:
                    last_id = eid
                    break
        assert last_id is not None
        # Missed while disconnected, in two queues.
        missed = [enqueue(api, name="add", args=[2, 2]), enqueue(api, name="noop", queue="other")]
        resume = {**HDR, "Last-Event-ID": last_id}
        with httpx.stream("GET", api.url + "/api/v1/events", headers=resume,
                          timeout=timeout) as r:  # fmt: skip
            assert r.status_code == 200
            got: list[tuple[str | None, dict[str, Any]]] = []
            for eid, ev in messages(r.iter_lines()):
                got.append((eid, ev))
                if len(got) == 2:
                    break
        assert [ev["task_id"] for _, ev in got] == missed
        assert all(ev["type"] == "enqueued" and eid == ev["id"] for eid, ev in got)
        bad = httpx.get(api.url + "/api/v1/events", headers={**HDR, "Last-Event-ID": "x"})
        assert bad.status_code == 422
    finally:
        api.close()


# --- a resume reads what it sends, in pages, and lets the loop turn --------------------------


async def _call(app: Any, path: str, headers: list[tuple[bytes, bytes]], send: Any,
                stop: asyncio.Event) -> None:  # fmt: skip
    """One request straight into the ASGI app; it ends when ``stop`` is set (a disconnect)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"127.0.0.1:8000"), *headers],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        await stop.wait()
        return {"type": "http.disconnect"}

    await app(scope, receive, send)


def same_order(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    """The same events, each stream's in its order, all in stream-id order (two streams may
    hold one id: their order between them is free)."""

    def key(d: dict[str, Any]) -> tuple[int, int]:
        return d["ts_ms"], int(d["id"].split("-")[1])

    per = [[d for d in x if d["stream"] == s] for x in (got, want) for s in ("default", "other")]
    keys = [key(d) for d in got]
    return per[:2] == per[2:] and keys == sorted(keys) and len(got) == len(want)


def xrange_counts(r: Any, prefix: str) -> list[int]:
    """The COUNT of every XRANGE on an event stream since the slow log was reset."""
    out = []
    for e in r.slowlog_get(-1):
        cmd = e["command"]
        cmd = cmd.decode() if isinstance(cmd, bytes) else cmd
        words = cmd.split(" ")
        if words[0].upper() == "XRANGE" and words[1].startswith(prefix):
            upper = [w.upper() for w in words]
            out.append(int(words[upper.index("COUNT") + 1]) if "COUNT" in upper else 10**9)
    return out


async def test_resumes_read_in_pages_keep_order_and_let_healthz_answer(
    fresh_redis: Any, prefix: str
) -> None:
    from dtq.admin.events import RESUME_PAGE
    from dtq_api.app import create_app

    settings = make_settings(fresh_redis.url, prefix)
    r = fresh_redis.client()
    async with Admin(settings) as a:
        for i in range(200):  # 200 entries of 20 events, 100 of 4 in another queue
            await a.client.enqueue_many([{"name": "add", "args": [i, j]} for j in range(20)])
            if i % 2:
                await a.client.enqueue_many(
                    [{"name": "add", "args": [i, j], "queue": "other"} for j in range(4)]
                )
    streams = r.keys(f"{prefix}:*events*")
    expected = sorted(
        (e for k in streams for eid, f in r.xrange(k)
         for e in events_from("other" if "other" in k else "default", eid, f)),
        key=lambda e: (e.ts_ms, int(e.id.split("-")[1])),
    )  # fmt: skip
    assert len(expected) == 4400
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()

    app = create_app(settings)
    log: list[tuple[str, bytes]] = []
    sent = {f"resume{i}": 0 for i in range(8)}
    done_at: dict[str, int] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    health: list[asyncio.Task[None]] = []
    frames: dict[str, list[dict[str, Any]]] = {t: [] for t in sent}

    def sender(tag: str) -> Any:
        async def send(m: dict[str, Any]) -> None:
            body = m.get("body", b"")
            log.append((tag, body))
            if tag == "healthz" or not body:
                return
            if body == b": connected\n\n" and not health:
                h = _call(app, "/healthz", [], sender("healthz"), asyncio.Event())
                health.append(loop.create_task(h))
            for _, data in messages(iter(body.decode().split("\n"))):
                frames[tag].append(data)
                sent[tag] += 1
                if sent[tag] == len(expected):
                    done_at[tag] = len(log)

        return send

    hdr = [(b"last-event-id", b"0-0")]
    async with app.router.lifespan_context(app):
        calls = [loop.create_task(_call(app, "/api/v1/events", hdr, sender(t), stop))
                 for t in sent]  # fmt: skip
        async with asyncio.timeout(60):
            while len(done_at) < len(sent):
                await asyncio.sleep(0.01)
            await health[0]
        stop.set()
        await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
    # Every event after the id, in order, to every resume.
    want = [e.to_dict() for e in expected]
    for tag in sent:
        assert same_order(frames[tag][: len(want)], want), tag
    # /healthz answered while the resumes were still sending their backlogs.
    answered = next(i for i, (t, b) in enumerate(log) if t == "healthz" and b)
    assert all(answered < at for at in done_at.values()), (answered, done_at)
    # Each resume read pages of at most RESUME_PAGE entries, about what it sent.
    counts = xrange_counts(r, prefix)
    assert max(counts) <= RESUME_PAGE, counts
    # (per stream, queues' and workers': the entries sent, one page read ahead, one empty
    # read at its end)
    entries, n_streams = 300, 3
    assert sum(counts) <= 8 * (entries + 2 * n_streams * RESUME_PAGE), sum(counts)
    # A backlog over the cap: a resume stops between entries, says so, and is still paged.
    r.slowlog_reset()
    async with Admin(settings) as a:
        got, more = await a.events_after("0-0", 1000)
    assert more and 980 < len(got) <= 1000
    assert same_order([e.to_dict() for e in got], want[: len(got)])
    assert max(xrange_counts(r, prefix)) <= RESUME_PAGE
