"""progress.lua's wrapper: a running task's progress report, fenced by its run."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from dtq.scripts.runner import Call
from dtq.store.keys import QueueKeys


class Progress(IntEnum):
    """progress.lua's reply."""

    REJECTED = 0
    """The run no longer holds the task: nothing was stored."""
    STORED = 1


def progress_call(
    qk: QueueKeys, tid: str, attempt: int, worker_id: str, payload: str, events_maxlen: int
) -> Call:
    return Call(
        "progress", [qk.task(tid), qk.events], [tid, attempt, worker_id, payload, events_maxlen]
    )


def parse_progress(raw: Any) -> Progress:
    return Progress(int(raw))
