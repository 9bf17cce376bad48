"""Sync task bodies and the worker's thread pool: a body whose attempt ended (timed out,
cancelled) while it waited for a pool thread never starts. A real dtq-worker process with two
pool threads, a real redis-server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dtq import Client
from tests.apps.faulty import read_journal
from tests.conftest import make_settings, wait_until
from tests.redis_server import RedisServer

APP = "tests.apps.syncpool:app"


def _starts(j: str, task_id: str) -> int:
    return sum(1 for e in read_journal(j) if e["ev"] == "start" and e["id"] == task_id)


@pytest.mark.parametrize("end", ["timeout", "cancel"])
def test_a_sync_body_whose_attempt_ended_while_it_waited_for_a_thread_never_starts(
    redis_server: RedisServer, prefix: str, spawn_worker: Any, tmp_path: Path, end: str
) -> None:
    """Both pool threads are held by bodies that outlived their timeout; a third sync run
    waits for a thread and its attempt ends (its own timeout, or a cancel): it is recorded so,
    and when a thread comes free its body must not start (before, it started then: a `failed`
    task ran, twice after a dead-letter requeue). The thread that comes free runs the next
    waiting body instead (FIFO: the sentinel's start comes after the victim's would)."""
    s = make_settings(redis_server.url, prefix)
    j = str(tmp_path / "journal.jsonl")
    release = [tmp_path / "release-1", tmp_path / "release-2"]
    w = spawn_worker(APP, s, "--concurrency", "2")
    with Client(settings=s) as c:
        held = [c.enqueue("held_sync", kwargs={"release_path": str(p), "journal_path": j})
                for p in release]  # fmt: skip
        for h in held:  # both bodies run on, holding both threads, their runs ended
            wait_until(lambda h=h: _starts(j, h.id) == 1 and c.get(h.id).status == "failed", 30)
        if end == "timeout":
            victim = c.enqueue("note_sync", kwargs={"journal_path": j}, timeout=0.5)
            wait_until(lambda: c.get(victim.id).status == "failed", 30)
            assert "timed out" in (c.get(victim.id).error or "")
        else:
            victim = c.enqueue("note_sync", kwargs={"journal_path": j}, timeout=60)
            wait_until(lambda: c.get(victim.id).status == "running", 30)
            assert c.cancel(victim.id)
            wait_until(lambda: c.get(victim.id).status == "cancelled", 30)
        sentinel = c.enqueue("note_sync", kwargs={"journal_path": j}, timeout=60)
        wait_until(lambda: c.get(sentinel.id).status == "running", 30)  # waits for a thread
        release[0].touch()  # one thread comes free: it takes the victim's body, then this one
        assert c.result(sentinel.id, timeout=30) == "ran"
        release[1].touch()
        wait_until(lambda: sum(1 for e in read_journal(j) if e["ev"] == "finish") == 2, 30)
        assert _starts(j, victim.id) == 0, f"{end}: the ended attempt's body started"
        assert c.get(victim.id).status == ("failed" if end == "timeout" else "cancelled")
    assert w.proc.poll() is None
