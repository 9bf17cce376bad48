"""The task record: the hash ``P:{q}:t:<tid>`` (:meth:`dtq.store.keys.QueueKeys.task`), its fields
named once, each with what it means.

The Lua scripts spell the same names (a Lua script cannot import them); ``tests/lua/test_record.py``
fails when a script reads or writes a record field that is not here, or when docs/design.md's
table ("The task record") leaves one out. Short names keep each record small: a queued task is
about 360 bytes, and every name is stored in every record.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Field(StrEnum):
    """A field of the task record (see :data:`MEANING`)."""

    STATUS = "status"
    ATTEMPT = "attempt"
    RETRIES = "retries"
    INTERRUPTIONS = "intr"
    ENTRY_ID = "eid"
    WORKER = "worker"
    NAME = "name"
    ARGS = "args"
    KWARGS = "kwargs"
    PRIORITY = "prio"
    IDEMPOTENCY_KEY = "idem"
    META = "meta"
    MAX_RETRIES = "maxr"
    TIMEOUT = "timeout"
    EXPIRES = "exp"
    LEFT_TO_DECLARATION = "dflt"
    ENQUEUED = "enq"
    DUE = "due"
    STARTED = "started"
    FINISHED = "finished"
    RESULT = "result"
    ERROR = "error"
    TRACEBACK = "tb"
    HEADERS = "hdr"
    FLOW = "flow"
    CANCEL = "cancel"
    REQUEUES = "requeues"
    PROGRESS = "progress"
    LIMIT_KEY = "lk"
    LIMIT_CONCURRENCY = "lc"
    LIMIT_RATE_COUNT = "lrn"
    LIMIT_RATE_WINDOW = "lrw"
    LIMIT_OWED = "lown"
    GROUP = "grp"


MEANING: Final[dict[Field, str]] = {
    Field.STATUS: "queued, scheduled, running, succeeded, failed, cancelled or expired",
    Field.ATTEMPT: "runs started so far; raised only by claim.lua: (task, attempt) names one run "
    "(the fencing token); absent while 0",
    Field.RETRIES: "failed runs counted against maxr; absent while 0",
    Field.INTERRUPTIONS: "shutdown hand-backs; they spend no retry up to DTQ_MAX_INTERRUPTIONS; "
    "absent while 0",
    Field.ENTRY_ID: "the stream entry that carries the task now; any other entry for it is a "
    "duplicate",
    Field.WORKER: "the worker running the current attempt",
    Field.NAME: "the task's name, as enqueued",
    Field.ARGS: "positional arguments (JSON), as enqueued",
    Field.KWARGS: "keyword arguments (JSON), as enqueued; absent when none",
    Field.PRIORITY: "band 0-9, as enqueued; absent while 5 (DEFAULT_PRIORITY)",
    Field.IDEMPOTENCY_KEY: "the idempotency key, as enqueued; absent when none",
    Field.META: "metadata (JSON), as enqueued; absent when none",
    Field.MAX_RETRIES: "retry budget (max_retries); absent while 3 (DEFAULT_MAX_RETRIES)",
    Field.TIMEOUT: "run timeout (seconds); absent when none",
    Field.EXPIRES: "expiry time (Redis ms); absent when none",
    Field.LEFT_TO_DECLARATION: "letters of mte the enqueue left to the worker's declaration "
    "(dtq.declared); emptied when the first claim fixed them",
    Field.ENQUEUED: "enqueue time (Redis ms)",
    Field.DUE: "when a scheduled task is due (Redis ms)",
    Field.STARTED: "start of the current attempt (Redis ms)",
    Field.FINISHED: "end of the last attempt (Redis ms)",
    Field.RESULT: "the JSON result of a success; absent when null",
    Field.ERROR: "'Type: message' of the last failure, or the reason of a cancel",
    Field.TRACEBACK: "traceback of the last failure, at most 8192 characters",
    Field.HEADERS: "middleware headers (JSON object of strings), returned in the claim reply",
    Field.FLOW: "a workflow step's flow and index, '<flow key>|<i>'",
    Field.CANCEL: "the reason of a requested cancel (the durable flag every path honours)",
    Field.REQUEUES: "times an operator requeued the task from the dead-letter queue",
    Field.PROGRESS: "the last progress report of a run (JSON), written by progress.lua while "
    "the run held the task",
    Field.LIMIT_KEY: "the fleet limit's key (dtq.limits)",
    Field.LIMIT_CONCURRENCY: "runs of the limit key allowed at once (0: no cap)",
    Field.LIMIT_RATE_COUNT: "starts of the limit key allowed per window (0: no rate)",
    Field.LIMIT_RATE_WINDOW: "the rate window (ms)",
    Field.LIMIT_OWED: "1 while a task released from behind its concurrency limit has not "
    "started: ended first, it passes the place on to the next parked task",
    Field.GROUP: "the task's fair group within its queue, as enqueued; absent when none ('' "
    "for a task without a group stored while the queue had active groups)",
}


DEFAULT_PRIORITY = 5
DEFAULT_MAX_RETRIES = 3

# What a record leaves out while a field holds it (lua/includes/record_defaults.lua): every
# reader reads an absent field as its value here. (A null result is left out too; TaskInfo reads
# its absence as None.) tests/lua/test_record.py checks the scripts' constants against these.
DEFAULTS: Final[dict[str, str]] = {
    Field.ATTEMPT: "0",
    Field.RETRIES: "0",
    Field.INTERRUPTIONS: "0",
    Field.MAX_RETRIES: str(DEFAULT_MAX_RETRIES),
    Field.PRIORITY: str(DEFAULT_PRIORITY),
}


def with_defaults(rec: dict[str, str]) -> dict[str, str]:
    """``rec`` (a record as HGETALL gives it) with each field left out at its default put in:
    the same dict whatever the form it was written in. An empty ``rec`` (no record) stays
    empty."""
    if not rec:
        return rec
    return {**DEFAULTS, **rec}
