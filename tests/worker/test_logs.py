"""Structured logs: one line per lifecycle event with task id, queue, attempt and worker."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from dtq import Client
from tests.conftest import make_settings, wait_until

pytestmark = pytest.mark.slow


def test_worker_json_logs_one_line_per_lifecycle_event(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    s = make_settings(redis_server.url, prefix)
    w = spawn_worker(
        "tests.apps.basic:app", s, "--worker-id", "wlog", DTQ_LOG_FORMAT="json", DTQ_LOG_TASKS="all"
    )
    with Client(settings=s) as c:
        ok = c.enqueue("add", [1, 2])
        retried = c.enqueue("flaky", [1])
        assert c.result(ok.id, timeout=30) == 3
        assert c.result(retried.id, timeout=30) == 2
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    wait_until(lambda: "stopped" in w.output(), timeout=10)
    lines = [json.loads(x) for x in w.output().splitlines() if x.startswith("{")]
    assert lines, w.output()
    mine = [x for x in lines if x.get("task_id") in (ok.id, retried.id)]
    events = [(x["task_id"], x["msg"].split()[0], x["attempt"]) for x in mine]
    expected = [
        (ok.id, "started", 1), (ok.id, "succeeded", 1),
        (retried.id, "started", 1), (retried.id, "retried", 1),
        (retried.id, "started", 2), (retried.id, "succeeded", 2),
    ]  # fmt: skip
    assert sorted(events) == sorted(expected)
    for x in mine:
        assert x["queue"] == "default" and x["worker"] == "wlog" and x["level"] == "info"
