"""The live event stream resumes where a client left it (``Last-Event-ID``) after a reconnect,
against a real dtq-api process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from dtq import Settings
from tests.api_proc import ApiProc

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
