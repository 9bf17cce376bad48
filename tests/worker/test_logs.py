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


def test_runs_do_not_inherit_the_context_of_the_run_that_claimed_them(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    """A run's context variables (a middleware's span, a task's own) stay in that run: the
    runs an outcome write claims next start in the worker's context, not in the writer's."""
    s = make_settings(redis_server.url, prefix, worker_concurrency=4)
    w = spawn_worker("tests.apps.basic:app", s)
    with Client(settings=s) as c:
        hs = c.enqueue_many([{"name": "context_leak", "args": [i]} for i in range(300)])
        seen = [c.result(h.id, timeout=60) for h in hs]
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    assert [x for x in seen if x is not None] == []


def test_a_signal_during_a_run_logs_outside_the_run(redis_server: Any, prefix: str) -> None:
    """The signal handler interrupts whatever the loop runs, a task's body included: the
    drain's log line must not carry that task's id."""
    import asyncio
    import logging

    from dtq import App
    from dtq.context import TaskContext, set_current
    from dtq.logs import TaskContextFilter
    from dtq_worker.worker import Worker

    s = make_settings(redis_server.url, prefix)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.addFilter(TaskContextFilter())
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("dtq.worker")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    async def main() -> None:
        w = Worker(App(s), s)
        w.install_signals()
        ctx = TaskContext("default:t1", "job", "default", 2, 1, 3, "w", None)
        try:
            await asyncio.get_running_loop().create_task(body(ctx))
            for _ in range(3):
                await asyncio.sleep(0)
        finally:
            timer = getattr(w, "_hard_timer", None)
            if timer is not None:
                timer.cancel()

    async def body(ctx: TaskContext) -> None:
        set_current(ctx)
        signal.raise_signal(signal.SIGTERM)  # handled here, inside the run's context

    try:
        asyncio.run(main())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        for sig, h in old.items():
            signal.signal(sig, h)
    drain = [r for r in records if "draining" in r.getMessage()]
    assert drain, [r.getMessage() for r in records]
    assert "task_id" not in drain[0].__dict__
