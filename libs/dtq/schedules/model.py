"""A periodic schedule (:class:`Schedule`), what a listing shows of it, and declaring one in
code (``@app.periodic``)."""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dtq import codec
from dtq.errors import InvalidRequest
from dtq.schedules.cron import cron_next, from_ms, to_ms
from dtq.sdk.requests import MAX_SPAN_S, SCHEDULE_OPTIONS, check_group, check_task_name, check_text
from dtq.settings import check_queue_name

if TYPE_CHECKING:
    from dtq.app import App

DEFAULT_GRACE_S = 60.0
DISABLED = float("inf")
"""The next-fire score of a disabled schedule: never due, and kept by ``schedule_put`` while
its definition is unchanged (a changed definition starts enabled from its next fire)."""
MIN_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic schedule: which task to enqueue, when, and with what.

    Exactly one of ``cron`` (5-field cron expression, wall clock in ``tz``) and ``every``
    (seconds) is given. ``priority``, ``max_retries`` and ``timeout`` default to the task's own
    (``@app.task``): the scheduling worker's when it imports the task, else (``max_retries`` and
    ``timeout``) the declaration of the worker that runs it. ``expires`` (seconds) ends a fire
    ``expired`` if no worker starts it in time. ``grace`` is how late a fire may still run
    (seconds).
    """

    name: str
    task: str
    queue: str = "default"
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    overlap: bool = True
    grace: float = DEFAULT_GRACE_S
    priority: int | None = None
    max_retries: int | None = None
    timeout: float | None = None
    expires: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source: str = "runtime"
    """``code`` for ``@app.periodic`` declarations (kept in step with the code by the workers),
    ``runtime`` for :func:`add_schedule` (kept until removed)."""
    group: str | None = None
    """The fair group (docs/groups.md) of each task it fires; None: no group."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 200:
            raise InvalidRequest("schedule name must be a string of 1 to 200 characters")
        check_text("schedule name", self.name)
        if not isinstance(self.task, str) or not self.task:
            raise InvalidRequest("schedule needs a task name")
        check_task_name(self.task)
        check_queue_name(self.queue)
        if (self.cron is None) == (self.every is None):
            raise InvalidRequest("give exactly one of cron= and every=")
        if self.every is not None and (
            isinstance(self.every, bool)
            or not isinstance(self.every, int | float)
            or not MIN_EVERY_S <= self.every <= MAX_SPAN_S  # (false for NaN and infinities)
        ):
            raise InvalidRequest(
                f"every must be a number of seconds from {MIN_EVERY_S:g} to at most {MAX_SPAN_S}"
            )
        if self.cron is not None:
            if not isinstance(self.cron, str) or (
                len(self.cron.split()) != 5 and not self.cron.startswith("@")
            ):
                raise InvalidRequest(f"cron must have 5 fields: {self.cron!r}")
            from croniter import croniter
            from croniter.croniter import CroniterBadCronError, CroniterBadDateError

            try:
                croniter(self.cron)
            except (CroniterBadCronError, ValueError, KeyError) as exc:
                raise InvalidRequest(f"bad cron expression {self.cron!r}: {exc}") from None
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidRequest(f"unknown time zone {self.tz!r}") from None
        if self.cron is not None:
            try:
                self.next_after(to_ms(datetime.now(UTC)))
            except CroniterBadDateError:
                raise InvalidRequest(f"cron expression {self.cron!r} never fires") from None
        if not isinstance(self.grace, int | float) or not 0 <= self.grace <= 86_400:
            raise InvalidRequest("grace must be 0 to 86400 seconds")
        for opt, hi in (("priority", 9), ("max_retries", None)):
            v = getattr(self, opt)
            if v is not None and (type(v) is not int or v < 0 or (hi is not None and v > hi)):
                bound = "from 0 to 9" if hi else "of at least 0"
                raise InvalidRequest(f"{opt} must be an integer {bound}, not {v!r}")
        for opt in ("timeout", "expires"):
            v = getattr(self, opt)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf")
            ):
                raise InvalidRequest(f"{opt} must be a positive number of seconds, not {v!r}")
        if self.source not in ("code", "runtime"):
            raise InvalidRequest("source must be 'code' or 'runtime'")
        check_group(self.group)
        codec.dumps(list(self.args), "schedule args")
        codec.dumps(dict(self.kwargs), "schedule kwargs")
        codec.dumps(dict(self.metadata), "schedule metadata")

    def next_after(self, after_ms: int) -> int:
        """The first fire time (ms since the epoch) strictly after ``after_ms``."""
        if self.every is not None:
            step = round(self.every * 1000)
            return (after_ms // step + 1) * step
        assert self.cron is not None
        return to_ms(cron_next(self.cron, ZoneInfo(self.tz), from_ms(after_ms)))

    def latest_in(self, lo_ms: int, hi_ms: int) -> int | None:
        """The last fire time in ``[lo_ms, hi_ms]``, or None."""
        if self.every is not None:
            step = round(self.every * 1000)
            last = hi_ms // step * step
            return last if last >= lo_ms else None
        t = self.next_after(lo_ms - 1)
        if t > hi_ms:
            return None
        while (n := self.next_after(t)) <= hi_ms:
            t = n
        return t

    def fields(self) -> dict[str, Any]:
        """Its fields, ``args`` as a list and ``kwargs`` and ``metadata`` as dicts."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(args=list(self.args), kwargs=dict(self.kwargs), metadata=dict(self.metadata))
        return d

    def request(self, **meta: Any) -> dict[str, Any]:
        """enqueue()'s arguments for a task it fires: its options, and its metadata naming it
        (plus ``meta``)."""
        options = {k: getattr(self, k) for k in SCHEDULE_OPTIONS}
        options["metadata"] = {**self.metadata, "schedule": self.name, **meta}
        return {"args": list(self.args), "kwargs": dict(self.kwargs) or None, **options}

    def to_json(self) -> str:
        """The stored definition: canonical JSON (sorted keys), compared byte for byte."""
        d = self.fields()
        if not self.group:  # (so a definition stored before groups existed reads unchanged)
            del d["group"]
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> Schedule:
        known = cls.__dataclass_fields__  # (a field a newer version added is left out)
        return cls(**{k: v for k, v in json.loads(raw).items() if k in known})


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A stored schedule with its next fire time and the id of the last task it enqueued."""

    schedule: Schedule
    next_fire_at: datetime | None
    last_task_id: str | None
    enabled: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as ``dtq schedules --json`` and ``GET /api/v1/schedules`` show it."""
        return {
            **self.schedule.fields(),
            "group": self.schedule.group or None,
            "next_fire_at": self.next_fire_at.isoformat() if self.next_fire_at else None,
            "last_task_id": self.last_task_id,
            "enabled": self.enabled,
        }


# --- declaring schedules in code -------------------------------------------------------------

_declared: weakref.WeakKeyDictionary[App, dict[tuple[str, str], Schedule]] = (
    weakref.WeakKeyDictionary()
)


def declared(app: App) -> list[Schedule]:
    """The schedules declared in code on ``app`` with ``@app.periodic``."""
    return list(_declared.get(app, {}).values())


def declare(app: App, s: Schedule) -> None:
    """Add the code schedule ``s`` to those ``app`` declares (``@app.periodic``)."""
    registry = _declared.setdefault(app, {})
    if (s.queue, s.name) in registry:
        raise InvalidRequest(f"schedule {s.name!r} is declared twice in queue {s.queue!r}")
    registry[(s.queue, s.name)] = s
