"""The schedule scripts' wrappers: schedule_put.lua (store a definition) and schedule_fire.lua
(fire one due schedule). dtq.schedules owns the model and the runner; these only send."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from dtq.scripts.enqueue import NewTask
from dtq.scripts.runner import Call, to_str
from dtq.store.keys import QueueKeys


class Stored(IntEnum):
    """schedule_put.lua's reply."""

    UNCHANGED = 0
    CHANGED = 1
    """The definition was created or changed (its next fire time set)."""


def schedule_put_call(qk: QueueKeys, name: str, spec: str, next_ms: int) -> Call:
    """Store schedule ``name``'s definition (JSON) and its next fire time, unless unchanged."""
    return Call("schedule_put", [qk.schedules, qk.schedules_next], [name, spec, next_ms])


def parse_schedule_put(raw: Any) -> Stored:
    return Stored(int(raw))


class FireOutcome(StrEnum):
    """What schedule_fire.lua did."""

    FIRED = "fired"
    OVERLAP = "overlap"
    """Skipped: the previous run is still active (and the schedule allows no overlap)."""
    MISSED = "missed"
    """Skipped: past the grace period."""
    STALE = "stale"
    """Someone else moved the schedule (fired it, changed or removed it): nothing was done."""


@dataclass(frozen=True, slots=True)
class Fired:
    outcome: FireOutcome
    tid: str  # the task fired (or, for OVERLAP, the one still active); "" otherwise


def schedule_fire_call(
    qk: QueueKeys,
    name: str,
    *,
    spec: str,
    expected_ms: int,
    next_ms: int,
    fire_ms: int | None,
    overlap: bool,
    task: NewTask,
    events_maxlen: int,
) -> Call:
    """Fire schedule ``name`` due at ``expected_ms`` (its stored next time, and ``spec`` its
    stored definition: anything else is stale) as ``task``, at ``fire_ms`` (None: skip the
    fire as missed); its next time becomes ``next_ms``. ``overlap``: whether a fire may start
    while the previous one still runs."""
    timeout = "" if task.timeout is None else repr(float(task.timeout))
    head = [name, expected_ms, next_ms, spec, 0 if fire_ms is None else 1, 1 if overlap else 0]
    fields = [task.tid, task.name, task.args, task.kwargs, task.priority, task.max_retries, timeout]
    tail = [task.expires_ms, task.meta, *_limit_fields(task.limit), task.group, task.unset]
    return Call(
        "schedule_fire",
        [*qk.streams, qk.events, qk.task_base, qk.schedules, qk.schedules_next, qk.schedules_last],
        [*head, events_maxlen, fire_ms or expected_ms, *fields, *tail],
    )


def _limit_fields(limit: str) -> tuple[str, str, str, str]:
    """schedule_fire.lua's lk, lc, lrn, lrw of a task's limit (dtq.limits.Limit.encode():
    "concurrency|rate count|rate window ms|key"; "" = none)."""
    if not limit:
        return "", "", "", ""
    lc, lrn, lrw, lk = limit.split("|", 3)
    return lk, lc, lrn, lrw


def parse_schedule_fire(raw: list[Any]) -> Fired:
    return Fired(FireOutcome(to_str(raw[0])), to_str(raw[1]))
