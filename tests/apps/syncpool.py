"""Sync tasks for the thread-pool tests: bodies that hold a pool thread until released, and
one that only records its start. Each run journals its start (tests.apps.faulty.journal)."""

from __future__ import annotations

import os
import time

from dtq import App
from tests.apps.faulty import journal

app = App()


@app.task(name="held_sync", timeout=0.5, max_retries=0)
def held_sync(release_path: str, journal_path: str) -> str:
    """Ignores its timeout: holds its thread until ``release_path`` exists (60 s at most)."""
    journal(journal_path, "start")
    deadline = time.monotonic() + 60
    while not os.path.exists(release_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    journal(journal_path, "finish")
    return "late"


@app.task(name="note_sync", max_retries=0)
def note_sync(journal_path: str) -> str:
    journal(journal_path, "start")
    return "ran"
