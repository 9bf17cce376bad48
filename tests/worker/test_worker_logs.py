"""What a worker logs (docs/operations.md, "Logs"): the records a task logs through its own
loggers reach the worker's log tagged with the run; a failed task is an ERROR with its
traceback; which per-task lines appear is DTQ_LOG_TASKS; the level is a flag in any case."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from dtq import Client, TaskFailed
from tests.conftest import WorkerProc, make_settings

pytestmark = pytest.mark.slow
APP = "tests.apps.logging_app:app"


def _run(redis_server: Any, prefix: str, spawn_worker: Any, *flags: str, **env: str) -> Any:
    """A worker of the logging app that ran chatty, sync_chatty and a failing task, stopped."""
    s = make_settings(redis_server.url, prefix)
    w: WorkerProc = spawn_worker(APP, s, "--worker-id", "wl", *flags, **env)
    with Client(settings=s) as c:
        ids = {
            "chatty": c.enqueue("chatty", ["hello"]).id,
            "sync_chatty": c.enqueue("sync_chatty", ["there"]).id,
            "boom": c.enqueue("boom").id,
        }
        assert c.result(ids["chatty"], timeout=30) == "hello"
        assert c.result(ids["sync_chatty"], timeout=30) == "there"
        with pytest.raises(TaskFailed):
            c.result(ids["boom"], timeout=30)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0  # exited: its output is all written
    return w.output(), ids


def test_task_records_reach_the_text_log_tagged_with_their_run(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    out, ids = _run(redis_server, prefix, spawn_worker)
    lines = out.splitlines()
    info = [x for x in lines if x.endswith("info hello")]
    assert len(info) == 1, out
    assert " INFO    tests.apps.logging_app [chatty " in info[0]
    assert f"{ids['chatty']} attempt 1]: info hello" in info[0]
    warn = [x for x in lines if x.endswith("warning hello")]
    assert len(warn) == 1 and " WARNING tests.apps.logging_app [chatty " in warn[0], out
    sync = [x for x in lines if x.endswith("sync info there")]
    assert len(sync) == 1 and f"[sync_chatty {ids['sync_chatty']} attempt 1]" in sync[0], out
    assert "debug hello" not in out  # below the worker's level (INFO)


def test_a_failed_task_is_an_error_with_its_traceback(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    out, ids = _run(redis_server, prefix, spawn_worker)
    lines = out.splitlines()
    at = [i for i, x in enumerate(lines) if f"failed boom {ids['boom']} attempt 1" in x]
    assert len(at) == 1, out
    assert " ERROR   dtq.executor: " in lines[at[0]]
    assert "ValueError: the body broke" in lines[at[0]]
    assert lines[at[0] + 1].startswith("Traceback (most recent call last):"), out
    tb = lines[at[0] + 1 :]
    assert any(x.startswith("ValueError: the body broke") for x in tb), out
    # The default DTQ_LOG_TASKS=failures: no line for runs that start or succeed.
    assert f"succeeded chatty {ids['chatty']}" not in out
    assert f"started chatty {ids['chatty']}" not in out


def test_json_lines_carry_the_run_and_the_extra_fields(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    out, ids = _run(redis_server, prefix, spawn_worker, DTQ_LOG_FORMAT="json")
    recs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    mine = [r for r in recs if r.get("logger") == "tests.apps.logging_app"]
    info = next(r for r in mine if r["msg"] == "info hello")
    assert info["level"] == "info" and info["task_id"] == ids["chatty"]
    assert info["task"] == "chatty" and info["attempt"] == 1 and info["customer"] == "acme"
    failed = next(r for r in recs if r.get("task_id") == ids["boom"] and r["level"] == "error")
    assert failed["msg"].startswith("failed boom") and "Traceback" in failed["exc"]
    assert failed["exc"].rstrip().endswith("ValueError: the body broke")


def test_log_level_flag_in_any_case_and_log_tasks_all(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    out, ids = _run(redis_server, prefix, spawn_worker, "--log-level", "warning",
                    DTQ_LOG_TASKS="ALL")  # fmt: skip
    assert "warning hello" in out and "info hello" not in out
    assert "started chatty" not in out  # INFO lines, below WARNING
    assert "failed boom" in out  # ERROR
    out, ids = _run(redis_server, prefix + "b", spawn_worker, DTQ_LOG_TASKS="all",
                    DTQ_LOG_LEVEL="debug")  # fmt: skip
    assert "debug hello" in out
    for verb in ("started", "succeeded"):
        assert f"{verb} chatty {ids['chatty']} attempt 1" in out, out


def test_log_tasks_outcomes_logs_each_end_but_no_start(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    out, ids = _run(redis_server, prefix, spawn_worker, DTQ_LOG_TASKS="outcomes")
    assert f"succeeded chatty {ids['chatty']} attempt 1" in out
    assert f"started chatty {ids['chatty']}" not in out


def test_a_retry_is_an_info_line_without_traceback(
    redis_server: Any, prefix: str, spawn_worker: Any
) -> None:
    s = make_settings(redis_server.url, prefix)
    w: WorkerProc = spawn_worker(APP, s, "--worker-id", "wr")
    with Client(settings=s) as c:
        h = c.enqueue("boom_once")
        with pytest.raises(TaskFailed):
            c.result(h.id, timeout=30)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    lines = w.output().splitlines()
    retried = [x for x in lines if f"retried boom_once {h.id} attempt 1" in x]
    assert len(retried) == 1 and " INFO    dtq.executor: " in retried[0], lines
    failed = [i for i, x in enumerate(lines) if f"failed boom_once {h.id} attempt 2" in x]
    assert len(failed) == 1 and lines[failed[0] + 1].startswith("Traceback"), lines
