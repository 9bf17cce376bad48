"""Periodic schedules: cron expressions (time-zone and DST aware) and fixed intervals.

Declared in code with ``@app.periodic(...)`` or added at run time with :func:`add_schedule`.
Schedules are stored per queue (``P:{q}:schedules``, next fire times in
``P:{q}:schedules:next``); the scheduler leader of the queue (one worker at a time) fires them.
Each fire is one atomic step (``lua/schedule_fire.lua``: compare-and-set of the next fire time,
then the enqueue), so it is enqueued exactly once however many workers run.

The rules (grace, ``overlap=False``, DST, ``every=N``) are in docs/lifecycle.md.

The package: ``cron.py`` (the time arithmetic), ``model.py`` (:class:`Schedule`, declaring in
code), ``ops.py`` (the SDK's list/add/remove/enable/run-now), ``runner.py`` (the firing, which the
worker's scheduler leader and :class:`dtq.testing.TestQueue` run).
"""

from __future__ import annotations

from dtq.errors import UnknownSchedule
from dtq.schedules.cron import cron_next
from dtq.schedules.model import (
    DEFAULT_GRACE_S,
    DISABLED,
    MIN_EVERY_S,
    Schedule,
    ScheduleInfo,
    declared,
    periodic,
)
from dtq.schedules.ops import (
    aadd_schedule,
    add_schedule,
    alist_schedules,
    aremove_schedule,
    arun_now,
    aset_enabled,
    list_schedules,
    remove_schedule,
)
from dtq.schedules.runner import FireResult, ScheduleRunner

__all__ = [
    "DEFAULT_GRACE_S",
    "DISABLED",
    "MIN_EVERY_S",
    "FireResult",
    "Schedule",
    "ScheduleInfo",
    "ScheduleRunner",
    "UnknownSchedule",
    "aadd_schedule",
    "add_schedule",
    "alist_schedules",
    "aremove_schedule",
    "arun_now",
    "aset_enabled",
    "cron_next",
    "declared",
    "list_schedules",
    "periodic",
    "remove_schedule",
]
