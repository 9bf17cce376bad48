"""The ``dtq`` admin CLI: tables, --json, confirmations, progress, documented exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from dtq import Client, Settings
from tests.conftest import ROOT
from tests.helpers import make_dead_letters
from tests.redis_server import free_port


@pytest.mark.cluster
def test_enqueue_task_and_tasks(dtq: Any) -> None:
    r = dtq("enqueue", "add", "--args", "[1, 2]", "--priority", "7", "--json")
    assert r.code == 0, r.err
    tid = r.json()["id"]
    assert r.json()["status"] == "queued" and r.json()["created"] is True
    r = dtq("enqueue", "add", "--args", "[1, 2]", "--idempotency-key", "k")
    first = r.out.split()[0]
    r = dtq("enqueue", "add", "--args", "[1, 2]", "--idempotency-key", "k")
    assert r.out.split()[0] == first and "(existing)" in r.out
    r = dtq("task", tid)
    assert r.code == 0 and "status: queued" in r.out and "args: [1, 2]" in r.out
    assert "enqueued" in r.out  # history
    d = dtq("task", tid, "--json").json()
    assert d["id"] == tid and d["priority"] == 7 and d["history"][0]["type"] == "enqueued"
    r = dtq("tasks", "--name", "add")
    assert r.code == 0 and tid in r.out and r.out.startswith("ID")
    page = dtq("tasks", "--json", "--limit", "1").json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    rest = dtq("tasks", "--json", "--cursor", page["next_cursor"]).json()
    assert {t["id"] for t in page["items"] + rest["items"]} == {tid, first}


@pytest.mark.cluster
def test_queues_pause_resume_purge_with_confirmation(dtq: Any, client: Client) -> None:
    client.enqueue_many([{"name": "add", "args": [i, i], "priority": i % 10} for i in range(30)])
    client.enqueue("add", [1, 1], delay=60)
    qs = dtq("queues", "--json").json()
    assert qs[0]["name"] == "default" and qs[0]["queued"] == 30 and qs[0]["scheduled"] == 1
    assert qs[0]["depth"]["9"] == 3
    r = dtq("queues")
    assert r.out.splitlines()[0].split()[:3] == ["QUEUE", "QUEUED", "BY"]
    assert "p9:3" in r.out
    assert dtq("pause", "default").out.strip() == "default: paused"
    assert "(already)" in dtq("pause", "default").out
    assert dtq("queues", "default", "--json").json()["paused"] is True
    assert dtq("resume", "default").code == 0
    # Declining the prompt changes nothing and exits 1.
    r = dtq("purge", "default", stdin="n\n")
    assert r.code == 1 and "Delete 30 queued and 1 scheduled" in r.err  # prompts go to stderr
    assert dtq("queues", "default", "--json").json()["queued"] == 30
    r = dtq("purge", "default", stdin="y\n")
    assert r.code == 0 and "purged 31 tasks" in r.out
    r = dtq("purge", "default", "--yes", "--json")
    assert r.code == 0 and r.json()["done"] == 0


def test_dlq_commands(dtq: Any, client: Client) -> None:
    ids = make_dead_letters(client, 12)
    r = dtq("dlq", "list")
    assert r.code == 0 and "RuntimeError: no" in r.out and ids[0] in r.out
    page = dtq("dlq", "list", "--json", "--limit", "5").json()
    assert len(page["items"]) == 5 and page["next_cursor"]
    r = dtq("dlq", "requeue", ids[0], "--max-retries", "4", "--json")
    assert r.code == 0 and r.json() == {"done": 1, "skipped": {}}
    assert client.get(ids[0]).max_retries == 4 and client.get(ids[0]).status.value == "queued"
    # Requeuing it again is not possible: exit 1 with the reason.
    r = dtq("dlq", "requeue", ids[0])
    assert r.code == 1 and "skipped: 1 queued" in r.out
    r = dtq("dlq", "discard", ids[1], ids[2])
    assert r.code == 0 and "discarded 2" in r.out
    r = dtq("dlq", "requeue")  # neither ids nor filters
    assert r.code == 2
    r = dtq("dlq", "requeue", "--error", f"no {ids[3].split(':')[1]}", "--yes")
    assert r.code == 0 and "requeued 1" in r.out
    r = dtq("dlq", "requeue", "--all", stdin="n\n")
    assert r.code == 1
    r = dtq("dlq", "purge", "--yes", "--json")
    assert r.code == 0 and r.json() == {"discarded": 8}
    assert dtq("dlq", "list", "--json").json()["items"] == []


def test_retry_cancel_workers_schedules(dtq: Any, client: Client) -> None:
    h = client.enqueue("add", [1, 1], delay=60)
    r = dtq("cancel", h.id)
    assert r.code == 0 and "cancelled" in r.out
    r = dtq("cancel", h.id)
    assert r.code == 1 and "already ended cancelled" in r.err
    assert dtq("retry", h.id).code == 0
    r = dtq("retry", h.id)
    assert r.code == 1 and "is queued" in r.err
    later = client.enqueue("add", [2, 2], delay=120)
    r = dtq("schedules", "--json")
    assert r.code == 0
    assert [d["task_id"] for d in r.json()["scheduled_tasks"]] == [later.id]
    assert "delayed" in dtq("schedules").out
    r = dtq("workers")  # no live worker: exit 1 (dtq workers as a liveness check)
    assert r.code == 1 and "(none)" in r.out and "no live worker" in r.err
    assert dtq("workers", "--json").json() == []


def test_exit_codes(dtq: Any, monkeypatch: Any) -> None:
    r = dtq("task", "default:0000")
    assert r.code == 1 and "no task default:0000" in r.err
    assert dtq("queues", "nope").code == 1
    assert dtq("pause", "nope").code == 1
    assert dtq("tasks", "--limit", "0").code == 2
    assert dtq("tasks", "--status", "bogus").code == 2
    assert dtq("enqueue", "add", "--args", "{not json").code == 2
    assert dtq("frobnicate").code == 2
    monkeypatch.setenv("DTQ_KEY_PREFIX", "bad:prefix")
    r = dtq("queues")
    assert r.code == 2 and "DTQ_KEY_PREFIX" in r.err
    monkeypatch.setenv("DTQ_KEY_PREFIX", "ok")
    monkeypatch.setenv("DTQ_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    r = dtq("queues")
    assert r.code == 3 and "Redis unreachable" in r.err


COMMANDS = [
    [], ["enqueue"], ["task"], ["tasks"], ["queues"], ["workers"], ["dlq"], ["dlq", "list"],
    ["dlq", "requeue"], ["dlq", "discard"], ["dlq", "purge"], ["retry"], ["cancel"], ["pause"],
    ["resume"], ["purge"], ["schedules"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "dtq")
def test_help_everywhere(dtq: Any, cmd: list[str]) -> None:
    r = dtq(*cmd, "--help")
    assert r.code == 0 and "Usage: dtq" in r.out
    if cmd:
        assert "Exit codes" in r.out


def test_console_script_runs_and_dev_bench_help() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    exe = os.path.join(os.path.dirname(sys.executable), "dtq")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "dlq" in r.stdout and "bench" in r.stdout
    r = subprocess.run([exe, "dev", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "dtq dev" in r.stdout


def test_enqueue_takes_positional_values_as_json_or_text(dtq: Any, client: Client) -> None:
    r = dtq("enqueue", "add", "1", "2", "--json")
    assert r.code == 0, r.err
    assert client.get(r.json()["id"]).args == [1, 2]
    r = dtq("enqueue", "greet", "ada", '{"x": [1]}', "true", "--json")
    assert client.get(r.json()["id"]).args == ["ada", {"x": [1]}, True]
    r = dtq("enqueue", "add", "1", "--args", "[2]")
    assert r.code == 2 and "not both" in r.err


def test_an_id_without_its_queue_is_looked_up_or_says_the_form(dtq: Any, client: Client) -> None:
    h = client.enqueue("add", [1, 2])
    tid = h.id.split(":", 1)[1]
    r = dtq("task", tid, "--json")
    assert r.code == 0 and r.json()["id"] == h.id, r.err
    r = dtq("task", "nosuchtid")
    assert r.code == 1 and "expected <queue>:<tid>" in r.err, r.err
    client.enqueue("add", [1], queue="other")  # a second known queue: not holding the tid
    assert dtq("task", tid, "--json").json()["id"] == h.id
    r = dtq("cancel", tid, "--json")
    assert r.code == 0 and r.json()["id"] == h.id, r.err


def test_task_of_a_workflow_shows_no_attempt_or_retries(dtq: Any, client: Client) -> None:
    from dtq import chain, sig

    h = client.enqueue_workflow(chain(sig("add", args=[1, 2]), sig("add", args=[3])))
    r = dtq("task", h.id)
    assert r.code == 0 and "steps:" in r.out, r.err
    assert "attempt:" not in r.out and "retries left" not in r.out, r.out
    r = dtq("task", h.id.split(":", 1)[1])  # a workflow id without its queue, too
    assert r.code == 0 and "steps:" in r.out, r.err


def test_workers_show_the_task_names_each_can_run(
    dtq: Any, settings: Settings, spawn_worker: Any
) -> None:
    from tests.conftest import wait_until

    w = spawn_worker("tests.apps.logging_app:app", settings, "--worker-id", "wnames")
    wait_until(lambda: dtq("workers").code == 0, timeout=30)
    rows = dtq("workers", "--json").json()
    assert [(x["worker_id"], x["tasks"]) for x in rows] == [
        ("wnames", ["boom", "boom_once", "chatty", "sync_chatty"])
    ]
    r = dtq("workers")
    assert r.code == 0 and "boom,boom_once,chatty,sync_chatty" in r.out
    w.kill()
